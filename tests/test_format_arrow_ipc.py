"""Format ``arrow_ipc``: round trips, bins read in place, compressed batches, other readers,
corruption. What every format promises (crashes, memory, workers): test_format_contract."""

from __future__ import annotations

import gc
import json
import pickle
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import Child, reference_bins, write_bins
from conftest import assert_reads_back as assert_same
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packlab.bins import PackedBin, bins_equal
from packlab.errors import FormatError, InvariantError, PacklabError
from packlab.formats import detect_format
from packlab.formats.arrow_ipc import Reader, Writer
from packlab.sources import open_shard


def write_shard(path: Path, bins: list[PackedBin], pack_size: int, **options: object) -> dict:
    return write_bins("arrow_ipc", path, bins, pack_size, **options)


@pytest.fixture
def bins(tmp_path: Path) -> list[PackedBin]:
    return reference_bins(tmp_path, num_sequences=300)


@pytest.fixture
def shard(tmp_path: Path, bins: list[PackedBin]) -> Path:
    path = tmp_path / "shard.arrow"
    write_shard(path, bins, 1024, batch_size=16)
    return path


def learned(bins: list[PackedBin]) -> int:
    return sum(int(b.loss_mask.sum()) for b in bins)


# -- round trips ------------------------------------------------------------------------------
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    num_sequences=st.integers(1, 120),
    max_len=st.integers(1, 900),
    pack_size=st.integers(1, 2048),
    batch_size=st.integers(1, 40),
    codec=st.sampled_from(["none", "lz4", "zstd"]),
)
def test_round_trip_equals_materialized_bins(seed: int, num_sequences: int, max_len: int,
                                             pack_size: int, batch_size: int, codec: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bins = reference_bins(Path(tmp), seed=seed, num_sequences=num_sequences,
                              max_len=max_len, pack_size=pack_size)
        path = Path(tmp) / "s.arrow"
        manifest = write_shard(path, bins, pack_size, batch_size=batch_size, compression=codec)
        assert manifest["num_batches"] == -(-len(bins) // batch_size)
        reader = open_shard(path)
        assert isinstance(reader, Reader)
        assert reader.pack_size == pack_size and reader.compression == codec
        assert reader.num_tokens == sum(b.packed_len for b in bins)
        assert reader.num_seqs == sum(b.num_seqs for b in bins)
        assert_same(reader, bins)
        order = np.random.default_rng(seed).permutation(len(bins))
        got = reader.read_bins(order)
        assert all(bins_equal(g, bins[i]) for g, i in zip(got, order, strict=True))
        assert all(bins_equal(g, b) for g, b in zip(reader.iter_bins(), bins, strict=True))
        assert reader.packed_lengths().tolist() == [b.packed_len for b in bins]
        summary = reader.validate()
        assert summary["num_bins"] == len(bins) and summary["num_batches"] == reader.num_batches


def test_metadata_in_schema_and_batches(shard: Path, bins: list[PackedBin]) -> None:
    with pa.memory_map(str(shard)) as source:
        reader = pa.ipc.open_file(source)
        static = json.loads(reader.schema.metadata[b"packlab"])
        assert static["format"] == "arrow_ipc" and static["pack_size"] == 1024
        assert static["batch_size"] == 16 and static["compression"] == "none"
        _, custom = reader.get_batch_with_custom_metadata(reader.num_record_batches - 1)
        last = json.loads(custom[b"packlab"])
    assert last["total_bins"] == len(bins)
    assert last["total_tokens"] == sum(b.packed_len for b in bins)
    assert last["total_seqs"] == sum(b.num_seqs for b in bins)
    assert detect_format(shard) == "arrow_ipc"


def test_writer_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(PacklabError, match="compression"):
        Writer(tmp_path / "a.arrow", pack_size=8, compression="gzip")
    with pytest.raises(PacklabError, match="batch_size"):
        Writer(tmp_path / "a.arrow", pack_size=8, batch_size=0)
    with pytest.raises(PacklabError, match="overflows int32"):
        Writer(tmp_path / "a.arrow", pack_size=2**20, batch_size=4096)
    assert not list(tmp_path.iterdir())


# -- bins read from the file ------------------------------------------------------------------------
def test_bins_are_read_from_the_file_into_arrays_of_their_own(shard: Path) -> None:
    reader = Reader(shard)
    a, b = reader.read_bin(3), reader.read_bin(4)
    assert a.input_ids.flags.writeable and a.input_ids.flags.owndata
    assert not np.shares_memory(a.input_ids, b.input_ids)
    # the runs are where the batch's buffers put them: bin 4's tokens follow bin 3's
    table = reader.table()
    assert table.locate(4)[0] == table.locate(3)[1]


def _sums_after_close(path: Path) -> list[int]:
    reader = Reader(path)
    packed = [reader.read_bin(i) for i in (0, 5, len(reader) - 1)]
    reader.close()
    del reader
    gc.collect()
    return [int(b.input_ids.astype(np.int64).sum()) + int(b.loss_mask.sum())
            + int(b.seq_start_id.sum()) for b in packed]


def test_decompressed_bins_stay_valid_after_the_reader_is_closed(tmp_path: Path,
                                                                 bins: list[PackedBin]) -> None:
    """The contract checks the default, bins that are views of the map; a compressed shard's
    bins come from batches decompressed into the cache instead. In a child: a freed buffer
    could crash the process, not just fail an assert."""
    path = tmp_path / "zstd.arrow"
    write_shard(path, bins, 1024, batch_size=16, compression="zstd")
    expected = [int(b.input_ids.astype(np.int64).sum()) + int(b.loss_mask.sum())
                + int(b.seq_start_id.sum()) for b in (bins[0], bins[5], bins[-1])]
    assert Child(_sums_after_close, path).result() == expected


def test_batched_reads_group_by_record_batch(tmp_path: Path, bins: list[PackedBin]) -> None:
    path = tmp_path / "z.arrow"
    write_shard(path, bins, 1024, batch_size=16, compression="zstd")
    reader = Reader(path, cache_batches=1)
    firsts = reader.batch_offsets[:-1]
    indices = np.concatenate([firsts, reader.batch_offsets[1:] - 1])
    got = reader.read_bins(indices)
    assert reader.cache_stats()["misses"] == reader.num_batches
    assert all(bins_equal(g, bins[int(i)]) for g, i in zip(got, indices, strict=True))
    with pytest.raises(IndexError, match="z.arrow"):
        reader.read_bins([len(bins)])
    assert bins_equal(reader.read_bin(-1), bins[-1])


# -- files written elsewhere, and other readers ----------------------------------------------
def plain_table(bins: list[PackedBin]) -> pa.Table:
    def column(parts: list[np.ndarray]) -> pa.Array:
        offsets = np.concatenate(([0], np.cumsum([p.shape[0] for p in parts]))).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(parts)))

    return pa.table({"input_ids": column([b.input_ids for b in bins]),
                     "loss_mask": column([b.loss_mask for b in bins]),
                     "seq_start_id": column([b.seq_start_id for b in bins])})


