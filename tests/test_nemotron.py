"""Nemotron's files as Nemotron writes them: spools (its manifest, no checksums, empty ones)
and output directories (``shard_*.parquet`` beside ``spool/``), through every command.

The files are written in Nemotron's documented byte layout by ``tests/nemotron_layout.py``
(no Nemotron code here), with a length mix packlab was not tuned to.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import one_error_line, run_cli, write_random_spool
from nemotron_layout import (
    chat_sft_extra,
    length_mix,
    random_sequences,
    write_nemotron_parquet,
    write_nemotron_spool,
)

from packlab.bins import bins_equal
from packlab.errors import FormatError
from packlab.formats import format_names, formats_where
from packlab.packing import pack
from packlab.packing.materialize import BinMaterializer, iter_bins
from packlab.sources import open_dataset
from packlab.spool import FILES, NEMOTRON_DTYPE_KEYS, SPOOL_RECORD, SpoolReader

PACK_SIZE = 2048


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """A Nemotron spool of 20,000 sequences (3.2M tokens; 350 longer than the pack size)."""
    path = tmp_path_factory.mktemp("nemotron") / "spool" / "shard_000000"
    sequences = random_sequences(length_mix(20_000, seed=7), seed=8)
    write_nemotron_spool(path, sequences, chat_sft_extra(0))
    return path, sequences


def test_a_nemotron_spool_reads_exactly(big: tuple[Path, list]) -> None:
    path, sequences = big
    on_disk = json.loads((path / SPOOL_RECORD).read_text())
    assert "num_tokens" not in on_disk and "files" not in on_disk  # Nemotron's keys only
    spool = SpoolReader(path)
    spool.verify()  # structure (offsets follow lengths, masks 0/1); no checksums to check
    assert spool.num_sequences == 20_000
    assert spool.num_tokens == on_disk["total_tokens"] == sum(t.size for t, _ in sequences)
    for i in (0, 1, 9_999, 19_999):
        tokens, mask = spool.read_sequence(i)
        np.testing.assert_array_equal(tokens, sequences[i][0])
        np.testing.assert_array_equal(mask, sequences[i][1])


def test_inspect_keeps_and_shows_nemotron_keys(big: tuple[Path, list], capsys) -> None:
    code, out, _ = run_cli(capsys, "inspect", big[0], "--json")
    assert code == 0
    info = json.loads(out)
    assert info["num_sequences"] == 20_000
    extra = info["extra"]
    assert extra["shard_id"] == "shard_000000" and extra["chat_template"] == "nano3"
    assert extra["tokenization_stats"]["num_errors"] == 0
    assert extra["input_files"] == ["/data/chat/part-00000.jsonl"]
    code, out, _ = run_cli(capsys, "inspect", big[0])
    assert code == 0 and "extra.shard_id" in out and "extra.seed" in out


def test_plans_packs_every_format_validates_and_reads_back(big: tuple[Path, list], tmp_path,
                                                           capsys) -> None:
    path, _ = big
    code, out, _ = run_cli(capsys, "plan", path, "--pack-size", PACK_SIZE, "--seed", 3,
                           "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["num_sequences"] == 20_000 and plan["truncated"] > 0
    spool = SpoolReader(path)
    assignment, _ = pack(spool.lengths, PACK_SIZE, seed=3)
    assert plan["num_bins"] == assignment.num_bins
    expected = [b.copy() for b in iter_bins(spool, assignment)]
    for name in format_names():
        out_dir = tmp_path / name
        code, _, err = run_cli(capsys, "pack", path, out_dir, "--format", name, "--pack-size",
                               PACK_SIZE, "--seed", 3, "--bins-per-shard", 500)
        assert code == 0, (name, err)
        code, out, err = run_cli(capsys, "validate", out_dir, "--json")
        assert code == 0, (name, err)
        assert json.loads(out)["num_bins"] == assignment.num_bins
        dataset = open_dataset(out_dir)
        assert len(dataset) == len(expected)
        for b, want in enumerate(expected):
            got = dataset.read_bin(b)
            assert bins_equal(got, want), (name, b)


def test_packed_index_records_checksums_the_spool_lacks(big: tuple[Path, list], tmp_path,
                                                        capsys) -> None:
    spool_dir = tmp_path / "spool"
    shutil.copytree(big[0], spool_dir)
    out = tmp_path / "index"
    name = formats_where("NEEDS_SPOOL")[0]
    code, _, err = run_cli(capsys, "pack", spool_dir, out, "--format", name, "--pack-size",
                           PACK_SIZE, "--bins-per-shard", 400)
    assert code == 0, err
    shards = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(shards) > 1
    recorded = [json.loads((s / "manifest.json").read_text())["spool"] for s in shards]
    assert all(r["files_from"] == "computed" for r in recorded)
    assert all(r["files"] == recorded[0]["files"] for r in recorded)  # hashed once, shared
    assert set(recorded[0]["files"]) == set(FILES.values())
    assert run_cli(capsys, "validate", out)[0] == 0
    # a changed byte in the spool: the checksums recorded at pack time catch it
    tokens = spool_dir / FILES["tokens"]
    data = bytearray(tokens.read_bytes())
    data[1234] ^= 0x40
    tokens.write_bytes(bytes(data))
    code, _, err = run_cli(capsys, "validate", out)
    assert code == 2
    one_error_line(err, tokens, "checksum mismatch", prefix="packlab validate: error:")
    # a spool that lost bytes is refused at open (sizes recorded), naming the spool
    tokens.write_bytes(bytes(data[:-4]))
    with pytest.raises(FormatError, match="its spool is missing or changed"):
        open_dataset(out)


def test_an_empty_nemotron_spool_gives_one_clear_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "spool" / "shard_000003"
    write_nemotron_spool(path, [], chat_sft_extra(3))
    assert all((path / name).stat().st_size == 0 for name in FILES.values())
    for argv in (("inspect", path), ("plan", path, "--pack-size", 64),
                 ("pack", path, tmp_path / "o", "--format", format_names()[0],
                  "--pack-size", 64)):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2, argv
        line = one_error_line(err, path, "empty spool", prefix=f"packlab {argv[0]}: error:")
        assert "Traceback" not in line


@pytest.mark.parametrize(("change", "message"), [
    ({"total_tokens": 5}, "num_tokens .* but total_tokens 5"),
    ({"tokens_dtype": "int64"}, r"tokens dtype int64 \(tokens_dtype\)"),
    ({"lengths_dtype": "uint64"}, r"lengths dtype uint64 \(lengths_dtype\)"),
    ({"mask_dtype": "not-a-dtype"}, r"masks dtype not-a-dtype \(mask_dtype\)"),
])
def test_a_manifest_that_contradicts_itself_is_refused(tmp_path: Path, change: dict,
                                                       message: str) -> None:
    spool = write_random_spool(tmp_path / "s", num_sequences=5)
    manifest = json.loads((spool.path / SPOOL_RECORD).read_text())
    (spool.path / SPOOL_RECORD).write_text(json.dumps({**manifest, **change}))
    with pytest.raises(FormatError, match=message):
        SpoolReader(spool.path)


def test_a_packlab_spool_is_a_nemotron_spool(tmp_path: Path) -> None:
    """packlab's manifest carries every key Nemotron writes, with Nemotron's values, and the
    files read the way Nemotron's reader reads them (offsets uint64, lengths uint32)."""
    spool = write_random_spool(tmp_path / "s", num_sequences=40, seed=5)
    mine = json.loads((spool.path / SPOOL_RECORD).read_text())
    theirs = write_nemotron_spool(tmp_path / "n", [spool.read_sequence(i)
                                                   for i in range(spool.num_sequences)])
    for key in theirs:
        assert mine[key] == theirs[key], key
    assert set(NEMOTRON_DTYPE_KEYS.values()) <= set(mine)
    for name in FILES.values():
        assert (spool.path / name).read_bytes() == (tmp_path / "n" / name).read_bytes()
    offsets = np.frombuffer((spool.path / "offsets.bin").read_bytes(), dtype=np.uint64)
    lengths = np.frombuffer((spool.path / "lengths.bin").read_bytes(), dtype=np.uint32)
    tokens = np.frombuffer((spool.path / "tokens.bin").read_bytes(), dtype=np.int32)
    i = 17
    np.testing.assert_array_equal(tokens[int(offsets[i]):int(offsets[i] + lengths[i])],
                                  spool.read_sequence(i)[0])


