"""Notebook 01's record: the synthetic spools beside real chat text, and tokenizing rates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from packlab.lab.records.base import Record


@dataclass
class SyntheticSpools(Record):
    NOTEBOOK: ClassVar[str] = "01_synthetic_spools"

    chat_length_mean: float
    chat_length_p50: float
    chat_length_p99: float
    chat_over_4096: float
    chat_over_8192: float
    chat_mask_fraction: float
    short_mask_fraction: float
    chat_entropy_bits: float
    chat_bytes_per_token: float
    chat_synth_tokens_per_second: float
    real_num_sequences: int
    real_num_tokens: int
    real_length_p50: float
    real_length_p99: float
    real_mask_fraction: float
    real_entropy_bits: float
    uniform_entropy_bits: float
    zipf_closer: bool
    top_token_share: dict[str, float]
    distinct_ids: dict[str, int]
    closest_profile_to_real: str
    ks_real: dict[str, float]
    lengths_seconds: float
    cpu_count: int | None = None
    bpe_train_seconds: float | None = None
    tokenize_bpe_tokens_per_cpu_second: float | None = None
    tokenize_hf_tokens_per_cpu_second: float | None = None
    tokenize_hf_generation_tokens_per_cpu_second: float | None = None
    tokenize_hf_floor_tokens_per_cpu_second: float | None = None
    tokenize_bpe_speedup: float | None = None
    tokenize_hf_speedup: float | None = None
    tokenize_bpe_cpu_efficiency: float | None = None
    tokenize_hf_cpu_efficiency: float | None = None
    tokenize_max_workers: int | None = None
    tokenize_load_average: float | None = None
    tokenize_same_bytes: bool | None = None
    tokenize_unlocated: int | None = None
    tokenize_hours_13b_1_cores_bpe: float | None = None
    tokenize_hours_13b_1_cores_hf: float | None = None
    tokenize_hours_13b_32_cores_bpe: float | None = None
    tokenize_hours_13b_32_cores_hf: float | None = None
