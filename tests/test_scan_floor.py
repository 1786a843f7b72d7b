"""A sequential scan touches every byte it claims to read, and never beats the raw read.

``packlab bench throughput`` and notebook 05 report a scan beside a raw sequential read of the
same files in the same cache state. A scan that stops the clock before the mapped bytes are
touched, or a floor that times its own buffer allocation, shows a scan faster than the disk.
Judged on ratios measured side by side in one run, with a generous margin for noise; no
wall-clock threshold.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import shard_per_format, write_random_spool

from packlab.formats import format_names
from packlab.lab.measure.throughput import RawRead, scan_rate
from packlab.packing import pack
from packlab.packing.materialize import iter_bins

# A scan through Python is many times slower than copying the same bytes out of the page
# cache (warm, measured ~0.05-0.2 of it); cold, both wait for the device (~0.6-1.0, and a
# memory map's read-around can beat a sequential read() of a small file: 1.6 seen once).
MARGIN = {"warm": 1.25, "cold": 2.0}


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("scan_floor")
    spool = write_random_spool(root / "spool", num_sequences=3000, max_len=1500, vocab_size=60_000)
    assignment, _ = pack(spool.lengths, 2048, algorithm="first_fit_decreasing")
    out: dict = shard_per_format(spool, assignment, root, format_names())
    out["_tokens"] = int(sum(b.input_ids.shape[0] for b in iter_bins(spool, assignment)))
    return out


@pytest.mark.parametrize("cache", ["warm", "cold"])
@pytest.mark.parametrize("name", format_names())
def test_a_scan_never_beats_the_raw_read(name: str, cache: str, shards: dict) -> None:
    row = scan_rate(shards[name], cache=cache, via="reader", repeats=3, budget=0.5)
    assert row["num_tokens"] == shards["_tokens"]
    # every token's id and mask byte was copied out of the bins, inside the timer
    assert row["bytes_delivered"] >= row["num_tokens"] * (2 + 1)
    assert row["ratio_to_floor"] <= MARGIN[cache], (
        f"{name} {cache}: scan {row['tokens_per_s']:.3g} tok/s against the raw read's "
        f"{row['floor_tokens_per_s']:.3g} ({row['ratio_to_floor']:.2f}x)")


def test_the_raw_read_reads_every_byte_into_one_buffer(tmp_path: Path) -> None:
    data = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8)
    files = [tmp_path / "a.bin", tmp_path / "b.bin"]
    files[0].write_bytes(data.tobytes())
    files[1].write_bytes(data[:12345].tobytes())
    read = RawRead(files, chunk=1 << 20)
    buffer = read.buffer
    assert read() == data.nbytes + 12345
    assert read.buffer is buffer and bytes(read.buffer[:12345]) == data[:12345].tobytes()
