"""The questions as measured jobs: each engine in a fresh process (packlab.lab.measure's harness),
time per phase and peak RSS growth over the process's baseline after imports.

Phases: ``open`` (resolve shards, read footers, create views / lazy frames) and ``query``
(run it and fetch every row). Both engines must return the same rows (``digest``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any

from packlab.query.questions import QUESTIONS, digest

ENGINES = ("duckdb", "polars")
ENGINE_IMPORTS = {
    "duckdb": ["duckdb", "packlab.query.views", "packlab.query.questions", "packlab.loading.dataset"],
    "polars": ["polars", "packlab.query.lazy", "packlab.query.questions", "packlab.loading.dataset"],
}


def question_job(engine: str, question: str, data: str, split: str | None = None
                 ) -> Iterator[str]:
    """Generator job for :func:`packlab.lab.measure.run_job`: yields ``open`` then ``query``."""
    q = QUESTIONS[question]
    began = time.perf_counter()
    if engine == "duckdb":
        from packlab.query.run import execute
        from packlab.query.views import connect

        con = connect(data, split=split, tokens=q.tokens)
        opened = time.perf_counter()
        yield "open"
        rows = execute(con, q.sql).fetchall()
        con.close()
    elif engine == "polars":
        from packlab.query.lazy import frames

        plan = q.polars(frames(data, split=split))
        opened = time.perf_counter()
        yield "open"
        rows = plan.collect().rows()
    else:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    done = time.perf_counter()
    yield "query"
    return {"engine": engine, "question": question, "rows": len(rows), "digest": digest(rows),
            "open_seconds": opened - began, "query_seconds": done - opened}


def measure(data: str, *, questions: Sequence[str] | None = None,
            engines: Sequence[str] = ENGINES, repeat: int = 1) -> list[dict[str, Any]]:
    """One row per (question, engine): median query seconds over ``repeat`` fresh processes,
    the largest peak RSS growth seen, and whether every engine returned the same rows."""
    from packlab.lab.measure import run_job

    rows = []
    for question in questions or list(QUESTIONS):
        answers: dict[str, str] = {}
        for engine in engines:
            runs = [run_job("packlab.lab.measure.queries:question_job", engine, question, str(data),
                            imports=ENGINE_IMPORTS[engine]) for _ in range(max(1, repeat))]
            peaks = [max(p["peak_rss_growth_bytes"] for p in r["phases"].values()) for r in runs]
            answers[engine] = runs[0]["result"]["digest"]
            rows.append({
                "question": question, "engine": engine, "rows": runs[0]["result"]["rows"],
                "query_seconds": statistics.median(r["result"]["query_seconds"] for r in runs),
                "open_seconds": statistics.median(r["result"]["open_seconds"] for r in runs),
                "peak_rss_growth_bytes": max(peaks),
            })
        agree = len(set(answers.values())) == 1
        for row in rows[-len(engines):]:
            row["agree"] = agree
    return rows
