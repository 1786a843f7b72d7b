"""The measurement of what the chain of custody costs a pack run: both variants write the same
shards, and the spool's checks are back in place after the unverified runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import write_random_spool

from packlab.errors import FormatError
from packlab.lab.measure.custody import _unverified, custody_cost
from packlab.spool import SpoolReader
from packlab.spool import custody as spool_custody


def test_custody_cost_times_both_variants_and_restores_the_checks(tmp_path: Path) -> None:
    spool = write_random_spool(tmp_path / "spool", num_sequences=200, max_len=300, seed=4)
    checks = SpoolReader.verify_index, SpoolReader.verify_sequences
    row = custody_cost(spool.path, tmp_path / "work", format="memmap_v1", pack_size=512,
                       bins_per_shard=16, repeats=1)
    assert (SpoolReader.verify_index, SpoolReader.verify_sequences) == checks
    assert row["num_tokens"] == spool.num_tokens
    assert all(s > 0 for s in row["seconds"].values()) and row["verification_seconds"] > 0
    assert not (tmp_path / "work").exists()
    tokens = tmp_path / "spool" / "tokens.bin"
    raw = bytearray(tokens.read_bytes())
    raw[5] ^= 1
    tokens.write_bytes(bytes(raw))
    everything = np.arange(spool.num_sequences)
    with _unverified():  # what the unverified variant skips: a damaged spool passes
        SpoolReader(spool.path).verify_sequences(everything)
    spool_custody._VERIFIED.clear()
    with pytest.raises(FormatError, match="tokens.bin: sequences 0..199: checksum mismatch"):
        SpoolReader(spool.path).verify_sequences(everything)
