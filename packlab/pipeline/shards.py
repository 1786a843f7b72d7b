"""Spool + assignment -> a directory of shards, written in parallel, each with a receipt.

Bins are cut into shards of ``bins_per_shard`` consecutive bins, named ``shard_000000`` plus
the format's suffix. Each shard is one job (:func:`write_shard`): the worker opens the spool by
path (memory-mapped), materializes its bins one at a time and streams them into one writer, so
a worker's memory is bounded by one shard's writer, never by the dataset. Its receipt
(:mod:`packlab.pipeline.receipts`) is written after the shard is published.

The chain of custody: the spool's lengths and offsets are checked against its record before
anything is planned on disk, and each job checks the ranges of sequences its bins read against
the spool's range checksums before it writes (:meth:`SpoolReader.verify_sequences`), so a
corrupted spool is refused, naming the file and sequences, never packed into shards whose
fresh checksums would vouch for it.

Output is deterministic: the same spool, assignment and options give the same bytes whatever
the number of workers or the executor (:mod:`packlab.executors`).

Every shard directory carries a dataset record (:mod:`packlab.pipeline.dataset_record`), written
before the first shard and finished after the last, and is locked while a job writes it; and,
beside it, the pack-metadata JSON Megatron-Bridge reads for fixed-shape batches
(``pack_metadata.json``, :mod:`packlab.interop.bridge_metadata`), computed from the plan.

What happens to shards already in the output directory is one choice, ``existing``:

- ``"refuse"`` (the default): an error naming the first one, unless the directory's record
  says the very same job wrote them (same spool, assignment, format, options): then it was
  interrupted, and this run finishes it as ``"reuse"`` would;
- ``"overwrite"``: every shard is written again, and shards left over from a larger earlier
  run are removed, so the directory reads as exactly this dataset;
- ``"reuse"``: a shard whose receipt still vouches for it (same format, bins and pack size;
  size and checksum unchanged, or the whole shard with ``verify="full"``) is kept, and only
  missing or damaged shards are written (what the output layout's reruns do).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packlab.errors import FormatError, PacklabError
from packlab.executors import check_stop, run_jobs
from packlab.formats import delete_shard, get_format, is_companion
from packlab.interop.bridge_metadata import (
    PACK_METADATA_FILE,
    metadata_of_assignment,
    write_pack_metadata,
)
from packlab.packing import BinAssignment
from packlab.packing.materialize import BinMaterializer
from packlab.pipeline.dataset_record import (
    DATASET_RECORD,
    completed,
    new_dataset_record,
    read_dataset_record,
    write_dataset_record,
    writing_lock,
)
from packlab.pipeline.receipts import (
    RECEIPT_SUFFIX,
    finish_receipt,
    receipt_path,
    reusable_receipt,
)
from packlab.pipeline.references import record_spool_use
from packlab.progress import shared_counter
from packlab.spool import SpoolReader
from packlab.storage.files import TMP_MARKER, is_temporary, remove, sha256_file

SHARD_NAME = re.compile(r"^shard_(\d{6,})")
EXISTING = ("refuse", "overwrite", "reuse")
REPORT_EVERY = 32  # bins between progress reports of a shard job
OWN_FILES = (DATASET_RECORD, PACK_METADATA_FILE)  # beside the shards: the job's own bookkeeping


def shard_name(index: int, format: str) -> str:
    return f"shard_{index:06d}{get_format(format).Writer.SUFFIX}"


def shard_ranges(num_bins: int, bins_per_shard: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``0..num_bins`` in runs of ``bins_per_shard``."""
    if bins_per_shard <= 0:
        raise PacklabError(f"bins_per_shard must be positive, got {bins_per_shard}")
    return [(s, min(s + bins_per_shard, num_bins)) for s in range(0, num_bins, bins_per_shard)]


def spool_path(spool: str | os.PathLike[str] | SpoolReader) -> str:
    """The spool as a path string: what a shard job carries to its worker."""
    return str(spool.path if isinstance(spool, SpoolReader) else Path(spool))


def write_shard(
    spool: str,
    part: BinAssignment,
    start: int,
    path: str,
    format: str,
    overwrite: bool,
    format_options: dict[str, Any],
    reporter: Any = None,
) -> dict[str, Any]:
    """Write ``part`` (bins ``start:start + part.num_bins`` of the whole assignment) into one
    shard; return its receipt. Runs in a worker: everything arrives by value or by path.

    A format that ``NEEDS_SPOOL`` gets the spool and the assignment instead of bins, and
    writes only its index (``write_assignment``). ``reporter`` (see
    :func:`packlab.progress.shared_counter`) hears how many bins are done, now and then.
    """
    stop = start + part.num_bins
    reader = SpoolReader(spool)
    reader.verify_sequences(part.seq_indices)  # what this shard reads, before it is written
    out = Path(path)
    options = dict(format_options)
    by_reference = get_format(format).Writer.NEEDS_SPOOL
    if by_reference:
        options.setdefault("spool", reader)
        options.setdefault("assignment", part)
    metadata = {"spool": str(Path(spool).resolve()), "bins": [start, stop],
                "vocab_size": reader.vocab_size}
    with get_format(format).Writer(out, pack_size=part.pack_size, num_bins=stop - start,
                     overwrite=overwrite, metadata=metadata, **options) as writer:
        done = 0
        if by_reference:
            writer.write_assignment()  # the index only: no token is gathered
        else:
            materializer = BinMaterializer(reader, part)
            for bin_id in range(stop - start):
                writer.write_bin(bin_id, *materializer.materialize(bin_id))
                if (bin_id + 1) % REPORT_EVERY == 0:
                    check_stop()
                    if reporter is not None:
                        reporter.put(REPORT_EVERY)
                        done += REPORT_EVERY
        record = writer.finalize()
    if reporter is not None:
        reporter.put(stop - start - done)
    return finish_receipt(out, format=format, bins=(start, stop),
                          num_tokens=int(record.get("num_tokens", writer.tokens_written)),
                          pack_size=part.pack_size)


