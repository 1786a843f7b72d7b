"""Deterministic names for runs and shard configurations (the ``{run_hash}`` and ``{hash}`` of
the layout's ``runs/{run_hash}/datasets/{name}/{hash}/``).

A hash is the SHA-256 of canonical JSON (sorted keys, no spaces), cut to 16 hex digits. Inputs
enter by what they *are*, never by where they are: a spool by the checksums its record lists,
not by its path, so moving a spool or the output keeps every hash (and every shard) valid.
"""

from __future__ import annotations

from typing import Any

from packlab.spool import SpoolReader
from packlab.storage.files import canonical, short_hash

__all__ = ["canonical", "short_hash", "spool_identity"]


def spool_identity(spool: SpoolReader) -> dict[str, Any]:
    """What a spool is, for hashing: counts, dtypes, vocabulary and its files' checksums.

    The checksums are the record's (written by the spool writer as it streamed the bytes);
    they are not recomputed here: ``SpoolReader.verify`` proves a spool matches its record.
    A spool whose record lists none (Nemotron's) is hashed once, so two such spools with
    equal counts never share an identity.
    """
    m = spool.record
    return {
        "version": m.get("version"),
        "num_sequences": int(m["num_sequences"]),
        "num_tokens": int(m["num_tokens"]),
        "vocab_size": m.get("vocab_size"),
        "dtypes": m.get("dtypes", {}),
        "files": {name: entry.get("sha256")
                  for name, entry in sorted(spool.file_checksums().items())},
    }
