"""Each notebook's numbers as a typed record: the recorded run reads into them, a record is
stored as its JSON and read back equal, and a record of the wrong notebook or with an unknown
number is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packlab.errors import PacklabError
from packlab.lab import records, results
from packlab.lab.notebooks import notebook_paths
from packlab.lab.records import PeakMemory, RandomAccess, WriteFormats
from packlab.lab.summaries.record import load_run, recorded_dir


def test_every_notebook_has_a_record_and_the_recorded_run_reads_into_it() -> None:
    run, _ = load_run(recorded_dir())
    assert {p.stem for p in notebook_paths()} == set(records.RECORDS)
    for name, recorded in run.items():
        record = records.load(name, recorded)
        assert type(record) is records.RECORDS[name]
        again = type(record).from_json(json.loads(json.dumps(record.to_json())))
        assert again == record, name


#: notebooks 02, 04 and 05 of the run recorded before typed records (commit 714c54e): flat names
FLAT_RUN = Path(__file__).parent / "data" / "flat_run"


def test_flat_names_become_attributes() -> None:
    run = {p.stem: json.loads(p.read_text()) for p in FLAT_RUN.glob("*.json")}
    assert all(records.KEY not in recorded for recorded in run.values())  # flat, as recorded
    flat = run["05_random_access"]["numbers"]
    access = records.load("05_random_access", run["05_random_access"])
    assert isinstance(access, RandomAccess)
    assert access.formats["memmap_v1"].warm.p50_us == flat["memmap_v1_warm_p50_us"]
    assert access.formats["parquet"].cold.ratio_to_pread == flat["parquet_cold_ratio_to_pread"]
    sizes = run["05_random_access"]["parameters"]["row_group_sizes"]
    assert [r.row_group_size for r in access.row_groups] == sizes
    assert access.row_groups[0].miss_p50_us == flat[f"parquet_rg{sizes[0]}_miss_p50_us"]
    assert access.epoch_seconds["today"] == flat["parquet_epoch_today_seconds"]
    memory = records.load("04_peak_memory", run["04_peak_memory"])
    assert isinstance(memory, PeakMemory)
    peak, bins = memory.formats["parquet"].write.largest()
    largest = max(run["04_peak_memory"]["parameters"]["sizes"])
    assert bins == largest
    assert peak == run["04_peak_memory"]["numbers"][
        f"parquet_write_peak_rss_growth_bytes_{largest}"]
    packing = records.load("02_packing", run["02_packing"])
    assert packing.algorithms["next_fit"].seconds == run["02_packing"]["numbers"][
        "next_fit_seconds"]


def test_a_record_is_stored_as_its_json_and_read_back(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACKLAB_BUILD", str(tmp_path))
    numbers = WriteFormats(bytes_per_token={"parquet": 2.5, "memmap_v1": 5.1}, num_bins=7)
    results.record("03_write_formats", numbers, parameters={"seed": 0})
    stored = results.load("03_write_formats")
    assert stored["record"] == "WriteFormats"
    assert stored["numbers"]["bytes_per_token"] == {"parquet": 2.5, "memmap_v1": 5.1}
    assert records.load("03_write_formats", stored) == numbers
    with pytest.raises(ValueError, match="must be its record"):
        results.record("05_random_access", numbers)


def test_unknown_numbers_and_another_notebooks_record_are_refused() -> None:
    with pytest.raises(PacklabError, match="unknown recorded numbers typo"):
        WriteFormats.from_json({"bytes_per_token": {}, "typo": 1})
    with pytest.raises(PacklabError, match="expected WriteFormats"):
        records.load("03_write_formats", {"record": "PeakMemory", "numbers": {}})
    assert records.load("99_unknown", {"numbers": {}}) is None


def test_int_keys_survive_json() -> None:
    memory = PeakMemory(formats={})
    memory.formats["pbin"] = records.peak_memory.FormatMemory()
    memory.formats["pbin"].write.peak_rss_growth_bytes[1000] = 5.0
    back = PeakMemory.from_json(json.loads(json.dumps(memory.to_json())))
    assert back.formats["pbin"].write.largest() == (5.0, 1000)
