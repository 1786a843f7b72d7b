"""Hugging Face's flattened batch, built by packlab: ``Collator(style="hf_flattening")``.

Equal, key for key (in order), dtype for dtype and value for value, to what transformers'
``DataCollatorWithFlattening`` returns (transformers 5.23+, ``data/data_collator.py``) when
each sub-sequence of each bin is one of its features, in order; TRL's
``DataCollatorForLanguageModeling(padding_free=True)`` returns the same keys and values in
another order (``tests/test_hf.py`` runs both on the same sequences). The whole batch of bins
is one row:

- ``input_ids``: every sub-sequence's tokens, concatenated (int64 ``[1, N]``);
- ``labels`` (int64 ``[1, N]``): token-aligned, as Hugging Face models shift them inside the
  loss: label ``j`` is token ``j`` where the stored mask trains its prediction, ``-100``
  elsewhere, and ``separator_id`` at the first token of every sub-sequence;
- ``position_ids`` (int64 ``[1, N]``, unless ``return_position_ids=False``): restart at
  ``position_ids_start`` for every sub-sequence; a model with ``attention_mask=None`` finds
  the boundaries there;
- ``seq_idx`` (int32 ``[1, N]``, with ``return_seq_idx``): the sub-sequence of each token,
  numbered across the batch;
- with ``return_flash_attn_kwargs``: ``cu_seq_lens_q`` and ``cu_seq_lens_k`` (int32 ``[S + 1]``,
  the cumulative sub-sequence lengths) and ``max_length_q`` / ``max_length_k`` (Python ints, the
  longest sub-sequence), what FlashAttention's varlen kernels read.

Why the labels move: packlab's ``loss_mask`` is target-aligned (``loss_mask[t]`` trains the
prediction of token ``t + 1`` from token ``t``, 0 at each sub-sequence's last token), while a
Hugging Face label is the token itself, so label ``j`` is kept where ``loss_mask[j - 1]`` is
set. Nothing here imports transformers; torch only for ``return_tensors="pt"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from packlab.errors import PacklabError
from packlab.interop.items import as_tensors, item_bounds

#: the label a Hugging Face loss ignores
IGNORE_INDEX = -100


def token_labels(item: Mapping[str, Any], *, ignore_index: int = IGNORE_INDEX) -> np.ndarray:
    """Token-aligned labels of one packed item (int64): token ``j`` where ``loss_mask[j - 1]``
    is set and ``j`` does not start a sub-sequence, ``ignore_index`` elsewhere."""
    ids, bounds = item_bounds(item)
    mask = np.asarray(item["loss_mask"])
    if mask.shape != ids.shape:
        raise PacklabError(f"collate: loss_mask has {mask.shape[0]} positions, input_ids "
                           f"{ids.shape[0]}")
    keep = np.zeros(ids.shape[0], dtype=bool)
    keep[1:] = mask[:-1] != 0
    keep[bounds[:-1]] = False  # a sub-sequence's first token is predicted from nothing of its own
    return np.where(keep, ids.astype(np.int64), np.int64(ignore_index))


def hf_flattening_batch(
    items: Sequence[Mapping[str, Any]],
    *,
    return_position_ids: bool = True,
    separator_id: int = IGNORE_INDEX,
    return_flash_attn_kwargs: bool = False,
    return_seq_idx: bool = False,
    position_ids_start: int = 0,
    return_tensors: Literal["pt", "np"] = "pt",
) -> dict[str, Any]:
    """The batch ``DataCollatorWithFlattening`` returns for the sub-sequences of ``items``
    (see above; its options, under its names)."""
    if not items:
        raise PacklabError("collate: empty batch")
    if return_tensors not in ("pt", "np"):
        raise PacklabError(f"collate: return_tensors must be 'pt' or 'np', got {return_tensors!r}")
    tokens, labels, starts, lengths = [], [], [], []
    offset = 0
    for item in items:
        ids, bounds = item_bounds(item)
        tokens.append(ids.astype(np.int64))
        labels.append(token_labels(item))
        starts.append(bounds[:-1] + offset)
        lengths.append(np.diff(bounds))
        offset += ids.shape[0]
    first = np.concatenate(starts)
    length = np.concatenate(lengths)
    label_row = np.concatenate(labels)
    label_row[first] = separator_id
    out: dict[str, Any] = {"input_ids": np.concatenate(tokens)[None], "labels": label_row[None]}
    if return_position_ids:
        positions = np.arange(offset, dtype=np.int64) - np.repeat(first, length)
        out["position_ids"] = (positions + position_ids_start)[None]
    if return_seq_idx:
        out["seq_idx"] = np.repeat(np.arange(length.shape[0], dtype=np.int32), length)[None]
    if return_flash_attn_kwargs:
        cu = np.concatenate(([0], np.cumsum(length))).astype(np.int32)
        out["cu_seq_lens_q"], out["cu_seq_lens_k"] = cu, cu.copy()
        out["max_length_q"] = out["max_length_k"] = int(length.max())
    return as_tensors(out) if return_tensors == "pt" else out
