"""Per-rank loading across real processes: torch.distributed (gloo, 127.0.0.1, a free
port), ranks started by torch.multiprocessing, two DataLoader workers inside every rank.

Each module fixture below is one real run (world sizes 1, 2, 3, 4); the tests read what the
ranks gathered. Every run is bounded by a deadline and its process group destroyed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import write_random_spool

from packlab.errors import PacklabError
from packlab.lab.per_rank.coverage import coverage
from packlab.lab.per_rank.launch import consume, launch, run_phases
from packlab.loading.per_rank import ChunkPlan, ChunkProducer, spool_source
from packlab.loading.per_rank.plan import chunk_path, marker_path
from packlab.packing import pack
from packlab.packing.materialize import iter_bins

pytestmark = pytest.mark.slow  # minutes of work: `make test-fast` leaves it out

PACK = 512
SPC = 6
MBS = 2
WORKERS = 2
DEADLINE = 150.0  # seconds; far above a normal run, so only a hang reaches it


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("distributed")
    spool = write_random_spool(root / "spool", num_sequences=130, max_len=250, seed=3)
    assignment, _ = pack(spool.lengths, PACK, algorithm="next_fit")
    sums = np.array([int(b.input_ids.sum(dtype=np.int64)) for b in iter_bins(spool, assignment)])
    source = spool_source(spool, assignment)
    plan = ChunkPlan(num_samples=assignment.num_bins, samples_per_chunk=SPC,
                         format="parquet", pack_size=PACK)
    ChunkProducer(root / "chunks", plan).produce(source)
    return {"root": root, "source": source, "plan": plan, "sums": sums,
            "chunks": root / "chunks"}


def phase(directory: Path, **options) -> dict:
    return {"directory": str(directory), "micro_batch_size": MBS, "num_workers": WORKERS,
            "poll_interval": 0.02, "timeout": 60.0, "seed": 11, **options}


def run(data, world_size: int, name: str, phases: list[dict], background=None) -> list[dict]:
    results = launch(run_phases, world_size, {"phases": phases}, data["root"] / name,
                     timeout=DEADLINE, background=background)
    assert [r["rank"] for r in results] == list(range(world_size))
    return results


@pytest.fixture(scope="module")
def world1(data):
    return run(data, 1, "w1", [phase(data["chunks"], epoch=0)])


@pytest.fixture(scope="module")
def world3(data):
    """Epoch 1 at world size 3, then a directory whose chunk 2 never comes."""
    missing = data["root"] / "missing"
    plan = ChunkPlan(num_samples=4 * SPC, samples_per_chunk=SPC, format="jsonl",
                         pack_size=PACK)
    ChunkProducer(missing, plan).produce(data["source"], chunks=[0, 1, 3])
    began = time.monotonic()
    results = run(data, 3, "w3", [phase(data["chunks"], epoch=1),
                                  phase(missing, timeout=1.0)])
    return results, time.monotonic() - began


@pytest.fixture(scope="module")
def world4(data):
    return run(data, 4, "w4", [phase(data["chunks"], epoch=2)])


@pytest.fixture(scope="module")
def world2(data):
    """A producer slower than the ranks (deleting what they mark), a crash after 2 steps and a
    resume. (Seed 003's design on real ranks, under Megatron-Bridge's own sampler:
    tests/bridge/test_real_ranks.py.)"""
    slow = data["root"] / "slow"
    ready = data["root"] / "ready"
    plan = data["plan"]
    producer = ChunkProducer(slow, plan)
    published: dict[int, float] = {}

    def produce(stop: threading.Event) -> None:
        while len(list(ready.glob("rank*"))) < 2:  # no chunk until both ranks are reading
            if stop.wait(0.05):
                return
        for chunk in range(plan.num_chunks):
            if stop.wait(0.2):
                return
            producer.collect()
            producer.produce(data["source"], chunks=[chunk])
            published[chunk] = time.time()

    results = run(data, 2, "w2", [phase(slow, epoch=0, stop_after=2, ready_dir=str(ready))],
                  background=produce)
    deadline = time.monotonic() + 10
    while producer.published() and time.monotonic() < deadline:
        producer.collect()
        time.sleep(0.05)
    ready_at = [float((ready / f"rank{r}").read_text()) for r in range(2)]
    return results, producer, published, ready_at


def rank_processes() -> list[psutil.Process]:
    """Ranks still alive, and their DataLoader workers: the descendants of the forkserver the
    ranks are forked from (the server itself stays for this process's next run, as
    multiprocessing's resource tracker does; neither is a rank)."""
    servers = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if "multiprocessing.forkserver" in " ".join(child.cmdline()):
                servers.append(child)
    assert len(servers) <= 1, servers
    return [p for server in servers for p in server.children(recursive=True)]


def served(results: list[dict], k: int = 0) -> list[np.ndarray]:
    for r in results:
        assert "error" not in r["phases"][k], r["phases"][k]["error"]
    return [np.array(r["phases"][k]["sample_ids"], dtype=np.int64) for r in results]


def check_exactly_once(data, results: list[dict], k: int = 0) -> None:
    ids = served(results, k)
    assert coverage(ids, data["plan"].num_samples).exactly_once
    for rank, r in enumerate(results):
        p = r["phases"][k]
        assert np.all((np.array(p["sample_ids"]) // SPC) % len(results) == rank)  # own chunks
        assert np.array_equal(np.array(p["token_sums"]), data["sums"][p["sample_ids"]])
        assert p["finished"] and p["completed_chunks"] == p["chunks"]
        # the batches were built in DataLoader worker processes, not in the rank itself
        loaders = 1 if p["first_pass"] is None else 2  # a resume starts a second DataLoader
        assert len(p["worker_pids"]) == WORKERS * loaders and r["pid"] not in p["worker_pids"]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_sample_served_exactly_once_across_real_ranks(data, world_size, request) -> None:
    results = request.getfixturevalue(f"world{world_size}")
    if world_size in (2, 3):
        results = results[0]
    check_exactly_once(data, results)


def test_world_size_changes_between_epochs(data, world1, world3, world4) -> None:
    """Epochs 0, 1, 2 on one directory at world sizes 1, 3, 4: each covers every sample once,
    each in its own shuffle."""
    orders = []
    for results in (world1, world3[0], world4):
        check_exactly_once(data, results)
        orders.append(np.concatenate(served(results)))
    assert len({tuple(o.tolist()) for o in orders}) == 3
    for chunk in range(data["plan"].num_chunks):
        marker = marker_path(chunk_path(data["chunks"], data["plan"], chunk))
        assert '"epoch": 2' in marker.read_text() and '"world_size": 4' in marker.read_text()


def test_resume_after_a_crash_loses_and_repeats_nothing(data, world2) -> None:
    results = world2[0]
    check_exactly_once(data, results)
    for r in results:
        p = r["phases"][0]
        first = p["first_pass"]
        assert len(first) == 2 * MBS  # two steps before the crash
        assert p["sample_ids"][: len(first)] == first
        rest = p["sample_ids"][len(first):]
        assert not set(first) & set(rest)


def test_a_producer_slower_than_the_ranks(data, world2) -> None:
    results, producer, published, ready_at = world2
    check_exactly_once(data, results)
    plan = data["plan"]
    assert len(published) == plan.num_chunks
    # both ranks were reading before the first chunk existed, so each waited for every one
    # of its chunks: it finished only after the last of them was published
    assert max(ready_at) < min(published.values())
    for r in results:
        p = r["phases"][0]
        assert p["finished_at"] > max(published[c] for c in p["chunks"])
    # every chunk was marked by its rank and then deleted by the producer
    assert producer.published() == [] and sorted(producer.deleted) == list(
        range(plan.num_chunks))


def test_a_missing_chunk_is_a_clear_timeout_not_a_hang(world3) -> None:
    results, seconds = world3
    errors = [r["phases"][1].get("error") for r in results]
    assert errors[0] is None and errors[1] is None  # chunks 0, 3 and 1 were there
    assert errors[2] is not None
    assert "chunk_00002.jsonl: chunk 2 (rank 2) not published after 1 s" in errors[2]
    assert seconds < DEADLINE


def test_a_stuck_run_is_terminated_at_its_deadline(tmp_path: Path) -> None:
    """No producer at all: the rank would wait (its own timeout is long); the launcher's
    deadline ends it, kills the process and says so."""
    seen: list[psutil.Process] = []

    def watch(stop: threading.Event) -> None:  # the check below sees a rank while it runs
        while not stop.is_set() and not seen:
            seen.extend(rank_processes())
            time.sleep(0.05)

    began = time.monotonic()
    with pytest.raises(PacklabError, match="did not finish within 3 s"):
        launch(consume, 1, phase(tmp_path / "nothing", timeout=600.0), tmp_path / "run",
               timeout=3.0, background=watch)
    assert time.monotonic() - began < 30
    assert seen
    assert rank_processes() == []


def test_no_rank_process_outlives_its_run(world1, world2, world3, world4) -> None:
    assert rank_processes() == []
    assert not [t for t in threading.enumerate() if t.name.startswith("torch")]


def test_the_rendezvous_store_listens_on_loopback_only() -> None:
    """Rank 0's store, as every run makes it: its port is bound to 127.0.0.1, never to every
    interface (torch's own TCPStore would listen on ``::``: a wildcard, in any namespace)."""
    from packlab.lab.per_rank.launch import free_port, local_store

    port = free_port()
    store = local_store(0, 1, port, timeout=30.0)
    store.set("probe", "1")
    assert store.get("probe") == b"1"
    bound = {c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
             if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    assert bound == {"127.0.0.1"}
    del store
