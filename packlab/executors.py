"""Where jobs run: in this process, a local process pool (the default), or Ray tasks.

:func:`run_jobs` runs one function over many argument tuples (a shard job is the arguments of
:func:`packlab.pipeline.shards.write_shard`): everything arrives by value or by path, so the
same job gives the same result in this process, a pool worker, a Ray task on this machine, or
a Ray task on another machine that sees the same paths. Shards are identical byte for byte
whichever runs them, and so are their receipts (the tests check it).

Ray: ``ray.init(num_cpus=workers, include_dashboard=False)`` with its temporary folder under
the build folder (``build/ray``) and ``RAY_AUTH_MODE=disabled`` (else Ray writes a token into
the home directory); or ``ray.init(address=...)`` to join a running cluster. A session started
here is local: every Ray server listens on 127.0.0.1 only (:func:`loopback_only`), never on
the machine's network (Ray has no authentication: a port reachable from the network runs
anyone's code); a user who wants a cluster names its address. A session this
module starts is always shut down, whatever happens; one already running is reused and left
running. :func:`iter_jobs` yields each result as its job finishes (a caller that merges or
counts as it goes). A failing task cancels the others and its own error is raised (a
:class:`~packlab.errors.PacklabError` stays one, for the command line's one-line message).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, TypeVar

from packlab.errors import PacklabError, one_line
from packlab.progress import progress

EXECUTORS = ("process", "ray")
T = TypeVar("T")


@contextlib.contextmanager
def ray_session(*, workers: int = 2, address: str | None = None,
                temp_dir: str | os.PathLike[str] | None = None) -> Iterator[Any]:
    """A Ray session for the block: reuse a running one, else start one and always shut it
    down. Yields the ``ray`` module."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with contextlib.ExitStack() as stack:
        if not address:
            stack.enter_context(loopback_only())  # before Ray is imported: it reads the switch
        try:
            import ray
        except ModuleNotFoundError:
            raise PacklabError("the ray executor needs Ray: pip install ray") from None
        if ray.is_initialized():
            yield ray
            return
        options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                   "configure_logging": False}
        if address:
            options["address"] = address
        else:
            folder = (Path(temp_dir) if temp_dir is not None
                      else Path(tempfile.gettempdir()) / f"packlab-ray-{os.getuid()}")
            folder.mkdir(parents=True, exist_ok=True)
            options.update(num_cpus=max(1, int(workers)), _temp_dir=str(folder.resolve()),
                           _node_ip_address=LOOPBACK)
        try:
            ray.init(**options)
        except Exception as exc:
            ray.shutdown()
            raise PacklabError(f"cannot start Ray ({'address ' + address if address else 'local'}"
                               f"): {one_line(exc, 300)}") from None
        try:
            yield ray
        finally:
            ray.shutdown()


LOOPBACK = "127.0.0.1"
SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # Ray's switch, "0": one machine only


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """Ray in its single-machine mode for the block (what it does on macOS and Windows): the
    node's address is 127.0.0.1, and Ray's servers (GCS, raylet, object manager, workers,
    agents) listen there only. ``_node_ip_address="127.0.0.1"`` alone is not enough: Ray 2.60
    turns a loopback address into the machine's own (``resolve_ip_for_localhost``) unless this
    mode is on. Ray reads the switch from the environment when it is first imported (its
    processes inherit it) and keeps it in ``ray._private.ray_constants``: both are set, and
    restored after."""
    previous = os.environ.get(SINGLE_MACHINE)
    os.environ[SINGLE_MACHINE] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    switch = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(SINGLE_MACHINE, None)
        else:
            os.environ[SINGLE_MACHINE] = previous
        constants = sys.modules.get("ray._private.ray_constants")
        if constants is not None:
            constants.ENABLE_RAY_CLUSTER = (
                switch if switch is not None
                else constants.env_bool(SINGLE_MACHINE, not constants.IS_WINDOWS_OR_OSX))


