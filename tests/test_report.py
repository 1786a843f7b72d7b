"""The report decides from the numbers: a format per use case computed from a run, verdicts in
one vocabulary and colour, notebook pages without code, figures whose legends leave the data
alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib
import nbformat
import pytest

from packlab.formats import format_names, formats_where, get_format
from packlab.lab.measure import verdicts
from packlab.lab.results import finding
from packlab.lab.summaries import findings_table, front, notebook_markdown
from packlab.lab.tables import human_bytes

matplotlib.use("Agg")


def _run(**overrides: Any) -> dict[str, dict[str, Any]]:
    """A small run in the recorded shape: notebooks 03, 04, 05 for every registered format."""
    memory: dict[str, Any] = {}
    access: dict[str, Any] = {}
    sizes = {}
    for i, fmt in enumerate(format_names()):
        in_ram = get_format(fmt).Reader.IN_RAM
        memory[f"{fmt}_write_peak_rss_growth_bytes_1000"] = 1e6 * (i + 1)
        memory[f"{fmt}_load_peak_rss_growth_bytes_1000"] = 4e9 if in_ram else 1e4 * (i + 1)
        memory[f"{fmt}_write_loglog_slope"] = 1.0 if in_ram else 0.05
        access[f"{fmt}_warm_p50_us"] = 200.0 if in_ram else 10.0 + i
        access[f"{fmt}_warm_python_floor_p50_us"] = 9.0
        access[f"{fmt}_cold_p50_us"] = 300.0 - 10 * i
        access[f"{fmt}_cold_pread_p50_us"] = 100.0
        access[f"{fmt}_scan_warm_tokens_per_s"] = 1e8
        sizes[fmt] = 5.0 - 0.1 * i
    run = {
        "03_write_formats": {"numbers": {"bytes_per_token": sizes}, "findings": []},
        "04_peak_memory": {"numbers": memory, "parameters": {"sizes": [1000]}, "findings": [
            finding("RFC: legacy ~4 GB", "4.1 GB", verdicts.approx(4.1e9, 4e9))]},
        "05_random_access": {"numbers": access, "findings": [
            finding("binidx: warm within 1.1x", "1.05x", verdicts.holds(True), source="target")]},
    }
    for key, value in overrides.items():
        notebook, number = key.split("__")
        run[notebook]["numbers"][number] = value
    return run


def _chosen(run: dict) -> dict[str, str | None]:
    return {r["use_case"]: r["format"] for r in front.recommendations(run)}


def _lazy() -> list[str]:
    return [f for f in format_names() if f not in formats_where("IN_RAM")]


def _readers(fmt: str) -> int:
    facts = get_format(fmt).Reader
    return len([r for r in facts.READ_BY if r not in facts.ITEMS_READ_BY])


def test_each_use_case_is_computed_from_the_numbers() -> None:
    """In the synthetic run every read ties (all within 248 µs of the fastest) and every load
    peak is a few hundred KB a node: who reads the files decides, then the bytes; the legacy
    format's 4 GB a process never passes the memory band."""
    run = _run()
    chosen = _chosen(run)
    most = max(_readers(f) for f in _lazy())
    sizes = run["03_write_formats"]["numbers"]["bytes_per_token"]
    read_most = [f for f in _lazy() if _readers(f) == most]
    smallest = min(sizes[f] for f in read_most)
    assert chosen["local training"] == min(f for f in read_most if sizes[f] <= 1.1 * smallest)
    assert chosen["local training"] not in formats_where("IN_RAM")
    assert chosen["object storage"] in formats_where("READS_IN_PLACE")
    assert chosen["Megatron pretrain tooling"] in [
        f for f in format_names() if "Megatron-core" in get_format(f).Reader.READ_BY
        and "Megatron-core" not in get_format(f).Reader.ITEMS_READ_BY]
    # a repack writes what a format stores: sizes within 10% of the smallest tie, and among
    # them (here all read alike) the one more systems read
    assert sizes[chosen["repacking often"]] <= 1.1 * min(sizes.values())
    assert chosen["repacking often"] == max(
        (f for f in format_names() if sizes[f] <= 1.1 * min(sizes.values())), key=_readers)
    # a read a step notices (1 ms more than the fastest, cold) takes a format out
    slow = chosen["local training"]
    changed = _run(**{f"05_random_access__{slow}_cold_p50_us": 1300.0})
    assert _chosen(changed)["local training"] not in (slow, None)
    in_ram = formats_where("IN_RAM")
    fast_legacy = _run(**{f"05_random_access__{f}_warm_p50_us": 0.1 for f in in_ram})
    assert _chosen(fast_legacy)["local training"] == chosen["local training"]  # 4 GB a process


