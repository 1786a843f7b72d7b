"""Notebook 04's record: write, load and read peak memory per format as the data grows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Self

from packlab.formats import format_names
from packlab.lab.records.base import Record

PHASES = ("write", "load", "read")


@dataclass
class Phase:
    """One format writing, loading or reading: peak RSS growth by bins measured, and the
    log-log slope of the peak against the bins (write: the anonymous RSS's; ``rss_loglog_slope``
    the whole RSS's)."""

    peak_rss_growth_bytes: dict[int, float] = field(default_factory=dict)
    rss_at_50k_bytes: float | None = None
    loglog_slope: float | None = None
    rss_loglog_slope: float | None = None

    def largest(self) -> tuple[float | None, int | None]:
        """``(peak, bins)`` at the largest size measured (None, None: not measured)."""
        if not self.peak_rss_growth_bytes:
            return None, None
        bins = max(self.peak_rss_growth_bytes)
        return float(self.peak_rss_growth_bytes[bins]), bins


@dataclass
class FormatMemory:
    write: Phase = field(default_factory=Phase)
    load: Phase = field(default_factory=Phase)
    read: Phase = field(default_factory=Phase)


@dataclass
class ReaderMemory:
    """A memory-mapped format's reader as its shard grows (opened and its first bin read, in a
    fresh process): its anonymous and file-backed growth by bins, and how many of the sampled
    bins had a page in memory after a cold open."""

    anon_growth_bytes: dict[int, float] = field(default_factory=dict)
    file_growth_bytes: dict[int, float] = field(default_factory=dict)
    bins_touched_at_open: int | None = None
    bins_sampled: int | None = None

    def added(self) -> float:
        """Anonymous growth at the largest size over that at the smallest."""
        return (self.anon_growth_bytes[max(self.anon_growth_bytes)]
                - self.anon_growth_bytes[min(self.anon_growth_bytes)])


@dataclass
class PeakMemory(Record):
    NOTEBOOK: ClassVar[str] = "04_peak_memory"

    formats: dict[str, FormatMemory]
    num_formats: int | None = None
    legacy_at_50k: dict[str, str] = field(default_factory=dict)
    flat_slope: float | None = None
    flat_writers: list[str] = field(default_factory=list)
    growing_writers: dict[str, float] = field(default_factory=dict)
    tracemalloc_misleading_count: int | None = None
    tracemalloc_misleading: list[dict[str, Any]] = field(default_factory=list)
    traced_measurements: int | None = None
    largest_bins: int | None = None
    largest_traced_bins: int | None = None
    readers: dict[str, ReaderMemory] = field(default_factory=dict)
    reader_pack_size: int | None = None

    @classmethod
    def from_flat(cls, numbers: Mapping[str, Any], parameters: Mapping[str, Any]) -> Self:
        """The run recorded under flat names (``parquet_write_peak_rss_growth_bytes_1000``,
        ``parquet_write_loglog_slope``...), each built from the formats and sizes it measured."""
        names = list(dict.fromkeys([*parameters.get("formats", []), *format_names()]))
        formats = {}
        for fmt in names:
            memory = FormatMemory(**{phase: Phase(
                {s: numbers[k] for s in parameters.get("sizes", [])
                 if (k := f"{fmt}_{phase}_peak_rss_growth_bytes_{s}") in numbers},
                numbers.get(f"{fmt}_{phase}_rss_at_50k_bytes"),
                numbers.get(f"{fmt}_{phase}_loglog_slope"),
                numbers.get(f"{fmt}_{phase}_rss_loglog_slope")) for phase in PHASES})
            if memory != FormatMemory():
                formats[fmt] = memory
        record = cls.from_json({f.name: numbers[f.name] for f in fields(cls)
                                if f.name in numbers} | {"formats": {}})
        record.formats = formats
        return record


def format_memory(rows: Sequence[Mapping[str, Any]], at_50k: Sequence[Mapping[str, Any]], *,
                  write_slopes: Mapping[str, float], write_rss_slopes: Mapping[str, float],
                  load_slopes: Mapping[str, float]) -> dict[str, FormatMemory]:
    """Each format's memory from notebook 04's measurements: the sweep's rows (``format``,
    ``phase``, ``bins``, ``peak_rss_growth_bytes``; a failed job, with an ``error``, left out),
    the RFC table's rows at 50k bins (``rss_bytes``) and the log-log slopes (write: anonymous
    and whole RSS; load)."""
    out: dict[str, FormatMemory] = {}

    def phase(fmt: str, name: str) -> Phase:
        memory = out.setdefault(fmt, FormatMemory())
        return {"write": memory.write, "load": memory.load, "read": memory.read}[name]

    for r in rows:
        if not r.get("error"):
            phase(r["format"], r["phase"]).peak_rss_growth_bytes[r["bins"]] = \
                r["peak_rss_growth_bytes"]
    for r in at_50k:
        phase(r["format"], r["phase"]).rss_at_50k_bytes = r["rss_bytes"]
    for fmt, slope in write_slopes.items():
        phase(fmt, "write").loglog_slope = slope
    for fmt, slope in write_rss_slopes.items():
        phase(fmt, "write").rss_loglog_slope = slope
    for fmt, slope in load_slopes.items():
        phase(fmt, "load").loglog_slope = slope
    return out


def reader_memory_of(result: Mapping[str, Any]) -> dict[str, ReaderMemory]:
    """Each memory-mapped format's :class:`ReaderMemory` from
    :func:`packlab.lab.measure.reader_memory.reader_memory`'s result."""
    out: dict[str, ReaderMemory] = {}
    for row in result["rows"]:
        if row["phase"] == "load" and not row.get("error"):
            memory = out.setdefault(row["format"], ReaderMemory())
            memory.anon_growth_bytes[int(row["bins"])] = float(row["peak_anon_growth_bytes"])
            memory.file_growth_bytes[int(row["bins"])] = float(row["peak_file_growth_bytes"])
    for fmt, touched in result["touched"].items():
        if fmt in out:
            out[fmt].bins_touched_at_open = touched["bins_touched"]
            out[fmt].bins_sampled = touched["bins_sampled"]
    return out
