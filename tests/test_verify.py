"""Integrity on read (issue 18, item 3): per-bin checksums where a format has room for them,
``verify=True`` catching a flipped token or mask byte with an error naming the file and the
bin, the invariants checked on every read, and shards written before checksums still open.

Each damaged byte is placed where the format's own description of its bins says it is (the
:class:`~packlab.formats.read.table.Placement` of the memory-mapped formats; the column chunk of a
Parquet row group), so the test damages the bin it names and no other.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import write_random_spool

from packlab import open_dataset
from packlab.bins import PackedBin, bins_equal, records_checksum
from packlab.errors import FormatError, PacklabError
from packlab.formats import format_names, formats_where
from packlab.packing import pack
from packlab.packing.materialize import iter_bins
from packlab.pipeline.shards import write_shards
from packlab.sources import open_shard
from packlab.storage.files import file_entry

TABLE_FORMATS = ["memmap_v1", "binidx", "arrow_ipc", "pbin"]
DAMAGED = 5  # the bin whose bytes are flipped


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One spool packed once, one shard per format (Parquet: 4 bins per row group)."""
    root = tmp_path_factory.mktemp("verify")
    spool = write_random_spool(root / "spool", num_sequences=120, max_len=400, seed=11)
    plan, _ = pack(spool.lengths, 1024, algorithm="next_fit", seed=0)
    out: dict[str, object] = {"root": root, "spool": spool, "plan": plan,
                              "bins": list(iter_bins(spool, plan, copy=True))}
    for name in format_names():
        options = {"parquet": {"row_group_size": 4}, "arrow_ipc": {"batch_size": 4}}
        receipt = write_shards(spool, plan, root / "clean" / name, format=name,
                               bins_per_shard=10**6, workers=1, **options.get(name, {}))
        out[name] = root / "clean" / name / receipt[0]["shard"]
    return out


