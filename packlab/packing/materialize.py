"""Materialize bins from a spool and an assignment, one at a time, into reusable buffers.

The loss mask is aligned for next-token prediction *within each sub-sequence*:
``loss_mask[j] = mask[j + 1]`` when ``j + 1`` is in the same sub-sequence, and the last
position of every sub-sequence is 0. (The design documents roll the whole bin's mask right by
one instead: off by two from this and leaking loss across boundaries; see notebook 02.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from packlab.bins import PackedBin, cumulative_offsets
from packlab.errors import FormatError, PacklabError
from packlab.packing import BinAssignment
from packlab.spool import SpoolReader
from packlab.storage.reads import ReadAdvice, advise, compact, lookup, opened, release_views

_preadv = os.preadv


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


class SpoolRuns:
    """A spool's tokens and masks as bins read them: each sequence's run ``pread`` from each
    file into buffers the caller gives (never through a map: a process reading a spool at
    random holds what it read, not the spool; see :mod:`packlab.storage.reads`). Masks derived from
    chat markers (a Megatron prefix without its sidecar) are sliced from RAM instead.

    A cold run of reads (the first, or one whose first page is not cached) asks for every
    sequence of the bin at once before it reads any (:class:`~packlab.storage.reads.ReadAdvice`)."""

    __slots__ = ("tokens", "token_at", "dtype", "width", "masks", "mask_at", "derived",
                 "advice", "path")

    def __init__(self, spool: SpoolReader) -> None:
        tokens, masks = spool.columns["tokens"], spool.columns.get("masks")
        self.path = spool.path
        self.tokens, self.token_at, self.dtype = opened(tokens.path), tokens.offset, tokens.dtype
        self.width = tokens.dtype.itemsize
        self.masks = None if masks is None else opened(masks.path)
        self.mask_at = 0 if masks is None else masks.offset
        self.derived = None if masks is not None else spool.masks  # in RAM, from the markers
        self.advice = ReadAdvice(self.tokens.fd)

    def read(self, starts: list[int], counts: list[int], ids: np.ndarray, mask: np.ndarray
             ) -> None:
        """Sequences at tokens ``starts`` (``counts`` of each) end to end into ``ids`` (the
        spool's token dtype) and ``mask`` (uint8, unshifted), both ``sum(counts)`` long."""
        width, tfd, tat = self.width, self.tokens.fd, self.token_at
        if self.advice.first(tat + width * starts[0], width * counts[0]):  # cold: all at once
            for s, c in zip(starts, counts, strict=True):
                advise(tfd, tat + width * s, width * c)
                if self.masks is not None:
                    advise(self.masks.fd, self.mask_at + s, c)
        into = memoryview(ids).cast("B")
        pos = 0
        for s, c in zip(starts, counts, strict=True):
            if _preadv(tfd, [into[width * pos:width * (pos + c)]], tat + width * s) != width * c:
                raise FormatError(f"{self.tokens.path}: sequence at token {s}: past the end of "
                                  "the file (truncated spool)")
            pos += c
        if self.masks is None:
            assert self.derived is not None
            mask[:] = np.concatenate([self.derived[s:s + c] for s, c in
                                      zip(starts, counts, strict=True)])
            return
        mfd, mat, into, pos = self.masks.fd, self.mask_at, memoryview(mask), 0
        for s, c in zip(starts, counts, strict=True):
            if _preadv(mfd, [into[pos:pos + c]], mat + s) != c:
                raise FormatError(f"{self.masks.path}: sequence at token {s}: past the end of "
                                  "the file (truncated spool)")
            pos += c


class BinMaterializer:
    """Builds one bin at a time from the spool, its sequences read by :class:`SpoolRuns` (a
    writer's resident memory is its buffers, whatever the spool's size).

    The whole assignment is checked against the spool once, here (every bin non-empty and
    within ``pack_size``, every sequence inside the spool, over-long ones as the policy says);
    what a read needs stays in RAM: per sequence its first token and its kept length (6 to 12
    bytes: 4 or 8 for the offset, 2 or 4 for the length), per bin 4 or 8 bytes.

    ``materialize(b)`` returns views into scratch buffers, valid until the next call (what a
    writer streams); ``materialize(b, copy=True)`` arrays of the bin's own (a reader's).
    """

    def __init__(self, spool: SpoolReader, assignment: BinAssignment) -> None:
        self.spool = spool
        self.assignment = assignment
        self.pack_size = size = assignment.pack_size
        self._tokens = np.zeros(size, dtype=np.int32)
        self._raw_mask = np.zeros(size, dtype=np.uint8)
        self._loss_mask = np.zeros(size, dtype=np.uint8)
        self._starts = np.zeros(size, dtype=np.int32)
        indices = np.asarray(assignment.seq_indices)
        bounds = np.asarray(assignment.bin_offsets, dtype=np.int64)
        where = spool.path
        max_index = int(indices.max()) if indices.size else -1
        if max_index >= spool.num_sequences:
            raise PacklabError(f"{where}: the assignment names sequence {max_index}, "
                               f"the spool has {spool.num_sequences}")
        if indices.size and int(indices.min()) < 0:
            raise PacklabError(f"{where}: the assignment names sequence {int(indices.min())}")
        empty = np.diff(bounds) <= 0
        if empty.any():
            raise PacklabError(f"{where}: bin {int(np.argmax(empty))}: the assignment gives it "
                               "no sequence")
        lengths = spool.lengths[indices].astype(np.int64)
        offsets = spool.offsets[indices]
        # the index pages this gather touched (the spool's, the assignment's when mapped)
        release_views(spool.lengths, spool.offsets, indices, assignment.bin_offsets)
        long = lengths > size
        if assignment.overlong != "truncate" and long.any():
            k = int(np.argmax(long))
            raise PacklabError(f"{where}: bin {_bin_of(bounds, k)}: sequence {int(indices[k])} "
                               f"has {int(lengths[k])} tokens, more than pack_size {size}, and "
                               "the assignment does not truncate")
        kept = np.minimum(lengths, size, out=lengths)
        past = (kept <= 0) | (offsets > np.uint64(spool.num_tokens)) | (
            offsets.astype(np.int64) > spool.num_tokens - kept)
        if past.any():
            k = int(np.argmax(past))
            raise FormatError(f"{where}: bin {_bin_of(bounds, k)}: sequence {int(indices[k])} at "
                              f"offset {int(offsets[k])} runs past the spool's "
                              f"{spool.num_tokens} tokens (corrupted offsets.bin)")
        ends = cumulative_offsets(kept)
        over = ends[bounds[1:]] - ends[bounds[:-1]] > size
        del ends
        if over.any():
            raise PacklabError(f"{where}: bin {int(np.argmax(over))}: sequences need more than "
                               f"pack_size {size} tokens (assignment does not match this spool)")
        self._runs = SpoolRuns(spool)
        self._bounds = lookup(compact(bounds))
        self._offsets = compact(offsets.astype(np.int64))
        self._kept = kept.astype(np.uint16) if size < 1 << 16 else compact(kept)
        self.nbytes = self._offsets.nbytes + self._kept.nbytes + bounds.shape[0] * 8

    @property
    def raw_mask(self) -> np.ndarray:
        """The spool's (unshifted) mask of the last bin materialized."""
        return self._raw_mask[:self._last]

    def materialize(self, bin_id: int, *, copy: bool = False) -> PackedBin:
        if not 0 <= bin_id < self.assignment.num_bins:
            raise IndexError(
                f"{self.spool.path}: bin {bin_id} out of range [0, {self.assignment.num_bins})"
            )
        lo, hi = self._bounds[bin_id], self._bounds[bin_id + 1]
        counts = self._kept[lo:hi]
        k = hi - lo
        starts = np.empty(k, dtype=np.int32) if copy else self._starts[:k]
        starts[0] = 0
        np.cumsum(counts[:-1], out=starts[1:])
        n = int(starts[-1]) + int(counts[-1])
        self._last = n
        ids = np.empty(n, dtype=np.int32) if copy else self._tokens[:n]
        raw = self._raw_mask[:n]
        wide = self._runs.dtype == np.int32
        into = ids if wide else np.empty(n, dtype=self._runs.dtype)
        self._runs.read(self._offsets[lo:hi].tolist(), counts.tolist(), into, raw)
        if not wide:
            ids[:] = into
        loss = np.empty(n, dtype=np.uint8) if copy else self._loss_mask[:n]
        align_loss_mask(raw, starts, loss)
        return PackedBin(ids, loss, starts)


def _bin_of(bounds: np.ndarray, k: int) -> int:
    """The bin holding the assignment's ``k``-th sequence."""
    return int(np.searchsorted(bounds, k, side="right") - 1)


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
