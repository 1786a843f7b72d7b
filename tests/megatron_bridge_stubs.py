"""Import Megatron-Bridge's own data modules on this machine (test support, not packlab).

megatron-bridge 0.6.2 declares Python >= 3.12 and pulls the whole training stack from its
package ``__init__`` files; it is installed here with ``pip install --no-deps
--ignore-requires-python`` (see the Makefile). Its packed-data modules run unmodified, but
five modules they pass through on import cannot load, so :func:`import_bridge` puts stand-ins
for exactly these into ``sys.modules`` first, and nothing else:

1. ``megatron.bridge`` (package ``__init__``): imports the model-conversion tree (AutoBridge,
   ``transformers`` models), which needs ``megatron.core._rank_utils.safe_get_world_size``,
   absent from the installed megatron-core. Stand-in: a bare package whose ``__path__`` is the
   installed directory, so every submodule below is Bridge's own file; only ``__init__`` is
   skipped.
2. ``megatron.bridge.data`` (package ``__init__``): imports every dataset builder (Energon,
   VLM, HF). Same bare package.
3. ``megatron.bridge.data.builders`` (package ``__init__``): imports the Energon and VLM
   builders beside ``gpt_sft``. Same bare package (``builders/gpt_sft.py`` itself is real).
4. ``megatron.bridge.utils.common_utils``: imports ``megatron.training`` (not a package of
   megatron-core) and the rank utilities missing above. The data modules use four names of it
   at import: ``get_local_rank_preinit``, ``get_rank_safe``, ``print_rank_0`` and
   ``resolve_path``; the stand-in gives them their documented single-process meaning (rank
   0, local rank from ``LOCAL_RANK``, print, an absolute resolved path).
5. ``megatron.bridge.training.tokenizers.tokenizer``: imports
   ``megatron.core.tokenizers.utils``, absent from the installed megatron-core. The data
   modules use ``MegatronTokenizer`` only as a type annotation: the stand-in is an empty
   class. (The datasets are given a tokenizer object with ``eos_id`` and ``eod``, all they
   read of one.)

Everything the tests call (``GPTSFTPackedDataset``, ``GPTSFTPackedParquetDataset``, their
``collate_fn``, ``build_gpt_sft_split``, ``PackedSequenceSpecs``, the offline packer
``prepare_gpt_sft_packed_data`` and its algorithms, ``write_packed_parquet``,
``safe_load_npy``) is Bridge's unmodified code from the installed wheel.

:func:`import_bridge_loaders` adds Bridge's loader builder (``data/loaders.py``:
``build_train_valid_test_data_loaders``), its samplers (``data/samplers.py``), the provider
contract (``data/base.py``), ``get_dataset_provider`` (``data/utils.py``) and the GPT SFT
builder (``data/builders/gpt_sft.py``: ``GPTSFTDatasetConfig`` and its datasets provider), all
real (the bare ``megatron.bridge.data.builders`` package of 3. is given the two names of
``gpt_sft`` its ``__init__`` exports and the loader modules import). The modules they import on
the way that cannot load here get stand-ins, each only what the real code reads of it:

6. ``megatron.bridge.training.config``: needs ``megatron.training`` (Megatron-LM's training
   package, not in the megatron-core wheel). The loader modules use ``ConfigContainer`` as a
   type annotation and ``GPTDatasetConfig``, ``GPTFIMDatasetConfig``, ``MockGPTDatasetConfig``
   in ``isinstance`` checks (pretraining configs, which a packed SFT dataset is not): empty
   classes. The container the builder reads is :class:`RecipeConfig` below.
7. ``megatron.bridge.training.state``: needs ``get_async_strategy``, absent from this
   megatron-core. ``TrainState`` is what the builder reads and writes of it: the consumed
   sample counts and the three ``do_*`` flags (:class:`TrainState` below, Bridge's fields and
   defaults, without its checkpoint methods).
8. ``megatron.bridge.data.megatron_mimo.base_provider`` and
   ``megatron.bridge.models.megatron_mimo.megatron_mimo_provider`` (need megatron-core and
   ``transformers`` modules absent here): the builder imports ``MegatronMIMODatasetProvider``
   and ``MegatronMIMOProvider`` to ask whether the model is a MIMO model: empty classes (it is
   not).
9. ``megatron.bridge.data.builders.direct_hf_sft``, ``.energon``, ``.mock_vlm_sft`` and
   ``megatron.bridge.data.datasets.fim_dataset`` (need ``transformers`` modules, Energon,
   ``megatron.training``): ``get_dataset_provider``'s registry maps their config classes to
   their builders; stand-ins are empty config classes (a packlab provider is none of them) and
   builders that refuse to run.
10. ``megatron.bridge.utils.common_utils`` (already a stand-in, 4. above) also gives
    ``get_world_size_safe`` (the world size of the initialized process group, else
    ``WORLD_SIZE``, else 1), which ``training/utils/sig_utils.py`` (real) imports.

One call is redirected, not stubbed: the builder puts its three ``do_*`` flags on ``"cuda"``
to broadcast them; this machine has no GPU, so :func:`cuda_flags_on_cpu` creates tensors asked
for on ``"cuda"`` on the CPU, where the gloo group broadcasts them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packlab.lab.interop_inputs import BridgeTokenizer, TokenizedSpool

BARE_PACKAGES = ("megatron.bridge", "megatron.bridge.data", "megatron.bridge.data.builders")
STUBBED = (*BARE_PACKAGES, "megatron.bridge.utils.common_utils",
           "megatron.bridge.training.tokenizers.tokenizer")


def _bridge_root() -> Path:
    spec = importlib.util.find_spec("megatron.core")
    if spec is None or spec.origin is None:
        raise ImportError("megatron-core is not installed (make install)")
    root = Path(spec.origin).parent.parent / "bridge"
    if not (root / "data" / "packing" / "gpt_sft.py").is_file():
        raise ImportError(f"megatron-bridge is not installed under {root} (make install)")
    return root


def _common_utils() -> types.ModuleType:
    from megatron.core._rank_utils import safe_get_rank

    module = types.ModuleType("megatron.bridge.utils.common_utils")

    def get_local_rank_preinit() -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    def print_rank_0(message: str) -> None:
        if safe_get_rank() == 0:
            print(message, flush=True)

    def resolve_path(path: str) -> Path:
        return Path(path).expanduser().absolute().resolve()

    def get_world_size_safe() -> int:
        import torch.distributed

        if torch.distributed.is_initialized():
            return torch.distributed.get_world_size()
        return int(os.environ.get("WORLD_SIZE", "1"))

    module.get_local_rank_preinit = get_local_rank_preinit
    module.get_rank_safe = safe_get_rank
    module.get_world_size_safe = get_world_size_safe
    module.print_rank_0 = print_rank_0
    module.resolve_path = resolve_path
    return module


def _tokenizer_module() -> types.ModuleType:
    module = types.ModuleType("megatron.bridge.training.tokenizers.tokenizer")
    module.MegatronTokenizer = type("MegatronTokenizer", (), {})
    return module


def import_bridge() -> types.SimpleNamespace:
    """Bridge's packed-data modules, imported for real behind the five stand-ins above."""
    root = _bridge_root()
    for name in BARE_PACKAGES:
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*name.split(".")[2:]))]
            sys.modules[name] = package
    sys.modules.setdefault("megatron.bridge.utils.common_utils", _common_utils())
    sys.modules.setdefault("megatron.bridge.training.tokenizers.tokenizer", _tokenizer_module())
    names = {
        "gpt_sft": "megatron.bridge.data.packing.gpt_sft",
        "parquet": "megatron.bridge.data.packing.parquet",
        "offline": "megatron.bridge.data.packing.offline",
        "algorithms": "megatron.bridge.data.packing.algorithms",
        "config": "megatron.bridge.data.packing.config",
        "builders": "megatron.bridge.data.builders.gpt_sft",
        "safe_pickle": "megatron.bridge.utils.safe_pickle",
    }
    return types.SimpleNamespace(**{k: importlib.import_module(v) for k, v in names.items()})


