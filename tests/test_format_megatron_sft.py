"""``megatron_sft`` against Megatron-core's own code and Megatron-Bridge's item schema.

Bridge's ``.sft`` module (``write_packed_indexed_dataset``, commit ``c91ec672``) is not in the
0.6.2 release the registry has, so compatibility is shown with what it is built on: Bridge
writes a pair with megatron-core's ``IndexedDatasetBuilder`` (``dtype=np.int32``, one
``add_item`` and one ``end_document`` per pack, then ``finalize``), and reads it with
megatron-core's ``IndexedDataset``. Here the builder writes pairs from rows encoded from the
facts (magic, version, count, starts, token words), packlab's pairs must be the same bytes,
``IndexedDataset`` must read packlab's pairs unchanged, and a pair the builder wrote (no
sidecar: as Bridge leaves it) must read, validate and convert item-exact, by every name
Bridge's resolver accepts, and be refused where Bridge refuses it.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import write_random_spool
from sft_pairs import builder_pair, item_from_facts

from packlab.bins import PackedBin, bins_equal
from packlab.cli import main
from packlab.errors import FormatError, PacklabError
from packlab.formats import get_format
from packlab.packing import pack
from packlab.packing.materialize import iter_bins
from packlab.sources import open_dataset, open_shard, open_writer
from packlab.sources.convert import convert
from packlab.sources.validate import validate_path

SFT = get_format("megatron_sft")

# Bridge's own test row (``_make_row`` in the unit tests of its packed indexed module) and its
# item, word by word: magic "SFTB", version 1, 2 sequences, starts 0 and 3, then each token's
# id with its loss-mask bit on top (11, 20 and 21 are trained on: their words are negative).
ROW = PackedBin(np.array([10, 11, 12, 20, 21, 22], dtype=np.int32),
                np.array([0, 1, 0, 1, 1, 0], dtype=np.uint8), np.array([0, 3], dtype=np.int32))
ROW_WORDS = [0x53465442, 1, 2, 0, 3,
             10, 11 - 2**31, 12, 20 - 2**31, 21 - 2**31, 22]


def write_pair(path: Path, bins: list[PackedBin], pack_size: int = 1024) -> Path:
    with open_writer("megatron_sft", path, pack_size=pack_size, num_bins=len(bins)) as writer:
        for packed in bins:
            writer.write(packed)
    return Path(path)


@pytest.fixture(scope="module")
def bins(tmp_path_factory: pytest.TempPathFactory) -> list[PackedBin]:
    root = tmp_path_factory.mktemp("sft")
    spool = write_random_spool(root / "spool", num_sequences=240, max_len=300, seed=5)
    assignment, _ = pack(spool.lengths, 1024, seed=0)
    return list(iter_bins(spool, assignment, copy=True))


# -- the bytes -----------------------------------------------------------------------------------
def test_the_item_is_bridges_row_word_by_word(tmp_path: Path) -> None:
    """Bridge's test row, written by packlab: the ``.bin`` holds exactly its words, the
    ``.idx`` is megatron-core's index of one int32 item of 11 words, one document."""
    idx = write_pair(tmp_path / "train.sft.idx", [ROW], pack_size=16)
    assert np.fromfile(tmp_path / "train.sft.bin", dtype="<i4").tolist() == ROW_WORDS
    assert item_from_facts(ROW).tolist() == ROW_WORDS
    header = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, 1, 2)
    assert idx.read_bytes() == header + struct.pack("<i", 11) + struct.pack("<q", 0) \
        + struct.pack("<2q", 0, 1)
    # and the same row written by the builder reads back as the row
    theirs = builder_pair(tmp_path / "bridge" / "train.sft", [np.array(ROW_WORDS)])
    assert bins_equal(open_shard(theirs).read_bin(0), ROW)
    assert open_dataset(theirs)[0]["seq_boundaries"].tolist() == [0, 3, 6]


def test_packlab_writes_what_megatron_cores_builder_writes(bins, tmp_path: Path) -> None:
    ours = write_pair(tmp_path / "ours" / "shard.sft.idx", bins)
    theirs = builder_pair(tmp_path / "theirs" / "shard.sft", [item_from_facts(b) for b in bins])
    assert (tmp_path / "ours/shard.sft.bin").read_bytes() == \
        (tmp_path / "theirs/shard.sft.bin").read_bytes()
    assert ours.read_bytes() == theirs.read_bytes()
    assert sorted(p.name for p in ours.parent.iterdir()) == [
        "shard.sft.bin", "shard.sft.idx", "shard.sft.packlab"]  # the sidecar is packlab's own


