"""Notebook 05's measurements (packlab.lab.measure.latency, throughput, floors, rowgroups,
access_report): delivery, the Python floor, cold reads proven cold, epochs, verdicts."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from conftest import write_random_spool

from packlab import open_dataset
from packlab.bins import bins_equal
from packlab.errors import PacklabError
from packlab.lab.measure.access_report import (
    headline_numbers,
    latency_table,
    mmap_finding,
    mmap_table,
    row_group_findings,
    target_findings,
    throughput_table,
)
from packlab.lab.measure.delivery import MIN_SAMPLES, Sink
from packlab.lab.measure.floors import MMAP_MODES, RamDataset, mmap_floors, python_floor
from packlab.lab.measure.latency import batched_access, random_access
from packlab.lab.measure.pagecache import drop_until_cold, resident_pages, shard_files
from packlab.lab.measure.reading import data_files
from packlab.lab.measure.rowgroups import row_group_miss, row_group_sweep, shuffled_epoch
from packlab.lab.measure.throughput import SAMPLERS, epoch_sampler, loader_rates, scan_rate
from packlab.lab.tables import fmt_us
from packlab.packing import BinAssignment, pack
from packlab.pipeline.shards import write_shards

ROW_GROUP = 8


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One small spool packed once, written as single shards of four formats."""
    root = tmp_path_factory.mktemp("access")
    spool = write_random_spool(root / "spool", num_sequences=240, max_len=500, seed=3)
    plan, _ = pack(spool.lengths, 1024, algorithm="next_fit", seed=0)
    plan.save(root / "assignment.npz")
    out: dict[str, Path] = {"spool": spool.path, "assignment": root / "assignment.npz"}
    options = {"parquet": {"row_group_size": ROW_GROUP}}
    for fmt in ("memmap_v1", "binidx", "parquet", "packed_index"):
        receipt = write_shards(spool, plan, root / fmt, format=fmt, bins_per_shard=10**6,
                               workers=1, **options.get(fmt, {}))
        out[fmt] = root / fmt / receipt[0]["shard"]
    return out


@contextmanager
def counting_decodes() -> Iterator[list[int]]:
    """Row groups the Parquet reader decodes during each timed, delivered read
    (:meth:`Sink.timed`), one count per read, in call order."""
    from packlab.formats.parquet import Reader

    decodes: list[int] = []
    per_call: list[int] = []
    load, timed = Reader._load, Sink.timed

    def counting_load(self: Reader, group: int) -> object:
        decodes.append(group)
        return load(self, group)

    def counting_timed(self: Sink, *args: object, **kwargs: object) -> tuple[int, int]:
        before = len(decodes)
        out = timed(self, *args, **kwargs)
        per_call.append(len(decodes) - before)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Reader, "_load", counting_load)
        mp.setattr(Sink, "timed", counting_timed)
        yield per_call


