"""SQL over the shards: views agree with the readers, invariants in SQL agree with validate,
polars answers the same questions, and bad queries are one clear line."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import run_cli, write_random_spool
from hypothesis import given, settings
from hypothesis import strategies as st

from packlab import open_dataset
from packlab.cli import main
from packlab.errors import FormatError, InvariantError, PacklabError
from packlab.lab.measure.queries import measure
from packlab.lab.tamper import RULES, break_bin
from packlab.packing import pack
from packlab.pipeline.layout import build_layout, known_splits
from packlab.pipeline.shards import write_shards
from packlab.query import connect, execute, query
from packlab.query.lazy import frames
from packlab.query.questions import QUESTIONS, answer, dataset_card, histogram
from packlab.query.views import close
from packlab.sources.validate import validate_path

SPLITS = "train=0.7,valid=0.2,test=0.1"


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("query")
    write_random_spool(root / "a", num_sequences=300, max_len=60, seed=21)
    write_random_spool(root / "b", num_sequences=120, max_len=60, seed=22)
    build_layout([root / "a", root / "b"], root / "out", format="parquet", pack_size=128,
                 splits=SPLITS, weights="0.6,0.4", bins_per_shard=9, workers=1)
    return root / "out"


def reader_counts(out: Path, split: str) -> dict[str, int]:
    """What the readers say about a split: bins, tokens, sequences, loss tokens."""
    ds = open_dataset(out, split=split)
    items = list(ds)
    return {"bins": len(ds), "tokens": int(ds.packed_lengths().sum()),
            "sequences": sum(len(i["seq_boundaries"]) - 1 for i in items),
            "loss_tokens": sum(int(i["loss_mask"].sum()) for i in items)}


def sql_counts(con, split: str) -> dict[str, int]:
    row = query(con, "SELECT count(*) AS bins, sum(packed_len) AS tokens, sum(num_seqs) AS "
                     "sequences, sum(loss_tokens) AS loss_tokens FROM bins WHERE split = ?",
                [split])[0]
    return {k: int(v or 0) for k, v in row.items()}  # sum() over no rows is NULL


@settings(max_examples=6, deadline=None)
@given(num_sequences=st.integers(20, 400), max_len=st.integers(1, 90),
       pack_size=st.sampled_from([90, 128, 200]), bins_per_shard=st.integers(1, 40),
       seed=st.integers(0, 3), algorithm=st.sampled_from(["first_fit_decreasing", "next_fit"]))
def test_sql_counts_equal_the_readers_on_random_layouts(num_sequences, max_len, pack_size,
                                                        bins_per_shard, seed, algorithm) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_random_spool(root / "s", num_sequences=num_sequences, max_len=max_len, seed=seed)
        build_layout([root / "s"], root / "out", format="parquet", pack_size=pack_size,
                     splits=SPLITS, bins_per_shard=bins_per_shard, seed=seed,
                     algorithm=algorithm, workers=1)
        out = root / "out"
        con = connect(out)
        for split in known_splits(out):
            if not (out / "splits" / split).is_dir() or not any((out / "splits" / split).iterdir()):
                assert sql_counts(con, split)["bins"] == 0
                continue
            want = reader_counts(out, split)
            assert sql_counts(con, split) == want
            seqs = query(con, "SELECT count(*) AS n, sum(length) AS t, sum(loss_tokens) AS l "
                              "FROM sequences WHERE split = ?", [split])[0]
            assert (seqs["n"], seqs["t"], seqs["l"]) == (
                want["sequences"], want["tokens"], want["loss_tokens"])
            shards = query(con, "SELECT sum(num_bins) AS b, sum(num_tokens) AS t FROM shards "
                                "WHERE split = ?", [split])[0]
            assert (shards["b"], shards["t"]) == (want["bins"], want["tokens"])
        assert query(con, "SELECT count(*) AS n FROM violations")[0]["n"] == 0
        for name in QUESTIONS:
            assert answer("duckdb", name, out) == answer("polars", name, out), name


def test_bins_and_sequences_match_the_reader_row_by_row(layout: Path) -> None:
    con = connect(layout, split="valid", tokens=True)
    ds = open_dataset(layout, split="valid")
    bins = query(con, "SELECT packed_len, num_seqs, loss_tokens FROM bins "
                      "ORDER BY shard, row")
    items = list(ds)
    assert [(b["packed_len"], b["num_seqs"], b["loss_tokens"]) for b in bins] == [
        (len(i["input_ids"]), len(i["seq_boundaries"]) - 1, int(i["loss_mask"].sum()))
        for i in items]
    seqs = query(con, "SELECT start, length, loss_tokens FROM sequences "
                      "ORDER BY shard, row, seq")
    want = [(int(a), int(b - a), int(i["loss_mask"][a:b].sum())) for i in items
            for a, b in zip(i["seq_boundaries"][:-1], i["seq_boundaries"][1:], strict=True)]
    assert [(s["start"], s["length"], s["loss_tokens"]) for s in seqs] == want
    tokens = execute(con, "SELECT token, loss FROM tokens ORDER BY shard, row, pos").fetchall()
    assert np.array_equal(np.array([t for t, _ in tokens]),
                          np.concatenate([i["input_ids"] for i in items]))
    assert np.array_equal(np.array([m for _, m in tokens]),
                          np.concatenate([i["loss_mask"] for i in items]))


def test_card_histograms_and_engines_agree(layout: Path) -> None:
    con = connect(layout)
    card = dataset_card(con)
    assert [r["split"] for r in card] == ["train", "valid", "test"]
    for row in card:
        want = reader_counts(layout, row["split"])
        assert (row["bins"], row["tokens"]) == (want["bins"], want["tokens"])
        assert row["efficiency"] == pytest.approx(want["tokens"] / (want["bins"] * 128))
        assert row["loss_fraction"] == pytest.approx(want["loss_tokens"] / want["tokens"])
    values, counts = histogram(con, "packed_len")
    assert sum(counts) == sum(r["bins"] for r in card) and values == sorted(values)
    lf = frames(layout)
    assert lf["bins"].collect().height == sum(counts)
    for name in QUESTIONS:
        assert answer("duckdb", name, layout) == answer("polars", name, layout), name


@pytest.mark.parametrize("how", RULES)
def test_a_broken_bin_is_found_by_sql_and_by_validate(how: str, tmp_path: Path) -> None:
    write_random_spool(tmp_path / "s", num_sequences=200, max_len=40, seed=5)
    out = tmp_path / "out"
    build_layout([tmp_path / "s"], out, format="parquet", pack_size=128, splits="train=1",
                 bins_per_shard=10, workers=1)
    assert query(connect(out), "SELECT count(*) AS n FROM violations")[0]["n"] == 0
    link = sorted((out / "splits" / "train").glob("*.parquet"))[1]
    starts = pq.read_table(link).column("seq_start_id").to_pylist()
    row = next(i for i, s in enumerate(starts) if len(s) >= 3)
    break_bin(link, row, how)
    found = query(connect(out), "SELECT shard, row, rule FROM violations")
    assert found == [{"shard": link.name, "row": row, "rule": how}]
    with pytest.raises(InvariantError, match=f"{link.name}: bin {row}: "):
        validate_path(out / "splits" / "train")
    assert main(["validate", str(out / "splits" / "train")]) == 2


def test_plain_directories_and_globs_have_no_split(layout: Path, tmp_path: Path, spool) -> None:
    assignment, _ = pack(spool.lengths, 1024, algorithm="next_fit")
    write_shards(spool, assignment, tmp_path / "flat", format="parquet", bins_per_shard=5,
                 workers=1)
    for data in (tmp_path / "flat", str(tmp_path / "flat" / "*.parquet")):
        rows = query(connect(data), "SELECT split, count(*) AS n FROM bins GROUP BY split")
        assert rows == [{"split": None, "n": assignment.num_bins}]
    with pytest.raises(FormatError, match="no splits/ folder"):
        connect(tmp_path / "flat", split="train")
    write_shards(spool, assignment, tmp_path / "mm", format="memmap_v1", bins_per_shard=50,
                 workers=1)
    sql = "SELECT count(*) AS n, sum(packed_len) AS t, sum(loss_tokens) AS l FROM bins"
    con = connect(tmp_path / "mm")  # another format: transcoded into a private folder first
    spill = con.execute("SELECT current_setting('temp_directory')").fetchone()[0]
    assert query(con, sql) == query(connect(tmp_path / "flat"), sql)
    close(con)
    assert not Path(spill).exists()
    with pytest.raises(FormatError, match="polars reads Parquet shards"):
        answer("polars", "split_counts", tmp_path / "mm")


def test_another_format_is_transcoded_once_per_process(spool, tmp_path, capsys) -> None:
    """The first query over a binidx output transcodes it, saying so; later ones (the Python
    API or the command, in the same process) read the same copy; a shard rewritten since is
    transcoded again."""
    assignment, _ = pack(spool.lengths, 1024, algorithm="next_fit")
    write_shards(spool, assignment, tmp_path / "bi", format="binidx", bins_per_shard=40,
                 workers=1)
    write_shards(spool, assignment, tmp_path / "pq", format="parquet", bins_per_shard=40,
                 workers=1)
    sql = "SELECT count(*) AS n, sum(packed_len) AS t, sum(loss_tokens) AS l FROM bins"
    notes: list[str] = []
    first = connect(tmp_path / "bi", note=notes.append)
    copies = sorted(first.execute("SELECT file FROM _shard_files").fetchall())
    assert query(first, sql) == query(connect(tmp_path / "pq"), sql)
    close(first)
    shards = len(copies)
    assert len(notes) == 1 and f"transcoding {shards} binidx shards" in notes[0]
    assert all(Path(c).is_file() for (c,) in copies)  # kept for the next query
    again = connect(tmp_path / "bi", note=notes.append)
    assert sorted(again.execute("SELECT file FROM _shard_files").fetchall()) == copies
    close(again)
    code, out, err = run_cli(capsys, "query", sql, "--data", tmp_path / "bi", "--format", "json")
    assert code == 0 and err == "" and len(notes) == 1
    shutil.rmtree(tmp_path / "bi")  # rewritten: new files, new times
    write_shards(spool, assignment, tmp_path / "bi", format="binidx", bins_per_shard=40,
                 workers=1)
    code, out, err = run_cli(capsys, "query", sql, "--data", tmp_path / "bi")
    assert code == 0 and err.startswith("packlab query: transcoding ") and "packlab convert" in err
    assert len(err.strip().splitlines()) == 1


def test_query_command_prints_a_table_csv_or_json(layout: Path, capsys) -> None:
    sql = "SELECT split, count(*) AS bins FROM bins GROUP BY split ORDER BY split"
    want = {r["split"]: r["bins"] for r in query(connect(layout), sql)}
    code, out, _ = run_cli(capsys, "query", sql, "--data", layout)
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["split", "bins"] and lines[-1] == "(3 rows)"
    assert {ln.split()[0]: int(ln.split()[1]) for ln in lines[2:-1]} == want
    code, out, _ = run_cli(capsys, "query", sql, "--data", layout, "--format", "csv")
    assert out.splitlines()[0] == "split,bins" and len(out.splitlines()) == 4
    code, out, _ = run_cli(capsys, "query", sql, "--data", layout, "--format", "json",
                       "--split", "valid")
    assert json.loads(out) == {"columns": ["split", "bins"],
                               "rows": [{"split": "valid", "bins": want["valid"]}]}
    code, out, _ = run_cli(capsys, "query", "SELECT * FROM bins", "--data", layout,
                       "--max-rows", 2)
    assert code == 0 and f"({sum(want.values())} rows, {sum(want.values()) - 2} not shown)" in out


@pytest.mark.parametrize("argv, message", [
    (["SELECT * FROM nope"], "Catalog Error: Table with name nope does not exist"),
    (["SELECT nope FROM bins"], 'Referenced column "nope" not found'),
    (["SELECT * FROM tokens"], "pass --tokens"),
    (["SELEC 1"], "Parser Error"),
    (["SELECT 1", "--split", "dev"], "no split 'dev'; splits here: train, valid, test"),
])
def test_bad_queries_are_one_line_exit_2(layout: Path, capsys, argv, message) -> None:
    code, out, err = run_cli(capsys, "query", argv[0], "--data", layout, *argv[1:])
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    if len(argv) == 1:  # the same SQL through the Python API: a PacklabError, one line
        with pytest.raises(PacklabError) as caught:
            execute(connect(layout), argv[0])
        assert "\n" not in str(caught.value)


def test_measured_jobs_agree_and_report_memory(layout: Path) -> None:
    rows = measure(str(layout), questions=["split_counts"])
    assert [r["engine"] for r in rows] == ["duckdb", "polars"]
    assert all(r["agree"] and r["rows"] == 3 for r in rows)
    assert all(r["peak_rss_growth_bytes"] > 0 and r["query_seconds"] > 0 for r in rows)
