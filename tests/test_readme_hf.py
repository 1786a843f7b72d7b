"""README, "Using packlab outputs with transformers and TRL": every block of that section runs,
in order, exactly as written (``packlab`` commands line by line, Python blocks in one
namespace), in a scratch directory. ``tokenizer`` is a tokenizer over the synthetic
vocabulary's ids (:func:`packlab.lab.train.hf_model.id_tokenizer`: built here, nothing
downloaded), standing for the reader's own."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from readme_sections import run_section

from packlab.lab.train.hf_model import id_tokenizer

TITLE = "## Using packlab outputs with transformers and TRL"


def test_the_section_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace = {"tokenizer": id_tokenizer(1024)}
    python_blocks, commands = run_section(TITLE, namespace)
    assert (python_blocks, commands) == (3, 2)
    for trainer in (namespace["trainer"], namespace["sft"]):
        assert trainer.state.global_step == 2
        assert math.isfinite(trainer.state.log_history[-1]["train_loss"])
