"""The inputs the README's interop sections start from, made the way their projects make them,
so a newcomer runs those sections from an empty folder (and the tests run them as printed).

- **Nemotron's output directory** (:func:`nemotron_output`): Nemotron's data_prep documents its
  files and these functions write what it writes (no Nemotron code is used or copied; Nemotron
  is no package on the registry). A spool (``SequenceSpoolWriter``): ``tokens.bin`` int32,
  ``masks.bin`` uint8 (unshifted), ``offsets.bin`` uint64, ``lengths.bin`` uint32, appended one
  sequence at a time; ``manifest.json`` written last through ``manifest.json.tmp``,
  ``json.dump(..., indent=2, sort_keys=True)`` of ``version``, ``num_sequences``,
  ``total_tokens``, the ``*_dtype`` keys and the caller's ``extra_manifest`` (its chat SFT
  stage's keys: :func:`chat_sft_extra`). No checksums. A packed Parquet shard
  (``ParquetShardWriter``): ``input_ids list<int32>``, ``loss_mask list<uint8>`` (aligned per
  sub-sequence), ``seq_start_id list<int32>``, zstd, row groups of 1000 rows, no packlab
  metadata. The directory: ``shard_{i:06d}.parquet`` beside ``spool/shard_{i:06d}/``.
- **Megatron-Bridge's packed ``.sft`` pairs** (:func:`bridge_sft_pairs`): each item from the
  format's facts alone (not packlab's encoder), the pair written by megatron-core's own
  ``IndexedDatasetBuilder``, as Bridge's ``write_packed_indexed_dataset`` writes it (``dtype
  np.int32``, one item and one document per pack; not in the 0.6.2 release).
- **What Bridge's offline packer and packed datasets read** of their inputs:
  :class:`BridgeTokenizer` (``eos_id``, ``eod``: all they read of a tokenizer) and
  :class:`TokenizedSpool`, a packlab spool as the tokenized split its ``dataset_builder``
  returns (Bridge's own builder tokenizes a JSONL with the recipe's tokenizer instead).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packlab.bins import PackedBin
from packlab.packing import pack
from packlab.packing.materialize import iter_bins
from packlab.spool import SpoolReader

ROW_GROUP = 1000
SFT_MAGIC = 0x53465442  # "SFTB"


# -- Nemotron ---------------------------------------------------------------------------------
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
    """A spool as Nemotron's writer leaves it; returns its record."""
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
    record = {"version": "spool_v1", "num_sequences": count, "total_tokens": total,
              "tokens_dtype": "int32", "mask_dtype": "uint8", "offsets_dtype": "uint64",
              "lengths_dtype": "uint32", **(extra or {})}
    with open(path / "manifest.json.tmp", "w") as f:
        json.dump(record, f, indent=2, sort_keys=True)
    os.rename(path / "manifest.json.tmp", path / "manifest.json")
    return record


def nemotron_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.uint8())),
                      ("seq_start_id", pa.list_(pa.int32()))])