def test_a_speed_a_step_does_not_notice_ties_and_memory_times_a_node_counts() -> None:
    """Two formats read by as many systems, one 6 µs faster warm and 150 µs faster cold: a
    tie (under 248 µs a bin of 4,096 tokens); the other opens with 200 MB less, which 64
    processes a node make 12.8 GB: that decides. Then sizes within 10% tie and the name goes."""
    lazy = _lazy()
    counts = {f: _readers(f) for f in lazy}
    a, b = next([f for f in lazy if counts[f] == n] for n in sorted(set(counts.values()),
                                                                   reverse=True)
                if list(counts.values()).count(n) > 1)[:2]
    overrides: dict[str, Any] = {}
    for f in lazy:
        overrides[f"05_random_access__{f}_warm_p50_us"] = 50.0
        overrides[f"05_random_access__{f}_cold_p50_us"] = 5000.0
        overrides[f"04_peak_memory__{f}_load_peak_rss_growth_bytes_1000"] = 1e6
    overrides.update({f"05_random_access__{a}_warm_p50_us": 4.0,
                      f"05_random_access__{b}_warm_p50_us": 10.0,
                      f"05_random_access__{a}_cold_p50_us": 250.0,
                      f"05_random_access__{b}_cold_p50_us": 400.0,
                      f"04_peak_memory__{a}_load_peak_rss_growth_bytes_1000": 2.03e8,
                      f"04_peak_memory__{b}_load_peak_rss_growth_bytes_1000": 3e6})
    run = _run(**overrides)
    run["05_random_access"]["parameters"] = {"pack_size": 4096}
    run["03_write_formats"]["numbers"]["bytes_per_token"].update({a: 4.0, b: 5.0})
    local = next(r for r in front.recommendations(run) if r["use_case"] == "local training")
    assert local["format"] == b and local["tied"] == []
    drops = {s["criterion"]: s["kept"] for s in local["steps"]}
    assert a in drops["cold read"] and a not in drops["memory per node"]
    # 10 MB less a process is 640 MB a node: under the 1 GB band, so the smaller file wins
    run["04_peak_memory"]["numbers"][f"{a}_load_peak_rss_growth_bytes_1000"] = 1.3e7
    assert _chosen(run)["local training"] == a
    run["03_write_formats"]["numbers"]["bytes_per_token"][a] = 4.6  # within 10%: a tie,
    assert _chosen(run)["local training"] == min(a, b)  # the name decides
    # at a smaller pack size a bin trains for less: 150 µs a 1,024-token bin is noticed
    run["05_random_access"]["parameters"] = {"pack_size": 1024}
    assert _chosen(run)["local training"] == a