def _module(name: str, **names: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in names.items():
        setattr(module, key, value)
    return module


def _refusing_builder(name: str) -> Any:
    def provider(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name}: a stand-in (its module cannot load here); not a packlab "
                           "provider's path")
    return provider


def _empty(name: str) -> type:
    return type(name, (), {})


@dataclass
class TrainState:
    """What Bridge's loader builder reads and writes of its ``TrainState``: Bridge's fields and
    defaults (``megatron/bridge/training/state.py``), without its checkpoint methods."""

    step: int = 0
    consumed_train_samples: int = 0
    skipped_train_samples: int = 0
    consumed_valid_samples: int = 0
    floating_point_operations_so_far: int = 0
    do_train: bool = False
    do_valid: bool = False
    do_test: bool = False


def _loader_stand_ins() -> dict[str, types.ModuleType]:
    builders = {"direct_hf_sft": "DirectHFSFT", "energon": "Energon", "mock_vlm_sft": "MockVLMSFT"}
    stand_ins = {
        f"megatron.bridge.data.builders.{module}": _module(
            f"megatron.bridge.data.builders.{module}", **{
                f"{prefix}DatasetConfig": _empty(f"{prefix}DatasetConfig"),
                f"{module}_train_valid_test_datasets_provider": _refusing_builder(module)})
        for module, prefix in builders.items()}
    stand_ins.update({
        "megatron.bridge.data.datasets.fim_dataset": _module(
            "megatron.bridge.data.datasets.fim_dataset", GPTFIMDataset=_empty("GPTFIMDataset")),
        "megatron.bridge.training.config": _module(
            "megatron.bridge.training.config", ConfigContainer=_empty("ConfigContainer"),
            GPTDatasetConfig=_empty("GPTDatasetConfig"),
            GPTFIMDatasetConfig=_empty("GPTFIMDatasetConfig"),
            MockGPTDatasetConfig=_empty("MockGPTDatasetConfig")),
        "megatron.bridge.training.state": _module("megatron.bridge.training.state",
                                                  TrainState=TrainState),
        "megatron.bridge.data.megatron_mimo.base_provider": _module(
            "megatron.bridge.data.megatron_mimo.base_provider",
            MegatronMIMODatasetProvider=_empty("MegatronMIMODatasetProvider")),
        "megatron.bridge.models.megatron_mimo.megatron_mimo_provider": _module(
            "megatron.bridge.models.megatron_mimo.megatron_mimo_provider",
            MegatronMIMOProvider=_empty("MegatronMIMOProvider")),
    })
    return stand_ins


