"""The RFC's scale, end to end on this machine: every stage of the pipeline measured the same
way (:mod:`packlab.lab.measure.stages`), one format at a time. Each output is deleted before the
next where the disk needs it.

:func:`scale_run` (notebook 12) synthesizes a spool of the ``short`` profile, then for each
format packs it, validates it, opens it, reads random bins (a first pass, then the same bins
warm, then in batches), runs one epoch through a torch DataLoader with the format's recommended
sampler and, for the formats a training job reads locally, loads it per rank (world size 4,
2 workers each, separate processes); binidx's pack is also killed half-way and finished by the
same command, and compared byte for byte; ``legacy_npy_pickle`` (one file of every bin, as
Nemotron writes today's format) is attempted under a memory cap, which records where it fails.

The sequence count is computed up front from the free disk (:func:`plan_count`) and stated.

The jobs (``*_job``) run in processes of their own, started by the stages, and report their
progress; each returns JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packlab.errors import PacklabError
from packlab.lab.measure.stages import Progress, StageResult, disk_usage, run_stage, status
from packlab.lab.records.at_scale import AtScale, ScalePlan

PROFILE = "short"
MIN_READS = 200  # random reads a pass takes at least, whatever its time budget
PACKLAB = [sys.executable, "-m", "packlab.cli"]
DISK_MARGIN = 0.85  # of the free disk a run may plan to use


def plan_count(requested: int, directory: Path, per_sequence: float) -> ScalePlan:
    """``requested``, or the largest count the free disk under ``directory`` holds (a spool and
    the largest output at once, within :data:`DISK_MARGIN`), stated either way."""
    free = shutil.disk_usage(directory).free
    fits = int(free * DISK_MARGIN / per_sequence)
    if fits >= requested:
        reason = (f"{requested:,} sequences need about {requested * per_sequence / 1e9:.1f} GB "
                  f"at once; {free / 1e9:.1f} GB are free")
        return ScalePlan(requested, requested, free, per_sequence, reason)
    reason = (f"{requested:,} sequences would need {requested * per_sequence / 1e9:.1f} GB at "
              f"once; {free / 1e9:.1f} GB are free: {fits:,} sequences fit")
    return ScalePlan(requested, fits, free, per_sequence, reason)


def pilot_bytes_per_sequence(directory: Path, pack_size: int, vocab_size: int | None) -> float:
    """Bytes a sequence of the profile costs while the run holds a spool and its largest output
    (padded memmap_v1 or binidx), from a pilot spool of 20,000 sequences."""
    from packlab.packing import pack
    from packlab.spool import SpoolReader
    from packlab.spool.synth import synthesize

    pilot = directory / "pilot"
    shutil.rmtree(pilot, ignore_errors=True)
    try:
        synthesize(pilot, num_sequences=20_000, profile=PROFILE, vocab_size=vocab_size, seed=1)
        spool = SpoolReader(pilot)
        assignment, _ = pack(spool.lengths, pack_size)
        padded = assignment.num_bins * pack_size * 5  # memmap_v1: int32 tokens, uint8 mask
        largest = max(padded, 5.2 * spool.num_tokens)
        return (disk_usage(pilot) + largest) / spool.num_sequences
    finally:
        shutil.rmtree(pilot, ignore_errors=True)


# -- the jobs: each runs in a stage's process ---------------------------------------------------
def _rss() -> dict[str, int]:
    anon, file, shmem = status(os.getpid()) or (0, 0, 0)
    return {"anon": anon, "file": file, "shmem": shmem}


def open_job(path: str, progress: str | None = None) -> dict[str, Any]:
    """Open the dataset (and read one bin: the first read builds each shard's table)."""
    from packlab.sources import open_dataset

    before = _rss()
    began = time.perf_counter()
    dataset = open_dataset(path)
    opened = time.perf_counter() - began
    dataset[len(dataset) - 1]
    return {"open_seconds": opened, "first_read_seconds": time.perf_counter() - began - opened,
            "num_bins": len(dataset), "num_shards": len(dataset.shards), "before": before,
            "after": _rss()}


def reads_job(path: str, samples: int, seed: int = 0, batch: int = 8,
              max_seconds: float = 60.0, progress: str | None = None) -> dict[str, Any]:
    """Seeded random bins: a first pass (at most ``max_seconds``: a format that decodes a
    block per random bin reads fewer), the same bins again (warm), then the same bins in
    batches of ``batch`` (``__getitems__``); each read delivered (copied into reused buffers,
    as a collate does: :class:`~packlab.lab.measure.delivery.Sink`), the process's resident
    memory after each pass; then the same bins through plain memory maps."""
    from packlab.lab.measure.delivery import Sink
    from packlab.loading.samplers import has_own_blocks
    from packlab.sources import open_dataset

    dataset = open_dataset(path)
    sink = Sink(dataset.pack_size)
    indices = np.random.default_rng(seed).integers(0, len(dataset), samples).tolist()
    report = Progress(progress, 3 * samples)
    out: dict[str, Any] = {"samples": samples, "num_bins": len(dataset), "after_open": _rss(),
                           "keeps_blocks": has_own_blocks(dataset)}
    for k, name in enumerate(("first", "warm")):
        times = np.empty(len(indices), dtype=np.int64)
        returned, stop = 0, time.perf_counter() + max_seconds
        for i, b in enumerate(indices):
            t = time.perf_counter_ns()
            returned += sink.take(dataset[b])
            times[i] = time.perf_counter_ns() - t
            report.update(k * samples + i)
            if k == 0 and time.perf_counter() > stop and i + 1 >= MIN_READS:
                indices, times = indices[:i + 1], times[:i + 1]
                out["samples"] = len(indices)
                break
        out[name] = {"p50_us": float(np.median(times)) / 1e3,
                     "p90_us": float(np.percentile(times, 90)) / 1e3,
                     "mean_us": float(times.mean()) / 1e3, "returned_bytes": returned,
                     "after": _rss()}
    batches = [indices[i:i + batch] for i in range(0, len(indices) - batch + 1, batch)]
    times = np.empty(len(batches), dtype=np.int64)
    for i, group in enumerate(batches):
        t = time.perf_counter_ns()
        for item in dataset.__getitems__(group):
            sink.take(item)
        times[i] = time.perf_counter_ns() - t
        report.update(2 * samples + i * batch)
    out["batched"] = {"per_bin_p50_us": float(np.median(times)) / 1e3 / batch, "batch": batch,
                      "after": _rss()}
    report.update(3 * samples, force=True)
    out["mapped"] = _through_a_map(dataset, indices)
    return out


def _through_a_map(dataset: Any, indices: list[int]) -> dict[str, Any] | None:
    """The same bins read as packlab read them before it read by ``pread``: slices of plain
    numpy memory maps of the shard's files, copied out (the raw CSR floor,
    :class:`~packlab.lab.measure.floors.RawCsr`), a first pass and a warm one, and what they
    left resident; None for a format whose bins are not runs of its files."""
    from packlab.lab.measure.floors import raw_floor

    raw = raw_floor(dataset)
    if raw is None:
        return None
    out: dict[str, Any] = {"before": _rss()}
    for name in ("first", "warm"):
        times = np.array([raw.timed([b]) for b in indices], dtype=np.int64)
        out[name] = {"p50_us": float(np.median(times)) / 1e3,
                     "mean_us": float(times.mean()) / 1e3, "after": _rss()}
    return out


def epoch_job(path: str, batch_size: int = 8, workers: int = 2, seed: int = 0,
              rank: int = 0, world_size: int = 1, progress: str | None = None
              ) -> dict[str, Any]:
    """One epoch through a torch DataLoader with the format's recommended sampler
    (:func:`packlab.loading.samplers.recommended_sampler`), collated into THD batches; a rank of
    ``world_size`` reads its share of every global batch, as Megatron's samplers give it."""
    import torch

    from packlab.loading.collate import Collator
    from packlab.loading.samplers import recommended_sampler
    from packlab.sources import open_dataset

    dataset = open_dataset(path)
    order = list(recommended_sampler(dataset, seed=seed))
    if world_size > 1:  # rank r takes micro-batch r of every global batch
        step = batch_size * world_size
        order = [i for g in range(0, len(order) - step + 1, step)
                 for i in order[g + rank * batch_size:g + (rank + 1) * batch_size]]
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, sampler=order, num_workers=workers,
        collate_fn=Collator(return_tensors="pt"), persistent_workers=False)
    report = Progress(progress, len(order))
    began = time.perf_counter()
    bins = tokens = 0
    for batch in loader:
        bins += int(batch["tokens"].shape[0])
        tokens += int(batch["token_count"].sum())
        report.update(bins)
    report.update(bins, force=True)
    return {"bins": bins, "tokens": tokens, "seconds": time.perf_counter() - began,
            "rank": rank, "world_size": world_size}