def test_reads_ipc_files_without_packlab_metadata(tmp_path: Path, bins: list[PackedBin]) -> None:
    path = tmp_path / "plain.arrow"
    table = plain_table(bins)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=7):
            writer.write_batch(batch)
    reader = open_shard(path)
    assert reader.packlab is None and reader.pack_size == max(b.packed_len for b in bins)
    assert_same(reader, bins)
    assert reader.validate()["packlab_metadata"] is False
    with pytest.raises(InvariantError, match=r"plain.arrow: bin \d+: packed_len"):
        Reader(path, pack_size=reader.pack_size - 1).validate()


def test_the_stream_format_is_not_taken_for_a_shard(tmp_path: Path, bins: list[PackedBin]) -> None:
    path = tmp_path / "stream.arrow"
    table = plain_table(bins)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(FormatError, match="stream.arrow: not a shard of any known format"):
        detect_format(path)
    with pytest.raises(FormatError, match="stream.arrow: not a readable Arrow IPC file"):
        Reader(path)


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
def test_pyarrow_and_polars_read_the_shard(tmp_path: Path, bins: list[PackedBin],
                                           codec: str) -> None:
    import polars as pl

    path = tmp_path / f"{codec}.arrow"
    write_shard(path, bins, 1024, batch_size=16, compression=codec)
    with pa.memory_map(str(path)) as source:
        table = pa.ipc.open_file(source).read_all()
    assert table.schema.remove_metadata() == plain_table(bins[:1]).schema
    assert table.num_rows == len(bins)
    assert np.array_equal(table.column("input_ids")[9].values.to_numpy(), bins[9].input_ids)
    frame = pl.read_ipc(path)
    assert frame.schema == {"input_ids": pl.List(pl.Int32), "loss_mask": pl.List(pl.UInt8),
                            "seq_start_id": pl.List(pl.Int32)}
    lengths = pl.scan_ipc(path).select(pl.col("input_ids").list.len()).collect().to_series()
    assert lengths.to_list() == [b.packed_len for b in bins]
    assert frame["loss_mask"].list.sum().sum() == learned(bins)


# -- corruption (a truncated file: test_format_contract) --------------------------------------
def token_position(path: Path, packed: PackedBin, offset: int) -> int:
    """Where token ``offset`` of a bin lies in an uncompressed file (found by its bytes)."""
    needle = packed.input_ids[offset : offset + 6].astype("<i4").tobytes()
    data = path.read_bytes()
    position = data.find(needle)
    assert position > 0 and data.find(needle, position + 1) < 0
    return position


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_bit_flip_in_the_tokens_is_caught(tmp_path: Path, bins: list[PackedBin],
                                          codec: str) -> None:
    path = tmp_path / "flip.arrow"
    write_shard(path, bins, 1024, batch_size=16, compression="none")
    position = token_position(path, bins[40], 3)
    if codec != "none":  # the same bins compressed: flip the middle of batch 2's body
        write_shard(path, bins, 1024, batch_size=16, compression=codec, overwrite=True)
        position = len(path.read_bytes()) * 2 // 5
    data = bytearray(path.read_bytes())
    data[position] ^= 0x01
    path.write_bytes(bytes(data))
    reader = Reader(path)
    with pytest.raises(FormatError, match=r"flip.arrow: record batch \d+ .*(checksum|corrupt)"):
        reader.validate()
    if codec == "none":
        # zero-copy reads do not checksum; validate (above) is the proof, or ask for it:
        with pytest.raises(FormatError, match=r"flip.arrow: record batch 2 \(bins 32\.\.47\)"):
            Reader(path, verify_checksums=True).read_bin(40)
        assert Reader(path).read_bin(40).input_ids[3] == bins[40].input_ids[3] ^ 1


