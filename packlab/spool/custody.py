"""The chain of custody of a spool: what a reader that writes from a spool (pack) checks
before it trusts what it reads, as :class:`~packlab.spool.SpoolReader` methods. A spool's
record carries a checksum per range of sequences of ``tokens.bin`` and ``masks.bin``
(``"ranges"``) and whole-file checksums of the small files: ``lengths.bin`` and
``offsets.bin`` are checked whole before a plan made from them is trusted
(:meth:`SpoolCustody.verify_index`), and every range a job reads before it writes
(:meth:`SpoolCustody.verify_sequences`), once per process, so a corrupted spool is refused
naming the file and its sequences, never laundered into fresh checksums."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from packlab.errors import FormatError
from packlab.storage.files import sha256_file, xxh3_of_range

_VERIFIED: dict[tuple[str, str], set[int]] = {}  # per process: (spool, record) -> ranges checked
RANGED = ("tokens", "masks")  # the files checked range by range (the others are small)


def is_count(value: Any) -> bool:
    """A JSON value that is a count (a non-negative int, not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class SpoolCustody:
    """The checks, over what a :class:`~packlab.spool.SpoolReader` has: its ``record``,
    ``path``, counts and memory maps."""

    FILES: dict[str, str]  # the spool's file names, by role
    RECORD_NAME: str  # its record's name
    record: dict[str, Any]
    path: Path
    num_sequences: int
    num_tokens: int
    offsets: np.ndarray

    def _map(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def range_checksums(self) -> tuple[int, dict[str, np.ndarray]] | None:
        """``(sequences per range, {file: uint64 checksums})`` from the record, or None for a
        spool written before them (or by Nemotron); a damaged entry is one FormatError."""
        FILES = self.FILES  # noqa: N806 - the spool's file names
        ranges = self.record.get("ranges")
        if ranges is None:
            return None
        where = self.path / self.RECORD_NAME
        per = ranges.get("sequences") if isinstance(ranges, dict) else None
        if not is_count(per) or per == 0 or ranges.get("checksum") != "xxh3_64":
            raise FormatError(f"{where}: bad 'ranges' (a damaged spool record)")
        count = -(-self.num_sequences // per)
        out = {}
        for name in RANGED:
            values = ranges.get(FILES[name])
            if not isinstance(values, list) or len(values) != count or not all(
                    is_count(v) and v < 1 << 64 for v in values):
                raise FormatError(f"{where}: 'ranges' of {FILES[name]}: not {count} checksums "
                                  "(a damaged spool record)")
            out[name] = np.array(values, dtype=np.uint64)
        return per, out

    def verify_index(self) -> None:
        """``lengths.bin`` and ``offsets.bin`` against the record's checksums (where it has
        them; a few bytes a sequence), before a plan made from them is trusted; a spool whose
        record has no range checksums but whole-file ones gets every file checked now."""
        FILES = self.FILES  # noqa: N806 - the spool's file names
        recorded = self.record.get("files") or {}
        names = ["lengths", "offsets"]
        if self.range_checksums() is None:
            names += list(RANGED)
        for name in names:
            entry = recorded.get(FILES[name])
            if isinstance(entry, dict) and "sha256" in entry and \
                    sha256_file(self.path / FILES[name]) != entry["sha256"]:
                raise FormatError(f"{self.path / FILES[name]}: checksum mismatch (corrupted "
                                  f"spool; `packlab validate {self.path}` checks it whole)")

    def verify_sequences(self, indices: np.ndarray) -> None:
        """Check every range of sequences ``indices`` fall in, once per process, against the
        record's range checksums (nothing to check for a spool without them); a corrupted
        range is one FormatError naming the file and its sequences."""
        FILES = self.FILES  # noqa: N806 - the spool's file names
        found = self.range_checksums()
        if found is None or not len(indices):
            return
        per, sums = found
        key = (str(self.path.resolve()), str(sums["tokens"][:4].tolist()))
        done = _VERIFIED.setdefault(key, set())
        offsets = self.offsets.view(np.ndarray)
        for r in np.unique(np.asarray(indices, dtype=np.int64) // per).tolist():
            if r in done:
                continue
            lo, hi = r * per, min((r + 1) * per, self.num_sequences)
            start = int(offsets[lo])
            stop = int(offsets[hi]) if hi < self.num_sequences else self.num_tokens
            for name in RANGED:
                column = self.columns[name]
                width = column.dtype.itemsize
                if xxh3_of_range(column.path, column.offset + width * start,
                                 column.offset + width * stop) != int(sums[name][r]):
                    raise FormatError(f"{self.path / FILES[name]}: sequences {lo}..{hi - 1}: "
                                      "checksum mismatch (corrupted spool; nothing was "
                                      "written from it)")
            done.add(r)
