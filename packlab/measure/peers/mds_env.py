"""Peers that cannot share packlab's environment, measured in their own: a subprocess.

MosaicML streaming needs numpy < 2.2; ``make mds-env`` (run by ``make run`` / ``make test``)
builds ``.venv-mds`` beside ``.venv`` with packlab's dependencies and streaming's. The parent
writes the reference bins as raw CSR (:mod:`packlab.measure.peers.raw_csr`) and hands the
child a JSON spec: the reference directory, the packlab shard of the in-RAM Python floor and
the one index list. The child (``python -m packlab.measure.peers.mds_env SPEC OUT``, packlab
from this checkout on ``PYTHONPATH``) runs the same :func:`packlab.measure.peers.run.compare`
on its peers, with raw CSR and the floors beside them in its own loop, and writes the rows
as JSON. No environment: the peers are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packlab.errors import PacklabError
from packlab.results import _root

ENVIRONMENTS = {"mds": ".venv-mds"}
PYTHON_VARIABLE = {"mds": "PACKLAB_MDS_PYTHON"}
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])


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
    timeout: float = 3600.0,
) -> dict[str, Any]:
    """Run ``compare`` on the peers ``names`` in ``environment``'s interpreter; its result
    (rows marked with the environment), or every peer skipped with the reason."""
    python = environment_python(environment)
    if python is None:
        reason = (f"no {ENVIRONMENTS[environment]} environment here (`make mds-env` builds it; "
                  f"or set {PYTHON_VARIABLE[environment]})")
        return {"rows": [], "skipped": [{"name": n, "system": n, "reason": reason}
                                        for n in names]}
    spec = {"names": list(names), "reference_dir": str(reference_dir),
            "floor_shard": str(floor_shard), "out_dir": str(out_dir),
            "indices": [int(i) for i in indices], "environment": ENVIRONMENTS[environment]}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="packlab-peers-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        try:
            proc = subprocess.run([str(python), "-m", "packlab.measure.peers.mds_env",
                                   str(spec_path), str(out_path)], stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, env=env, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise PacklabError(f"{python}: no result within {timeout:.0f} s") from None
        if proc.returncode != 0 or not out_path.is_file():
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:]) or "no message"
            reason = f"{python} failed (exit {proc.returncode}): {tail}"
            return {"rows": [], "skipped": [{"name": n, "system": n, "reason": reason}
                                            for n in names]}
        result = json.loads(out_path.read_text())
    result["log"] = proc.stdout
    return result


def main(argv: list[str] | None = None) -> int:
    """The child: ``python -m packlab.measure.peers.mds_env SPEC OUT``."""
    import numpy as np

    from packlab.measure.peers.raw_csr import load_reference
    from packlab.measure.peers.registry import get_peer
    from packlab.measure.peers.run import compare

    spec_path, out_path = (argv if argv is not None else sys.argv[1:])
    spec = json.loads(Path(spec_path).read_text())
    reference = load_reference(spec["reference_dir"])
    result = compare(reference, spec["out_dir"], [get_peer(n) for n in spec["names"]],
                     floor_shard=spec["floor_shard"], indices=np.asarray(spec["indices"]),
                     environment=spec["environment"])
    result["versions"] = {"python": sys.version.split()[0], "numpy": np.__version__}
    Path(out_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
