"""Notebook 11's table and findings, computed from :func:`packlab.lab.measure.peers.side_by_side`'s rows.

Systems measured in another environment (MDS, in ``.venv-mds``) are timed in another process,
so systems are ranked by ``x_floor``: p50 over the in-RAM Python floor measured in the same
process and loop (each process has its own). The findings:

- **speed**: packlab's best format (lowest ``x_floor``) against the fastest peer that returns
  all three columns; holds when packlab's is at or below it. Beside it, the same against the
  fastest *library* returning all three (a project's own reader: ``Peer.LIBRARY``), the
  hand-written reads of the bytes (raw CSR, Arrow numpy views) left out: what a training stack
  choosing a format, not writing its own reader, compares;
- **size**: among every system (peers and packlab formats) within ``within`` x of the fastest
  system's ``x_floor``, the one with the fewest bytes on disk per token (all files, while
  being read); holds when it is packlab's Parquet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from packlab.errors import PacklabError
from packlab.lab.measure.peers.registry import get_peer
from packlab.lab.measure.verdicts import NOT_MEASURED, holds
from packlab.lab.tables import times

SYSTEM_KINDS = ("peer", "packlab")
PARQUET = "packlab_parquet"


def systems(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of systems (not floors), fastest first."""
    return sorted((r for r in rows if r["kind"] in SYSTEM_KINDS), key=lambda r: r["x_floor"])


def floors(rows: Sequence[dict[str, Any]], environment: str = "venv") -> dict[str, dict]:
    """The floors measured in one environment's loop, by name."""
    return {r["name"]: r for r in rows if r["kind"] == "floor" and r["environment"] == environment}