def test_megatron_cores_indexed_dataset_reads_packlabs_pairs_unchanged(bins, tmp_path: Path
                                                                       ) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    write_pair(tmp_path / "train.sft.idx", bins)
    dataset = IndexedDataset(str(tmp_path / "train.sft"))
    try:
        assert len(dataset) == len(bins)
        assert dataset.document_indices.tolist() == list(range(len(bins) + 1))
        for i, packed in enumerate(bins):
            assert np.array_equal(dataset[i], item_from_facts(packed)), i
    finally:
        del dataset


# -- Bridge's pairs, by every name Bridge's resolver accepts --------------------------------------
@pytest.fixture
def bridge_dir(bins, tmp_path: Path) -> Path:
    """Three pairs as Bridge leaves them (no sidecar; a publication lock beside one)."""
    folder = tmp_path / "bridge"
    for k, part in enumerate((bins[:5], bins[5:12], bins[12:])):
        builder_pair(folder / f"training_{k}.sft", [item_from_facts(b) for b in part])
    (folder / "training_0.sft.lock").write_bytes(b"")
    return folder


@pytest.mark.parametrize(("name", "first", "count"), [
    ("training_1.sft", 5, 7), ("training_1.sft.bin", 5, 7), ("training_1.sft.idx", 5, 7),
    (".", 0, None), ("*.sft", 0, None), ("*.sft.idx", 0, None), ("training_[12]*", 5, None)])
def test_bridges_pairs_open_item_exact_by_every_name(bins, bridge_dir: Path, name: str,
                                                     first: int, count: int | None) -> None:
    dataset = open_dataset(bridge_dir / name)
    expected = bins[first:] if count is None else bins[first:first + count]
    assert dataset.formats == ["megatron_sft"] * len(dataset.shards)
    assert len(dataset) == len(expected)
    for i, packed in enumerate(expected):
        item = dataset[i]
        assert np.array_equal(item["input_ids"], packed.input_ids), i
        assert np.array_equal(item["loss_mask"], packed.loss_mask), i
        assert item["seq_boundaries"].tolist() == [*packed.seq_start_id.tolist(),
                                                   packed.packed_len]


def test_a_pair_without_sidecar_validates_and_converts_both_ways_byte_for_byte(
        bins, bridge_dir: Path, tmp_path: Path) -> None:
    bridge = bridge_dir / "training_1.sft.idx"
    reader = open_shard(bridge)
    assert not reader.has_checksums
    assert reader.num_tokens == sum(b.packed_len for b in bins[5:12])
    assert reader.pack_size == max(b.packed_len for b in bins[5:12])  # its longest bin
    assert open_shard(bridge, pack_size=1024).pack_size == 1024
    with pytest.raises(FormatError, match="no per-bin checksums"):
        open_shard(bridge, verify=True)
    summary = validate_path(bridge)
    assert (summary["num_bins"], summary["num_tokens"]) == (7, reader.num_tokens)
    convert(bridge, str(tmp_path / "one.parquet"), format="parquet")
    convert(tmp_path / "one.parquet", str(tmp_path / "back" / "training_1.sft.idx"),
            format="megatron_sft")
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"back/training_1.sft{suffix}").read_bytes() == \
            (bridge_dir / f"training_1.sft{suffix}").read_bytes()
    assert open_shard(tmp_path / "back/training_1.sft.idx", verify=True).has_checksums
    convert(bridge_dir, str(tmp_path / "all"), format="arrow_ipc")  # a directory: a dataset
    assert [b.input_ids.tolist() for b in open_dataset(tmp_path / "all").read_bins(range(
        len(bins)))] == [b.input_ids.tolist() for b in bins]


