"""README, "Integrity on read" and "Python": every block of the two sections runs, in order,
exactly as written, in an empty scratch directory (``packlab`` commands line by line, Python
blocks in one namespace per section)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from readme_sections import run_section

from packlab.errors import FormatError
from packlab.loading.samplers import BlockShuffleSampler

INTEGRITY = "### Integrity on read"
PYTHON = "## Python\n"


def test_the_integrity_section_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    assert run_section(INTEGRITY, namespace) == (1, 2)
    assert set(namespace["item"]) == {"input_ids", "loss_mask", "seq_boundaries"}
    # what its comment says of a damaged bin, on the output the section made
    tokens = tmp_path / "checked" / "shard_000000" / "data.bin"
    raw = np.fromfile(tokens, np.uint8)
    raw[raw.shape[0] // 2] ^= 1  # a token of a bin in the middle
    raw.tofile(tokens)
    import packlab

    dataset = packlab.open_dataset("checked", verify=True)
    refused = []
    for i in range(len(dataset)):
        try:
            dataset[i]
        except FormatError as exc:
            refused.append(str(exc))
    assert len(refused) == 1
    assert re.match(r"checked/shard_000000: bin \d+: checksum mismatch", refused[0])

def test_the_python_section_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    assert run_section(PYTHON, namespace) == (2, 0)
    train, sampler = namespace["train"], namespace["sampler"]
    assert isinstance(sampler, BlockShuffleSampler) and len(sampler) == len(train)
    assert sampler.num_blocks == sum(r.num_row_groups for r in train.readers())
    assert sorted(sampler) == list(range(len(train))) and sampler.epoch == 1
    assert namespace["batch"]["tokens"].shape[0] <= 4
