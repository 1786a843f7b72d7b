"""Shard and spool writes on Ray: byte for byte what the process pool writes; errors surface;
the Ray session is always shut down. One local Ray session (about 15 s to start here)."""

from __future__ import annotations

import contextlib
import ipaddress
from pathlib import Path

import pytest
from chat_tokenizers import chat_setup, options
from conftest import write_random_spool

from packlab.cli import main
from packlab.codecs.jsonl_index import index_path
from packlab.errors import PacklabError
from packlab.executors import ray_session, run_jobs
from packlab.packing import pack
from packlab.pipeline.shards import write_shard, write_shards
from packlab.tokenize import tokenize_chat_jsonl

pytestmark = pytest.mark.slow  # minutes of work: `make test-fast` leaves it out


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory``, receipts included, by relative name."""
    return {str(path.relative_to(directory)): path.read_bytes()
            for path in sorted(p for p in directory.rglob("*") if p.is_file())}


def assert_ray_listens_on_loopback_only(session: object) -> None:
    """Every socket that Ray's processes (GCS, raylet, its agents and workers: this process's
    descendants, with a task run so workers exist) listen on is bound to a loopback address:
    no wildcard (0.0.0.0, ::) and no address of the machine's interfaces. A wildcard shows as
    one wherever it is bound; an interface's address shows as itself: on the machine, or in
    ``make test``'s network namespace, its veth address 10.254.0.1."""
    import psutil

    assert session.get(session.remote(lambda: 1).remote()) == 1
    assert {node["NodeManagerAddress"] for node in session.nodes()} == {"127.0.0.1"}
    listening = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            listening += [(process.name(), c.laddr.ip) for c in
                          process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert len(listening) >= 3, listening  # GCS, raylet, a worker at least
    loopback = [ip for _, ip in listening
                if ipaddress.ip_address(ip.removeprefix("::ffff:")).is_loopback]
    assert len(loopback) == len(listening), listening


def test_ray_writes_what_the_process_pool_writes_byte_for_byte(tmp_path: Path) -> None:
    """Shards and spools, in one Ray session (Ray takes ~15 s to start here: one start for
    both), the command line reusing the running session, errors surfacing."""
    spool = write_random_spool(tmp_path / "spool", num_sequences=160, max_len=400, seed=9)
    assignment, _ = pack(spool.lengths, 1024, algorithm="first_fit_decreasing")
    formats = ["parquet", "memmap_v1", "binidx"]
    for name in formats:
        write_shards(spool, assignment, tmp_path / "pool" / name, format=name,
                     bins_per_shard=7, workers=2)
    chats = chat_setup(tmp_path / "chats")
    jsonl, folder = chats["jsonl"], chats["folders"]["chatml_generation"]
    reference = {name: spool_tree(tokenize_chat_jsonl(jsonl, tmp_path / f"one-{name}",
                                                      **options(chats, name)).path)
                 for name in ("bpe", "llama3", "generation")}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(jsonl.read_text(encoding="utf-8") + "{oops\n", encoding="utf-8")
    with ray_session(workers=2, temp_dir=tmp_path.parent / "ray") as session:
        assert session.is_initialized()
        assert_ray_listens_on_loopback_only(session)
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
        for name in ("bpe", "llama3"):
            remote = tokenize_chat_jsonl(jsonl, tmp_path / f"ray-{name}", workers=2,
                                         executor="ray", **options(chats, name))
            assert spool_tree(remote.path) == reference[name]
        assert main(["tokenize", str(jsonl), str(tmp_path / "ray-tok"), "--tokenizer",
                     str(folder), "--executor", "ray", "--workers", "2"]) == 0
        with pytest.raises(PacklabError, match=f"{bad}: line {len(chats['records']) + 1}: "
                                               "malformed JSON"):
            tokenize_chat_jsonl(bad, tmp_path / "ray-bad", workers=2, executor="ray")
    import ray  # here, not at collection: only the worker that runs this test pays for it

    assert not ray.is_initialized()  # the session this test started is shut down
    for name in formats:
        pool, remote = tree(tmp_path / "pool" / name), tree(tmp_path / "ray" / name)
        assert len(pool) > 2 and pool == remote
    assert not list((tmp_path / "bad").glob("shard_*"))
    assert tree(tmp_path / "cli") == tree(tmp_path / "pool" / "parquet")
    assert spool_tree(tmp_path / "ray-tok") == reference["generation"]
    assert not (tmp_path / "ray-bad").exists()
    assert not index_path(jsonl).exists()


def spool_tree(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_an_unknown_executor_is_a_clear_error() -> None:
    with pytest.raises(PacklabError, match="unknown executor 'dask'"):
        run_jobs(write_shard, [("spool", None, 0, "x", "parquet", False, {})], 2, executor="dask")
