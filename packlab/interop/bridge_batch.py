"""Megatron-Bridge's packed batch, built by packlab: ``Collator(style="megatron_bridge")``.

Equal, key for key, dtype for dtype and value for value, to what
``GPTSFTPackedDataset.collate_fn`` returns in megatron-bridge 0.6.2
(``megatron/bridge/data/packing/gpt_sft.py``; ``tests/bridge/test_megatron_bridge.py`` runs both on
the same items). Given items with ``input_ids``, ``loss_mask`` (stored, already aligned per
sub-sequence) and ``seq_boundaries``, for each row:

- every sub-sequence of ``L`` tokens gives ``L - 1`` positions: ``tokens`` its first ``L - 1``
  tokens, ``labels`` its last ``L - 1``, ``position_ids`` ``0..L-2``; ``token_count`` (a list
  of ints) the row's positions;
- ``loss_mask`` the stored mask over those positions (``answer_only_loss``; else 1 wherever
  the token is not EOS), then **0 wherever ``tokens == eos_id``**, padding included;
- the row width: ``max_seq_length`` with ``pad_to_max_length``, else the longest row rounded
  up to ``pad_seq_length_to_mult`` (16, Bridge's default) and capped at ``max_seq_length``;
  ``tokens`` and ``labels`` padded with ``eos_id``, ``loss_mask`` and ``position_ids`` with 0
  (int64 everywhere);
- ``cu_seqlens_q`` (int32; ``cu_seqlens_kv`` the same): ``[0, cumsum(L - 1)]``, plus the row
  width when the row is shorter, then every row extended by repeating its last value to the
  longest; ``max_seqlen_q``/``_kv`` int32 ``[B, 1]``, the longest segment; ``attention_mask``
  ``None``;
- ``pad_seq_to_mult > 1`` (context parallelism): Bridge's packer pads every sequence with EOS
  at pack time, and collate only describes it: ``cu_seqlens_q_padded``/``_kv_padded`` count
  the stored segments, ``cu_seqlens_q``/``_kv`` stop each at its last non-EOS token. (packlab
  pads nothing here; packlab's own THD style pads at collate time instead.)
- fixed shape (``pad_cu_seqlens``, for CUDA graphs; needs ``pad_to_max_length`` and the pack
  metadata, :mod:`packlab.interop.bridge_metadata`): the boundaries are extended with the row
  width to ``max_samples_per_bin + 2`` entries, and ``max_seqlen_q``/``_kv`` become int32
  ``[B]``, ``max(dataset_max_seqlen, max_seq_length - min_packed_seqlen)``.

Bridge's ``return_cu_seqlen=False`` branch (a dense causal mask per row) and
``ceil_to_power_2`` are not built.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from packlab.errors import PacklabError
from packlab.interop.items import as_tensors, item_bounds

PackMetadata = Sequence[Mapping[str, Any]] | str | os.PathLike[str]


def _ceil_to(n: int, mult: int) -> int:
    return -(-n // mult) * mult


def _load_metadata(pack_metadata: PackMetadata | None) -> list[Mapping[str, Any]]:
    """Bridge's pack-metadata list, given as one or as the path of its JSON file."""
    if pack_metadata is None:
        raise PacklabError("collate: pad_cu_seqlens needs pack_metadata= (the list, or the "
                           "path of the pack-metadata JSON packlab writes beside its shards)")
    if isinstance(pack_metadata, str | os.PathLike):
        try:
            with open(pack_metadata) as f:
                pack_metadata = json.load(f)
        except (OSError, ValueError) as exc:
            raise PacklabError(f"{pack_metadata}: unreadable pack metadata: {exc}") from None
    entries = list(pack_metadata)  # type: ignore[arg-type]
    keys = ("max_samples_per_bin", "dataset_max_seqlen", "min_packed_seqlen")
    if not entries or not all(isinstance(e, Mapping) and all(k in e for k in keys)
                              for e in entries):
        raise PacklabError(f"collate: pack metadata must be a non-empty list of dicts with "
                           f"{', '.join(keys)}")
    return entries


