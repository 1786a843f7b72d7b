"""Spool + assignment -> a directory of shards, written in parallel, each with a receipt.

Bins are cut into shards of ``bins_per_shard`` consecutive bins, named ``shard_000000`` plus
the format's suffix. Each shard is one task for a process pool: the worker opens the spool by
path (memory-mapped), materializes its bins one at a time and streams them into one writer, so
a worker's memory is bounded by one shard's writer, never by the dataset. A shard is published
atomically by its writer; its receipt (``shard_000000<suffix>.receipt.json``) is written after,
so a receipt always vouches for a complete shard.

A receipt::

    {"shard": "shard_000000.parquet", "format": "parquet", "bins": [0, 4096],
     "num_bins": 4096, "num_tokens": 16512331, "pack_size": 4096, "bytes": 21033100,
     "sha256": "...", "sha256_of": "shard_000000.parquet", "seconds": 1.9}

Output is deterministic: the same spool, assignment and options give the same bytes whatever
the number of workers.

:func:`resume_shards` is the rerun-friendly variant the output layout (:mod:`packlab.layout`)
uses: a shard whose receipt still vouches for it (same format, bins and pack size; size and
checksum unchanged) is kept, and only missing or damaged shards are written again.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packlab.errors import FormatError, PacklabError
from packlab.files import publish, remove, sha256_file, temporary_sibling
from packlab.formats import get_format, open_writer
from packlab.materialize import BinMaterializer
from packlab.packing import BinAssignment
from packlab.progress import progress
from packlab.spool import SpoolReader

RECEIPT_SUFFIX = ".receipt.json"
SHARD_NAME = re.compile(r"^shard_(\d{6,})")


def shard_name(index: int, format: str) -> str:
    return f"shard_{index:06d}{get_format(format).SUFFIX}"


def shard_ranges(num_bins: int, bins_per_shard: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``0..num_bins`` in runs of ``bins_per_shard``."""
    if bins_per_shard <= 0:
        raise PacklabError(f"bins_per_shard must be positive, got {bins_per_shard}")
    return [(s, min(s + bins_per_shard, num_bins)) for s in range(0, num_bins, bins_per_shard)]


def _spool_path(spool: str | os.PathLike[str] | SpoolReader) -> str:
    """The spool as a path string: what a shard job carries to its worker."""
    return str(spool.path if isinstance(spool, SpoolReader) else Path(spool))


def needs_spool(format: str) -> bool:
    """True for formats that store a reference to the spool instead of tokens (packed_index).

    Such a format's writer takes ``spool=`` and ``assignment=`` (the shard's bins); when it
    offers ``write_assignment()`` the pipeline calls that instead of materializing any bin.
    """
    module = get_format(format)
    return bool(getattr(module, "NEEDS_SPOOL", False) or getattr(module.Writer, "needs_spool", False))


def shard_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def shard_checksum(path: Path) -> tuple[str, str]:
    """SHA-256 of a file shard, or of a directory shard's manifest (which lists every file's)."""
    if path.is_file():
        return sha256_file(path), path.name
    for name in ("manifest.json", "index.json"):
        if (path / name).is_file():
            return sha256_file(path / name), f"{path.name}/{name}"
    raise PacklabError(f"{path}: directory shard without a manifest.json to checksum")


def write_receipt(shard: Path, receipt: dict[str, Any]) -> Path:
    """Write ``<shard>.receipt.json`` atomically (after the shard itself is published)."""
    final = receipt_path(shard)
    tmp = temporary_sibling(final)
    tmp.write_text(json.dumps(receipt, indent=2) + "\n")
    publish(tmp, final, overwrite=True)
    return final


