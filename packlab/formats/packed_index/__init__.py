"""Format ``packed_index``: no token copy, only the bin assignment and a reference to the spool.

Tokenize once, repack with any pack size or algorithm in seconds: a shard stores which spool
sequences go in which bin (the :class:`~packlab.packing.BinAssignment` CSR) and gathers the
bins from the spool at read time, as :class:`~packlab.packing.materialize.BinMaterializer` does (loss
mask aligned per sub-sequence, over-long sequences truncated as the assignment says). A repack
rewrites only the index: 8 bytes per sequence, whatever the token count.

Reading: on the first read the spool's tokens and masks are mapped for random access
(:mod:`packlab.storage.reads`) and where every sequence of every bin starts, and how much of it the
bin keeps, is computed into RAM (16 bytes per sequence) and checked, so a read is a few slice
copies and a cold read asks for all of its sequences at once.

A shard is a directory, published atomically::

    bin_offsets.npy   int64[num_bins + 1]   bin b holds seq_indices[bin_offsets[b]:bin_offsets[b+1]]
    seq_indices.npy   int64[num_assigned]   spool sequence indices, in bin order
    seq_checksums.npy uint64[num_assigned]  each of those sequences' xxh3_64 as the bin uses it:
                                            its kept tokens' bytes as int32 (whatever the
                                            spool stores: a Megatron prefix's may be uint16)
                                            seeding its masks' (uint8), read at pack time
    manifest.json     written last: pack_size, overlong policy, counts, the files' sha256,
                      "seq_checksum": "xxh3_64", and

    "spool": {"path": "/abs/spool", "relative": "../spool", "manifest_sha256": "...",
              "num_sequences": 1000000, "num_tokens": 123456789, "vocab_size": 131072,
              "files": {"tokens.bin": {"bytes": ..., "sha256": ...}, ...}}

The reader looks for the spool at the relative path first (a tree moved as a whole), then the
absolute one (or where ``Reader(path, spool=...)`` says), and accepts it only if its record
still matches what the shard recorded; ``validate`` also re-hashes the spool files. A changed
or missing spool is a :class:`~packlab.errors.FormatError`, never silently different bins.

The spool's ``files`` are its data files' sizes and checksums: copied from the spool's
record when it lists them (packlab's), else computed once at pack time (Nemotron's spool
records none; ``"files_from": "computed"``; the pipeline hashes the spool once for all its
shards and passes ``spool_files=``). Opening checks them against the spool's record, or
against the files' sizes where the record has none; ``validate`` re-hashes the files
against them either way.

The writer needs the spool and the assignment (``NEEDS_SPOOL`` tells the pipeline):
``Writer(path, *, pack_size, spool=..., assignment=..., first_bin=0)``. Bins passed through
``write_bin`` are compared with the bins gathered from the spool (``verify=True``; with
``verify=False`` only their lengths and starts), so what the reader returns is what was written.
:meth:`Writer.write_assignment` (used by :func:`write_packed_index`) takes every bin at once
without gathering a token, but hashing each sequence it indexes for ``seq_checksums.npy``
(the spool read once: about 3.7 us per sequence of ~1000 tokens; ``checksums=False`` skips it,
for a repack that reads no token at all, and then ``verify=True`` is refused). A reader opened
with ``verify=True`` hashes each sequence as it gathers it: a spool changed in place (a flipped
token or mask byte the record's sizes cannot see) is a FormatError naming the shard and the
bin, never silently different bins.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from packlab.bins import CHECKSUM, PackedBin, check_csr, cumulative_offsets
from packlab.codecs.safe_pickle import read_npy_header
from packlab.errors import FormatError, PacklabError
from packlab.formats.packed_index.gather import (
    SUMS,
    changed_sequence,
    gathered_files,
    sequence_checksums,
)
from packlab.formats.shared.base import (
    SHARD_RECORD,
    FormatFacts,
    ShardReader,
    ShardWriter,
    count_field,
    index_list,
    read_shard_record,
)
from packlab.formats.shared.npy_identity import check_identity, npy_header
from packlab.packing import BinAssignment
from packlab.packing.materialize import BinMaterializer
from packlab.spool import SpoolReader, spool_record_at
from packlab.storage.files import file_entry, sha256_file, short_hash, verify_files
from packlab.storage.location import Location
from packlab.storage.reads import MappedFile

FORMAT = "packed_index"
SUFFIX = ""
VERSION = "packed_index_v1"  # the record's "layout" key
RECORD = SHARD_RECORD
OFFSETS = "bin_offsets.npy"
INDICES = "seq_indices.npy"
NEEDS_SPOOL = True


def detect(location: Location) -> bool:
    """A directory holding the two index files (its reader explains anything missing)."""
    return (location / OFFSETS).is_file() and (location / INDICES).is_file()


class PackedIndexFacts(FormatFacts):
    """What ``packed_index`` is: a bin assignment over a spool (no token copy)."""

    FORMAT = FORMAT
    SUFFIX = SUFFIX
    RECORD = RECORD
    RECORD_FORMAT = FORMAT
    FILES = (OFFSETS, INDICES, SUMS)
    NEEDS_SPOOL = True
    detect = staticmethod(detect)


def spool_identity(spool: SpoolReader, files: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a shard records about its spool, to recognise it (and notice a change) later:
    counts, and its data files' sizes and checksums (``files``: computed already, else the
    spool's own or computed now)."""
    record = spool.record
    recorded = _recorded_files(record)
    return {
        "manifest_sha256": sha256_file(spool.record_path),
        "num_sequences": record["num_sequences"],
        "num_tokens": record["num_tokens"],
        "vocab_size": record.get("vocab_size"),
        "files": files if files is not None else spool.file_checksums(),
        "files_from": "manifest" if recorded else "computed",
    }


