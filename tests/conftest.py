"""Shared fixtures: small real spools and assignments on disk, a shard of any format written
through its facts, children to run risky reads in, and a quiet home directory."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packlab.bins import PackedBin, bin_digest, bins_equal
from packlab.errors import FormatError
from packlab.formats import get_format
from packlab.lab.s3server import S3Server
from packlab.packing import BinAssignment, pack
from packlab.packing.materialize import iter_bins
from packlab.sources import open_writer
from packlab.spool import FILES, SPOOL_RECORD, SpoolReader, SpoolWriter

# Libraries that write to the home directory write into a throwaway folder instead.
_HOME = Path(os.environ.get("PACKLAB_TEST_HOME", "/tmp/packlab-test-home"))
os.environ.setdefault("HF_HOME", str(_HOME / "hf"))
os.environ.setdefault("MPLCONFIGDIR", str(_HOME / "mpl"))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fuzz-scale", type=float, default=1.0,
                     help="multiply the mutations per format of tests/test_fuzz.py (CI: 1; "
                          "a long run: 10 or more)")
    parser.addoption("--fuzz-seed", default=None,
                     help="the seed of tests/test_fuzz.py's mutations (default: "
                          "$PACKLAB_FUZZ_SEED, else the commit checked out)")


def pytest_report_header(config: pytest.Config) -> str:
    """The fuzz seed, first thing in the output: a failure reruns from it."""
    from mutations import fuzz_seed

    seed, source = fuzz_seed(config.getoption("--fuzz-seed"))
    return f"fuzz seed: {seed} ({source}; again: --fuzz-seed {seed} or PACKLAB_FUZZ_SEED={seed})"


@pytest.fixture(scope="session")
def fuzz_scale(request: pytest.FixtureRequest) -> float:
    return float(request.config.getoption("--fuzz-scale"))


@pytest.fixture(scope="session")
def fuzz_seed(request: pytest.FixtureRequest) -> str:
    from mutations import fuzz_seed

    return fuzz_seed(request.config.getoption("--fuzz-seed"))[0]


def write_random_spool(
    path: Path,
    *,
    num_sequences: int = 200,
    max_len: int = 700,
    vocab_size: int = 50_000,
    seed: int = 0,
) -> SpoolReader:
    """A spool of random sequences (lengths 1..max_len, random 0/1 masks) written for real."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, size=num_sequences)
    total = int(lengths.sum())
    with SpoolWriter(path, vocab_size=vocab_size, source={"generator": "tests", "seed": seed}) as w:
        w.append_many(
            rng.integers(0, vocab_size, size=total, dtype=np.int64),
            rng.integers(0, 2, size=total, dtype=np.uint8),
            lengths,
        )
    return SpoolReader(path)


def random_job(root: Path, *, num_sequences: int, seed: int, pack_size: int = 512
               ) -> tuple[SpoolReader, BinAssignment]:
    """A random spool under ``root/spool`` packed first-fit decreasing: what a pack job writes."""
    spool = write_random_spool(root / "spool", num_sequences=num_sequences, max_len=300,
                               seed=seed)
    assignment, _ = pack(spool.lengths, pack_size, algorithm="first_fit_decreasing")
    return spool, assignment


def write_empty_spool(path: Path) -> Path:
    """A spool directory of empty files under a zero-count manifest, built by hand (a
    SpoolWriter refuses to publish an empty spool)."""
    path.mkdir()
    for name in FILES.values():
        (path / name).write_bytes(b"")
    manifest = {"version": "spool_v1", "num_sequences": 0, "num_tokens": 0}
    (path / SPOOL_RECORD).write_text(json.dumps(manifest))
    return path


def shard_per_format(spool: SpoolReader, assignment: BinAssignment, root: Path,
                     names: list[str]) -> dict[str, Path]:
    """One shard of every format in ``names`` under ``root/NAME``, all holding the same bins
    (written by the pipeline, as ``packlab pack`` writes them)."""
    from packlab.pipeline.shards import write_shards

    out = {}
    for name in names:
        receipts = write_shards(spool, assignment, root / name, format=name,
                                bins_per_shard=max(assignment.num_bins, 1), workers=1)
        out[name] = root / name / receipts[0]["shard"]
    return out


