"""Notebook 11's peers: every adapter round-trips the reference bins through its own system,
the side-by-side run follows its rules, and the findings come from the rows. No timing is
asserted: only that timings exist, come from one index list, and are put beside their floors.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import Child

from packlab.errors import PacklabError
from packlab.lab.measure.peers import get_peer, mds_env, peer_names, run, side_by_side
from packlab.lab.measure.peers.base import (
    COLUMNS,
    Peer,
    Reference,
    arrays_of,
    bytes_of,
    reference_from,
)
from packlab.lab.measure.peers.megatron_peer import MODULE as MEGATRON_MODULE
from packlab.lab.measure.peers.raw_csr import RawCsr, load_reference
from packlab.lab.measure.peers.run import compare, prepare, verify
from packlab.lab.measure.peers.summary import findings, smallest_fast, table
from packlab.lab.measure.timing import seeded_indices
from packlab.packing import pack
from packlab.spool.synth import synthesize

HERE = [n for n in peer_names() if not get_peer(n).ENVIRONMENT]
ELSEWHERE = [n for n in peer_names() if get_peer(n).ENVIRONMENT]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    root = tmp_path_factory.mktemp("peers")
    spool = synthesize(root / "spool", num_sequences=150, profile="chat", seed=3)
    plan, _ = pack(spool.lengths, 1024, seed=3)
    return reference_from(spool, plan)


def test_the_reference_holds_the_packed_bins(reference: Reference) -> None:
    from packlab.packing.materialize import iter_bins

    tokens = count = 0
    for i, packed in enumerate(iter_bins(reference.spool, reference.assignment)):  # reused buffers
        for got, want in zip(reference.bin(i), packed, strict=True):
            assert np.array_equal(got, want)
        tokens += packed.packed_len
        count += 1
    assert len(reference) == count > 10 and reference.num_tokens == tokens


def _round_trip(name: str, reference: Reference, directory: Path) -> int:
    peer = get_peer(name)
    assert peer.unavailable() is None, f"{name}: {peer.unavailable()}"
    prepared = prepare(peer, reference, directory)  # writes, opens, verifies every bin
    try:
        assert prepared.bytes_written == bytes_of(peer.files(directory)) > 0
        for i in (0, len(reference) - 1):
            got = peer.as_reference(arrays_of(prepared.opened.read(i)))
            want = [reference.bin(i)[COLUMNS.index(c)] for c in peer.COLUMNS]
            assert len(got) == len(want)
            assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    finally:
        prepared.opened.close()
    return len(reference)


@pytest.mark.parametrize("name", HERE)
def test_every_peer_round_trips_the_reference(name: str, reference: Reference,
                                              tmp_path: Path) -> None:
    # in a forked child: Lance and Vortex start Rust thread pools that are not fork-safe, and
    # the suite forks workers after this test; the libraries stay out of the test process
    assert Child(_round_trip, name, reference, tmp_path / name).result() == len(reference)


def test_tokens_only_systems_say_so() -> None:
    only = {n for n in HERE + ELSEWHERE if get_peer(n).COLUMNS != COLUMNS}
    assert only == {"megatron_indexed", "modalities"}


def test_verify_names_the_system_bin_and_column(reference: Reference, tmp_path: Path) -> None:
    peer = RawCsr()
    peer.write(reference, tmp_path / "csr")
    columns = reference.columns
    mask = columns.loss_mask.copy()
    lo = int(columns.token_offsets[2])
    mask[lo] ^= 1
    tampered = Reference(columns._replace(loss_mask=mask), reference.pack_size)
    opened = peer.open(tmp_path / "csr")
    with pytest.raises(PacklabError, match=r"raw CSR numpy memmap: bin 2 column loss_mask"):
        verify(peer, opened, tampered)


def test_raw_csr_carries_the_reference(reference: Reference, tmp_path: Path) -> None:
    RawCsr().write(reference, tmp_path / "ref")
    loaded = load_reference(tmp_path / "ref")
    assert loaded.pack_size == reference.pack_size and loaded.vocab_size == reference.vocab_size
    assert all(np.array_equal(a, b) for a, b in zip(loaded.columns, reference.columns,
                                                   strict=True))


class _Logged(RawCsr):
    """Raw CSR whose import and write are logged, in order, with the run's clock readings."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def load(self) -> None:
        self.events.append("load")
        super().load()

    def write(self, reference: Reference, directory: Path) -> None:
        self.events.append("write")
        super().write(reference, directory)


