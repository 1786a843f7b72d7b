"""Every registered format: random spools and pack sizes read back as the materialized bins;
any format converted to any other and back is identical, bin for bin (content hashes)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import shard_per_format, write_random_spool
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from packlab import open_dataset
from packlab.bins import bin_digest
from packlab.errors import PacklabError
from packlab.formats import format_names, get_format
from packlab.lab.tables import markdown_table
from packlab.loading.dataset import bin_digests
from packlab.loading.discovery import find_shards
from packlab.packing import ALGORITHMS, pack
from packlab.packing.materialize import iter_bins
from packlab.pipeline.shards import write_shards
from packlab.sources import open_shard
from packlab.sources.convert import convert
from packlab.sources.validate import validate_path

FORMATS = format_names()
TARGETS = [name for name in FORMATS if not get_format(name).Writer.NEEDS_SPOOL]


def digests(reader) -> list[str]:
    return [bin_digest(*b) for b in reader.iter_bins()]


@pytest.mark.parametrize("name", FORMATS)
@settings(max_examples=6, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    num_sequences=st.integers(1, 60),
    max_len=st.integers(1, 300),
    pack_size=st.integers(8, 400),
    algorithm=st.sampled_from(sorted(ALGORITHMS) or ["next_fit"]),
    overlong=st.sampled_from(["truncate", "drop"]),
    vocab_size=st.sampled_from([300, 70_000]),
    bins_per_shard=st.integers(1, 20),
)
def test_random_spools_read_back_as_materialized(name, seed, num_sequences, max_len, pack_size,
                                                 algorithm, overlong, vocab_size,
                                                 bins_per_shard) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        spool = write_random_spool(root / "spool", num_sequences=num_sequences, max_len=max_len,
                                   vocab_size=vocab_size, seed=seed)
        lengths = np.asarray(spool.lengths)
        assume(overlong == "truncate" or bool((lengths <= pack_size).any()))
        assignment, report = pack(lengths, pack_size, algorithm=algorithm, seed=seed,
                                  overlong=overlong)
        expected = [b.copy() for b in iter_bins(spool, assignment)]
        write_shards(spool, assignment, root / "out", format=name,
                     bins_per_shard=bins_per_shard, workers=1)
        ds = open_dataset(root / "out")
        assert len(ds) == report.num_bins == len(expected)
        got = ds.read_bins(np.arange(len(ds))[::-1])[::-1]
        for i, (want, have) in enumerate(zip(expected, got, strict=True)):
            assert np.array_equal(have.input_ids, want.input_ids), i
            assert np.array_equal(have.loss_mask, want.loss_mask), i
            assert np.array_equal(have.seq_start_id, want.seq_start_id), i
        assert validate_path(root / "out")["num_tokens"] == report.num_tokens


@pytest.fixture(scope="module")
def source_shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One shard of every format, all holding the same bins."""
    root = tmp_path_factory.mktemp("convert")
    spool = write_random_spool(root / "spool", num_sequences=80, max_len=200, seed=9)
    assignment, _ = pack(spool.lengths, 256, algorithm="next_fit")
    return shard_per_format(spool, assignment, root, FORMATS)


@pytest.mark.parametrize("source", FORMATS)
def test_any_format_to_any_other_and_back_is_identical(source, source_shards, tmp_path) -> None:
    reference = digests(open_shard(source_shards[FORMATS[0]]))
    original = source_shards[source]
    assert digests(open_shard(original)) == reference
    back_format = source if source in TARGETS else TARGETS[0]
    for target in TARGETS:
        there = tmp_path / f"{source}-to-{target}"
        (row,) = convert(original, there, format=target)
        assert row["num_bins"] == len(reference) and row["bytes_after"] > 0
        assert digests(open_shard(there, format=target)) == reference, target
        back = tmp_path / f"{source}-to-{target}-back"
        convert(there, back, format=back_format)
        assert digests(open_shard(back, format=back_format)) == reference, target


def test_directory_conversion_keeps_one_shard_per_input(tmp_path) -> None:
    spool = write_random_spool(tmp_path / "spool", num_sequences=60, seed=2)
    assignment, _ = pack(spool.lengths, 512, algorithm="next_fit")
    src, dst = TARGETS[0], TARGETS[-1]
    write_shards(spool, assignment, tmp_path / "a", format=src, bins_per_shard=5)
    rows = convert(tmp_path / "a", tmp_path / "b", format=dst)
    inputs = find_shards(tmp_path / "a")
    outputs = find_shards(tmp_path / "b")
    assert len(rows) == len(inputs) == len(outputs) > 1
    assert all(name == dst for _, name in outputs)
    assert [p.name.split(".")[0] for p, _ in inputs] == [p.name.split(".")[0] for p, _ in outputs]
    a, b = open_dataset(tmp_path / "a"), open_dataset(tmp_path / "b")
    assert [bin_digest(*a.read_bin(i)) for i in range(len(a))] == \
        [bin_digest(*b.read_bin(i)) for i in range(len(b))]
    # the same job again finishes (here: keeps) its output, as pack does; another is refused
    assert len(convert(tmp_path / "a", tmp_path / "b", format=dst)) == len(rows)
    with pytest.raises(PacklabError, match="already holds another output"):
        convert(tmp_path / "a", tmp_path / "b", format=src)
    assert len(convert(tmp_path / "a", tmp_path / "b", format=dst, overwrite=True)) == len(rows)


@pytest.mark.parametrize("target", FORMATS)
def test_conversion_is_refused_exactly_into_formats_that_need_a_spool(target, source_shards,
                                                                       tmp_path) -> None:
    """A shard that stores a reference to its spool cannot be made from another shard."""
    source = source_shards[TARGETS[0]]
    there = tmp_path / "x"
    if get_format(target).Writer.NEEDS_SPOOL:
        with pytest.raises(PacklabError, match="cannot be converted into"):
            convert(source, there, format=target)
        assert not there.exists()
    else:
        convert(source, there, format=target)
        assert digests(open_shard(there, format=target)) == digests(open_shard(source))


def test_bin_digests_and_markdown_table(source_shards) -> None:
    shard = source_shards[TARGETS[0]]
    expected = digests(open_shard(shard))
    assert bin_digests(shard) == bin_digests(open_dataset(shard)) == expected
    assert bin_digests(shard.parent) == expected
    table = markdown_table(["format", "bytes", "ratio", "ok"], [["parquet", 12345, 0.123456, True]])
    assert table.splitlines() == ["| format | bytes | ratio | ok |", "|---|---|---|---|",
                                  "| parquet | 12,345 | 0.1235 | yes |"]