# -- Nemotron's output directory: shard_*.parquet beside spool/ ------------------------------
@pytest.fixture(scope="module")
def nemotron_output(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """Two packed Parquet shards beside the spools they came from, plus an empty spool (a
    shard whose input yielded nothing) and one still being written."""
    out = tmp_path_factory.mktemp("nemotron_out")
    sequences = random_sequences(length_mix(3_000, seed=1), seed=2)
    bins = []
    for i in range(2):
        spool_dir = out / "spool" / f"shard_{i:06d}"
        write_nemotron_spool(spool_dir, sequences[i * 1500:(i + 1) * 1500], chat_sft_extra(i))
        spool = SpoolReader(spool_dir)
        assignment, _ = pack(spool.lengths, 4096, seed=i)
        shard = [b.copy() for b in iter_bins(spool, assignment)]
        write_nemotron_parquet(out / f"shard_{i:06d}.parquet", shard)
        bins += shard
    write_nemotron_spool(out / "spool" / "shard_000002", [], chat_sft_extra(2))
    unfinished = out / "spool" / "shard_000003"
    unfinished.mkdir()
    (unfinished / "tokens.bin.tmp").write_bytes(b"\0" * 8)
    return out, bins


def test_a_nemotron_output_directory_opens_as_a_dataset(nemotron_output) -> None:
    out, bins = nemotron_output
    dataset = open_dataset(out)
    assert [p.name for p in dataset.shards] == ["shard_000000.parquet",
                                                "shard_000001.parquet"]
    assert len(dataset) == len(bins)
    for b in range(0, len(bins), 7):
        assert bins_equal(dataset.read_bin(b), bins[b])


def test_commands_read_a_nemotron_output_directory(nemotron_output, tmp_path, capsys) -> None:
    out, bins = nemotron_output
    code, text, err = run_cli(capsys, "validate", out, "--json")
    assert code == 0, err
    result = json.loads(text)
    assert result["num_shards"] == 2 and result["num_bins"] == len(bins)
    code, text, err = run_cli(capsys, "inspect", out / "shard_000000.parquet", "--json")
    assert code == 0 and json.loads(text)["format"] == "parquet", err
    code, text, err = run_cli(capsys, "query", "SELECT count(*) AS n, sum(packed_len) AS t "
                              "FROM bins", "--data", out, "--format", "json")
    assert code == 0, err
    rows = json.loads(text)["rows"]
    assert rows[0]["n"] == len(bins) and rows[0]["t"] == sum(b.packed_len for b in bins)
    code, _, err = run_cli(capsys, "convert", out, tmp_path / "c", "--format",
                           formats_where("RAW_RUNS")[0])
    assert code == 0, err
    converted = open_dataset(tmp_path / "c")
    assert all(bins_equal(converted.read_bin(b), bins[b]) for b in range(0, len(bins), 5))


def test_the_spool_folder_is_not_a_dataset(nemotron_output, capsys) -> None:
    out, _ = nemotron_output
    code, _, err = run_cli(capsys, "validate", out / "spool")
    assert code == 2
    one_error_line(err, out / "spool", "folder of spools", prefix="packlab validate: error:")


def test_a_stray_entry_beside_nemotron_shards_is_still_an_error(nemotron_output, tmp_path
                                                                ) -> None:
    out, _ = nemotron_output
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "spool" / "notes").mkdir()  # a folder that is not a spool: spool/ is no longer
    with pytest.raises(FormatError, match="spool: not a shard of any known format"):
        open_dataset(copy)


