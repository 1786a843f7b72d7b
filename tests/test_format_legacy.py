"""legacy_npy_pickle: faithful to today's files, read without running pickle code. What every
format promises (and the memory it grows by): test_format_contract."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import write_random_spool
from hypothesis import given, settings
from hypothesis import strategies as st

from packlab.bins import PackedBin, bins_equal
from packlab.codecs.safe_pickle import UnsafePickleError, load_pickled_npy
from packlab.errors import FormatError, InvariantError, PacklabError
from packlab.formats import detect_format
from packlab.formats.legacy_npy_pickle import Reader, Writer
from packlab.lab.measure.harness import run_job
from packlab.lab.measure.jobs import format_imports
from packlab.lab.measure.workload import make_workload
from packlab.packing import pack
from packlab.packing.materialize import iter_bins
from packlab.sources import open_shard


def random_bins(n: int, pack_size: int, seed: int = 0) -> list[PackedBin]:
    """Valid bins of random length with 1-3 sub-sequences (last token of each has mask 0)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(3, pack_size + 1))
        starts = np.unique(np.concatenate(([0], rng.integers(1, length, size=2)))).astype(np.int32)
        mask = rng.integers(0, 2, size=length).astype(np.uint8)
        mask[np.append(starts[1:], length) - 1] = 0
        ids = rng.integers(0, 50_000, size=length).astype(np.int32)
        out.append(PackedBin(ids, mask, starts))
    return out


def write_shard(path: Path, bins: list[PackedBin], pack_size: int) -> None:
    with Writer(path, pack_size=pack_size, num_bins=len(bins)) as w:
        for b in bins:
            w.write(b)


def assert_dtypes(b: PackedBin) -> None:
    assert (b.input_ids.dtype, b.loss_mask.dtype, b.seq_start_id.dtype) == (
        np.int32, np.uint8, np.int32)


@pytest.fixture
def shard(tmp_path: Path) -> tuple[Path, list[PackedBin]]:
    bins = random_bins(20, 48)
    write_shard(tmp_path / "shard.npy", bins, 48)
    return tmp_path / "shard.npy", bins


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), pack_size=st.integers(8, 900))
def test_round_trip_equals_materialized_bins(
    tmp_path_factory: pytest.TempPathFactory, seed: int, pack_size: int
) -> None:
    root = tmp_path_factory.mktemp("legacy")
    spool = write_random_spool(root / "spool", num_sequences=60, max_len=400, seed=seed)
    assignment, _ = pack(spool.lengths, pack_size, algorithm="next_fit", seed=seed)
    expected = list(iter_bins(spool, assignment, copy=True))
    write_shard(root / "shard.npy", expected, pack_size)
    assert detect_format(root / "shard.npy") == "legacy_npy_pickle"
    reader = open_shard(root / "shard.npy", pack_size=pack_size)
    assert reader.num_bins == len(expected) and reader.pack_size == pack_size
    assert reader.num_tokens == sum(b.packed_len for b in expected)
    got = list(reader.iter_bins())
    assert all(bins_equal(a, b) for a, b in zip(got, expected, strict=True))
    assert_dtypes(got[0])
    np.testing.assert_array_equal(reader.packed_lengths(), [b.packed_len for b in expected])
    assert reader.validate()["num_bins"] == len(expected)


def test_plain_np_load_reads_packlab_files_as_todays_trainers_do(
    shard: tuple[Path, list[PackedBin]],
) -> None:
    path, bins = shard
    data = np.load(path, allow_pickle=True)  # what GPTSFTPackedDataset does (trusted file)
    assert data.dtype == object and data.shape == (len(bins),)
    for item, b in zip(data, bins, strict=True):
        assert set(item) == {"input_ids", "loss_mask", "seq_start_id"}
        assert all(type(v) is list for v in item.values())
        assert item["input_ids"] == b.input_ids.tolist()
        assert item["loss_mask"] == b.loss_mask.tolist()
        assert item["seq_start_id"] == b.seq_start_id.tolist()


@pytest.mark.parametrize("kind", ["lists", "int64 arrays", "int32 arrays", "bool masks"])
def test_files_from_plain_np_save_read_back_identically(tmp_path: Path, kind: str) -> None:
    bins = random_bins(12, 40, seed=7)

    def value(key: str, arr: np.ndarray) -> Any:
        if kind == "lists":
            return arr.tolist()
        if kind == "bool masks" and key == "loss_mask":
            return arr.astype(bool)
        return arr.astype(np.int64 if kind == "int64 arrays" else arr.dtype)

    data = [{k: value(k, v) for k, v in zip(("input_ids", "loss_mask", "seq_start_id"), b,
                                            strict=True)} for b in bins]
    np.save(tmp_path / "plain.npy", data, allow_pickle=True)
    reader = Reader(tmp_path / "plain.npy")
    got = [reader.read_bin(i) for i in range(len(bins))]
    assert all(bins_equal(a, b) for a, b in zip(got, bins, strict=True))
    assert all(assert_dtypes(b) is None for b in got)
    assert reader.pack_size == max(b.packed_len for b in bins)  # inferred: not in the format
    assert reader.validate()["num_bins"] == len(bins)