def run_jobs(fn: Callable[..., T], jobs: Sequence[tuple[Any, ...]], workers: int, *,
             desc: str | None = "work", executor: str = "process",
             address: str | None = None) -> list[T]:
    """``fn(*job)`` for every job (serially, in a process pool, or as Ray tasks); results in
    job order. The first failure cancels the rest and is raised."""
    jobs = list(jobs)
    return _in_order(iter_jobs(fn, jobs, workers, executor=executor, address=address),
                     len(jobs), desc)


def _in_order(done: Iterator[tuple[int, T]], count: int, desc: str | None) -> list[T]:
    results: list[Any] = [None] * count
    for i, result in (progress(done, total=count, desc=desc) if desc else done):
        results[i] = result
    return results


def iter_jobs(fn: Callable[..., T], jobs: Sequence[tuple[Any, ...]], workers: int, *,
              executor: str = "process", address: str | None = None,
              temp_dir: str | os.PathLike[str] | None = None) -> Iterator[tuple[int, T]]:
    """``(i, fn(*jobs[i]))`` as each job finishes, in any order (for a caller that merges or
    counts as it goes). The first failure cancels the rest and is raised."""
    jobs = list(jobs)
    if not jobs:
        return
    if executor == "ray":
        yield from _iter_ray(fn, jobs, workers=workers, address=address, temp_dir=temp_dir)
    elif executor != "process":
        raise PacklabError(f"unknown executor {executor!r}; choose from {', '.join(EXECUTORS)}")
    elif workers <= 1 or len(jobs) == 1:
        for i, job in enumerate(jobs):
            yield i, fn(*job)
    else:
        yield from _iter_pool(fn, jobs, workers)


def run_pool(fn: Callable[..., T], jobs: list[tuple[Any, ...]], workers: int, *,
             desc: str | None = "work") -> list[T]:
    """``fn(*job)`` in a process pool; the first failure cancels the rest and is raised."""
    return _in_order(_iter_pool(fn, list(jobs), workers), len(jobs), desc)