def _copy(written: dict[str, object], name: str, tmp_path: Path) -> Path:
    source = Path(written[name])  # type: ignore[arg-type]
    target = tmp_path / source.name
    (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
    return target


def _flip(file: Path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= mask
    file.write_bytes(bytes(data))


def _byte_of(shard: Path, column: str, b: int, position: int) -> tuple[Path, int]:
    """File and byte offset of value ``position`` of bin ``b``'s ``column`` (tokens or mask)."""
    placement = open_shard(shard).placement()
    runs = placement.index.runs(b, b + 1)
    if column == "tokens":
        c, first = placement.tokens, int(runs.token_start[0])
    else:
        c, first = placement.mask, int(runs.mask_start[0])
    return Path(c.path), c.offset + np.dtype(c.dtype).itemsize * (first + position)


@pytest.mark.parametrize("column", ["tokens", "mask"])
@pytest.mark.parametrize("name", TABLE_FORMATS)
def test_verify_catches_a_flipped_byte_naming_file_and_bin(written: dict[str, object],
                                                            name: str, column: str,
                                                            tmp_path: Path) -> None:
    shard = _copy(written, name, tmp_path)
    bins: list[PackedBin] = written["bins"]  # type: ignore[assignment]
    file, offset = _byte_of(shard, column, DAMAGED, 2)  # value 2: not a sequence's last token
    _flip(file, offset, 0x01)
    plain = open_shard(shard)
    assert not bins_equal(plain.read_bin(DAMAGED), bins[DAMAGED])  # silently different...
    reader = open_shard(shard, verify=True)
    assert bins_equal(reader.read_bin(DAMAGED - 1), bins[DAMAGED - 1])  # its neighbours read
    with pytest.raises(FormatError, match=f"{shard.name}: bin {DAMAGED}: checksum mismatch"):
        reader.read_bin(DAMAGED)  # ...unless verified
    with pytest.raises(FormatError, match=f"bin {DAMAGED}: checksum mismatch"):
        reader.read_bins([0, DAMAGED])
    dataset = open_dataset(shard, verify=True)
    with pytest.raises(FormatError, match=f"{shard.name}: bin {DAMAGED}: checksum"):
        dataset[DAMAGED]
    with pytest.raises(FormatError, match=f"bin {DAMAGED}: checksum"):
        dataset.__getitems__([1, DAMAGED])
    assert all(bins_equal(dataset.read_bin(i), bins[i]) for i in range(DAMAGED))


@pytest.mark.parametrize("name", TABLE_FORMATS)
def test_validate_checks_every_bins_checksum(written: dict[str, object], name: str,
                                             tmp_path: Path) -> None:
    """A flip the whole-file checksums no longer see (recomputed after the damage, as a
    careless copy tool would) is still found by the per-bin ones, naming the bin."""
    shard = _copy(written, name, tmp_path)
    summary = open_shard(shard).validate()
    assert summary["bin_checksums"] is True
    file, offset = _byte_of(shard, "tokens", DAMAGED, 2)
    _flip(file, offset, 0x02)
    if shard.is_dir():  # re-sign the manifest's whole-file checksums
        manifest = json.loads((shard / "manifest.json").read_text())
        manifest["files"][file.name] = file_entry(file)
        (shard / "manifest.json").write_text(json.dumps(manifest))
        message = f"bin {DAMAGED}: checksum mismatch"
    else:  # one-file shards: their own whole-file or per-batch checksum speaks first
        message = "checksum mismatch"
    with pytest.raises(FormatError, match=message):
        open_shard(shard).validate()


def test_parquet_pages_carry_the_checksums_and_verify_names_the_bins(
        written: dict[str, object], tmp_path: Path) -> None:
    """Parquet's per-page CRC-32 is its per-block checksum (where DuckDB, polars, HF datasets
    and Megatron-Bridge expect it): a flipped byte in a page fails the read of its row group,
    naming the file and the row group's bins, even with verification turned off, once
    ``verify=True`` asks."""
    import pyarrow.parquet as pq

    shard = _copy(written, "parquet", tmp_path)
    group = DAMAGED // 4  # 4 bins per row group
    for column in (0, 1):  # input_ids, loss_mask
        target = tmp_path / f"damaged_{column}.parquet"
        shutil.copy(shard, target)
        chunk = pq.read_metadata(target).row_group(group).column(column)
        start = chunk.dictionary_page_offset or chunk.data_page_offset
        _flip(target, start + chunk.total_compressed_size // 2, 0x10)
        bins = f"bins {4 * group}..{4 * group + 3}"
        with pytest.raises(FormatError, match=f"damaged_{column}.parquet: row group {group} "
                                              f"\\({bins}\\)"):
            open_shard(target, verify_checksums=False, verify=True).read_bin(DAMAGED)
        with pytest.raises(FormatError, match=f"row group {group}"):
            open_dataset(target)[DAMAGED]  # the default checks the pages too


def test_legacy_has_no_room_and_relies_on_the_invariants(written: dict[str, object],
                                                         tmp_path: Path) -> None:
    """Megatron-Bridge unpickles the file as it is: no checksum. A mask value of 2 (the fuzz
    finding) is refused on every read, verify or not; a changed token cannot be seen."""
    from packlab.formats.legacy_npy_pickle import Writer

    bins: list[PackedBin] = written["bins"]  # type: ignore[assignment]
    damaged = [b.copy() for b in bins[:8]]
    damaged[DAMAGED].loss_mask[0] = 2
    with Writer(tmp_path / "legacy.npy", pack_size=1024, check=False) as writer:
        for packed in damaged:
            writer.write(packed)
    for verify in (False, True):
        reader = open_shard(tmp_path / "legacy.npy", verify=verify)
        assert bins_equal(reader.read_bin(0), bins[0])
        with pytest.raises(PacklabError, match=f"legacy.npy: bin {DAMAGED}: loss_mask values"):
            reader.read_bin(DAMAGED)
    assert "legacy_npy_pickle" in formats_where("IN_RAM")


def test_packed_index_verifies_the_sequences_it_gathers(written: dict[str, object],
                                                        tmp_path: Path) -> None:
    """A spool changed in place (same sizes, so its manifest still matches) gives different
    bins silently unless the shard was opened with verify=True."""
    root = tmp_path / "tree"
    spool_src: Path = written["spool"].path  # type: ignore[union-attr]
    shutil.copytree(spool_src, root / "spool")
    shard = _copy(written, "packed_index", root)
    reader = open_shard(shard, spool=root / "spool")
    seq = int(reader.assignment.bin_indices(DAMAGED)[0])
    offset = int(reader._open_index().spool.offsets[seq])
    _flip(root / "spool" / "tokens.bin", 4 * (offset + 1), 0x01)
    bins: list[PackedBin] = written["bins"]  # type: ignore[assignment]
    assert not bins_equal(open_shard(shard, spool=root / "spool").read_bin(DAMAGED),
                          bins[DAMAGED])
    checked = open_shard(shard, spool=root / "spool", verify=True)
    assert bins_equal(checked.read_bin(0), bins[0])
    with pytest.raises(FormatError, match=f"{shard.name}: bin {DAMAGED}: its sequence 0 "
                                          "differs from the spool"):
        checked.read_bin(DAMAGED)


@pytest.mark.parametrize("name", TABLE_FORMATS)
def test_shards_without_checksums_still_open_and_verify_says_it_cannot(
        written: dict[str, object], name: str, tmp_path: Path) -> None:
    """A shard written before per-bin checksums (rebuilt here by removing them the way the old
    writer left them out) reads and validates as before; verify=True refuses, saying why."""
    shard = _copy(written, name, tmp_path)
    _strip_checksums(name, shard)
    bins: list[PackedBin] = written["bins"]  # type: ignore[assignment]
    reader = open_shard(shard)
    assert all(bins_equal(reader.read_bin(i), bins[i]) for i in range(len(bins)))
    assert reader.validate()["bin_checksums"] is False
    with pytest.raises(FormatError, match="no per-bin checksums.*verify=True cannot"):
        open_shard(shard, verify=True).read_bin(0)


def _strip_checksums(name: str, shard: Path) -> None:
    """The shard as a writer before per-bin checksums left it: no checksum file, section or
    metadata key (the other bytes as they are)."""
    if shard.is_dir():
        manifest = json.loads((shard / "manifest.json").read_text())
        for f in [f for f in manifest["files"] if "checksum" in f]:
            (shard / f).unlink()
            del manifest["files"][f]
        del manifest["bin_checksum"]
        (shard / "manifest.json").write_text(json.dumps(manifest))
    elif name == "pbin":
        from packlab.formats.pbin import TAIL, TRAILER_MAGIC

        data = shard.read_bytes()
        length, _ = TAIL.unpack(data[-TAIL.size:])
        at = len(data) - TAIL.size - length
        footer = json.loads(data[at:at + length])
        del footer["bin_checksum"], footer["sections"]["checksums"]
        body = json.dumps(footer, sort_keys=True).encode()
        shard.write_bytes(data[:at] + body + TAIL.pack(len(body), TRAILER_MAGIC))
    else:
        import pyarrow as pa

        from packlab.formats.shared.arrow_lists import METADATA_KEY, dump_metadata, load_metadata

        with pa.BufferReader(shard.read_bytes()) as source:  # not mapped: rewritten below
            reader = pa.ipc.open_file(source)
            static = load_metadata(reader.schema.metadata[METADATA_KEY], "schema")
            del static["bin_checksum"]
            schema = reader.schema.with_metadata({METADATA_KEY: dump_metadata(static)})
            batches = []
            for k in range(reader.num_record_batches):
                batch, custom = reader.get_batch_with_custom_metadata(k)
                info = load_metadata(custom[METADATA_KEY], "batch")
                del info["bin_checksums"]
                batches.append((batch, dump_metadata(info)))
        with pa.OSFile(str(shard), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for batch, info in batches:
                writer.write_batch(batch, custom_metadata={METADATA_KEY: info})


# -- what it costs (notebook 05) ----------------------------------------------------------------
def test_integrity_costs_measure_every_check_and_the_rule_picks_the_defaults(
        written: dict[str, object]) -> None:
    from packlab.lab.measure.integrity import COSTS, defaults_rule, integrity_costs

    rows = {name: integrity_costs(written[name], samples=40, seed=1)  # type: ignore[arg-type]
            for name in ("memmap_v1", "parquet", "legacy_npy_pickle")}
    mapped = rows["memmap_v1"]
    assert mapped["verify_available"] and mapped["samples"] == 40
    for cost in COSTS:
        assert 0 < mapped[f"{cost}_p50_us"] <= mapped[f"{cost}_p99_us"]
    assert mapped["structure_ns_per_bin"] > 0 and rows["parquet"]["structure_ns_per_bin"] is None
    assert mapped["verify_ratio"] == mapped["verified_p50_us"] / mapped["read_p50_us"]
    rule = defaults_rule({"a": {"verify_ratio": 1.5, "check_bin_ratio": 0.8},
                          "b": {"verify_ratio": 1.05, "check_bin_ratio": 0.02},
                          "c": {"verify_ratio": 1.3, "check_bin_ratio": 0.5}})
    assert rule["verify_added"] == pytest.approx(0.3) and not rule["verify_default"]
    assert rule["check_bin_added"] == pytest.approx(0.5) and not rule["check_bin_default"]
    cheap = defaults_rule({"a": {"verify_ratio": 1.04, "check_bin_ratio": 0.05}})
    assert cheap["verify_default"] and cheap["check_bin_default"]


def test_the_structure_of_every_bin_is_checked_chunk_by_chunk(monkeypatch) -> None:
    """A table checks every bin's structure a few thousand bins at a time: the same table
    whatever the chunk, and a broken bin in a later chunk named."""
    from packlab.formats.read import table as tables

    lengths = np.array([5, 7, 3, 9, 4])
    counts = np.array([1, 2, 1, 3, 1])
    starts = np.array([0, 0, 4, 0, 0, 2, 6, 0], dtype=np.int32)
    token_offsets = np.concatenate(([0], np.cumsum(lengths)))
    seq_offsets = np.concatenate(([0], np.cumsum(counts)))
    tokens = np.arange(int(token_offsets[-1]), dtype=np.int32)
    mask = np.zeros_like(tokens, dtype=np.uint8)

    def table(values: np.ndarray) -> tables.BinTable:
        return tables.BinTable(tokens, mask, values, tables.CsrIndex(token_offsets, seq_offsets),
                               pack_size=16, source="s")

    whole = [table(starts).item(b)["seq_boundaries"].tolist() for b in range(5)]
    assert whole[3] == [0, 2, 6, 9]
    broken = starts.copy()
    broken[6] = 1  # bin 3's starts 0, 2, 1: not increasing
    for chunk in (1, 2, 3):
        monkeypatch.setattr(tables, "CHUNK", chunk)
        assert [table(starts).item(b)["seq_boundaries"].tolist() for b in range(5)] == whole
        with pytest.raises(FormatError, match="s: bin 3: seq_start_id not strictly increasing"):
            table(broken)


def test_sequence_checksums_read_in_windows_match_each_sequence_hashed_alone(
        written: dict[str, object]) -> None:
    """packed_index's per-sequence checksums, read through small windows in file order and
    put back in the order asked, equal each sequence's hash computed directly."""
    from xxhash import xxh3_64_intdigest

    from packlab.formats.packed_index.gather import sequence_checksums

    spool = written["spool"]
    order = np.random.default_rng(4).permutation(spool.num_sequences)  # type: ignore[union-attr]
    tokens, masks = np.asarray(spool.tokens), np.asarray(spool.masks)  # type: ignore[union-attr]
    expected = []
    for s in order.tolist():
        a = int(spool.offsets[s])  # type: ignore[union-attr]
        n = min(int(spool.lengths[s]), 300)  # type: ignore[union-attr]
        expected.append(xxh3_64_intdigest(masks[a:a + n].tobytes(),
                                          xxh3_64_intdigest(tokens[a:a + n].tobytes())))
    for window in (1, 500, 1 << 20):  # a window smaller than a sequence, a few, all of them
        found = sequence_checksums(spool, order, 300, window=window)  # type: ignore[arg-type]
        assert found.tolist() == expected


def test_a_checksum_this_packlab_does_not_know_is_refused_naming_where(written, tmp_path
                                                                     ) -> None:
    """``bin_checksum`` naming another algorithm: refused at open, never read unchecked (one
    rule for manifests, footers and Arrow's metadata: ``records_checksum``)."""
    assert records_checksum({}, "m") is False
    assert records_checksum({"bin_checksum": "xxh3_64"}, "m") is True
    with pytest.raises(FormatError, match="m: per-bin checksum 'crc32'"):
        records_checksum({"bin_checksum": "crc32"}, "m")
    shard = _copy(written, "binidx", tmp_path)
    manifest = json.loads((shard / "manifest.json").read_text())
    (shard / "manifest.json").write_text(json.dumps({**manifest, "bin_checksum": "crc32"}))
    with pytest.raises(FormatError, match=r"manifest.json: per-bin checksum 'crc32'"):
        open_shard(shard)