def _item(n: int, dtype: type = np.int32) -> dict[str, np.ndarray]:
    return {"input_ids": np.arange(n, dtype=dtype), "loss_mask": np.ones(n, dtype=np.uint8),
            "seq_boundaries": np.array([0, n // 2, n], dtype=np.int32)}


def test_sink_copies_every_byte_and_grows() -> None:
    sink = Sink(4)
    assert sink.take(_item(3)) == 3 * 4 + 3 + 3 * 4
    assert sink.ids[:3].tolist() == [0, 1, 2] and sink.ids.dtype == np.int64
    big = _item(100, np.uint16)
    assert sink.take(big) == 100 * 2 + 100 + 12
    assert np.array_equal(sink.ids[:100], np.arange(100))
    assert sink.bounds[:3].tolist() == [0, 50, 100]


def test_sink_timed_arrays_copies_any_container_byte_for_byte() -> None:
    # notebook 11's delivery: a dict's values or a tuple, the same bytes in the same order
    item = _item(3000, np.uint16)
    raw = b"".join(a.tobytes() for a in item.values())
    for got in (item, tuple(item.values()), [a[::-1][::-1] for a in item.values()]):
        sink = Sink(4)
        assert sink.timed_arrays(lambda _, got=got: got, 0) > 0
        assert sink.buffer[:len(raw)].tobytes() == raw


def test_ram_dataset_serves_the_same_bins_through_the_same_path(shards: dict[str, Path]) -> None:
    dataset = open_dataset([shards["memmap_v1"], shards["parquet"]])
    floor = RamDataset(dataset)
    assert len(floor) == len(dataset) and floor.num_tokens == dataset.num_tokens
    for i in (0, len(dataset) // 2 - 1, len(dataset) // 2, len(dataset) - 1, -1):
        assert bins_equal(floor.read_bin(i), dataset.read_bin(i))
    batch = [5, 0, len(dataset) - 1, 5]
    for a, b in zip(floor.__getitems__(batch), dataset.__getitems__(batch), strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    with pytest.raises(IndexError):
        floor[len(dataset)]


def test_data_files_include_the_spool_a_packed_index_reads(shards: dict[str, Path]) -> None:
    files = data_files(open_dataset(shards["packed_index"]))
    assert set(shard_files(shards["spool"])) <= set(files)
    assert set(shard_files(shards["packed_index"])) <= set(files)
    assert set(data_files(open_dataset(shards["memmap_v1"]))) == set(
        shard_files(shards["memmap_v1"]))


def _mapped(array: np.ndarray) -> bool:
    """Whether this process maps the first page of ``array`` (``/proc/self/pagemap``'s present
    bit, readable without privileges)."""
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(array.__array_interface__["data"][0] // page * 8)
        return bool(int.from_bytes(f.read(8), "little") >> 63)


def test_a_read_has_its_bytes_when_it_returns(shards: dict[str, Path]) -> None:
    """binidx reads a bin with ``pread`` into arrays of its own (packlab.storage.reads): when the
    read returns, its bytes are in them, never pages still to fault in from the disk, so a
    benchmark's clock that stops at the return has waited for the data."""
    dataset = open_dataset(shards["binidx"])
    dataset[0]
    tokens = max(shard_files(shards["binidx"]), key=lambda f: f.stat().st_size)
    assert drop_until_cold(shard_files(shards["binidx"])) == 0
    item = dataset[len(dataset) - 1]
    assert item["input_ids"].flags.owndata and _mapped(item["input_ids"])  # in RAM: written
    assert resident_pages(tokens)[0] > 0  # read from the file already, nothing touched yet


@pytest.mark.parametrize("fmt", ["memmap_v1", "binidx", "parquet", "packed_index"])
def test_random_access_warm_and_cold_with_floors(shards: dict[str, Path], fmt: str) -> None:
    floor = python_floor(shards[fmt])
    warm = random_access(shards[fmt], samples=30, floor=floor)
    cold = random_access(shards[fmt], cache="cold", samples=12, floor=floor)
    assert warm["samples"] == 30 and cold["samples"] == 12 and warm["format"] == fmt
    for row in (warm, cold):
        for prefix in ("", "python_floor_", "memcpy_", "pread_"):
            assert 0 < row[f"{prefix}p50_us"] <= row[f"{prefix}p90_us"] <= row[f"{prefix}p99_us"]
        assert row["ratio_to_python_floor"] == pytest.approx(
            row["p50_us"] / row["python_floor_p50_us"])
        assert row["bytes_per_bin"] > 0
        parts = row["p50_by_part_us"]  # each fifth's p50: the whole's lies among them
        assert len(parts) == 5 and min(parts) <= row["p50_us"] <= max(parts)
    assert cold["cold_verified"] is True and cold["cold_max_resident_pages"] == 0
    assert "cold_verified" not in warm


def test_a_cold_parquet_read_decodes_its_row_group(shards: dict[str, Path]) -> None:
    """Cold means the reader holds nothing of the bin: no decoded row group serves it."""
    with counting_decodes() as per_call:
        row = random_access(shards["parquet"], cache="cold", samples=12)
    # the format's 12 reads, each step beside one of its Python floor's (alternating which goes
    # first); memcpy and pread are not reads of the format
    interleaved = [n for k in range(12) for n in ((0, 1) if k % 2 else (1, 0))]
    assert row["cold_verified"] and per_call == interleaved


def test_random_access_stops_at_its_time_budget(shards: dict[str, Path]) -> None:
    row = random_access(shards["memmap_v1"], samples=10_000, max_seconds=0.0)
    assert row["samples"] == MIN_SAMPLES


def test_bad_arguments_are_clear_errors(shards: dict[str, Path]) -> None:
    with pytest.raises(PacklabError, match="warm"):
        random_access(shards["binidx"], cache="hot")
    with pytest.raises(PacklabError, match="samples"):
        random_access(shards["binidx"], samples=0)
    with pytest.raises(PacklabError, match="batch_size"):
        batched_access(shards["binidx"], batch_size=1)
    with pytest.raises(PacklabError, match="policy"):
        shuffled_epoch(shards["parquet"], policy="two")
    with pytest.raises(PacklabError, match="sampler"):
        shuffled_epoch(shards["parquet"], sampler="sorted")
    twice = RamDataset(open_dataset([shards["parquet"], shards["parquet"]]))
    with pytest.raises(PacklabError, match="floor holds"):
        random_access(shards["memmap_v1"], floor=twice)


def test_batched_access_reports_both_paths(shards: dict[str, Path]) -> None:
    row = batched_access(shards["binidx"], batch_size=4, samples=15)
    assert row["samples"] == 15 and row["batch_size"] == 4
    assert row["gain"] == pytest.approx(row["single_p50_us"] / row["batched_p50_us"])
    assert all(row[f"{p}p50_us"] > 0 for p in ("batched_", "single_", "floor_batched_",
                                                "floor_single_"))


@pytest.mark.parametrize("cache", ["warm", "cold"])
def test_scan_rate_reads_every_token(shards: dict[str, Path], cache: str) -> None:
    row = scan_rate(shards["parquet"], cache=cache)
    dataset = open_dataset(shards["parquet"])
    assert row["num_tokens"] == dataset.num_tokens and row["num_bins"] == len(dataset)
    assert row["tokens_per_s"] > 0 and row["python_floor_tokens_per_s"] > 0
    assert row["file_bytes"] == shards["parquet"].stat().st_size


def test_epoch_samplers_cover_the_first_bins_once(shards: dict[str, Path]) -> None:
    dataset = open_dataset(shards["parquet"])
    n = len(dataset) - 3
    for kind in SAMPLERS:
        order = epoch_sampler(dataset, kind, num_bins=n, seed=1).indices()
        assert sorted(order.tolist()) == list(range(n))
    with pytest.raises(PacklabError):
        epoch_sampler(dataset, "sorted")


def test_loader_rates_deliver_exactly_the_bins_asked(shards: dict[str, Path]) -> None:
    rows = loader_rates(shards["parquet"], workers=(0, 2), batch_size=4, max_bins=21,
                               sampler="block")
    assert [r["workers"] for r in rows] == [0, 2]
    assert all(r["bins"] == 21 and r["bins_per_s"] > 0 for r in rows)


def test_shuffled_epochs_count_row_group_decodes(shards: dict[str, Path]) -> None:
    ours = shuffled_epoch(shards["parquet"], policy="lru", sampler="block", window=4)
    assert not ours["projected"] and ours["accesses"] == ours["num_bins"]
    assert ours["row_group_decodes"] == ours["num_row_groups"] > 4  # each decoded once
    today = shuffled_epoch(shards["parquet"], policy="one_row_group", sampler="shuffle")
    assert today["row_group_decodes"] > 2 * today["num_row_groups"]
    part = shuffled_epoch(shards["parquet"], policy="one_row_group", sampler="shuffle",
                                 max_accesses=10)
    assert part["projected"] and part["accesses"] == 10
    assert part["epoch_seconds"] == pytest.approx(part["seconds"] * part["num_bins"] / 10)


def test_row_group_miss_decodes_on_every_read(shards: dict[str, Path], tmp_path: Path) -> None:
    """Every timed read decodes its row group, also when the file has a single one."""
    single = tmp_path / "one"
    write_shards(shards["spool"], BinAssignment.load(shards["assignment"]), single,
                 format="parquet", bins_per_shard=10**6, workers=1, row_group_size=10**6)
    with counting_decodes() as per_read:
        many = row_group_miss(shards["parquet"], samples=15)
        assert per_read == [1] * 15
        per_read.clear()
        one = row_group_miss(next(single.glob("*.parquet")), samples=12)
        assert per_read == [1] * 12
    assert many["samples"] == 15 and many["num_row_groups"] > 1 and many["p50_us"] > 0
    assert one["num_row_groups"] == 1


def test_row_group_sweep_writes_and_measures_each_size(shards: dict[str, Path],
                                                        tmp_path: Path) -> None:
    rows = row_group_sweep(tmp_path, shards["spool"], shards["assignment"], [16, 4],
                                  latency_samples=12)
    assert [r["row_group_size"] for r in rows] == [4, 16]
    for row in rows:
        assert row["num_row_groups"] == -(-row["num_bins"] // row["row_group_size"])
        assert row["bytes_on_disk"] == (tmp_path / f"row_group_{row['row_group_size']}.parquet"
                                        ).stat().st_size
        assert row["write_peak_anon_growth_bytes"] is not None and row["miss_samples"] >= 10
        assert row["scan_tokens_per_s"] > 0 and row["block_epoch_per_bin_us"] > 0
    assert len(row_group_findings(rows)) == 2 + 3


def _sweep_row(size: int, write: float, miss_us: float, scan: float, bins: int = 50_000
               ) -> dict[str, float]:
    return {"row_group_size": size, "num_bins": bins, "write_peak_anon_growth_bytes": write,
            "write_peak_rss_growth_bytes": write * 2, "write_arrow_pool_peak_bytes": write / 2,
            "miss_p50_us": miss_us, "scan_tokens_per_s": scan}


def test_row_group_findings_compute_their_verdicts() -> None:
    rows = [_sweep_row(10000, 190e6, 900.0, 9e7), _sweep_row(100, 30e6, 10.0, 1e7),
            _sweep_row(1000, 21e6, 90.0, 5e7)]
    found = row_group_findings(rows)
    assert [f["verdict"] for f in found[:3]] == ["does not hold", "holds", "holds"]
    assert "~2 MB" in found[0]["claim"] and "~200 MB" in found[2]["claim"]
    assert [f["verdict"] for f in found[3:]] == ["holds"] * 3
    flipped = [_sweep_row(100, 2e6, 100.0, 9e7), _sweep_row(10000, 2e8, 10.0, 1e7)]
    assert [f["verdict"] for f in row_group_findings(flipped)[2:]] == [
        "does not hold"] * 3
    capped = row_group_findings([_sweep_row(10000, 90e6, 1.0, 1.0, bins=4500)])
    assert "20 KB x 4500 rows" in capped[0]["claim"] and capped[0]["verdict"] == "holds"


def _latency(p50: float, floor: float, pread: float, verified: bool = True) -> dict[str, object]:
    return {"p50_us": p50, "python_floor_p50_us": floor, "pread_p50_us": pread,
            "ratio_to_python_floor": p50 / floor, "ratio_to_pread": p50 / pread,
            "cold_verified": verified}


def test_target_findings_compute_their_verdicts() -> None:
    warm = {"memmap_v1": {**_latency(10.5, 10.0, 5.0), "raw_csr_p50_us": 10.0,
                          "ratio_to_raw_csr": 1.05},
            "binidx": {**_latency(13.0, 10.0, 5.0), "raw_csr_p50_us": 10.0,
                       "ratio_to_raw_csr": 1.3}}
    # memmap_v1 and binidx keep a bin in several files: held to 1.3x a pread cold; arrow_ipc
    # (one file) to docs/design.md's 1.5x
    cold = {"memmap_v1": _latency(125.0, 10.0, 100.0), "binidx": _latency(100.0, 10.0, 90.0,
                                                                           verified=False),
            "arrow_ipc": _latency(140.0, 10.0, 100.0),
            "legacy_npy_pickle": _latency(1.0, 1.0, 100.0)}
    epochs = {"today": {"epoch_seconds": 50.0, "projected": True, "accesses": 100},
              "packlab": {"epoch_seconds": 1.0, "projected": False, "accesses": 900}}
    found = target_findings(warm, cold, epochs)

    def verdict(*words: str) -> str:
        (hit,) = [f["verdict"] for f in found if all(w in f["claim"] for w in words)]
        return hit

    assert verdict("memmap_v1:", "Python floor") == "holds"
    assert verdict("memmap_v1:", "raw CSR numpy") == "holds"
    assert verdict("binidx:", "Python floor") == "does not hold"
    assert verdict("binidx:", "raw CSR numpy") == "does not hold"
    assert not [f for f in found if "batched" in f["claim"]]  # measured, not a target
    assert verdict("memmap_v1:", "cold", "1.3x") == "holds"
    assert verdict("binidx:", "cold", "1.3x") == "does not hold"  # pages left: not cold
    assert verdict("arrow_ipc:", "cold", "1.5x") == "holds"
    assert verdict("parquet:", "shuffled") == "does not hold"
    assert not [f for f in found if f["claim"].startswith("legacy_npy_pickle")]  # no cold read
    assert "projected from 100 accesses" in next(f["measured"] for f in found
                                                 if f["claim"].startswith("parquet"))


def test_notebook_tables_and_numbers_carry_every_format() -> None:
    warm = {"memmap_v1": {**_latency(10.0, 9.0, 5.0), "p90_us": 11.0, "p99_us": 30.0,
                          "mean_us": 12.0, "memcpy_p50_us": 1.0, "samples": 5}}
    latency = {"warm": warm, "cold": {}}
    table = latency_table(latency)
    assert "| memmap_v1 | warm | 5 | 10.0 | 11.0 | 30.0 | 12.0 | n/a |" in table
    assert "1.11x" in table
    warm["memmap_v1"].update(raw_csr_p50_us=9.5, ratio_to_raw_csr=10.0 / 9.5)
    assert "| 9.5 |" in latency_table(latency) and "1.053x" in latency_table(latency)
    scans = {"warm": {"memmap_v1": {"tokens_per_s": 2e8, "python_floor_tokens_per_s": 3e8,
                                    "floor_tokens_per_s": 5e8}}, "cold": {}}
    loaders = {"memmap_v1": [{"workers": 0, "steady_bins_per_s": None, "bins_per_s": 900.0,
                              "first_batch_seconds": 0.5}]}
    assert "DataLoader 0 workers bins/s" in throughput_table(scans, loaders)
    numbers = headline_numbers(latency, scans, {}, loaders, [], {})
    assert numbers.formats["memmap_v1"].warm.p50_us == 10.0
    assert numbers.formats["memmap_v1"].dataloader_bins_per_s[0] == 900.0
    assert numbers.formats["memmap_v1"].scan_warm.tokens_per_s == 2e8
    assert fmt_us(12345.6) == "12,346" and fmt_us(None) == "n/a"


def test_mmap_floors_count_what_each_way_reads(tmp_path: Path) -> None:
    import mmap

    data = tmp_path / "data.bin"
    data.write_bytes(np.random.default_rng(0).integers(0, 255, 4 << 20, dtype=np.uint8).tobytes())
    row = mmap_floors(data, nbytes=20_000, samples=4)
    wanted = -(-20_000 // mmap.PAGESIZE)
    assert row["mmap_random_pages"] == wanted and row["mmap_random_willneed_pages"] == wanted
    assert row["pread_pages"] >= wanted and row["mmap_pages"] >= wanted
    assert all(row[f"{mode}_p50_us"] > 0 for mode in MMAP_MODES)
    assert mmap_finding(row)["verdict"] in ("holds", "does not hold")
    assert "mmap_random_willneed" in mmap_table(row)
    with pytest.raises(PacklabError, match="too small"):
        mmap_floors(data, nbytes=8 << 20)


@pytest.mark.parametrize("fmt", ["memmap_v1", "binidx"])
def test_the_raw_csr_floor_gathers_the_same_bins_from_the_same_files(
        shards: dict[str, Path], fmt: str) -> None:
    """The floor is honest only if it moves what the format returns: the same tokens, mask and
    boundaries, gathered by numpy from the format's own files (its Placement); None for a format
    that decodes or gathers (no placement to compare with)."""
    from packlab.lab.measure.floors import raw_floor

    dataset = open_dataset(shards[fmt])
    raw = raw_floor(dataset)
    assert raw is not None and raw_floor(open_dataset(shards["parquet"])) is None
    for placement in raw.placements:
        assert str(placement.tokens.path).startswith(str(shards[fmt]))
    for i in (0, len(dataset) // 2, len(dataset) - 1):
        item = dataset[i]
        raw.read(i)
        n, k = item["input_ids"].shape[0], item["seq_boundaries"].shape[0]
        assert np.array_equal(raw.ids[:n], item["input_ids"])
        assert np.array_equal(raw.mask[:n], item["loss_mask"])
        assert np.array_equal(raw.bounds[:k], item["seq_boundaries"])
    row = random_access(shards[fmt], samples=30)
    assert row["raw_csr_p50_us"] > 0 and row["ratio_to_raw_csr"] > 0
    assert random_access(shards[fmt], cache="cold", samples=3)["raw_csr_p50_us"] is None
    b = batched_access(shards[fmt], batch_size=4, samples=10)
    assert b["raw_single_p50_us"] > 0 and b["raw_batch_p50_us"] > 0 and b["gain_vs_raw"] > 0