def ranks_job(path: str, world_size: int = 4, workers: int = 2, batch_size: int = 8,
              seed: int = 0, progress: str | None = None) -> dict[str, Any]:
    """``world_size`` ranks as separate processes, each one epoch of its share through a
    DataLoader of ``workers`` workers (the stage sums every process's memory)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="packlab-ranks-") as tmp:
        ranks = []
        for rank in range(world_size):
            result, done = Path(tmp) / f"{rank}.json", Path(tmp) / f"{rank}.progress"
            command = [sys.executable, "-m", "packlab.lab.measure.stages",
                       "packlab.lab.measure.scale:epoch_job",
                       json.dumps({"path": path, "batch_size": batch_size, "workers": workers,
                                   "seed": seed, "rank": rank, "world_size": world_size}),
                       str(result), str(done)]
            ranks.append((subprocess.Popen(command), result, done))
        report = Progress(progress, 0)
        while running := [p for p, _, _ in ranks if p.poll() is None]:
            seen = [_read_pair(d) for _, _, d in ranks]
            report.total = sum(t for _, t in seen)
            report.update(sum(n for n, _ in seen))
            try:  # the next report in 0.5 s, or as soon as the last rank running exits
                running[-1].wait(0.5)
            except subprocess.TimeoutExpired:
                pass
        codes = [p.wait() for p, _, _ in ranks]
        if any(codes):
            raise PacklabError(f"ranks exited {codes}")
        return {"ranks": [json.loads(r.read_text()) for _, r, _ in ranks]}


def _read_pair(path: Path) -> tuple[int, int]:
    try:
        done, total = path.read_text().split()
        return int(done), int(total)
    except (OSError, ValueError):
        return 0, 0


def legacy_job(spool: str, pack_size: int, out: str, progress: str | None = None
               ) -> dict[str, Any]:
    """Today's format as Nemotron writes it: every bin of the spool into one pickled .npy
    (the writer keeps them all as Python lists until it saves), bins reported as they are
    kept: under a memory cap the stage stops it and the last report says where."""
    from packlab.formats.legacy_npy_pickle import Writer
    from packlab.packing import pack
    from packlab.packing.materialize import BinMaterializer
    from packlab.spool import SpoolReader

    reader = SpoolReader(spool)
    assignment, _ = pack(reader.lengths, pack_size)
    materializer = BinMaterializer(reader, assignment)
    report = Progress(progress, assignment.num_bins, every=0.02)  # where it stops, closely
    report.update(0, force=True)  # its work begins: the cap counts from here
    with Writer(out, pack_size=pack_size) as writer:
        for b in range(assignment.num_bins):
            writer.write(materializer.materialize(b))
            report.update(b + 1)
        report.update(assignment.num_bins, force=True)
    return {"bins": assignment.num_bins}


# -- the run ------------------------------------------------------------------------------------
def _receipts(out: Path) -> int:
    try:
        return sum(1 for _ in out.glob("*.receipt.json"))
    except OSError:
        return 0


def _spool_progress(staging_parent: Path, name: str, num_sequences: int
                    ) -> Callable[[], tuple[int, int] | None]:
    """A synth's progress: the lengths it wrote so far (4 bytes a sequence), in its staging
    folder or the spool once published."""
    def seen() -> tuple[int, int] | None:
        for folder in [staging_parent / name, *staging_parent.glob(f".{name}*")]:
            lengths = folder / "lengths.bin"
            if lengths.is_file():
                return min(lengths.stat().st_size // 4, num_sequences), num_sequences
        return None
    return seen


def file_digests(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative names): what "byte for byte" compares."""
    out = {}
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with open(f, "rb") as fh:
            while block := fh.read(8 << 20):
                digest.update(block)
        out[str(f.relative_to(root))] = digest.hexdigest()
    return out


