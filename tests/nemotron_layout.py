"""Nemotron's on-disk layouts, written byte for byte from their documentation (test support).

No Nemotron code is used or copied: Nemotron's data_prep documents the layout, and these
helpers write what it writes, so packlab's tests meet the files as Nemotron leaves them.

- A spool (``SequenceSpoolWriter``): ``tokens.bin`` int32, ``masks.bin`` uint8 (unshifted),
  ``offsets.bin`` uint64, ``lengths.bin`` uint32, appended one sequence at a time;
  ``manifest.json`` written last through ``manifest.json.tmp``, ``json.dump(...,
  indent=2, sort_keys=True)`` of ``version``, ``num_sequences``, ``total_tokens``,
  ``tokens_dtype``, ``mask_dtype``, ``offsets_dtype``, ``lengths_dtype`` and the caller's
  ``extra_manifest`` (its chat SFT stage's keys below). No checksums. An empty input still
  finalizes: empty files and zero counts.
- A packed Parquet shard (``ParquetShardWriter``): ``input_ids list<int32>``,
  ``loss_mask list<uint8>`` (aligned per sub-sequence, as packlab's), ``seq_start_id
  list<int32>``, zstd, row groups of 1000 rows, no packlab metadata.
- An output directory: ``shard_{i:06d}.parquet`` beside ``spool/shard_{i:06d}/``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packlab.bins import PackedBin

SCHEMA = pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.uint8())),
                    ("seq_start_id", pa.list_(pa.int32()))])
ROW_GROUP = 1000


def chat_sft_extra(shard_index: int, **overrides: Any) -> dict[str, Any]:
    """The ``extra_manifest`` Nemotron's chat SFT spool stage passes (its keys, our values)."""
    extra: dict[str, Any] = {
        "shard_id": f"shard_{shard_index:06d}", "shard_index": shard_index,
        "created_at": "2026-11-21T10:00:00Z", "input_files": ["/data/chat/part-00000.jsonl"],
        "messages_field": "messages", "tools_field": "tools", "chat_template": "nano3",
        "max_doc_tokens": None, "max_rows": None, "seed": 1234, "used_in_filter": None,
        "used_in_field": "used_in", "pack_size": 4096, "algorithm": "first_fit_shuffle",
        "dtype": "int32",
        "tokenization_stats": {"num_input_rows": 0, "num_output_sequences": 0,
                               "num_filtered": 0, "num_validation_errors": 0,
                               "num_truncated": 0, "num_errors": 0},
    }
    extra.update(overrides)
    return extra


def write_nemotron_spool(path: Path, sequences: Sequence[tuple[np.ndarray, np.ndarray]],
                         extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A spool as Nemotron's writer leaves it; returns its manifest."""
    path.mkdir(parents=True, exist_ok=True)
    names = ("tokens.bin", "masks.bin", "offsets.bin", "lengths.bin")
    handles = {name: open(path / f"{name}.tmp", "ab") for name in names}  # noqa: SIM115
    total = 0
    try:
        for tokens, mask in sequences:
            ids = np.asarray(tokens, dtype=np.int32)
            if ids.size == 0:
                continue  # Nemotron's append skips empty sequences
            handles["offsets.bin"].write(np.array([total], dtype=np.uint64).tobytes())
            handles["lengths.bin"].write(np.array([ids.size], dtype=np.uint32).tobytes())
            handles["tokens.bin"].write(ids.tobytes())
            handles["masks.bin"].write(np.asarray(mask, dtype=np.uint8).tobytes())
            total += int(ids.size)
    finally:
        for f in handles.values():
            f.close()
    for name in names:
        os.rename(path / f"{name}.tmp", path / name)
    count = (path / "lengths.bin").stat().st_size // 4
    manifest = {"version": "spool_v1", "num_sequences": count, "total_tokens": total,
                "tokens_dtype": "int32", "mask_dtype": "uint8", "offsets_dtype": "uint64",
                "lengths_dtype": "uint32", **(extra or {})}
    with open(path / "manifest.json.tmp", "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
    os.rename(path / "manifest.json.tmp", path / "manifest.json")
    return manifest


def write_nemotron_parquet(path: Path, bins: Sequence[PackedBin]) -> None:
    """A packed Parquet shard as Nemotron's ParquetShardWriter writes it (no packlab metadata)."""
    writer = pq.ParquetWriter(str(path), SCHEMA, compression="zstd")
    try:
        for lo in range(0, len(bins), ROW_GROUP):
            part = bins[lo:lo + ROW_GROUP]
            table = pa.table({
                "input_ids": pa.array([b.input_ids.tolist() for b in part], SCHEMA[0].type),
                "loss_mask": pa.array([b.loss_mask.tolist() for b in part], SCHEMA[1].type),
                "seq_start_id": pa.array([b.seq_start_id.tolist() for b in part],
                                         SCHEMA[2].type),
            }, schema=SCHEMA)
            writer.write_table(table, row_group_size=ROW_GROUP)
    finally:
        writer.close()


def length_mix(count: int, seed: int) -> np.ndarray:
    """Sequence lengths from a mix packlab's defaults were never tuned to: short chat turns,
    a lognormal body, a long tail past common pack sizes, and single tokens."""
    rng = np.random.default_rng(seed)
    kind = rng.choice(4, size=count, p=[0.4, 0.53, 0.02, 0.05])
    short = rng.integers(2, 48, size=count)
    body = np.rint(rng.lognormal(4.6, 0.8, size=count)).astype(np.int64)
    long = rng.integers(1200, 6000, size=count)
    lengths = np.choose(kind, [short, body, long, np.ones(count, dtype=np.int64)])
    return np.maximum(lengths, 1)


def random_sequences(lengths: np.ndarray, seed: int, vocab: int = 131_072
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Tokens and chat-like masks (a prompt of 0s, then a response of 1s) for each length."""
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths.tolist():
        prompt = int(rng.integers(0, n + 1))
        mask = np.zeros(n, dtype=np.uint8)
        mask[prompt:] = 1
        out.append((rng.integers(0, vocab, size=n, dtype=np.int32), mask))
    return out