def test_fifths_re_decide_every_use_case_with_their_reads() -> None:
    """Two lazy formats whose cold p50s cross from one fifth to the next (92 against 106 µs):
    the difference ties, so every fifth keeps the whole run's answer; a fifth in which one
    format's cold read is a millisecond slower moves it."""
    lazy = _lazy()
    a, b = lazy[:2]
    overrides: dict[str, Any] = {}
    for f in lazy:
        warm = 10.0 if f in (a, b) else 50.0
        overrides[f"05_random_access__{f}_warm_p50_us"] = warm
        overrides[f"05_random_access__{f}_warm_p50_by_part_us"] = [warm] * 5
        cold = [92.0, 106.0, 92.0, 106.0, 92.0] if f == a else [106.0, 92.0, 106.0, 92.0, 106.0]
        overrides[f"05_random_access__{f}_cold_p50_us"] = 99.0 if f in (a, b) else 5000.0
        overrides[f"05_random_access__{f}_cold_p50_by_part_us"] = (
            cold if f in (a, b) else [5000.0] * 5)
    for f in formats_where("IN_RAM"):
        overrides[f"05_random_access__{f}_warm_p50_by_part_us"] = [200.0] * 5
        overrides[f"05_random_access__{f}_cold_p50_by_part_us"] = [300.0] * 5
    run = _run(**overrides)
    rows = front.format_rows(run)
    agree = front.decide.fifth_agreement(rows, 4096)
    assert agree == {c["use_case"]: (5, 5) for c in front.recommendations(run)}
    assert front.reruns(run)["local training"] == "5 of 5 fifths"
    pick = _chosen(run)["local training"]
    run["05_random_access"]["numbers"][f"{pick}_cold_p50_by_part_us"][2] = 1500.0
    assert front.decide.fifth_agreement(front.format_rows(run), 4096)["local training"] == (4, 5)
    # a run recorded before the parts: the rule still decides, without fifths
    assert front.decide.fifth_agreement(front.format_rows(_run()), 4096) == {}
    assert front.reruns(_run())["local training"] == "no fifths recorded"


def test_two_runs_answers_are_compared_per_use_case() -> None:
    run = _run()
    other = _run(**{f"05_random_access__{_chosen(run)['local training']}_cold_p50_us": 1e5})
    pairs = front.compare_runs(run, other)
    assert [p["use_case"] for p in pairs] == [c["use_case"] for c in front.recommendations(run)]
    differ = [p["use_case"] for p in pairs if not p["same"]]
    assert "local training" in differ and "object storage" not in differ  # no local read there
    assert "the other run: `" in front.reruns(run, other)["local training"]
    assert front.reruns(run, run)["object storage"] == "no fifths recorded; the other run: the same"
    assert "| local training |" in front.comparison_table(pairs) and "**no**" in \
        front.comparison_table(pairs)


def test_the_recommendation_is_set_beside_what_the_stack_reads() -> None:
    """Megatron-Bridge reads packed Parquet: the report sets local training's answer beside
    Parquet under Bridge's one-row-group policy (notebook 05's epoch, per bin) and beside the
    prefix path (an export, then index-only repacks: notebook 03), each difference judged by
    the bands."""
    from packlab.formats.shared import stacks
    from packlab.lab.summaries import stack

    released = {f for _, f in stack.released_defaults()}
    assert released == {f for f in format_names() if any(
        i.status in (stacks.RELEASED, stacks.DEPRECATED)
        for i in get_format(f).Reader.STACK_INPUTS)}
    assert get_format("megatron_sft").Reader.STACK_INPUTS == (stacks.SFT_PAIR,)
    assert stacks.SFT_PAIR.status == stacks.CLOSED and not stacks.SFT_PAIR.released
    assert "megatron_sft" not in released and "parquet" in released
    run = _run()
    run["05_random_access"]["numbers"].update(
        {"num_bins": 4000, "parquet_epoch_today_seconds": 200.0,
         "parquet_epoch_packlab_seconds": 0.4, "parquet_shuffled_epoch_speedup": 500.0})
    run["03_write_formats"]["numbers"].update(
        {"num_tokens": 1_000_000, "repack_index_bytes": 300_000, "repack_index_seconds": 0.05,
         "repack_parquet_bytes": 30_000_000, "repack_parquet_seconds": 3.0})
    beside = stack.beside_stack(run)
    assert beside is not None and beside["local"] == _chosen(run)["local training"]
    assert beside["parquet"] == "parquet" and beside["index"] == "packed_index"
    aspects = {a[0]: a[1:] for a in beside["aspects"]}
    _, bridge, prefix = aspects["a random bin, shuffled"]
    assert bridge.startswith("50,000 µs a bin, warm (+50.0 ms a bin: a step notices)")
    assert "200.0 s an epoch of 4,000 bins" in bridge and "100 µs a bin, 500x less" in bridge
    ours, _, _ = aspects["memory per node (64 processes)"]
    assert ours.startswith(human_bytes(64 * 1e4 * (format_names().index(beside["local"]) + 1)))
    _, parquet_repack, prefix_repack = aspects["a repack at another pack size"]
    assert parquet_repack == "rewrites every bin: 30 MB in 3.00 s (notebook 03)"
    assert "300 KB in 0.05 s over a spool" in prefix_repack  # a run before the prefix path
    run["03_write_formats"]["numbers"].update(
        {"prefix_export_bytes": 3_000_000, "prefix_export_seconds": 0.5,
         "prefix_repack_bytes": 310_000, "prefix_repack_seconds": 0.06})
    aspects = {a[0]: a[1:] for a in stack.beside_stack(run)["aspects"]}
    assert aspects["a repack at another pack size"][2] == (
        "the index only: 310 KB in 0.06 s over the prefix, after one export of 3 MB in "
        "0.50 s (notebook 03)")
    assert aspects["bytes on disk"][2].startswith("3.00 B/token once")
    table = stack.beside_stack_table(run)
    assert "packed Parquet as Megatron-Bridge 0.6.2 reads it (`parquet`)" in table
    del run["05_random_access"]
    assert stack.beside_stack(run) is None  # no local answer to set beside anything


