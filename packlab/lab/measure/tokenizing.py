"""Tokenizing throughput: tokens/s per core for each tokenizer path, how it scales with workers,
and what that means for a post-training corpus of 13B tokens (notebook 01).

Each run is the command's own path (:func:`packlab.tokenize.tokenize_chat_jsonl`: JSON parsing,
the chat template, encoding, the mask, the spool write; with workers, also the line index, the
jobs and the merge), timed end to end. Runs are interleaved (every repeat runs every path at
every worker count once, in turn) and the median is reported, so a neighbour's load falls on
all of them alike. Beside each path, its floor: the tokenizer alone encoding the same chats,
already rendered, in this process (no pipeline does better on one core).

The machines are shared, so a core's rate is counted in CPU time (user + system seconds of the
process and its pool workers): tokens per CPU second is what one core does when it is ours,
whatever the neighbours run; wall-clock tokens/s and the speedup over one worker are reported
beside it, with the load average during the runs. The projection for ``N`` cores is ``tokens /
(tokens per CPU second x N)``, the CPU rate taken from the run with the most workers (so the
parallel overhead is paid): it assumes ``N`` cores of our own and that the serial parts (the
line index, the merge, both at disk speed) stay small beside ``N`` tokenizing cores; more
cores than this machine has were not measured.
"""

from __future__ import annotations

import os
import resource
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packlab.storage.files import sha256_file, staged
from packlab.tokenize import (
    ChatTokenizer,
    HFChatTokenizer,
    Unlocated,
    encoder_spec,
    iter_file_records,
    load_encoder,
    tokenize_chat_jsonl,
    validate_messages,
)

CORPUS_TOKENS = 13e9  # ~13M samples of a current post-training corpus, ~1,000 tokens each
CORES = (1, 2, 8, 32, 128)


def repeat_jsonl(source: str | os.PathLike[str], out: str | os.PathLike[str],
                 copies: int) -> Path:
    """``source`` written ``copies`` times into ``out`` (a bigger corpus to time)."""
    out = Path(out)
    with staged(out, overwrite=True) as tmp, open(tmp, "wb") as f:
        for _ in range(max(1, copies)):
            with open(source, "rb") as src:
                shutil.copyfileobj(src, f)
    return out


def tokenize_rates(jsonl: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                   paths: Mapping[str, Mapping[str, Any]], worker_counts: Sequence[int] = (1, 2),
                   repeats: int = 1) -> list[dict[str, Any]]:
    """One row per (path, workers), medians over ``repeats``: wall seconds and tokens/s, CPU
    seconds (this process and its workers) and tokens per CPU second (the rate of one core,
    whatever else the machine runs), speedup and efficiency over the fewest workers (wall
    clock), CPU efficiency (tokens per CPU second against the fewest workers': what the
    parallel run costs in extra CPU), the floor's tokens per CPU second, and whether the
    spool's bytes equal the fewest workers'. ``paths`` maps a name to ``tokenize_chat_jsonl`` options
    (``{"encoding": ...}`` or ``{"tokenizer": ..., "chat_template": ...}``)."""
    out_dir = Path(out_dir)
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {}
    floors: dict[str, list[float]] = {}
    counts: dict[str, tuple[int, int]] = {}
    load = os.getloadavg()[0]
    for _ in range(max(1, repeats)):
        for name, options in paths.items():
            floors.setdefault(name, []).append(encode_floor(jsonl, options))
            for workers in worker_counts:
                wall, cpu = -time.perf_counter(), -_cpu_seconds()
                spool = tokenize_chat_jsonl(jsonl, out_dir / f"{_slug(name)}-{workers}",
                                            workers=workers, overwrite=True, **options)
                wall, cpu = wall + time.perf_counter(), cpu + _cpu_seconds()
                runs.setdefault((name, workers), []).append((wall, cpu))
                counts[name] = (spool.record["source"]["stats"]["records"], spool.num_tokens)
    load = max(load, os.getloadavg()[0])
    digests = {key: _digests(out_dir / f"{_slug(key[0])}-{key[1]}") for key in runs}
    rows = []
    for name in paths:
        records, tokens = counts[name]
        fewest = min(worker_counts)
        base = tokens / float(np.median([w for w, _ in runs[(name, fewest)]]))
        base_cpu = tokens / float(np.median([c for _, c in runs[(name, fewest)]]))
        floor = float(np.median(floors[name]))
        for workers in worker_counts:
            wall = float(np.median([w for w, _ in runs[(name, workers)]]))
            cpu = float(np.median([c for _, c in runs[(name, workers)]]))
            speedup = tokens / wall / base
            rows.append({"path": name, "workers": workers, "records": records, "tokens": tokens,
                         "seconds": wall, "tokens_per_second": tokens / wall,
                         "cpu_seconds": cpu, "tokens_per_cpu_second": tokens / cpu,
                         "speedup": speedup, "efficiency": speedup * fewest / workers,
                         "cpu_efficiency": tokens / cpu / base_cpu,
                         "floor_tokens_per_cpu_second": floor,
                         "share_of_floor": tokens / cpu / floor, "load_average": load,
                         "same_bytes": digests[(name, workers)] == digests[(name, fewest)]})
    return rows


def encode_floor(jsonl: str | os.PathLike[str], options: Mapping[str, Any]) -> float:
    """Tokens per CPU second of the tokenizer alone on the chats of ``jsonl``, rendered
    beforehand."""
    encoder = load_encoder(encoder_spec(**options))
    texts = []
    for where, record in iter_file_records(Path(jsonl)):
        if isinstance(encoder, ChatTokenizer):
            texts.append(encoder.render_text(validate_messages(record, where)))
        elif isinstance(encoder, HFChatTokenizer):
            try:
                texts.append(encoder.render(record, where)[0])
            except Unlocated:  # not tokenized by the pipeline either
                continue
    if isinstance(encoder, HFChatTokenizer):
        def encode(text: str) -> int:
            return len(encoder.tokenizer.encode(text, add_special_tokens=False))
    else:
        def encode(text: str) -> int:
            return int(encoder.encode_text(text).shape[0])
    began = time.process_time()
    tokens = sum(encode(text) for text in texts)
    return tokens / (time.process_time() - began)


def _cpu_seconds() -> float:
    """User + system seconds of this process and of its children that have ended (the pool's
    workers, once it has shut down)."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def projected_hours(rows: Sequence[Mapping[str, Any]], cores: Sequence[int] = CORES,
                    total_tokens: float = CORPUS_TOKENS) -> list[dict[str, Any]]:
    """Hours to tokenize ``total_tokens`` on ``N`` cores, per path: at the tokens per CPU
    second of its run with the most workers (so the parallel overhead, index and merge
    included), every core busy (see the module doc for the assumption)."""
    out = []
    for name in dict.fromkeys(r["path"] for r in rows):
        widest = max((r for r in rows if r["path"] == name), key=lambda r: r["workers"])
        for n in cores:
            rate = widest["tokens_per_cpu_second"] * n
            out.append({"path": name, "cores": n, "tokens_per_second": rate,
                        "hours": total_tokens / rate / 3600})
    return out


def _digests(spool: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(spool.iterdir())}


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")