def existing_shards(out_dir: Path) -> list[Path]:
    """Entries of ``out_dir`` named like pipeline shards (``shard_NNNNNN...``), receipts excluded."""
    if not out_dir.is_dir():
        return []
    return sorted(p for p in out_dir.iterdir()
                  if SHARD_NAME.match(p.name) and not p.name.endswith(RECEIPT_SUFFIX)
                  and not is_companion(p.name))


def remove_stale_shards(out: Path, keep: Sequence[str]) -> list[str]:
    """Remove shards (and their receipts) of ``out`` not named in ``keep``; returns their names."""
    wanted = set(keep)
    gone = []
    for stale in existing_shards(out):
        if stale.name not in wanted:
            delete_shard(stale)
            remove(receipt_path(stale))
            gone.append(stale.name)
    return gone


def job_identity(spool: str, assignment: BinAssignment, *, format: str, bins_per_shard: int,
                 format_options: dict[str, Any]) -> dict[str, Any]:
    """What a shard job is, for its dataset record: the same identity means the same bytes.
    The spool enters by its record's checksum, not its path (moving it changes nothing)."""
    reader = SpoolReader(spool)
    return {
        "spool": {"manifest_sha256": sha256_file(reader.record_path),
                  "num_sequences": reader.num_sequences, "num_tokens": reader.num_tokens},
        "assignment_sha256": assignment.digest(), "format": format,
        "bins_per_shard": int(bins_per_shard), "format_options": format_options,
    }


