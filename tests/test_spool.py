"""The spool (spool_v1): exact round trips, atomic publishing, and clear errors on bad spools."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import write_empty_spool, write_random_spool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packlab.errors import FormatError, PacklabError
from packlab.spool import DTYPES, FILES, SPOOL_RECORD, SpoolReader, SpoolWriter
from packlab.spool import stats as spool_stats

_SETTINGS = settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def sequences(draw: st.DrawFn) -> list[tuple[np.ndarray, np.ndarray]]:
    """1..30 sequences of 1..300 tokens in [0, 2**31), with 0/1 masks."""
    count = draw(st.integers(1, 30))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    high = draw(st.sampled_from([2, 50_000, 2**31]))
    out = []
    for _ in range(count):
        n = draw(st.integers(1, 300))
        out.append((rng.integers(0, high, size=n, dtype=np.int64),
                    rng.integers(0, 2, size=n, dtype=np.uint8)))
    return out


@_SETTINGS
@given(seqs=sequences(), batched=st.booleans())
def test_round_trip_is_exact(tmp_path_factory: pytest.TempPathFactory,
                             seqs: list[tuple[np.ndarray, np.ndarray]], batched: bool) -> None:
    path = tmp_path_factory.mktemp("spool") / "s"
    with SpoolWriter(path) as writer:
        if batched:
            writer.append_many(np.concatenate([t for t, _ in seqs]),
                               np.concatenate([m for _, m in seqs]),
                               np.array([t.size for t, _ in seqs]))
        else:
            for tokens, mask in seqs:
                writer.append(tokens, mask)
    reader = SpoolReader(path)
    reader.verify()
    assert reader.num_sequences == len(seqs)
    assert reader.num_tokens == sum(t.size for t, _ in seqs)
    for i, (tokens, mask) in enumerate(seqs):
        got_tokens, got_mask = reader.read_sequence(i)
        assert got_tokens.dtype == DTYPES["tokens"] and got_mask.dtype == DTYPES["masks"]
        np.testing.assert_array_equal(got_tokens, tokens)
        np.testing.assert_array_equal(got_mask, mask)
    np.testing.assert_array_equal(reader.lengths, [t.size for t, _ in seqs])


def test_round_trip_across_flushes(tmp_path: Path) -> None:
    """More than one writer flush (1M tokens): offsets continue across the flush boundary."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 40_000, size=80)
    tokens = rng.integers(0, 131_072, size=int(lengths.sum()), dtype=np.int32)
    masks = rng.integers(0, 2, size=tokens.size, dtype=np.uint8)
    with SpoolWriter(tmp_path / "s", vocab_size=131_072) as writer:
        for start in range(0, 80, 7):
            stop = min(start + 7, 80)
            lo, hi = int(lengths[:start].sum()), int(lengths[:stop].sum())
            writer.append_many(tokens[lo:hi], masks[lo:hi], lengths[start:stop])
    reader = SpoolReader(tmp_path / "s")
    assert reader.num_tokens > 1 << 20
    reader.verify()
    np.testing.assert_array_equal(reader.tokens, tokens)
    np.testing.assert_array_equal(reader.masks, masks)
    np.testing.assert_array_equal(reader.offsets, np.concatenate(([0], np.cumsum(lengths)[:-1])))
    last = reader.read_sequence(79)[0]
    np.testing.assert_array_equal(last, tokens[-int(lengths[-1]):])


def test_manifest_is_labelled_and_written(spool: SpoolReader) -> None:
    manifest = json.loads((spool.path / SPOOL_RECORD).read_text())
    assert manifest["version"] == "spool_v1"
    assert manifest["dtypes"] == {name: dt.str for name, dt in DTYPES.items()}
    assert set(manifest["files"]) == set(FILES.values())
    for name, entry in manifest["files"].items():
        assert entry["bytes"] == (spool.path / name).stat().st_size
    assert manifest["source"] == {"generator": "tests", "seed": 0}


def test_reader_pickles_without_its_maps(spool: SpoolReader) -> None:
    first = spool.read_sequence(3)[0].copy()
    clone = pickle.loads(pickle.dumps(spool))
    assert clone._maps is None
    np.testing.assert_array_equal(clone.read_sequence(3)[0], first)


def test_an_exception_inside_the_writer_leaves_nothing(tmp_path: Path) -> None:
    final = tmp_path / "s"
    with pytest.raises(RuntimeError, match="boom"), SpoolWriter(final) as writer:
        writer.append(np.arange(10), np.ones(10, dtype=np.uint8))
        raise RuntimeError("boom")
    assert not final.exists()
    assert list(tmp_path.iterdir()) == []  # the temporary is gone too


def test_an_exception_keeps_the_previous_spool(tmp_path: Path) -> None:
    final = tmp_path / "s"
    old = write_random_spool(final, num_sequences=5)
    old_tokens = np.array(old.tokens)
    with pytest.raises(RuntimeError), SpoolWriter(final, overwrite=True) as writer:
        writer.append(np.arange(3), np.ones(3, dtype=np.uint8))
        raise RuntimeError("crash while replacing")
    np.testing.assert_array_equal(SpoolReader(final).tokens, old_tokens)


