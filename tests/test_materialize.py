"""Materialize: bins from a real spool pass every invariant, carry exactly their sequences'
tokens, and a loss mask equal to the per-sequence next-token alignment computed naively; the
design documents' whole-bin roll does not; truncation only when the assignment says so."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import write_random_spool
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from packlab.bins import check_bin, check_csr
from packlab.errors import FormatError, InvariantError, PacklabError
from packlab.packing import ALGORITHMS, BinAssignment, pack
from packlab.packing.materialize import (
    BinMaterializer,
    align_loss_mask,
    alignment_errors,
    bin_masks,
    iter_bins,
    roll_whole_bin,
)
from packlab.spool import FILES, SpoolReader, SpoolWriter


def naive_loss_mask(spool: SpoolReader, seqs: list[int], pack_size: int) -> list[int]:
    """Per sequence: position j learns when token j+1 of the same sequence is a learn token."""
    out: list[int] = []
    for seq in seqs:
        raw = [int(v) for v in spool.read_sequence(seq)[1]][:pack_size]
        out.extend(raw[j + 1] if j + 1 < len(raw) else 0 for j in range(len(raw)))
    return out


def flat_csr(bins: list) -> dict[str, np.ndarray]:
    return {
        "token_offsets": np.concatenate(([0], np.cumsum([b.packed_len for b in bins]))),
        "seq_offsets": np.concatenate(([0], np.cumsum([b.num_seqs for b in bins]))),
        "seq_starts": np.concatenate([b.seq_start_id for b in bins]),
        "loss_mask": np.concatenate([b.loss_mask for b in bins]),
        "input_ids": np.concatenate([b.input_ids for b in bins]),
    }


@settings(max_examples=25, deadline=None)
@given(
    num_sequences=st.integers(1, 40),
    max_len=st.integers(1, 300),
    pack_size=st.integers(1, 400),
    algorithm=st.sampled_from(sorted(ALGORITHMS)),
    overlong=st.sampled_from(["truncate", "drop"]),
    seed=st.integers(0, 10_000),
)
def test_materialized_bins_pass_every_invariant_and_match_the_naive_alignment(
    num_sequences: int, max_len: int, pack_size: int, algorithm: str, overlong: str, seed: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spool = write_random_spool(Path(tmp) / "s", num_sequences=num_sequences,
                                   max_len=max_len, seed=seed)
        lengths = spool.lengths.astype(np.int64)
        # nothing to pack is another case (test_packing checks the error)
        assume(not (overlong == "drop" and (lengths > pack_size).all()))
        assignment, _ = pack(spool.lengths, pack_size, algorithm=algorithm, seed=seed,
                             overlong=overlong)
        bins = list(iter_bins(spool, assignment, copy=True))
        assert len(bins) == assignment.num_bins
        for b, packed in enumerate(bins):
            check_bin(*packed, pack_size=pack_size, source=str(spool.path), bin_id=b)
            seqs = assignment.bin_indices(b).tolist()
            kept = [min(int(lengths[s]), pack_size) for s in seqs]
            assert packed.seq_start_id.tolist() == np.cumsum([0] + kept[:-1]).tolist()
            tokens = np.concatenate([spool.read_sequence(s)[0][:pack_size] for s in seqs])
            assert np.array_equal(packed.input_ids, tokens)
            assert packed.loss_mask.tolist() == naive_loss_mask(spool, seqs, pack_size)
        csr = flat_csr(bins)
        check_csr(csr["token_offsets"], csr["seq_offsets"], csr["seq_starts"], csr["loss_mask"],
                  pack_size=pack_size, source=str(spool.path), input_ids=csr["input_ids"])


def _spool_of(path: Path, sequences: list[tuple[list[int], list[int]]]) -> SpoolReader:
    with SpoolWriter(path, vocab_size=100) as w:
        for tokens, mask in sequences:
            w.append(np.array(tokens), np.array(mask, dtype=np.uint8))
    return SpoolReader(path)


def test_whole_bin_roll_differs_and_leaks_loss_across_a_boundary(tmp_path: Path) -> None:
    # A: a prompt token then two answer tokens; B: two answer tokens then a prompt token
    spool = _spool_of(tmp_path / "s", [([10, 11, 12], [0, 1, 1]), ([20, 21, 22], [1, 1, 0])])
    assignment = BinAssignment(np.array([0, 2]), np.array([0, 1]), pack_size=8)
    packed = next(iter_bins(spool, assignment))
    raw = np.array([0, 1, 1, 1, 1, 0], np.uint8)
    # per sequence: A learns to produce 11 and 12, B learns 21; nothing crosses from A into B
    assert packed.loss_mask.tolist() == [1, 1, 0, 1, 0, 0]
    rolled = roll_whole_bin(raw)
    assert rolled.tolist() == [0, 0, 1, 1, 1, 1]
    # off by two inside a sequence: the roll marks j where mask[j-1] is set, not mask[j+1]
    assert rolled[2:].tolist()[:2] == packed.loss_mask[:2].tolist()
    # the roll asks position 2 (A's last token) to predict B's first token
    with pytest.raises(InvariantError, match=r"bin 0: loss_mask is 1 at position 2"):
        check_bin(packed.input_ids, rolled, packed.seq_start_id, pack_size=8,
                  source=str(spool.path), bin_id=0)
    masks = bin_masks(BinMaterializer(spool, assignment), 0)
    assert masks.raw.tolist() == raw.tolist() and masks.rolled.tolist() == rolled.tolist()
    assert masks.aligned.tolist() == [1, 1, 0, 1, 0, 0]
    assert alignment_errors(spool, assignment) == {
        "bins": 1, "tokens": 6, "targets": 3, "differ": 5, "leaking": 2, "missed": 2,
        "spurious": 3, "bins_failing": 1,
    }


def test_the_roll_is_wrong_on_real_bins_too(tmp_path: Path) -> None:
    spool = write_random_spool(tmp_path / "s", num_sequences=300, seed=11)
    assignment, _ = pack(spool.lengths, 1024, algorithm="first_fit_decreasing")
    materializer = BinMaterializer(spool, assignment)
    differing = leaking = 0
    for b in range(assignment.num_bins):
        packed = materializer.materialize(b)
        raw = np.concatenate([spool.read_sequence(s)[1] for s in assignment.bin_indices(b)])
        rolled = roll_whole_bin(raw)
        differing += int((rolled != packed.loss_mask).sum())
        ends = np.append(packed.seq_start_id[1:], packed.packed_len) - 1
        leaking += int(rolled[ends].sum())
    assert differing > 0.3 * spool.num_tokens  # random masks: about half the positions
    assert leaking > 0
    counts = alignment_errors(spool, assignment)
    assert (counts["differ"], counts["leaking"]) == (differing, leaking)
    assert counts["tokens"] == spool.num_tokens and counts["bins"] == assignment.num_bins
    assert counts["missed"] + counts["spurious"] == differing


def test_align_loss_mask_on_one_sequence_and_on_single_tokens() -> None:
    out = np.empty(4, np.uint8)
    align_loss_mask(np.array([1, 0, 1, 1], np.uint8), np.array([0]), out)
    assert out.tolist() == [0, 1, 1, 0]
    out = np.empty(3, np.uint8)
    align_loss_mask(np.array([1, 1, 1], np.uint8), np.array([0, 1, 2]), out)
    assert out.tolist() == [0, 0, 0]  # one-token sequences have nothing to predict


def test_truncation_only_when_the_assignment_says_truncate(tmp_path: Path) -> None:
    spool = _spool_of(tmp_path / "s", [([1, 2, 3, 4, 5, 6], [1, 1, 1, 1, 1, 1]), ([7, 8], [0, 1])])
    assignment, report = pack(spool.lengths, 4, algorithm="first_fit_decreasing")
    assert report.truncated == 1
    bins = list(iter_bins(spool, assignment, copy=True))
    assert bins[0].input_ids.tolist() == [1, 2, 3, 4]
    assert bins[0].loss_mask.tolist() == [1, 1, 1, 0]  # the cut end learns nothing
    assert bins[1].input_ids.tolist() == [7, 8]
    # an assignment that does not truncate yet holds the long sequence: a clear error
    no_truncate = BinAssignment(assignment.bin_offsets, assignment.seq_indices, 4, "drop")
    with pytest.raises(PacklabError, match=r"s: bin 0: sequence 0 has 6 tokens.*does not truncate"):
        list(iter_bins(spool, no_truncate))
    dropped, report = pack(spool.lengths, 4, overlong="drop")
    assert report.dropped == 1
    assert [b.input_ids.tolist() for b in iter_bins(spool, dropped, copy=True)] == [[7, 8]]


def test_assignments_that_do_not_fit_the_spool_are_refused(tmp_path: Path) -> None:
    spool = _spool_of(tmp_path / "s", [([1, 2, 3], [1, 1, 1]), ([4, 5, 6], [1, 1, 1])])
    with pytest.raises(PacklabError, match=r"names sequence 2, the spool has 2"):
        BinMaterializer(spool, BinAssignment(np.array([0, 1]), np.array([2]), 8))
    with pytest.raises(PacklabError, match=r"names sequence -1"):
        BinMaterializer(spool, BinAssignment(np.array([0, 1]), np.array([-1]), 8))
    # the whole assignment is checked when the materializer is made, before any bin is read
    too_full = BinAssignment(np.array([0, 2]), np.array([0, 1]), 5)  # 6 tokens in a 5-bin
    with pytest.raises(PacklabError, match=r"bin 0: sequences need more than pack_size 5"):
        BinMaterializer(spool, too_full)
    empty_bin = BinAssignment(np.array([0, 2, 2]), np.array([0, 1]), 8)
    with pytest.raises(PacklabError, match=r"bin 1: the assignment gives it no sequence"):
        BinMaterializer(spool, empty_bin)
    two_bins = BinAssignment(np.array([0, 1, 2]), np.array([0, 1]), 8)
    with pytest.raises(IndexError, match=r"bin 3 out of range \[0, 2\)"):
        BinMaterializer(spool, two_bins).materialize(3)


def test_corrupted_offsets_are_a_format_error(tmp_path: Path) -> None:
    spool = _spool_of(tmp_path / "s", [([1, 2, 3], [1, 1, 1]), ([4, 5, 6], [1, 1, 1])])
    np.array([0, 5], dtype="<u8").tofile(spool.path / FILES["offsets"])  # same size, wrong
    spool = SpoolReader(spool.path)
    assignment, _ = pack(spool.lengths, 8, algorithm="next_fit")
    with pytest.raises(FormatError, match=r"bin 0: sequence 1 at offset 5 runs past"):
        list(iter_bins(spool, assignment))


def test_views_are_reused_unless_copied(spool: SpoolReader, assignment: BinAssignment) -> None:
    views = iter_bins(spool, assignment)
    first = next(views)
    kept = first.copy()
    second = next(views)
    assert np.shares_memory(first.input_ids, second.input_ids)  # scratch buffers, no allocation
    copies = list(iter_bins(spool, assignment, copy=True, start=0, stop=2))
    assert np.array_equal(copies[0].input_ids, kept.input_ids)
    assert not np.shares_memory(copies[0].input_ids, copies[1].input_ids)
    assert [b.packed_len for b in iter_bins(spool, assignment, start=2)] == \
        assignment.bin_lengths(spool.lengths)[2:].tolist()