def scale_run(directory: str | os.PathLike[str], *, num_sequences: int,
              formats: Sequence[str], pack_size: int = 4096, bins_per_shard: int = 8192,
              vocab_size: int | None = None, read_samples: int = 20_000,
              read_seconds: float = 60.0,
              loader_batch_size: int = 8, loader_workers: int = 2, world_size: int = 4,
              rank_formats: Sequence[str] = ("binidx",), resume_format: str = "binidx",
              legacy_cap_bytes: int = 6 << 30, log: Callable[[str], None] = print) -> AtScale:
    """Every stage, in order (see the module); ``directory`` is emptied first and after."""
    root = Path(directory)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    began = time.perf_counter()
    try:
        per = pilot_bytes_per_sequence(root, pack_size, vocab_size)
        plan = plan_count(num_sequences, root, per)
        log(f"[scale] {plan.reason}")
        n = plan.num_sequences
        spool = root / "spool"
        synth = [*PACKLAB, "synth", str(spool), "--num-sequences", str(n), "--profile", PROFILE]
        if vocab_size:
            synth += ["--vocab-size", str(vocab_size)]
        run = AtScale(plan=plan, num_tokens=0, baseline=formats[0])
        stage = run_stage("synth", synth, progress=_spool_progress(root, "spool", n),
                          disk=lambda: disk_usage(spool))
        _keep(run, "synth", stage, log)
        from packlab.spool import SpoolReader

        tokens = SpoolReader(spool).num_tokens
        run.num_tokens = run.stages["synth"].tokens = tokens
        run.stages["synth"].tokens_per_cpu_second = tokens / max(stage.cpu_seconds, 1e-9)
        shards = -(-_num_bins(spool, pack_size) // bins_per_shard)
        for fmt in formats:
            _one_format(run, root, spool, fmt, tokens, shards, pack_size=pack_size,
                        bins_per_shard=bins_per_shard, read_samples=read_samples,
                        read_seconds=read_seconds,
                        batch_size=loader_batch_size, workers=loader_workers,
                        world_size=world_size if fmt in rank_formats else 0,
                        resume=fmt == resume_format, log=log)
        legacy = root / "legacy.npy"
        stage = run_stage("write legacy_npy_pickle", job="packlab.lab.measure.scale:legacy_job",
                          kwargs={"spool": str(spool), "pack_size": pack_size,
                                  "out": str(legacy)},
                          tokens=tokens, cap_bytes=legacy_cap_bytes, interval=0.02,
                          disk=lambda: disk_usage(legacy) if legacy.exists() else 0)
        _keep(run, "write:legacy_npy_pickle", stage, log)
        run.seconds = time.perf_counter() - began
        return run
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _keep(run: AtScale, key: str, stage: StageResult, log: Callable[[str], None]) -> None:
    run.stages[key] = stage
    s = stage.summed
    log(f"[scale] {key}: {stage.outcome}, {stage.seconds:.1f} s, {stage.cpu_seconds:.1f} CPU-s, "
        f"peak resident {s.rss / 2**20:.0f} MiB (anon {s.anon / 2**20:.0f}, file "
        f"{s.file / 2**20:.0f}) over {stage.processes} process(es)"
        + (f"; {stage.detail}" if stage.detail else ""))
    if stage.outcome == "failed":
        raise PacklabError(f"scale run: stage {key} failed: {stage.detail}")


def _one_format(run: AtScale, root: Path, spool: Path, fmt: str, tokens: int, shards: int, *,
                pack_size: int, bins_per_shard: int, read_samples: int, read_seconds: float,
                batch_size: int,
                workers: int, world_size: int, resume: bool, log: Callable[[str], None]) -> None:
    out = root / fmt
    command = [*PACKLAB, "pack", str(spool), str(out), "--format", fmt, "--pack-size",
               str(pack_size), "--bins-per-shard", str(bins_per_shard)]
    progress = (lambda: (_receipts(out), shards))  # noqa: E731 - a closure over out
    _keep(run, f"pack:{fmt}", run_stage(f"pack {fmt}", command, tokens=tokens,
                                         progress=progress, disk=lambda: disk_usage(out)), log)
    _keep(run, f"validate:{fmt}", run_stage(f"validate {fmt}", [*PACKLAB, "validate", str(out)],
                                             tokens=tokens), log)
    stage = run_stage(f"open {fmt}", job="packlab.lab.measure.scale:open_job",
                      kwargs={"path": str(out)})
    _keep(run, f"open:{fmt}", stage, log)
    run.num_bins[fmt] = int(stage.result["num_bins"])
    _keep(run, f"reads:{fmt}", run_stage(
        f"random reads {fmt}", job="packlab.lab.measure.scale:reads_job",
        kwargs={"path": str(out), "samples": min(read_samples, run.num_bins[fmt]),
                "max_seconds": read_seconds}), log)
    _keep(run, f"epoch:{fmt}", run_stage(
        f"epoch {fmt}", job="packlab.lab.measure.scale:epoch_job",
        kwargs={"path": str(out), "batch_size": batch_size, "workers": workers},
        tokens=tokens), log)
    if world_size:
        _keep(run, f"ranks:{fmt}", run_stage(
            f"ranks {fmt}", job="packlab.lab.measure.scale:ranks_job",
            kwargs={"path": str(out), "world_size": world_size, "workers": workers,
                    "batch_size": batch_size}, tokens=tokens), log)
    if resume:
        expected = file_digests(out)
        shutil.rmtree(out)
        half = max(1, shards // 2)
        killed = run_stage(f"pack {fmt}, killed", command, tokens=tokens, progress=progress,
                           kill_when=lambda done: done is not None and done[0] >= half)
        _keep(run, f"killed:{fmt}", killed, log)
        _keep(run, f"resumed:{fmt}", run_stage(f"pack {fmt}, the same command again", command,
                                                tokens=tokens, progress=progress,
                                                disk=lambda: disk_usage(out)), log)
        found = file_digests(out)
        run.byte_identical = found == expected
        run.resumed_files = len(found)
        run.differing_files = sorted(k for k in {*found, *expected}
                                     if found.get(k) != expected.get(k))
        log(f"[scale] resumed {fmt}: {len(found)} files, byte for byte the same: "
            f"{run.byte_identical}")
    shutil.rmtree(out, ignore_errors=True)


def _num_bins(spool: Path, pack_size: int) -> int:
    from packlab.packing import pack
    from packlab.spool import SpoolReader

    return pack(SpoolReader(spool).lengths, pack_size)[0].num_bins