def _recorded_files(record: dict[str, Any]) -> dict[str, Any]:
    """The checksums a spool's record lists (packlab's), or {} (Nemotron's has none)."""
    files = record.get("files")
    return files if isinstance(files, dict) else {}


def _check_given_files(spool: SpoolReader, files: dict[str, Any], where: Path) -> None:
    """``spool_files=`` computed by a caller must describe this spool's files."""
    if set(files) != set(spool.data_files):
        raise PacklabError(f"{where}: spool_files must list {sorted(spool.data_files)}")
    for name, entry in files.items():
        size = (spool.root / name).stat().st_size
        if not isinstance(entry, dict) or entry.get("bytes") != size or "sha256" not in entry:
            raise PacklabError(f"{where}: spool_files[{name!r}] does not describe "
                               f"{spool.root / name} ({size} bytes)")


def _as_spool(spool: str | os.PathLike[str] | SpoolReader | None, where: Path) -> SpoolReader:
    if spool is None:
        raise PacklabError(f"{where}: the packed_index writer needs spool= (the spool it indexes)")
    return spool if isinstance(spool, SpoolReader) else SpoolReader(spool)


def _as_assignment(assignment: BinAssignment | str | os.PathLike[str] | None,
                   where: Path) -> BinAssignment:
    if assignment is None:
        raise PacklabError(f"{where}: the packed_index writer needs assignment= (the bins)")
    return assignment if isinstance(assignment, BinAssignment) else BinAssignment.load(assignment)


