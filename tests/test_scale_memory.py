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

from packlab.lab.measure.harness import run_job
from packlab.lab.measure.jobs import format_imports
from packlab.lab.measure.stages import run_stage
from packlab.packing import pack
from packlab.pipeline.shards import write_shards
from packlab.spool import SpoolReader
from packlab.spool.synth import synthesize

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


def decoded_cache(out: Path) -> int:
    """The most a process keeps of decoded Parquet row groups (the process's budget of them,
    each as large as the largest uncompressed; nothing for other formats)."""
    import pyarrow.parquet as pq

    from packlab.formats.shared.arrow_lists import LRUCache

    sizes = [pq.ParquetFile(f).metadata.row_group(g).total_byte_size
             for f in out.glob("*.parquet") for g in range(pq.ParquetFile(f).num_row_groups)]
    return getattr(LRUCache, "PROCESS_CAPACITY", 4) * max(sizes, default=0)


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
    assert held < HELD + decoded_cache(out)  # Parquet keeps a few decoded row groups
    assert file_held < HELD / 4


@pytest.mark.parametrize("name", ["binidx", "parquet"])
def test_a_writer_holds_the_same_whatever_the_spool_size(name: str, spool: SpoolReader,
                                                        tmp_path: Path) -> None:
    """A shard of 150 bins written from the whole spool (40 MB of tokens and masks, its bins'
    sequences spread over all of it by the default shuffled first fit) and one from a tenth of
    it, each in a fresh process: what the writer's process grew by (anonymous and
    file-backed, its peak) is about the same."""
    small = synthesize(tmp_path / "small", num_sequences=3_700, profile="short", seed=3)
    grown = {}
    for label, source in (("small", small), ("whole", spool)):
        plan = tmp_path / f"{label}.npz"
        pack(source.lengths, 4096)[0].select(0, 150).save(plan)
        report = run_job("packlab.lab.measure.jobs:write_shard", name, str(source.path),
                         str(plan), str(tmp_path / f"{label}-{name}"),
                         imports=format_imports(name))
        write = report["phases"]["write"]
        grown[label] = (write["peak_rss_growth_bytes"], write["peak_file_growth_bytes"])
    spool_bytes = 5 * spool.num_tokens
    print(f"{name}: its writer grew by {grown['small'][0] / MiB:.1f} MiB for a tenth of the "
          f"spool, {grown['whole'][0] / MiB:.1f} MiB for all of it ({spool_bytes / MiB:.0f} MiB "
          f"of tokens and masks; file-backed {grown['whole'][1] / MiB:.1f} MiB)")
    assert spool_bytes > 2 * HELD
    assert grown["whole"][0] - grown["small"][0] < HELD / 2
    assert grown["whole"][1] < HELD / 4


def _bytes_read() -> int:
    """What this process has read by read(2) and pread(2) so far (``/proc/self/io``)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no rchar")



def test_a_spool_is_verified_once_a_process_while_unchanged(tmp_path: Path) -> None:
    """Every shard of an output that shares a spool verifies it (at the RFC's scale, 86
    ``packed_index`` shards each hashed and scanned the same 14 GB spool): once a process, while
    its files are unchanged; a file changed since is checked again."""
    from packlab.errors import FormatError

    spool = synthesize(tmp_path / "spool", num_sequences=20_000, profile="short", seed=4)
    size = sum(p.stat().st_size for p in spool.root.iterdir() if p.is_file())
    before = _bytes_read()
    SpoolReader(spool.root).verify()
    first = _bytes_read() - before
    before = _bytes_read()
    for _ in range(10):  # as ten shards over it would
        SpoolReader(spool.root).verify()
    again = _bytes_read() - before
    print(f"verify read {first / MiB:.1f} MiB, then {again / MiB:.2f} MiB for ten more")
    assert first > size / 2 and again < size / 20
    tokens = next(p for p in spool.root.iterdir() if p.name.startswith("tokens"))
    with open(tokens, "r+b") as f:  # one byte changed in place: same size, another mtime
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(FormatError, match="checksum mismatch"):
        SpoolReader(spool.root).verify()
