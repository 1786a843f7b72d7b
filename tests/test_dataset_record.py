"""The dataset record (OUT/dataset.json): written first, finished last; an output directory
knows its shards, so an interrupted, shortened, swapped or duplicated dataset is refused."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import random_job, write_random_spool

from packlab import open_dataset
from packlab.bins import bin_digest
from packlab.errors import FormatError, PacklabError, PacklabWarning
from packlab.formats import format_names, get_format
from packlab.pipeline.dataset_record import (
    DATASET_RECORD,
    read_dataset_record,
    write_dataset_record,
    writing_lock,
)
from packlab.pipeline.layout import build_layout
from packlab.pipeline.receipts import receipt_path
from packlab.pipeline.shards import plan_shards, write_shard, write_shards
from packlab.sources.validate import validate_path

FORMATS = format_names()


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory):
    return random_job(tmp_path_factory.mktemp("manifest"), num_sequences=90, seed=4)


def write(job, out: Path, name: str, **options) -> list[dict]:
    spool, assignment = job
    return write_shards(spool, assignment, out, format=name, bins_per_shard=4, workers=1,
                        **options)


def tree(directory: Path) -> dict[str, bytes]:
    """Every file's bytes, receipts without their timing."""
    out = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name.endswith(".receipt.json"):
            data = json.dumps({k: v for k, v in json.loads(data).items() if k != "seconds"}).encode()
        out[str(path.relative_to(directory))] = data
    return out


@pytest.mark.parametrize("name", FORMATS)
def test_the_manifest_lists_every_shard_with_the_receipts_identity(job, tmp_path, name) -> None:
    receipts = write(job, tmp_path / "out", name)
    manifest = read_dataset_record(tmp_path / "out")
    assert manifest["state"] == "complete" and manifest["format"] == name
    assert [s["name"] for s in manifest["shards"]] == [r["shard"] for r in receipts]
    for entry, receipt in zip(manifest["shards"], receipts, strict=True):
        assert entry["bins"] == receipt["bins"] and entry["sha256"] == receipt["sha256"]
        assert entry["bytes"] == receipt["bytes"] and entry["num_tokens"] == receipt["num_tokens"]
    assert manifest["num_bins"] == job[1].num_bins
    assert validate_path(tmp_path / "out")["dataset_record"] is True


def interrupted(job, out: Path, name: str, written: int) -> None:
    """What a job killed after ``written`` shards leaves: its manifest still "writing"."""
    spool, assignment = job
    plan = plan_shards(spool, assignment, out, format=name, bins_per_shard=4)
    write_dataset_record(out, plan.record)
    for i in sorted(plan.jobs)[:written]:
        write_shard(*plan.jobs[i])


@pytest.mark.parametrize("name", ["parquet", "memmap_v1"])
def test_an_interrupted_job_is_refused_until_the_same_job_finishes_it(job, tmp_path, name) -> None:
    write(job, tmp_path / "whole", name)
    out = tmp_path / "out"
    interrupted(job, out, name, written=3)
    for call in (lambda: open_dataset(out), lambda: validate_path(out)):
        with pytest.raises(FormatError, match=r"incomplete output \(3 of \d+ shards written"):
            call()
    with pytest.raises(PacklabError, match="already holds another output"):  # another job
        write_shards(job[0], job[1], out, format=name, bins_per_shard=5, workers=1)
    kept = {p.name: p.stat().st_ino for p in out.glob("shard_*")}
    write(job, out, name)  # the same job: finishes what is missing
    assert {p.name: p.stat().st_ino for p in out.glob("shard_*") if p.name in kept} == kept
    assert tree(out) == tree(tmp_path / "whole")
    assert len(open_dataset(out)) == job[1].num_bins


@pytest.mark.parametrize("name", FORMATS)
def test_a_missing_or_extra_shard_is_refused(job, tmp_path, name) -> None:
    out = tmp_path / "out"
    write(job, out, name)
    extra = tmp_path / "extra"
    write(job, extra, name)
    gone = out / read_dataset_record(out)["shards"][1]["name"]
    moved = tmp_path / "moved"
    shutil.move(gone, moved)
    for call in (lambda: open_dataset(out), lambda: validate_path(out)):
        with pytest.raises(FormatError, match=f"{gone.name}: missing .*lists it: bins 4..7"):
            call()
    shutil.move(moved, gone)
    assert len(open_dataset(out)) == job[1].num_bins
    stranger = out / "shard_000099" if not gone.suffix else out / f"shard_000099{gone.suffix}"
    (shutil.copytree if gone.is_dir() else shutil.copy)(extra / gone.name, stranger)
    # a shard the record does not list is not the dataset's: ignored, said in one warning
    for call in (lambda: len(open_dataset(out)), lambda: validate_path(out)["num_bins"]):
        with pytest.warns(PacklabWarning, match=f"{stranger.name} not listed in its "
                          f"{DATASET_RECORD}: not part of the dataset, ignored"):
            assert call() == job[1].num_bins