def _iter_pool(fn: Callable[..., T], jobs: list[tuple[Any, ...]], workers: int
               ) -> Iterator[tuple[int, T]]:
    """Ctrl-C (SIGINT to the whole process group) is the parent's to handle: workers ignore
    it; the parent cancels the queued jobs and aborts those in flight (``STOP_JOB``: their
    writers clean up; a worker killed outright leaves a temporary the next run sweeps). Any other failure
    cancels the queued jobs and lets those in flight finish."""
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)),
                             initializer=_pool_worker) as pool:
        with interrupts_held():  # forked with SIGINT held, until the worker ignores it
            futures = {pool.submit(_stoppable, fn, job): i for i, job in enumerate(jobs)}
        try:
            for future in as_completed(futures):
                error = future.exception()
                if isinstance(error, BrokenProcessPool):
                    raise PacklabError(f"a worker process died ({error}); out of memory? "
                                       "try fewer --workers (or smaller jobs)") from None
                if error is not None:
                    raise error
                yield futures[future], future.result()
        except KeyboardInterrupt:
            for future in futures:
                future.cancel()  # queued jobs never start
            for pid in list(getattr(pool, "_processes", None) or {}):
                try:
                    os.kill(pid, STOP_JOB)  # jobs in flight abort (see _stoppable)
                except ProcessLookupError:
                    pass
            raise
        finally:  # a failure, or a caller that stopped early: drop the jobs not started
            for future in futures:
                future.cancel()


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold SIGINT for the block (the workers forked in it start with it held); one that
    arrives meanwhile is delivered when the block ends."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ctrl-C during the block is kept and raised when the block ends, for code that must
    not be interrupted halfway: numba's compiler calls back into Python from C, and a
    KeyboardInterrupt raised in such a callback is printed as a traceback and dropped
    (the interrupt is lost). Holding SIGINT with a signal mask is not enough here: with any
    other thread running (a process pool's manager) the kernel delivers it to that thread
    and Python still raises it in the main one. Outside the main thread the block runs as
    is (only the main thread receives Python's signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if arrived:
            signal.raise_signal(signal.SIGINT)  # the handler in place before the block


_IN_JOB = [False]  # in a pool worker: whether a job is running
_STOPPED = [False]  # in a pool worker: the parent asked the running job to stop
STOP_JOB = signal.SIGUSR1
PARENT_GONE = 128 + signal.SIGHUP  # a worker's exit status once its parent is gone, as a shell's
PARENT_POLL = 0.5  # seconds between a worker's looks at its parent


def _pool_worker() -> None:
    """A pool worker's set-up: it ignores Ctrl-C (the parent stops the pool and reports it,
    once; no worker prints a traceback); ``STOP_JOB`` (SIGUSR1) from the parent aborts the job
    running (its writer cleans up: nothing half written is published) and leaves an idle worker
    alone (it exits when the pool shuts down, so the pool never sees a worker vanish; SIGTERM
    keeps its default, for the pool's own clean-up of a broken pool); and it exits once the
    parent is gone (:func:`_exit_with_parent`)."""
    def stop(signum: int, frame: Any) -> None:
        if _IN_JOB[0]:
            _STOPPED[0] = True
            raise SystemExit(128 + signum)

    def dropped(info: Any) -> None:
        # the stop raised inside a finalizer or weakref callback, where Python prints it and
        # drops it: the job's next check_stop() raises it again
        if not (_STOPPED[0] and isinstance(info.exc_value, SystemExit)):
            sys.__unraisablehook__(info)

    sys.unraisablehook = dropped
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(STOP_JOB, stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _exit_with_parent()


def _exit_with_parent() -> None:
    """In a pool worker: exit once the parent process is gone. A parent killed outright
    (``kill PID``, ``timeout``, the OOM killer) never shuts its pool down, and its workers would
    wait on the job queue forever, holding what they inherited: the output's writing lock
    among it, so the same command run again was refused. A thread looks at the worker's parent
    id every ``PARENT_POLL`` s (it changes when the parent dies); the worker's temporaries are
    swept by the next run, as a killed worker's are."""
    parent = multiprocessing.parent_process()  # as it was at the fork: it may be gone by now
    pid = parent.pid if parent is not None else os.getppid()

    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(PARENT_POLL)
        os._exit(PARENT_GONE)

    threading.Thread(target=watch, name="packlab-parent-watch", daemon=True).start()


def check_stop() -> None:
    """In a pool worker's job, now and then: stop if the parent asked and the stop was dropped
    (it arrived while Python ran a finalizer)."""
    if _STOPPED[0]:
        raise SystemExit(128 + STOP_JOB)


def _stoppable(fn: Callable[..., T], job: tuple[Any, ...]) -> T:
    """``fn(*job)`` in a pool worker, marked as running (see :func:`_pool_worker`)."""
    _IN_JOB[0] = True
    try:
        return fn(*job)
    finally:
        _IN_JOB[0] = False


def run_ray(fn: Callable[..., T], jobs: Sequence[tuple[Any, ...]], *, workers: int = 2,
            address: str | None = None, temp_dir: str | os.PathLike[str] | None = None
            ) -> list[T]:
    """``fn(*job)`` as Ray tasks; results in job order."""
    jobs = list(jobs)
    return _in_order(iter_jobs(fn, jobs, workers, executor="ray", address=address,
                               temp_dir=temp_dir), len(jobs), None)


def _iter_ray(fn: Callable[..., T], jobs: list[tuple[Any, ...]], *, workers: int,
              address: str | None, temp_dir: str | os.PathLike[str] | None
              ) -> Iterator[tuple[int, T]]:
    with ray_session(workers=workers, address=address, temp_dir=temp_dir) as ray:
        task = ray.remote(num_cpus=1, max_retries=0)(fn)
        refs = [task.remote(*job) for job in jobs]
        order = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                yield order[ready[0]], ray.get(ready[0])
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, BaseException) else None
            if isinstance(cause, PacklabError):
                raise cause from None
            raise PacklabError(f"a Ray task failed: {one_line(exc, 300)}"
                               ) from None
        finally:  # a failure, or a caller that stopped early: cancel what still runs
            for ref in pending:
                ray.cancel(ref, force=True)
