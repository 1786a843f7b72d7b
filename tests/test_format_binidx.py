"""binidx: round trips, megatron-core compatibility, token dtype, damage detection. What every
format promises (truncation, lifetimes, pickling, crashes): test_format_contract."""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import write_random_spool
from hypothesis import given, settings
from hypothesis import strategies as st

from packlab.bins import bins_equal
from packlab.errors import FormatError, InvariantError, PacklabError
from packlab.formats import binidx, detect_format
from packlab.packing import BinAssignment, pack
from packlab.packing.materialize import iter_bins
from packlab.sources import open_shard
from packlab.spool import SpoolReader
from packlab.storage.files import sha256_file


def write_shard(path: Path, spool: SpoolReader, assignment: BinAssignment, **options: object
                ) -> binidx.Reader:
    with binidx.Writer(path, pack_size=assignment.pack_size, num_bins=assignment.num_bins,
                       **options) as writer:
        for packed in iter_bins(spool, assignment):
            writer.write(packed)
    return binidx.Reader(path)


def rewrite_checksums(shard: Path) -> None:
    """Make the manifest agree with damaged files, so only the deeper checks can catch it."""
    manifest = json.loads((shard / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        entry["sha256"] = sha256_file(shard / name)
        entry["bytes"] = (shard / name).stat().st_size
    manifest["fingerprints"] = {"data.bin": binidx.fingerprint(shard / "data.bin", whole=False),
                                "data.idx": binidx.fingerprint(shard / "data.idx", whole=True)}
    (shard / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture
def shard(tmp_path: Path, spool: SpoolReader, assignment: BinAssignment) -> Path:
    write_shard(tmp_path / "shard", spool, assignment, vocab_size=spool.vocab_size)
    return tmp_path / "shard"


@settings(max_examples=12, deadline=None)
@given(
    num_sequences=st.integers(1, 120),
    max_len=st.integers(1, 300),
    pack_size=st.sampled_from([64, 256, 1000]),
    algorithm=st.sampled_from(["next_fit", "first_fit_decreasing", "first_fit_shuffle"]),
    vocab_size=st.sampled_from([100, 65_536, 65_537, 200_000]),
    dtype=st.sampled_from(["auto", "int32"]),
    seed=st.integers(0, 2**16),
)
def test_round_trip_equals_materialized_bins(num_sequences: int, max_len: int, pack_size: int,
                                             algorithm: str, vocab_size: int, dtype: str,
                                             seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spool = write_random_spool(Path(tmp) / "spool", num_sequences=num_sequences,
                                   max_len=max_len, vocab_size=vocab_size, seed=seed)
        assignment, _ = pack(spool.lengths, pack_size, algorithm=algorithm, seed=seed)
        reader = write_shard(Path(tmp) / "shard", spool, assignment, vocab_size=vocab_size,
                             dtype=dtype)
        assert detect_format(Path(tmp) / "shard") == "binidx"
        assert reader.num_bins == assignment.num_bins
        for i, packed in enumerate(iter_bins(spool, assignment)):
            assert bins_equal(reader.read_bin(i), packed), i
        assert np.array_equal(reader.packed_lengths(), assignment.bin_lengths(spool.lengths))
        summary = reader.validate()
        assert summary["num_tokens"] == int(assignment.bin_lengths(spool.lengths).sum())
        fits = dtype == "auto" and vocab_size <= 65_536
        assert reader.token_dtype == np.dtype("<u2" if fits else "<i4")


def test_megatron_core_reads_every_row_unchanged(tmp_path: Path, spool: SpoolReader,
                                                 assignment: BinAssignment) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    for dtype, np_type in (("uint16", np.uint16), ("int32", np.int32)):
        shard = tmp_path / dtype
        write_shard(shard, spool, assignment, dtype=dtype)
        dataset = IndexedDataset(binidx.megatron_prefix(shard))  # kept alive while rows are used
        assert len(dataset) == assignment.num_bins
        assert dataset.index.dtype is np_type
        for i, packed in enumerate(iter_bins(spool, assignment)):
            row = dataset[i]
            assert row.dtype == np_type and np.array_equal(row, packed.input_ids), i
        # byte-compatible: megatron-core's own builder writes the very same two files
        import torch

        prefix = str(tmp_path / f"megatron_{dtype}")
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np_type)
        for packed in iter_bins(spool, assignment):
            builder.add_item(torch.from_numpy(packed.input_ids.astype(np.int64)))
            builder.end_document()
        builder.finalize(prefix + ".idx")
        assert (shard / "data.bin").read_bytes() == Path(prefix + ".bin").read_bytes()
        assert (shard / "data.idx").read_bytes() == Path(prefix + ".idx").read_bytes()
        del dataset


def test_token_dtype_choice_and_disk_size(tmp_path: Path) -> None:
    spool = write_random_spool(tmp_path / "spool", num_sequences=300, vocab_size=60_000)
    assignment, _ = pack(spool.lengths, 1024)
    tokens = int(assignment.bin_lengths(spool.lengths).sum())
    small = write_shard(tmp_path / "u16", spool, assignment, vocab_size=60_000)
    large = write_shard(tmp_path / "i32", spool, assignment, vocab_size=60_000, dtype="int32")
    unknown = write_shard(tmp_path / "unknown", spool, assignment)  # no vocab_size: int32
    from_metadata = write_shard(tmp_path / "meta", spool, assignment,
                                metadata={"vocab_size": 60_000})
    assert small.token_dtype == np.dtype("<u2") == from_metadata.token_dtype
    assert large.token_dtype == np.dtype("<i4") == unknown.token_dtype
    assert (tmp_path / "u16" / "data.bin").stat().st_size == 2 * tokens
    assert (tmp_path / "i32" / "data.bin").stat().st_size == 4 * tokens
    assert large.bytes_on_disk() - small.bytes_on_disk() == 2 * tokens
    assert small.info()["token_dtype"] == "uint16"


def test_uint16_refuses_a_token_that_does_not_fit(tmp_path: Path) -> None:
    spool = write_random_spool(tmp_path / "spool", num_sequences=50, vocab_size=70_000, seed=3)
    assignment, _ = pack(spool.lengths, 1024)
    with pytest.raises(PacklabError, match=r"bin \d+: token ids .* do not fit uint16"):
        write_shard(tmp_path / "shard", spool, assignment, dtype="uint16")
    assert not (tmp_path / "shard").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["spool"]  # no temporary left behind
    with pytest.raises(PacklabError, match="token dtype"):
        binidx.Writer(tmp_path / "x", pack_size=8, dtype="float32")


def test_header_fields_are_checked(shard: Path) -> None:
    original = (shard / "data.idx").read_bytes()
    (shard / "data.idx").write_bytes(b"MMIDIDX")  # cut inside the magic
    with pytest.raises(FormatError, match="data.idx.*header"):
        binidx.Reader(shard)
    (shard / "data.idx").write_bytes(b"NOTANIDX\x00" + original[9:])
    assert binidx.detect(shard) is False
    with pytest.raises(FormatError, match="bad magic"):
        binidx.Reader(shard)
    (shard / "data.idx").write_bytes(original[:17] + bytes([4]) + original[18:])  # dtype code
    with pytest.raises(FormatError, match="dtype code 4"):
        binidx.Reader(shard)
    (shard / "data.idx").write_bytes(original[:9] + struct.pack("<Q", 2) + original[17:])
    with pytest.raises(FormatError, match="version 2"):
        binidx.Reader(shard)
    (shard / "data.idx").write_bytes(original)
    (shard / "manifest.json").unlink()
    with pytest.raises(FormatError, match="manifest.json: missing"):
        open_shard(shard)


def test_validate_catches_flipped_bytes_by_checksum(shard: Path) -> None:
    assert binidx.Reader(shard).validate()["format"] == "binidx"
    data = bytearray((shard / "data.bin").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (shard / "data.bin").write_bytes(bytes(data))
    with pytest.raises(FormatError, match="data.bin: checksum mismatch"):
        binidx.Reader(shard).validate()


def test_validate_catches_a_leaking_loss_mask(shard: Path, spool: SpoolReader,
                                              assignment: BinAssignment) -> None:
    lengths = assignment.bin_lengths(spool.lengths)
    loss = bytearray((shard / "loss_mask.bin").read_bytes())
    last_of_bin_2 = binidx.Reader(shard).header_size["loss_mask.bin"] \
        + int(lengths[:3].sum()) - 1  # header, then one byte per token
    loss[last_of_bin_2] = 1
    (shard / "loss_mask.bin").write_bytes(bytes(loss))
    rewrite_checksums(shard)
    with pytest.raises(InvariantError, match="bin 2: loss_mask is 1 .* sequence boundary"):
        binidx.Reader(shard).validate()


def test_validate_catches_a_bad_pointer(shard: Path) -> None:
    reader = binidx.Reader(shard)
    n = reader.num_bins
    idx = bytearray((shard / "data.idx").read_bytes())
    pointer_1 = 34 + 4 * n + 8
    idx[pointer_1 : pointer_1 + 8] = struct.pack("<q", 2)
    (shard / "data.idx").write_bytes(bytes(idx))
    rewrite_checksums(shard)
    with pytest.raises(FormatError, match="bin 1: byte pointer 2 does not follow"):
        binidx.Reader(shard).validate()
    idx[pointer_1 : pointer_1 + 8] = struct.pack("<q", 10**12)
    (shard / "data.idx").write_bytes(bytes(idx))
    rewrite_checksums(shard)
    with pytest.raises(FormatError, match="bin 1: index entry points outside"):
        binidx.Reader(shard).read_bin(1)
