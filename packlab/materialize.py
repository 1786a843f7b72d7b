"""Materialize bins from a spool and an assignment, one at a time, into reusable buffers.

The loss mask is aligned for next-token prediction *within each sub-sequence*:
``loss_mask[j] = mask[j + 1]`` when ``j + 1`` is in the same sub-sequence, and the last
position of every sub-sequence is 0. (The design documents roll the whole bin's mask right by
one instead: off by two from this and leaking loss across boundaries; see notebook 02.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from packlab.bins import PackedBin
from packlab.errors import FormatError, PacklabError
from packlab.packing import BinAssignment
from packlab.spool import SpoolReader


def align_loss_mask(mask: np.ndarray, seq_start_id: np.ndarray, out: np.ndarray) -> None:
    """Write the next-token loss mask of a bin into ``out`` (same length as ``mask``)."""
    n = mask.shape[0]
    out[: n - 1] = mask[1:n]
    out[n - 1] = 0
    if seq_start_id.shape[0] > 1:
        out[seq_start_id[1:] - 1] = 0


def roll_whole_bin(mask: np.ndarray) -> np.ndarray:
    """The design documents' alignment (shift right by one over the whole bin). Kept only to
    show, in notebook 02 and the tests, how it differs from :func:`align_loss_mask`."""
    out = np.zeros_like(mask)
    out[1:] = mask[:-1]
    return out


class BinMaterializer:
    """Fills one bin at a time into scratch buffers sized ``pack_size``.

    The returned :class:`PackedBin` holds views into the scratch buffers: valid until the next
    call (``copy()`` it to keep it). No Python lists, no per-token work in Python.
    """

    def __init__(self, spool: SpoolReader, assignment: BinAssignment) -> None:
        self.spool = spool
        self.assignment = assignment
        self.pack_size = assignment.pack_size
        self._tokens = np.zeros(self.pack_size, dtype=np.int32)
        self._raw_mask = np.zeros(self.pack_size, dtype=np.uint8)
        self._loss_mask = np.zeros(self.pack_size, dtype=np.uint8)
        self._starts = np.zeros(self.pack_size, dtype=np.int32)
        indices = assignment.seq_indices
        max_index = int(indices.max()) if indices.size else -1
        if max_index >= spool.num_sequences:
            raise PacklabError(
                f"{spool.path}: the assignment names sequence {max_index}, "
                f"the spool has {spool.num_sequences}"
            )
        if indices.size and int(indices.min()) < 0:
            raise PacklabError(f"{spool.path}: the assignment names sequence {int(indices.min())}")
        # Plain ndarray views of the spool's memory maps: slicing a np.memmap builds a memmap
        # object per slice, which costs more than copying a short sequence.
        self._spool_tokens = spool.tokens.view(np.ndarray)
        self._spool_masks = spool.masks.view(np.ndarray)
        self._spool_offsets = spool.offsets.view(np.ndarray)
        self._spool_lengths = spool.lengths.view(np.ndarray)

    def materialize(self, bin_id: int) -> PackedBin:
        if not 0 <= bin_id < self.assignment.num_bins:
            raise IndexError(
                f"{self.spool.path}: bin {bin_id} out of range [0, {self.assignment.num_bins})"
            )
        pos = 0
        indices = self.assignment.bin_indices(bin_id)
        if indices.shape[0] == 0:
            raise PacklabError(f"{self.spool.path}: bin {bin_id}: the assignment gives it no sequence")
        seq_offsets = self._spool_offsets[indices].tolist()
        seq_lengths = self._spool_lengths[indices].tolist()
        tokens, masks = self._spool_tokens, self._spool_masks
        for k, seq in enumerate(indices.tolist()):
            start = seq_offsets[k]
            n = seq_lengths[k]
            if n > self.pack_size:
                if self.assignment.overlong != "truncate":
                    raise PacklabError(
                        f"{self.spool.path}: bin {bin_id}: sequence {seq} has {n} tokens, more "
                        f"than pack_size {self.pack_size}, and the assignment does not truncate"
                    )
                n = self.pack_size
            if pos + n > self.pack_size:
                raise PacklabError(
                    f"{self.spool.path}: bin {bin_id}: sequences need more than pack_size "
                    f"{self.pack_size} tokens (assignment does not match this spool)"
                )
            if start + n > self.spool.num_tokens:
                raise FormatError(
                    f"{self.spool.path}: bin {bin_id}: sequence {seq} at offset {start} runs "
                    f"past the spool's {self.spool.num_tokens} tokens (corrupted offsets.bin)"
                )
            self._starts[k] = pos
            self._tokens[pos : pos + n] = tokens[start : start + n]
            self._raw_mask[pos : pos + n] = masks[start : start + n]
            pos += n
        starts = self._starts[: indices.shape[0]]
        align_loss_mask(self._raw_mask[:pos], starts, self._loss_mask[:pos])
        return PackedBin(self._tokens[:pos], self._loss_mask[:pos], starts)


class BinMasks(NamedTuple):
    """One bin's masks side by side: the spool's raw mask and its two alignments."""

    raw: np.ndarray  # the spool's learn mask, unshifted
    aligned: np.ndarray  # per sub-sequence next-token alignment (what packlab stores)
    rolled: np.ndarray  # the design documents' whole-bin roll
    seq_start_id: np.ndarray


def bin_masks(materializer: BinMaterializer, bin_id: int) -> BinMasks:
    """Materialize bin ``bin_id`` and return its masks (copies) for comparison."""
    packed = materializer.materialize(bin_id)
    raw = materializer._raw_mask[: packed.packed_len].copy()
    return BinMasks(raw, packed.loss_mask.copy(), roll_whole_bin(raw), packed.seq_start_id.copy())


def alignment_errors(spool: SpoolReader, assignment: BinAssignment) -> dict[str, int]:
    """Where the whole-bin roll goes wrong, counted over every bin of an assignment.

    ``differ``: positions whose loss differs from the per-sequence alignment; ``leaking``:
    positions where the roll trains a sub-sequence's last token to predict the *next*
    sequence's first token (loss across a boundary); ``missed`` / ``spurious``: positions the
    roll leaves out / adds; ``bins_failing``: bins ``check_bin`` would refuse.
    """
    materializer = BinMaterializer(spool, assignment)
    counts = dict.fromkeys(("bins", "tokens", "targets", "differ", "leaking", "missed",
                            "spurious", "bins_failing"), 0)
    for b in range(assignment.num_bins):
        m = bin_masks(materializer, b)
        last = np.append(m.seq_start_id[1:], m.raw.shape[0]) - 1
        leaking = int(m.rolled[last].sum())
        counts["bins"] += 1
        counts["tokens"] += int(m.raw.shape[0])
        counts["targets"] += int(m.aligned.sum())
        counts["differ"] += int((m.rolled != m.aligned).sum())
        counts["leaking"] += leaking
        counts["missed"] += int((m.aligned > m.rolled).sum())
        counts["spurious"] += int((m.rolled > m.aligned).sum())
        counts["bins_failing"] += int(leaking > 0)
    return counts


def iter_bins(
    spool: SpoolReader,
    assignment: BinAssignment,
    *,
    start: int = 0,
    stop: int | None = None,
    copy: bool = False,
) -> Iterator[PackedBin]:
    """Bins ``start:stop`` in order; views into scratch buffers unless ``copy``."""
    materializer = BinMaterializer(spool, assignment)
    stop = assignment.num_bins if stop is None else stop
    for bin_id in range(start, stop):
        packed = materializer.materialize(bin_id)
        yield packed.copy() if copy else packed
