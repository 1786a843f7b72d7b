"""A packlab dataset as Megatron-Bridge's packed SFT dataset: what Bridge's loaders ask of one.

Bridge 0.6.2's data loaders (``megatron/bridge/data/samplers.py``, ``loaders.py``) take any
map-style dataset with ``len``, ``[i]`` and a ``collate_fn`` attribute; its own packed SFT
datasets (``GPTSFTPackedDataset`` over a ``.npy``, ``GPTSFTPackedParquetDataset`` over Parquet,
``megatron/bridge/data/packing/``) add two behaviours the loaders rely on, which
:class:`BridgeSFTDataset` gives any packlab dataset, value for value:

- **a negative index is a padding sample.** ``dataloader_type="batch"`` with ``drop_last=False``
  fills the last global batch with ``-1``: Bridge serves the sample a Python negative index
  names (the last one, through the samples mapping when there is one) with an all-zero loss
  mask, so it trains nothing. (With ``answer_only_loss=False`` Bridge's collate ignores the
  stored mask and trains every non-EOS token, padding samples included; packlab's batch does
  the same, being Bridge's.)
- **``max_num_samples`` maps more (or fewer) samples than bins**, epoch by epoch: every bin
  once per epoch, each epoch in its own permutation, as many epochs as needed, cut at
  ``max_num_samples`` (:func:`bridge_samples_mapping`). Bridge seeds NumPy's global generator
  with the dataset's ``seed`` and shuffles; packlab draws the same permutations from its own
  ``RandomState(seed)``, leaving the global generator alone.

``collate_fn`` is Bridge 0.6.2's packed batch (:mod:`packlab.interop.bridge_batch`, a
:class:`~packlab.loading.collate.Collator` of style ``"megatron_bridge"``). An item is the packlab
dataset's own (``{"input_ids", "loss_mask", "seq_boundaries"}``, numpy arrays where Bridge
returns lists: its ``collate_fn`` and packlab's take either).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from packlab.errors import PacklabError


class ItemSource(Protocol):
    """What :class:`BridgeSFTDataset` wraps: a packlab dataset (or anything serving its items)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Mapping[str, Any]: ...


def bridge_samples_mapping(num_bins: int, max_num_samples: int, seed: int) -> np.ndarray:
    """Bridge's samples mapping for a packed dataset of ``num_bins`` bins: ``ceil(max_num_samples
    / num_bins)`` epochs, each ``arange(num_bins)`` shuffled in turn by one ``RandomState(seed)``,
    concatenated and cut to ``max_num_samples`` (int32 where the bins allow: half the memory,
    the same permutations)."""
    if num_bins < 1:
        raise PacklabError("samples mapping: the dataset holds no bins")
    if max_num_samples < 1:
        raise PacklabError(f"samples mapping: max_num_samples must be >= 1, got {max_num_samples}")
    rng = np.random.RandomState(seed)
    epochs = -(-max_num_samples // num_bins)
    dtype = np.int32 if num_bins < 2**31 else np.int64
    mapping = np.empty(epochs * num_bins, dtype=dtype)
    for epoch in range(epochs):
        order = mapping[epoch * num_bins:(epoch + 1) * num_bins]
        order[:] = np.arange(num_bins, dtype=dtype)
        rng.shuffle(order)
    return mapping[:max_num_samples]


def padding_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """``item`` trained on nothing: the same tokens and boundaries, an all-zero loss mask."""
    mask = np.asarray(item["loss_mask"])
    return {**item, "loss_mask": np.zeros(mask.shape, dtype=mask.dtype)}


class BridgeSFTDataset:
    """``dataset`` served as Bridge's packed SFT dataset (see the module docstring).

    ``collate_fn``: the batch builder Bridge's loaders pass to the DataLoader (a
    ``Collator(style="megatron_bridge", ...)``). ``max_num_samples``: the samples mapping's
    length (``None``: every bin once, in stored order, as Bridge without it). Picklable for
    DataLoader workers when ``dataset`` is (packlab's datasets are).
    """

    def __init__(self, dataset: ItemSource, *, collate_fn: Any,
                 max_num_samples: int | None = None, seed: int = 1234) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.num_bins = len(dataset)
        self.samples_mapping = None if max_num_samples is None else bridge_samples_mapping(
            self.num_bins, max_num_samples, seed)

    def __len__(self) -> int:
        if self.samples_mapping is not None:
            return int(self.samples_mapping.shape[0])
        return self.num_bins

    def source_index(self, index: Any) -> tuple[int, bool]:
        """The bin sample ``index`` reads, and whether it is a padding sample (negative)."""
        index = operator.index(index)
        padding = index < 0
        if not -len(self) <= index < len(self):
            raise IndexError(f"sample {index} out of range [0, {len(self)})")
        if self.samples_mapping is not None:
            index = int(self.samples_mapping[index])
        elif padding:
            index += self.num_bins
        return index, padding

    def __getitem__(self, index: Any) -> dict[str, Any]:
        source, padding = self.source_index(index)
        item = self.dataset[source]
        return padding_item(item) if padding else item

    def __getitems__(self, indices: Sequence[Any]) -> list[dict[str, Any]]:
        """A batch in one call (what ``torch.utils.data.DataLoader`` uses when it exists): the
        wrapped dataset's own batched read where it has one."""
        located = [self.source_index(i) for i in indices]
        sources = [s for s, _ in located]
        getitems = getattr(self.dataset, "__getitems__", None)
        items = getitems(sources) if getitems is not None else [self.dataset[s] for s in sources]
        return [padding_item(item) if padding else item
                for item, (_, padding) in zip(items, located, strict=True)]
