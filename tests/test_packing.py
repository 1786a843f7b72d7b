"""Packing: exact against naive per-item loops, valid for any input, close to the lower bound
on realistic lengths, bounded memory at 13M sequences, and `packlab plan` on the command line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import one_error_line, run_cli, write_empty_spool
from hypothesis import given, settings
from hypothesis import strategies as st

from packlab.errors import PacklabError
from packlab.packing import (
    ALGORITHMS,
    DEFAULT_ALGORITHM,
    BinAssignment,
    compare_algorithms,
    pack,
)
from packlab.packing import algorithms as packers
from packlab.spool import FILES, SpoolReader, SpoolWriter
from packlab.spool.synth import synth_lengths

ALL = sorted(ALGORITHMS)
FAST = settings(max_examples=60, deadline=None)


# -- naive references: the textbook loops, one item at a time ---------------------------------


def naive_first_fit(sizes: list[int], pack_size: int) -> list[int]:
    rooms: list[int] = []
    out = []
    for s in sizes:
        for b, room in enumerate(rooms):
            if room >= s:
                rooms[b] -= s
                out.append(b)
                break
        else:
            rooms.append(pack_size - s)
            out.append(len(rooms) - 1)
    return out


def naive_best_fit(sizes: list[int], pack_size: int) -> list[int]:
    rooms: list[int] = []
    out = []
    for s in sizes:
        fits = [(room, b) for b, room in enumerate(rooms) if room >= s]
        if fits:
            _, b = min(fits)  # tightest room, then lowest bin number
            rooms[b] -= s
        else:
            rooms.append(pack_size - s)
            b = len(rooms) - 1
        out.append(b)
    return out


def naive_next_fit(sizes: list[int], pack_size: int) -> list[int]:
    out, current, used = [], 0, 0
    for s in sizes:
        if used + s > pack_size:
            current, used = current + 1, 0
        out.append(current)
        used += s
    return out


def as_bins(assignment: BinAssignment) -> list[list[int]]:
    return [assignment.bin_indices(b).tolist() for b in range(assignment.num_bins)]


def relabel(bin_of: list[int], order: np.ndarray) -> list[list[int]]:
    """Bins as sorted lists of original indices, from bins of items taken in ``order``."""
    bins: dict[int, list[int]] = {}
    for item, b in zip(order.tolist(), bin_of, strict=True):
        bins.setdefault(b, []).append(item)
    return [sorted(bins[b]) for b in sorted(bins)]


small_problem = st.integers(1, 60).flatmap(
    lambda p: st.tuples(st.just(p), st.lists(st.integers(1, p), min_size=1, max_size=120))
)


# -- exactness ---------------------------------------------------------------------------------


@FAST
@given(small_problem)
def test_decreasing_algorithms_equal_the_naive_loops(problem: tuple[int, list[int]]) -> None:
    pack_size, sizes = problem
    lengths = np.array(sizes, dtype=np.int64)
    order = packers.decreasing_order(lengths)
    values, counts = packers._runs(lengths[order])
    in_order = lengths[order].tolist()
    assert in_order == sorted(sizes, reverse=True)
    ffd = naive_first_fit(in_order, pack_size)
    bound = packers.max_bins(lengths, pack_size)
    assert packers.grouped_first_fit(values, counts, pack_size, bound).tolist() == ffd
    assert packers.first_fit_in_order(lengths, order, pack_size)[order].tolist() == ffd
    assert packers.grouped_best_fit(values, counts, pack_size).tolist() == naive_best_fit(
        in_order, pack_size
    )
    for name, ref in (("first_fit_decreasing", ffd),
                      ("best_fit_decreasing", naive_best_fit(in_order, pack_size))):
        assignment, _ = pack(lengths, pack_size, algorithm=name)
        assert as_bins(assignment) == relabel(ref, order)


@FAST
@given(small_problem, st.integers(0, 2**32 - 1))
def test_shuffle_and_next_fit_equal_the_naive_loops(
    problem: tuple[int, list[int]], seed: int
) -> None:
    pack_size, sizes = problem
    lengths = np.array(sizes, dtype=np.int64)
    # first_fit_shuffle is NeMo's: a seeded permutation, then plain first fit
    order = np.random.default_rng(seed).permutation(len(sizes))
    assignment, _ = pack(lengths, pack_size, algorithm="first_fit_shuffle", seed=seed)
    assert as_bins(assignment) == relabel(naive_first_fit(lengths[order].tolist(), pack_size), order)
    assignment, _ = pack(lengths, pack_size, algorithm="next_fit", seed=seed)
    identity = np.arange(len(sizes))
    assert as_bins(assignment) == relabel(naive_next_fit(sizes, pack_size), identity)


def test_grouped_and_per_item_first_fit_agree_on_realistic_lengths() -> None:
    lengths = np.minimum(synth_lengths(60_000, "chat", 1), 4096)
    order = packers.decreasing_order(lengths)
    values, counts = packers._runs(lengths[order])
    grouped = packers.grouped_first_fit(values, counts, 4096, packers.max_bins(lengths, 4096))
    assert np.array_equal(grouped, packers.first_fit_in_order(lengths, order, 4096)[order])


def test_diverse_lengths_take_the_per_item_path_with_the_same_result() -> None:
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 200_000, size=3000)  # ~3000 distinct lengths: groups don't pay
    values, _ = packers._runs(np.sort(lengths))
    assert not packers._groups_pay(values.shape[0], lengths.shape[0])
    assignment, _ = pack(lengths, 200_000, algorithm="first_fit_decreasing")
    order = packers.decreasing_order(lengths)
    ref = naive_first_fit(lengths[order].tolist(), 200_000)
    assert as_bins(assignment) == relabel(ref, order)


# -- properties of every algorithm -------------------------------------------------------------


def check_assignment(lengths: np.ndarray, pack_size: int, overlong: str, algorithm: str,
                     seed: int) -> None:
    assignment, report = pack(lengths, pack_size, algorithm=algorithm, seed=seed,
                              overlong=overlong)
    over = lengths > pack_size
    kept = np.flatnonzero(~over) if overlong == "drop" else np.arange(lengths.shape[0])
    # every kept sequence in exactly one bin, nothing else
    assert np.array_equal(np.sort(assignment.seq_indices), kept)
    # within a bin: ascending spool index; no empty bin; no bin over pack_size
    per_bin = assignment.seqs_per_bin()
    assert (per_bin > 0).all()
    loads = assignment.bin_lengths(lengths)
    assert loads.max() <= pack_size
    for b in range(assignment.num_bins):
        assert (np.diff(assignment.bin_indices(b)) > 0).all()
    total = int(np.minimum(lengths[kept], pack_size).sum())
    lower = -(-total // pack_size)
    assert report.num_tokens == total == int(loads.sum())
    assert report.lower_bound_bins == lower
    assert lower <= report.num_bins == assignment.num_bins <= 2 * lower + 1
    assert report.efficiency == pytest.approx(total / (report.num_bins * pack_size))
    assert report.num_sequences == lengths.shape[0]
    assert report.num_packed_sequences == kept.shape[0]
    n_over = int(over.sum())
    excess = int((lengths[over] - pack_size).sum())
    if overlong == "truncate":
        assert (report.truncated, report.dropped) == (n_over, 0)
        assert (report.truncated_tokens, report.dropped_tokens) == (excess, 0)
        # a truncated sequence fills a bin alone
        pos = np.flatnonzero(np.isin(assignment.seq_indices, np.flatnonzero(over)))
        bins = np.searchsorted(assignment.bin_offsets, pos, side="right") - 1
        assert (per_bin[bins] == 1).all() and (loads[bins] == pack_size).all()
    else:
        assert (report.truncated, report.dropped) == (0, n_over)
        assert report.dropped_tokens == excess + n_over * pack_size
    assert report.spool_tokens == int(lengths.sum())
    assert report.spool_tokens == report.num_tokens + report.truncated_tokens + report.dropped_tokens
    assert report.max_seqs_per_bin == per_bin.max() and report.min_seqs_per_bin == per_bin.min()
    # deterministic for a seed
    again, _ = pack(lengths, pack_size, algorithm=algorithm, seed=seed, overlong=overlong)
    assert np.array_equal(again.bin_offsets, assignment.bin_offsets)
    assert np.array_equal(again.seq_indices, assignment.seq_indices)


@FAST
@given(
    st.integers(1, 300).flatmap(
        lambda p: st.tuples(st.just(p), st.lists(st.integers(1, 2 * p + 5), min_size=1,
                                                 max_size=200))
    ),
    st.sampled_from(ALL),
    st.sampled_from(["truncate", "drop"]),
    st.integers(0, 1000),
)
def test_any_lengths_any_pack_size_every_algorithm(
    problem: tuple[int, list[int]], algorithm: str, overlong: str, seed: int
) -> None:
    pack_size, sizes = problem
    lengths = np.array(sizes, dtype=np.int64)
    if overlong == "drop" and (lengths > pack_size).all():
        with pytest.raises(PacklabError, match="every sequence is longer"):
            pack(lengths, pack_size, algorithm=algorithm, overlong="drop")
        return
    check_assignment(lengths, pack_size, overlong, algorithm, seed)


@pytest.mark.parametrize("algorithm", ALL)
def test_realistic_lengths_every_algorithm(algorithm: str) -> None:
    lengths = synth_lengths(20_000, "chat", 2)  # ~3.5% over 4096
    for overlong in ("truncate", "drop"):
        check_assignment(lengths, 4096, overlong, algorithm, seed=7)


def test_seed_changes_the_shuffle_only() -> None:
    lengths = synth_lengths(5000, "chat", 0)
    a, _ = pack(lengths, 4096, algorithm="first_fit_shuffle", seed=1)
    b, _ = pack(lengths, 4096, algorithm="first_fit_shuffle", seed=2)
    assert not np.array_equal(a.seq_indices, b.seq_indices)
    for name in ("first_fit_decreasing", "best_fit_decreasing", "next_fit",
                 "modified_first_fit_decreasing", "megatron_lm_mffd"):
        c, _ = pack(lengths, 4096, algorithm=name, seed=1)
        d, _ = pack(lengths, 4096, algorithm=name, seed=2)
        assert np.array_equal(c.seq_indices, d.seq_indices)


def test_default_algorithm_is_first_fit_shuffle() -> None:
    assert DEFAULT_ALGORITHM == "first_fit_shuffle"
    _, report = pack(np.array([3, 2, 1]), 4)
    assert report.algorithm == "first_fit_shuffle"


def test_ffd_and_bfd_within_half_a_percent_of_the_lower_bound() -> None:
    lengths = synth_lengths(200_000, "chat", 0)
    for algorithm in ("first_fit_decreasing", "best_fit_decreasing"):
        _, report = pack(lengths, 4096, algorithm=algorithm)
        assert report.bins_over_lower_bound < 0.005, report
        assert report.efficiency > 0.995
    _, nf = pack(lengths, 4096, algorithm="next_fit")
    assert nf.num_bins > report.num_bins  # concatenative packing wastes room


def test_truncate_and_drop_are_counted_on_a_known_case() -> None:
    lengths = np.array([10, 3, 12, 4, 10])
    _, truncated = pack(lengths, 10, algorithm="first_fit_decreasing")
    assert (truncated.truncated, truncated.truncated_tokens, truncated.dropped) == (1, 2, 0)
    assert truncated.num_tokens == 37 and truncated.num_bins == 4
    assignment, dropped = pack(lengths, 10, algorithm="first_fit_decreasing", overlong="drop")
    assert (dropped.dropped, dropped.dropped_tokens, dropped.truncated) == (1, 12, 0)
    assert 2 not in assignment.seq_indices and dropped.num_tokens == 27
    assert as_bins(assignment) == [[0], [4], [1, 3]]
    assert assignment.overlong == "drop"


@pytest.mark.parametrize(
    ("lengths", "pack_size", "kwargs", "message"),
    [
        ([1, 2], 0, {}, "pack_size must be a positive integer"),
        ([1, 2], -5, {}, "pack_size must be a positive integer"),
        ([1, 2], True, {}, "pack_size must be a positive integer"),
        ([1, 2], 2.5, {}, "pack_size must be a positive integer"),
        ([], 8, {}, "nothing to pack"),
        ([3, 0, 2], 8, {}, "sequence 1 has length 0"),
        ([3, -1], 8, {}, "sequence 1 has length -1"),
        ([1.5, 2.0], 8, {}, "must be integers"),
        ([[1, 2]], 8, {}, "nothing to pack"),
        ([1, 2], 8, {"algorithm": "worst_fit"}, "unknown packing algorithm 'worst_fit'"),
        ([1, 2], 8, {"overlong": "wrap"}, "overlong must be"),
        ([9, 10], 8, {"overlong": "drop"}, "every sequence is longer than pack_size 8"),
    ],
)
def test_bad_input_is_a_clear_error(lengths: list, pack_size: object, kwargs: dict,
                                    message: str) -> None:
    with pytest.raises(PacklabError, match=message):
        pack(np.array(lengths), pack_size, **kwargs)  # type: ignore[arg-type]


def test_an_algorithm_bug_never_reaches_a_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ALGORITHMS, "everything_in_one", lambda n, p, rng: np.zeros_like(n))
    with pytest.raises(PacklabError, match="more than pack_size 4 .algorithm bug"):
        pack(np.array([3, 3]), 4, algorithm="everything_in_one")
    monkeypatch.setitem(ALGORITHMS, "gap", lambda n, p, rng: np.arange(n.shape[0]) * 2)
    with pytest.raises(PacklabError, match="empty bin"):
        pack(np.array([3, 3]), 4, algorithm="gap")


def test_compare_algorithms_side_by_side() -> None:
    lengths = synth_lengths(3000, "chat", 3)
    table = compare_algorithms(lengths, 4096, seed=5, repeats=2)
    assert sorted(table) == ALL
    for name, (assignment, report) in table.items():
        alone, expected = pack(lengths, 4096, algorithm=name, seed=5)
        assert np.array_equal(assignment.seq_indices, alone.seq_indices)
        assert report.num_bins == expected.num_bins and report.seconds > 0
    only = compare_algorithms(lengths, 4096, algorithms=["next_fit"])
    assert list(only) == ["next_fit"]
    with pytest.raises(PacklabError, match="repeats"):
        compare_algorithms(lengths, 4096, repeats=0)


# -- memory at full scale ---------------------------------------------------------------------


FULL_SCALE = {"first_fit_decreasing": 0.005, "first_fit_shuffle": 0.01,
              "modified_first_fit_decreasing": 0.005, "megatron_lm_mffd": 0.005}


@pytest.fixture(scope="module")
def full_scale() -> dict[str, dict]:
    """13M chat lengths packed by each algorithm in one fresh process (the lengths made once),
    the process's peak RSS reset before each (``VmHWM``, via ``/proc/self/clear_refs``)."""
    script = textwrap.dedent(
        f"""
        import json
        from packlab.lab.measure.memory import read_status, reset_peak
        from packlab.packing import pack
        from packlab.spool.synth import synth_lengths
        lengths = synth_lengths(13_000_000, "chat", 0)
        out = {{}}
        for algorithm in {list(FULL_SCALE)!r}:
            assert reset_peak()
            _, report = pack(lengths, 4096, algorithm=algorithm)
            out[algorithm] = {{"hwm": read_status()["VmHWM"], "bins": report.num_bins,
                              "over": report.bins_over_lower_bound,
                              "sequences": report.num_sequences}}
        print(json.dumps(out))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600, check=True)
    return json.loads(done.stdout)


@pytest.mark.parametrize("algorithm", list(FULL_SCALE))
def test_13m_lengths_pack_under_2gb_peak_rss(algorithm: str, full_scale: dict[str, dict]
                                             ) -> None:
    result = full_scale[algorithm]
    assert result["sequences"] == 13_000_000
    assert result["over"] < FULL_SCALE[algorithm]
    assert result["hwm"] < 2 * 1024**3, f"peak RSS {result['hwm'] / 2**20:.0f} MiB"


# -- packlab plan ------------------------------------------------------------------------------


@pytest.fixture
def chat_spool(tmp_path: Path) -> SpoolReader:
    from packlab.spool.synth import synthesize

    return synthesize(tmp_path / "chat", num_sequences=400, seed=4)


def test_plan_json_matches_pack_and_writes_nothing(
    chat_spool: SpoolReader, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(p.name for p in chat_spool.path.parent.rglob("*"))
    code, out, err = run_cli(capsys, "plan", str(chat_spool.path), "--pack-size", "2048",
                          "--algorithm", "best_fit_decreasing", "--overlong", "drop", "--json")
    assert code == 0, err
    plan = json.loads(out)
    required = {"num_sequences", "num_tokens", "pack_size", "num_bins", "lower_bound_bins",
                "efficiency", "dropped", "truncated", "seconds"}
    assert required <= set(plan)
    _, report = pack(chat_spool.lengths, 2048, algorithm="best_fit_decreasing", overlong="drop")
    for key in required - {"seconds"}:
        assert plan[key] == getattr(report, key), key
    assert plan["dropped"] > 0 and plan["truncated"] == 0
    assert plan["num_sequences"] == 400 and plan["pack_size"] == 2048
    assert sorted(p.name for p in chat_spool.path.parent.rglob("*")) == before


def test_plan_table_and_seed(chat_spool: SpoolReader, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "plan", str(chat_spool.path), "--pack-size", "4096")
    assert code == 0
    assert "lower_bound_bins" in out and DEFAULT_ALGORITHM in out
    runs = []
    for seed in ("1", "1", "2"):
        code, out, _ = run_cli(capsys, "plan", str(chat_spool.path), "--pack-size", "1024",
                            "--seed", seed, "--json")
        runs.append(json.loads(out))
    assert runs[0]["truncated"] > 0 and runs[0]["seed"] == 1
    assert runs[0]["num_bins"] == runs[1]["num_bins"]


def _one_error_line(err: str, *names: object) -> None:
    one_error_line(err, *names, prefix="packlab plan: error: ")


def test_plan_missing_spool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "plan", str(tmp_path / "nope"), "--pack-size", "8")
    assert code == 2 and out == ""
    _one_error_line(err, tmp_path / "nope")


def test_plan_truncated_tokens_bin(chat_spool: SpoolReader,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    tokens = chat_spool.path / FILES["tokens"]
    with open(tokens, "r+b") as f:
        f.truncate(tokens.stat().st_size - 4)
    code, out, err = run_cli(capsys, "plan", str(chat_spool.path), "--pack-size", "4096")
    assert code == 2 and out == ""
    _one_error_line(err, tokens, "truncated")


@pytest.mark.parametrize("size", ["0", "-4096"])
def test_plan_bad_pack_size(chat_spool: SpoolReader, capsys: pytest.CaptureFixture[str],
                            size: str) -> None:
    code, out, err = run_cli(capsys, "plan", str(chat_spool.path), f"--pack-size={size}")
    assert code == 2 and out == ""
    _one_error_line(err, "argument --pack-size: expected a positive integer", size)


def test_plan_unknown_algorithm(chat_spool: SpoolReader,
                                capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "plan", str(chat_spool.path), "--pack-size", "8",
                        "--algorithm", "magic")
    assert code == 2
    _one_error_line(err, "magic", "first_fit_decreasing")


def test_plan_empty_spool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a writer refuses to publish an empty spool, so build the directory by hand
    empty = write_empty_spool(tmp_path / "empty")
    code, out, err = run_cli(capsys, "plan", str(empty), "--pack-size", "8")
    assert code == 2 and out == ""
    _one_error_line(err, empty, "empty spool")


def test_plan_zero_length_sequence_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with SpoolWriter(tmp_path / "s") as w:
        w.append_many(np.arange(6), np.ones(6, dtype=np.uint8), np.array([3, 3]))
    np.array([3, 0], dtype="<u4").tofile(tmp_path / "s" / FILES["lengths"])  # corrupt lengths
    code, _, err = run_cli(capsys, "plan", str(tmp_path / "s"), "--pack-size", "8")
    assert code == 2
    _one_error_line(err, tmp_path / "s" / FILES["lengths"], "sequence 1 has length 0")


def test_plan_in_a_real_process(chat_spool: SpoolReader) -> None:
    exe = [sys.executable, "-m", "packlab.cli", "plan", str(chat_spool.path)]
    done = subprocess.run([*exe, "--pack-size", "4096", "--json"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["num_sequences"] == 400
    bad = subprocess.run([*exe, "--pack-size", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    _one_error_line(bad.stderr, "--pack-size")
