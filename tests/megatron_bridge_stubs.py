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
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any

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

    module.get_local_rank_preinit = get_local_rank_preinit
    module.get_rank_safe = safe_get_rank
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


class Tokenizer:
    """What Bridge's packed datasets and packer read of a tokenizer: the EOS id."""

    def __init__(self, eos_id: int) -> None:
        self.eos_id = eos_id
        self.eod = eos_id


class SpoolAsTokenizedDataset:
    """A packlab spool as the tokenized split Bridge's offline packer asks its
    ``dataset_builder`` for: items ``{"input_ids", "loss_mask"}`` (lists, the mask unshifted,
    as Bridge's SFT datasets give it), a ``tokenizer`` with ``eod`` and
    ``pad_seq_length_to_mult``."""

    def __init__(self, spool: Any, eos_id: int, pad_seq_length_to_mult: int) -> None:
        self.spool = spool
        self.tokenizer = Tokenizer(eos_id)
        self.pad_seq_length_to_mult = pad_seq_length_to_mult

    def __len__(self) -> int:
        return self.spool.num_sequences

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        tokens, mask = self.spool.read_sequence(i)
        return {"input_ids": tokens.tolist(), "loss_mask": mask.tolist()}