def test_a_run_without_a_notebook_says_not_measured() -> None:
    run = _run()
    del run["05_random_access"]
    rows = {r["use_case"]: r for r in front.recommendations(run)}
    assert rows["local training"]["format"] is None
    assert rows["local training"]["why"] == verdicts.NOT_MEASURED
    assert "n/a" in front.format_table(run)


def test_the_format_table_carries_every_format_and_who_reads_it() -> None:
    table = front.format_table(_run())
    for fmt in format_names():
        assert f"`{fmt}`" in table
        for reader in get_format(fmt).Reader.READ_BY:
            assert reader in table
    assert "4 GB" in table  # memory in units people read, not raw bytes


def test_verdicts_are_one_vocabulary_decided_by_one_rule() -> None:
    t = verdicts.TOLERANCE
    assert verdicts.approx(4e9 * t * 0.99, 4e9) == verdicts.HOLDS
    assert verdicts.approx(4e9 * t * 1.01, 4e9) == verdicts.DOES_NOT_HOLD
    assert verdicts.approx(3.2, 2, 3) == verdicts.HOLDS  # inside the widened range
    assert verdicts.at_most(20e6 * t, 20e6) == verdicts.HOLDS
    assert verdicts.at_least(200 / t, 200) == verdicts.HOLDS
    assert verdicts.at_least(199 / t, 200) == verdicts.DOES_NOT_HOLD
    assert verdicts.flat(0.304) == verdicts.HOLDS  # printed 0.30: at the threshold
    assert verdicts.flat(0.306) == verdicts.DOES_NOT_HOLD
    assert verdicts.overall(["holds", "does not hold"]) == verdicts.PARTLY
    assert verdicts.overall(["holds", "not measured"]) == verdicts.HOLDS
    assert verdicts.overall([]) == verdicts.NOT_MEASURED
    assert verdicts.deviation(45e6, 1e6) == "45x the claim"
    assert verdicts.deviation(1.04e9, 1e9) == "1.04x the claim"
    for word in verdicts.VERDICTS:
        assert word in verdicts.COLOURS and word in verdicts.badge(word)
    assert "<s>" in verdicts.badge("fails")  # a word outside the vocabulary is shown struck
    assert str(verdicts.TOLERANCE) in verdicts.RULE


