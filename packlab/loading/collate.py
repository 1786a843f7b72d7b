"""Collate packed bins into a training batch, in one of three styles (``Collator(style=...)``).

``style="thd"`` (the default) is packlab's own THD batch, described below. ``style=
"megatron_bridge"`` is Megatron-Bridge's batch exactly as its packed ``collate_fn`` builds it
(megatron-bridge 0.6.2, ``megatron/bridge/data/packing/gpt_sft.py``), for a training loop that
expects Bridge's keys: :mod:`packlab.interop.bridge_batch`. ``style="hf_flattening"`` is the
one-row batch of transformers' ``DataCollatorWithFlattening`` (and TRL's padding-free
collator): token-aligned ``labels`` with ``-100``, ``position_ids`` restarting at every
sub-sequence, optional FlashAttention kwargs and ``seq_idx``: :mod:`packlab.interop.hf_batch`.
The first two side by side:

=====================  =========================================  =============================================
                       ``thd`` (packlab)                          ``megatron_bridge`` (Bridge's ``collate_fn``)
=====================  =========================================  =============================================
boundaries             ``cu_seqlens`` int32, ``-1``-terminated,   ``cu_seqlens_q``/``_kv`` int32, rows extended
                       ``cu_seqlens_argmin`` int64 ``[B, 1]``     by repeating their last value
longest segment        ``max_seqlen`` int32 ``[B, 1]``            ``max_seqlen_q``/``_kv`` int32 ``[B, 1]``
                                                                  (``[B]`` with ``pad_cu_seqlens``)
row width              the longest row (or ``pad_to_length``)     longest row rounded up to 16, capped at
                                                                  ``max_seq_length`` (or ``max_seq_length``)
padding tokens         ``pad_token_id`` (default 0)               ``eos_id``
loss                   the stored mask                            the stored mask, 0 wherever a token is EOS
``pad_seq_to_mult``    pads every segment here (loss 0),          describes segments padded at pack time:
                       ``cu_seqlens_unpadded`` for the real ones  ``cu_seqlens_q_padded``/``_kv_padded``
fixed shape            ``cu_seqlens_size=K``                      ``pad_cu_seqlens`` + the pack-metadata JSON
others                 ``token_count`` int64 ``[B]``              ``token_count`` list, ``attention_mask`` None
=====================  =========================================  =============================================

The ``thd`` style:

- each sub-sequence of length ``L`` contributes ``L - 1`` positions: ``tokens`` are its first
  ``L - 1`` tokens, ``labels`` its last ``L - 1`` (the real next token, never ``-100``: the
  ``loss_mask`` decides what counts), ``loss_mask`` the stored (already next-token aligned)
  mask over the same positions; ``position_ids`` restart at 0 for every sub-sequence;
- rows are padded to one width with ``pad_token_id`` in ``tokens`` and ``labels``, 0 in
  ``loss_mask`` and ``position_ids``;
- ``cu_seqlens`` (int32) are the cumulative sub-sequence lengths; when the row is wider than
  its sequences, the row width is appended (the padding is one more segment, as the attention
  kernels expect no unaccounted tail); rows are then padded with ``-1`` to the longest row
  plus one, and ``cu_seqlens_argmin`` gives the index of the first ``-1`` (where a consumer
  cuts, without a device-to-host sync);
- ``pad_seq_to_mult`` pads every sub-sequence to a multiple (for context parallelism); the
  padding then lives inside the segment (positions keep counting, loss 0), ``cu_seqlens``
  count padded lengths and ``cu_seqlens_unpadded`` the real ones;
- ``cu_seqlens_size`` fixes the width of ``cu_seqlens`` (CUDA graphs need one shape): the
  real entries, then the last value repeated (zero-length sequences), then one ``-1``. Pair it
  with ``pad_to_length`` so tokens have one shape too.

``max_seqlen`` (int32, ``[batch, 1]``) is the longest segment of each row; ``token_count``
(int64, ``[batch]``) the real (unpadded) THD positions of each row. Everything else is int64
(``torch.LongTensor`` with ``return_tensors="pt"``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from packlab.errors import PacklabError
from packlab.interop.bridge_batch import megatron_bridge_batch
from packlab.interop.hf_batch import hf_flattening_batch
from packlab.interop.items import as_tensors, item_bounds


def _ceil_to(n: np.ndarray, mult: int) -> np.ndarray:
    return -(-n // mult) * mult


def _row_segments(
    item: Mapping[str, Any], mult: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boundaries (int64), real THD segment lengths and padded segment lengths of one bin."""
    _, bounds = item_bounds(item)
    real = np.diff(bounds) - 1
    return bounds, real, _ceil_to(real, mult)


