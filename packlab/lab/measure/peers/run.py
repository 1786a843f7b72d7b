"""The side-by-side run: every system prepared, verified, warmed, then timed interleaved.

One :func:`compare` call, the same rules for every system:

1. **Written** from the same :class:`~packlab.lab.measure.peers.base.Reference` bins into the
   system (its own writer), **opened** with its own reader and **verified**: every bin read
   back equals the reference in every column the system stores (values, whatever the dtype).
   A system that cannot be installed or run here is skipped, the reason kept.
2. A **warm pass**: every bin read in order and delivered, then the timed reads.
3. **One seeded index list**, read in rounds by the one timing loop of
   :mod:`packlab.lab.measure.timing` (:func:`timed_loop`): each round every system reads the
   round's slice of the list, one system after another, in an order drawn anew each round;
   each read timed alone with ``perf_counter_ns`` and *delivered*: every array it returned
   (a dict's values, or the sequence) copied byte for byte into a preallocated buffer inside
   the timer, the same copy for every system
   (:meth:`packlab.lab.measure.delivery.Sink.timed_arrays`).
4. **Floors in the same loop** (:mod:`packlab.lab.measure.floors`): a memcpy of the bytes of
   the bin's three columns (:class:`~packlab.lab.measure.floors.Memcpy`, through the same
   delivery), and the **in-RAM Python floor**: packlab's access path
   (``open_dataset(shard)[i]``) over the same bins held in RAM
   (:func:`packlab.lab.measure.floors.python_floor`). ``raw_csr`` is the floor of the bytes.
5. **Bytes on disk**: every file of the system's data, as written and again after the reads
   (a system that decompresses or caches on read, as MDS does, grows), over the tokens.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packlab.errors import PacklabError
from packlab.lab.measure.delivery import Budget, Sink, percentiles
from packlab.lab.measure.floors import FLOOR_LABELS, FLOORS, Memcpy, python_floor
from packlab.lab.measure.peers.base import COLUMNS, Opened, Peer, Reference, arrays_of, bytes_of
from packlab.lab.measure.timing import Lane, interleaved

ROUNDS = 20
SETTLE = 10  # untimed reads before each system's slice of a round


@dataclass
class Prepared:
    """A system written, opened and verified."""

    peer: Peer
    directory: Path
    opened: Opened
    bytes_written: int
    write_seconds: float
    verified_bins: int


def verify(peer: Peer, opened: Opened, reference: Reference,
           max_seconds: float | None = None) -> int:
    """Every bin read back equals the reference in the columns the system stores (bins in
    order; with ``max_seconds``, as many as fit, at least ``MIN_SAMPLES``); returns the bins
    checked. One clear error naming the system, bin and column otherwise."""
    wanted = [COLUMNS.index(c) for c in peer.COLUMNS]
    budget = Budget(max_seconds)
    for i in range(len(reference)):
        if budget.spent(i):
            return i
        got = peer.as_reference(arrays_of(opened.read(i)))
        expected = reference.bin(i)
        if len(got) != len(wanted):
            raise PacklabError(f"{peer.LABEL}: bin {i} came back with {len(got)} columns, "
                               f"expected {len(wanted)} ({', '.join(peer.COLUMNS)})")
        for array, k in zip(got, wanted, strict=True):
            if not np.array_equal(np.asarray(array), expected[k]):
                raise PacklabError(f"{peer.LABEL}: bin {i} column {COLUMNS[k]} differs from "
                                   "the reference")
    return len(reference)


def prepare(peer: Peer, reference: Reference, directory: Path,
            max_seconds: float | None = None) -> Prepared:
    """Write the reference into the system (a fresh directory; its library imported before
    the write is timed), open it, verify every bin (as many as ``max_seconds`` allows)."""
    if directory.exists():
        shutil.rmtree(directory)
    peer.load()
    began = time.perf_counter()
    peer.write(reference, directory)
    seconds = time.perf_counter() - began
    written = bytes_of(peer.files(directory))
    opened = peer.open(directory)
    try:
        verified = verify(peer, opened, reference, max_seconds)
    except BaseException:
        opened.close()
        raise
    return Prepared(peer, directory, opened, written, seconds, verified)


def dtypes_of(got: Sequence[Any]) -> str:
    return "/".join(str(np.asarray(a).dtype) for a in got)


def bin_bytes(reference: Reference) -> np.ndarray:
    """Bytes of each bin's three columns in the reference's dtypes (what the memcpy floor
    moves)."""
    c = reference.columns
    return (np.diff(c.token_offsets) * (c.input_ids.itemsize + c.loss_mask.itemsize)
            + np.diff(c.seq_offsets) * c.seq_start_id.itemsize)


def timed_loop(reads: dict[str, Callable[[int], Any]], indices: np.ndarray, sink: Sink, *,
               num_bins: int, rounds: int = ROUNDS, max_seconds: float | None = None,
               seed: int = 0, floors: Sequence[str] = ()
               ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Every system's read (and the ``floors`` among them) as a lane of
    :func:`packlab.lab.measure.timing.interleaved`, delivered by
    :meth:`~packlab.lab.measure.delivery.Sink.timed_arrays`: a warm pass (every bin, in order),
    then the index list in ``rounds`` slices, the systems' order drawn anew each round
    (``seed``), each slice after ``SETTLE`` untimed reads. Returns nanoseconds per read in
    index-list order, and the bins each system's warm pass read.

    Rounds rather than one index at a time across all systems: a system's reads run back to
    back (as in a training loop; a slow neighbour such as Lance's ``take`` would otherwise
    leave every next read a cold CPU cache), while the machine's slow moments still fall on
    every system alike. A new order each round, not the list rotated: rotated, a system
    always followed the same neighbour, and what a heavy one leaves behind fell on the same
    system every round (packlab's formats, listed after Vortex and Modalities, read 1.09x
    raw CSR behind them and 1.02x listed first). And each system's slice starts after
    ``SETTLE`` untimed reads (of the bins before it in the list): a training loop reads back
    to back, so what is timed is a read in stride, not the first after a neighbour emptied
    the CPU's caches. ``max_seconds``: each system's warm pass, and its timed reads, stop
    once they took that long (never before ``MIN_SAMPLES``): a system at 100 ms a read then
    reads a prefix of the list, and says so (the arrays are shorter)."""
    def lane(name: str, read: Callable[[int], Any]) -> Lane:
        return Lane(name, lambda i: sink.timed_arrays(read, i),
                    warm=lambda i: sink.timed_arrays(read, i),  # the same delivery
                    floor=name in floors)

    timings = interleaved([lane(name, read) for name, read in reads.items()],
                          np.asarray(indices), rounds=rounds, order="shuffle", settle=SETTLE,
                          max_seconds=max_seconds, warm_bins=num_bins, warm_seconds=max_seconds,
                          seed=seed)
    return timings.ns, timings.warmed


