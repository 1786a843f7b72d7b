"""Format ``parquet``: round trips, the footer, its cache, foreign files, other readers,
corruption. What every format promises (crashes, memory, workers): test_format_contract."""

from __future__ import annotations

import json
import pickle
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import assert_reads_back as assert_same
from conftest import reference_bins, write_bins
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packlab.bins import PackedBin, bins_equal
from packlab.errors import FormatError, InvariantError, PacklabError
from packlab.formats import detect_format
from packlab.formats.parquet import OneRowGroupReader, Reader, Writer
from packlab.formats.shared.arrow_lists import dump_metadata
from packlab.sources import open_shard


def write_shard(path: Path, bins: list[PackedBin], pack_size: int, **options: object) -> dict:
    return write_bins("parquet", path, bins, pack_size, **options)


@pytest.fixture
def bins(tmp_path: Path) -> list[PackedBin]:
    return reference_bins(tmp_path, num_sequences=300)


@pytest.fixture(params=["default", "smallest", "dictionary"])
def shard(request: pytest.FixtureRequest, tmp_path: Path, bins: list[PackedBin]) -> Path:
    """A shard in the writer's default encoding (compact), and in the other named ones: every
    reader below reads each unchanged."""
    path = tmp_path / "shard.parquet"
    options = {} if request.param == "default" else {"encoding": request.param}
    write_shard(path, bins, 1024, row_group_size=16, **options)
    return path


def _encodings(path: Path) -> dict[str, tuple[set[str], str, int | None]]:
    """Each column's encodings and codec, from the footer (first row group)."""
    meta = pq.read_metadata(path).row_group(0)
    out = {}
    for c in range(meta.num_columns):
        chunk = meta.column(c)
        out[chunk.path_in_schema.split(".")[0]] = (set(chunk.encodings), chunk.compression)
    return out


def test_the_default_encoding_is_compact_and_the_old_one_is_one_option_away(
        tmp_path: Path, bins: list[PackedBin]) -> None:
    """Default: zstd-9, PLAIN tokens, DELTA_BINARY_PACKED starts (standard encodings), 16 MiB
    pages; encoding="dictionary" writes what Nemotron writes (dictionary everywhere, zstd)."""
    write_shard(tmp_path / "compact.parquet", bins, 1024)
    write_shard(tmp_path / "dictionary.parquet", bins, 1024, encoding="dictionary")
    compact, dictionary = (_encodings(tmp_path / f"{n}.parquet") for n in ("compact", "dictionary"))
    assert "PLAIN" in compact["input_ids"][0] and "RLE_DICTIONARY" not in compact["input_ids"][0]
    assert "DELTA_BINARY_PACKED" in compact["seq_start_id"][0]
    assert "RLE_DICTIONARY" in compact["loss_mask"][0]
    assert all("RLE_DICTIONARY" in encodings for encodings, _ in dictionary.values())
    assert {codec for _, codec in compact.values()} == {"ZSTD"} == {
        codec for _, codec in dictionary.values()}
    footer = Reader(tmp_path / "compact.parquet").packlab
    assert (footer["compression_level"], footer["layout"]) == (
        9, "zstd-9 plain starts-delta page-16384K")
    assert Reader(tmp_path / "dictionary.parquet").packlab["layout"] == "zstd"
    assert (tmp_path / "compact.parquet").stat().st_size != (
        tmp_path / "dictionary.parquet").stat().st_size
    for name in ("compact", "dictionary"):
        reader = Reader(tmp_path / f"{name}.parquet")
        assert all(bins_equal(reader.read_bin(i), b) for i, b in enumerate(bins))
    with pytest.raises(PacklabError, match="unknown Parquet encoding 'tiny'"):
        write_shard(tmp_path / "x.parquet", bins, 1024, encoding="tiny")