LOADER_STUBBED = tuple(_loader_stand_ins())


def import_bridge_loaders() -> types.SimpleNamespace:
    """Bridge's loader builder, samplers, provider contract, ``get_dataset_provider`` and GPT
    SFT builder, imported for real behind the stand-ins listed in the module docstring (on top
    of :func:`import_bridge`'s)."""
    bridge = import_bridge()
    for name, module in _loader_stand_ins().items():
        sys.modules.setdefault(name, module)
    builders = sys.modules["megatron.bridge.data.builders"]
    for name in ("GPTSFTDatasetConfig", "gpt_sft_train_valid_test_datasets_provider"):
        setattr(builders, name, getattr(bridge.builders, name))  # what its __init__ exports
    names = {
        "base": "megatron.bridge.data.base",
        "samplers": "megatron.bridge.data.samplers",
        "loaders": "megatron.bridge.data.loaders",
        "utils": "megatron.bridge.data.utils",
    }
    for key, module in names.items():
        setattr(bridge, key, importlib.import_module(module))
    return bridge


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


@dataclass
class TrainingSettings:
    """The fields of Megatron-LM's ``TrainingConfig`` (``megatron.training.config``, not in the
    megatron-core wheel) that Bridge's loader builder reads, with Megatron-LM's defaults."""

    micro_batch_size: int
    global_batch_size: int
    train_iters: int
    train_samples: int | None = None
    num_epochs: int | None = None
    exit_signal: int = signal.SIGTERM
    exit_signal_handler_for_dataloader: bool = False


@dataclass
class ValidationSettings:
    """The fields of Megatron-LM's ``ValidationConfig`` the loader builder reads."""

    eval_interval: int | None = None
    eval_iters: int = 0
    eval_global_batch_size: int | None = None
    eval_micro_batch_size: int | None = None
    skip_train: bool = False


@dataclass
class RecipeConfig:
    """The smallest container Bridge's ``build_train_valid_test_data_loaders`` reads in place
    of its ``ConfigContainer``: ``train``, ``validation``, ``dataset`` (the real provider or
    ``GPTSFTDatasetConfig``) and ``model`` (only asked whether it is a MIMO model)."""

    train: TrainingSettings
    validation: ValidationSettings
    dataset: Any
    model: Any = None


# what Bridge's packed datasets and packer read of a tokenizer, and a spool as the tokenized
# split its offline packer asks for: the lab's (the README's interop section uses them too)
Tokenizer = BridgeTokenizer
SpoolAsTokenizedDataset = TokenizedSpool


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