class Writer(PackedIndexFacts, ShardWriter):
    """Writes the assignment and the spool reference; tokens stay in the spool."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        spool: str | os.PathLike[str] | SpoolReader | None = None,
        assignment: BinAssignment | str | os.PathLike[str] | None = None,
        first_bin: int = 0,
        verify: bool = True,
        spool_files: dict[str, Any] | None = None,
        checksums: bool = True,
        **options: Any,
    ) -> None:
        where = Path(path)
        self.checksums = bool(checksums)
        self.spool = _as_spool(spool, where)
        gathered_files(self.spool)  # the files its reads gather from: refused now, not later
        if spool_files is not None:
            _check_given_files(self.spool, spool_files, where)
        self.spool_files = spool_files
        self.assignment = _as_assignment(assignment, where)
        self.first_bin = int(first_bin)
        self.verify = verify
        if not 0 <= self.first_bin < self.assignment.num_bins:
            raise PacklabError(f"{where}: first_bin {first_bin} outside the assignment's "
                               f"{self.assignment.num_bins} bins")
        if options.get("pack_size", self.assignment.pack_size) != self.assignment.pack_size:
            raise PacklabError(f"{where}: pack_size {options['pack_size']} differs from the "
                               f"assignment's {self.assignment.pack_size}")
        options["pack_size"] = self.assignment.pack_size
        available = self.assignment.num_bins - self.first_bin
        if options.get("num_bins") is not None and options["num_bins"] > available:
            raise PacklabError(f"{where}: {options['num_bins']} bins announced, the assignment has "
                               f"{available} from bin {self.first_bin}")
        self._materializer: BinMaterializer | None = None  # bins compared (write_bin) only
        super().__init__(path, **options)

    def _open(self) -> None:
        self.tmp_path.mkdir()
        # what this shard is, before its first byte (every .npy header carries it)
        self.identity = short_hash({"metadata": self.metadata, "pack_size": self.pack_size})

    def _write(self, packed: PackedBin) -> None:
        bin_id = self.first_bin + self.bins_written
        if bin_id >= self.assignment.num_bins:
            raise PacklabError(f"{self.path}: bin {self.bins_written} is beyond the assignment")
        expected = self._gather_structure(bin_id)
        same = (packed.input_ids.shape[0] == expected[0]
                and np.array_equal(packed.seq_start_id, expected[1]))
        if same and self.verify:
            if self._materializer is None:
                self._materializer = BinMaterializer(self.spool, self.assignment)
            gathered = self._materializer.materialize(bin_id)
            same = (np.array_equal(packed.input_ids, gathered.input_ids)
                    and np.array_equal(packed.loss_mask, gathered.loss_mask))
        if not same:
            raise PacklabError(
                f"{self.path}: bin {self.bins_written} differs from bin {bin_id} gathered from "
                f"the spool {self.spool.path}: a packed_index shard can only store bins of its "
                "spool and assignment"
            )

    def _gather_structure(self, bin_id: int) -> tuple[int, np.ndarray]:
        """Packed length and seq_start_id of a bin, from the spool lengths alone."""
        seqs = self.assignment.bin_indices(bin_id)
        kept = np.minimum(self.spool.lengths[seqs].astype(np.int64), self.assignment.pack_size)
        starts = np.concatenate(([0], np.cumsum(kept)[:-1]))
        return int(kept.sum()), starts

    def write_assignment(self) -> None:
        """Take every (remaining announced) bin at once, without gathering any token."""
        if self.finished or self.bins_written:
            raise PacklabError(f"{self.path}: write_assignment() must be the only write")
        count = self.expected_bins or self.assignment.num_bins - self.first_bin
        part = self.assignment.select(self.first_bin, self.first_bin + count)
        lengths = part.bin_lengths(self.spool.lengths)
        _check_assignment(part, self.spool, lengths, source=str(self.path))
        self.bins_written = part.num_bins
        self.tokens_written = int(lengths.sum())
        self.seqs_written = int(part.seq_indices.shape[0])

    def _close(self, record: dict[str, Any]) -> dict[str, Any]:
        part = self.assignment.select(self.first_bin, self.first_bin + self.bins_written)
        files = {
            OFFSETS: _save_npy(self.tmp_path / OFFSETS, part.bin_offsets, self.identity),
            INDICES: _save_npy(self.tmp_path / INDICES, part.seq_indices, self.identity),
        }
        if self.checksums:
            files[SUMS] = _save_npy(self.tmp_path / SUMS, sequence_checksums(
                self.spool, part.seq_indices, part.pack_size), self.identity, dtype="<u8")
            record["seq_checksum"] = CHECKSUM
        record["identity"] = self.identity
        spool_abs = self.spool.path.resolve()
        record.update(
            layout=VERSION,
            overlong=part.overlong,
            first_bin=self.first_bin,
            spool={
                "path": str(spool_abs),
                "relative": os.path.relpath(spool_abs, self.path.absolute()),
                **spool_identity(self.spool, self.spool_files),
            },
            files=files,
        )
        (self.tmp_path / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        return record


def write_packed_index(
    path: str | os.PathLike[str],
    spool_path: str | os.PathLike[str] | SpoolReader,
    assignment: BinAssignment,
    overwrite: bool = False,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write a packed_index shard of every bin of ``assignment``; returns its record."""
    writer = Writer(path, pack_size=assignment.pack_size, spool=spool_path,
                    assignment=assignment, overwrite=overwrite, metadata=metadata)
    try:
        writer.write_assignment()
    except BaseException:
        writer.abort()
        raise
    return writer.finalize()


