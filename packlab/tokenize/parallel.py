"""Tokenizing on many cores (``--workers N``) or on Ray (``--executor ray``), into one spool.

The JSONL's line index (:mod:`packlab.codecs.jsonl_index`: the fresh ``CHAT.jsonl.idx`` beside it, or
one built for this run in the temporary folder) cuts the records into jobs of about equal bytes
(``JOBS_PER_WORKER`` per worker, none over ``MAX_JOB_BYTES`` of JSONL). Each job tokenizes its
records with the same loop as a one-process run (:func:`~packlab.tokenize.records.encode_into`)
into a part spool in a hidden folder beside the output; the parent appends the parts to the
output in record order as they arrive (a part, once appended, is deleted), so the spool is the
same, byte for byte, whatever ran it and however it was cut. Memory: each worker holds its
tokenizer and one batch; the parent one chunk of a part. A bad line (the error names the file
and line) stops the run once every job before it has finished, so the error is the first bad
line of the file, as with one worker; the jobs still running are cancelled, nothing is
published and the parts are removed, so an existing output is left as it was.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from packlab.codecs.jsonl_index import JsonlIndex, build_jsonl_index, index_path
from packlab.errors import FormatError, PacklabError
from packlab.executors import iter_jobs
from packlab.progress import progress_bar
from packlab.spool import DTYPES, FILES, SpoolReader, SpoolWriter
from packlab.storage.files import remove, temporary_sibling
from packlab.tokenize.records import Spec, Stats, encode_into, iter_index_records, load_encoder

JOBS_PER_WORKER = 4  # more jobs than workers: a slow job does not leave the others idle
MAX_JOB_BYTES = 16 << 20  # ~10 s of one core: a failure stops the run soon
MERGE_TOKENS = 1 << 20


def tokenize_in_parts(jsonl: Path, spec: Spec, writer: SpoolWriter, stats: Stats, *,
                      workers: int, executor: str = "process", address: str | None = None,
                      limit: int | None = None, unlocated: str = "skip") -> None:
    """Tokenize ``jsonl`` in parallel jobs and append every sequence to ``writer`` in order."""
    # One worker is one core: the tokenizers library's own threads stay off in the workers.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parts = temporary_sibling(writer.path)
    parts.mkdir()
    try:
        index = _open_index(jsonl, parts)
        count = len(index) if limit is None else min(limit, len(index))
        jobs = [(str(jsonl), str(index.index), start, stop, str(parts / f"part-{k:06d}"), spec,
                 unlocated) for k, (start, stop) in enumerate(job_bounds(index, count, workers))]
        done: dict[int, dict[str, Any]] = {}
        merged = 0
        with progress_bar(total=count, desc="tokenize", unit=" records") as bar:
            for k, result in iter_jobs(tokenize_part, jobs, workers, executor=executor,
                                       address=address):
                done[k] = result
                bar.update(result["stats"]["records"])
                while merged in done:  # append in record order, as soon as the next is in
                    ready = done.pop(merged)
                    if ready["error"] is not None:  # the first bad line in the file
                        raise ready["error"]
                    if ready["part"] is not None:
                        append_spool(writer, Path(ready["part"]))
                        remove(Path(ready["part"]))
                    stats.add(ready["stats"])
                    merged += 1
    finally:
        remove(parts)


def tokenize_part(jsonl: str, index: str, start: int, stop: int, part: str, spec: Spec,
                  unlocated: str) -> dict[str, Any]:
    """One job: records ``start..stop-1`` into the part spool ``part`` (none when no record
    gave a sequence); returns ``{"part", "stats", "error"}``. An error in use (a bad line) is
    returned, not raised, so the parent reports the first one in file order, as one worker
    would, whichever job fails first."""
    encoder = load_encoder(spec)
    stats = Stats()
    writer = SpoolWriter(part, vocab_size=encoder.vocab_size)
    try:
        written = encode_into(encoder, iter_index_records(jsonl, index, start, stop), writer,
                              stats, unlocated=unlocated)
        if written:
            writer.finalize()
        else:
            writer.abort()
    except PacklabError as exc:
        writer.abort()
        return {"part": None, "stats": stats.to_dict(), "error": exc}
    except BaseException:
        writer.abort()
        raise
    return {"part": part if written else None, "stats": stats.to_dict(), "error": None}


def job_bounds(index: JsonlIndex, count: int, workers: int) -> list[tuple[int, int]]:
    """``(start, stop)`` record ranges covering ``0..count-1``, of about equal JSONL bytes."""
    if count == 0:
        return []
    entries = index.entries[:count]
    ends = (entries["offset"] + entries["length"]).astype(np.int64) - int(entries["offset"][0])
    size = int(ends[-1])
    jobs = min(count, max(workers * JOBS_PER_WORKER, -(-size // MAX_JOB_BYTES)))
    cuts = np.searchsorted(ends, size * np.arange(1, jobs) / jobs, side="left") + 1
    bounds = np.unique(np.concatenate(([0], np.clip(cuts, 1, count - 1), [count])))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def append_spool(writer: SpoolWriter, path: Path) -> None:
    """Append every sequence of the spool at ``path`` to ``writer``, read a chunk at a time
    (plain reads, not a memory map: the parent's memory stays one chunk, whatever the part)."""
    part = SpoolReader(path)
    lengths = np.fromfile(path / FILES["lengths"], dtype=DTYPES["lengths"]).astype(np.int64)
    ends = np.cumsum(lengths)
    with open(path / FILES["tokens"], "rb") as tokens, open(path / FILES["masks"], "rb") as masks:
        first = 0
        while first < part.num_sequences:
            base = int(ends[first - 1]) if first else 0
            stop = max(first + 1, int(np.searchsorted(ends, base + MERGE_TOKENS, side="right")))
            count = int(ends[stop - 1]) - base
            writer.append_many(np.fromfile(tokens, dtype=DTYPES["tokens"], count=count),
                               np.fromfile(masks, dtype=DTYPES["masks"], count=count),
                               lengths[first:stop])
            first = stop


def _open_index(jsonl: Path, scratch: Path) -> JsonlIndex:
    """The fresh index beside ``jsonl``, else one built into ``scratch`` (lines unparsed: the
    jobs parse them and name a bad one)."""
    try:
        return JsonlIndex(jsonl, index_path(jsonl))
    except FormatError:
        return JsonlIndex(jsonl, build_jsonl_index(jsonl, scratch / "input.jsonl.idx",
                                                   validate=False))