def test_a_lone_data_file_or_a_stale_sidecar_is_refused_naming_it(bins, tmp_path: Path) -> None:
    write_pair(tmp_path / "a.sft.idx", bins[:3])
    (tmp_path / "a.sft.idx").rename(tmp_path / "moved.idx")
    with pytest.raises(FormatError, match=r"a\.sft\.bin: no a\.sft\.idx beside it"):
        open_dataset(tmp_path)
    (tmp_path / "moved.idx").unlink()
    pair = write_pair(tmp_path / "b" / "b.sft.idx", bins[:3])
    sidecar = (tmp_path / "b/b.sft.packlab").read_bytes()
    builder_pair(tmp_path / "b" / "b.sft", [item_from_facts(b) for b in bins[3:5]])
    (tmp_path / "b/b.sft.packlab").write_bytes(sidecar)  # rewritten without its sidecar
    with pytest.raises(FormatError, match=r"b\.sft\.packlab: records 3 bins, its pair holds 2"):
        open_shard(pair)
    write_pair(tmp_path / "c" / "c.sft.idx", bins[:3])
    sidecar = (tmp_path / "c/c.sft.packlab").read_bytes()
    builder_pair(tmp_path / "c" / "c.sft", [item_from_facts(b) for b in bins[2:5]])
    (tmp_path / "c/c.sft.packlab").write_bytes(sidecar)  # as many bins, other bytes
    with pytest.raises(FormatError, match=r"c\.sft\.bin: \d+ bytes, its sidecar c\.sft\.packlab"):
        open_shard(tmp_path / "c/c.sft.idx")


def test_a_token_id_over_31_bits_is_refused_by_the_writer(tmp_path: Path) -> None:
    wide = PackedBin(np.array([5, 2**31], dtype=np.int64), np.zeros(2, dtype=np.uint8),
                     np.array([0], dtype=np.int32))
    with pytest.raises(PacklabError, match=r"bin 0: token id 2147483648 over 2\*\*31-1"):
        write_pair(tmp_path / "w.sft.idx", [wide])
    assert list(tmp_path.iterdir()) == []


# -- what Bridge refuses, refused with one line naming the file and the bin -------------------------

