"""Chat records in, tokens and masks out: the loop every tokenize path runs (one process, a pool
worker, a Ray task), so the spool bytes do not depend on who ran it.

A record is one JSONL line; ``where`` is ``"{file}: line {n}"`` (the line a person sees in an
editor), the prefix of every error about it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from packlab.codecs.jsonl_index import JsonlIndex, iter_jsonl_lines, parse_json_line
from packlab.errors import PacklabError
from packlab.spool import SpoolWriter
from packlab.tokenize.bpe import ChatTokenizer
from packlab.tokenize.chat_template import Unlocated
from packlab.tokenize.hf import HFChatTokenizer, TokenizerSpec

UNLOCATED_SHOWN = 5  # unlocated records named in the spool record (the first ones, in file order)
UNLOCATED = ("skip", "error")
_BATCH_RECORDS = 256

Spec = str | TokenizerSpec  # a bpe-openai encoding name, or a Hugging Face tokenizer


class ChatEncoder(Protocol):
    vocab_size: int

    def encode_record(self, record: dict[str, Any], where: str
                      ) -> tuple[np.ndarray, np.ndarray, int]: ...

    def describe(self) -> dict[str, Any]: ...


@lru_cache(maxsize=4)
def load_encoder(spec: Spec) -> ChatEncoder:
    """The encoder a spec names; cached, so a worker loads it once for all its jobs."""
    if isinstance(spec, TokenizerSpec):
        return HFChatTokenizer(spec)
    return ChatTokenizer(spec)


@dataclass
class Stats:
    """What tokenizing counted; the spool record's ``source.stats``. Adding the stats of
    consecutive record ranges gives the stats of the whole (so any split gives the same)."""

    records: int = 0
    messages: int = 0
    learn_tokens: int = 0
    records_without_response: int = 0
    records_unlocated: int = 0
    assistant_turns_without_end_token: int = 0
    unlocated: list[str] = field(default_factory=list)  # "where: reason", the first few

    def add(self, other: Stats | dict[str, Any]) -> None:
        other = other if isinstance(other, Stats) else Stats(**other)
        for name, value in asdict(other).items():
            if name == "unlocated":
                self.unlocated = (self.unlocated + value)[:UNLOCATED_SHOWN]
            else:
                setattr(self, name, getattr(self, name) + value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def iter_file_records(jsonl: Path, limit: int | None = None
                      ) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, record)`` of the first ``limit`` non-blank lines, streaming."""
    for count, (line, _, raw) in enumerate(iter_jsonl_lines(jsonl)):
        if limit is not None and count >= limit:
            return
        yield f"{jsonl}: line {line}", parse_json_line(jsonl, line, raw)


def iter_index_records(jsonl: str | os.PathLike[str], index: str | os.PathLike[str],
                       start: int, stop: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, record)`` of records ``start..stop-1`` through the JSONL line index."""
    with JsonlIndex(jsonl, index) as lines:
        numbers = lines.entries["line"][start:stop]
        for i, line in zip(range(start, stop), numbers.tolist(), strict=True):
            yield f"{lines.jsonl}: line {line}", parse_json_line(lines.jsonl, line,
                                                                lines.read_bytes(i))


def encode_into(encoder: ChatEncoder, records: Iterable[tuple[str, dict[str, Any]]],
                writer: SpoolWriter, stats: Stats, *, unlocated: str = "skip") -> int:
    """Encode every record and append its sequence to ``writer``; returns the number of
    sequences written. An unlocated record is skipped and counted (``unlocated="skip"``) or
    is an error naming its line (``"error"``)."""
    if unlocated not in UNLOCATED:
        raise PacklabError(f"unlocated must be one of {', '.join(UNLOCATED)}, got {unlocated!r}")
    written = 0
    batch: list[tuple[np.ndarray, np.ndarray]] = []
    for where, record in records:
        stats.records += 1
        try:
            tokens, mask, missing_end = encoder.encode_record(record, where)
        except Unlocated as exc:
            if unlocated == "error":
                raise PacklabError(f"{where}: cannot mask the assistant text exactly: {exc}"
                                   ) from None
            stats.records_unlocated += 1
            if len(stats.unlocated) < UNLOCATED_SHOWN:
                stats.unlocated.append(f"{where}: {exc}")
            continue
        stats.messages += len(record["messages"])
        stats.assistant_turns_without_end_token += missing_end
        batch.append((tokens, mask))
        if len(batch) == _BATCH_RECORDS:
            written += _flush(writer, batch, stats)
    return written + _flush(writer, batch, stats)


def _flush(writer: SpoolWriter, batch: list[tuple[np.ndarray, np.ndarray]],
           stats: Stats) -> int:
    if not batch:
        return 0
    tokens = np.concatenate([t for t, _ in batch])
    masks = np.concatenate([m for _, m in batch])
    lengths = np.array([t.shape[0] for t, _ in batch], dtype=np.int64)
    writer.append_many(tokens, masks, lengths)
    learn = np.add.reduceat(masks.astype(np.int64), np.concatenate(([0], np.cumsum(lengths)[:-1])))
    stats.learn_tokens += int(learn.sum())
    stats.records_without_response += int((learn == 0).sum())
    count = len(batch)
    batch.clear()
    return count


def masked_segments(decode: Callable[[np.ndarray], str], tokens: np.ndarray,
                    mask: np.ndarray) -> list[tuple[int, str]]:
    """``(mask value, text)`` of each run of equal mask values: what a sequence teaches, for
    a person to read (``decode`` as the tokenizer's; runs split no character here)."""
    tokens, mask = np.asarray(tokens), np.asarray(mask)
    if tokens.shape[0] == 0:
        return []
    edges = [0, *(np.flatnonzero(np.diff(mask.astype(np.int8))) + 1).tolist(), mask.shape[0]]
    return [(int(mask[a]), decode(tokens[a:b])) for a, b in zip(edges[:-1], edges[1:],
                                                                 strict=True)]


def marker_encoder(spec: Spec) -> Callable[[str], list[int]]:
    """How a chat marker string (``"<|im_start|>assistant\\n"``) becomes token ids with the
    tokenizer ``spec`` names: special-token strings matched as the special tokens (as
    Megatron-LM's config tokenizes its markers with the model's tokenizer), the text between
    them encoded as text. For :mod:`packlab.spool.masks`."""
    encoder = load_encoder(spec)
    if isinstance(encoder, HFChatTokenizer):
        tokenizer = encoder.tokenizer
        return lambda text: list(tokenizer.encode(text, add_special_tokens=False).ids)
    specials: dict[str, int] = encoder.special_tokens  # type: ignore[attr-defined]
    split = re.compile("(" + "|".join(re.escape(s) for s in specials) + ")")

    def encode(text: str) -> list[int]:
        ids: list[int] = []
        for piece in split.split(text):
            if piece in specials:
                ids.append(specials[piece])
            elif piece:
                ids += encoder.encode_text(piece).tolist()  # type: ignore[attr-defined]
        return ids

    return encode