# -- pickles that would run code ------------------------------------------------------------
class _Payload:
    """An object whose unpickling calls ``call(*args)`` (how a hostile pickle runs code)."""

    def __init__(self, call: Any, *args: Any) -> None:
        self.call, self.args = call, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.call, self.args


def _payloads(marker: Path) -> dict[str, _Payload]:
    return {
        "os.system": _Payload(os.system, f"touch {marker}"),
        "subprocess.check_call": _Payload(subprocess.check_call, ["touch", str(marker)]),
        "builtins.exec": _Payload(exec, f"open({str(marker)!r}, 'w').close()"),
        "numpy.save": _Payload(np.save, str(marker), np.zeros(1)),
    }


def _hostile_file(path: Path, payload: _Payload) -> None:
    """A legacy file whose bin 1 hides the payload inside its loss_mask."""
    bins = random_bins(3, 16)
    data = [{"input_ids": b.input_ids.tolist(), "loss_mask": b.loss_mask.tolist(),
             "seq_start_id": b.seq_start_id.tolist()} for b in bins]
    data[1]["loss_mask"] = [payload]
    np.save(path, np.array(data, dtype=object), allow_pickle=True)


@pytest.mark.parametrize("name", ["os.system", "subprocess.check_call", "builtins.exec",
                                  "numpy.save"])
def test_a_pickle_that_would_run_a_command_is_refused(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "marker"
    path = tmp_path / "hostile.npy"
    _hostile_file(path, _payloads(marker)[name])
    assert detect_format(path) == "legacy_npy_pickle"
    reader = Reader(path)
    with pytest.raises(UnsafePickleError, match=rf"{path}: refused to unpickle global "):
        reader.read_bin(0)
    with pytest.raises(FormatError, match=str(path)):
        reader.validate()
    assert not marker.exists() and not marker.with_suffix(".npy").exists()


def test_the_hostile_file_is_live_under_plain_np_load(tmp_path: Path) -> None:
    """Control: the same kind of file does run its command under np.load(allow_pickle=True)."""
    marker = tmp_path / "marker"
    _hostile_file(tmp_path / "hostile.npy", _payloads(marker)["os.system"])
    with pytest.raises(UnsafePickleError, match="posix.system"):
        load_pickled_npy(tmp_path / "hostile.npy")
    assert not marker.exists()
    np.load(tmp_path / "hostile.npy", allow_pickle=True)
    assert marker.exists()


class _ShortObjectArray:
    """Pickles as an object array of shape (20,) whose state holds only 3 items."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (np._core.multiarray._reconstruct, (np.ndarray, (0,), b"b"),
                (1, (20,), np.dtype(object), False, [1, 2, 3]))


def _raw_npy(path: Path, shape: tuple[int, ...], payload: Any) -> None:
    """A .npy file: an object-array header, then any pickle (np.save would not write these)."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "|O", "fortran_order": False, "shape": shape})
        pickle.dump(payload, f, protocol=3)


def test_a_pickle_that_crashes_numpy_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "short.npy"
    _raw_npy(path, (20,), _ShortObjectArray())
    with pytest.raises(FormatError, match=r"short.npy: corrupted .*pickled with 3"):
        Reader(path).read_bin(0)
    # control: numpy's own unpickling reads past the 3-item list and kills the process
    code = f"import numpy as np; np.load({str(path)!r}, allow_pickle=True)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode < 0


def test_a_memo_index_far_beyond_the_stream_is_refused_before_loading(tmp_path: Path) -> None:
    """One flipped byte of a LONG_BINPUT (a fuzz case) asks the unpickler for a memo of 2.5
    billion entries (20 GB): refused by the walk before the load, in a process capped at 2 GiB
    of address space, where the load would end in a MemoryError instead."""
    path = tmp_path / "memo.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "|O", "fortran_order": False, "shape": (1,)})
        f.write(b"\x80\x02]r" + (1_258_310_400).to_bytes(4, "little") + b".")
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            "from packlab.codecs.safe_pickle import load_pickled_npy\n"
            "from packlab.errors import FormatError\n"
            f"try:\n    load_pickled_npy({str(path)!r})\n"
            "except FormatError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == (f"{path}: corrupted pickle: memo index 1258310400 at byte 131, "
                                   "3 bytes into the stream")