def table(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the side-by-side table (systems fastest first, then the floors;
    skipped systems last with their reason)."""
    headers = ["system", "columns", "p50 µs", "p90 µs", "p99 µs", "x in-RAM floor",
               "x raw CSR", "bytes/token", "accesses", "bins verified", "ran in"]
    out = []
    for r in systems(result["rows"]) + [r for r in result["rows"] if r["kind"] == "floor"]:
        columns = r["columns"] if r["columns"] == "all three" else "tokens only (copied as returned)"
        size = "" if "bytes_per_token" not in r else f"{r['bytes_per_token']:.2f}"
        if "bytes_per_token_written" in r and abs(r["bytes_per_token_written"]
                                                  - r["bytes_per_token"]) > 0.005:
            size += f" ({r['bytes_per_token_written']:.2f} written)"
        out.append([r["system"], columns if r["kind"] != "floor" else "floor",
                    f"{r['p50_us']:,.1f}", f"{r['p90_us']:,.1f}", f"{r['p99_us']:,.1f}",
                    _ratio(r["x_floor"]), _ratio(r["x_raw_csr"]) if "x_raw_csr" in r else "",
                    size, f"{r['samples']:,}", _verified(r), r["environment"]])
    out += [[s["system"], "skipped", "", "", "", "", "", "", "", "", s["reason"]]
            for s in result.get("skipped", [])]
    return headers, out


def _ratio(x: float) -> str:
    """Two decimals below 10x (the fast systems sit within a few percent of each other and
    of the floors: 0.97x, 1.02x), a whole number above."""
    return f"{x:.2f}x" if x < 10 else times(x)


def _verified(row: dict[str, Any]) -> str:
    """``all`` or ``k of n`` (a slow system's time budget ran out first)."""
    if "verified_bins" not in row:
        return ""
    if row["verified_bins"] == row["num_bins"]:
        return "all"
    return f"first {row['verified_bins']:,} of {row['num_bins']:,}"


def best_packlab(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    found = [r for r in systems(rows) if r["kind"] == "packlab"]
    if not found:
        raise PacklabError("no packlab format was measured")
    return found[0]


def fastest_full_peer(rows: Sequence[dict[str, Any]], *, library: bool = False
                      ) -> dict[str, Any] | None:
    """The fastest peer returning all three columns (None: no such peer ran); ``library``:
    the fastest library among them (:attr:`~packlab.lab.measure.peers.base.Peer.LIBRARY`)."""
    found = [r for r in systems(rows) if r["kind"] == "peer" and r["columns"] == "all three"
             and (not library or get_peer(r["name"]).LIBRARY)]
    return found[0] if found else None


def smallest_fast(rows: Sequence[dict[str, Any]], within: float = 10.0) -> dict[str, Any]:
    """Among systems within ``within`` x of the fastest's ``x_floor``, the fewest bytes per
    token (ties: the faster)."""
    ranked = systems(rows)
    if not ranked:
        raise PacklabError("no system was measured")
    limit = within * ranked[0]["x_floor"]
    fast = [r for r in ranked if r["x_floor"] <= limit]
    return min(fast, key=lambda r: (r["bytes_per_token"], r["x_floor"]))


def findings(result: dict[str, Any], *, within: float = 10.0) -> dict[str, Any]:
    """The two questions of the issue, answered from the rows: ``numbers`` and ``findings``
    (``claim``, ``measured``, ``verdict``)."""
    rows = result["rows"]
    best = best_packlab(rows)
    peer = fastest_full_peer(rows)
    library = fastest_full_peer(rows, library=True)
    fastest = systems(rows)[0]
    small = smallest_fast(rows, within)
    parquet = next((r for r in rows if r["name"] == PARQUET), None)
    numbers: dict[str, Any] = {
        "best_packlab": best["name"], "best_packlab_p50_us": best["p50_us"],
        "best_packlab_x_floor": best["x_floor"],
        "fastest_full_peer": peer["name"] if peer else None,
        "fastest_full_peer_p50_us": peer["p50_us"] if peer else None,
        "fastest_full_peer_x_floor": peer["x_floor"] if peer else None,
        "fastest_library": library["name"] if library else None,
        "fastest_library_p50_us": library["p50_us"] if library else None,
        "fastest_system": fastest["name"], "fastest_x_floor": fastest["x_floor"],
        "smallest_within": small["name"], "smallest_within_bytes_per_token":
        small["bytes_per_token"], "within": within,
        "parquet_bytes_per_token": parquet["bytes_per_token"] if parquet else None,
        "parquet_x_floor": parquet["x_floor"] if parquet else None,
    }
    out = []
    for against, key, what in ((peer, "best_packlab_vs_fastest_full_peer", "peer"),
                               (library, "best_packlab_vs_fastest_library", "library")):
        claim = (f"packlab's best format at or below the fastest {what} returning all three "
                 "columns (warm p50)")
        if against is None:
            out.append({"claim": claim, "measured": f"no such {what} ran",
                        "verdict": NOT_MEASURED})
            continue
        ratio = best["x_floor"] / against["x_floor"]
        numbers[key] = ratio
        out.append({
            "claim": claim,
            "measured": f"{best['system']} {best['p50_us']:.2f} µs ({best['x_floor']:.3f}x "
                        f"floor) against {against['system']} {against['p50_us']:.2f} µs "
                        f"({against['x_floor']:.3f}x): {ratio:.3f}x",  # near 1: three digits
            "verdict": holds(ratio <= 1.0)})
    if parquet is None:
        out.append({"claim": f"packlab's Parquet the smallest among systems within {within:g}x "
                    "of the fastest", "measured": "Parquet not measured",
                    "verdict": NOT_MEASURED})
    else:
        fast_enough = parquet["x_floor"] <= within * fastest["x_floor"]
        out.append({
            "claim": f"packlab's Parquet the smallest file among systems within {within:g}x of "
                     "the fastest's p50 (all bytes on disk per token)",
            "measured": f"Parquet {parquet['bytes_per_token']:.2f} B/token at "
                        f"{times(parquet['x_floor'] / fastest['x_floor'])} the fastest "
                        f"({fastest['system']}); smallest within: {small['system']} "
                        f"{small['bytes_per_token']:.2f}",
            "verdict": holds(fast_enough and small["name"] == PARQUET)})
    return {"numbers": numbers, "findings": out}
