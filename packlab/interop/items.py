"""What every batch style reads of a packed item, and how its numpy batch becomes torch's.

An item is what a packlab dataset returns (``{"input_ids", "loss_mask", "seq_boundaries"}``);
each batch style (packlab's THD, Megatron-Bridge's, Hugging Face's flattened batch) starts by
checking its boundaries the same way, so a bad item fails with the same one-line error
whatever style reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from packlab.errors import PacklabError


def item_bounds(item: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The item's ``input_ids`` (as stored) and its boundaries (int64, checked: from 0 to the
    packed length, strictly increasing)."""
    ids = np.asarray(item["input_ids"])
    bounds = np.asarray(item["seq_boundaries"], dtype=np.int64)
    if bounds.ndim != 1 or bounds.shape[0] < 2 or bounds[0] != 0 or bounds[-1] != ids.shape[0]:
        raise PacklabError(
            f"collate: seq_boundaries must run from 0 to packed_len {ids.shape[0]}, got "
            f"{bounds[:3].tolist()}...{bounds[-1:].tolist()}"
        )
    if (np.diff(bounds) <= 0).any():
        raise PacklabError("collate: seq_boundaries must be strictly increasing")
    return ids, bounds


def as_tensors(batch: Mapping[str, Any]) -> dict[str, Any]:
    """Every numpy array of ``batch`` as a tensor (one tensor where the batch shares one array,
    as Megatron-Bridge's ``_q`` and ``_kv`` do); other values as they are. torch is imported
    here, only when tensors are asked for."""
    try:
        import torch
    except ImportError:
        raise PacklabError("collate: return_tensors='pt' needs torch, which is not installed"
                           ) from None
    tensors: dict[int, Any] = {}
    return {key: tensors.setdefault(id(value), torch.from_numpy(np.ascontiguousarray(value)))
            if isinstance(value, np.ndarray) else value for key, value in batch.items()}
