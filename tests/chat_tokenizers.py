"""Real Hugging Face tokenizers for the tokenize tests, built offline: a byte-level BPE trained
on the docstring corpus, one tokenizer folder per template packlab ships; chat records that
probe the templates (turns, system prompts, tools, unicode, template text inside content); and
the check every test applies to a tokenized record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from packlab.tokenize import BUILTIN_TEMPLATES
from packlab.tokenize.corpus import build_docstring_corpus
from packlab.tokenize.train import tokenizer_folder, train_bpe_tokenizer

# What each template does to an assistant message's text and which text ends the turn.
TRIMS = {"llama3": True, "llama3_system": True, "chatml": False, "chatml_generation": False}
END_OF_TURN = {"llama3": "<|eot_id|>", "llama3_system": "<|eot_id|>", "chatml": "<|im_end|>",
               "chatml_generation": "<|im_end|>"}
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look up a Python object's documentation.",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}},
                   "required": ["name"]}}}]


def build_tokenizers(root: Path, *, records: int = 200, vocab_size: int = 2048
                     ) -> tuple[Path, dict[str, Path]]:
    """The corpus and one tokenizer folder per shipped template (one trained tokenizer.json)."""
    corpus = build_docstring_corpus(root / "corpus.jsonl", records, seed=0)
    tokenizer_json = train_bpe_tokenizer(corpus, root / "bpe" / "tokenizer.json",
                                         vocab_size=vocab_size)
    return corpus, {name: tokenizer_folder(tokenizer_json, root / name, name)
                    for name in BUILTIN_TEMPLATES}


def chat(*pairs: tuple[str, str], **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": r, "content": c} for r, c in pairs], **extra}


PROBES = [
    chat(("system", "Be brief."), ("user", "2+2?"), ("assistant", "4"), ("user", "and 3+3?"),
         ("assistant", "6, of course.")),
    chat(("user", "only a question")),
    chat(("user", "say nothing"), ("assistant", "")),
    chat(("user", "unicode?"), ("assistant", "héllo wörld 😀 — 日本語, naïve café")),
    chat(("user", "the ChatML end token is <|im_end|>, right?"),
         ("assistant", "Yes: <|im_end|> and Llama's <|eot_id|> end a turn.")),
    chat(("user", "code"), ("assistant", "```python\ndef f(x):\n    return x  # same\n```")),
    chat(("assistant", "I speak first."), ("user", "ok")),
    chat(("user", "which tool?"), ("assistant", "The lookup tool."), tools=TOOLS),
    chat(("system", "S"), ("user", "u"), ("assistant", "a"), ("assistant", "b")),
]


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                    encoding="utf-8")
    return path


def corpus_records(corpus: Path, count: int | None = None) -> list[dict[str, Any]]:
    lines = corpus.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[:count]]


def mask_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``(start, stop)`` of every run of 1s."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def expected_learned(message: dict[str, Any], template: str) -> str:
    """What an assistant message must decode to under mask 1, computed from the message alone:
    its text as the template renders it (tool calls as JSON), then the end-of-turn text."""
    text = message.get("content") or ""
    if TRIMS[template]:
        text = text.strip()
    for k, call in enumerate(message.get("tool_calls") or ()):
        fn = call.get("function", call)
        body = json.dumps({"name": fn["name"], "arguments": fn["arguments"]}, ensure_ascii=False)
        text += ("\n" if k or text else "") + f"<tool_call>\n{body}\n</tool_call>"
    return text + END_OF_TURN[template]


def check_masked_exactly(decode: Any, tokens: np.ndarray, mask: np.ndarray,
                         record: dict[str, Any], template: str) -> None:
    """Mask 1 decodes, run by run, to exactly each assistant turn's text plus the end-of-turn
    text, in order; so mask 0 covers everything else (headers, other roles, system prompts)."""
    tokens, mask = np.asarray(tokens), np.asarray(mask)
    assert set(np.unique(mask).tolist()) <= {0, 1}
    learned = [decode(tokens[a:b]) for a, b in mask_runs(mask)]
    expected = [expected_learned(m, template) for m in record["messages"]
                if m["role"] == "assistant"]
    assert learned == expected
    if not expected:
        assert int(mask.sum()) == 0


UNLOCATED = chat(("user", "q"), ("assistant", "\nan answer that starts with a newline"))
TOKENIZERS = {"bpe": {}, "o200k": {"encoding": "o200k_base"},
              "llama3": {"tokenizer": "llama3"}, "generation": {"tokenizer": "chatml_generation"},
              "chatml": {"tokenizer": "chatml"}}


def chat_setup(root: Path) -> dict[str, Any]:
    """A chat JSONL (the corpus, probes, unlocated records spread through it) and tokenizers."""
    corpus, folders = build_tokenizers(root, records=240)
    records = corpus_records(corpus)
    for k, probe in enumerate([*PROBES, UNLOCATED, UNLOCATED]):
        records.insert(17 * k + 5, probe)
    jsonl = write_jsonl(root / "chat.jsonl", records)
    return {"root": root, "jsonl": jsonl, "folders": folders, "records": records}


def options(setup: dict[str, Any], name: str) -> dict[str, Any]:
    """The tokenize options of tokenizer ``name`` (a folder of ``setup``'s, or an encoding)."""
    opts = dict(TOKENIZERS[name])
    if "tokenizer" in opts:
        opts["tokenizer"] = setup["folders"][opts["tokenizer"]]
    return opts
