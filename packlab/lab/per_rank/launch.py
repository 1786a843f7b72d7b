"""Real data-parallel runs: ``torch.distributed`` (gloo, 127.0.0.1) over fresh processes.

:func:`launch` starts ``world_size`` processes with ``torch.multiprocessing``, each of which
joins a gloo process group on a free local port, runs a job, and shares its result with
``all_gather_object``; rank 0 writes them to ``result.json``. It never hangs: a job's error is
caught and shared (so no rank waits on a dead peer), the group is always destroyed (``finally``),
and the parent joins with a deadline, then terminates whatever is left.

:func:`consume` is the job the tests and notebook 08 run: one epoch on one rank through a
DataLoader (``num_workers`` workers inside the rank), with the rank-local fix or the proposed
design under Megatron's sampler; optionally stopping after some steps and resuming from the
checkpointed ``consumed_samples`` in fresh objects, as a restarted trainer would.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from packlab.errors import PacklabError, one_line
from packlab.storage.files import staged

Job = Callable[[int, int, dict[str, Any]], dict[str, Any]]

# Ranks start as forks of one server process that imported these once (multiprocessing's
# forkserver, started by the first launch of this process and kept for the next): a fresh
# interpreter per rank imported torch again, two seconds of CPU a rank. Nothing else is shared:
# the server forks before it runs anything.
RANK_START = "forkserver"
RANK_PRELOAD = ["torch", "torch.distributed", "torch.utils.data", "packlab.lab.per_rank.launch",
                "packlab.loading.per_rank.dataset", "packlab.loading.per_rank.sampler"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(job: Job, world_size: int, config: dict[str, Any], out_dir: str | os.PathLike[str],
           *, timeout: float = 60.0,
           background: Callable[[threading.Event], None] | None = None,
           preload: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Run ``job(rank, world_size, config)`` on ``world_size`` real processes; return the
    per-rank results (rank order).

    ``preload``: modules the ranks' forkserver imports once, beside :data:`RANK_PRELOAD`, before
    it forks them (the server starts at this process's first launch, with that launch's list).

    ``background(stop)`` runs in a thread of this process meanwhile (e.g. a producer); ``stop``
    is set once the ranks are done or dead, so it must return soon after. Raises
    :class:`PacklabError` if a rank dies, if the background fails, or if the ranks do not
    finish within ``timeout`` s (then they are terminated).
    """
    import multiprocessing

    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = out / "result.json"
    result.unlink(missing_ok=True)
    port = free_port()
    multiprocessing.get_context(RANK_START).set_forkserver_preload([*RANK_PRELOAD, *preload])
    context = mp.start_processes(_rank_main, args=(world_size, port, job, config, str(out),
                                                   timeout), nprocs=world_size, join=False,
                                 start_method=RANK_START)
    deadline = time.monotonic() + timeout
    stop = threading.Event()
    failed: list[BaseException] = []
    thread = None
    if background is not None:
        thread = threading.Thread(target=_guarded, args=(background, stop, failed), daemon=True,
                                  name="packlab-background")
        thread.start()
    try:
        while not context.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise PacklabError(f"{out}: {world_size} ranks did not finish within "
                                   f"{timeout:g} s (terminated)")
    except ProcessException as exc:
        raise PacklabError(f"{out}: rank {exc.error_index} failed: "
                           f"{one_line(exc, 300)}") from None
    finally:
        stop.set()
        _terminate(context.processes)
        if thread is not None:
            thread.join(max(1.0, deadline - time.monotonic()))
    if failed:
        raise PacklabError(f"{out}: the background task failed: {failed[0]}") from failed[0]
    if not result.is_file():
        raise PacklabError(f"{result}: the ranks wrote no result")
    return json.loads(result.read_text())


def _guarded(task: Callable[[threading.Event], None], stop: threading.Event,
             failed: list[BaseException]) -> None:
    try:
        task(stop)
    except BaseException as exc:  # reported by launch() in the calling thread
        failed.append(exc)


def _terminate(processes: list[Any]) -> None:
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)


def local_store(rank: int, world_size: int, port: int, timeout: float) -> Any:
    """The group's rendezvous store on 127.0.0.1:``port`` only: rank 0 serves it from a socket
    it bound there itself and hands over (torch's TCPStore, given a port, listens on every
    interface, ``::``), the other ranks connect to it."""
    import torch.distributed as dist

    listening = None
    if rank == 0:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        listening = listener.detach()  # the store's from now on
    return dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0,
                         timeout=timedelta(seconds=timeout), master_listen_fd=listening)