def write_shard(
    spool_path: str,
    part: BinAssignment,
    start: int,
    path: str,
    format: str,
    overwrite: bool,
    format_options: dict[str, Any],
) -> dict[str, Any]:
    """Write ``part`` (bins ``start:start + part.num_bins`` of the whole assignment) into one
    shard; return its receipt. Runs in a worker: everything arrives by value or by path.
    """
    began = time.perf_counter()
    stop = start + part.num_bins
    spool = SpoolReader(spool_path)
    out = Path(path)
    options = dict(format_options)
    by_reference = needs_spool(format)
    if by_reference:
        options.setdefault("spool", spool)
        options.setdefault("assignment", part)
    metadata = {"spool": str(Path(spool_path).resolve()), "bins": [start, stop],
                "vocab_size": spool.vocab_size}
    with open_writer(format, out, pack_size=part.pack_size, num_bins=stop - start,
                     overwrite=overwrite, metadata=metadata, **options) as writer:
        if by_reference and hasattr(writer, "write_assignment"):
            writer.write_assignment()  # the index only: no token is gathered
        else:
            materializer = BinMaterializer(spool, part)
            for bin_id in range(stop - start):
                writer.write_bin(bin_id, *materializer.materialize(bin_id))
        manifest = writer.finalize()
    digest, digest_of = shard_checksum(out)
    receipt = {
        "shard": out.name,
        "format": format,
        "bins": [start, stop],
        "num_bins": stop - start,
        "num_tokens": int(manifest.get("num_tokens", writer.tokens_written)),
        "pack_size": part.pack_size,
        "bytes": shard_bytes(out),
        "sha256": digest,
        "sha256_of": digest_of,
        "seconds": round(time.perf_counter() - began, 6),
    }
    write_receipt(out, receipt)
    return receipt


def existing_shards(out_dir: Path) -> list[Path]:
    """Entries of ``out_dir`` named like pipeline shards (``shard_NNNNNN...``), receipts excluded."""
    if not out_dir.is_dir():
        return []
    return sorted(p for p in out_dir.iterdir()
                  if SHARD_NAME.match(p.name) and not p.name.endswith(RECEIPT_SUFFIX))


def write_shards(
    spool: str | os.PathLike[str] | SpoolReader,
    assignment: BinAssignment,
    out_dir: str | os.PathLike[str],
    *,
    format: str,
    bins_per_shard: int,
    workers: int = 2,
    overwrite: bool = False,
    executor: str = "process",
    address: str | None = None,
    **format_options: Any,
) -> list[dict[str, Any]]:
    """Write every bin of ``assignment`` as shards of ``format`` under ``out_dir``.

    ``executor`` runs the shard jobs in the local process pool (``"process"``) or as Ray tasks
    (``"ray"``, on a local cluster or the one at ``address``): the bytes are the same.

    Returns the receipts in shard order. Refuses to mix with shards already in ``out_dir``
    unless ``overwrite``; then shards left over from a larger earlier run are removed, so the
    directory reads as exactly this dataset.
    """
    spool_path = _spool_path(spool)
    SpoolReader(spool_path)  # fail early, naming the spool, if it is missing or damaged
    get_format(format)
    out = Path(out_dir)
    ranges = shard_ranges(assignment.num_bins, bins_per_shard)
    names = [shard_name(i, format) for i in range(len(ranges))]
    present = existing_shards(out)
    if present and not overwrite:
        raise PacklabError(f"{out}: already holds shards ({present[0].name}, ...); "
                           "pass overwrite=True (--overwrite) to replace them")
    out.mkdir(parents=True, exist_ok=True)
    jobs = [
        (spool_path, assignment.select(start, stop), start, str(out / name), format, overwrite,
         format_options)
        for (start, stop), name in zip(ranges, names, strict=True)
    ]
    receipts = run_shard_jobs(jobs, workers, desc=f"write {format}", executor=executor,
                              address=address)
    remove_stale_shards(out, names)
    return receipts