def run_cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    """``packlab ARGV...`` in this process: exit code, stdout, stderr."""
    from packlab.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, *names: object, prefix: str = "") -> str:
    """The single stderr line of a failed command, checked to start with ``prefix`` and to
    name every one of ``names``."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(prefix), (prefix, lines[0])
    for name in names:
        assert str(name) in lines[0], (name, lines[0])
    return lines[0]


@pytest.fixture
def spool(tmp_path: Path) -> SpoolReader:
    return write_random_spool(tmp_path / "spool")


@pytest.fixture
def assignment(spool: SpoolReader) -> BinAssignment:
    result, _ = pack(spool.lengths, 1024, algorithm="next_fit", seed=0)
    return result


def reference_bins(tmp: Path, *, seed: int = 0, num_sequences: int = 200, max_len: int = 700,
                   pack_size: int = 1024) -> list[PackedBin]:
    """Materialized bins (copies) of a random spool packed with next fit: what a shard must hold."""
    spool = write_random_spool(tmp / f"spool-{seed}", num_sequences=num_sequences,
                               max_len=max_len, seed=seed)
    assignment, _ = pack(spool.lengths, pack_size, algorithm="next_fit", seed=seed)
    return list(iter_bins(spool, assignment, copy=True))


def write_bins(format: str, path: Path, bins: list[PackedBin], pack_size: int,
               **options: object) -> dict:
    """Write ``bins`` as one shard of ``format``; returns the writer's manifest."""
    with open_writer(format, path, pack_size=pack_size, **options) as writer:
        for packed in bins:
            writer.write(packed)
        return writer.finalize()


def assert_reads_back(reader: object, bins: list[PackedBin]) -> None:
    """``reader`` returns exactly ``bins``, as int32 tokens, uint8 masks and int32 starts."""
    assert len(reader) == len(bins)  # type: ignore[arg-type]
    for i, expected in enumerate(bins):
        got = reader.read_bin(i)  # type: ignore[attr-defined]
        assert bins_equal(got, expected), i
        assert got.input_ids.dtype == np.int32 and got.loss_mask.dtype == np.uint8
        assert got.seq_start_id.dtype == np.int32


# -- a shard of any format, decided by its facts, never its name -----------------------------
def shard_path(root: Path, format: str, stem: str = "shard") -> Path:
    """Where a shard of ``format`` goes under ``root``: a directory, or a file with its suffix."""
    return root / f"{stem}{get_format(format).Writer.SUFFIX}"


def writer_options(format: str, spool: SpoolReader, assignment: BinAssignment) -> dict:
    """What a writer of ``format`` takes besides bins: its spool and assignment when it stores
    a reference to them (``NEEDS_SPOOL``)."""
    if get_format(format).Writer.NEEDS_SPOOL:
        return {"spool": spool, "assignment": assignment}
    return {}


def open_format_writer(format: str, path: Path, spool: SpoolReader, assignment: BinAssignment,
                       *, announce: bool = True, **options: Any) -> Any:
    """A writer of ``format`` for the bins of ``assignment`` (their count announced or not,
    unless ``num_bins=`` says otherwise)."""
    options.setdefault("num_bins", assignment.num_bins if announce else None)
    return open_writer(format, path, pack_size=assignment.pack_size,
                       **writer_options(format, spool, assignment), **options)


def write_format_shard(format: str, path: Path, spool: SpoolReader, assignment: BinAssignment,
                       *, announce: bool = True) -> Path:
    """Every bin of ``assignment`` over ``spool`` written as one shard of ``format``."""
    with open_format_writer(format, path, spool, assignment, announce=announce) as writer:
        for packed in iter_bins(spool, assignment):
            writer.write(packed)
    return path


def shard_files_of(format: str, path: Path) -> list[Path]:
    """Every file a shard consists of, largest first: the file itself and its companions
    (a pair's ``.bin``, packlab's sidecar), or a directory's files."""
    facts = get_format(format).Reader
    files = [path / name for name in facts.shard_files()] if facts.is_directory() else [
        path, *(c for c in facts.companions(path) if c.exists())]
    return sorted(files, key=lambda f: -f.stat().st_size)


def digests(bins: Iterator[PackedBin] | list[PackedBin]) -> list[str]:
    return [bin_digest(*b) for b in bins]