@dataclass
class ShardPlan:
    """What :func:`plan_shards` decided for one shard directory."""

    out: Path
    names: list[str]
    record: dict[str, Any] = field(default_factory=dict)  # the dataset record, written first
    reused: dict[int, dict[str, Any]] = field(default_factory=dict)  # shard number -> receipt
    jobs: dict[int, tuple[Any, ...]] = field(default_factory=dict)  # shard number -> job
    spool: str = ""  # the spool and the whole assignment: for OUT's pack metadata
    assignment: BinAssignment | None = None

    def receipts(self, written: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
        """Receipts in shard order, each marked ``reused`` true or false."""
        out = []
        for i in range(len(self.names)):
            if i in self.reused:
                out.append({**self.reused[i], "reused": True})
            else:
                out.append({**written[i], "reused": False})
        return out


def plan_shards(
    spool: str | os.PathLike[str] | SpoolReader,
    assignment: BinAssignment,
    out_dir: str | os.PathLike[str],
    *,
    format: str,
    bins_per_shard: int,
    existing: str = "refuse",
    verify: str = "receipt",
    **format_options: Any,
) -> ShardPlan:
    """Decide, shard by shard, what to keep and what to write (nothing is written yet)."""
    if existing not in EXISTING:
        raise PacklabError(f"existing must be one of {EXISTING}, got {existing!r}")
    if "overwrite" in format_options:
        raise PacklabError("shards already there are handled by existing= "
                           f"({', '.join(EXISTING)}), not overwrite=")
    path = spool_path(spool)
    get_format(format)
    checked = SpoolReader(path)  # before any work: the lengths the plan was made from, and
    checked.verify_index()  # every range of sequences the plan reads
    checked.verify_sequences(assignment.seq_indices)
    out = Path(out_dir)
    if out.is_dir():  # a job writing here now is the one thing to say (not "already holds")
        with writing_lock(out):
            pass
    job = job_identity(path, assignment, format=format, bins_per_shard=bins_per_shard,
                       format_options=format_options)
    ranges = shard_ranges(assignment.num_bins, bins_per_shard)
    names = [shard_name(i, format) for i in range(len(ranges))]
    record = new_dataset_record(format=format, pack_size=assignment.pack_size, job=job,
                            shards=list(zip(names, ranges, strict=True)))
    before = _record_before(out, existing)
    same_job = before is not None and before.get("job_hash") == record["job_hash"]
    present = existing_shards(out)
    if existing == "refuse" and not same_job and (present or before is not None):
        what = present[0].name if present else DATASET_RECORD
        raise PacklabError(f"{out}: already holds another output ({what}, ...); "
                           "pass overwrite=True to replace it")
    if same_job and existing == "refuse":
        existing = "reuse"  # the same job, interrupted: finish it
    plan = ShardPlan(out, names, record=record, spool=path, assignment=assignment)
    if get_format(format).Writer.NEEDS_SPOOL:  # the spool's checksums, hashed once for all
        format_options = {**format_options, "spool_files": SpoolReader(path).file_checksums()}
    for i, ((start, stop), name) in enumerate(zip(ranges, plan.names, strict=True)):
        target = out / name
        kept = reusable_receipt(target, format=format, bins=(start, stop),
                                pack_size=assignment.pack_size, verify=verify
                                ) if existing == "reuse" else None
        if kept is not None:
            plan.reused[i] = kept
        else:
            plan.jobs[i] = (path, assignment.select(start, stop), start, str(target), format,
                            existing != "refuse", format_options)
    return plan


def write_planned(plans: Sequence[ShardPlan], workers: int, *, desc: str = "write",
                  executor: str = "process", address: str | None = None
                  ) -> list[list[dict[str, Any]]]:
    """Write the jobs of many plans in one pool, drop stale shards; receipts per plan."""
    flat = [(k, i, job) for k, plan in enumerate(plans) for i, job in sorted(plan.jobs.items())]
    todo = sum(int(job[1].num_bins) for _, _, job in flat)
    with ExitStack() as locks:
        for plan in plans:
            locks.enter_context(writing_lock(plan.out))
            sweep_own_temporaries(plan.out)  # a killed run's: nobody else writes here now
            write_dataset_record(plan.out, plan.record)  # "writing": the shards to expect
            for i in plan.jobs:  # a damaged shard's old receipt must not outlive it
                remove(receipt_path(plan.out / plan.names[i]))
            if get_format(plan.record["format"]).Writer.NEEDS_SPOOL:
                record_spool_use(plan.spool, plan.out, plan.record["format"])
        with shared_counter(total=todo, desc=desc, unit="bin",
                            processes=executor == "process" and workers > 1 and len(flat) > 1,
                            enabled=executor != "ray") as reporter:
            receipts = run_jobs(write_shard, [(*job, reporter) for _, _, job in flat], workers,
                                desc=None, executor=executor, address=address)
        written: list[dict[int, dict[str, Any]]] = [{} for _ in plans]
        for (k, i, _), receipt in zip(flat, receipts, strict=True):
            written[k][i] = receipt
        out = []
        for plan, done in zip(plans, written, strict=True):
            remove_stale_shards(plan.out, plan.names)
            out.append(plan.receipts(done))
            if plan.assignment is not None:  # Megatron-Bridge's, from the lengths alone
                write_pack_metadata(plan.out, metadata_of_assignment(
                    plan.assignment, SpoolReader(plan.spool).lengths))
            write_dataset_record(plan.out, completed(plan.record, out[-1]))  # last: "complete"
    return out


def sweep_own_temporaries(out: Path) -> list[str]:
    """Remove what a killed job left in ``out``: hidden temporaries of shards, receipts and the
    job's own files (``.shard_000003.parquet.tmp-<pid>-<rand>``...). Called with the
    directory's lock held, so no living job is writing them; anything else is left alone."""
    gone = []
    for entry in out.iterdir() if out.is_dir() else []:
        if not is_temporary(entry):
            continue
        name = entry.name[1:].split(TMP_MARKER, 1)[0]
        if SHARD_NAME.match(name) or name in OWN_FILES:
            remove(entry)
            gone.append(entry.name)
    return gone


def _record_before(out: Path, existing: str) -> dict[str, Any] | None:
    """The dataset record already in ``out``; a damaged one only matters when refusing."""
    try:
        return read_dataset_record(out)
    except FormatError:
        if existing == "refuse":
            raise
        return None


def write_shards(
    spool: str | os.PathLike[str] | SpoolReader,
    assignment: BinAssignment,
    out_dir: str | os.PathLike[str],
    *,
    format: str,
    bins_per_shard: int,
    workers: int = 2,
    existing: str = "refuse",
    verify: str = "receipt",
    executor: str = "process",
    address: str | None = None,
    **format_options: Any,
) -> list[dict[str, Any]]:
    """Write every bin of ``assignment`` as shards of ``format`` under ``out_dir``; receipts in
    shard order, each marked ``reused`` (kept, or written now) with ``existing="reuse"`` and
    wherever the run kept shards (the same job, interrupted, finished).
    ``existing``: see the module docstring. ``executor``
    runs the shard jobs in the local process pool (``"process"``) or as Ray tasks (``"ray"``, on
    a local cluster or the one at ``address``): the bytes are the same."""
    plan = plan_shards(spool, assignment, out_dir, format=format, bins_per_shard=bins_per_shard,
                       existing=existing, verify=verify, **format_options)
    receipts = write_planned([plan], workers, desc=f"write {format}", executor=executor,
                             address=address)[0]
    if existing == "reuse" or plan.reused:
        return receipts
    return [{k: v for k, v in r.items() if k != "reused"} for r in receipts]