def compare(
    reference: Reference,
    out_dir: str | os.PathLike[str],
    peers: Sequence[Peer],
    *,
    floor_shard: str | os.PathLike[str],
    indices: np.ndarray,
    environment: str = "",
    max_seconds: float | None = None,
    seed: int = 0,
    log: Any = print,
) -> dict[str, Any]:
    """Prepare, verify and time ``peers`` (all of this environment) beside the floors.

    ``floor_shard``: a packlab shard of the same bins whose in-RAM copy is the Python floor.
    ``max_seconds``: each system's budget for each of verification, warm pass and timed reads
    (a slow system then checks, warms and reads fewer bins: ``verified_bins``, ``warm_bins``,
    ``samples`` say how many). ``seed``: the order of the systems in each round.
    Returns ``{"rows": [...], "skipped": [...]}``: a row per system and floor with p50/p90/p99
    and mean (µs), ``x_floor`` (p50 over the in-RAM Python floor's), ``x_raw_csr`` and
    ``x_memcpy`` where measured, bytes on disk and per token.
    """
    root = Path(out_dir)
    prepared: list[Prepared] = []
    skipped: list[dict[str, str]] = []
    for peer in peers:
        reason = peer.unavailable()
        if reason is None:
            try:
                prepared.append(prepare(peer, reference, root / peer.NAME, max_seconds))
                continue
            except Exception as exc:  # a system that cannot run here: skipped, said why
                reason = f"{type(exc).__name__}: {exc}"
        skipped.append({"system": peer.LABEL, "name": peer.NAME, "reason": reason})
        log(f"[peers] skipped {peer.LABEL}: {reason}")
    floor = python_floor(floor_shard)
    if len(floor) != len(reference):
        raise PacklabError(f"{floor_shard}: {len(floor)} bins, the reference {len(reference)}")
    sizes = bin_bytes(reference).tolist()
    memcpy = Memcpy(max(sizes))
    measured = ("memcpy", "python_floor")
    reads: dict[str, Any] = {p.peer.NAME: p.opened.read for p in prepared}
    reads["memcpy"] = lambda i: memcpy.read(sizes[i])
    reads["python_floor"] = floor.__getitem__
    sink = Sink(4 * reference.pack_size)
    try:
        ns, warmed = timed_loop(reads, np.asarray(indices), sink, num_bins=len(reference),
                                max_seconds=max_seconds, seed=seed, floors=measured)
        rows = [_row(p, ns[p.peer.NAME], reference, environment) for p in prepared]
        for row in rows:
            row["warm_bins"] = warmed[row["name"]]
    finally:
        for p in prepared:
            p.opened.close()
    rows += [{"system": FLOOR_LABELS[name], "name": name, "kind": "floor",
              "columns": "all three", "environment": environment or "venv",
              "samples": int(ns[name].shape[0]), **percentiles(ns[name])}
             for name in FLOORS if name in measured]
    _ratios(rows)
    return {"rows": rows, "skipped": skipped, "samples": int(len(indices))}


def _row(p: Prepared, ns: np.ndarray, reference: Reference, environment: str) -> dict[str, Any]:
    after = bytes_of(p.peer.files(p.directory))
    tokens = reference.num_tokens
    return {"system": p.peer.LABEL, "name": p.peer.NAME, "kind": p.peer.KIND,
            "columns": "all three" if p.peer.COLUMNS == COLUMNS else "tokens only",
            "dtypes": dtypes_of(arrays_of(p.opened.read(0))), "environment": environment or "venv",
            "verified_bins": p.verified_bins, "num_bins": len(reference),
            "samples": int(ns.shape[0]), "bytes_written": p.bytes_written,
            "bytes_on_disk": after, "bytes_per_token": after / tokens,
            "bytes_per_token_written": p.bytes_written / tokens,
            "write_seconds": p.write_seconds, "note": p.peer.NOTE, **percentiles(ns)}


def _ratios(rows: list[dict[str, Any]]) -> None:
    """``x_floor``, ``x_raw_csr``, ``x_memcpy``: p50 over that floor's p50, same process."""
    base = {r["name"]: r["p50_us"] for r in rows}
    for r in rows:
        for key, name in (("x_floor", "python_floor"), ("x_raw_csr", "raw_csr"),
                          ("x_memcpy", "memcpy")):
            if base.get(name):
                r[key] = r["p50_us"] / base[name]