# -- children: a forked DataLoader worker, or a read that could crash the interpreter --------
def _send_outcome(conn: Any, fn: Callable[..., Any], args: tuple) -> None:
    try:
        outcome: tuple = ("returned", fn(*args))
    except BaseException as exc:  # noqa: BLE001 - the parent judges what was raised
        outcome = ("raised", type(exc).__name__, str(exc), isinstance(exc, FormatError))
    conn.send(outcome)
    conn.close()


def as_a_terminal_job() -> None:
    """``preexec_fn`` of a command a test watches and signals (with ``process_group=0``, not a
    session of its own: a new session is a new scheduler autogroup, where the nice value would
    weigh against nothing): a lower priority than its watcher, and Ctrl-C's SIGINT handled as a
    terminal's job has it. Started in the background by a shell without job control (``make
    test &``, nohup, some CI runners) the tests inherit SIGINT ignored, and Python keeps an
    ignored SIGINT ignored: the command would finish every time."""
    os.nice(10)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Child:
    """``fn(*args)`` in a forked child (it inherits open readers as a DataLoader worker does)."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        context = multiprocessing.get_context("fork")
        self._receive, send = context.Pipe(duplex=False)
        self.process = context.Process(target=_send_outcome, args=(send, fn, args), daemon=True)
        self.process.start()
        send.close()

    def outcome(self, timeout: float = 120) -> tuple:
        """``("returned", value)`` or ``("raised", type name, message, is a FormatError)``;
        an AssertionError if the child died instead (a signal: a segfault, a bus error)."""
        try:
            if not self._receive.poll(timeout):
                self.process.kill()
                raise AssertionError(f"child {self.process.pid}: no answer within {timeout} s")
            outcome = self._receive.recv()
        except EOFError:
            self.process.join(timeout=60)
            code = self.process.exitcode
            name = signal.Signals(-code).name if code is not None and code < 0 else code
            raise AssertionError(f"child {self.process.pid} died ({name})") from None
        finally:
            self._receive.close()
        self.process.join(timeout=60)
        assert self.process.exitcode == 0, self.process.exitcode
        return outcome

    def result(self, timeout: float = 120) -> Any:
        """What ``fn`` returned; an AssertionError naming anything it raised."""
        outcome = self.outcome(timeout)
        assert outcome[0] == "returned", outcome
        return outcome[1]


# -- jobs for packlab.lab.measure.harness (importable: the measured child imports this module) ---
def read_every_bin_and_keep(path: str) -> Iterator[str]:
    """``load``: open the shard, read bin 0; ``read``: read every bin and keep them all alive
    (each touched), so the phase's growth is what the kept bins cost."""
    from packlab.sources import open_shard

    reader = open_shard(path)
    first = reader.read_bin(0)
    yield "load"
    kept = reader.read_bins(range(len(reader)))
    touched = sum(int(b.input_ids[-1]) + int(b.loss_mask[-1]) for b in kept)
    yield "read"
    return {"num_bins": len(kept), "num_tokens": int(sum(b.packed_len for b in kept)),
            "touched": touched + first.packed_len}


def write_repeated_bin(format: str, path: str, num_bins: int, pack_size: int,
                       announce: bool) -> Iterator[str]:
    """``write``: one synthetic bin of ``pack_size - 48`` tokens written ``num_bins`` times
    (no spool to map: a writer's own memory and nothing else), the count announced or not."""
    n = pack_size - 48
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 50_000, size=n).astype(np.int32)
    starts = np.array([0, n // 4, n // 2, 3 * n // 4], dtype=np.int32)
    mask = rng.integers(0, 2, size=n).astype(np.uint8)
    mask[np.append(starts[1:], n) - 1] = 0
    one = PackedBin(ids, mask, starts)
    with open_writer(format, Path(path), pack_size=pack_size,
                     num_bins=num_bins if announce else None) as writer:
        for _ in range(num_bins):
            writer.write(one)
    yield "write"
    return {"num_bins": num_bins, "num_tokens": num_bins * n}


BUCKET = "lab"  # the bucket the ``server`` fixture creates


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    """A local S3-compatible server on 127.0.0.1 with bucket :data:`BUCKET`, for one test
    module; stopped (and checked stopped) after it."""
    with S3Server() as srv:
        srv.create_bucket(BUCKET)
        yield srv
    assert not srv.running


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests first: two workers (``make test``) then share the long ones from the
    start and end on short ones together, instead of one worker finishing a notebook alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
