"""Resident memory at scale, at CI size: what a reader holds after many random reads and what a
writer holds while packing a spool several times its bound, counted as ``top``, Slurm and an
OOM killer count it (``RssAnon`` + ``RssFile`` of every process, sampled through the run).

Each bound is a constant plus the work in hand, whatever the size of the files: through memory
maps (the read path these tests replaced), 4,000 random reads of a 40 MB shard left about
90 KB of file-backed memory per read in the process (a touched page maps its whole large
folio, up to 2 MB), ten ``packed_index`` shards over one spool mapped it ten times, and a
writer ended holding its whole spool."""

from __future__ import annotations

from pathlib import Path

import pytest

from packlab.lab.measure.stages import run_stage
from packlab.packing import pack
from packlab.pipeline.shards import write_shards
from packlab.spool import SpoolReader
from packlab.synth import synthesize

MiB = 1 << 20
READS = 4_000
HELD = 16 * MiB  # what a reader may keep beyond what opening took, whatever it has read
FORMATS = ["binidx", "megatron_sft", "memmap_v1", "arrow_ipc", "pbin", "parquet", "packed_index"]
CASES = [(f, 1) for f in FORMATS] + [("packed_index", 10), ("binidx", 10)]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spool(tmp_path_factory: pytest.TempPathFactory) -> SpoolReader:
    """About 8M tokens of the short profile: 2,000 bins of 4,096 tokens, a 40 MB shard."""
    root = tmp_path_factory.mktemp("scale_memory")
    return synthesize(root / "spool", num_sequences=37_000, profile="short", seed=3)


def rss(peaks: dict[str, int]) -> int:
    return peaks["anon"] + peaks["file"] + peaks["shmem"]


@pytest.mark.parametrize(("name", "shards"), CASES, ids=[f"{f}-{n}" for f, n in CASES])
def test_a_reader_holds_a_constant_after_many_random_reads(name: str, shards: int,
                                                           spool: SpoolReader,
                                                           tmp_path: Path) -> None:
    assignment, _ = pack(spool.lengths, 4096, seed=0)
    out = tmp_path / name
    write_shards(spool, assignment, out, format=name, workers=1,
                 bins_per_shard=-(-assignment.num_bins // shards))
    stage = run_stage("reads", job="packlab.lab.measure.scale:reads_job",
                      kwargs={"path": str(out), "samples": READS // 2})
    assert stage.outcome == "ok", stage.detail
    res = stage.result
    returned = res["first"]["returned_bytes"] + res["warm"]["returned_bytes"]
    held = rss(res["batched"]["after"]) - rss(res["after_open"])
    file_held = res["batched"]["after"]["file"] - res["after_open"]["file"]
    print(f"{name} x{shards}: {3 * READS // 2:,} reads returned {returned / MiB:.0f} MiB, "
          f"left {held / MiB:.1f} MiB resident ({file_held / MiB:.1f} file-backed)")
    assert returned > 4 * HELD  # the reads touched far more than the bound
    assert held < HELD
    assert file_held < HELD / 4


@pytest.mark.parametrize("name", ["binidx", "parquet"])
def test_a_writer_holds_the_same_whatever_the_spool_size(name: str, spool: SpoolReader,
                                                        tmp_path: Path) -> None:
    """A pack of the whole spool (40 MB of tokens and masks) against one of a tenth of it:
    every process of the pack holds about the same (the plan's 12 bytes a sequence aside)."""
    small = synthesize(tmp_path / "small", num_sequences=3_700, profile="short", seed=3)
    peaks = {}
    for label, source in (("small", small), ("whole", spool)):
        out = tmp_path / f"{label}-{name}"
        command = ["packlab", "pack", str(source.path), str(out), "--format", name,
                   "--pack-size", "4096", "--bins-per-shard", "500", "--workers", "2"]
        stage = run_stage(f"pack {label}", command)
        assert stage.outcome == "ok", stage.detail
        peaks[label] = stage.per_process
    grown = peaks["whole"].rss - peaks["small"].rss
    file_grown = peaks["whole"].file - peaks["small"].file
    spool_bytes = 5 * spool.num_tokens
    print(f"{name}: a pack process held {peaks['small'].rss / MiB:.0f} MiB for a tenth of the "
          f"spool, {peaks['whole'].rss / MiB:.0f} MiB for all of it "
          f"({spool_bytes / MiB:.0f} MiB of tokens and masks)")
    assert spool_bytes > 8 * HELD
    assert grown < HELD and file_grown < HELD / 4