def test_findings_name_their_source_and_render_with_colour() -> None:
    rfc = finding("RFC: Parquet ~0.4x", "0.40x", "holds")
    mine = finding("__getitems__ cheaper", "7% cheaper", "holds", source="target")
    assert (rfc["source"], mine["source"]) == ("rfc", "target")
    with pytest.raises(ValueError, match="source"):
        finding("x", "y", "holds", source="nobody")
    table = findings_table([rfc, mine])
    assert verdicts.COLOURS["holds"][0] in table and "\\_\\_getitems\\_\\_" in table
    assert "holds" in findings_table([rfc], colour=False).splitlines()[-1]
    text = notebook_markdown("99_unknown", {"numbers": {}, "findings": [rfc]})
    assert "RFC: Parquet" in text  # no bullets module: the findings alone


def _executed_notebook(path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 99 · A test\n\nWhat does **this** `do`?"),
                nbformat.v4.new_code_cell("secret_code_line = 1")]
    nb.cells[1].outputs = [nbformat.v4.new_output(
        "display_data", data={"text/markdown": "a finding", "text/plain": "x"})]
    nbformat.write(nb, path)


def test_write_report_front_page_and_notebook_pages(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from packlab.lab.report import write_report

    monkeypatch.setenv("PACKLAB_BUILD", str(tmp_path / "build"))
    executed, results, out = tmp_path / "nb", tmp_path / "results", tmp_path / "report"
    executed.mkdir()
    results.mkdir()
    _executed_notebook(executed / "99_test.ipynb")
    for name, recorded in _run().items():
        (results / f"{name}.json").write_text(json.dumps(recorded))
    (results / "99_test.json").write_text(json.dumps(
        {"parameters": {"n": 3}, "numbers": {}, "findings": [finding("x", "y", "does not hold")]}))
    (results / "run.json").write_text(json.dumps(
        {"run": "r1", "date": "2026-11-25T10:00:00+00:00", "scale": "ci", "commit": "abc1234",
         "machine": {"cores": 2, "memory_bytes": 8e9, "read_ahead_kb": 128},
         "versions": {"python": "3.11.7", "numpy": "2.4.0"}, "timings": {"99_test": 1.5}}))
    index = write_report(executed, out, results=results).read_text()
    for fmt in [r["format"] for r in front.recommendations(_run())]:
        assert f"<code>{fmt}</code>" in index
    assert verdicts.COLOURS["does not hold"][0] in index
    assert "abc1234" in index and "2 cores" in index and "read-ahead 128 KB" in index
    assert "<strong>this</strong>" in index  # the question rendered, not raw Markdown
    assert "href='99_test.html'" in index
    page = (out / "99_test.html").read_text()
    assert "secret_code_line" not in page and "a finding" in page
    assert "href='index.html'" in page and "n=3" in page
    assert (out / "99_test.ipynb").is_file()


def test_plots_move_legends_off_the_data_and_label_bytes(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt

    from packlab.lab import plots

    monkeypatch.setenv("PACKLAB_BUILD", str(tmp_path))
    fig, (left, right) = plt.subplots(1, 2)
    for ax in (left, right):
        ax.plot([1, 2, 3], [1e3, 1e6, 1e9], label="data")
        ax.set_yscale("log")
        ax.legend(loc="center")
    plots.bytes_axis(right, "y")
    bars = plots.log_bars(left, [0, 1], [0, 5e6], 0.4, label="bars")
    assert len(bars) == 1  # the zero draws no bar
    fig.tight_layout()
    plots.legends_outside(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in (left, right):
        legend, box = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
        assert legend.x0 >= box.x1 - 1 or legend.y1 <= box.y0 + 1, "legend over the data"
    assert "1 GB" in [t.get_text() for t in right.get_yticklabels()]
    plots.save(fig, "99_test", show=False)
    assert (tmp_path / "figures" / "99_test.png").is_file()
    assert plots.pareto_front([1, 2, 3], [3, 1, 2]) == [1, 2]  # (1, 3) is beaten by (2, 1)
