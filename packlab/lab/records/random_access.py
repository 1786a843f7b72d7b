"""Notebook 05's record: one random bin per format and cache state against its floors, scans,
batches, DataLoader rates, integrity costs, the Parquet row-group sweep and shuffled epochs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Self

from packlab.formats import format_names
from packlab.lab.measure.floors import MMAP_MODES
from packlab.lab.records.base import Record, build

#: the shuffled epochs notebook 05 times, by name
EPOCHS = ("today", "packlab reader, uniform shuffle", "packlab")


@dataclass
class Latency:
    """One format, one cache state: :func:`packlab.lab.measure.latency.random_access`'s figures
    (µs, p50 unless said), None where a floor was not measured."""

    p50_us: float
    p90_us: float | None = None
    p99_us: float | None = None
    mean_us: float | None = None
    samples: int | None = None
    python_floor_p50_us: float | None = None
    memcpy_p50_us: float | None = None
    pread_p50_us: float | None = None
    raw_csr_p50_us: float | None = None
    ratio_to_python_floor: float | None = None
    ratio_to_pread: float | None = None
    ratio_to_raw_csr: float | None = None
    p50_by_part_us: list[float] | None = None  # each fifth of the reads: reruns in miniature


@dataclass
class Scan:
    tokens_per_s: float
    ratio_to_floor: float | None = None


@dataclass
class Batched:
    """Per bin, ``__getitems__`` against single reads (``gain``: single over batched)."""

    batched_p50_us: float
    single_p50_us: float
    gain: float | None
    raw_single_p50_us: float | None = None
    gain_vs_raw: float | None = None


@dataclass
class Integrity:
    """What each check adds to a warm read (:mod:`packlab.lab.measure.integrity`)."""

    read_p50_us: float
    check_bin_p50_us: float
    xxh3_p50_us: float
    crc32_p50_us: float
    check_bin_ratio: float
    verified_p50_us: float | None = None
    verify_ratio: float | None = None
    structure_ns_per_bin: float | None = None


@dataclass
class IntegrityRule:
    """:func:`packlab.lab.measure.integrity.defaults_rule`."""

    budget: float
    verify_added: float | None
    check_bin_added: float | None
    verify_default: bool
    check_bin_default: bool


@dataclass
class FormatAccess:
    """Everything notebook 05 measured of one format."""

    warm: Latency | None = None
    cold: Latency | None = None
    scan_warm: Scan | None = None
    scan_cold: Scan | None = None
    batched: Batched | None = None
    dataloader_bins_per_s: dict[int, float | None] = field(default_factory=dict)
    integrity: Integrity | None = None

    def latency(self, cache: str) -> Latency | None:
        return {"warm": self.warm, "cold": self.cold}[cache]


@dataclass
class RowGroupSize:
    """One row-group size of the Parquet sweep (:func:`~packlab.lab.measure.rowgroups.row_group_sweep`)."""

    row_group_size: int
    bytes_on_disk: int
    write_peak_rss_growth_bytes: float
    write_peak_anon_growth_bytes: float
    miss_p50_us: float
    block_epoch_per_bin_us: float
    scan_tokens_per_s: float


@dataclass
class MmapProbe:
    """One cold read of a bin's bytes four ways (:func:`~packlab.lab.measure.floors.mmap_floors`)."""

    p50_us: dict[str, float]  # by mode of MMAP_MODES
    read_ahead_kb: int | None
    mmap_pages: float
    nbytes: int


@dataclass
class RandomAccess(Record):
    NOTEBOOK: ClassVar[str] = "05_random_access"

    formats: dict[str, FormatAccess]
    num_bins: int | None = None
    mmap: MmapProbe | None = None
    integrity_rule: IntegrityRule | None = None
    row_groups: list[RowGroupSize] = field(default_factory=list)
    epoch_seconds: dict[str, float] = field(default_factory=dict)
    shuffled_epoch_speedup: float | None = None
    row_group_decodes: dict[str, int] = field(default_factory=dict)

    def measured(self, cache: str) -> list[str]:
        """The formats with a ``cache`` ("warm" or "cold") random read, in recorded order."""
        return [f for f, a in self.formats.items() if a.latency(cache) is not None]

    @classmethod
    def from_flat(cls, numbers: Mapping[str, Any], parameters: Mapping[str, Any]) -> Self:
        """The run recorded under flat names (``memmap_v1_warm_p50_us``,
        ``parquet_rg1000_miss_p50_us``, ``parquet_epoch_today_seconds``...), each name built
        from the formats, worker counts and row-group sizes the run measured."""
        names = list(dict.fromkeys([*parameters.get("formats", []), *format_names()]))
        workers = parameters.get("loader_workers", [])
        formats = {}
        for fmt in names:
            access = FormatAccess(
                warm=_flat(Latency, numbers, f"{fmt}_warm_"),
                cold=_flat(Latency, numbers, f"{fmt}_cold_"),
                scan_warm=_flat(Scan, numbers, f"{fmt}_scan_warm_"),
                scan_cold=_flat(Scan, numbers, f"{fmt}_scan_cold_"),
                batched=_flat(Batched, numbers, f"{fmt}_", {"gain": "batch_gain",
                                                            "gain_vs_raw": "batch_gain_vs_raw"}),
                dataloader_bins_per_s={w: numbers[k] for w in workers if (
                    k := f"{fmt}_dataloader_{w}_workers_bins_per_s") in numbers},
                integrity=_flat(Integrity, numbers, f"{fmt}_integrity_"))
            if access != FormatAccess():
                formats[fmt] = access
        mmap = None
        if "cold_mmap_p50_us" in numbers:
            mmap = MmapProbe({m: numbers[f"cold_{m}_p50_us"] for m in MMAP_MODES},
                             numbers.get("read_ahead_kb"), numbers["mmap_pages"],
                             numbers["mmap_nbytes"])
        epochs = {e: numbers[k] for e in EPOCHS if (k := f"parquet_epoch_{slug(e)}_seconds")
                  in numbers}
        return cls(formats=formats, num_bins=numbers.get("num_bins"), mmap=mmap,
                   integrity_rule=_flat(IntegrityRule, numbers, "integrity_rule_"),
                   row_groups=[r for s in parameters.get("row_group_sizes", []) if (
                       r := _flat(RowGroupSize, {**numbers, f"parquet_rg{s}_row_group_size": s},
                                  f"parquet_rg{s}_")) is not None],
                   epoch_seconds=epochs,
                   shuffled_epoch_speedup=numbers.get("parquet_shuffled_epoch_speedup"),
                   row_group_decodes=numbers.get("row_group_decodes", {}))


def slug(epoch: str) -> str:
    """The name an epoch was recorded under in the flat shape."""
    return "_".join(epoch.replace(",", " ").split())


def _flat(cls: type, numbers: Mapping[str, Any], prefix: str,
          renamed: Mapping[str, str] | None = None) -> Any:
    """A dataclass from the flat names ``prefix + field`` (``renamed``: a field stored under
    another name), or None when its first field was not recorded."""
    renamed = renamed or {}
    keys = {f.name: prefix + renamed.get(f.name, f.name) for f in fields(cls)}
    if keys[fields(cls)[0].name] not in numbers:
        return None
    return build(cls, {name: numbers[key] for name, key in keys.items() if key in numbers})