def _rank_main(rank: int, world_size: int, port: int, job: Job, config: dict[str, Any],
               out_dir: str, timeout: float) -> None:
    """One rank: join the group, run the job (errors caught and shared), always tear down."""
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", store=local_store(rank, world_size, port, timeout),
                            rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout))
    try:
        try:
            result = job(dist.get_rank(), dist.get_world_size(), config)
        except Exception as exc:  # shared with the other ranks instead of leaving them waiting
            result = {"rank": rank, "error": f"{type(exc).__name__}: {exc}"}
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, result)
        if rank == 0:
            final = Path(out_dir) / "result.json"
            with staged(final, overwrite=True) as tmp:
                tmp.write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


# -- the consuming job --------------------------------------------------------------------------
def run_phases(rank: int, world_size: int, config: dict[str, Any]) -> dict[str, Any]:
    """Several :func:`consume` runs in one process group (``config["phases"]``), one after
    the other; a phase's error is reported in its place and the next phase still runs."""
    phases = []
    for phase in config["phases"]:
        try:
            phases.append(consume(rank, world_size, phase))
        except Exception as exc:
            phases.append({"rank": rank, "error": f"{type(exc).__name__}: {exc}"})
    return {"rank": rank, "world_size": world_size, "pid": os.getpid(), "phases": phases}


