"""Notebook 06's record: bytes per token per format, Parquet encodings, entropy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from packlab.lab.records.base import Record


@dataclass
class Compression(Record):
    NOTEBOOK: ClassVar[str] = "06_compression"

    bytes_per_token: dict[str, dict[str, float]]
    token_entropy_bits: dict[str, float]
    byte_plane_entropy_bits: dict[str, float]
    pack_efficiency: dict[str, float]
    parquet_vs_legacy: dict[str, float]
    memmap_vs_legacy: dict[str, float]
    zstd_ratio_to_raw: dict[str, float]
    codec_table: list[dict[str, Any]]
    memmap_padding: list[dict[str, Any]]
    layouts: dict[str, list[dict[str, Any]]]
    rfc_layout: dict[str, dict[str, float]]
    smallest_fast: dict[str, dict[str, Any]]
    smallest_fast_tokens_to_entropy: dict[str, float]
    balanced: dict[str, dict[str, Any]]
    smallest_fast_to_entropy: dict[str, float]
    real_text_saving: float
    compact_vs_legacy: dict[str, float]
    uint16_gain_uniform: dict[str, float]
    default_layout: dict[str, Any] | None = None
    smallest_layout: dict[str, Any] | None = None
