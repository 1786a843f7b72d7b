"""Raw CSR: the three columns as flat ``.npy`` arrays plus two offset arrays, memory-mapped.

The least a reader of these bytes can do: ``np.load(mmap_mode="r")`` of each file once, taken
as plain ndarray views, then bin ``i`` is three slices. Also how the reference travels to a peer in another environment
(:func:`load_reference`). On disk, one directory::

    input_ids.npy      int32[num_tokens]
    loss_mask.npy      uint8[num_tokens]
    seq_start_id.npy   int32[num_seqs]
    token_offsets.npy  int64[num_bins + 1]   bin b = input_ids[token_offsets[b]:token_offsets[b+1]]
    seq_offsets.npy    int64[num_bins + 1]   its seq_start_id = seq_start_id[seq_offsets[b]:...]
    meta.json          {"pack_size": 4096, "vocab_size": 131072}
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from packlab.formats.shared.arrow_lists import BinColumns
from packlab.lab.measure.peers.base import Opened, Peer, Reference

ARRAYS = BinColumns._fields


class RawCsr(Peer):
    NAME = "raw_csr"
    LABEL = "raw CSR numpy memmap"
    LIBRARY = False

    def write(self, reference: Reference, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name, array in zip(ARRAYS, reference.columns, strict=True):
            np.save(directory / f"{name}.npy", array)
        (directory / "meta.json").write_text(json.dumps(
            {"pack_size": reference.pack_size, "vocab_size": reference.vocab_size}))

    def open(self, directory: Path) -> Opened:
        # plain ndarray views of the maps: slicing an np.memmap builds a memmap object per slice
        maps = [np.load(directory / f"{name}.npy", mmap_mode="r") for name in ARRAYS]
        ids, mask, starts, tok, seq = (m.view(np.ndarray) for m in maps)

        def read(i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            t0, t1 = tok[i], tok[i + 1]
            s0, s1 = seq[i], seq[i + 1]
            return ids[t0:t1], mask[t0:t1], starts[s0:s1]

        return Opened(read, keep=maps)


def load_reference(directory: str | Path) -> Reference:
    """A :class:`Reference` from a raw CSR directory (read into RAM)."""
    root = Path(directory)
    meta = json.loads((root / "meta.json").read_text())
    columns = BinColumns(*(np.load(root / f"{name}.npy") for name in ARRAYS))
    return Reference(columns, int(meta["pack_size"]), meta.get("vocab_size"))