class Reader(PackedIndexFacts, ShardReader):
    """Gathers bins from the referenced spool; opening reads the records, not the index."""

    @property
    def metadata(self) -> dict[str, Any]:
        found = self.record.get("metadata")
        return found if isinstance(found, dict) else {}

    def __init__(self, path: str | os.PathLike[str], *,
                 spool: str | os.PathLike[str] | None = None, verify: bool = False) -> None:
        super().__init__(path)
        self.record = shard_record(self.path)
        self.verify = bool(verify)
        self.has_checksums = self.record.get("seq_checksum") == CHECKSUM
        self.identity = self.record.get("identity")  # every .npy header names it
        if self.verify and not self.has_checksums:
            raise FormatError(f"{self.path}: records no sequence checksums (written with "
                              "checksums=False, or before packlab stored them): verify=True "
                              "cannot check its bins; `packlab validate` re-hashes its spool")
        m = self.record
        self.pack_size = int(m["pack_size"])
        self.num_bins = int(m["num_bins"])
        self.num_tokens = int(m["num_tokens"])
        self.num_seqs = int(m["num_seqs"])
        self.overlong = m["overlong"]
        verify_files(self.path, m["files"], checksums=False)
        self.spool_path = self._find_spool(None if spool is None else Path(spool))
        self._assignment: BinAssignment | None = None
        self._spool: SpoolReader | None = None
        self._materializer: BinMaterializer | None = None
        self._sequence_sums: memoryview | None = None

    @classmethod
    def spool_reference(cls, shard: Path) -> dict[str, str]:
        spool = shard_record(Path(shard))["spool"]
        return {"relative": spool["relative"], "path": spool["path"]}

    def _handles(self) -> tuple[str, ...]:
        return ("_assignment", "_spool", "_materializer", "_sequence_sums")

    def _find_spool(self, override: Path | None) -> Path:
        recorded = self.record["spool"]
        if override is not None:
            candidates = [override]
        else:
            local = Path(os.path.normpath(self.path.absolute() / recorded["relative"]))
            candidates = list(dict.fromkeys([local, Path(recorded["path"])]))
        problems = []
        for candidate in candidates:
            change = self._spool_change(candidate)
            if change is None:
                return candidate
            problems.append(f"{candidate}: {change}")
        raise FormatError(f"{self.path}: its spool is missing or changed ({'; '.join(problems)}); "
                          "repack it, or put the spool it was built from back where it was (from "
                          "Python, open_shard(..., spool=PATH) names it)")

    def _spool_change(self, candidate: Path) -> str | None:
        """What differs between the spool at ``candidate`` and the one recorded, or None."""
        recorded = self.record["spool"]
        try:
            found = spool_record_at(candidate)
        except FormatError as exc:
            return str(exc)
        if found is None:
            return "missing"
        spool_record, folder = found
        for key in ("num_sequences", "num_tokens"):
            if spool_record.get(key) != recorded.get(key):
                return f"{key} {spool_record.get(key)}, the shard recorded {recorded.get(key)}"
        own = _recorded_files(spool_record)
        if own and own != recorded.get("files"):
            return "its files' checksums differ from the ones the shard recorded"
        for name, entry in recorded.get("files", {}).items():
            file = folder / name
            if not file.is_file() or file.stat().st_size != entry.get("bytes"):
                return f"{name} is missing or not {entry.get('bytes')} bytes"
        return None

    def _open_assignment(self) -> tuple[SpoolReader, BinAssignment]:
        """The spool and the shard's assignment, its index checked against the spool's count."""
        if self._assignment is None or self._spool is None:
            offsets = _load_npy(self.path / OFFSETS, self.num_bins + 1, identity=self.identity)
            indices = _load_npy(self.path / INDICES, self.num_seqs, identity=self.identity)
            self._spool = SpoolReader(self.spool_path)
            _check_index(self.path, offsets, indices, self._spool.num_sequences)
            self._assignment = BinAssignment(offsets, indices, self.pack_size, self.overlong)
        return self._spool, self._assignment

    def _open_index(self) -> BinMaterializer:
        """What reads the bins: the assignment checked against the spool whole, in RAM."""
        if self._materializer is None:
            spool, assignment = self._open_assignment()
            try:
                self._materializer = BinMaterializer(spool, assignment)
            except PacklabError as exc:
                raise FormatError(f"{self.path}: does not fit its spool: {exc}") from None
        return self._materializer

    @property
    def assignment(self) -> BinAssignment:
        return self._open_assignment()[1]

    def _sums(self) -> memoryview:
        """The sequences' recorded checksums (``verify``), in RAM: 8 bytes a sequence."""
        if self._sequence_sums is None:
            self._sequence_sums = memoryview(np.ascontiguousarray(
                _load_npy(self.path / SUMS, self.num_seqs, "<u8", self.identity)))
        return self._sequence_sums

    def read_bin(self, index: int) -> PackedBin:
        """A freshly gathered bin (its own arrays: int32 tokens, uint8 loss mask, int32 starts);
        with ``verify``, each of its sequences checked against its checksum."""
        m = self._materializer if self._materializer is not None else self._open_index()
        if not 0 <= index < self.num_bins:
            index = self.check_index(index)
        packed = m.materialize(index, copy=True)
        if self.verify:
            self._verified(m, index, packed)
        return packed

    def read_bins(self, indices: Any) -> list[PackedBin]:
        return [self.read_bin(i) for i in index_list(indices)]

    def _verified(self, m: BinMaterializer, b: int, packed: PackedBin) -> None:
        """Bin ``b`` just gathered: each sequence's tokens and mask as read from the spool
        hashed against the shard's record (and the mask values checked: 0 or 1)."""
        first = int(self.assignment.bin_offsets[b])
        k = changed_sequence(packed.input_ids, m.raw_mask, packed.seq_start_id, self._sums(),
                             first)
        if k is not None:
            raise FormatError(f"{self.path}: bin {b}: its sequence {k} differs from the spool "
                              f"{self.spool_path} it was packed from (changed in place; "
                              "corrupted)")
        if packed.loss_mask.shape[0] and int(packed.loss_mask.max()) > 1:
            raise FormatError(f"{self.path}: bin {b}: loss_mask value "
                              f"{int(packed.loss_mask.max())} from the spool (must be 0 or 1)")

    def packed_lengths(self) -> np.ndarray:
        spool, assignment = self._open_assignment()
        return assignment.bin_lengths(spool.lengths)

    def bytes_on_disk(self) -> int:
        """The index only; the spool it references is counted in ``info()["spool_bytes"]``."""
        return super().bytes_on_disk()

    def info(self) -> dict[str, Any]:
        spool_bytes = sum(e.get("bytes", 0) for e in self.record["spool"]["files"].values())
        return {**super().info(), "num_seqs": self.num_seqs, "spool": str(self.spool_path),
                "spool_bytes": spool_bytes}

    def validate(self, *, spool_checksums: bool = True) -> dict[str, Any]:
        """Index checksums, the spool unchanged (re-hashed), every bin's structure and limits."""
        verify_files(self.path, self.record["files"], checksums=True)
        self._open_assignment()
        assert self._spool is not None
        if spool_checksums:
            if not _recorded_files(self._spool.record):  # none of its own: the pack-time ones
                verify_files(self._spool.root, self.record["spool"]["files"], checksums=True)
            self._spool.verify()  # structure; and the hashes its record lists, if any
        lengths = self.assignment.bin_lengths(self._spool.lengths)
        _check_assignment(self.assignment, self._spool, lengths, source=str(self.path))
        if self.has_checksums:
            self._check_sequences()
        if int(lengths.sum()) != self.num_tokens:
            raise FormatError(f"{self.path}: bins hold {int(lengths.sum())} tokens, the record "
                              f"says {self.num_tokens}")
        return {"format": FORMAT, "num_bins": self.num_bins, "num_tokens": self.num_tokens,
                "num_seqs": self.num_seqs, "pack_size": self.pack_size,
                "spool": str(self.spool_path), "bytes_on_disk": self.bytes_on_disk()}

    def _check_sequences(self) -> None:
        """Every indexed sequence of the spool against the checksum the shard recorded."""
        assert self._spool is not None
        recorded = _load_npy(self.path / SUMS, self.num_seqs, "<u8", self.identity)
        part = self.assignment
        found = sequence_checksums(self._spool, part.seq_indices, part.pack_size)
        wrong = recorded != found
        if wrong.any():
            b = int(np.searchsorted(part.bin_offsets, int(np.argmax(wrong)), side="right") - 1)
            raise FormatError(f"{self.path}: bin {b}: a sequence differs from the spool "
                              f"{self.spool_path} it was packed from (changed in place)")