def test_nothing_under_the_final_name_until_finalize(tmp_path: Path) -> None:
    final = tmp_path / "s"
    writer = SpoolWriter(final)
    writer.append(np.arange(5), np.zeros(5, dtype=np.uint8))
    assert not final.exists()
    writer.finalize()
    assert SpoolReader(final).num_sequences == 1


def test_existing_spool_is_not_overwritten_by_default(spool: SpoolReader) -> None:
    with pytest.raises(PacklabError, match="already exists"):
        SpoolWriter(spool.path)


@pytest.mark.parametrize(
    ("tokens", "mask", "lengths", "message"),
    [
        ([1, 2, 3], [0, 1], [3], "mask values"),
        ([1, 2, 3], [0, 1, 1], [2], "lengths sum"),
        ([1, 2, 3], [0, 1, 1], [3, 0], "empty sequences"),
        ([1, -2, 3], [0, 1, 1], [3], "out of range"),
        ([1, 2, 3], [0, 2, 1], [3], "0 or 1"),
        ([1.5, 2, 3], [0, 1, 1], [3], "integers"),
        ([1, 2, 3], [0, -1, 1], [3], "0 or 1"),  # would wrap to 255 as uint8
        ([1, 2, 3], [0, 0.5, 1], [3], "0 or 1"),  # would truncate to 0
    ],
)
def test_bad_appends_are_refused(tmp_path: Path, tokens: list, mask: list, lengths: list,
                                 message: str) -> None:
    with SpoolWriter(tmp_path / "s") as writer:
        writer.append(np.arange(4), np.zeros(4, dtype=np.uint8))
        with pytest.raises(PacklabError, match=message):
            writer.append_many(np.array(tokens), np.array(mask), np.array(lengths))
    assert SpoolReader(tmp_path / "s").num_sequences == 1  # what was written is kept


def test_tokens_beyond_the_vocabulary_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PacklabError, match=r"\[0, 100\)"), SpoolWriter(tmp_path / "s",
                                                                        vocab_size=100) as w:
        w.append(np.array([5, 100]), np.array([0, 1]))
    assert not (tmp_path / "s").exists()


def test_a_writer_with_no_sequences_publishes_nothing(tmp_path: Path) -> None:
    with pytest.raises(PacklabError, match="empty spool"), SpoolWriter(tmp_path / "s"):
        pass
    assert not (tmp_path / "s").exists()


# -- bad spools on disk ----------------------------------------------------------------------


def _copy(spool: SpoolReader, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(spool.path, target)
    return target


def test_missing_spool(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match=str(tmp_path / "nope")):
        SpoolReader(tmp_path / "nope")


@pytest.mark.parametrize("name", sorted(FILES.values()))
def test_missing_file(spool: SpoolReader, tmp_path: Path, name: str) -> None:
    path = _copy(spool, tmp_path)
    (path / name).unlink()
    with pytest.raises(FormatError, match=f"{path / name}: missing"):
        SpoolReader(path)


@pytest.mark.parametrize("name", sorted(FILES.values()))
def test_truncated_file(spool: SpoolReader, tmp_path: Path, name: str) -> None:
    path = _copy(spool, tmp_path)
    size = (path / name).stat().st_size
    with open(path / name, "r+b") as f:
        f.truncate(size - 1)
    with pytest.raises(FormatError, match=f"{path / name}: {size - 1} bytes.*truncated"):
        SpoolReader(path)


def test_extra_bytes_are_caught_too(spool: SpoolReader, tmp_path: Path) -> None:
    path = _copy(spool, tmp_path)
    with open(path / "tokens.bin", "ab") as f:
        f.write(b"\0\0\0\0")
    with pytest.raises(FormatError, match="tokens.bin"):
        SpoolReader(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "unreadable record"),
        ("[1, 2]", "not a spool_v1 record"),
        ('{"version": "spool_v0"}', "not a spool_v1 record"),
        ('{"version": "spool_v1", "num_sequences": "3", "num_tokens": 4}', "num_sequences"),
        ('{"version": "spool_v1", "num_sequences": 3}', "num_tokens"),
        ('{"version": "spool_v1", "num_sequences": -1, "num_tokens": 4}', "num_sequences"),
    ],
)
def test_bad_manifest(spool: SpoolReader, tmp_path: Path, text: str, message: str) -> None:
    path = _copy(spool, tmp_path)
    (path / SPOOL_RECORD).write_text(text)
    with pytest.raises(FormatError, match=message) as info:
        SpoolReader(path)
    assert str(path) in str(info.value)


def test_wrong_dtype_in_manifest(spool: SpoolReader, tmp_path: Path) -> None:
    path = _copy(spool, tmp_path)
    manifest = json.loads((path / SPOOL_RECORD).read_text())
    manifest["dtypes"]["tokens"] = "<i8"
    (path / SPOOL_RECORD).write_text(json.dumps(manifest))
    with pytest.raises(FormatError, match="tokens dtype <i8"):
        SpoolReader(path)