def collate_in_worker(items: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`~packlab.loading.per_rank.dataset.collate_ids` plus the pid of the process that ran it
    (a DataLoader worker when ``num_workers > 0``)."""
    from packlab.loading.per_rank.dataset import collate_ids

    return {**collate_ids(items), "worker_pid": os.getpid()}


def _loader(dataset: Any, batch_sampler: Any, config: dict[str, Any]) -> Any:
    import multiprocessing as mp

    from torch.utils.data import DataLoader

    workers = int(config.get("num_workers", 0))
    # Fork the workers, as a torchrun-launched trainer does on Linux: a spawned worker would
    # import torch again (seconds each).
    context = "fork" if workers and "fork" in mp.get_all_start_methods() else None
    return DataLoader(dataset, batch_sampler=batch_sampler, num_workers=workers,
                      collate_fn=collate_in_worker, multiprocessing_context=context,
                      timeout=float(config.get("timeout", 30.0)) + 30.0 if workers else 0)


def _rank_local(rank: int, world_size: int, config: dict[str, Any], consumed: int
                ) -> tuple[Any, Any, Any]:
    from packlab.loading.per_rank.dataset import RankShardedDataset
    from packlab.loading.per_rank.sampler import RankLocalSampler

    dataset = RankShardedDataset(config["directory"], poll_interval=config.get(
        "poll_interval", 0.02), timeout=config.get("timeout", 30.0),
        cache_chunks=config.get("cache_chunks", 2))
    if (dataset.rank, dataset.world_size) != (rank, world_size):
        raise PacklabError(f"dataset sees rank {dataset.rank}/{dataset.world_size}, "
                           f"torch.distributed {rank}/{world_size}")
    sampler = RankLocalSampler(dataset.plan, rank=rank, world_size=world_size,
                               micro_batch_size=config["micro_batch_size"],
                               seed=config.get("seed", 0), epoch=config.get("epoch", 0),
                               window=config.get("window", 1), consumed_samples=consumed)
    tracker = dataset.tracker(epoch=sampler.epoch)
    tracker.skip(sampler.served_before())
    return dataset, sampler, tracker


class _Served:
    """What one rank's loop collected."""

    def __init__(self) -> None:
        self.ids: list[np.ndarray] = []
        self.sums: list[np.ndarray] = []
        self.pids: set[int] = set()
        self.times: list[float] = []
        self.tokens = 0
        self.steps = 0

    def drain(self, batches: Any, stop_after: int | None = None) -> int:
        """Consume batches (all, or ``stop_after`` of them); returns the steps taken."""
        taken = 0
        for batch in batches:
            self.ids.append(batch["sample_id"])
            self.sums.append(batch["token_sum"])
            self.pids.add(int(batch["worker_pid"]))
            self.times.append(time.time())
            self.tokens += int(batch["num_tokens"])
            self.steps += 1
            taken += 1
            if stop_after is not None and taken == stop_after:
                break  # a crash after this step: only the checkpoint survives
        return taken

    def flat(self, parts: list[np.ndarray]) -> list[int]:
        return np.concatenate(parts).tolist() if parts else []

    def steady_rate(self) -> float:
        """Samples per second after the first batch arrived (worker start-up excluded)."""
        if len(self.times) < 2 or self.times[-1] <= self.times[0]:
            return 0.0
        after_first = sum(int(ids.shape[0]) for ids in self.ids[1:])
        return after_first / (self.times[-1] - self.times[0])


def consume(rank: int, world_size: int, config: dict[str, Any]) -> dict[str, Any]:
    """One epoch on this rank; returns the sample ids served (in order) and timings.

    ``config``: ``directory``, ``micro_batch_size``, ``design`` (``rank_local`` or ``seed``),
    ``num_workers``, ``seed``, ``epoch``, ``window``, ``poll_interval``, ``timeout``,
    ``stop_after`` (steps before a simulated crash, then a resume from the checkpoint),
    ``ready_dir`` (where to write ``rank{r}`` once reading starts), ``sampler`` (the seed
    design's batch sampler class, called as Megatron's ``MegatronPretrainingSampler``; default
    packlab's reproduction, the tests pass Megatron-Bridge's own).
    """
    if config.get("design", "rank_local") == "seed":
        return _consume_seed(rank, world_size, config)
    began, began_wall = time.perf_counter(), time.time()
    dataset, sampler, tracker = _rank_local(rank, world_size, config, 0)
    if config.get("ready_dir"):  # tell a waiting producer this rank is up and about to read
        ready = Path(config["ready_dir"]) / f"rank{rank}"
        ready.parent.mkdir(parents=True, exist_ok=True)
        ready.write_text(str(time.time()))
    served = _Served()
    stop_after = config.get("stop_after")
    first_pass = None
    steps = served.drain(tracker.track(_loader(dataset, sampler, config)), stop_after)
    if stop_after is not None:
        state = json.loads(json.dumps(sampler.state_dict(steps_done=steps)))  # as on disk
        first_pass = served.flat(served.ids)
        dataset, sampler, tracker = _rank_local(rank, world_size, config, 0)
        sampler.load_state_dict(state)
        tracker.skip(sampler.served_before())
        served.drain(tracker.track(_loader(dataset, sampler, config)))
    seconds = time.perf_counter() - began
    ids = served.flat(served.ids)
    return {
        "rank": rank, "world_size": world_size, "design": "rank_local",
        "sample_ids": ids, "token_sums": served.flat(served.sums), "first_pass": first_pass,
        "steps": served.steps, "tokens": served.tokens, "seconds": seconds,
        "samples_per_s": len(ids) / seconds if seconds > 0 else 0.0,
        "steady_samples_per_s": served.steady_rate(),
        "completed_chunks": sorted(tracker.completed), "finished": tracker.finished,
        "len": len(dataset), "chunks": dataset.index.chunks.tolist(),
        "pid": os.getpid(), "worker_pids": sorted(served.pids), "started": began_wall,
        "batch_times": served.times,
        "finished_at": time.time(),
    }


def _consume_seed(rank: int, world_size: int, config: dict[str, Any]) -> dict[str, Any]:
    """The proposed dataset under ``MegatronPretrainingSampler`` (global indices)."""
    from packlab.lab.per_rank.megatron_sampler import MegatronPretrainingSampler
    from packlab.lab.per_rank.seed_design import SeedLazyShardedDataset
    from packlab.loading.per_rank.dataset import wait_for_plan

    began = time.perf_counter()
    plan = wait_for_plan(Path(config["directory"]), poll_interval=0.02,
                             timeout=config.get("timeout", 30.0))
    dataset = SeedLazyShardedDataset(config["directory"], plan, rank=rank,
                                     world_size=world_size, mark_completed=False,
                                     record_errors=True)
    sampler_class = config.get("sampler", MegatronPretrainingSampler)
    sampler = sampler_class(len(dataset), 0, config["micro_batch_size"], rank, world_size)
    ids, asked = [], []
    for batch in _loader(dataset, sampler, config):
        ids.append(batch["sample_id"])
    for b in sampler:
        asked.extend(b)
    served = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    seconds = time.perf_counter() - began
    return {"rank": rank, "world_size": world_size, "design": "seed",
            "sampler": f"{sampler_class.__module__}.{sampler_class.__qualname__}",
            "sample_ids": served.tolist(), "asked": asked, "seconds": seconds}
