"""A format per use case, decided on what the use case's users feel, so a rerun keeps it.

What a user of packed data feels is the data wait a format adds to a training step, the
memory it costs a node (one process's peak times every rank and DataLoader worker), who else
reads the files, and the bytes they take. Each use case names the formats it can use, then
applies its criteria in order: a criterion keeps the formats whose value is within its band of
the best, and the next criterion chooses among those; after the last, the first by name.

The bands are what makes an answer survive a rerun. A difference inside a band is one no user
would notice, so no timing noise inside it can move the answer:

- **data wait**: a read that is slower than the fastest by less than :func:`noticed_us` (1%
  of what the bin's tokens cost to train at the least, or 10% of the fastest read, whichever
  is larger) ties;
- **memory per node**: load peaks times :data:`PROCESSES_PER_NODE` within
  :data:`NODE_MEMORY_BAND` tie;
- **bytes on disk**: within :data:`SIZE_BAND` of the smallest tie;
- **who reads the files**: the released stacks and tools that read the bins' tokens as
  packlab writes them (a count, no band: a fact, not a measurement).

Rows come from :func:`packlab.lab.summaries.front.format_rows`; :func:`in_fifth` gives the
same rows with one fifth of the run's reads (a rerun in miniature).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Row = Mapping[str, Any]

#: the least accelerator time one token trains for: a model of 1e9 parameters (6 FLOP a
#: parameter a token, forward and backward) on one H100 at its dense bf16 peak, 989 TFLOP/s
TRAIN_SECONDS_PER_TOKEN = 6 * 1e9 / 989e12
#: the share of that time a bin's data wait may differ by and no step notice it
NOTICED_SHARE = 0.01
#: a read within this factor of the fastest is the same read, however large the bin's budget
SPEED_FACTOR = 1.10
#: the processes of one node that each open the dataset: 8 ranks times 8 DataLoader workers
PROCESSES_PER_NODE = 64
#: load peaks (times the processes of a node) closer than this tie: 16 MB a process, ten times
#: what one format's peak moves between runs, and under 0.1% of an 8-GPU node's host memory
NODE_MEMORY_BAND = 1e9
#: sizes within this factor of the smallest tie: a size is the same at every run (the same bins,
#: the same encoders), so the band is for what a person would choose a format on
SIZE_BAND = 1.10
#: the pack size notebook 05 reads at default scale, for a run that did not record its own
REFERENCE_PACK_SIZE = 4096
#: the reader whose tokens make a format usable by Megatron's pretraining tools
MEGATRON_CORE = "Megatron-core"


def noticed_us(pack_size: int) -> float:
    """The data wait a ``pack_size`` bin may add and no step notice: 1% of its training time
    at the least (248 µs for 4,096 tokens)."""
    return NOTICED_SHARE * TRAIN_SECONDS_PER_TOKEN * pack_size * 1e6


@dataclass(frozen=True)
class Criterion:
    """One thing a user feels: a row's value (lower is better; None: not measured) and how
    far above the best a value still ties."""

    name: str
    value: Callable[[Row], float | None]
    band: Callable[[float], float]


@dataclass(frozen=True)
class UseCase:
    name: str
    eligible: Callable[[Row], bool]
    criteria: tuple[Criterion, ...]
    who: str  #: which formats it can use, in words


def _speed(name: str, key: str, unit_us: float, noticed: float) -> Criterion:
    """A data wait in ``key`` (``unit_us`` µs a unit): ties within the noticed wait or within
    :data:`SPEED_FACTOR` of the fastest."""
    return Criterion(name, lambda r: r.get(key),
                     lambda best: max(noticed / unit_us, (SPEED_FACTOR - 1) * best))


def _cold(row: Row) -> float | None:
    """A cold read; a format that loads every bin at open reads them all from memory."""
    return row["warm_p50_us"] if row["in_ram"] else row["cold_p50_us"]


def _node_memory(row: Row) -> float | None:
    load = row["load_peak_bytes"]
    return None if load is None else load * PROCESSES_PER_NODE


def _readers(row: Row) -> float:
    return -len(row["token_readers"])


def _relative(factor: float) -> Callable[[float], float]:
    return lambda best: (factor - 1) * best


def use_cases(pack_size: int) -> tuple[UseCase, ...]:
    """The use cases, in the order the report prints them."""
    noticed = noticed_us(pack_size)
    warm = _speed("warm read", "warm_p50_us", 1.0, noticed)
    cold = Criterion("cold read", _cold, lambda best: max(noticed, (SPEED_FACTOR - 1) * best))
    readers = Criterion("who reads the files", _readers, lambda best: 0.0)
    memory = Criterion("memory per node", _node_memory, lambda best: NODE_MEMORY_BAND)
    disk = Criterion("bytes on disk", lambda r: r["disk_bytes_per_token"], _relative(SIZE_BAND))
    stored = Criterion("bytes stored", lambda r: r["bytes_per_token"], _relative(SIZE_BAND))
    remote = _speed("wait on object storage", "s3_wait_ms", 1e3, noticed)
    return (
        UseCase("local training",
                lambda r: not r["in_ram"] and r["warm_p50_us"] is not None
                and r["cold_p50_us"] is not None and r["load_peak_bytes"] is not None,
                (warm, cold, readers, memory, disk),
                "formats that open lazily (one that loads every bin at open holds the whole "
                "dataset in every process)"),
        UseCase("object storage",
                lambda r: r["reads_in_place"] and r["bytes_per_token"] is not None,
                (remote, readers, memory, stored),
                "formats read in place by ranged requests (the others are downloaded whole "
                "before their first bin)"),
        UseCase("repacking often", lambda r: r["bytes_per_token"] is not None,
                (Criterion("bytes a repack writes", lambda r: r["bytes_per_token"],
                           _relative(SIZE_BAND)), warm, cold, readers, memory),
                "every format measured (a repack rewrites what a format stores)"),
        UseCase("Megatron pretrain tooling",
                lambda r: MEGATRON_CORE in r["token_readers"] and r["warm_p50_us"] is not None,
                (warm, cold, memory, disk),
                "formats whose tokens megatron-core's `IndexedDataset` reads as they are"),
    )


def decide(case: UseCase, rows: Sequence[Row]) -> dict[str, Any]:
    """``case``'s format: ``format`` (None when no format is eligible), ``tied`` (equal by
    every criterion: the name chose), ``eligible``, ``steps`` (each criterion with the formats
    it kept, or ``skipped`` when a candidate was not measured on it)."""
    kept = sorted((r for r in rows if case.eligible(r)), key=lambda r: r["format"])
    eligible = _names(kept)
    steps: list[dict[str, Any]] = []
    for criterion in case.criteria:
        if len(kept) <= 1:
            break
        values = [criterion.value(r) for r in kept]
        if any(v is None for v in values):
            steps.append({"criterion": criterion.name, "skipped": True, "kept": _names(kept)})
            continue
        best = min(v for v in values if v is not None)
        limit = best + criterion.band(best)
        kept = [r for r, v in zip(kept, values, strict=True) if v is not None and v <= limit]
        steps.append({"criterion": criterion.name, "skipped": False, "best": best,
                      "limit": limit, "kept": _names(kept)})
    best_row = kept[0] if kept else None
    return {"use_case": case.name, "format": best_row["format"] if best_row else None,
            "row": best_row, "tied": _names(kept[1:]), "eligible": eligible, "steps": steps}


def _names(rows: Sequence[Row]) -> list[str]:
    return [r["format"] for r in rows]


def decide_all(rows: Sequence[Row], pack_size: int) -> list[dict[str, Any]]:
    return [decide(case, rows) for case in use_cases(pack_size)]


# -- reruns ------------------------------------------------------------------------------------
def fifths(rows: Sequence[Row]) -> int | None:
    """How many parts the run's reads were timed in (each a rerun in miniature); None when a
    format read warm or cold lacks them (a run recorded before them)."""
    counts = [len(r[f"{key}_parts"]) for r in rows for key in ("warm_p50_us", "cold_p50_us")
              if r[key] is not None and r.get(f"{key}_parts") is not None]
    lacking = any(r[key] is not None and r.get(f"{key}_parts") is None
                  for r in rows for key in ("warm_p50_us", "cold_p50_us"))
    return None if lacking or not counts else min(counts)


def in_fifth(rows: Sequence[Row], part: int) -> list[dict[str, Any]]:
    """The rows with every read's p50 taken from one part of the run's reads."""
    out = []
    for r in rows:
        row = dict(r)
        for key in ("warm_p50_us", "cold_p50_us"):
            if r[key] is not None:
                row[key] = r[f"{key}_parts"][part]
        out.append(row)
    return out


def fifth_agreement(rows: Sequence[Row], pack_size: int) -> dict[str, tuple[int, int]]:
    """Per use case, in how many parts of the run the rule chooses what the whole run
    chooses, of how many (empty: the run has no parts)."""
    parts = fifths(rows)
    if parts is None:
        return {}
    whole = {c["use_case"]: c["format"] for c in decide_all(rows, pack_size)}
    same = dict.fromkeys(whole, 0)
    for k in range(parts):
        for choice in decide_all(in_fifth(rows, k), pack_size):
            same[choice["use_case"]] += choice["format"] == whole[choice["use_case"]]
    return {case: (n, parts) for case, n in same.items()}


def agreement(ours: Sequence[Mapping[str, Any]], theirs: Sequence[Mapping[str, Any]]
              ) -> list[dict[str, Any]]:
    """Two runs' answers side by side: per use case, each run's format and whether they agree."""
    other = {c["use_case"]: c["format"] for c in theirs}
    return [{"use_case": c["use_case"], "this": c["format"], "other": other.get(c["use_case"]),
             "same": c["format"] == other.get(c["use_case"])} for c in ours]
