"""Megatron-Bridge's declared stack, read from its installed metadata (test support).

``make bridge-env`` installs ``[tool.packlab] bridge_no_deps`` (Bridge and the megatron-core it
is paired with) without their dependencies, then runs this file: it prints, one a line, every
requirement Bridge declares and those of the megatron-core extras Bridge asks for
(``megatron-core[dev,mlm]``), markers evaluated for this interpreter, less the ones named in
``[tool.packlab.bridge_left_out]``; the Makefile installs them in one resolution with packlab's
own. ``tests/bridge/test_stack.py`` checks the environment against the same reading: every
declared requirement satisfied but the named ones, and each named one really not.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib.metadata import distribution
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
BRIDGE = "megatron-bridge"


def settings() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["packlab"]


@dataclass(frozen=True)
class Declared:
    """One requirement as a distribution declares it (``by``: ``megatron-bridge`` or
    ``megatron-core[dev]``...)."""

    by: str
    requirement: Requirement

    @property
    def text(self) -> str:
        """The requirement without its marker, as ``bridge_left_out`` names it."""
        plain = Requirement(str(self.requirement))
        plain.marker = None
        return str(plain)


def _applying(name: str, extras: set[str]) -> list[Declared]:
    """``name``'s requirements that apply here: unconditional ones (or whose marker holds on
    this interpreter), and those of the ``extras`` asked for."""
    out = []
    for line in distribution(name).requires or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is None or marker.evaluate({"extra": ""}):
            out.append(Declared(name, requirement))
            continue
        extra = next((e for e in sorted(extras) if marker.evaluate({"extra": e})), None)
        if extra is not None:
            out.append(Declared(f"{name}[{extra}]", requirement))
    return out


def declared() -> list[Declared]:
    """Bridge's requirements (no extras of its own), then those its ``megatron-core[...]``
    requirement adds through the extras it names."""
    bridge = _applying(BRIDGE, set())
    core = next(d for d in bridge if d.requirement.name == "megatron-core")
    return bridge + [d for d in _applying("megatron-core", set(core.requirement.extras))
                     if d.by != "megatron-core"]  # its plain ones: torch, numpy, packaging


def left_out() -> dict[str, str]:
    """Requirement (without marker) -> why it is not installed."""
    return dict(settings()["bridge_left_out"])


def to_install() -> list[str]:
    """Every declared requirement but the left-out ones and the pinned pair itself."""
    pinned = {Requirement(r).name for r in settings()["bridge_no_deps"]}
    skip = left_out()
    return [d.text for d in declared()
            if d.text not in skip and d.requirement.name not in pinned]


if __name__ == "__main__":
    print("\n".join(to_install()))
