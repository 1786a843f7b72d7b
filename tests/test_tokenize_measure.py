"""Notebook 01's tokenizing measurements: what they time is the real command's output, the
arithmetic of the projection, and the masked segments a person reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chat_tokenizers import build_tokenizers, chat

from packlab.lab.measure.tokenizing import (
    CORPUS_TOKENS,
    encode_floor,
    projected_hours,
    repeat_jsonl,
    tokenize_rates,
)
from packlab.spool import SpoolReader
from packlab.tokenize import HFChatTokenizer, masked_segments, tokenizer_spec


def test_rates_time_the_real_spools_and_project_honestly(tmp_path: Path) -> None:
    corpus, folders = build_tokenizers(tmp_path, records=60)
    big = repeat_jsonl(corpus, tmp_path / "big.jsonl", 3)
    assert big.read_bytes() == corpus.read_bytes() * 3
    paths = {"bpe": {"encoding": "cl100k_base"}, "hf": {"tokenizer": folders["llama3"]}}
    rows = tokenize_rates(big, tmp_path / "rates", paths, (1, 2), repeats=2)
    assert [(r["path"], r["workers"]) for r in rows] == [("bpe", 1), ("bpe", 2), ("hf", 1),
                                                          ("hf", 2)]
    for row in rows:
        spool = SpoolReader(tmp_path / "rates" / f"{row['path']}-{row['workers']}")
        assert row["tokens"] == spool.num_tokens and row["records"] == 180
        assert row["same_bytes"] is True
        assert row["tokens_per_second"] == pytest.approx(row["tokens"] / row["seconds"])
        assert row["tokens_per_cpu_second"] == pytest.approx(row["tokens"] / row["cpu_seconds"])
        assert row["cpu_seconds"] > 0 and row["floor_tokens_per_cpu_second"] > 0
    assert rows[0]["speedup"] == 1.0 and rows[1]["efficiency"] == pytest.approx(
        rows[1]["speedup"] / 2)
    assert rows[0]["cpu_efficiency"] == 1.0 and rows[1]["cpu_efficiency"] == pytest.approx(
        rows[1]["tokens_per_cpu_second"] / rows[0]["tokens_per_cpu_second"])
    projection = projected_hours(rows, cores=(1, 10))
    hf_two = rows[3]["tokens_per_cpu_second"]
    assert [(p["path"], p["cores"]) for p in projection] == [("bpe", 1), ("bpe", 10), ("hf", 1),
                                                              ("hf", 10)]
    assert projection[2]["hours"] == pytest.approx(CORPUS_TOKENS / hf_two / 3600)
    assert projection[3]["hours"] == pytest.approx(projection[2]["hours"] / 10)
    assert encode_floor(big, {"tokenizer": folders["llama3"]}) > 0


def test_masked_segments_read_back_the_conversation(tmp_path: Path) -> None:
    _, folders = build_tokenizers(tmp_path, records=20, vocab_size=512)
    encoder = HFChatTokenizer(tokenizer_spec(folders["chatml"]))
    record = chat(("user", "q?"), ("assistant", "yes"), ("user", "sure?"), ("assistant", "no"))
    tokens, mask, _ = encoder.encode_record(record, "r")
    assert masked_segments(encoder.decode, tokens, mask) == [
        (0, "<|im_start|>user\nq?<|im_end|>\n<|im_start|>assistant\n"), (1, "yes<|im_end|>"),
        (0, "\n<|im_start|>user\nsure?<|im_end|>\n<|im_start|>assistant\n"), (1, "no<|im_end|>"),
        (0, "\n")]
    assert masked_segments(encoder.decode, tokens[:0], mask[:0]) == []
    assert json.loads((folders["chatml"] / "tokenizer_config.json").read_text())[
        "eos_token"] == "<|im_end|>"