def collate(
    items: Sequence[Mapping[str, Any]],
    *,
    pad_seq_to_mult: int = 1,
    cu_seqlens_size: int | None = None,
    pad_to_length: int | None = None,
    pad_token_id: int = 0,
    return_tensors: Literal["np", "pt"] = "np",
) -> dict[str, Any]:
    """The THD batch of ``items`` (dicts with ``input_ids``, ``loss_mask``, ``seq_boundaries``)."""
    if not items:
        raise PacklabError("collate: empty batch")
    mult = int(pad_seq_to_mult)
    if mult < 1:
        raise PacklabError(f"collate: pad_seq_to_mult must be >= 1, got {pad_seq_to_mult}")
    segments = [_row_segments(item, mult) for item in items]
    needed = max(int(padded.sum()) for _, _, padded in segments)
    width = needed if pad_to_length is None else int(pad_to_length)
    if width < needed:
        raise PacklabError(f"collate: a bin needs {needed} positions, pad_to_length is {width}")
    batch = len(items)
    tokens = np.full((batch, width), pad_token_id, dtype=np.int64)
    labels = np.full((batch, width), pad_token_id, dtype=np.int64)
    loss_mask = np.zeros((batch, width), dtype=np.int64)
    position_ids = np.zeros((batch, width), dtype=np.int64)
    cu_rows: list[np.ndarray] = []
    cu_unpadded_rows: list[np.ndarray] = []
    token_count = np.zeros(batch, dtype=np.int64)
    for row, (item, (bounds, real, padded)) in enumerate(zip(items, segments, strict=True)):
        ids = np.asarray(item["input_ids"])
        mask = np.asarray(item["loss_mask"])
        n = ids.shape[0]
        keep = np.ones(n, dtype=bool)
        keep[bounds[1:] - 1] = False  # the last token of each sub-sequence is only a label
        src = np.flatnonzero(keep)
        seg_dest = np.zeros(real.shape[0], dtype=np.int64)
        np.cumsum(padded[:-1], out=seg_dest[1:])
        seg_of = np.repeat(np.arange(real.shape[0]), real)
        dest = seg_dest[seg_of] + (src - bounds[:-1][seg_of])
        tokens[row, dest] = ids[src]
        labels[row, dest] = ids[src + 1]
        loss_mask[row, dest] = mask[src]
        used = int(padded.sum())
        position_ids[row, :used] = np.arange(used) - np.repeat(seg_dest, padded)
        token_count[row] = int(real.sum())
        cu = np.concatenate(([0], np.cumsum(padded)))
        cu_unpadded = np.concatenate(([0], np.cumsum(real)))
        if cu[-1] != width:
            cu = np.append(cu, width)
            cu_unpadded = np.append(cu_unpadded, cu_unpadded[-1])
        cu_rows.append(cu)
        cu_unpadded_rows.append(cu_unpadded)
    out: dict[str, Any] = {
        "tokens": tokens,
        "labels": labels,
        "loss_mask": loss_mask,
        "position_ids": position_ids,
        "token_count": token_count,
    }
    cu_seqlens, argmin = _pad_cu_rows(cu_rows, cu_seqlens_size)
    out["cu_seqlens"] = cu_seqlens
    out["cu_seqlens_argmin"] = argmin
    out["max_seqlen"] = np.array(
        [[int(np.diff(c).max())] for c in cu_rows], dtype=np.int32
    )
    if mult > 1:
        out["cu_seqlens_unpadded"], out["cu_seqlens_unpadded_argmin"] = _pad_cu_rows(
            cu_unpadded_rows, cu_seqlens_size
        )
    if return_tensors == "pt":
        return as_tensors(out)
    if return_tensors != "np":
        raise PacklabError(f"collate: return_tensors must be 'np' or 'pt', got {return_tensors!r}")
    return out


def _pad_cu_rows(rows: list[np.ndarray], size: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Rows of cumulative lengths -> one int32 array, ``-1``-terminated, and the argmin."""
    longest = max(r.shape[0] for r in rows)
    if size is None:
        width = longest + 1
        out = np.full((len(rows), width), -1, dtype=np.int32)
        for i, r in enumerate(rows):
            out[i, : r.shape[0]] = r
    else:
        width = int(size)
        if width < longest + 1:
            raise PacklabError(
                f"collate: cu_seqlens_size {width} is too small: a bin needs {longest} entries "
                f"plus the -1 terminator ({longest + 1}); raise it to at least max sequences "
                "per bin + 3"
            )
        out = np.empty((len(rows), width), dtype=np.int32)
        for i, r in enumerate(rows):
            out[i, : r.shape[0]] = r
            out[i, r.shape[0] : width - 1] = r[-1]
        out[:, -1] = -1
    argmin = np.argmin(out, axis=1).reshape(-1, 1).astype(np.int64)
    return out, argmin


#: each style's batch builder, by name
BUILDERS: dict[str, Callable[..., dict[str, Any]]] = {
    "thd": collate, "megatron_bridge": megatron_bridge_batch, "hf_flattening": hf_flattening_batch,
}
STYLES = tuple(BUILDERS)


class Collator:
    """A picklable ``collate_fn`` for a DataLoader: ``style`` and its options bound.

    ``Collator(pad_seq_to_mult=2)`` is :func:`collate` (``style="thd"``);
    ``Collator(style="megatron_bridge", max_seq_length=4096, eos_id=2)`` is
    :func:`packlab.interop.bridge_batch.megatron_bridge_batch` (Bridge's keys and values);
    ``Collator(style="hf_flattening", return_flash_attn_kwargs=True)`` is
    :func:`packlab.interop.hf_batch.hf_flattening_batch` (``DataCollatorWithFlattening``'s).
    """

    def __init__(self, style: str = "thd", **options: Any) -> None:
        if style not in STYLES:
            raise PacklabError(f"collate: unknown style {style!r}: {', '.join(STYLES)}")
        self.style = style
        self.options = options

    def __call__(self, items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return BUILDERS[self.style](items, **self.options)
