"""Which outputs still read a spool: so replacing the spool never breaks them silently.

A shard of a format that ``NEEDS_SPOOL`` (``packed_index``) holds no tokens, only an index into
its spool. When the pipeline writes such shards it leaves a note inside the spool, one small
file per output directory::

    SPOOL/.packlab-references/3f0c9a1e2b4d5c6f.json
        {"output": "/data/out", "format": "packed_index"}

:func:`spool_users` lists the outputs that still exist and whose shards still point at this
spool (their recorded path resolves to it); ``packlab synth``/``tokenize --overwrite`` refuse
to replace a spool while any does. A note is best effort: a spool in a read-only folder gets
none (then only outputs beside it could be found; see :func:`spool_users`). Notes are hidden
(``.``-prefixed), so a spool's record, checksums and uploads never see them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from packlab.formats import get_format
from packlab.pipeline.dataset_record import read_dataset_record
from packlab.storage.files import short_hash, staged

NOTES_DIR = ".packlab-references"


def record_spool_use(spool: str | os.PathLike[str], output: str | os.PathLike[str],
                     format: str) -> bool:
    """Leave the note saying ``output`` reads ``spool``; False when the spool's folder is not
    writable (the note is then missing, never half written)."""
    out = str(Path(output).resolve())
    notes = Path(spool) / NOTES_DIR
    try:
        notes.mkdir(exist_ok=True)
        with staged(notes / f"{short_hash(out)}.json", overwrite=True) as tmp:
            tmp.write_text(json.dumps({"output": out, "format": format}) + "\n")
    except OSError:
        return False
    return True


def spool_users(spool: str | os.PathLike[str]) -> list[Path]:
    """Output directories whose shards still read ``spool`` (from the notes it holds)."""
    target = Path(spool).resolve()
    users = []
    notes = target / NOTES_DIR
    for note in sorted(notes.glob("*.json")) if notes.is_dir() else []:
        try:
            output = Path(json.loads(note.read_text())["output"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _reads(output, target):
            users.append(output)
    return users


def _reads(output: Path, spool: Path) -> bool:
    """Whether some shard of ``output`` (a pack output, or a layout part) points at ``spool``."""
    record = _dataset_record(output)
    if record is None:
        return False
    reader = get_format(record["format"]).Reader
    if not reader.NEEDS_SPOOL:
        return False
    for entry in record["shards"]:
        shard = output / entry["name"]
        try:
            recorded = reader.spool_reference(shard)
        except Exception:  # noqa: BLE001 - a shard gone or damaged reads nothing
            continue
        here = Path(os.path.normpath(shard.absolute() / recorded["relative"]))
        if here.exists() and here.resolve() == spool:
            return True
        if Path(recorded.get("path", "")).resolve() == spool:
            return True
    return False


def _dataset_record(output: Path) -> dict[str, Any] | None:
    try:
        return read_dataset_record(output) if output.is_dir() else None
    except Exception:  # noqa: BLE001 - a damaged record: that output reads nothing safely
        return None