def run_shard_jobs(jobs: Sequence[tuple[Any, ...]], workers: int, *, desc: str = "write",
                   executor: str = "process", address: str | None = None
                   ) -> list[dict[str, Any]]:
    """Run :func:`write_shard` argument tuples (serially, in a process pool, or as Ray tasks);
    receipts in job order. Jobs may target different directories and spools."""
    jobs = list(jobs)
    if not jobs:
        return []
    if executor == "ray":
        from packlab.executors import run_ray

        return run_ray(jobs, workers=workers, address=address)
    if executor != "process":
        raise PacklabError(f"unknown executor {executor!r}; choose from process, ray")
    if workers <= 1 or len(jobs) == 1:
        return [write_shard(*job) for job in progress(jobs, total=len(jobs), desc=desc)]
    return _run_pool(jobs, workers, desc=desc)


def remove_stale_shards(out: Path, keep: Sequence[str]) -> list[str]:
    """Remove shards (and their receipts) of ``out`` not named in ``keep``; returns their names."""
    wanted = set(keep)
    gone = []
    for stale in existing_shards(out):
        if stale.name not in wanted:
            remove(stale)
            remove(receipt_path(stale))
            gone.append(stale.name)
    return gone


def receipt_path(shard: Path) -> Path:
    return shard.parent / f"{shard.name}{RECEIPT_SUFFIX}"


# -- reruns: keep what a receipt still vouches for ----------------------------------------------
VERIFY_MODES = ("receipt", "full")


def reusable_receipt(shard: Path, *, format: str, bins: tuple[int, int], pack_size: int,
                     verify: str = "receipt") -> dict[str, Any] | None:
    """The receipt of a shard that can be kept as it is, or None (missing, damaged, no receipt,
    or written for other bins / another format / another pack size).

    ``verify="receipt"`` trusts size + SHA-256 against the receipt (a directory shard's checksum
    covers its manifest only, which lists every file's); ``"full"`` also runs the reader's
    ``validate`` (every file checksum and every bin's invariants).
    """
    if verify not in VERIFY_MODES:
        raise PacklabError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
    if not shard.exists():
        return None
    try:
        receipt = check_receipt(shard)
        if receipt is None:
            return None
        if (receipt.get("format") != format or receipt.get("bins") != [int(b) for b in bins]
                or receipt.get("pack_size") != pack_size):
            return None
        if verify == "full":
            validate_shard(shard, format)
    except (PacklabError, OSError):
        return None
    return receipt