def test_bins_of_a_nemotron_spool_match_the_materializer(big: tuple[Path, list]) -> None:
    """Nemotron and packlab align the loss mask the same way (per sub-sequence, last 0)."""
    spool = SpoolReader(big[0])
    assignment, _ = pack(spool.lengths, PACK_SIZE, seed=0)
    materializer = BinMaterializer(spool, assignment)
    b = materializer.materialize(0)
    seqs = assignment.bin_indices(0)
    pos = 0
    for s in seqs.tolist():
        tokens, mask = spool.read_sequence(s)
        n = min(tokens.size, PACK_SIZE)
        np.testing.assert_array_equal(b.input_ids[pos:pos + n], tokens[:n])
        np.testing.assert_array_equal(b.loss_mask[pos:pos + n - 1], mask[1:n])
        assert b.loss_mask[pos + n - 1] == 0
        pos += n


def test_spools_without_checksums_keep_distinct_identities(tmp_path: Path) -> None:
    """Two Nemotron spools of equal counts but different tokens hash apart (a layout rerun
    must never take one for the other)."""
    from packlab.pipeline.layout.hashes import spool_identity

    sequences = random_sequences(length_mix(50, seed=1), seed=2)
    changed = [(t.copy(), m) for t, m in sequences]
    changed[10][0][0] ^= 1
    write_nemotron_spool(tmp_path / "a", sequences)
    write_nemotron_spool(tmp_path / "b", changed)
    a, b = SpoolReader(tmp_path / "a"), SpoolReader(tmp_path / "b")
    assert (a.num_sequences, a.num_tokens) == (b.num_sequences, b.num_tokens)
    assert spool_identity(a) != spool_identity(b)
    assert spool_identity(a) == spool_identity(SpoolReader(tmp_path / "a"))