_FLIPS = textwrap.dedent("""
    import json, pickle, shutil, sys
    import numpy as np
    from packlab.bins import bins_equal
    from packlab.errors import FormatError, InvariantError
    from packlab.formats.arrow_ipc import Reader

    clean_path, expected_path, flips, validate = sys.argv[1:5]
    expected = pickle.load(open(expected_path, "rb"))
    clean = open(clean_path, "rb").read()
    path = clean_path + ".flipped"
    rng = np.random.default_rng(11)
    outcomes = {"caught": 0, "same": 0, "wrong": []}
    for position in rng.integers(0, len(clean), size=int(flips)).tolist():
        data = bytearray(clean)
        data[position] ^= 1 << int(rng.integers(0, 8))
        open(path, "wb").write(bytes(data))
        try:
            reader = Reader(path)
            if validate == "validate":
                reader.validate()
            got = reader.read_bins(range(len(expected)))
        except (FormatError, InvariantError):
            outcomes["caught"] += 1
            continue
        same = len(got) == len(expected) and reader.pack_size == 1024 and all(
            bins_equal(g, b) for g, b in zip(got, expected))
        if same:
            outcomes["same"] += 1
        else:
            outcomes["wrong"].append(position)
    print(json.dumps(outcomes))
""")


@pytest.mark.parametrize(("codec", "check"), [("none", "validate"), ("lz4", "validate"),
                                              ("zstd", "read")])
def test_random_bit_flips_never_give_silently_wrong_bins(tmp_path: Path, bins: list[PackedBin],
                                                         codec: str, check: str) -> None:
    """Flip one bit anywhere; ``validate`` (or, for compressed shards, reading alone) either
    raises a clear error or returns exactly the original bins. In a child process: a corrupted
    IPC message must not crash the interpreter either."""
    path, expected = tmp_path / "flips.arrow", tmp_path / "bins.pickle"
    write_shard(path, bins[:40], 1024, batch_size=8, compression=codec)
    expected.write_bytes(pickle.dumps(bins[:40]))
    done = subprocess.run([sys.executable, "-c", _FLIPS, str(path), str(expected), "150", check],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    outcomes = json.loads(done.stdout)
    assert outcomes["wrong"] == [] and outcomes["caught"] > 100, outcomes


_NO_PANDAS = textwrap.dedent("""
    import sys
    import numpy as np
    from packlab.bins import PackedBin
    from packlab.sources import open_shard, open_writer

    packed = PackedBin(np.arange(5, dtype=np.int32), np.array([1, 0, 1, 1, 0], np.uint8),
                       np.array([0, 2], np.int32))
    for fmt, name in (("parquet", "a.parquet"), ("arrow_ipc", "a.arrow")):
        with open_writer(fmt, sys.argv[1] + name, pack_size=8) as writer:
            writer.write(packed)
        reader = open_shard(sys.argv[1] + name)
        reader.validate(), reader.read_bins([0]), reader.packed_lengths()
    print("pandas" in sys.modules)
""")


def test_writing_and_reading_never_import_pandas(tmp_path: Path) -> None:
    """pyarrow's ``pa.array(ndarray)``/``to_numpy()`` import pandas: ~50 MB per worker."""
    done = subprocess.run([sys.executable, "-c", _NO_PANDAS, f"{tmp_path}/"], capture_output=True,
                          text=True, check=True, timeout=120)
    assert done.stdout.strip() == "False"


def test_a_large_pack_size_takes_fewer_bins_a_batch_by_default(tmp_path: Path,
                                                               bins: list[PackedBin]) -> None:
    """At ``pack_size=2_200_000`` 1000 bins a batch would overflow int32 list offsets: the
    default batch holds as many as fit, and the shard reads back (issue 25's case, which
    failed naming an option the command line does not have)."""
    with Writer(tmp_path / "big.arrow", pack_size=2_200_000) as writer:
        assert writer.batch_size * 2_200_000 <= 2**31 - 1 < (writer.batch_size + 1) * 2_200_000
        for packed in bins[:3]:
            writer.write(packed)
        writer.finalize()
    with Reader(tmp_path / "big.arrow") as reader:
        assert all(bins_equal(reader.read_bin(i), bins[i]) for i in range(3))
