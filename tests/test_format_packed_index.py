"""packed_index: bins gathered from the spool, repacks that rewrite only the index, a changed or
missing spool detected, damage caught. What every format promises: test_format_contract."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import write_random_spool
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from packlab.bins import bins_equal
from packlab.errors import FormatError, InvariantError, PacklabError
from packlab.formats import detect_format, packed_index
from packlab.formats.shared.npy_identity import npy_header
from packlab.packing import BinAssignment, pack
from packlab.packing.materialize import iter_bins
from packlab.sources import open_shard
from packlab.spool import SpoolReader, SpoolWriter
from packlab.storage.files import sha256_file


def assert_reads_like(reader: packed_index.Reader, spool: SpoolReader,
                      assignment: BinAssignment) -> None:
    assert reader.num_bins == assignment.num_bins
    for i, packed in enumerate(iter_bins(spool, assignment)):
        assert bins_equal(reader.read_bin(i), packed), i


@pytest.fixture
def shard(tmp_path: Path, spool: SpoolReader, assignment: BinAssignment) -> Path:
    packed_index.write_packed_index(tmp_path / "shard", spool.path, assignment)
    return tmp_path / "shard"


@settings(max_examples=12, deadline=None)
@given(
    num_sequences=st.integers(1, 150),
    max_len=st.integers(1, 400),
    pack_size=st.sampled_from([50, 128, 700]),
    algorithm=st.sampled_from(["next_fit", "best_fit_decreasing", "first_fit_shuffle"]),
    overlong=st.sampled_from(["truncate", "drop"]),
    through_write_bin=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_round_trip_equals_materialized_bins(num_sequences: int, max_len: int, pack_size: int,
                                             algorithm: str, overlong: str,
                                             through_write_bin: bool, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spool = write_random_spool(Path(tmp) / "spool", num_sequences=num_sequences,
                                   max_len=max_len, seed=seed)
        # nothing left to pack is another case (pack() refuses it; test_packing checks that)
        assume(not (overlong == "drop" and int(spool.lengths.min()) > pack_size))
        assignment, report = pack(spool.lengths, pack_size, algorithm=algorithm, seed=seed,
                                  overlong=overlong)  # type: ignore[arg-type]
        out = Path(tmp) / "out" / "shard"
        if through_write_bin:
            with packed_index.Writer(out, pack_size=pack_size, num_bins=assignment.num_bins,
                                     spool=str(spool.path), assignment=assignment) as writer:
                for i, packed in enumerate(iter_bins(spool, assignment)):
                    writer.write_bin(i, *packed)
        else:
            packed_index.write_packed_index(out, spool.path, assignment)
        assert detect_format(out) == "packed_index"
        reader = open_shard(out)
        assert_reads_like(reader, spool, assignment)
        assert reader.num_tokens == report.num_tokens
        assert np.array_equal(reader.packed_lengths(), assignment.bin_lengths(spool.lengths))
        assert reader.validate()["num_bins"] == assignment.num_bins


def test_repacking_rewrites_only_the_index(tmp_path: Path) -> None:
    spool = write_random_spool(tmp_path / "spool", num_sequences=400, max_len=900)
    spool_hashes = {p.name: sha256_file(p) for p in spool.path.iterdir()}
    for pack_size, algorithm in ((1024, "first_fit_decreasing"), (4096, "next_fit")):
        assignment, _ = pack(spool.lengths, pack_size, algorithm=algorithm)
        shard = tmp_path / f"p{pack_size}"
        packed_index.write_packed_index(shard, spool.path, assignment)
        reader = packed_index.Reader(shard)
        assert_reads_like(reader, spool, assignment)
        # 8 bytes per sequence (and 8 more for its checksum) and per bin, plus a manifest:
        # far below the tokens
        index_bytes = reader.bytes_on_disk()
        assert index_bytes < 8 * (2 * 400 + assignment.num_bins + 1) + 4096
        assert reader.info()["spool_bytes"] > 20 * index_bytes
    assert {p.name: sha256_file(p) for p in spool.path.iterdir()} == spool_hashes


def test_shards_of_one_assignment_via_first_bin(tmp_path: Path, spool: SpoolReader,
                                                assignment: BinAssignment) -> None:
    # the pipeline passes assignment.select(start, stop); first_bin= does the same
    with packed_index.Writer(tmp_path / "s1", pack_size=1024, spool=spool, num_bins=3,
                             assignment=assignment, first_bin=2) as writer:
        for i, packed in enumerate(iter_bins(spool, assignment, start=2, stop=5)):
            writer.write_bin(i, *packed)
    reader = packed_index.Reader(tmp_path / "s1")
    assert reader.num_bins == 3
    assert_reads_like(reader, spool, assignment.select(2, 5))
    assert packed_index.Writer.NEEDS_SPOOL is True and packed_index.Reader.NEEDS_SPOOL is True


def test_writer_needs_the_spool_and_the_assignment(tmp_path: Path, spool: SpoolReader,
                                                   assignment: BinAssignment) -> None:
    with pytest.raises(PacklabError, match="needs spool="):
        packed_index.Writer(tmp_path / "a", pack_size=1024, assignment=assignment)
    with pytest.raises(PacklabError, match="needs assignment="):
        packed_index.Writer(tmp_path / "a", pack_size=1024, spool=spool)
    with pytest.raises(PacklabError, match="pack_size 512 differs"):
        packed_index.Writer(tmp_path / "a", pack_size=512, spool=spool, assignment=assignment)
    saved = tmp_path / "assignment.npz"
    assignment.save(saved)
    packed_index.Writer(tmp_path / "a", pack_size=1024, spool=spool, assignment=saved).abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["assignment.npz", "spool"]


def test_bins_that_are_not_the_spools_are_refused(tmp_path: Path, spool: SpoolReader,
                                                  assignment: BinAssignment) -> None:
    bins = list(iter_bins(spool, assignment, stop=2, copy=True))
    for verify in (True, False):
        with pytest.raises(PacklabError, match="bin 0 differs"), packed_index.Writer(
            tmp_path / "a", pack_size=1024, spool=spool, assignment=assignment, verify=verify,
        ) as writer:
            writer.write(bins[1])  # bin 1 offered as bin 0: lengths differ
    changed = bins[0].copy()
    changed.input_ids[0] += 1  # same structure, other tokens: only full verification sees it
    with pytest.raises(PacklabError, match="bin 0 differs"), packed_index.Writer(
        tmp_path / "a", pack_size=1024, spool=spool, assignment=assignment
    ) as writer:
        writer.write(changed)
    assert not (tmp_path / "a").exists()


def test_a_changed_spool_is_detected(shard: Path, spool: SpoolReader) -> None:
    # same lengths, other tokens: the recorded checksums tell them apart
    tokens, masks, lengths = np.array(spool.tokens), np.array(spool.masks), np.array(spool.lengths)
    with SpoolWriter(spool.path, vocab_size=spool.vocab_size, overwrite=True) as writer:
        writer.append_many((tokens + 1) % spool.vocab_size, masks, lengths)
    with pytest.raises(FormatError, match="spool is missing or changed.*checksums differ"):
        packed_index.Reader(shard)
    # another spool altogether
    write_random_spool(spool.path.parent / "other", num_sequences=spool.num_sequences, seed=9)
    shutil.rmtree(spool.path)
    (spool.path.parent / "other").rename(spool.path)
    with pytest.raises(FormatError, match="spool is missing or changed.*num_tokens"):
        packed_index.Reader(shard)


def test_a_spool_edited_in_place_fails_validation(shard: Path, spool: SpoolReader) -> None:
    tokens = bytearray((spool.path / "tokens.bin").read_bytes())
    tokens[100] ^= 0x01  # same size, manifest untouched: opening cannot tell, validate must
    (spool.path / "tokens.bin").write_bytes(bytes(tokens))
    reader = packed_index.Reader(shard)
    with pytest.raises(FormatError, match="tokens.bin: checksum mismatch"):
        reader.validate()


def test_a_missing_spool_and_where_to_find_it(tmp_path: Path, shard: Path,
                                              spool: SpoolReader) -> None:
    moved = tmp_path / "elsewhere" / "spool"
    moved.parent.mkdir()
    spool.path.rename(moved)
    with pytest.raises(FormatError, match="spool is missing or changed.*missing"):
        packed_index.Reader(shard)
    reader = packed_index.Reader(shard, spool=moved)
    assert reader.spool_path == moved and reader.read_bin(0).packed_len > 0


def test_a_tree_moved_as_a_whole_finds_its_spool(tmp_path: Path, shard: Path,
                                                 spool: SpoolReader,
                                                 assignment: BinAssignment) -> None:
    moved = tmp_path.parent / f"{tmp_path.name}-moved"
    tmp_path.rename(moved)
    try:
        reader = packed_index.Reader(moved / "shard")
        assert reader.spool_path == moved / "spool"
        assert_reads_like(reader, SpoolReader(moved / "spool"), assignment)
    finally:
        moved.rename(tmp_path)


def test_damaged_index_files_are_format_errors(shard: Path) -> None:
    offsets = (shard / "bin_offsets.npy").read_bytes()
    (shard / "bin_offsets.npy").write_bytes(offsets[:-5])
    with pytest.raises(FormatError, match="bin_offsets.npy.*truncated"):
        packed_index.Reader(shard)
    (shard / "bin_offsets.npy").write_bytes(b"garbage" + offsets[7:])
    with pytest.raises(FormatError, match="bin_offsets.npy: checksum mismatch"):
        packed_index.Reader(shard).validate()
    with pytest.raises(FormatError, match="bin_offsets.npy: not a valid .npy"):
        packed_index.Reader(shard).read_bin(0)
    (shard / "bin_offsets.npy").write_bytes(offsets)
    (shard / "manifest.json").write_text("{not json")
    with pytest.raises(FormatError, match="manifest.json: unreadable"):
        open_shard(shard)


def test_validate_catches_an_index_outside_the_spool(shard: Path, spool: SpoolReader) -> None:
    indices = np.load(shard / "seq_indices.npy")
    indices[3] = spool.num_sequences + 7
    manifest = json.loads((shard / "manifest.json").read_text())
    (shard / "seq_indices.npy").write_bytes(  # a consistent forgery: the shard's identity kept
        npy_header(indices.dtype, indices.shape, manifest["identity"]) + indices.tobytes())
    manifest["files"]["seq_indices.npy"]["sha256"] = sha256_file(shard / "seq_indices.npy")
    (shard / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FormatError, match=r"seq_indices.npy: bin 1: sequence \d+ is not in the "
                                          "spool"):
        packed_index.Reader(shard).validate()


def test_validate_catches_an_overfull_bin(tmp_path: Path, spool: SpoolReader) -> None:
    order = np.arange(spool.num_sequences, dtype=np.int64)
    overfull = BinAssignment(np.array([0, 3, spool.num_sequences]), order, 1024)
    big = int(spool.lengths[:3].sum())
    assert big > 1024  # three random sequences of up to 700 tokens (seed 0) overflow 1024
    with pytest.raises(InvariantError, match="bin 0: packed_len"):
        packed_index.write_packed_index(tmp_path / "bad", spool.path, overfull)
    assert not (tmp_path / "bad").exists()
