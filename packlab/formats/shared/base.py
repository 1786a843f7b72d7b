"""What every shard format shares: the writer protocol, the reader base, and the shard record.

A writer is a keyword-only context manager. It checks every bin's invariants, accepts bins
only in order (``bin_id`` 0, 1, 2, ...), refuses to finalize with fewer bins than announced,
works under a temporary name and publishes atomically in :meth:`ShardWriter.finalize`, the
record (a file or a footer) written last. Leaving the ``with`` block on an exception aborts: nothing
appears under the final name.

A reader opens lazily (cheap to construct and to pickle, so a DataLoader worker reopens it),
returns bins whose arrays stay valid after the reader is closed or collected, and can
``validate`` a shard whole (sizes, checksums, every invariant).

What a format *is* (a directory or a file, its record, whether it needs its spool, loads
everything, returns views, pads) is :class:`FormatFacts`: class attributes that the writer
and reader of a format share, and that every consumer (pipeline, dataset discovery, object
storage, measurement) reads instead of testing format names.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from packlab.bins import PackedBin, check_bin
from packlab.errors import FormatError, PacklabError
from packlab.formats.shared.stacks import StackInput
from packlab.limits import MAX_COUNT
from packlab.storage.files import DIRECTORY_RECORD, read_json
from packlab.storage.location import Location, as_location
from packlab.version import __version__


def close_stream(stream: Any, where: object) -> None:
    """Close an output stream (on object storage, which completes its upload); a failure is
    one line naming ``where``."""
    try:
        stream.close()
    except Exception as exc:  # noqa: BLE001 - pyarrow raises OSError or ArrowException
        raise PacklabError(f"{where}: writing failed: {str(exc).splitlines()[0][:300]}") from None


#: the readers a format's ``READ_BY`` may name: stacks people train or query with
READERS = ("Megatron-core", "Megatron-Bridge", "DuckDB", "HF datasets", "Modalities")


class FormatFacts:
    """The format contract: what a format is, as class attributes its Writer and Reader share.

    Each format module declares them once, on a small class both its ``Writer`` and its
    ``Reader`` inherit (``class Writer(MemmapFacts, ShardWriter)``). Consumers read them from
    the registry (``get_format(name).Reader.NEEDS_SPOOL``); no code outside ``formats/``
    decides anything by a format's name.
    """

    #: the registry name (``packlab pack --format``)
    FORMAT: ClassVar[str]
    #: what a one-file shard's name ends with (``".parquet"``); ``""``: a directory shard
    SUFFIX: ClassVar[str] = ""
    #: a directory shard's record file, written last (its commit point); None for one-file shards
    RECORD: ClassVar[str | None] = None
    #: the shard record's ``"format"`` value that names this format (how object storage knows a
    #: directory shard without downloading it)
    RECORD_FORMAT: ClassVar[str | None] = None
    #: the other files of a directory shard (an upload holding them but no record is unfinished)
    FILES: ClassVar[tuple[str, ...]] = ()
    #: stores a reference to its spool instead of tokens: the writer takes ``spool=`` and
    #: ``assignment=`` and offers ``write_assignment()``; the reader takes ``spool=`` and says
    #: where the shard expects it (:meth:`ShardReader.spool_reference`)
    NEEDS_SPOOL: ClassVar[bool] = False
    #: the reader loads every bin when it opens (no cold read; memory grows with the shard)
    IN_RAM: ClassVar[bool] = False
    #: bins are runs of values in the shard's files, read as they are (no decode): the reads
    #: held to the memcpy floor
    RAW_RUNS: ClassVar[bool] = False
    #: the writer writes one file front to back through :meth:`ShardWriter._sink`, so it can
    #: stream straight to object storage (a temporary key, published by a server-side copy)
    STREAMS: ClassVar[bool] = False
    #: the reader reads a file on object storage in place with ranged requests (else it is
    #: downloaded into a verified local cache first)
    READS_IN_PLACE: ClassVar[bool] = False
    #: a shard is one Parquet file that SQL engines scan as it is (DuckDB ``read_parquet``,
    #: polars ``scan_parquet``), so ``packlab query`` reads it
    SQL_READABLE: ClassVar[bool] = False
    #: the other stacks that read this format's shards as packlab writes them (names from
    #: :data:`READERS`); each pair is run for real by ``tests/test_read_by.py``
    READ_BY: ClassVar[tuple[str, ...]] = ()
    #: a shard carries a record of its writer (a file, footer metadata or trailer), so
    #: packlab tells its own shards from another program's; False: no room for one (legacy)
    KEEPS_RECORD: ClassVar[bool] = True
    #: of ``READ_BY``, the readers that return each bin as this format's raw item (words
    #: packlab decodes), not as its tokens: they read the files, not the data
    ITEMS_READ_BY: ClassVar[tuple[str, ...]] = ()
    #: what training stacks read in this format (:mod:`packlab.formats.shared.stacks`): a released
    #: default, a deprecated one, or a proposal, each with the commit it was read at
    STACK_INPUTS: ClassVar[tuple[StackInput, ...]] = ()
    #: a one-file shard's other files, each by the suffix that takes the place of ``SUFFIX``
    #: in its name (a Megatron pair's ``.bin``, packlab's sidecar): published before the file
    #: itself (the shard's commit point), uploaded, downloaded, counted and removed with it
    COMPANIONS: ClassVar[tuple[str, ...]] = ()
    #: of the companions, the one holding packlab's record of the shard (it may be missing
    #: from a shard another tool wrote); its checksum stands for the shard's in receipts
    COMPANION_RECORD: ClassVar[str | None] = None
    #: the files holding the bins' tokens and masks (names inside a directory shard; in a
    #: one-file shard companion suffixes): a reader that ``READS_IN_PLACE`` reads them by
    #: ranges where they are, and fetches the shard's other files (its index) once into a
    #: local cache
    DATA_FILES: ClassVar[tuple[str, ...]] = ()
    #: bins the writer holds before it writes them out, at its defaults (a row group, a record
    #: batch; 1 for a writer that writes each bin as it comes): its memory is bounded by that
    #: many bins' bytes (times what its encoder needs) plus a constant, never by the shard
    BUFFERED_BINS: ClassVar[int] = 1

    @classmethod
    def is_directory(cls) -> bool:
        return not cls.SUFFIX

    @classmethod
    def detect(cls, location: Location) -> bool:
        """Whether ``location`` (a file for a one-file format, a folder for the others: the
        registry asks only those) is, or looks like, a shard of this format (let the reader
        explain what is wrong); reads a few bytes at most, never raises."""
        raise NotImplementedError(f"{cls.__name__}.detect")

    @classmethod
    def plan_limits(cls, *, pack_size: int, num_bins: int, num_tokens: int,
                    where: object) -> list[str]:
        """Check a plan against this format's bounds before any work: refuse (one
        PacklabError naming ``where``) what it cannot write; return what a person should hear
        before it starts (a padded format: the bytes it would write). Every format: a bin's
        positions are int32 (``seq_start_id``, Arrow and Parquet list offsets)."""
        if not 0 < pack_size <= MAX_PACK_SIZE:
            raise PacklabError(f"{where}: pack_size must be from 1 to {MAX_PACK_SIZE:,} (a "
                               f"bin's positions are int32), got {pack_size:,}")
        return []

    @classmethod
    def companions(cls, entry: Any) -> list[Any]:
        """The companion files of the one-file shard ``entry`` (a ``Path`` or a
        :class:`~packlab.storage.location.Location`: the same kind back), whether they exist or not."""
        name = entry.name
        if not cls.COMPANIONS or not name.endswith(cls.SUFFIX):
            return []
        stem = name[: -len(cls.SUFFIX)]
        return [entry.parent / f"{stem}{suffix}" for suffix in cls.COMPANIONS]

    @classmethod
    def shard_files(cls) -> tuple[str, ...]:
        """Every file name inside a directory shard, its record included."""
        return (*cls.FILES, *((cls.RECORD,) if cls.RECORD else ()))


#: a directory shard's record: the file its writer publishes last (counts, every file's size
#: and SHA-256); one-file shards keep theirs in a footer, trailer or metadata of their own
SHARD_RECORD = DIRECTORY_RECORD

MAX_PACK_SIZE = (1 << 31) - 1  # positions in a bin are int32 (seq_start_id)


def count_field(record: Any, key: str, where: object, *, minimum: int = 0) -> int:
    """A count read from a record, footer or metadata: an int from ``minimum`` to
    :data:`MAX_COUNT` (``pack_size``: :data:`MAX_PACK_SIZE`). Anything else is damage (a
    string, a float, 2**63: numpy would overflow on it) and one FormatError naming ``where``."""
    value = record.get(key) if isinstance(record, dict) else None
    limit = MAX_PACK_SIZE if key == "pack_size" else MAX_COUNT
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= limit:
        raise FormatError(f"{where}: bad or missing {key!r} ({value!r:.40})")
    return value


def index_list(indices: Sequence[int] | np.ndarray) -> Sequence[int]:
    """Bin indices as a sequence of ints to loop over: a numpy array becomes a list in one C
    call (for the batches a DataLoader asks, a Python loop beats a dozen small numpy calls)."""
    if isinstance(indices, list | tuple | range):
        return indices
    return np.asarray(indices).reshape(-1).tolist()  # arrays, tensors, other sequences


def head(file: Path | Location, size: int) -> bytes:
    """The first ``size`` bytes of ``file`` (fewer if it is shorter; on object storage one
    ranged GET); a FormatError when it cannot be read."""
    location = as_location(file)
    if not location.is_local:
        if not location.is_file():
            raise FormatError(f"{file}: missing (the shard is incomplete)")
        return location.read_range(0, min(size, location.size()))
    try:
        with open(file, "rb") as f:
            return f.read(size)
    except OSError as exc:
        raise FormatError(f"{file}: cannot read: {exc.strerror}") from None


def starts_with(location: Location, magic: bytes) -> bool:
    """A file whose first bytes are ``magic``: how single-file formats recognise themselves."""
    return _bytes_at(location, 0, len(magic)) == magic


def ends_with(location: Location, magic: bytes, *, min_size: int = 0) -> bool:
    """A file of at least ``min_size`` bytes whose last bytes are ``magic``."""
    location = as_location(location)
    try:
        size = location.size()
    except PacklabError:
        return False
    return size >= max(min_size, len(magic)) and _bytes_at(location, size - len(magic),
                                                           len(magic)) == magic


def _bytes_at(location: Location, offset: int, count: int) -> bytes | None:
    try:
        return as_location(location).read_range(offset, count)
    except (PacklabError, OSError):
        return None


def read_shard_record(shard: Path, name: str, *, kind: str,
                            expect: dict[str, Any]) -> dict[str, Any]:
    """The JSON record of a directory shard, checked for the fields in ``expect`` (the first
    names the format: ``{"format": "binidx", "layout": ...}``); every error names the file."""
    file = shard / name
    if not shard.is_dir():
        raise FormatError(f"{shard}: a {kind} shard is a directory")
    if not file.is_file():
        raise FormatError(f"{file}: missing (an unfinished or damaged {kind} shard)")
    record = read_json(file, unreadable="unreadable record")
    (first, wanted), *rest = expect.items()
    if not isinstance(record, dict) or record.get(first) != wanted:
        raise FormatError(f"{file}: not a {wanted} shard record")
    for key, value in rest:
        if record.get(key) != value:
            raise FormatError(f"{file}: {key} {record.get(key)!r}, this reader knows {value!r}")
    return record


class ShardWriter(FormatFacts, ABC):
    """Streaming writer of one shard. Subclasses implement ``_open``, ``_write``, ``_close``.

    ``path``: a local path or a :class:`~packlab.storage.location.Location` (where the bytes go is the
    Location's business: a format that ``STREAMS`` writes its one file through
    :meth:`_sink`, published by the Location in one step; the others build files under the
    local temporary ``tmp_path``, so their target must have a local path).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Location,
        *,
        pack_size: int,
        num_bins: int | None = None,
        overwrite: bool = False,
        metadata: dict[str, Any] | None = None,
        check: bool = True,
    ) -> None:
        self.target = as_location(path)
        self.path: Any = self.target.local_path or self.target  # as messages name it
        self.pack_size = int(pack_size)
        if self.pack_size <= 0:
            raise PacklabError(f"{self.path}: pack_size must be positive, got {pack_size}")
        if self.target.local_path is None and not self.STREAMS:
            raise PacklabError(f"{self.path}: a {self.FORMAT} shard is built in a local folder "
                               "(write it locally and upload it)")
        self.expected_bins = num_bins
        self.overwrite = overwrite
        self.metadata = dict(metadata or {})
        self.check = check
        if self.target.exists() and not overwrite:
            raise PacklabError(f"{self.path}: already exists (pass overwrite=True to replace it)")
        self._stream: Any = None  # a streaming writer's output (closed by _finish_file)
        self.tmp = self.target.temporary()
        self.tmp_path: Path = self.tmp.local_path or Path(self.tmp.path)
        self.bins_written = 0
        self.tokens_written = 0
        self.seqs_written = 0
        self.finished = False
        self._open()

    # -- the protocol -------------------------------------------------------------------------
    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        elif not self.finished:
            self.finalize()

    def write_bin(
        self,
        bin_id: int,
        input_ids: np.ndarray,
        loss_mask: np.ndarray,
        seq_start_id: np.ndarray,
    ) -> None:
        """Write bin ``bin_id``; bins must arrive in order, each passing every invariant."""
        if self.finished:
            raise PacklabError(f"{self.path}: writer already finalized")
        if bin_id != self.bins_written:
            raise PacklabError(
                f"{self.path}: bin {bin_id} written out of order (expected bin {self.bins_written})"
            )
        if self.expected_bins is not None and bin_id >= self.expected_bins:
            raise PacklabError(f"{self.path}: bin {bin_id} beyond the announced {self.expected_bins}")
        if self.check:
            check_bin(input_ids, loss_mask, seq_start_id, pack_size=self.pack_size,
                      source=str(self.path), bin_id=bin_id)
        self._write(PackedBin(input_ids, loss_mask, seq_start_id))
        self.bins_written += 1
        self.tokens_written += int(input_ids.shape[0])
        self.seqs_written += int(seq_start_id.shape[0])

    def write(self, packed: PackedBin) -> None:
        """Append the next bin (the id is implied)."""
        self.write_bin(self.bins_written, *packed)

    def finalize(self) -> dict[str, Any]:
        """Finish the shard, write its record last, publish it under the final name."""
        if self.finished:
            raise PacklabError(f"{self.path}: writer already finalized")
        if self.expected_bins is not None and self.bins_written != self.expected_bins:
            self.abort()
            raise PacklabError(
                f"{self.path}: only {self.bins_written} of {self.expected_bins} bins written"
            )
        if self.bins_written == 0:
            self.abort()
            raise PacklabError(f"{self.path}: no bins written (empty shard)")
        try:
            record = self._close(self.base_record())
            self._publish()
        except BaseException:
            self.abort()
            raise
        self.finished = True
        return record

    def abort(self) -> None:
        """Drop the temporary; nothing appears under the final name."""
        self._discard()
        self._remove_temporary()
        self.finished = True

    def base_record(self) -> dict[str, Any]:
        """The fields every format's record (a file, footer or metadata) carries."""
        return {
            "format": self.FORMAT,
            "packlab_version": __version__,
            "pack_size": self.pack_size,
            "num_bins": self.bins_written,
            "num_tokens": self.tokens_written,
            "num_seqs": self.seqs_written,
            "metadata": self.metadata,
        }

    # -- where the shard goes: its Location's business ------------------------------------------
    def _sink(self) -> Any:
        """The output stream a format that ``STREAMS`` writes its one file to (the temporary;
        closed by :meth:`_finish_file`)."""
        self._stream = self.tmp.open_output()
        return self._stream

    def _finish_file(self) -> int:
        """Close and sync the temporary a streaming format wrote; its bytes."""
        stream, self._stream = self._stream, None
        if stream is not None:
            close_stream(stream, self.path)
        self.tmp.sync()
        return int(self.tmp.size())

    def _publish(self) -> None:
        self.target.publish_from(self.tmp, overwrite=self.overwrite)

    def _remove_temporary(self) -> None:
        stream, self._stream = getattr(self, "_stream", None), None
        if stream is not None:  # pyarrow cannot abort an upload: close it, then delete it
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - the shard is being abandoned anyway
                pass
        try:
            self.tmp.delete()
        except PacklabError:
            pass

    # -- for subclasses -----------------------------------------------------------------------
    @abstractmethod
    def _open(self) -> None:
        """Create the temporary file(s) at ``self.tmp_path``."""

    @abstractmethod
    def _write(self, packed: PackedBin) -> None:
        """Append one (already checked) bin."""

    @abstractmethod
    def _close(self, record: dict[str, Any]) -> dict[str, Any]:
        """Flush everything under ``self.tmp_path``, write the record last, return it."""

    def _discard(self) -> None:
        """Release open handles before the temporary is removed (override when needed)."""


