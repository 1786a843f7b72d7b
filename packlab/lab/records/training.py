"""Notebook 10's record: the same small model trained from every format."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from packlab.lab.records.base import Record


@dataclass
class Training(Record):
    NOTEBOOK: ClassVar[str] = "10_training"

    formats: list[str]
    losses_identical: bool
    batches_identical: bool
    runs: int
    steps: int
    step_seconds: dict[str, dict[str, float]]
    wait_seconds: dict[str, dict[str, float]]
    compute_seconds: dict[str, dict[str, float]]
    wait_share: dict[str, dict[str, float]]
    startup_seconds: dict[str, dict[str, float]]
    open_seconds: dict[str, float]
    open_rss_bytes: dict[str, int]
    peak_rss_bytes: dict[str, int]
    peak_anon_bytes: dict[str, int]
    workers_rss_bytes: dict[str, dict[str, int]]
    step_time_ratio: dict[str, float]
    wait_added_share: dict[str, float]
    compute_ratio: dict[str, float]
    resume_identical: bool
    loss_mask_roll: dict[str, float]
    attention_without_mask: dict[str, float]
    wait_added_by: dict[str, str]
    first_difference: dict[str, Any] | None = None
    #: the Hugging Face section (transformers and TRL beside packlab's shard and collator)
    hf: dict[str, Any] | None = None
