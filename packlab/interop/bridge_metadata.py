"""The pack-metadata JSON Megatron-Bridge reads beside packed data, written by packlab.

Bridge's fixed-shape batches (``pad_cu_seqlens=True``, for CUDA graphs) need, per packed
dataset, how many sequences a bin holds at most and how long sequences and bins are. Its
offline packer writes them as a JSON *list* of dicts, one per packed split, which its dataset
classes read through ``pack_metadata_file_path`` (``PackedSequenceSpecs.packed_metadata_path``
in a recipe)::

    [{"dataset_max_seqlen": 2047, "max_samples_per_bin": 31, "packing_factor": 8.74,
      "packing_efficiency": 97.31, "pack_size": 4096, "min_packed_seqlen": 3571}]

Every length in it is in Bridge's terms: next-token positions, ``L - 1`` for a sequence of
``L`` tokens (:data:`packlab.bins.CONVENTIONS`): ``dataset_max_seqlen`` is the longest
sequence's positions, ``min_packed_seqlen`` the fewest positions of any bin,
``packing_efficiency`` the bins' positions over ``pack_size`` in percent (rounded as Bridge
rounds). For packlab's bins ``pack_size`` is packlab's pack size: give Bridge the same number
as ``packed_sequence_size`` / ``max_seq_length`` (a packlab bin of ``P`` tokens has fewer than
``P`` positions, so it always fits).

``packlab pack`` writes ``OUT/pack_metadata.json`` beside ``dataset.json`` (from the plan,
before the dataset record is marked complete); :func:`metadata_of_bins` computes it for any
dataset (a converted one, or Bridge's own files, where it reproduces Bridge's file).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from packlab.bins import PackedBin
from packlab.errors import FormatError, PacklabError
from packlab.packing import BinAssignment
from packlab.storage.files import staged

PACK_METADATA_FILE = "pack_metadata.json"
KEYS = ("dataset_max_seqlen", "max_samples_per_bin", "packing_factor", "packing_efficiency",
        "pack_size", "min_packed_seqlen")


def pack_metadata(packed_lengths: np.ndarray, seqs_per_bin: np.ndarray, longest_sequence: int,
                  pack_size: int) -> dict[str, Any]:
    """Bridge's metadata of one packed dataset from its bins' stored lengths, their sequence
    counts and its longest sequence in tokens (all converted to positions here)."""
    packed = np.asarray(packed_lengths, dtype=np.int64)
    seqs = np.asarray(seqs_per_bin, dtype=np.int64)
    if packed.size == 0 or packed.shape != seqs.shape:
        raise PacklabError("pack metadata: needs one length and one sequence count per bin")
    positions = packed - seqs
    num_bins = int(packed.shape[0])
    return {
        "dataset_max_seqlen": int(longest_sequence) - 1,
        "max_samples_per_bin": int(seqs.max()),
        "packing_factor": round(int(seqs.sum()) / num_bins, 2),
        "packing_efficiency": round(int(positions.sum()) / num_bins / int(pack_size) * 100, 2),
        "pack_size": int(pack_size),
        "min_packed_seqlen": int(positions.min()),
    }


def metadata_of_assignment(assignment: BinAssignment, spool_lengths: np.ndarray
                           ) -> dict[str, Any]:
    """The metadata of the bins an assignment will write (from the lengths alone, no token
    read; over-long sequences counted as the bins keep them, truncated to ``pack_size``)."""
    kept = np.minimum(np.asarray(spool_lengths)[assignment.seq_indices].astype(np.int64),
                      assignment.pack_size)
    return pack_metadata(assignment.bin_lengths(spool_lengths),
                         np.diff(np.asarray(assignment.bin_offsets)), int(kept.max()),
                         assignment.pack_size)


def metadata_of_bins(bins: Iterable[PackedBin], pack_size: int) -> dict[str, Any]:
    """The metadata of any bins (a dataset's ``iter_bins()``, say): one pass, memory bounded
    by one bin plus two integers per bin."""
    packed: list[int] = []
    seqs: list[int] = []
    longest = 0
    for b in bins:
        n = int(b.input_ids.shape[0])
        starts = np.asarray(b.seq_start_id, dtype=np.int64)
        packed.append(n)
        seqs.append(int(starts.shape[0]))
        longest = max(longest, int(np.diff(np.append(starts, n)).max()))
    return pack_metadata(np.array(packed), np.array(seqs), longest, pack_size)


def write_pack_metadata(directory: str | os.PathLike[str], metadata: dict[str, Any]) -> Path:
    """Publish ``directory/pack_metadata.json`` (a one-entry list, as Bridge reads it); the
    same content already there is left alone (a rerun that reuses every shard rewrites
    nothing)."""
    final = Path(directory) / PACK_METADATA_FILE
    text = json.dumps([metadata], indent=2) + "\n"
    if final.is_file() and final.read_text() == text:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with staged(final, overwrite=True) as tmp:
        tmp.write_text(text)
    return final


def read_pack_metadata(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """A pack-metadata file (packlab's or Bridge's), checked; errors name the file."""
    path = Path(path)
    if path.is_dir():
        path = path / PACK_METADATA_FILE
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise FormatError(f"{path}: unreadable pack metadata: {exc}") from None
    if not isinstance(entries, list) or not entries or not all(
            isinstance(e, dict) and all(isinstance(e.get(k), int | float) for k in KEYS)
            for e in entries):
        raise FormatError(f"{path}: not a pack-metadata list (each entry needs {', '.join(KEYS)})")
    return entries
