"""The environment the Bridge tests run in is Megatron-Bridge 0.6.2's declared stack: its
Python, every requirement it declares (and those of the megatron-core extras it asks for)
installed at a version it allows, but the ones ``[tool.packlab.bridge_left_out]`` names, each
of which really is missing or off its pin; and Bridge's own modules imported, every one its
installed file but the one stand-in ``bridge_code`` names."""

from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path

from bridge_code import STAND_IN, import_bridge
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from stack import declared, left_out, settings


def installed(requirement: Requirement) -> bool:
    try:
        found = version(requirement.name)
    except PackageNotFoundError:
        return False
    return SpecifierSet(str(requirement.specifier)).contains(found, prereleases=True)


def where(module: object) -> str:
    """A module's file, or a namespace package's directory; ``/`` for a stand-in."""
    path = list(getattr(module, "__path__", []))
    return getattr(module, "__file__", None) or (path[0] if path else "/")


def test_the_python_is_the_one_bridge_declares() -> None:
    bridge_python = SpecifierSet(distribution("megatron-bridge").metadata["Requires-Python"])
    here = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    assert here in bridge_python, (here, bridge_python)
    assert here.startswith(settings()["bridge_python"] + ".")


def test_every_declared_requirement_is_met_but_the_named_ones() -> None:
    for pinned in settings()["bridge_no_deps"]:
        assert installed(Requirement(pinned)), pinned
    requirements = declared()
    assert len(requirements) > 40  # Bridge's own and megatron-core[dev,mlm]'s
    unmet = sorted({d.text for d in requirements if not installed(d.requirement)})
    assert unmet == sorted(left_out()), unmet
    assert all(reason.strip() for reason in left_out().values())
    assert installed(Requirement("transformers<=5.12.1"))


def test_bridge_imports_as_it_is_but_its_one_stand_in() -> None:
    assert importlib.util.find_spec("transformer_engine") is None
    root = Path(distribution("megatron-bridge").locate_file("megatron/bridge"))
    real = root.joinpath(*STAND_IN.split(".")[2:]).with_suffix(".py")
    assert "import transformer_engine.pytorch as te" in real.read_text()
    import_bridge()
    bridge = {name: module for name, module in sys.modules.items()
              if name == "megatron.bridge" or name.startswith("megatron.bridge.")}
    assert len(bridge) > 200  # the package's __init__ imports its model and training trees
    foreign = [name for name, module in bridge.items()
               if not Path(where(module)).is_relative_to(root)]
    assert foreign == [STAND_IN]
