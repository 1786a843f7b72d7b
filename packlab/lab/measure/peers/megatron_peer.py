"""Megatron-core's ``IndexedDataset`` (``MMIDIDX``): tokens only, written by its own builder.

``IndexedDatasetBuilder`` writes ``bins.bin`` + ``bins.idx`` (one document of one sequence per
packed bin, tokens in the narrowest type Megatron picks for the vocabulary:
``DType.optimal_dtype``); ``IndexedDataset(prefix)[i]`` returns a view of the memory map. It
stores no loss mask and no sequence starts. The dataset object must stay alive while its
arrays are used (it segfaults otherwise): :class:`Opened` keeps it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from packlab.lab.measure.peers.base import TOKENS_ONLY, Opened, Peer, Reference

PREFIX = "bins"
MODULE = "megatron.core.datasets.indexed_dataset"


def _indexed() -> Any:
    with warnings.catch_warnings():  # Apex / Transformer Engine missing: harmless here
        warnings.simplefilter("ignore")
        import megatron.core.datasets.indexed_dataset as indexed
    return indexed


class Megatron(Peer):
    NAME = "megatron_indexed"
    LABEL = "Megatron-core IndexedDataset"
    COLUMNS = TOKENS_ONLY
    REQUIRES = ("megatron.core",)

    def load(self) -> None:
        import torch  # noqa: F401 - its builder takes tensors

        _indexed()

    def write(self, reference: Reference, directory: Path) -> None:
        import torch

        indexed = _indexed()
        directory.mkdir(parents=True, exist_ok=True)
        prefix = directory / PREFIX
        dtype = indexed.DType.optimal_dtype(reference.vocab_size)
        builder = indexed.IndexedDatasetBuilder(str(prefix) + ".bin", dtype=dtype)
        for i in range(len(reference)):
            builder.add_item(torch.from_numpy(reference.bin(i)[0]))
            builder.end_document()
        builder.finalize(str(prefix) + ".idx")

    def open(self, directory: Path) -> Opened:
        dataset = _indexed().IndexedDataset(str(directory / PREFIX))
        get = dataset.__getitem__
        return Opened(lambda i: (get(i),), keep=dataset)
