"""collate: the THD batch, checked against a naive reference written from Megatron-Bridge's loop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packlab.errors import PacklabError
from packlab.loading.collate import Collator, collate
from packlab.packing import pack
from packlab.packing.materialize import iter_bins
from packlab.spool import SpoolReader, SpoolWriter

PAD = 7


def naive(items: list[dict], mult: int = 1, pad: int = PAD) -> dict[str, list]:
    """Megatron-Bridge's packed collate, spelled out with Python lists (slow, obvious)."""
    rows = []
    for item in items:
        ids = [int(x) for x in item["input_ids"]]
        mask = [int(x) for x in item["loss_mask"]]
        b = [int(x) for x in item["seq_boundaries"]]
        row = {"t": [], "l": [], "m": [], "p": [], "cu": [0], "cuu": [0]}
        for k in range(len(b) - 1):
            s, e = b[k], b[k + 1]
            t = ids[s : e - 1]
            padded = -(-len(t) // mult) * mult
            extra = padded - len(t)
            row["t"] += t + [pad] * extra
            row["l"] += ids[s + 1 : e] + [pad] * extra
            row["m"] += mask[s : e - 1] + [0] * extra
            row["p"] += list(range(padded))
            row["cu"].append(row["cu"][-1] + padded)
            row["cuu"].append(row["cuu"][-1] + len(t))
        rows.append(row)
    width = max(len(r["t"]) for r in rows)
    for r in rows:
        fill = width - len(r["t"])
        r["t"] += [pad] * fill
        r["l"] += [pad] * fill
        r["m"] += [0] * fill
        r["p"] += [0] * fill
        if r["cu"][-1] != width:
            r["cu"].append(width)
            r["cuu"].append(r["cuu"][-1])
    cu_width = max(len(r["cu"]) for r in rows) + 1
    for r in rows:
        r["cu"] += [-1] * (cu_width - len(r["cu"]))
        r["cuu"] += [-1] * (cu_width - len(r["cuu"]))
    return {key: [r[key] for r in rows] for key in ("t", "l", "m", "p", "cu", "cuu")}


def random_item(rng: np.random.Generator, max_seqs: int = 5, max_len: int = 9) -> dict:
    lengths = rng.integers(1, max_len + 1, size=int(rng.integers(1, max_seqs + 1)))
    n = int(lengths.sum())
    bounds = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    mask = rng.integers(0, 2, size=n).astype(np.uint8)
    mask[bounds[1:] - 1] = 0
    return {"input_ids": rng.integers(100, 200, size=n).astype(np.int32),
            "loss_mask": mask, "seq_boundaries": bounds}


def test_a_small_batch_by_hand() -> None:
    items = [
        {"input_ids": np.array([10, 11, 12, 20, 21]), "loss_mask": np.array([1, 0, 0, 1, 0]),
         "seq_boundaries": np.array([0, 3, 5])},
        {"input_ids": np.array([30, 31]), "loss_mask": np.array([1, 0]),
         "seq_boundaries": np.array([0, 2])},
    ]
    out = collate(items, pad_token_id=PAD)
    assert out["tokens"].tolist() == [[10, 11, 20], [30, PAD, PAD]]
    assert out["labels"].tolist() == [[11, 12, 21], [31, PAD, PAD]]
    assert out["loss_mask"].tolist() == [[1, 0, 1], [1, 0, 0]]
    assert out["position_ids"].tolist() == [[0, 1, 0], [0, 0, 0]]
    assert out["cu_seqlens"].tolist() == [[0, 2, 3, -1], [0, 1, 3, -1]]
    assert out["cu_seqlens"].dtype == np.int32
    assert out["cu_seqlens_argmin"].tolist() == [[3], [3]]
    assert out["max_seqlen"].tolist() == [[2], [2]]
    assert out["token_count"].tolist() == [3, 1]
    assert "cu_seqlens_unpadded" not in out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 4), mult=st.sampled_from([1, 2, 4]))
def test_matches_the_naive_reference(seed: int, batch: int, mult: int) -> None:
    rng = np.random.default_rng(seed)
    items = [random_item(rng) for _ in range(batch)]
    out = collate(items, pad_seq_to_mult=mult, pad_token_id=PAD)
    ref = naive(items, mult)
    assert out["tokens"].tolist() == ref["t"]
    assert out["labels"].tolist() == ref["l"]
    assert out["loss_mask"].tolist() == ref["m"]
    assert out["position_ids"].tolist() == ref["p"]
    assert out["cu_seqlens"].tolist() == ref["cu"]
    if mult > 1:
        assert out["cu_seqlens_unpadded"].tolist() == ref["cuu"]
        assert out["tokens"].shape[1] % mult == 0
    for row, cu in enumerate(ref["cu"]):
        valid = cu[: cu.index(-1)]
        assert out["cu_seqlens_argmin"][row, 0] == len(valid)
        assert out["max_seqlen"][row, 0] == max(np.diff(valid))