def write_nemotron_parquet(path: Path, bins: Sequence[PackedBin]) -> None:
    """A packed Parquet shard as Nemotron's ParquetShardWriter writes it (no packlab metadata)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = nemotron_schema()
    writer = pq.ParquetWriter(str(path), schema, compression="zstd")
    try:
        for lo in range(0, len(bins), ROW_GROUP):
            part = bins[lo:lo + ROW_GROUP]
            table = pa.table({
                "input_ids": pa.array([b.input_ids.tolist() for b in part], schema[0].type),
                "loss_mask": pa.array([b.loss_mask.tolist() for b in part], schema[1].type),
                "seq_start_id": pa.array([b.seq_start_id.tolist() for b in part],
                                         schema[2].type),
            }, schema=schema)
            writer.write_table(table, row_group_size=ROW_GROUP)
    finally:
        writer.close()


def nemotron_output(spool: str | os.PathLike[str], out: str | os.PathLike[str], *,
                    pack_size: int = 4096, seed: int = 0) -> Path:
    """Nemotron's output directory for the sequences of ``spool``: ``out/spool/shard_000000/``
    (Nemotron's spool of them) beside ``out/shard_000000.parquet`` (their bins, packed by
    first fit on a shuffled order, Nemotron's default). Returns ``out``."""
    reader = SpoolReader(spool)
    root = Path(out)
    if root.exists():
        raise FileExistsError(f"{root}: already exists")
    spool_dir = root / "spool" / "shard_000000"
    write_nemotron_spool(spool_dir, [reader.read_sequence(i) for i in range(reader.num_sequences)],
                         chat_sft_extra(0, pack_size=pack_size))
    written = SpoolReader(spool_dir)
    assignment, _ = pack(written.lengths, pack_size, seed=seed)
    write_nemotron_parquet(root / "shard_000000.parquet",
                           [b.copy() for b in iter_bins(written, assignment)])
    return root


# -- Megatron-Bridge -------------------------------------------------------------------------
def item_from_facts(packed: PackedBin) -> np.ndarray:
    """Bridge's item of one bin: ``[0x53465442, 1, n, starts..., words...]``, a word the id
    with the loss-mask bit on top (bit 31)."""
    ids, mask, starts = packed
    words = (ids.astype(np.uint32) | (mask.astype(np.uint32) << np.uint32(31))).view(np.int32)
    header = np.array([SFT_MAGIC, 1, len(starts)], dtype=np.int32)
    return np.concatenate((header, starts.astype(np.int32), words))


def builder_pair(prefix: Path, items: list[np.ndarray]) -> Path:
    """A pair written as Bridge writes one: megatron-core's builder, int32, one item and one
    document per pack. Returns its ``.idx``."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix.parent.mkdir(parents=True, exist_ok=True)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    for item in items:
        builder.add_item(torch.from_numpy(np.asarray(item, dtype=np.int32)))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")
    return Path(f"{prefix}.idx")


def bridge_sft_pairs(spool: str | os.PathLike[str], out: str | os.PathLike[str], *,
                     pack_size: int = 4096, pairs: int = 2, seed: int = 1) -> list[Path]:
    """The bins of ``spool`` (first fit on a shuffled order, ``seed``) as ``pairs`` pairs
    ``out/training_<pack_size>_<k>.sft.bin/.idx`` written as Bridge writes them, the bins in
    order, split as evenly as may be. Returns their ``.idx``."""
    reader = SpoolReader(spool)
    assignment, _ = pack(reader.lengths, pack_size, seed=seed)
    bins = [b.copy() for b in iter_bins(reader, assignment)]
    cuts = np.linspace(0, len(bins), pairs + 1).astype(int)
    return [builder_pair(Path(out) / f"training_{pack_size}_{k}.sft",
                         [item_from_facts(b) for b in bins[cuts[k]:cuts[k + 1]]])
            for k in range(pairs)]


class BridgeTokenizer:
    """What Bridge's packed datasets and offline packer read of a tokenizer: the EOS id
    (``eos_id``, and ``eod``, the same id). A recipe passes its own."""

    def __init__(self, eos_id: int) -> None:
        self.eos_id = int(eos_id)
        self.eod = int(eos_id)


class TokenizedSpool:
    """A packlab spool as the tokenized split Bridge's offline packer asks its
    ``dataset_builder`` for: items ``{"input_ids", "loss_mask"}`` (lists, the mask unshifted,
    as Bridge's SFT datasets give it), a ``tokenizer`` and ``pad_seq_length_to_mult``."""

    def __init__(self, spool: Any, eos_id: int, pad_seq_length_to_mult: int) -> None:
        self.spool = spool if isinstance(spool, SpoolReader) else SpoolReader(spool)
        self.tokenizer = BridgeTokenizer(eos_id)
        self.pad_seq_length_to_mult = pad_seq_length_to_mult

    def __len__(self) -> int:
        return self.spool.num_sequences

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        tokens, mask = self.spool.read_sequence(i)
        return {"input_ids": tokens.tolist(), "loss_mask": mask.tolist()}