class ShardReader(FormatFacts, ABC):
    """Lazy, picklable reader of one shard.

    Construction reads only the record/footer/header. ``read_bin`` returns arrays that stay
    valid after the reader is closed or collected (copies, or views that keep their buffer).
    """

    def __init__(self, path: str | os.PathLike[str] | Location, *, stat: bool = True) -> None:
        """``stat=False``: the format's own opening finds out whether the shard is there
        (a reader whose first request tells it anyway, as a Parquet footer's read does)."""
        self.location = as_location(path)
        self.path: Any = self.location.local_path or self.location  # as messages name it
        if stat and not self.location.exists():
            raise FormatError(f"{self.path}: no such file or directory")
        self.pack_size: int = 0
        self.num_bins: int = 0
        self.num_tokens: int = 0

    def __len__(self) -> int:
        return self.num_bins

    #: the attribute holding a one-file shard's packlab record as its reader found it (its
    #: footer, metadata, trailer or sidecar; None in a file another program wrote)
    RECORD_ATTRIBUTE: ClassVar[str | None] = None

    @property
    def own_record(self) -> bool:
        """Whether the shard carries packlab's own record (a directory shard's record file, which
        its reader requires; a one-file shard's packlab footer, metadata or trailer): what
        ``--overwrite`` may replace. A file another program wrote has none."""
        if self.RECORD_ATTRIBUTE is None:
            return self.KEEPS_RECORD
        return getattr(self, self.RECORD_ATTRIBUTE) is not None

    @property
    def metadata(self) -> dict[str, Any]:
        """What the writer was given as ``metadata=`` and recorded with the shard (the pipeline
        records ``bins``: the shard's place in its dataset); empty when the format has none."""
        if self.RECORD_ATTRIBUTE is None:
            return {}
        found = (getattr(self, self.RECORD_ATTRIBUTE) or {}).get("metadata")
        return found if isinstance(found, dict) else {}

    def __getstate__(self) -> dict[str, Any]:
        """Pickle paths and metadata only; handles and maps are reopened in the new process."""
        state = self.__dict__.copy()
        for key in self._handles():
            state[key] = None
        return state

    def _handles(self) -> Sequence[str]:
        """Attribute names holding open files or maps (set to None when pickled)."""
        return ()

    def check_index(self, index: int) -> int:
        if not -self.num_bins <= index < self.num_bins:
            raise IndexError(f"{self.path}: bin {index} out of range [0, {self.num_bins})")
        return index % self.num_bins

    @abstractmethod
    def read_bin(self, index: int) -> PackedBin:
        """Bin ``index`` (arrays safe to keep)."""

    def read_bins(self, indices: Sequence[int] | np.ndarray) -> list[PackedBin]:
        """Many bins at once; formats override this when batching is cheaper than a loop."""
        return [self.read_bin(int(i)) for i in indices]

    def iter_bins(self) -> Iterator[PackedBin]:
        for i in range(self.num_bins):
            yield self.read_bin(i)

    def item(self, index: int) -> dict[str, np.ndarray]:
        """Bin ``index`` as the dict a Megatron-Bridge packed dataset returns."""
        return self.read_bin(index).item()

    def item_read(self) -> Callable[[int], dict[str, np.ndarray]]:
        """What a dataset calls for bin ``b`` of this shard (``0 <= b < num_bins``): the
        table's own read of a format whose bins are runs of its files, else :meth:`item`."""
        return self.item

    def packed_lengths(self) -> np.ndarray:
        """Packed length of every bin (int64), from the index/metadata where possible."""
        return np.array([self.read_bin(i).packed_len for i in range(self.num_bins)], dtype=np.int64)

    @abstractmethod
    def validate(self) -> dict[str, Any]:
        """Prove the shard whole: sizes, checksums, every invariant of every bin.

        Returns a summary (``format``, ``num_bins``, ``num_tokens``, ...); raises
        :class:`packlab.errors.FormatError` or :class:`packlab.errors.InvariantError`.
        """

    @classmethod
    def spool_reference(cls, shard: Path) -> dict[str, str]:
        """A shard of a format that ``NEEDS_SPOOL``: its record of where its spool is,
        ``relative`` (to the shard) and ``path`` (absolute, when written)."""
        raise FormatError(f"{shard}: a {cls.FORMAT} shard references no spool")

    def bytes_on_disk(self) -> int:
        """All bytes this shard occupies (every file of a directory shard)."""
        return self.location.tree_size()

    def info(self) -> dict[str, Any]:
        """What ``packlab inspect`` prints."""
        return {
            "path": str(self.path),
            "format": self.FORMAT,
            "num_bins": self.num_bins,
            "num_tokens": self.num_tokens,
            "pack_size": self.pack_size,
            "bytes_on_disk": self.bytes_on_disk(),
        }

    def close(self) -> None:
        """Release handles; bins already returned stay valid."""
        for key in self._handles():
            setattr(self, key, None)

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
