"""Tokenizing in parallel jobs (a process pool, Ray): the spool is byte for byte the one-worker
spool, whatever the tokenizer, the cut or the executor; a failure names its line and leaves
nothing; the parent's memory stays flat. One local Ray session (about 20 s to start)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chat_tokenizers import TOKENIZERS, chat, chat_setup, options

from packlab import cli
from packlab.codecs.jsonl_index import JsonlIndex, build_jsonl_index
from packlab.spool import SpoolReader
from packlab.tokenize import tokenize_chat_jsonl
from packlab.tokenize.parallel import job_bounds


def tree(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return chat_setup(tmp_path_factory.mktemp("parallel"))


@pytest.mark.parametrize("name", TOKENIZERS)
def test_two_workers_write_the_one_worker_spool_byte_for_byte(
        name: str, setup: dict[str, Any], tmp_path: Path) -> None:
    jsonl, opts = setup["jsonl"], options(setup, name)
    one = tokenize_chat_jsonl(jsonl, tmp_path / "one", **opts)
    two = tokenize_chat_jsonl(jsonl, tmp_path / "two", workers=2, **opts)
    three = tokenize_chat_jsonl(jsonl, tmp_path / "three", workers=3, limit=200, **opts)
    assert tree(one.path) == tree(two.path)
    stats = one.record["source"]["stats"]
    assert stats["records"] == len(setup["records"])
    if name in ("llama3", "bpe", "o200k"):  # llama3 trims the newline away; bpe encodes apart
        assert stats["records_unlocated"] == 0
    else:
        assert stats["records_unlocated"] == 2 and len(stats["unlocated"]) == 2
    limited = tokenize_chat_jsonl(jsonl, tmp_path / "limited", limit=200, **opts)
    assert tree(limited.path) == tree(three.path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["limited", "one", "three", "two"]


def test_the_index_beside_the_jsonl_is_used_when_fresh(setup: dict[str, Any],
                                                       tmp_path: Path) -> None:
    jsonl = tmp_path / "chat.jsonl"
    jsonl.write_bytes(setup["jsonl"].read_bytes())
    reference = tokenize_chat_jsonl(jsonl, tmp_path / "ref")
    index = build_jsonl_index(jsonl)
    with_index = tokenize_chat_jsonl(jsonl, tmp_path / "indexed", workers=2)
    assert tree(with_index.path) == tree(reference.path)
    with open(jsonl, "a") as f:  # the index is stale now: one is built for the run instead
        f.write(json.dumps(chat(("user", "late"), ("assistant", "record"))) + "\n")
    grown = tokenize_chat_jsonl(jsonl, tmp_path / "grown", workers=2)
    assert grown.num_sequences == reference.num_sequences + 1
    assert index.exists() and tree(grown.path) == tree(
        tokenize_chat_jsonl(jsonl, tmp_path / "grown1").path)


def test_jobs_cover_every_record_once_in_about_equal_bytes(setup: dict[str, Any],
                                                           tmp_path: Path) -> None:
    jsonl = tmp_path / "chat.jsonl"
    jsonl.write_bytes(setup["jsonl"].read_bytes())
    index = JsonlIndex(jsonl, build_jsonl_index(jsonl, tmp_path / "idx"))
    for workers, count in [(1, len(index)), (2, len(index)), (5, 100), (64, 30), (2, 1)]:
        bounds = job_bounds(index, count, workers)
        assert bounds[0][0] == 0 and bounds[-1][1] == count
        assert all(a < b for a, b in bounds)
        assert all(b == c for (_, b), (c, _) in zip(bounds[:-1], bounds[1:], strict=True))
        jobs = min(count, 4 * workers)
        assert len(bounds) == jobs if count >= 10 * jobs else len(bounds) <= jobs
    bounds = job_bounds(index, len(index), 2)
    sizes = [int(index.entries["offset"][b - 1] + index.entries["length"][b - 1]
                 - index.entries["offset"][a]) for a, b in bounds]
    assert max(sizes) < 2.5 * np.mean(sizes)
    assert job_bounds(index, 0, 2) == []


def test_a_malformed_line_in_a_worker_names_it_and_loses_nothing(
        setup: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = setup["jsonl"].read_text(encoding="utf-8").splitlines()
    lines[150] = lines[150][:-7]  # a truncated record on line 151
    jsonl = tmp_path / "chat.jsonl"
    jsonl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "spool"
    old = tokenize_chat_jsonl(setup["jsonl"], out)
    before = tree(old.path)
    argv = ["tokenize", str(jsonl), str(out), "--workers", "2", "--overwrite"]
    for extra in ([], ["--tokenizer", str(setup["folders"]["llama3"])]):
        assert cli.main([*argv, *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{jsonl}: line 151: malformed JSON" in err
        assert tree(out) == before  # the spool already there is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl", "spool"]


def test_progress_stays_quiet_off_a_terminal(setup: dict[str, Any], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tokenize", str(setup["jsonl"]), str(tmp_path / "s"), "--workers", "2",
                     "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    summary = json.loads(captured.out)
    assert summary["workers"] == 2 and summary["num_records"] == len(setup["records"])


def test_the_parent_memory_stays_flat_while_parts_merge(tmp_path: Path) -> None:
    """A spool of ~4M tokens (20 MB) from two workers: the parent, which merges the parts,
    grows its peak RSS by far less than it writes (child process; small buffers)."""
    jsonl = tmp_path / "big.jsonl"
    words = " ".join(f"word{i % 997} and more text, number {i}." for i in range(450))
    record = json.dumps(chat(("user", "Explain."), ("assistant", words)))
    jsonl.write_text((record + "\n") * 800)
    code = textwrap.dedent(f"""
        import packlab.spool as spool, packlab.tokenize.parallel as parallel
        from packlab.tokenize import tokenize_chat_jsonl
        spool._FLUSH_TOKENS = parallel.MERGE_TOKENS = 1 << 14
        def hwm():
            for row in open("/proc/self/status"):
                if row.startswith("VmHWM:"):
                    return int(row.split()[1]) * 1024
        tokenize_chat_jsonl({str(jsonl)!r}, {str(tmp_path / "warm")!r}, limit=2, workers=2)
        base = hwm()
        reader = tokenize_chat_jsonl({str(jsonl)!r}, {str(tmp_path / "s")!r}, workers=2)
        print(hwm() - base, reader.num_tokens)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    growth, tokens = int(out[0]), int(out[1])
    assert tokens > 3_000_000
    assert growth < tokens * 5 / 8, f"peak RSS grew {growth} bytes merging {tokens} tokens"
    assert SpoolReader(tmp_path / "s").num_sequences == 800