@dataclass
class ShardPlan:
    """What :func:`plan_resume` decided for one shard directory."""

    out: Path
    names: list[str]
    reused: dict[int, dict[str, Any]] = field(default_factory=dict)  # shard number -> receipt
    jobs: dict[int, tuple[Any, ...]] = field(default_factory=dict)  # shard number -> job

    def receipts(self, written: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
        """Receipts in shard order, each marked ``reused`` true or false."""
        out = []
        for i in range(len(self.names)):
            if i in self.reused:
                out.append({**self.reused[i], "reused": True})
            else:
                out.append({**written[i], "reused": False})
        return out


def plan_resume(
    spool: str | os.PathLike[str] | SpoolReader,
    assignment: BinAssignment,
    out_dir: str | os.PathLike[str],
    *,
    format: str,
    bins_per_shard: int,
    reuse: bool = True,
    verify: str = "receipt",
    **format_options: Any,
) -> ShardPlan:
    """Decide, shard by shard, what to keep and what to write (nothing is written yet).

    A shard is kept when :func:`reusable_receipt` vouches for it (and ``reuse``); every other
    shard becomes a job that overwrites whatever is at its name.
    """
    spool_path = _spool_path(spool)
    get_format(format)
    out = Path(out_dir)
    ranges = shard_ranges(assignment.num_bins, bins_per_shard)
    plan = ShardPlan(out, [shard_name(i, format) for i in range(len(ranges))])
    for i, ((start, stop), name) in enumerate(zip(ranges, plan.names, strict=True)):
        path = out / name
        kept = reusable_receipt(path, format=format, bins=(start, stop),
                                pack_size=assignment.pack_size, verify=verify) if reuse else None
        if kept is not None:
            plan.reused[i] = kept
        else:
            plan.jobs[i] = (spool_path, assignment.select(start, stop), start, str(path),
                            format, True, format_options)
    return plan


def finish_resume(plans: Sequence[ShardPlan], workers: int, *, desc: str = "write",
                  executor: str = "process", address: str | None = None
                  ) -> list[list[dict[str, Any]]]:
    """Write the jobs of many plans in one pool, drop stale shards; receipts per plan."""
    flat = [(k, i, job) for k, plan in enumerate(plans) for i, job in sorted(plan.jobs.items())]
    for plan in plans:
        plan.out.mkdir(parents=True, exist_ok=True)
        for i in plan.jobs:  # a damaged shard's old receipt must not outlive it
            remove(receipt_path(plan.out / plan.names[i]))
    receipts = run_shard_jobs([job for _, _, job in flat], workers, desc=desc,
                              executor=executor, address=address)
    written: list[dict[int, dict[str, Any]]] = [{} for _ in plans]
    for (k, i, _), receipt in zip(flat, receipts, strict=True):
        written[k][i] = receipt
    out = []
    for plan, done in zip(plans, written, strict=True):
        remove_stale_shards(plan.out, plan.names)
        out.append(plan.receipts(done))
    return out


def resume_shards(
    spool: str | os.PathLike[str] | SpoolReader,
    assignment: BinAssignment,
    out_dir: str | os.PathLike[str],
    *,
    format: str,
    bins_per_shard: int,
    workers: int = 2,
    reuse: bool = True,
    verify: str = "receipt",
    executor: str = "process",
    address: str | None = None,
    **format_options: Any,
) -> list[dict[str, Any]]:
    """Like :func:`write_shards`, but keeps every shard whose receipt still vouches for it and
    writes only the missing or damaged ones. Receipts come back in shard order, each with
    ``reused`` true (kept) or false (written now)."""
    spool_path = _spool_path(spool)
    SpoolReader(spool_path)
    plan = plan_resume(spool_path, assignment, out_dir, format=format,
                       bins_per_shard=bins_per_shard, reuse=reuse, verify=verify,
                       **format_options)
    return finish_resume([plan], workers, desc=f"write {format}", executor=executor,
                         address=address)[0]


def _run_pool(jobs: list[tuple[Any, ...]], workers: int, *, desc: str) -> list[dict[str, Any]]:
    """Run the shard jobs in a process pool; the first failure cancels the rest and is raised."""
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        futures = [pool.submit(write_shard, *job) for job in jobs]
        for future in progress(as_completed(futures), total=len(futures), desc=desc):
            error = future.exception()
            if error is not None:
                for other in futures:
                    other.cancel()
                if isinstance(error, BrokenProcessPool):
                    raise PacklabError(f"a shard writer process died ({error}); out of memory? "
                                       "try fewer --workers or a smaller --bins-per-shard"
                                       ) from None
                raise error
        return [future.result() for future in futures]


# -- validation -------------------------------------------------------------------------------
def check_receipt(shard: Path) -> dict[str, Any] | None:
    """Compare a shard with its receipt, if it has one (bins, bytes, checksum)."""
    where = receipt_path(shard)
    if not where.is_file():
        return None
    try:
        receipt = json.loads(where.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise FormatError(f"{where}: unreadable receipt: {exc}") from None
    if not isinstance(receipt, dict):
        raise FormatError(f"{where}: unreadable receipt: not a JSON object")
    size = shard_bytes(shard)
    if size != receipt.get("bytes"):
        raise FormatError(f"{shard}: {size} bytes, its receipt says {receipt.get('bytes')} "
                          "(truncated or replaced?)")
    digest, _ = shard_checksum(shard)
    if digest != receipt.get("sha256"):
        raise FormatError(f"{shard}: checksum differs from its receipt (corrupted)")
    return receipt


def validate_shard(path: Path, format: str) -> dict[str, Any]:
    """Prove one shard whole (the reader's ``validate``) and consistent with its receipt.

    Whatever a reader raises on damaged bytes becomes one :class:`FormatError` naming the shard.
    """
    from packlab.formats import open_shard

    try:
        reader = open_shard(path, format=format)
        try:
            summary = dict(reader.validate())
            summary.setdefault("num_bins", reader.num_bins)
            summary.setdefault("num_tokens", reader.num_tokens)
            summary["bytes"] = reader.bytes_on_disk()
        finally:
            reader.close()
    except PacklabError:
        raise
    except Exception as exc:  # damaged bytes surface as library errors: name the file, one line
        detail = " ".join(str(exc).split())[:300]
        raise FormatError(f"{path}: unreadable {format} shard ({type(exc).__name__}: {detail})"
                          ) from None
    receipt = check_receipt(path)
    if receipt is not None and receipt.get("num_bins") != summary["num_bins"]:
        raise FormatError(f"{path}: {summary['num_bins']} bins, its receipt says "
                          f"{receipt.get('num_bins')}")
    summary["path"] = str(path)
    summary["format"] = format
    summary["receipt"] = receipt is not None
    return summary


def validate_path(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Validate a shard, a directory of shards, or an output layout (every split, and the
    counts ``blend.json`` gives); raises on the first problem, naming it."""
    from packlab.dataset import find_shards
    from packlab.layout.blend import is_layout

    root = Path(path)
    if is_layout(root) and not any(p.name.startswith("shard_") for p in root.iterdir()):
        return validate_layout(root)
    shards = find_shards(root)
    if root.is_dir() and not (len(shards) == 1 and shards[0][0] == root):
        names = {p.name for p, _ in shards}
        for receipt in sorted(root.glob(f"*{RECEIPT_SUFFIX}")):
            shard = receipt.name[: -len(RECEIPT_SUFFIX)]
            if shard not in names:
                raise FormatError(f"{root / shard}: missing (its receipt {receipt.name} exists)")
    rows = [validate_shard(p, name) for p, name in shards]
    return {"path": str(root), **_totals(rows)}


def validate_layout(root: Path) -> dict[str, Any]:
    """Every split of an output layout, and each split's bins and tokens against blend.json."""
    from packlab.layout.blend import SPLITS_DIR, known_splits, read_blend, split_source

    blend = read_blend(root) or {}
    rows: list[dict[str, Any]] = []
    splits: dict[str, Any] = {}
    for split in known_splits(root):
        expected = blend.get("splits", {}).get(split, {})
        if expected.get("num_bins") == 0:  # no sequence fell into it: valid, and empty
            splits[split] = {"num_shards": 0, "num_bins": 0, "num_tokens": 0}
            continue
        source = split_source(root, split)
        result = validate_path(source) if isinstance(source, Path) else _validate_list(source)
        for key in ("num_bins", "num_tokens"):
            if key in expected and expected[key] != result[key]:
                raise FormatError(f"{root / SPLITS_DIR / split}: {result[key]} "
                                  f"{key[4:]}, blend.json says {expected[key]}")
        splits[split] = {k: result[k] for k in ("num_shards", "num_bins", "num_tokens")}
        rows.extend(result["shards"])
    return {"path": str(root), **_totals(rows), "splits": splits}


def _validate_list(paths: Sequence[Path]) -> dict[str, Any]:
    from packlab.dataset import find_shards

    return _totals([validate_shard(p, name) for p, name in find_shards(list(paths))])


def _totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Shard, bin, token and byte counts over validated shards, the rows kept beside them."""
    return {
        "num_shards": len(rows),
        "num_bins": sum(int(r["num_bins"]) for r in rows),
        "num_tokens": sum(int(r["num_tokens"]) for r in rows),
        "bytes": sum(int(r["bytes"]) for r in rows),
        "shards": rows,
    }