def _swap(a: Path, b: Path, name: str | None = None) -> None:
    """Exchange two shards, their companion files (a Megatron pair's .bin and packlab's
    sidecar) and their receipts (what the fuzzing found validate accepted)."""
    tmp = a.with_name("swap-tmp")
    companions = get_format(name).Reader.companions if name else (lambda entry: [])
    for x, y in ((a, b), *zip(companions(a), companions(b), strict=True),
                 (receipt_path(a), receipt_path(b))):
        x.rename(tmp)
        y.rename(x)
        tmp.rename(y)


@pytest.mark.parametrize("name", FORMATS)
def test_swapped_or_duplicated_shards_are_refused(job, tmp_path, name) -> None:
    out = tmp_path / "out"
    write(job, out, name)
    entries = read_dataset_record(out)["shards"]
    first, second = out / entries[0]["name"], out / entries[1]["name"]
    _swap(first, second, name)
    for call in (lambda: open_dataset(out), lambda: validate_path(out)):
        with pytest.raises(FormatError, match=f"{first.name}: .*(swapped|replaced|bytes)"):
            call()
    _swap(first, second, name)
    digests = [bin_digest(*open_dataset(out).read_bin(i)) for i in range(8)]
    assert len(set(digests)) == 8
    # a shard copied over another, its receipt adjusted to vouch for the copy
    shutil.rmtree(second) if second.is_dir() else second.unlink()
    (shutil.copytree if first.is_dir() else shutil.copy)(first, second)
    facts = get_format(name).Reader
    for a, b in zip(facts.companions(first), facts.companions(second), strict=True):
        shutil.copy(a, b)
    receipt = json.loads(receipt_path(first).read_text())
    receipt_path(second).write_text(json.dumps({**receipt, "shard": second.name}))
    for call in (lambda: open_dataset(out), lambda: validate_path(out)):
        with pytest.raises(FormatError, match=f"{second.name}: "):
            call()


def test_a_damaged_manifest_is_one_error_naming_it(job, tmp_path) -> None:
    out = tmp_path / "out"
    write(job, out, "parquet")
    path = out / DATASET_RECORD
    for damage in (b"{not json", b"\xff\xfe", json.dumps({"version": "packlab_dataset_v1",
                                                          "state": "done"}).encode()):
        path.write_bytes(damage)
        with pytest.raises(FormatError, match=f"{DATASET_RECORD}: "):
            open_dataset(out)