# -- round trips ------------------------------------------------------------------------------
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    num_sequences=st.integers(1, 120),
    max_len=st.integers(1, 900),
    pack_size=st.integers(1, 2048),
    row_group_size=st.integers(1, 40),
    codec=st.sampled_from(["zstd", "snappy", "gzip", "lz4", "brotli", "none"]),
    use_dictionary=st.booleans(),
)
def test_round_trip_equals_materialized_bins(seed: int, num_sequences: int, max_len: int,
                                             pack_size: int, row_group_size: int, codec: str,
                                             use_dictionary: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bins = reference_bins(Path(tmp), seed=seed, num_sequences=num_sequences,
                              max_len=max_len, pack_size=pack_size)
        path = Path(tmp) / "s.parquet"
        manifest = write_shard(path, bins, pack_size, row_group_size=row_group_size,
                               compression=codec, use_dictionary=use_dictionary)
        assert manifest["num_bins"] == len(bins)
        assert manifest["num_row_groups"] == -(-len(bins) // row_group_size)
        reader = open_shard(path)
        assert isinstance(reader, Reader)
        assert reader.pack_size == pack_size and reader.compression == codec
        assert reader.num_tokens == sum(b.packed_len for b in bins)
        assert reader.num_seqs == sum(b.num_seqs for b in bins)
        assert_same(reader, bins)
        order = np.random.default_rng(seed).permutation(len(bins))
        assert all(bins_equal(g, bins[i]) for g, i in zip(reader.read_bins(order), order, strict=True))
        assert all(bins_equal(g, b) for g, b in zip(reader.iter_bins(), bins, strict=True))
        assert reader.packed_lengths().tolist() == [b.packed_len for b in bins]
        summary = reader.validate()
        assert summary["num_bins"] == len(bins) and summary["packlab_metadata"]


def test_footer_metadata_is_written_at_close(shard: Path, bins: list[PackedBin]) -> None:
    meta = pq.read_metadata(shard)
    info = json.loads(meta.metadata[b"packlab"])
    assert isinstance(info.pop("metadata_crc32"), int)
    assert info["format"] == "parquet" and info["version"] == "packlab_parquet_v1"
    assert info["num_bins"] == len(bins) == meta.num_rows
    assert info["num_tokens"] == sum(b.packed_len for b in bins)
    assert info["num_seqs"] == sum(b.num_seqs for b in bins)
    assert info["pack_size"] == 1024 and info["row_group_size"] == 16
    assert meta.num_row_groups == -(-len(bins) // 16)
    assert meta.row_group(0).column(0).compression == "ZSTD"
    assert pq.read_schema(shard).remove_metadata() == pa.schema([
        ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.uint8())),
        ("seq_start_id", pa.list_(pa.int32()))])


def test_detect_and_suffix(shard: Path, tmp_path: Path) -> None:
    assert detect_format(shard) == "parquet"
    other = tmp_path / "not.parquet"
    other.write_bytes(b"hello world")
    with pytest.raises(FormatError, match="not.parquet"):
        detect_format(other)


def test_writer_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(PacklabError, match="compression"):
        Writer(tmp_path / "a.parquet", pack_size=8, compression="lzma")
    with pytest.raises(PacklabError, match="row_group_size"):
        Writer(tmp_path / "a.parquet", pack_size=8, row_group_size=0)
    assert not list(tmp_path.iterdir())


def test_token_ids_beyond_int32_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.parquet"
    with pytest.raises(PacklabError, match="bin 0: token id"), Writer(path, pack_size=8) as w:
        w.write_bin(0, np.array([1, 2**31], dtype=np.int64), np.zeros(2, np.uint8),
                    np.array([0], np.int32))
    assert not path.exists() and not list(tmp_path.iterdir())


# -- the reader's cache (forked workers, pickling, lifetimes: test_format_contract) ----------
def test_lru_cache_is_bounded_and_batched_reads_decode_each_group_once(
        shard: Path, bins: list[PackedBin]) -> None:
    reader = Reader(shard, cache_row_groups=2)
    groups = reader.num_row_groups
    assert groups >= 4
    # one bin from each row group, twice, interleaved: bin-by-bin misses every time
    firsts, lasts = reader.row_group_offsets[:-1], reader.row_group_offsets[1:] - 1
    indices = np.concatenate([firsts, lasts])
    for i in indices:
        reader.read_bin(int(i))
    assert reader.cache_stats()["misses"] == 2 * groups
    assert reader.cache_stats()["size"] == 2
    batched = Reader(shard, cache_row_groups=1)
    got = batched.read_bins(indices)
    assert batched.cache_stats()["misses"] == groups
    assert all(bins_equal(g, bins[int(i)]) for g, i in zip(got, indices, strict=True))
    assert reader.row_group_of(indices).tolist() == [*range(groups), *range(groups)]


def test_one_row_group_reader_reproduces_the_baseline(shard: Path,
                                                      bins: list[PackedBin]) -> None:
    reader = OneRowGroupReader(shard)
    assert isinstance(open_shard(shard, one_row_group_cache=True), OneRowGroupReader)
    assert type(open_shard(shard)) is Reader
    assert_same(reader, bins)
    assert type(pickle.loads(pickle.dumps(reader))) is OneRowGroupReader
    order = np.random.default_rng(1).permutation(len(bins))[:20]
    assert all(bins_equal(g, bins[i]) for g, i in zip(reader.read_bins(order), order, strict=True))


# -- files without packlab metadata (as Nemotron and Megatron-Bridge write them) --------------
def foreign_table(bins: list[PackedBin], mask_type: pa.DataType | None = None) -> pa.Table:
    def column(parts: list[np.ndarray], value_type: pa.DataType) -> pa.Array:
        offsets = np.concatenate(([0], np.cumsum([p.shape[0] for p in parts]))).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets),
                                        pa.array(np.concatenate(parts)).cast(value_type))

    return pa.table({
        "input_ids": column([b.input_ids for b in bins], pa.int32()),
        "loss_mask": column([b.loss_mask for b in bins], mask_type or pa.uint8()),
        "seq_start_id": column([b.seq_start_id for b in bins], pa.int32()),
    })


