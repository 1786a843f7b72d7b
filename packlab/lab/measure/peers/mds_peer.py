"""MosaicML streaming (MDS): the bins written by ``MDSWriter``, read by ``StreamingDataset``.

Runs in its own environment (``ENVIRONMENT = "mds"``: streaming needs numpy < 2.2; see
:mod:`packlab.lab.measure.peers.mds_env`). Columns ``ndarray:int32`` / ``ndarray:uint8`` /
``ndarray:int32``, shards of at most 64 MB, uncompressed or zstd. ``StreamingDataset(local=
directory)`` reads a local copy; a compressed shard is decompressed next to it on first use
(``shard.*.mds`` beside ``shard.*.mds.zstd``), so the bytes on disk while reading are both.

``streaming``'s package imports its image-dataset module, which imports torchvision (never
used for MDS files); where torchvision is absent a stand-in module with the two names it
imports is put in ``sys.modules`` first (:func:`stand_in_torchvision`).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

from packlab.lab.measure.peers.base import COLUMNS, Opened, Peer, Reference

ENCODINGS = {"input_ids": "ndarray:int32", "loss_mask": "ndarray:uint8",
             "seq_start_id": "ndarray:int32"}
SIZE_LIMIT = 1 << 26


def stand_in_torchvision() -> None:
    """``torchvision.datasets.VisionDataset`` / ``CIFAR10`` and
    ``torchvision.transforms.functional.to_tensor``, unusable, for ``import streaming``."""
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        return

    class VisionDataset:  # noqa: D401 - a stand-in
        """Stand-in: streaming's image datasets are not available here."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("torchvision is a stand-in here: no image datasets")

    def to_tensor(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("torchvision is a stand-in here: no image transforms")

    names = ("torchvision", "torchvision.datasets", "torchvision.transforms",
             "torchvision.transforms.functional")
    modules = {name: types.ModuleType(name) for name in names}
    for name, module in modules.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    modules["torchvision.datasets"].VisionDataset = VisionDataset
    modules["torchvision.datasets"].CIFAR10 = VisionDataset
    modules["torchvision.transforms.functional"].to_tensor = to_tensor
    modules["torchvision"].datasets = modules["torchvision.datasets"]
    modules["torchvision"].transforms = modules["torchvision.transforms"]
    modules["torchvision.transforms"].functional = modules["torchvision.transforms.functional"]
    sys.modules.update(modules)


def _streaming() -> Any:
    stand_in_torchvision()
    import streaming

    return streaming


class _Mds(Peer):
    REQUIRES = ("streaming",)
    ENVIRONMENT = "mds"
    COMPRESSION: str | None = None

    def load(self) -> None:
        _streaming()

    def write(self, reference: Reference, directory: Path) -> None:
        streaming = _streaming()
        with streaming.MDSWriter(out=str(directory), columns=ENCODINGS,
                                 compression=self.COMPRESSION, size_limit=SIZE_LIMIT) as writer:
            for i in range(len(reference)):
                writer.write(dict(zip(COLUMNS, reference.bin(i), strict=True)))

    def open(self, directory: Path) -> Opened:
        streaming = _streaming()
        streaming.base.util.clean_stale_shared_memory()
        dataset = streaming.StreamingDataset(local=str(directory), batch_size=1)
        get = dataset.get_item
        return Opened(get, keep=dataset)  # a dict: its values are delivered


class Mds(_Mds):
    NAME = "mds"
    LABEL = "MosaicML streaming (MDS)"


class MdsZstd(_Mds):
    NAME = "mds_zstd"
    LABEL = "MosaicML streaming (MDS, zstd)"
    COMPRESSION = "zstd"
