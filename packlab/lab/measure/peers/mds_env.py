"""Peers that cannot share packlab's environment, measured in their own: a subprocess.

MosaicML streaming needs numpy < 2.2; ``make mds-env`` (run by ``make run`` / ``make test``)
builds ``.venv-mds`` beside ``.venv`` with packlab's dependencies and streaming's. The parent
writes the reference bins as raw CSR (:mod:`packlab.lab.measure.peers.raw_csr`) and runs
:func:`measure_there` in that environment's interpreter through the measurement harness
(``run_job(..., isolation="subprocess", python=...)``: a fresh process, packlab from this
checkout on its ``PYTHONPATH``), handing it the reference directory, the packlab shard of the
in-RAM Python floor and the one index list; it runs the same
:func:`packlab.lab.measure.peers.run.compare` on its peers, raw CSR and the floors beside them in
its own loop. No environment, or a child that fails: the peers are skipped with the reason.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packlab.errors import PacklabError
from packlab.lab.measure.harness import run_job
from packlab.lab.results import _root

ENVIRONMENTS = {"mds": ".venv-mds"}
PYTHON_VARIABLE = {"mds": "PACKLAB_MDS_PYTHON"}


def environment_python(environment: str) -> Path | None:
    """The interpreter of ``environment``: ``$PACKLAB_MDS_PYTHON``, else ``.venv-mds`` in this
    checkout, else beside the virtualenv running now (a worktree sharing one checkout's
    ``.venv``)."""
    folder = ENVIRONMENTS[environment]
    override = os.environ.get(PYTHON_VARIABLE[environment])
    candidates = [Path(override)] if override else []
    candidates += [_root() / folder / "bin" / "python",
                   Path(sys.prefix).resolve().parent / folder / "bin" / "python"]
    return next((c for c in candidates if c.is_file()), None)


def run_elsewhere(
    environment: str,
    names: Sequence[str],
    *,
    reference_dir: Path,
    floor_shard: Path,
    out_dir: Path,
    indices: Sequence[int],
    max_seconds: float | None = None,
    timeout: float = 3600.0,
) -> dict[str, Any]:
    """Run ``compare`` on the peers ``names`` in ``environment``'s interpreter, a fresh process
    of the measurement harness (:func:`packlab.lab.measure.harness.run_job`); its result (rows
    marked with the environment; ``peak_rss_growth_bytes``: that process's peak RSS over its
    post-import baseline), or every peer skipped
    with the reason."""
    python = environment_python(environment)
    if python is None:
        return _skipped(names, f"no {ENVIRONMENTS[environment]} environment here (`make mds-env` "
                               f"builds it; or set {PYTHON_VARIABLE[environment]})")
    try:
        payload = run_job(measure_there, list(names), str(reference_dir), str(floor_shard),
                          str(out_dir), [int(i) for i in indices], ENVIRONMENTS[environment],
                          max_seconds, isolation="subprocess", python=python, timeout=timeout)
    except PacklabError as exc:
        return _skipped(names, f"{python}: {exc}")
    result = payload["result"]
    result["peak_rss_growth_bytes"] = payload["phases"]["job"]["peak_rss_growth_bytes"]
    return result


def _skipped(names: Sequence[str], reason: str) -> dict[str, Any]:
    return {"rows": [], "skipped": [{"name": n, "system": n, "reason": reason} for n in names]}


def measure_there(names: list[str], reference_dir: str, floor_shard: str, out_dir: str,
                  indices: list[int], environment: str, max_seconds: float | None = None
                  ) -> dict[str, Any]:
    """The job the other environment runs: :func:`packlab.lab.measure.peers.run.compare` on its
    peers, the reference read back from raw CSR."""
    import numpy as np

    from packlab.lab.measure.peers.raw_csr import load_reference
    from packlab.lab.measure.peers.registry import get_peer
    from packlab.lab.measure.peers.run import compare

    result = compare(load_reference(reference_dir), out_dir, [get_peer(n) for n in names],
                     floor_shard=floor_shard, indices=np.asarray(indices),
                     environment=environment, max_seconds=max_seconds, log=lambda line: None)
    result["versions"] = {"python": sys.version.split()[0], "numpy": np.__version__}
    return result