def test_write_seconds_time_the_write_and_not_the_import(
        reference: Reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    readings = iter((10.0, 12.5))
    monkeypatch.setattr(run, "time", SimpleNamespace(
        perf_counter=lambda: events.append("clock") or next(readings)))
    prepared = prepare(_Logged(events), reference, tmp_path / "csr")
    prepared.opened.close()
    assert events == ["load", "clock", "write", "clock"]
    assert prepared.write_seconds == 2.5


def _imports_on_load(name: str, module: str) -> tuple[bool, bool]:
    """Whether ``module`` is imported before and after the peer's load, in this process with
    ``module`` forgotten first (a test before may have imported it)."""
    sys.modules.pop(module, None)
    before = module in sys.modules
    get_peer(name).load()
    return before, module in sys.modules


def test_megatrons_load_imports_what_its_writer_uses() -> None:
    # in a forked child: the module forgotten and imported again there, not in the test process
    assert Child(_imports_on_load, "megatron_indexed", MEGATRON_MODULE).result() == (False, True)


class _Missing(Peer):
    NAME = "missing"
    LABEL = "a system not installed"
    REQUIRES = ("packlab_no_such_module",)


def test_a_system_that_cannot_run_is_skipped_with_its_reason(reference: Reference,
                                                             tmp_path: Path) -> None:
    said: list[str] = []
    floor = get_peer("packlab_memmap_v1")
    floor.write(reference, tmp_path / "floor")
    out = compare(reference, tmp_path / "run", [_Missing(), RawCsr()],
                  floor_shard=floor.shard(tmp_path / "floor"),
                  indices=seeded_indices(len(reference), 20, 0), log=said.append)
    assert out["skipped"] == [{"system": "a system not installed", "name": "missing",
                               "reason": "packlab_no_such_module is not installed in this "
                                         "environment"}]
    assert said == ["[peers] skipped a system not installed: packlab_no_such_module is not "
                    "installed in this environment"]
    assert [r["name"] for r in out["rows"]] == ["raw_csr", "memcpy", "python_floor"]


def test_a_packlab_format_that_cannot_run_is_an_error_not_a_skip(
        reference: Reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another library may be missing here; packlab's own formats must be measured (notebook
    11 once skipped megatron_sft: its pair's companions read as three shards)."""
    def broken(self, directory: Path):
        raise PacklabError(f"{directory}: expected one packlab shard, found 3")

    monkeypatch.setattr(type(get_peer("packlab_binidx")), "open", broken)
    with pytest.raises(PacklabError, match="packlab binidx could not be measured: "
                       ".*expected one packlab shard, found 3"):
        side_by_side(reference, tmp_path, names=["packlab_binidx"], samples=20)


def test_a_missing_environment_skips_its_peers_with_the_reason(
        reference: Reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(mds_env.ENVIRONMENTS, "mds", ".venv-nowhere")
    monkeypatch.delenv("PACKLAB_MDS_PYTHON", raising=False)
    out = mds_env.run_elsewhere("mds", ["mds"], reference_dir=tmp_path, floor_shard=tmp_path,
                                out_dir=tmp_path, indices=[0])
    assert out["rows"] == []
    assert "no .venv-nowhere environment here (`make mds-env` builds it" in \
        out["skipped"][0]["reason"]


def test_side_by_side_follows_its_rules(reference: Reference, tmp_path: Path) -> None:
    names = ["raw_csr", "megatron_indexed", "hf_datasets_numpy", "packlab_parquet",
             "packlab_arrow_ipc", *ELSEWHERE]
    result = side_by_side(reference, tmp_path, names=names, samples=40, seed=5)
    rows = {(r["name"], r["environment"]): r for r in result["rows"]}
    assert not result["skipped"], result["skipped"]
    # every system of packlab's environment, then the floors of its loop
    for name in names[:5]:
        row = rows[(name, "venv")]
        assert row["verified_bins"] == len(reference)
        assert row["p50_us"] <= row["p90_us"] <= row["p99_us"]
        files = get_peer(name).files(tmp_path / "venv" / name)
        assert row["bytes_on_disk"] == bytes_of(files)
        assert row["bytes_per_token"] == pytest.approx(row["bytes_on_disk"] / reference.num_tokens)
    assert rows[("python_floor", "venv")]["x_floor"] == pytest.approx(1.0)
    assert rows[("raw_csr", "venv")]["x_raw_csr"] == pytest.approx(1.0)
    assert rows[("megatron_indexed", "venv")]["columns"] == "tokens only"
    assert rows[("hf_datasets_numpy", "venv")]["dtypes"] == "int64/int64/int64"
    # MDS ran in its own environment, raw CSR and the floors beside it in that loop
    for name in ELSEWHERE:
        row = rows[(name, ".venv-mds")]
        assert row["kind"] == "peer" and row["verified_bins"] == len(reference)
    assert {"raw_csr", "memcpy", "python_floor"} <= {
        n for (n, env), r in rows.items() if env == ".venv-mds" and r["kind"] == "floor"}
    assert result["environments"]["mds"]["numpy"] < "2.2"  # its own interpreter, via the harness
    assert result["environments"]["mds"]["peak_rss_growth_bytes"] > 0
    zstd = rows[("mds_zstd", ".venv-mds")]
    assert zstd["bytes_on_disk"] > zstd["bytes_written"]  # decompressed beside the zstd shard
    # the same seeded index list everywhere
    assert result["samples"] == 40
    assert np.array_equal(seeded_indices(len(reference), 40, 5),
                          seeded_indices(len(reference), 40, 5))
    headers, shown = table(result)
    assert len(shown) == len(result["rows"]) and all(len(r) == len(headers) for r in shown)
    assert "tokens only (copied as returned)" in [r[1] for r in shown]
    json.dumps(result)  # recordable as it is


def _row(name: str, kind: str, x: float, size: float, columns: str = "all three") -> dict:
    return {"name": name, "system": name, "kind": kind, "columns": columns, "x_floor": x,
            "p50_us": 4 * x, "bytes_per_token": size, "environment": "venv"}


def test_findings_are_computed_from_the_rows() -> None:
    rows = [_row("raw_csr", "peer", 1.0, 5.0), _row("megatron_indexed", "peer", 0.8, 4.0,
                                                    "tokens only"),
            _row("packlab_binidx", "packlab", 0.95, 5.0), _row("packlab_parquet", "packlab",
                                                               2.0, 2.3),
            _row("lance", "peer", 90.0, 2.2), _row("python_floor", "floor", 1.0, 0.0)]
    out = findings({"rows": rows})
    verdicts = [f["verdict"] for f in out["findings"]]
    assert verdicts == ["holds", "holds", "holds"]  # 0.95 <= 1.0 and <= 90; lance past 10x
    assert out["numbers"]["fastest_full_peer"] == "raw_csr"
    assert out["numbers"]["fastest_library"] == "lance"  # raw CSR is written by hand
    assert out["numbers"]["best_packlab"] == "packlab_binidx"
    rows[2]["x_floor"] = 1.2
    rows[4]["x_floor"] = 7.0  # lance now within 10x of the fastest, and smaller
    out = findings({"rows": rows})
    verdicts = [f["verdict"] for f in out["findings"]]
    assert verdicts == ["does not hold", "holds", "does not hold"]
    assert smallest_fast(rows)["name"] == "lance"
    assert out["numbers"]["best_packlab_vs_fastest_full_peer"] == pytest.approx(1.2)
    assert out["numbers"]["best_packlab_vs_fastest_library"] == pytest.approx(1.2 / 7.0)
    rows[4]["x_floor"] = 1.1  # now the library is faster than packlab's best
    assert findings({"rows": rows})["findings"][1]["verdict"] == "does not hold"


def test_only_the_hand_written_reads_are_not_libraries() -> None:
    assert {n for n in peer_names() if not get_peer(n).LIBRARY and get_peer(n).KIND == "peer"} \
        == {"raw_csr", "arrow_numpy_views"}


def test_labels_overlap_neither_each_other_nor_the_points(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from packlab.lab.measure.peers.figure import MARKER_PX, place_labels, text_box

    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.uniform(3, 5, 8), rng.uniform(10, 400, 6)])
    ys = np.concatenate([rng.uniform(4.9, 5.1, 8), rng.uniform(2, 5, 6)])
    fig, ax = plt.subplots(figsize=(9, 5))
    ax.scatter(xs, ys)
    ax.set_xscale("log")
    ax.set_xlim(2, 800)
    ax.set_ylim(1.5, 6)
    labels = [f"system number {k}" for k in range(len(xs))]
    texts = place_labels(ax, xs, ys, labels)
    renderer = fig.canvas.get_renderer()
    boxes = [text_box(t, renderer) for t in texts]
    assert [t.get_text() for t in texts] == labels
    for a in range(len(boxes)):
        for b in range(a + 1, len(boxes)):
            assert not boxes[a].overlaps(boxes[b]), (labels[a], labels[b])
    for x, y in ax.transData.transform(list(zip(xs, ys, strict=True))):
        for box in boxes:
            assert not (box.x0 < x - MARKER_PX < box.x1 and box.y0 < y < box.y1)
    plt.close(fig)


def test_systems_on_one_spot_share_a_label_and_the_size_as_written_is_plotted() -> None:
    from packlab.lab.measure.peers.figure import coinciding, system_label

    xs = [5.86, 5.92, 5.88, 6.9, 4.82, 35.6, 38.1]
    ys = [5.01, 5.03, 5.01, 5.01, 4.0, 2.1, 2.1]
    names = ["binidx", "memmap_v1", "pbin", "raw CSR", "Megatron-core", "MDS", "HF arrow"]
    groups = coinciding(xs, ys, names)
    assert [g[2].split("\n") for g in groups] == [
        ["Megatron-core"], ["binidx (5.9 µs)", "pbin (5.9 µs)", "memmap_v1 (5.9 µs)"],
        ["raw CSR"], ["MDS (35.6 µs)", "HF arrow (38.1 µs)"]]
    assert groups[1][:2] == (5.86, 5.01)  # at its fastest member
    row = {"system": "MDS (zstd)", "environment": ".venv-mds", "bytes_per_token": 7.04,
           "bytes_per_token_written": 2.1}
    assert system_label(row) == "MDS (zstd) [.venv-mds], 7.0 B/token after reads"
    assert system_label({**row, "environment": "venv", "bytes_per_token": 2.1}) == "MDS (zstd)"


def test_every_system_reads_the_one_index_list_after_a_warm_pass() -> None:
    from packlab.lab.measure.delivery import Sink
    from packlab.lab.measure.peers.run import SETTLE, timed_loop

    seen: dict[str, list[int]] = {"a": [], "b": [], "c": []}

    def reader(name: str):
        def read(i: int) -> tuple[np.ndarray]:
            seen[name].append(i)
            return (np.full(3, i, dtype=np.int32),)
        return read

    indices = seeded_indices(7, 23, 1)
    ns, warmed = timed_loop({n: reader(n) for n in seen}, indices, Sink(8), num_bins=7,
                            rounds=4)
    order = indices.tolist()
    bounds = np.linspace(0, 23, 5).astype(int).tolist()
    expected = list(range(7))  # the warm pass, then per round: the settling reads, the slice
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        expected += [order[k] for k in range(lo - SETTLE, lo)] + order[lo:hi]
    for name, calls in seen.items():
        assert calls == expected
        assert ns[name].shape == (23,) and (ns[name] > 0).all() and warmed[name] == 7


def test_each_round_draws_the_order_of_the_systems_anew() -> None:
    # rotated, a system always followed the same neighbour (and paid for what it left behind)
    from packlab.lab.measure.delivery import Sink
    from packlab.lab.measure.peers.run import SETTLE, timed_loop

    calls: list[tuple[str, int]] = []

    def reader(name: str):
        def read(i: int) -> tuple[np.ndarray]:
            calls.append((name, i))
            return (np.zeros(2, dtype=np.int32),)
        return read

    names = ["a", "b", "c", "d"]
    indices = np.arange(40) % 5
    timed_loop({n: reader(n) for n in names}, indices, Sink(8), num_bins=5, rounds=20, seed=3)
    per = SETTLE + 2  # each system's reads in a round: the settling ones, then its slice of 2
    timed = calls[4 * 5:]  # after every system's warm pass
    orders = [tuple(name for name, _ in timed[r * 4 * per:(r + 1) * 4 * per:per])
              for r in range(20)]
    assert all(sorted(order) == names for order in orders)
    before = {(order[k - 1], order[k]) for order in orders for k in range(1, 4)}
    assert all(len({p for p, n in before if n == name}) >= 2 for name in names)
    assert len(set(orders)) > 5


def test_a_slow_system_reads_a_prefix_of_the_list_within_its_budget() -> None:
    import time

    from packlab.lab.measure.delivery import MIN_SAMPLES, Sink
    from packlab.lab.measure.peers.run import SETTLE, timed_loop

    seen: dict[str, list[int]] = {"slow": [], "fast": []}

    def slow(i: int) -> tuple[np.ndarray]:
        seen["slow"].append(i)
        time.sleep(0.002)
        return (np.zeros(2, dtype=np.int32),)

    def fast(i: int) -> tuple[np.ndarray]:
        seen["fast"].append(i)
        return (np.zeros(2, dtype=np.int32),)

    indices = seeded_indices(300, 60, 2)
    ns, warmed = timed_loop({"slow": slow, "fast": fast}, indices, Sink(8), num_bins=300,
                            rounds=3, max_seconds=0.001)
    assert MIN_SAMPLES <= warmed["slow"] < 300 and warmed["fast"] >= MIN_SAMPLES
    taken = ns["slow"].shape[0]
    assert taken == MIN_SAMPLES  # past its budget from the first read: the minimum, no more
    settle = indices[-SETTLE:].tolist()  # before the first round's slice; none once stopped
    assert seen["slow"] == list(range(warmed["slow"])) + settle + indices[:taken].tolist()


def test_the_harness_runs_another_interpreter_only_in_a_subprocess() -> None:
    from packlab.lab.measure.harness import run_job

    with pytest.raises(PacklabError, match="python= needs isolation='subprocess'"):
        run_job("packlab.lab.measure.jobs:allocate", 1, python="/usr/bin/python3")