def _check_index(path: Path, offsets: np.ndarray, indices: np.ndarray, num_sequences: int
                 ) -> None:
    """The CSR read from disk, before anything indexes with it (vectorized, once per process):
    bins of one sequence or more, ending where the sequences do, each sequence in the spool."""
    steps = offsets[1:] - offsets[:-1]
    if offsets[0] != 0 or offsets[-1] != indices.shape[0] or (steps <= 0).any():
        b = int(np.argmax(steps <= 0)) if (steps <= 0).any() else 0
        raise FormatError(f"{path / OFFSETS}: bin {b}: bin offsets must rise strictly from 0 "
                          f"to {indices.shape[0]} (corrupted)")
    outside = (indices < 0) | (indices >= num_sequences)
    if outside.any():
        k = int(np.argmax(outside))
        b = int(np.searchsorted(offsets, k, side="right") - 1)
        raise FormatError(f"{path / INDICES}: bin {b}: sequence {int(indices[k])} is not in the "
                          f"spool ({num_sequences} sequences; corrupted)")


def _check_assignment(part: BinAssignment, spool: SpoolReader, lengths: np.ndarray, *,
                      source: str) -> None:
    """CSR well formed, indices inside the spool, policy honoured, every bin's invariants.

    The loss mask needs no check here: it is aligned at read time from the spool's 0/1 masks,
    which leaves the last position of every sub-sequence 0 by construction.
    """
    offsets, indices = part.bin_offsets, part.seq_indices
    if offsets.ndim != 1 or offsets.shape[0] < 2 or offsets[0] != 0:
        raise FormatError(f"{source}: bin offsets must be 1-D and start at 0")
    if offsets[-1] != indices.shape[0] or bool(np.any(np.diff(offsets) <= 0)):
        raise FormatError(f"{source}: bin offsets must increase strictly up to "
                          f"{indices.shape[0]} (empty bin or bad end)")
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= spool.num_sequences):
        bad = int(np.argmax((indices < 0) | (indices >= spool.num_sequences)))
        b = int(np.searchsorted(offsets, bad, side="right") - 1)
        raise FormatError(f"{source}: bin {b}: sequence {int(indices[bad])} is not in the spool "
                          f"({spool.num_sequences} sequences)")
    seq_lengths = spool.lengths[indices].astype(np.int64)
    if part.overlong == "drop" and bool(np.any(seq_lengths > part.pack_size)):
        bad = int(np.argmax(seq_lengths > part.pack_size))
        b = int(np.searchsorted(offsets, bad, side="right") - 1)
        raise FormatError(f"{source}: bin {b}: sequence {int(indices[bad])} is longer than "
                          f"pack_size {part.pack_size} and the policy is 'drop'")
    kept = np.minimum(seq_lengths, part.pack_size)
    token_offsets = cumulative_offsets(lengths)
    ends = np.cumsum(kept)
    starts = ends - kept - np.repeat(token_offsets[:-1], np.diff(offsets))
    check_csr(token_offsets, offsets, starts, None, pack_size=part.pack_size, source=source)


