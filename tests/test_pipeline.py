"""write_shards: shards and receipts, parallel output byte-identical to one worker, overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import write_random_spool

from packlab import open_dataset
from packlab.bins import bin_digest
from packlab.errors import PacklabError
from packlab.formats import format_names
from packlab.packing import BinAssignment, pack
from packlab.packing.materialize import iter_bins
from packlab.pipeline.receipts import RECEIPT_SUFFIX, shard_bytes, shard_checksum
from packlab.pipeline.shards import shard_ranges, write_shards
from packlab.sources.validate import validate_path
from packlab.spool import SpoolReader
from packlab.storage.files import sha256_file

FORMATS = format_names()


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[SpoolReader, BinAssignment]:
    root = tmp_path_factory.mktemp("pipeline")
    spool = write_random_spool(root / "spool", num_sequences=150, max_len=250, seed=4)
    assignment, _ = pack(spool.lengths, 400, algorithm="first_fit_decreasing", seed=1)
    return spool, assignment


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root``, receipts included, by relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_shard_ranges_cover_every_bin() -> None:
    assert shard_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert shard_ranges(3, 8) == [(0, 3)]
    with pytest.raises(PacklabError):
        shard_ranges(3, 0)


@pytest.mark.parametrize("name", FORMATS)
def test_shards_and_receipts(name: str, packed, tmp_path: Path) -> None:
    spool, assignment = packed
    out = tmp_path / "out"
    receipts = write_shards(spool, assignment, out, format=name, bins_per_shard=7, workers=1)
    assert len(receipts) == -(-assignment.num_bins // 7)
    assert [r["bins"] for r in receipts] == [list(b) for b in shard_ranges(assignment.num_bins, 7)]
    lengths = assignment.bin_lengths(spool.lengths)
    for i, r in enumerate(receipts):
        shard = out / r["shard"]
        assert r["shard"].startswith(f"shard_{i:06d}") and shard.exists()
        on_disk = json.loads((out / f"{r['shard']}{RECEIPT_SUFFIX}").read_text())
        assert on_disk == r
        assert r["format"] == name and r["pack_size"] == assignment.pack_size
        assert r["num_bins"] == r["bins"][1] - r["bins"][0]
        assert r["num_tokens"] == int(lengths[r["bins"][0] : r["bins"][1]].sum())
        assert r["bytes"] == shard_bytes(shard)
        assert (r["sha256"], r["sha256_of"]) == shard_checksum(shard)
        target = out / r["sha256_of"]
        assert sha256_file(target) == r["sha256"]
    ds = open_dataset(out)
    expected = [bin_digest(*b) for b in iter_bins(spool, assignment)]
    assert [bin_digest(*ds.read_bin(i)) for i in range(len(ds))] == expected
    summary = validate_path(out)
    assert summary["num_bins"] == assignment.num_bins
    assert all(row["receipt"] for row in summary["shards"])


@pytest.mark.parametrize("name", FORMATS)
def test_parallel_output_is_byte_identical_to_one_worker(name: str, packed, tmp_path: Path
                                                          ) -> None:
    spool, assignment = packed
    serial = write_shards(spool, assignment, tmp_path / "a", format=name, bins_per_shard=6,
                          workers=1)
    parallel = write_shards(spool, assignment, tmp_path / "b", format=name, bins_per_shard=6,
                            workers=3)
    a, b = tree_bytes(tmp_path / "a"), tree_bytes(tmp_path / "b")
    assert a.keys() == b.keys() and len(a) >= len(serial)
    assert all(a[k] == b[k] for k in a), [k for k in a if a[k] != b[k]]
    assert any(k.endswith(RECEIPT_SUFFIX) for k in a) and serial == parallel


def test_existing_shards_need_overwrite_and_stale_ones_are_removed(packed, tmp_path: Path) -> None:
    spool, assignment = packed
    name = "parquet" if "parquet" in FORMATS else FORMATS[0]
    out = tmp_path / "out"
    many = write_shards(spool, assignment, out, format=name, bins_per_shard=4, workers=2)
    with pytest.raises(PacklabError, match="already holds another output"):
        write_shards(spool, assignment, out, format=name, bins_per_shard=5)  # another job
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = write_shards(spool, assignment, out, format=name, bins_per_shard=4)  # the same job
    assert all(r.pop("reused") for r in again)  # nothing rewritten: each receipt vouches
    assert again == many
    mtimes.pop("dataset.json")  # rewritten: "writing", then "complete" again
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != "dataset.json"
            } == mtimes
    few = write_shards(spool, assignment, out, format=name, bins_per_shard=1000, workers=2,
                       existing="overwrite")
    assert len(many) > 1 and len(few) == 1
    left = sorted(p.name for p in out.iterdir())
    assert left == ["dataset.json", "pack_metadata.json", few[0]["shard"],
                    f"{few[0]['shard']}{RECEIPT_SUFFIX}"]
    assert len(open_dataset(out)) == assignment.num_bins


def test_a_failing_worker_raises_a_clear_error(tmp_path: Path, packed) -> None:
    spool, _ = packed
    small = write_random_spool(tmp_path / "small", num_sequences=5, seed=1)
    # an assignment that names sequences the small spool does not have
    offsets = np.array([0, 2, 4], dtype=np.int64)
    bad = BinAssignment(offsets, np.array([0, 1, 2, 140], dtype=np.int64), 4096)
    with pytest.raises(PacklabError, match="small: the assignment names sequence 140"):
        write_shards(small, bad, tmp_path / "out", format=FORMATS[0], bins_per_shard=1,
                     workers=2)
    assert not (tmp_path / "out" / "shard_000001").exists()
    with pytest.raises(PacklabError, match="unknown format"):
        write_shards(spool, bad, tmp_path / "x", format="nope", bins_per_shard=1)
    with pytest.raises(PacklabError, match="no such spool"):
        write_shards(tmp_path / "missing", bad, tmp_path / "x", format=FORMATS[0],
                     bins_per_shard=1)
