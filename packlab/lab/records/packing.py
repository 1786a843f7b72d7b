"""Notebook 02's record: each packing algorithm against the lower bound, its speed, the roll."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self

from packlab.lab.records.base import Record, build


@dataclass
class Algorithm:
    """One packing algorithm at the notebook's N."""

    num_bins: int
    efficiency: float
    bins_over_lower_bound: float
    seconds: float


@dataclass
class Packing(Record):
    NOTEBOOK: ClassVar[str] = "02_packing"

    algorithms: dict[str, Algorithm]
    lower_bound_bins: int
    closest_algorithms: list[str]
    sweep_sizes: list[int]
    sweep_seconds: dict[str, list[float]]
    sweep_loglog_slope: dict[str, float]
    seconds_at_1m: dict[str, float]
    trap: dict[str, int]
    #: packlab's packers beside TRL's BFD on the same lengths, by packer
    beside_trl: dict[str, dict[str, float]] | None = None
    #: bins over the lower bound at each size of the sweep, by algorithm
    sweep_over_bound: dict[str, list[float]] | None = None
    #: every algorithm on each synthetic length profile at the notebook's N, by profile
    profiles: dict[str, dict[str, Algorithm]] | None = None

    @classmethod
    def from_flat(cls, numbers: Mapping[str, Any], parameters: Mapping[str, Any]) -> Self:
        """The run recorded under flat names (``next_fit_seconds``...), one set per algorithm
        of the sweep."""
        algorithms = {a: build(Algorithm, {f.name: numbers[f"{a}_{f.name}"]
                                           for f in fields(Algorithm)})
                      for a in numbers["sweep_loglog_slope"]}
        record = build(cls, {f.name: numbers[f.name] for f in fields(cls)
                             if f.name != "algorithms" and f.name in numbers}
                       | {"algorithms": {}})
        record.algorithms = algorithms
        return record
