"""Notebook 12's record: the RFC's scale, end to end, every stage measured the same way."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from packlab.lab.measure.stages import StageResult
from packlab.lab.records.base import Record


@dataclass
class ScalePlan:
    """How many sequences the run packs, and why (the free disk, computed up front)."""

    requested: int
    num_sequences: int
    free_bytes: int
    bytes_per_sequence: float  # the spool and the largest output, per sequence (a pilot)
    reason: str


@dataclass
class AtScale(Record):
    """``stages`` by key (``synth``, ``pack:binidx``, ``reads:binidx``, ...), in the order they
    ran; ``baseline``: the format every other format's reads are compared with; ``byte_identical``: the pack killed half-way and finished by the same command wrote
    what the uninterrupted one did (every file's sha256; ``differing_files`` where not)."""

    NOTEBOOK: ClassVar[str] = "12_at_scale"

    plan: ScalePlan
    num_tokens: int
    baseline: str = ""  # the format the others' reads are compared with (the run's first)
    num_bins: dict[str, int] = field(default_factory=dict)
    stages: dict[str, StageResult] = field(default_factory=dict)
    byte_identical: bool | None = None
    resumed_files: int = 0
    differing_files: list[str] = field(default_factory=list)
    seconds: float = 0.0