def _save_npy(path: Path, values: np.ndarray, identity: str, dtype: str = "<i8"
              ) -> dict[str, Any]:
    """An index array (8 bytes per sequence: small) as a ``.npy`` whose header names the shard
    (:mod:`packlab.formats.shared.npy_identity`); its record entry."""
    array = np.ascontiguousarray(values, dtype=dtype)
    with open(path, "wb") as f:
        f.write(npy_header(array.dtype, array.shape, identity))
        f.write(memoryview(array).cast("B"))
        f.flush()
        os.fsync(f.fileno())
    return file_entry(path)


def _load_npy(path: Path, count: int, dtype: str = "<i8", identity: object = None
              ) -> np.ndarray:
    """The ``count`` values of a 1-D ``dtype`` .npy, memory-mapped, never unpickled; its header
    parsed by :func:`~packlab.codecs.safe_pickle.read_npy_header` (not numpy's parser, whose tokenizer
    fails on damaged bytes) and checked against the record's count and the file's size first,
    so any damage is a FormatError naming the file; a header that names another shard than
    ``identity`` (the record's) is refused (files exchanged between shards)."""
    want = np.dtype(dtype)
    try:
        with open(path, "rb") as fp:
            header = read_npy_header(fp, source=str(path))
            size = os.fstat(fp.fileno()).st_size
            fp.seek(0)
            raw = fp.read(header.data_offset)
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc.strerror}") from None
    check_identity(path, raw, identity)
    if header.dtype != want or header.shape != (count,) or header.fortran_order:
        raise FormatError(f"{path}: header says {header.dtype.str}{list(header.shape)}, the "
                          f"record needs {want.str}[{count}]")
    if size != header.data_offset + want.itemsize * count:
        raise FormatError(f"{path}: {size} bytes, its header needs "
                          f"{header.data_offset + want.itemsize * count} (truncated or corrupted)")
    return MappedFile(path, random=False).view(want, header.data_offset, count)


def shard_record(path: Path) -> dict[str, Any]:
    """The shard's record, checked for its format and fields; errors name the file."""
    file = path / RECORD
    record = read_shard_record(path, RECORD, kind=FORMAT,
                                       expect={"format": FORMAT, "layout": VERSION})
    for key in ("pack_size", "num_bins", "num_tokens", "num_seqs"):
        count_field(record, key, file, minimum=1)
    spool = record.get("spool")
    if not isinstance(spool, dict) or not all(
        isinstance(spool.get(k), str) for k in ("path", "relative", "manifest_sha256")
    ) or not isinstance(spool.get("files"), dict):
        raise FormatError(f"{file}: bad or missing 'spool' reference")
    if record.get("overlong") not in ("truncate", "drop"):
        raise FormatError(f"{file}: bad 'overlong' policy {record.get('overlong')!r}")
    if not isinstance(record.get("files"), dict):
        raise FormatError(f"{file}: bad or missing 'files'")
    return record
