"""memmap_v1 (Option A): round trips, the documented .npy layout, damage detection, flat writer
memory without a bin count. What every format promises: test_format_contract."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import write_random_spool
from hypothesis import given, settings
from hypothesis import strategies as st

from packlab.bins import PackedBin, bin_checksum, bins_equal
from packlab.errors import FormatError, InvariantError, PacklabError
from packlab.formats import detect_format
from packlab.formats.memmap_v1 import (
    CHECKSUMS,
    FILES,
    RECORD,
    RECORD_FORMAT,
    Reader,
    Writer,
    npy_header,
)
from packlab.lab.measure.harness import run_job
from packlab.lab.measure.jobs import format_imports
from packlab.packing import pack
from packlab.packing.materialize import iter_bins
from packlab.sources import open_shard
from packlab.storage.files import file_entry


def write_shard(path: Path, bins: list[PackedBin], pack_size: int, *, announce: bool = True) -> None:
    with Writer(path, pack_size=pack_size, num_bins=len(bins) if announce else None) as w:
        for b in bins:
            w.write(b)


def random_bins(n: int, pack_size: int, seed: int = 0) -> list[PackedBin]:
    """Valid bins of random length with 1-3 sub-sequences (last token of each has mask 0)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(3, pack_size + 1))
        starts = np.unique(np.concatenate(([0], rng.integers(1, length, size=2)))).astype(np.int32)
        mask = rng.integers(0, 2, size=length).astype(np.uint8)
        mask[np.append(starts[1:], length) - 1] = 0
        ids = rng.integers(0, 50_000, size=length).astype(np.int32)
        out.append(PackedBin(ids, mask, starts))
    return out


@pytest.fixture
def shard(tmp_path: Path) -> tuple[Path, list[PackedBin]]:
    bins = random_bins(40, 64)
    write_shard(tmp_path / "shard", bins, 64)
    return tmp_path / "shard", bins


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), pack_size=st.integers(8, 900), announce=st.booleans())
def test_round_trip_equals_materialized_bins(
    tmp_path_factory: pytest.TempPathFactory, seed: int, pack_size: int, announce: bool
) -> None:
    root = tmp_path_factory.mktemp("memmap")
    spool = write_random_spool(root / "spool", num_sequences=60, max_len=400, seed=seed)
    assignment, _ = pack(spool.lengths, pack_size, algorithm="next_fit", seed=seed)
    expected = list(iter_bins(spool, assignment, copy=True))
    write_shard(root / "shard", expected, pack_size, announce=announce)
    assert detect_format(root / "shard") == "memmap_v1"
    reader = open_shard(root / "shard")
    assert (reader.num_bins, reader.pack_size) == (len(expected), pack_size)
    assert reader.num_tokens == sum(b.packed_len for b in expected)
    assert all(bins_equal(a, b) for a, b in zip(reader.iter_bins(), expected, strict=True))
    np.testing.assert_array_equal(reader.packed_lengths(), [b.packed_len for b in expected])
    indices = np.random.default_rng(seed).integers(-len(expected), len(expected), size=25)
    batch = reader.read_bins(indices)
    assert all(bins_equal(b, expected[i]) for b, i in zip(batch, indices, strict=True))
    assert reader.validate()["num_bins"] == len(expected)


def test_files_are_plain_npy_with_the_documented_layout(shard: tuple[Path, list[PackedBin]]) -> None:
    path, bins = shard
    manifest = json.loads((path / RECORD).read_text())
    assert manifest["format"] == RECORD_FORMAT and manifest["num_bins"] == len(bins)
    assert manifest["dtypes"]["input_ids"] == "<i4" and manifest["dtypes"]["seq_starts"] == "<u4"
    assert sorted(p.name for p in path.iterdir()) == sorted([*FILES.values(), CHECKSUMS,
                                                             RECORD])
    assert manifest["bin_checksum"] == "xxh3_64"
    checksums = np.load(path / CHECKSUMS, allow_pickle=False)
    assert checksums.dtype == np.dtype("<u8") and checksums.shape == (len(bins),)
    ids = np.load(path / "input_ids.npy", mmap_mode="r", allow_pickle=False)
    lengths = np.load(path / "packed_len.npy", allow_pickle=False)
    offsets = np.load(path / "seq_offsets.npy", allow_pickle=False)
    starts = np.load(path / "seq_starts.npy", allow_pickle=False)
    assert ids.shape == (len(bins), 64) and ids.dtype == np.int32
    for i, b in enumerate(bins):
        np.testing.assert_array_equal(ids[i, : lengths[i]], b.input_ids)
        assert not ids[i, lengths[i]:].any()  # zero padding
        np.testing.assert_array_equal(starts[offsets[i]:offsets[i + 1]], b.seq_start_id)
        assert int(checksums[i]) == bin_checksum(ids[i, : lengths[i]].copy(),
                                                 np.ascontiguousarray(b.loss_mask),
                                                 b.seq_start_id.astype("<i4"))


def test_unknown_bin_count_gives_the_same_bytes(tmp_path: Path) -> None:
    bins = random_bins(30, 50, seed=3)
    write_shard(tmp_path / "known", bins, 50, announce=True)
    write_shard(tmp_path / "unknown", bins, 50, announce=False)
    for name in FILES.values():
        assert (tmp_path / "known" / name).read_bytes() == (tmp_path / "unknown" / name).read_bytes()


def test_token_ids_that_do_not_fit_int32_are_refused(tmp_path: Path) -> None:
    ids = np.array([1, 2**31, 3], dtype=np.int64)
    with pytest.raises(PacklabError, match="do not fit"):
        with Writer(tmp_path / "s", pack_size=8) as w:
            w.write(PackedBin(ids, np.zeros(3, np.uint8), np.array([0], np.int32)))
    assert not (tmp_path / "s").exists()