@pytest.mark.parametrize("mask_type", [pa.uint8(), pa.int8()], ids=["nemotron", "bridge_int8"])
def test_reads_files_without_packlab_metadata(tmp_path: Path, bins: list[PackedBin],
                                              mask_type: pa.DataType) -> None:
    path = tmp_path / "nemotron.parquet"
    pq.write_table(foreign_table(bins, mask_type), path, row_group_size=50, compression="zstd")
    longest = max(b.packed_len for b in bins)
    reader = open_shard(path)
    assert reader.packlab is None and reader.pack_size == longest
    assert reader.num_tokens == sum(b.packed_len for b in bins)
    assert_same(reader, bins)
    assert reader.validate()["packlab_metadata"] is False
    assert open_shard(path, pack_size=4096).pack_size == 4096
    with pytest.raises(InvariantError, match=r"nemotron.parquet: bin \d+: packed_len"):
        Reader(path, pack_size=longest - 1).validate()


def test_wrong_schema_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "other.parquet"
    pq.write_table(pa.table({"text": ["a", "b"]}), path)
    with pytest.raises(FormatError, match="other.parquet: no column 'input_ids'"):
        open_shard(path)
    pq.write_table(pa.table({"input_ids": ["a"], "loss_mask": [[1]], "seq_start_id": [[0]]}),
                   path)
    with pytest.raises(FormatError, match="'input_ids' is string"):
        Reader(path)


def test_metadata_that_disagrees_with_the_footer_is_refused(tmp_path: Path,
                                                            bins: list[PackedBin]) -> None:
    path = tmp_path / "liar.parquet"
    info = {"format": "parquet", "pack_size": 1024, "num_bins": len(bins) + 1,
            "num_tokens": sum(b.packed_len for b in bins),
            "num_seqs": sum(b.num_seqs for b in bins)}
    table = foreign_table(bins).replace_schema_metadata({"packlab": dump_metadata(info)})
    pq.write_table(table, path)
    with pytest.raises(FormatError, match="liar.parquet: footer has .* bins"):
        Reader(path)


def test_broken_invariants_in_a_file_are_found_by_validate(tmp_path: Path,
                                                           bins: list[PackedBin]) -> None:
    broken = list(bins)
    bad = broken[3]
    mask = bad.loss_mask.copy()
    mask[-1] = 1  # loss would cross the end of the last sub-sequence
    broken[3] = PackedBin(bad.input_ids, mask, bad.seq_start_id)
    path = tmp_path / "leak.parquet"
    pq.write_table(foreign_table(broken), path)
    with pytest.raises(InvariantError, match="leak.parquet: bin 3: loss_mask is 1"):
        Reader(path, pack_size=1024).validate()


# -- other readers ----------------------------------------------------------------------------
def test_duckdb_reads_the_shard(shard: Path, bins: list[PackedBin]) -> None:
    import duckdb

    con = duckdb.connect()
    rows = con.execute(f"SELECT len(input_ids), typeof(input_ids), typeof(loss_mask), "
                   f"typeof(seq_start_id) FROM read_parquet('{shard}')").fetchall()
    assert [r[0] for r in rows] == [b.packed_len for b in bins]
    assert rows[0][1:] == ("INTEGER[]", "UTINYINT[]", "INTEGER[]")
    total, learned = con.execute(f"SELECT sum(len(input_ids)), sum(list_sum(loss_mask)) "
                             f"FROM read_parquet('{shard}')").fetchall()[0]
    assert total == sum(b.packed_len for b in bins)
    assert learned == sum(int(b.loss_mask.sum()) for b in bins)


