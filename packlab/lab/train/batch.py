"""What the model reads from a batch: one normalised view of either THD batch style.

Two collate styles build a packed batch, and a trainer must read both the same way:

- packlab's own (:func:`packlab.loading.collate.collate`): ``cu_seqlens`` int32, each row ``-1``
  terminated (and, with ``cu_seqlens_size``, padded by repeating its last value first); with
  ``pad_seq_to_mult`` the physical offsets are ``cu_seqlens`` and the logical ones
  ``cu_seqlens_unpadded``;
- Megatron-Bridge's (``GPTSFTPackedDataset.collate_fn``): ``cu_seqlens_q`` / ``cu_seqlens_kv``
  int32, rows padded to one width by repeating the last value, ``max_seqlen_q`` ``[B, 1]``,
  ``attention_mask`` None; with ``pad_seq_to_mult`` the physical offsets are
  ``cu_seqlens_q_padded`` and ``cu_seqlens_q`` the logical ones.

:func:`thd_view` reads the physical offsets of either and turns them into a segment id per
position (a zero-length segment, repeated offset, gets no position; the row's padding tail is a
segment of its own, as the attention kernels see it). :func:`attention_mask` builds the
block-diagonal causal mask from the segment ids: position ``i`` attends to ``j`` only when
``j <= i`` and both lie in the same segment.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from packlab.errors import PacklabError
from packlab.loading.collate import Collator

#: the batch keys holding physical cumulative offsets, in the order they are looked for
OFFSET_KEYS = ("cu_seqlens_q_padded", "cu_seqlens_q", "cu_seqlens")


class ThdView(NamedTuple):
    """The tensors the model consumes, ``[batch, length]`` each, int64."""

    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    segment_ids: torch.Tensor


def _tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))


def offsets_key(batch: Mapping[str, Any]) -> str:
    """Which key of ``batch`` holds the physical offsets (Megatron-Bridge's or packlab's)."""
    for key in OFFSET_KEYS:
        if batch.get(key) is not None:
            return key
    raise PacklabError(f"a THD batch needs one of {', '.join(OFFSET_KEYS)}; this one has "
                       f"{', '.join(sorted(batch))}")


def segment_ids(cu_seqlens: torch.Tensor, width: int) -> torch.Tensor:
    """``[batch, width]`` segment numbers from cumulative offsets (``-1`` entries ignored)."""
    cu = _tensor(cu_seqlens).to(torch.int64)
    if cu.ndim == 1:
        cu = cu[None]
    cu = torch.where(cu < 0, torch.full_like(cu, width), cu)
    if (cu[:, 0] != 0).any() or (cu.diff(dim=1) < 0).any() or (cu > width).any():
        raise PacklabError(f"cu_seqlens must rise from 0 to at most the row width {width}, got "
                           f"{cu[:, :6].tolist()}")
    positions = torch.arange(width, dtype=torch.int64).expand(cu.shape[0], width).contiguous()
    return torch.searchsorted(cu.contiguous(), positions, right=True) - 1


def thd_view(batch: Mapping[str, Any]) -> ThdView:
    """The normalised view of a packlab or Megatron-Bridge THD batch (numpy or torch)."""
    tokens = _tensor(batch["tokens"]).to(torch.int64)
    width = int(tokens.shape[1])
    return ThdView(
        tokens=tokens,
        labels=_tensor(batch["labels"]).to(torch.int64),
        loss_mask=_tensor(batch["loss_mask"]).to(torch.int64),
        position_ids=_tensor(batch["position_ids"]).to(torch.int64),
        segment_ids=segment_ids(batch[offsets_key(batch)], width),
    )


def attention_mask(segments: torch.Tensor, *, block_diagonal: bool = True) -> torch.Tensor:
    """``[batch, length, length]`` bool, True where query ``i`` may attend to key ``j``:
    causal within each segment (``block_diagonal``), or causal over the whole row."""
    length = segments.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    if not block_diagonal:
        return causal.expand(segments.shape[0], length, length)
    return causal & (segments[:, :, None] == segments[:, None, :])


def make_collator(style: str = "thd", **options: Any) -> Collator:
    """The ``collate_fn`` of a training run: packlab's THD batch, or Megatron-Bridge's
    (``style="megatron_bridge"``), as torch tensors. The model reads both through
    :func:`thd_view`."""
    return Collator(style=style, return_tensors="pt", **options)


def batch_digest(batch: Mapping[str, Any]) -> str:
    """A sha256 over every array of a batch (key, dtype, shape and bytes): equal digests,
    equal batches."""
    digest = hashlib.sha256()
    for key in sorted(batch):
        value = batch[key]
        if value is None:
            continue
        array = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        digest.update(f"{key}|{array.dtype}|{array.shape}|".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()
