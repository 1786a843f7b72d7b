"""Where shard writes run: the local process pool (default) or Ray tasks.

A shard job is the argument tuple of :func:`packlab.pipeline.write_shard`: everything arrives
by value or by path, so the same job writes the same bytes in a pool worker, a Ray task on
this machine, or a Ray task on another machine that sees the same paths. Output is identical
byte for byte to the process pool's (the tests check it); only ``seconds`` in the receipts
differs.

Ray: ``ray.init(num_cpus=workers, include_dashboard=False)`` with its temporary folder under
the build folder (``build/ray``) and ``RAY_AUTH_MODE=disabled`` (else Ray writes a token into
the home directory); or ``ray.init(address=...)`` to join a running cluster. A session this
module starts is always shut down, whatever happens; one already running is reused and left
running. A failing task cancels the others and its own error is raised (a
:class:`~packlab.errors.PacklabError` stays one, for the command line's one-line message).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from packlab.errors import PacklabError


@contextlib.contextmanager
def ray_session(*, workers: int = 2, address: str | None = None,
                temp_dir: str | os.PathLike[str] | None = None) -> Iterator[Any]:
    """A Ray session for the block: reuse a running one, else start one and always shut it
    down. Yields the ``ray`` module."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
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
        from packlab.results import build_dir

        folder = Path(temp_dir) if temp_dir is not None else build_dir() / "ray"
        folder.mkdir(parents=True, exist_ok=True)
        options.update(num_cpus=max(1, int(workers)), _temp_dir=str(folder.resolve()))
    try:
        ray.init(**options)
    except Exception as exc:
        ray.shutdown()
        raise PacklabError(f"cannot start Ray ({'address ' + address if address else 'local'}):"
                           f" {' '.join(str(exc).split())[:300]}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def run_ray(jobs: Sequence[tuple[Any, ...]], *, workers: int = 2, address: str | None = None,
            temp_dir: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """Run :func:`~packlab.pipeline.write_shard` jobs as Ray tasks; receipts in job order."""
    from packlab.pipeline import write_shard

    jobs = list(jobs)
    if not jobs:
        return []
    with ray_session(workers=workers, address=address, temp_dir=temp_dir) as ray:
        task = ray.remote(num_cpus=1, max_retries=0)(write_shard)
        refs = [task.remote(*job) for job in jobs]
        try:
            return list(ray.get(refs))
        except ray.exceptions.RayTaskError as exc:
            for ref in refs:
                ray.cancel(ref, force=True)
            cause = exc.cause if isinstance(exc.cause, BaseException) else None
            if isinstance(cause, PacklabError):
                raise cause from None
            raise PacklabError(f"a Ray shard task failed: {' '.join(str(exc).split())[:300]}"
                               ) from None