def test_a_job_that_is_not_an_object_is_refused_by_open_and_validate(job, tmp_path,
                                                                      capsys) -> None:
    """``"job": -1`` (one of the fuzzer's record mutations) is one line naming the record, from
    Python and from ``packlab validate``, never an internal error."""
    out = tmp_path / "out"
    write(job, out, "memmap_v1")
    path = out / DATASET_RECORD
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "job": -1}))
    with pytest.raises(FormatError, match=rf"{DATASET_RECORD}: 'job' is a number, not an object"):
        open_dataset(out)
    from packlab.cli import main

    assert main(["validate", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'job' is a number" in err[0]


def test_a_second_job_into_one_directory_is_refused_while_the_first_writes(job, tmp_path) -> None:
    out = tmp_path / "out"
    with writing_lock(out), pytest.raises(PacklabError, match="another packlab job is writing"):
        write(job, out, "parquet")
    assert not list(out.glob("shard_*"))
    write(job, out, "parquet")  # the lock went with the first job
    assert read_dataset_record(out)["state"] == "complete"


# -- layouts: a split links its datasets' shards; each is placed by its directory's manifest ----
@pytest.fixture(scope="module")
def spools(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("layout-spools")
    return [write_random_spool(root / name, num_sequences=160, max_len=300, seed=seed).path
            for name, seed in (("chat", 1), ("code", 2))]


def build(spools: list[Path], out: Path, name: str) -> Path:
    build_layout([str(s) for s in spools], out, format=name, pack_size=512,
                 splits="train=0.8,valid=0.2", bins_per_shard=4, workers=1)
    return out


def dataset_dir(out: Path) -> Path:
    """The directory of the dataset with the most shards in the layout (runs/.../hash/)."""
    homes = [m.parent for m in (out / "runs").rglob(DATASET_RECORD)]
    return max(homes, key=lambda h: len(read_dataset_record(h)["shards"]))


def refused_everywhere(out: Path, pattern: str) -> None:
    for call in (lambda: open_dataset(out, split="train"), lambda: validate_path(out)):
        with pytest.raises(FormatError, match=pattern):
            call()


@pytest.mark.parametrize("name", ["parquet", "memmap_v1"])
def test_a_layouts_split_refuses_a_missing_swapped_or_duplicated_shard(spools, tmp_path,
                                                                       name) -> None:
    whole = build(spools, tmp_path / "whole", name)
    served = [bin_digest(*b) for b in open_dataset(whole, split="train").read_bins(
        range(len(open_dataset(whole, split="train"))))]

    def damaged() -> tuple[Path, Path, Path]:
        out = tmp_path / "out"
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(whole, out, symlinks=True)
        home = dataset_dir(out)
        entries = read_dataset_record(home)["shards"]
        return out, home / entries[0]["name"], home / entries[1]["name"]

    out, first, second = damaged()
    assert [bin_digest(*b) for b in open_dataset(out, split="train").read_bins(
        range(len(served)))] == served
    shutil.move(second, tmp_path / "gone")
    refused_everywhere(out, f"{second.name}.*(broken link|missing)")
    out, first, second = damaged()
    _swap(first, second, name)
    refused_everywhere(out, f"{first.name}: .*(swapped|another shard in its place)")
    out, first, second = damaged()
    (shutil.rmtree if second.is_dir() else Path.unlink)(second)
    (shutil.copytree if first.is_dir() else shutil.copy)(first, second)
    receipt = json.loads(receipt_path(first).read_text())
    receipt_path(second).write_text(json.dumps({**receipt, "shard": second.name}))
    refused_everywhere(out, f"{second.name}: ")
    out, first, _ = damaged()  # the same shard linked twice into a split
    link = next(p for p in (out / "splits" / "train").iterdir() if p.resolve() == first)
    (link.parent / f"again__{link.name}").symlink_to(os.readlink(link))
    refused_everywhere(out, "links to the same shard as")


# -- written before dataset records: the checks their receipts allow ------------------------
@pytest.mark.parametrize("name", ["parquet", "memmap_v1", "legacy_npy_pickle"])
def test_an_output_without_a_dataset_manifest_is_checked_by_its_receipts(job, tmp_path,
                                                                          name) -> None:
    whole = tmp_path / "whole"
    write(job, whole, name)
    (whole / DATASET_RECORD).unlink()  # as written before dataset records existed
    expected = [bin_digest(*b) for b in open_dataset(whole).read_bins(range(job[1].num_bins))]
    assert validate_path(whole)["dataset_record"] is False

    def damaged() -> tuple[Path, list[Path]]:
        out = tmp_path / "out"
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(whole, out)
        return out, sorted(p for p in out.glob("shard_*") if not p.name.endswith(".json"))

    out, shards = damaged()
    assert [bin_digest(*b) for b in open_dataset(out).read_bins(range(len(expected)))
            ] == expected
    for path in (shards[1], receipt_path(shards[1])):  # a shard deleted with its receipt
        (shutil.rmtree if path.is_dir() else Path.unlink)(path)
    for call in (lambda: open_dataset(out), lambda: validate_path(out)):
        with pytest.raises(FormatError, match=f"{shards[2].name}: .*bins 4..7 are missing"):
            call()
    out, shards = damaged()
    _swap(shards[0], shards[1])  # with their receipts: each receipt names the other shard
    for call in (lambda: open_dataset(out), lambda: validate_path(out)):
        with pytest.raises(FormatError, match=f"{shards[0].name}: its receipt is "):
            call()
    out, shards = damaged()  # a shard copied over another, its receipt adjusted
    (shutil.rmtree if shards[1].is_dir() else Path.unlink)(shards[1])
    (shutil.copytree if shards[0].is_dir() else shutil.copy)(shards[0], shards[1])
    receipt = json.loads(receipt_path(shards[0]).read_text())
    receipt_path(shards[1]).write_text(json.dumps({**receipt, "shard": shards[1].name}))
    for call in (lambda: open_dataset(out), lambda: validate_path(out)):
        with pytest.raises(FormatError, match=f"{shards[1].name}: .*bins 0..3 are also in another "):
            call()


def test_a_layout_without_dataset_manifests_opens_and_validates(spools, tmp_path) -> None:
    out = build(spools, tmp_path / "out", "parquet")
    expected = len(open_dataset(out, split="train"))
    for manifest in (out / "runs").rglob(DATASET_RECORD):
        manifest.unlink()
    assert len(open_dataset(out, split="train")) == expected
    assert validate_path(out)["splits"]["train"]["num_bins"] == expected
    home = max({p.resolve().parent for p in (out / "splits" / "train").iterdir()},
               key=lambda h: len(list(h.glob("*.receipt.json"))))
    first, second = sorted(p for p in home.glob("shard_*") if not p.name.endswith(".json"))[:2]
    _swap(first, second)  # the shards only: each receipt now vouches for the other's bytes
    with pytest.raises(FormatError, match=f"{first.name}: holds bins .*receipt|swapped"):
        open_dataset(out, split="train")
    with pytest.raises(FormatError, match=f"{first.name}: "):
        validate_path(out)


def test_validate_checks_each_receipt_against_its_place(job, tmp_path) -> None:
    out = tmp_path / "out"
    write(job, out, "parquet")
    shard = out / read_dataset_record(out)["shards"][1]["name"]
    receipt = json.loads(receipt_path(shard).read_text())
    receipt_path(shard).write_text(json.dumps({**receipt, "bins": [8, 12]}))
    with pytest.raises(FormatError, match=f"{shard.name}: its receipt puts it at bins "
                                          "8..11, its place in the dataset is bins 4..7"):
        validate_path(out)