def test_missing_manifest_is_an_unfinished_spool(spool: SpoolReader, tmp_path: Path) -> None:
    path = _copy(spool, tmp_path)
    (path / SPOOL_RECORD).unlink()
    with pytest.raises(FormatError, match=f"{path / SPOOL_RECORD}: missing"):
        SpoolReader(path)


def test_empty_spool(tmp_path: Path) -> None:
    path = write_empty_spool(tmp_path / "empty")
    with pytest.raises(FormatError, match=f"{path}: empty spool"):
        SpoolReader(path)


@pytest.mark.parametrize("name", sorted(FILES.values()))
def test_verify_catches_a_flipped_byte(spool: SpoolReader, tmp_path: Path, name: str) -> None:
    path = _copy(spool, tmp_path)
    SpoolReader(path).verify()
    with open(path / name, "r+b") as f:
        f.seek(5)
        byte = f.read(1)
        f.seek(5)
        f.write(bytes([byte[0] ^ 0x10]))
    reader = SpoolReader(path)  # sizes still match: only the checksum can tell
    with pytest.raises(FormatError, match=f"{path / name}: checksum mismatch"):
        reader.verify()


def _without_checksums(path: Path) -> None:
    """A spool from a writer that records no checksums: verify() must check the values."""
    manifest = json.loads((path / SPOOL_RECORD).read_text())
    del manifest["files"]
    (path / SPOOL_RECORD).write_text(json.dumps(manifest))


def test_verify_catches_tokens_beyond_the_vocabulary(spool: SpoolReader, tmp_path: Path) -> None:
    path = _copy(spool, tmp_path)
    _without_checksums(path)
    tokens = np.memmap(path / "tokens.bin", dtype=DTYPES["tokens"], mode="r+")
    tokens[7] = spool.vocab_size
    tokens.flush()
    del tokens
    with pytest.raises(FormatError, match=r"tokens.bin: token ids .* outside \[0, 50000\)"):
        SpoolReader(path).verify()


def test_verify_catches_lengths_that_disagree(spool: SpoolReader, tmp_path: Path) -> None:
    path = _copy(spool, tmp_path)
    _without_checksums(path)
    lengths = np.memmap(path / "lengths.bin", dtype=DTYPES["lengths"], mode="r+")
    lengths[-1] += 1
    lengths.flush()
    del lengths
    with pytest.raises(FormatError, match="lengths.bin: lengths sum to"):
        SpoolReader(path).verify()


def test_out_of_range_index(spool: SpoolReader) -> None:
    with pytest.raises(IndexError, match="out of range"):
        spool.read_sequence(spool.num_sequences)


# -- spool statistics (packlab inspect, notebook 01) -----------------------------------------


def test_length_summary() -> None:
    lengths = np.array([1, 2, 3, 4, 100, 5000], dtype=np.uint32)
    summary = spool_stats.length_summary(lengths, over=(4, 4096))
    assert summary["length_min"] == 1 and summary["length_max"] == 5000
    assert summary["length_mean"] == pytest.approx(5110 / 6)
    assert summary["length_p50"] == pytest.approx(3.5)
    assert summary["length_p99"] == pytest.approx(np.percentile(lengths.astype(np.int64), 99))
    assert summary["over_4"] == pytest.approx(2 / 6)
    assert summary["over_4096"] == pytest.approx(1 / 6)


def test_chunked_passes_match_whole_array_passes(spool: SpoolReader,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spool_stats, "_SCAN", 1000)  # many chunks, a ragged last one
    tokens, masks = np.array(spool.tokens), np.array(spool.masks)
    counts = spool_stats.token_counts(spool.tokens, spool.vocab_size)
    np.testing.assert_array_equal(counts, np.bincount(tokens, minlength=spool.vocab_size))
    assert spool_stats.count_nonzero_chunked(spool.masks) == int(np.count_nonzero(masks))
    info = spool_stats.describe_spool(spool)
    assert info["mask_fraction"] == pytest.approx(masks.mean())
    assert info["num_tokens"] == tokens.size and info["vocab_size"] == 50_000


def test_rank_frequency_and_entropy() -> None:
    counts = np.array([0, 5, 0, 20, 5, 10])
    np.testing.assert_allclose(spool_stats.rank_frequency(counts), [0.5, 0.25, 0.125, 0.125])
    assert spool_stats.order0_entropy_bits(counts) == pytest.approx(1.75)
    assert spool_stats.order0_entropy_bits(np.full(1024, 3)) == pytest.approx(10.0)


def test_ks_distance() -> None:
    rng = np.random.default_rng(0)
    same = spool_stats.ks_distance(rng.normal(size=4000), rng.normal(size=3000))
    shifted = spool_stats.ks_distance(rng.normal(size=4000), rng.normal(1.0, size=3000))
    assert same < 0.05 and 0.3 < shifted < 0.45  # N(0,1) vs N(1,1): 2 * Phi(0.5) - 1 = 0.383
    assert spool_stats.ks_distance(np.array([1, 2]), np.array([3, 4, 5])) == 1.0
    assert spool_stats.ks_distance(np.array([1, 2, 3]), np.array([3, 2, 1])) == 0.0

