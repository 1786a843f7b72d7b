"""Shard writes on Ray: byte for byte what the process pool writes; errors surface; the Ray
session is always shut down. One local Ray session (about 20 s to start on this machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray
from conftest import write_random_spool

from packlab.cli import main
from packlab.errors import PacklabError
from packlab.executors import ray_session, run_jobs
from packlab.packing import pack
from packlab.pipeline.shards import write_shard, write_shards


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (receipts without their timing) by relative name."""
    out = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name.endswith(".receipt.json"):
            receipt = json.loads(data)
            receipt.pop("seconds")
            data = json.dumps(receipt, sort_keys=True).encode()
        out[str(path.relative_to(directory))] = data
    return out


def test_ray_shards_equal_the_process_pool_shards_byte_for_byte(tmp_path: Path) -> None:
    spool = write_random_spool(tmp_path / "spool", num_sequences=160, max_len=400, seed=9)
    assignment, _ = pack(spool.lengths, 1024, algorithm="first_fit_decreasing")
    formats = ["parquet", "memmap_v1", "binidx"]
    for name in formats:
        write_shards(spool, assignment, tmp_path / "pool" / name, format=name,
                     bins_per_shard=7, workers=2)
    with ray_session(workers=2, temp_dir=tmp_path.parent / "ray") as session:
        assert session.is_initialized()
        for name in formats:
            receipts = write_shards(spool, assignment, tmp_path / "ray" / name, format=name,
                                    bins_per_shard=7, workers=2, executor="ray")
            assert [r["bins"][0] for r in receipts] == list(range(0, assignment.num_bins, 7))
        with pytest.raises(PacklabError, match="row_group_size must be a positive"):
            write_shards(spool, assignment, tmp_path / "bad", format="parquet",
                         bins_per_shard=7, executor="ray", row_group_size=0)
        with pytest.raises(PacklabError, match="already holds another output"):
            write_shards(spool, assignment, tmp_path / "ray" / "parquet", format="parquet",
                         bins_per_shard=6, executor="ray")
        # the command line, in this process: it reuses the running session
        assert main(["pack", str(spool.path), str(tmp_path / "cli"), "--format", "parquet",
                     "--pack-size", "1024", "--algorithm", "first_fit_decreasing",
                     "--bins-per-shard", "7", "--executor", "ray"]) == 0
    assert not ray.is_initialized()  # the session this test started is shut down
    for name in formats:
        pool, remote = tree(tmp_path / "pool" / name), tree(tmp_path / "ray" / name)
        assert len(pool) > 2 and pool == remote
    assert not list((tmp_path / "bad").glob("shard_*"))
    assert tree(tmp_path / "cli") == tree(tmp_path / "pool" / "parquet")


def test_an_unknown_executor_is_a_clear_error() -> None:
    with pytest.raises(PacklabError, match="unknown executor 'dask'"):
        run_jobs(write_shard, [("spool", None, 0, "x", "parquet", False, {})], 2, executor="dask")
