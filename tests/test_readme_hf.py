"""README, "Using packlab outputs with transformers and TRL": every block of that section runs,
in order, exactly as written (``packlab`` commands line by line, Python blocks in one
namespace), from an empty scratch directory; its ``tokenizer`` is the one the section builds
(:func:`packlab.lab.train.hf_model.id_tokenizer`, nothing downloaded)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from readme_sections import run_section

from packlab.lab.train.hf_model import id_tokenizer

TITLE = "## Using packlab outputs with transformers and TRL"


def test_the_section_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    python_blocks, commands = run_section(TITLE, namespace)
    assert (python_blocks, commands) == (3, 2)
    for trainer in (namespace["trainer"], namespace["sft"]):
        assert trainer.state.global_step == 2
        assert math.isfinite(trainer.state.log_history[-1]["train_loss"])
    assert namespace["tokenizer"].get_vocab() == id_tokenizer(1024).get_vocab()