def test_polars_reads_the_shard(shard: Path, bins: list[PackedBin]) -> None:
    import polars as pl

    frame = pl.read_parquet(shard)
    assert frame.schema == {"input_ids": pl.List(pl.Int32), "loss_mask": pl.List(pl.UInt8),
                            "seq_start_id": pl.List(pl.Int32)}
    assert np.array_equal(frame["input_ids"][7].to_numpy(), bins[7].input_ids)
    lengths = pl.scan_parquet(shard).select(pl.col("input_ids").list.len()).collect()
    assert lengths.to_series().to_list() == [b.packed_len for b in bins]


def test_hugging_face_datasets_reads_the_shard(shard: Path, bins: list[PackedBin],
                                               tmp_path: Path) -> None:
    from datasets import load_dataset

    ds = load_dataset("parquet", data_files=str(shard), split="train",
                      cache_dir=str(tmp_path / "hf-cache"))
    schema = ds.data.schema
    assert schema.field("input_ids").type == pa.list_(pa.int32())
    assert schema.field("loss_mask").type == pa.list_(pa.uint8())
    assert schema.field("seq_start_id").type == pa.list_(pa.int32())
    assert len(ds) == len(bins)
    row = ds.with_format("numpy")[11]
    assert np.array_equal(row["input_ids"], bins[11].input_ids)
    assert np.array_equal(row["loss_mask"], bins[11].loss_mask)


# -- corruption (a truncated file: test_format_contract) --------------------------------------
def data_page_position(path: Path, group: int, column: int) -> int:
    """A byte in the middle of a column chunk written as one plain data page (no dictionary)."""
    chunk = pq.read_metadata(path).row_group(group).column(column)
    assert chunk.dictionary_page_offset is None
    return chunk.data_page_offset + chunk.total_compressed_size // 2


@pytest.mark.parametrize("column", [0, 1, 2], ids=["input_ids", "loss_mask", "seq_start_id"])
def test_bit_flip_in_a_data_page_is_caught_by_the_page_checksum(
        tmp_path: Path, bins: list[PackedBin], column: int) -> None:
    path = tmp_path / "flip.parquet"
    write_shard(path, bins, 1024, row_group_size=16, compression="none", use_dictionary=False)
    data = bytearray(path.read_bytes())
    data[data_page_position(path, 2, column)] ^= 0x04
    path.write_bytes(bytes(data))
    reader = Reader(path)  # the footer is intact
    with pytest.raises(FormatError, match=r"flip.parquet: row group 2 \(bins 32\.\.47\): .*CRC"):
        reader.validate()
    assert bins_equal(reader.read_bin(0), bins[0])  # other row groups still read
    with pytest.raises(FormatError, match="flip.parquet: row group 2.*CRC"):
        reader.read_bin(40)
    # without page verification a flipped token goes through silently; a flipped mask value
    # (4 or 5) is caught by the invariants every decoded row group is checked against
    unverified = Reader(path, verify_checksums=False)
    if column == 1:
        with pytest.raises(InvariantError, match=r"flip.parquet: bin (3[2-9]|4[0-7]): loss_mask"):
            unverified.read_bins(range(32, 48))
        return
    try:
        got = unverified.read_bins(range(32, 48))
    except InvariantError as exc:  # a start moved past its neighbour: structure broken
        assert column == 2 and "flip.parquet: bin" in str(exc)
        return
    assert not all(bins_equal(g, bins[32 + k]) for k, g in enumerate(got))
    with pytest.raises(FormatError, match="flip.parquet: row group 2.*CRC"):
        Reader(path, verify_checksums=False, verify=True).read_bin(40)


def test_random_bit_flips_never_give_silently_wrong_bins(tmp_path: Path,
                                                         bins: list[PackedBin]) -> None:
    path = tmp_path / "flips.parquet"
    write_shard(path, bins[:60], 1024, row_group_size=16)
    clean = path.read_bytes()
    rng = np.random.default_rng(7)
    caught = 0
    for position in rng.integers(0, len(clean), size=40).tolist():
        data = bytearray(clean)
        data[position] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(data))
        try:
            reader = Reader(path)
            reader.validate()
            got = reader.read_bins(range(60))
        except (FormatError, InvariantError):
            caught += 1
            continue
        assert all(bins_equal(g, b) for g, b in zip(got, bins[:60], strict=True)), position
    assert caught > 20
