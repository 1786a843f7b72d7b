"""Megatron-Bridge's packed ``.sft`` pairs as Bridge writes them, for the tests: each item from
the facts alone (not packlab's encoder), the pair by megatron-core's own
``IndexedDatasetBuilder`` (Bridge's ``write_packed_indexed_dataset`` is not in the 0.6.2
release: it writes with this builder, ``dtype=np.int32``, one item and one document per pack).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from packlab.bins import PackedBin


def item_from_facts(packed: PackedBin) -> np.ndarray:
    """Bridge's item of one bin: ``[0x53465442, 1, n, starts..., words...]``, a word the id
    with the loss-mask bit on top (bit 31)."""
    ids, mask, starts = packed
    words = (ids.astype(np.uint32) | (mask.astype(np.uint32) << np.uint32(31))).view(np.int32)
    header = np.array([0x53465442, 1, len(starts)], dtype=np.int32)
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