def _row(item: Mapping[str, Any], eos_id: int, answer_only_loss: bool
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One item's tokens, labels, loss, positions, segment lengths and logical lengths."""
    stored, bounds = item_bounds(item)
    ids = stored.astype(np.int64, copy=False)
    lengths = np.diff(bounds)
    keep = np.ones(ids.shape[0], dtype=bool)
    keep[bounds[1:] - 1] = False  # the last token of each sub-sequence is only a label
    src = np.flatnonzero(keep)
    tokens = ids[src]
    if answer_only_loss:
        loss = np.asarray(item["loss_mask"], dtype=np.int64)[src]
    else:
        loss = (tokens != eos_id).astype(np.int64)
    segments = lengths - 1
    positions = np.arange(src.shape[0]) - np.repeat(np.cumsum(segments) - segments, segments)
    # logical length of a segment: up to its last non-EOS token (EOS padding excluded)
    seg_of = np.repeat(np.arange(segments.shape[0]), segments)
    logical = np.zeros(segments.shape[0], dtype=np.int64)
    real = tokens != eos_id
    np.maximum.at(logical, seg_of[real], positions[real] + 1)
    return tokens, ids[src + 1], loss, positions, segments, logical


def megatron_bridge_batch(
    items: Sequence[Mapping[str, Any]],
    *,
    max_seq_length: int,
    eos_id: int,
    pad_to_max_length: bool = False,
    pad_seq_length_to_mult: int = 16,
    pad_seq_to_mult: int = 1,
    pad_cu_seqlens: bool = False,
    pack_metadata: PackMetadata | None = None,
    answer_only_loss: bool = True,
    return_tensors: Literal["pt", "np"] = "pt",
) -> dict[str, Any]:
    """The batch Megatron-Bridge's packed ``collate_fn`` returns for ``items`` (see above)."""
    if not items:
        raise PacklabError("collate: empty batch")
    if pad_cu_seqlens and not pad_to_max_length:
        raise PacklabError("collate: pad_cu_seqlens needs pad_to_max_length=True (one shape)")
    meta = _load_metadata(pack_metadata) if pad_cu_seqlens else None
    rows = [_row(item, eos_id, answer_only_loss) for item in items]
    longest = max(r[0].shape[0] for r in rows)
    if pad_to_max_length:
        width = int(max_seq_length)
    else:
        width = min(int(max_seq_length), _ceil_to(longest, int(pad_seq_length_to_mult)))
    if longest > width:
        raise PacklabError(f"collate: a bin has {longest} positions, more than max_seq_length "
                           f"{max_seq_length} (pack it smaller, or raise max_seq_length)")
    batch = len(items)
    tokens = np.full((batch, width), eos_id, dtype=np.int64)
    labels = np.full((batch, width), eos_id, dtype=np.int64)
    loss_mask = np.zeros((batch, width), dtype=np.int64)
    position_ids = np.zeros((batch, width), dtype=np.int64)
    physical = pad_seq_to_mult > 1
    cu_rows: list[list[int]] = []
    padded_rows: list[list[int]] = []
    for b, (t, lab, loss, pos, segments, logical) in enumerate(rows):
        n = t.shape[0]
        tokens[b, :n], labels[b, :n], loss_mask[b, :n], position_ids[b, :n] = t, lab, loss, pos
        stored = [0, *np.cumsum(segments).tolist()]
        if stored[-1] != width:
            stored.append(width)  # the padding is one more segment
        if physical:
            cu = [0, *np.cumsum(logical).tolist()]
            if len(stored) > len(cu):
                cu.append(cu[-1])
        else:
            cu = stored
        if meta is not None:
            extra = max(max(int(m["max_samples_per_bin"]) for m in meta) - len(stored) + 2, 0)
            if physical:
                cu += [cu[-1]] * extra
                stored += [width] * extra
            else:
                cu += [width] * extra
        cu_rows.append(cu)
        padded_rows.append(stored)
    loss_mask[tokens == eos_id] = 0  # no loss on EOS, padding included
    boundaries = cu_rows + (padded_rows if physical else [])
    count = max(len(r) for r in boundaries)
    cu_q = _extend(cu_rows, count)
    cu_padded = _extend(padded_rows, count) if physical else None
    segment_lengths = np.diff(cu_padded if physical else cu_q, axis=1)
    if meta is not None:
        safe = max(max(int(m["dataset_max_seqlen"]) for m in meta),
                   width - min(int(m["min_packed_seqlen"]) for m in meta))
        max_seqlen = np.full(batch, safe, dtype=np.int32)
    else:
        max_seqlen = segment_lengths.max(axis=1, keepdims=True).astype(np.int32)
    out: dict[str, Any] = {
        "tokens": tokens, "labels": labels, "loss_mask": loss_mask,
        "position_ids": position_ids, "token_count": [int(r[0].shape[0]) for r in rows],
        "attention_mask": None, "cu_seqlens_q": cu_q, "max_seqlen_q": max_seqlen,
        "max_seqlen_kv": max_seqlen, "cu_seqlens_kv": cu_q,
    }
    if cu_padded is not None:
        out["cu_seqlens_q_padded"] = out["cu_seqlens_kv_padded"] = cu_padded
    if return_tensors == "pt":
        return as_tensors(out)
    if return_tensors != "np":
        raise PacklabError(f"collate: return_tensors must be 'pt' or 'np', got {return_tensors!r}")
    return out


def _extend(rows: list[list[int]], count: int) -> np.ndarray:
    """Rows of boundaries as one int32 array, each extended by repeating its last value."""
    out = np.empty((len(rows), count), dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
        out[i, len(r):] = r[-1]
    return out