# -- damage (a truncated file: test_format_contract) ----------------------------------------
@pytest.mark.parametrize("name", FILES.values())
def test_every_bit_flip_fails_validate(shard: tuple[Path, list[PackedBin]], name: str) -> None:
    path, _ = shard
    file = path / name
    original = file.read_bytes()
    rng = np.random.default_rng(len(name))
    for position in rng.integers(0, len(original), size=6):
        flipped = bytearray(original)
        flipped[position] ^= 1 << int(rng.integers(0, 8))
        file.write_bytes(bytes(flipped))
        with pytest.raises(FormatError, match=str(file)):
            Reader(path).validate()
        try:  # reading does not hash: it returns bins or says FormatError, nothing else
            reader = Reader(path)
            for i in range(reader.num_bins):
                reader.read_bin(i)
            reader.read_bins(range(reader.num_bins))
        except FormatError as exc:
            assert str(path) in str(exc)
    file.write_bytes(original)
    Reader(path).validate()


def _flip(file: Path, offset: int, mask: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= mask
    file.write_bytes(bytes(data))


def test_flips_in_the_index_or_header_are_caught_on_read(shard: tuple[Path, list[PackedBin]]) -> None:
    path, _ = shard
    _flip(path / "packed_len.npy", 128 + 3 * 4 + 3, 0x80)  # bin 3's length gains 2**31
    with pytest.raises(FormatError, match="bin 3: packed_len"):
        Reader(path).read_bin(3)
    with pytest.raises(FormatError, match="bin 3"):
        Reader(path).read_bins([1, 3])
    header = (path / "input_ids.npy").read_bytes()[:128]
    _flip(path / "input_ids.npy", header.index(b"(40,") + 1, 0x01)  # shape 40 -> 50
    with pytest.raises(FormatError, match="input_ids.npy"):
        Reader(path).read_bin(0)


def test_corrupt_manifest_and_unfinished_shard(shard: tuple[Path, list[PackedBin]]) -> None:
    path, _ = shard
    manifest = path / RECORD
    text = manifest.read_text()
    manifest.write_text(text.replace('"num_bins": 40', '"num_bins": 41'))
    with pytest.raises(FormatError, match="bytes, record says|header"):
        Reader(path).validate()
    manifest.write_text(text[: len(text) // 2])
    assert detect_format(path) == "memmap_v1"
    with pytest.raises(FormatError, match="unreadable record"):
        open_shard(path)
    manifest.unlink()
    with pytest.raises(FormatError, match="missing"):
        open_shard(path)


def _rewrite(path: Path, name: str, array: np.ndarray) -> None:
    """Replace a file's payload and re-sign the manifest (the shard's identity kept in the
    header): damage only the invariants can see."""
    manifest = json.loads((path / RECORD).read_text())
    header = npy_header(array.dtype, array.shape, manifest["identity"])
    (path / name).write_bytes(header + np.ascontiguousarray(array).tobytes())
    manifest["files"][name] = file_entry(path / name)
    (path / RECORD).write_text(json.dumps(manifest))


def test_validate_checks_padding_and_invariants(shard: tuple[Path, list[PackedBin]]) -> None:
    path, bins = shard
    ids = np.load(path / "input_ids.npy")
    lengths = np.load(path / "packed_len.npy")
    short = int(np.argmax(lengths < 64))
    padded = ids.copy()
    padded[short, 63] = 7
    _rewrite(path, "input_ids.npy", padded)
    with pytest.raises(FormatError, match=f"bin {short}: non-zero padding"):
        Reader(path).validate()
    _rewrite(path, "input_ids.npy", ids)
    mask = np.load(path / "loss_mask.npy")
    leaking = mask.copy()
    leaking[5, lengths[5] - 1] = 1
    _rewrite(path, "loss_mask.npy", leaking)
    with pytest.raises(InvariantError, match="bin 5: loss_mask is 1"):
        Reader(path).validate()
    _rewrite(path, "loss_mask.npy", mask)
    offsets = np.load(path / "seq_offsets.npy")
    starts = np.load(path / "seq_starts.npy")
    swapped = starts.copy()
    k = int(np.argmax(np.diff(offsets) > 1))  # a bin with two starts or more
    swapped[offsets[k] + 1] = 0
    _rewrite(path, "seq_starts.npy", swapped)
    with pytest.raises(InvariantError, match=f"bin {k}: seq_start_id not strictly increasing"):
        Reader(path).validate()
    _rewrite(path, "seq_starts.npy", starts)
    assert Reader(path).validate()["num_bins"] == len(bins)


# -- memory (the contract measures it with the count announced) ------------------------------
def test_writer_memory_is_flat_without_a_bin_count_too(tmp_path: Path) -> None:
    """Unannounced, the writer grows its files and rewrites the headers at the end: memory
    stays flat all the same (measured in a fresh process by packlab.lab.measure.harness)."""
    def growth(num_bins: int) -> int:
        out = tmp_path / f"s{num_bins}"
        report = run_job("conftest:write_repeated_bin", "memmap_v1", out, num_bins, 2048, False,
                         imports=format_imports("memmap_v1"))
        assert Reader(out).num_bins == num_bins
        return report["phases"]["write"]["peak_rss_phase_growth_bytes"]

    small, large = growth(2_000), growth(20_000)
    data_bytes = 20_000 * 2048 * 5
    print(f"memmap_v1 writer, count unannounced, peak RSS growth: 2k bins {small / 2**20:.1f} "
          f"MiB, 20k bins {large / 2**20:.1f} MiB (shard {data_bytes / 2**20:.0f} MiB)")
    assert large < small + (8 << 20), (small, large)
    assert large < data_bytes / 10