DAMAGE = {
    "bad magic": ([0x53465443, 1, 2, 0, 3, 10, 11, 12, 20, 21, 22], r"bin 1: bad magic 0x53465443"),
    "version": ([0x53465442, 2, 2, 0, 3, 10, 11, 12, 20, 21, 22], r"bin 1: item version 2"),
    "no boundaries": ([0x53465442, 1, 0, 10, 11, 12, 20, 21, 22], r"bin 1: boundary count 0"),
    "boundaries past the row": ([0x53465442, 1, 9, 0, 3, 10, 11], r"bin 1: boundary count 9"),
    "starts not from 0": ([0x53465442, 1, 2, 1, 3, 10, 11, 12, 20, 21, 22],
                          r"bin 1: sequence starts \[1, 3\]"),
    "starts not increasing": ([0x53465442, 1, 2, 0, 0, 10, 11, 12, 20, 21, 22],
                              r"bin 1: sequence starts \[0, 0\]"),
    "a start past the tokens": ([0x53465442, 1, 2, 0, 6, 10, 11, 12, 20, 21, 22],
                                r"bin 1: sequence starts \[0, 6\]"),
    "too few words": ([0x53465442, 1, 1, 0], r"bin 1: index entry .* under 5 words"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_what_bridge_refuses_is_one_line_naming_the_file_and_the_bin(
        damage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    words, message = DAMAGE[damage]
    idx = builder_pair(tmp_path / "bad.sft", [np.array(ROW_WORDS), np.array(words)])
    with pytest.raises(FormatError, match=message) as caught:
        reader = open_shard(idx)
        reader.read_bin(0)
        reader.read_bin(1)
    assert "bad.sft" in str(caught.value) and "\n" not in str(caught.value)
    assert main(["validate", str(idx)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.sft" in err[0] and "bin 1" in err[0], err


def test_an_index_of_another_dtype_is_refused(tmp_path: Path) -> None:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(tmp_path / "u16.sft.bin"), dtype=np.uint16)
    builder.add_item(torch.tensor([1, 2, 3, 4, 5], dtype=torch.int64))
    builder.end_document()
    builder.finalize(str(tmp_path / "u16.sft.idx"))
    with pytest.raises(FormatError, match=r"u16\.sft\.idx: dtype code 8 \(uint16\); a packed SFT "
                                          r"pair holds int32 words"):
        open_shard(tmp_path / "u16.sft.idx")


# -- the files know their shard, the output discipline -------------------------------------------
def test_a_file_exchanged_with_another_shards_is_refused_at_the_first_read(
        bins, tmp_path: Path) -> None:
    """Two shards of the same shape (same sizes, other tokens): a ``.bin`` or a sidecar
    exchanged between them is refused before a bin is served, naming the file."""
    other = [PackedBin(b.input_ids + 1, b.loss_mask, b.seq_start_id) for b in bins[:3]]
    write_pair(tmp_path / "a" / "x.sft.idx", bins[:3])
    write_pair(tmp_path / "b" / "x.sft.idx", other)
    assert open_shard(tmp_path / "a/x.sft.idx").read_bin(1).input_ids.tolist() == \
        bins[1].input_ids.tolist()
    for name in ("x.sft.bin", "x.sft.packlab"):
        mixed = tmp_path / f"mixed_{name}"
        mixed.mkdir()
        for part in ("x.sft.idx", "x.sft.bin", "x.sft.packlab"):
            source = tmp_path / ("b" if part == name else "a") / part
            (mixed / part).write_bytes(source.read_bytes())
        with pytest.raises(FormatError, match=r"x\.sft\.bin: not this shard's"):
            open_shard(mixed / "x.sft.idx").read_bin(0)
        with pytest.raises(FormatError, match=r"x\.sft\.bin: (not this shard's|checksum differs)"):
            validate_path(mixed / "x.sft.idx")


def test_convert_never_replaces_a_pair_it_did_not_write_nor_a_lone_companion(
        bins, bridge_dir: Path, tmp_path: Path) -> None:
    """--overwrite replaces packlab's own pair only: a pair Bridge wrote (no sidecar), or a
    person's file where the pair's ``.bin`` would go, is refused and kept byte for byte."""
    source = write_pair(tmp_path / "src" / "s.sft.idx", bins[:3])
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    for suffix in (".bin", ".idx"):
        (foreign / f"t.sft{suffix}").write_bytes((bridge_dir / f"training_1.sft{suffix}")
                                                 .read_bytes())
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "u.sft.bin").write_bytes(b"a person's file\n")
    for target, what in ((foreign / "t.sft.idx", "t.sft.idx: exists and is not"),
                         (lone / "u.sft.idx", r"u\.sft\.bin: exists, and writing")):
        before = {p: p.read_bytes() for p in target.parent.iterdir()}
        with pytest.raises(PacklabError, match=what):
            convert(source, str(target), format="megatron_sft", overwrite=True)
        assert {p: p.read_bytes() for p in target.parent.iterdir()} == before
    convert(source, str(tmp_path / "mine.sft.idx"), format="megatron_sft")
    convert(source, str(tmp_path / "mine.sft.idx"), format="megatron_sft", overwrite=True)
    assert validate_path(tmp_path / "mine.sft.idx")["num_bins"] == 3


@pytest.mark.parametrize("name", ["training_1.sft", "training_1.sft.bin", "training_1.sft.idx"])
def test_open_shard_takes_any_name_of_a_pair(bins, bridge_dir: Path, name: str) -> None:
    """``open_shard`` (format detected, as the command line does) by either file or the prefix."""
    reader = open_shard(bridge_dir / name)
    assert reader.FORMAT == "megatron_sft" and reader.num_bins == 7
    assert bins_equal(reader.read_bin(6), bins[11])


def test_sizes_and_the_page_cache_count_every_file_of_a_pair(bridge_dir: Path,
                                                             tmp_path: Path) -> None:
    """``bench size`` and the cold-cache measurements see the ``.bin`` (and the sidecar) beside
    the ``.idx`` a shard is named by, not the index alone."""
    from packlab.lab.measure.pagecache import shard_files
    from packlab.lab.measure.size import size_report

    pairs = sorted(bridge_dir.glob("*.sft.[bi][id][nx]"))
    report = size_report(bridge_dir)
    assert report["bytes_on_disk"] == sum(p.stat().st_size for p in pairs)
    assert sorted(report["files"]) == sorted(p.name for p in pairs)
    ours = write_pair(tmp_path / "p" / "one.sft.idx", [ROW], pack_size=16)
    assert [p.name for p in shard_files(ours)] == ["one.sft.bin", "one.sft.packlab",
                                                   "one.sft.idx"]
    assert size_report(ours)["bytes_on_disk"] == sum(
        p.stat().st_size for p in ours.parent.iterdir())
