"""Shared fixtures: small real spools and assignments on disk, and a quiet home directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from packlab.bins import PackedBin, bin_digest, bins_equal
from packlab.formats import open_writer
from packlab.materialize import iter_bins
from packlab.packing import BinAssignment, pack
from packlab.spool import FILES, MANIFEST, SpoolReader, SpoolWriter

# Libraries that write to the home directory write into a throwaway folder instead.
_HOME = Path(os.environ.get("PACKLAB_TEST_HOME", "/tmp/packlab-test-home"))
os.environ.setdefault("HF_HOME", str(_HOME / "hf"))
os.environ.setdefault("MPLCONFIGDIR", str(_HOME / "mpl"))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


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


def write_empty_spool(path: Path) -> Path:
    """A spool directory of empty files under a zero-count manifest, built by hand (a
    SpoolWriter refuses to publish an empty spool)."""
    path.mkdir()
    for name in FILES.values():
        (path / name).write_bytes(b"")
    manifest = {"version": "spool_v1", "num_sequences": 0, "num_tokens": 0}
    (path / MANIFEST).write_text(json.dumps(manifest))
    return path


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


def _digests_in_child(reader: object, queue: object) -> None:
    digests = [bin_digest(*reader.read_bin(i)) for i in range(len(reader))]  # type: ignore[attr-defined]
    queue.put((digests, reader._pid == os.getpid()))  # type: ignore[attr-defined]


def read_in_forked_child(reader: object) -> tuple[list[str], bool]:
    """Every bin's digest as a forked child (a DataLoader worker) reads it through the parent's
    open ``reader``, and whether the child reopened its own handle."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_digests_in_child, args=(reader, queue))
    child.start()
    result = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
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
