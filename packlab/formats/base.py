"""What every shard format shares: the writer protocol, the reader base, and the manifest.

A writer is a keyword-only context manager. It checks every bin's invariants, accepts bins
only in order (``bin_id`` 0, 1, 2, ...), refuses to finalize with fewer bins than announced,
works under a temporary name and publishes atomically in :meth:`ShardWriter.finalize`, the
manifest (or footer) written last. Leaving the ``with`` block on an exception aborts: nothing
appears under the final name.

A reader opens lazily (cheap to construct and to pickle, so a DataLoader worker reopens it),
returns bins whose arrays stay valid after the reader is closed or collected, and can
``validate`` a shard whole (sizes, checksums, every invariant).
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from packlab import __version__
from packlab.bins import PackedBin
from packlab.errors import FormatError, PacklabError
from packlab.files import publish, remove, temporary_sibling
from packlab.invariants import check_bin


def index_list(indices: Sequence[int] | np.ndarray) -> Sequence[int]:
    """Bin indices as a sequence of ints to loop over: a numpy array becomes a list in one C
    call (for the batches a DataLoader asks, a Python loop beats a dozen small numpy calls)."""
    if isinstance(indices, list | tuple | range):
        return indices
    return np.asarray(indices).reshape(-1).tolist()  # arrays, tensors, other sequences


def starts_with(path: Path, magic: bytes) -> bool:
    """A file whose first bytes are ``magic``: how single-file formats recognise themselves."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(len(magic)) == magic


def read_directory_manifest(shard: Path, name: str, *, kind: str,
                            expect: dict[str, Any]) -> dict[str, Any]:
    """The JSON manifest of a directory shard, checked for the fields in ``expect`` (the first
    names the format: ``{"format": "binidx", "layout": ...}``); every error names the file."""
    file = shard / name
    if not shard.is_dir():
        raise FormatError(f"{shard}: a {kind} shard is a directory")
    if not file.is_file():
        raise FormatError(f"{file}: missing (an unfinished or damaged {kind} shard)")
    try:
        manifest = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{file}: unreadable manifest: {exc}") from None
    (first, wanted), *rest = expect.items()
    if not isinstance(manifest, dict) or manifest.get(first) != wanted:
        raise FormatError(f"{file}: not a {wanted} manifest")
    for key, value in rest:
        if manifest.get(key) != value:
            raise FormatError(f"{file}: {key} {manifest.get(key)!r}, this reader knows {value!r}")
    return manifest


class ShardWriter(ABC):
    """Streaming writer of one shard. Subclasses implement ``_open``, ``_write``, ``_close``."""

    FORMAT: ClassVar[str]

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        pack_size: int,
        num_bins: int | None = None,
        overwrite: bool = False,
        metadata: dict[str, Any] | None = None,
        check: bool = True,
    ) -> None:
        self.path = self._target(path)
        self.pack_size = int(pack_size)
        if self.pack_size <= 0:
            raise PacklabError(f"{self.path}: pack_size must be positive, got {pack_size}")
        self.expected_bins = num_bins
        self.overwrite = overwrite
        self.metadata = dict(metadata or {})
        self.check = check
        if self._target_exists() and not overwrite:
            raise PacklabError(f"{self.path}: already exists (pass overwrite=True to replace it)")
        self.tmp_path = self._make_temporary()
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
        """Finish the shard, write its manifest last, publish it under the final name."""
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
            manifest = self._close(self.base_manifest())
            self._publish()
        except BaseException:
            self.abort()
            raise
        self.finished = True
        return manifest

    def abort(self) -> None:
        """Drop the temporary; nothing appears under the final name."""
        self._discard()
        self._remove_temporary()
        self.finished = True

    def base_manifest(self) -> dict[str, Any]:
        """The fields every format's manifest (or footer metadata) carries."""
        return {
            "format": self.FORMAT,
            "packlab_version": __version__,
            "pack_size": self.pack_size,
            "num_bins": self.bins_written,
            "num_tokens": self.tokens_written,
            "num_seqs": self.seqs_written,
            "metadata": self.metadata,
        }

    # -- where the shard goes (a writer to object storage overrides these, see packlab.cloud) --
    def _target(self, path: str | os.PathLike[str]) -> Path:
        return Path(path)

    def _target_exists(self) -> bool:
        return self.path.exists() or self.path.is_symlink()

    def _make_temporary(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return temporary_sibling(self.path)

    def _publish(self) -> None:
        publish(self.tmp_path, self.path, overwrite=self.overwrite)

    def _remove_temporary(self) -> None:
        remove(self.tmp_path)

    # -- for subclasses -----------------------------------------------------------------------
    @abstractmethod
    def _open(self) -> None:
        """Create the temporary file(s) at ``self.tmp_path``."""

    @abstractmethod
    def _write(self, packed: PackedBin) -> None:
        """Append one (already checked) bin."""

    @abstractmethod
    def _close(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Flush everything under ``self.tmp_path``, write the manifest last, return it."""

    def _discard(self) -> None:
        """Release open handles before the temporary is removed (override when needed)."""


class ShardReader(ABC):
    """Lazy, picklable reader of one shard.

    Construction reads only the manifest/footer/header. ``read_bin`` returns arrays that stay
    valid after the reader is closed or collected (copies, or views that keep their buffer).
    """

    FORMAT: ClassVar[str]

    def __init__(self, path: str | os.PathLike[str]) -> None:
        # A remote location (packlab.storage.Location: ``is_remote``) is kept as it is, so
        # messages name its URI; its reader opens it through its filesystem.
        self.path = path if getattr(path, "is_remote", False) else Path(path)  # type: ignore[assignment]
        if not (getattr(path, "is_remote", False) or self.path.exists()
                or str(path).startswith(("s3://", "gs://", "file://"))):
            raise FormatError(f"{self.path}: no such file or directory")
        self.pack_size: int = 0
        self.num_bins: int = 0
        self.num_tokens: int = 0

    def __len__(self) -> int:
        return self.num_bins

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

    def packed_lengths(self) -> np.ndarray:
        """Packed length of every bin (int64), from the index/metadata where possible."""
        return np.array([self.read_bin(i).packed_len for i in range(self.num_bins)], dtype=np.int64)

    @abstractmethod
    def validate(self) -> dict[str, Any]:
        """Prove the shard whole: sizes, checksums, every invariant of every bin.

        Returns a summary (``format``, ``num_bins``, ``num_tokens``, ...); raises
        :class:`packlab.errors.FormatError` or :class:`packlab.errors.InvariantError`.
        """

    def bytes_on_disk(self) -> int:
        """All bytes this shard occupies (every file of a directory shard)."""
        if self.path.is_dir():
            return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())
        return self.path.stat().st_size

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
