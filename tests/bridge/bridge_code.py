"""Megatron-Bridge's own code on its declared stack, behind one stand-in (test support).

``.venv-bridge`` (``make bridge-env``) holds megatron-bridge 0.6.2 on Python 3.12 with the
requirements it declares, less those ``[tool.packlab.bridge_left_out]`` names. There Bridge's
package imports as it is, but for one module: ``megatron.bridge.peft.lora_layers`` imports
Transformer Engine unconditionally (``import transformer_engine.pytorch as te``), and
``megatron.bridge`` reaches it on import (``models`` -> ``models.conversion`` -> ``peft``).
Transformer Engine is Bridge's ``te`` extra, not one of its requirements, and a CPU machine
cannot have it: its PyTorch part (``transformer_engine_torch``) is only a source distribution,
whose build compiles CUDA kernels against torch. :func:`import_bridge` puts a stand-in for that
one module into ``sys.modules`` first: the four names other modules import from it
(``LinearAdapter``, ``LoRALinear``, ``LoRATopKRouter``, ``TEFusedLoRALinear``: LoRA adapter
layers, which no data path touches) as empty classes. Every other module is Bridge's own file,
``megatron.bridge``'s ``__init__`` included (``tests/bridge/test_stack.py`` checks both).

One call is redirected, not stubbed: Bridge's loader builder puts its three ``do_*`` flags on
``"cuda"`` to broadcast them; this machine has no GPU, so :func:`cuda_flags_on_cpu` creates
tensors asked for on ``"cuda"`` on the CPU, where the gloo group broadcasts them.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STAND_IN = "megatron.bridge.peft.lora_layers"
STAND_IN_NAMES = ("LinearAdapter", "LoRALinear", "LoRATopKRouter", "TEFusedLoRALinear")
MODULES = {
    "gpt_sft": "megatron.bridge.data.packing.gpt_sft",
    "parquet": "megatron.bridge.data.packing.parquet",
    "offline": "megatron.bridge.data.packing.offline",
    "algorithms": "megatron.bridge.data.packing.algorithms",
    "config": "megatron.bridge.data.packing.config",
    "builders": "megatron.bridge.data.builders.gpt_sft",
    "safe_pickle": "megatron.bridge.utils.safe_pickle",
    "base": "megatron.bridge.data.base",
    "samplers": "megatron.bridge.data.samplers",
    "loaders": "megatron.bridge.data.loaders",
    "utils": "megatron.bridge.data.utils",
    "training": "megatron.bridge.training.config",
    "state": "megatron.bridge.training.state",
    "models": "megatron.bridge.models",
}


def _stand_in() -> types.ModuleType:
    module = types.ModuleType(STAND_IN)
    module.__doc__ = "A stand-in: the real module imports Transformer Engine (see bridge_code)."
    for name in STAND_IN_NAMES:
        setattr(module, name, type(name, (), {}))
    return module


def import_bridge(names: tuple[str, ...] = tuple(MODULES)) -> types.SimpleNamespace:
    """Bridge's modules the tests run (``names`` of :data:`MODULES`), imported for real behind
    the one stand-in of the module docstring."""
    sys.modules.setdefault(STAND_IN, _stand_in())
    return types.SimpleNamespace(**{k: importlib.import_module(MODULES[k]) for k in names})


def recipe_config(bridge: types.SimpleNamespace, *, train: Any, dataset: Any,
                  validation: Any = None) -> Any:
    """Bridge's own ``ConfigContainer`` as a recipe fills it, for the parts its loader builder
    reads (``train``, ``validation``, ``dataset``; ``model`` is only asked whether it is a
    MIMO model): a one-layer GPT provider that is never built, the other configs at their
    defaults."""
    c = bridge.training
    return c.ConfigContainer(
        train=train, validation=validation if validation is not None else c.ValidationConfig(),
        dataset=dataset, model=bridge.models.GPTModelProvider(
            num_layers=1, hidden_size=16, num_attention_heads=2),
        optimizer=c.OptimizerConfig(), scheduler=c.SchedulerConfig(), logger=c.LoggerConfig(),
        tokenizer=c.TokenizerConfig(), checkpoint=c.CheckpointConfig())


@contextmanager
def cuda_flags_on_cpu() -> Iterator[None]:
    """While open, ``torch.tensor(..., device="cuda")`` makes a CPU tensor (see the module
    docstring: Bridge's builder broadcasts three flags from the GPU; this machine has none)."""
    import torch

    real = torch.tensor

    def tensor(*args: Any, device: Any = None, **kwargs: Any) -> Any:
        return real(*args, device="cpu" if device == "cuda" else device, **kwargs)

    torch.tensor = tensor
    try:
        yield
    finally:
        torch.tensor = real


def same_item(theirs: dict[str, Any], ours: dict[str, Any]) -> bool:
    """Two packed items equal key for key and value for value (lists or arrays alike)."""
    import numpy as np

    return set(theirs) == set(ours) and all(
        np.asarray(theirs[k]).tolist() == np.asarray(ours[k]).tolist() for k in theirs)


def assert_same_batch(theirs: dict[str, Any], ours: dict[str, Any]) -> None:
    """Key for key (in order), dtype for dtype, shape and value for value."""
    import torch

    assert list(theirs) == list(ours)
    for key, value in theirs.items():
        mine = ours[key]
        if isinstance(value, torch.Tensor):
            assert isinstance(mine, torch.Tensor), key
            assert (value.dtype, tuple(value.shape)) == (mine.dtype, tuple(mine.shape)), key
            assert torch.equal(value, mine), key
        else:
            assert type(value) is type(mine) and value == mine, key