@pytest.mark.parametrize("payload, message", [
    (np.array([1.5]), "dtype 'f8' is not one packed data uses"),
    (np.zeros(2, dtype="V4"), "dtype 'V4' is not one packed data uses"),
    ([np.int64(3)], "list, not the object array"),
])
def test_unexpected_contents_are_clear_format_errors(
    tmp_path: Path, payload: Any, message: str
) -> None:
    path = tmp_path / "odd.npy"
    _raw_npy(path, (1,), payload)
    with pytest.raises(FormatError, match=message):
        Reader(path).read_bin(0)


def test_non_pickled_or_odd_npy_files_are_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "ints.npy", np.arange(10))
    with pytest.raises(FormatError, match="not a legacy packed file"):
        Reader(tmp_path / "ints.npy")
    np.save(tmp_path / "dict.npy", np.array([{"input_ids": [1]}], dtype=object))
    with pytest.raises(FormatError, match="bin 0: missing loss_mask, seq_start_id"):
        Reader(tmp_path / "dict.npy").read_bin(0)
    wide = [{"input_ids": [1, 2**40], "loss_mask": [0, 0], "seq_start_id": [0]}]
    np.save(tmp_path / "wide.npy", wide, allow_pickle=True)
    with pytest.raises(FormatError, match="does not fit int32"):
        Reader(tmp_path / "wide.npy").read_bin(0)
    floats = [{"input_ids": [1.5, 2.0], "loss_mask": [0, 0], "seq_start_id": [0]}]
    np.save(tmp_path / "floats.npy", floats, allow_pickle=True)
    with pytest.raises(FormatError, match="not integers"):
        Reader(tmp_path / "floats.npy").read_bin(0)
    leaking = [{"input_ids": [1, 2], "loss_mask": [0, 1], "seq_start_id": [0]}]
    np.save(tmp_path / "leak.npy", leaking, allow_pickle=True)
    with pytest.raises(InvariantError, match="bin 0: loss_mask is 1"):
        Reader(tmp_path / "leak.npy").validate()
    with pytest.raises(FormatError, match="no such file"):
        Reader(tmp_path / "absent.npy")


# -- damage (a truncated file: test_format_contract) ---------------------------------------------------------------------------------
def test_structural_bit_flips_are_clear_format_errors(shard: tuple[Path, list[PackedBin]]) -> None:
    path, _ = shard
    original = path.read_bytes()
    header_end = original.index(b"\n") + 1
    cases = {
        "magic": 1,                                   # b"NUMPY" -> b"NTMPY"
        "proto opcode": header_end,                   # first pickle byte
        "a key name": original.index(b"seq_start_id") + 2,
        "stop opcode": len(original) - 1,
    }
    for what, position in cases.items():
        flipped = bytearray(original)
        flipped[position] ^= 0x01
        path.write_bytes(bytes(flipped))
        with pytest.raises(FormatError, match=str(path)):
            Reader(path).validate()
        with pytest.raises(FormatError, match=str(path)):
            reader = Reader(path)
            for i in range(reader.num_bins):
                reader.read_bin(i)
        assert what


def test_random_bit_flips_never_escape_as_other_errors(
    shard: tuple[Path, list[PackedBin]],
) -> None:
    """No checksum in this format: a flip is caught by the pickle or the invariants, or it
    changes a value unseen; but never a crash, a hang or an exception other than ours."""
    path, _ = shard
    original = path.read_bytes()
    rng = np.random.default_rng(0)
    caught = 0
    for position in rng.integers(0, len(original), size=150):
        flipped = bytearray(original)
        flipped[position] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(flipped))
        try:
            reader = Reader(path)
            reader.validate()
            for i in range(reader.num_bins):
                assert_dtypes(reader.read_bin(i))
        except PacklabError as exc:
            assert str(path) in str(exc)
            caught += 1
    assert caught > 10  # most flips hit structure (pickle opcodes, lengths, keys)


# -- memory (the contract: it grows with the shard) ------------------------------------------
def test_writer_holds_python_ints_not_five_bytes_a_token(tmp_path: Path) -> None:
    """Faithful to today's writer: every token a Python int in a list until np.save, measured
    in a fresh process by packlab.lab.measure.harness."""
    work = make_workload(tmp_path / "work", 2_000, pack_size=2048)
    report = run_job("packlab.lab.measure.jobs:write_shard", "legacy_npy_pickle", work.spool,
                     work.prefix(2_000), tmp_path / "shard.npy", {},
                     imports=format_imports("legacy_npy_pickle"))
    grew = report["phases"]["write"]["peak_rss_phase_growth_bytes"]
    tokens = Reader(tmp_path / "shard.npy").num_tokens
    print(f"legacy_npy_pickle writer peak RSS growth: {grew / 2**20:.1f} MiB for {tokens:,} "
          f"tokens ({grew / tokens:.0f} bytes a token; numpy int32 + uint8 would be 5)")
    assert grew > 16 * tokens  # an 8-byte list slot per token and per mask, and int objects