def test_pad_seq_to_mult_pads_each_sequence() -> None:
    item = {"input_ids": np.arange(1, 9), "loss_mask": np.array([1, 1, 0, 1, 1, 1, 1, 0]),
            "seq_boundaries": np.array([0, 3, 8])}  # THD lengths 2 and 4
    out = collate([item], pad_seq_to_mult=4, pad_token_id=0)
    assert out["cu_seqlens"].tolist() == [[0, 4, 8, -1]]
    assert out["cu_seqlens_unpadded"].tolist() == [[0, 2, 6, -1]]
    assert out["tokens"].tolist() == [[1, 2, 0, 0, 4, 5, 6, 7]]
    assert out["labels"].tolist() == [[2, 3, 0, 0, 5, 6, 7, 8]]
    assert out["loss_mask"].tolist() == [[1, 1, 0, 0, 1, 1, 1, 1]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]


def test_fixed_shape_cu_seqlens_repeat_the_last_value_then_minus_one() -> None:
    rng = np.random.default_rng(3)
    batches = [[random_item(rng) for _ in range(3)] for _ in range(4)]
    shapes = set()
    for items in batches:
        out = collate(items, cu_seqlens_size=10, pad_to_length=64)
        shapes.add((out["tokens"].shape, out["cu_seqlens"].shape))
        for row in out["cu_seqlens"]:
            cut = int(np.argmin(row))
            assert cut == 9 and row[-1] == -1
            valid = row[:cut]
            assert valid[0] == 0 and np.all(np.diff(valid) >= 0)
            assert np.all(valid[np.argmax(valid) :] == 64)  # zero-length tail sequences
        assert out["cu_seqlens_argmin"].ravel().tolist() == [9, 9, 9]
    assert shapes == {((3, 64), (3, 10))}


def test_too_small_sizes_are_clear_errors() -> None:
    item = random_item(np.random.default_rng(0), max_seqs=5)
    item["seq_boundaries"] = np.array([0, 1, 2, 3, len(item["input_ids"])])
    with pytest.raises(PacklabError, match="cu_seqlens_size 4 is too small"):
        collate([item], cu_seqlens_size=4)
    with pytest.raises(PacklabError, match="pad_to_length"):
        collate([item], pad_to_length=1)
    with pytest.raises(PacklabError, match="seq_boundaries"):
        collate([{**item, "seq_boundaries": np.array([0, 2])}])
    with pytest.raises(PacklabError, match="empty batch"):
        collate([])


def test_torch_tensors() -> None:
    import torch

    items = [random_item(np.random.default_rng(i)) for i in range(3)]
    out = Collator(return_tensors="pt", pad_seq_to_mult=2)(items)
    ref = collate(items, pad_seq_to_mult=2)
    assert out["tokens"].dtype == torch.int64 and out["cu_seqlens"].dtype == torch.int32
    for key, value in ref.items():
        assert np.array_equal(out[key].numpy(), value), key


def test_loss_falls_exactly_on_learnable_next_tokens(tmp_path: Path) -> None:
    """End to end from a spool: the labels with loss are the learnable tokens that have a
    predecessor in their own sequence, in order: nothing shifted, nothing across a boundary."""
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 30, size=60)
    tokens = np.arange(int(lengths.sum()), dtype=np.int64) + 1  # every token id unique
    raw = rng.integers(0, 2, size=tokens.shape[0]).astype(np.uint8)
    with SpoolWriter(tmp_path / "s", vocab_size=10**6) as w:
        w.append_many(tokens, raw, lengths)
    spool = SpoolReader(tmp_path / "s")
    assignment, _ = pack(spool.lengths, 64, algorithm="next_fit")
    items = [{"input_ids": b.input_ids, "loss_mask": b.loss_mask,
              "seq_boundaries": b.seq_boundaries()} for b in iter_bins(spool, assignment, copy=True)]
    out = collate(items, pad_token_id=0)
    learned = out["labels"][out["loss_mask"] == 1]
    firsts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    expect = np.ones(tokens.shape[0], dtype=bool)
    expect[firsts] = False  # the first token of a sequence is never a label
    expected = tokens[expect & (raw == 1)]
    assert sorted(learned.tolist()) == sorted(expected.tolist())
