"""Where bytes live, local or on object storage, as one thing: a :class:`Location` (a pyarrow
filesystem plus a path in it). ``s3://bucket/key`` and ``/data/out`` both become one
(:func:`resolve`, the one place a path or URI becomes a Location); what reads and writes shards
(the formats) does it through a Location's methods: a Location knows how to open, publish, sync
and delete on its own filesystem (a rename and an fsync locally, a server-side copy on object
storage), and says where it is (:attr:`Location.is_local`), the one question a reader asks to
pick its kind of reads (:mod:`packlab.formats.read.shard_reads`). Moving bytes between stores and
the local cache (uploads, verified downloads) is :mod:`packlab.storage.objects`.

Why pyarrow's filesystems: Parquet reads and writes go through them natively (ranged reads,
multipart uploads), DuckDB can be handed one, and they pickle, so a DataLoader worker or a
spawned process reopens the same store. Any fsspec filesystem works too (wrapped with
``pyarrow.fs.FSSpecHandler``), but ``s3fs`` is not needed and must not be installed beside
``boto3`` (their botocore pins conflict).

Which store ``s3://`` means, in order: the options given to :func:`configure` (what
a local S3 server does for tests and notebooks), else ``AWS_ENDPOINT_URL_S3``
/ ``AWS_ENDPOINT_URL`` from the environment (pyarrow ignores them, packlab reads them), else
AWS itself with pyarrow's usual credential chain.

Object storage has no rename, so "publish under the final name in one step" is done per object
(:meth:`Location.publish_from`):

- a writer writes a temporary key beside the final one (``.name.tmp-<pid>-<rand>``, the local
  convention: :meth:`Location.temporary`), then it is copied to the final key server-side
  (``CopyObject``: the final key shows the old object or the whole new one, never a part) and
  the temporary deleted. Why not stream straight to the final key: pyarrow's S3 output stream
  has no abort, and dropping an unclosed one *completes* the upload (its destructor closes):
  a writer failing with a Python exception would publish a partial object (a test shows it).
  A writer killed outright never completes its multipart upload, so nothing appears at all.
- On a local filesystem the temporary is renamed instead (atomic).

Listings skip hidden names (temporaries, and anything starting with ``.``).
"""

from __future__ import annotations

import fnmatch
import glob as globlib
import os
import posixpath
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from packlab.errors import FormatError, PacklabError
from packlab.storage import files
from packlab.storage.files import TMP_MARKER, fsync_path, publish, remove

_URI = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_DEFAULTS: dict[str, dict[str, Any]] = {}
_CACHE: dict[tuple[str, tuple[tuple[str, Any], ...]], pafs.FileSystem] = {}


# -- URIs and filesystems ----------------------------------------------------------------------
def scheme_of(path: Any) -> str | None:
    """``"s3"`` for ``"s3://b/k"``; None for a local path."""
    if isinstance(path, Location):
        return path.scheme
    if not isinstance(path, str):
        return None
    match = _URI.match(path)
    return match.group(1).lower() if match else None


def is_remote(path: Any) -> bool:
    """A URI other than ``file://``, or a :class:`Location` on object storage (those are opened
    through a filesystem, never with ``open``)."""
    return scheme_of(path) not in (None, "file")


def configure(scheme: str, /, *, replace: bool = False, **options: Any) -> dict[str, Any]:
    """Set the options of the filesystem ``scheme://`` URIs get in this process (for ``s3``:
    ``pyarrow.fs.S3FileSystem`` keywords such as ``endpoint_override``, ``scheme``,
    ``access_key``, ``secret_key``, ``region``). Merged into the current ones unless
    ``replace``; returns the previous options (to restore them)."""
    scheme = scheme.lower()
    previous = dict(_DEFAULTS.get(scheme, {}))
    _DEFAULTS[scheme] = dict(options) if replace else {**previous, **options}
    if not _DEFAULTS[scheme]:
        del _DEFAULTS[scheme]
    return previous


def _s3_options() -> dict[str, Any]:
    if "s3" in _DEFAULTS:
        return dict(_DEFAULTS["s3"])
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not endpoint:
        return {}
    match = _URI.match(endpoint)
    scheme = match.group(1) if match else "https"
    return {"endpoint_override": endpoint[match.end():] if match else endpoint, "scheme": scheme}


def filesystem_for(scheme: str) -> pafs.FileSystem:
    """The (cached) pyarrow filesystem for ``scheme://`` URIs, as configured."""
    scheme = scheme.lower()
    options = _s3_options() if scheme == "s3" else dict(_DEFAULTS.get(scheme, {}))
    key = (scheme, tuple(sorted(options.items())))
    if key not in _CACHE:
        _CACHE[key] = _make_filesystem(scheme, options)
    return _CACHE[key]


def _make_filesystem(scheme: str, options: dict[str, Any]) -> pafs.FileSystem:
    try:
        if scheme == "s3":
            return pafs.S3FileSystem(**options)
        if scheme in ("gs", "gcs"):
            return pafs.GcsFileSystem(**options)
        if scheme in ("az", "abfs", "abfss"):
            return pafs.AzureFileSystem(**options)
        if scheme == "file":
            return pafs.LocalFileSystem()
        import fsspec

        return from_fsspec(fsspec.filesystem(scheme, **options))
    except (ValueError, ImportError, OSError, TypeError) as exc:
        raise PacklabError(f"{scheme}://: no filesystem for this scheme: {exc}") from None


def from_fsspec(fs: Any) -> pafs.FileSystem:
    """Any fsspec filesystem as a pyarrow one."""
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


def as_arrow_filesystem(filesystem: Any) -> pafs.FileSystem:
    """A pyarrow filesystem from a pyarrow or fsspec one."""
    if isinstance(filesystem, pafs.FileSystem):
        return filesystem
    if hasattr(filesystem, "_strip_protocol") and hasattr(filesystem, "open"):
        return from_fsspec(filesystem)
    raise PacklabError(f"not a pyarrow or fsspec filesystem: {type(filesystem).__name__}")


def as_location(path: str | os.PathLike[str] | Location) -> Location:
    """``path`` as a :class:`Location`: itself if it is one, else resolved (a local path, or
    a URI of a configured store)."""
    return resolve(path)


def resolve(path: str | os.PathLike[str] | Location, filesystem: Any = None) -> Location:
    """A :class:`Location` for a URI (``s3://bucket/key``), or for a path inside ``filesystem``.

    With a ``filesystem`` (pyarrow or fsspec), ``path`` may be a URI of that store or a bare
    path in it (``bucket/key``). Without one, the URI's scheme picks it (see :func:`configure`).
    """
    if isinstance(path, Location):
        return path
    text = os.fspath(path)
    files.check_path_name(text)
    scheme = scheme_of(text)
    inner = text[len(scheme) + 3:] if scheme else text
    if filesystem is not None:
        fs = as_arrow_filesystem(filesystem)
        return Location(fs, _clean(inner), scheme or _scheme_of_filesystem(fs))
    if scheme is None:  # a local path, kept as given (messages name it so)
        return Location(pafs.LocalFileSystem(), str(Path(inner)), "file")
    if scheme == "file":
        return Location(pafs.LocalFileSystem(), str(Path(inner).absolute()), "file")
    if not _clean(inner):
        raise PacklabError(f"{text}: no bucket in this URI")
    return Location(filesystem_for(scheme), _clean(inner), scheme)


def _scheme_of_filesystem(fs: pafs.FileSystem) -> str:
    if isinstance(fs, pafs.LocalFileSystem):
        return "file"
    if isinstance(fs, pafs.PyFileSystem):
        protocol = getattr(getattr(fs.handler, "fs", None), "protocol", "fsspec")
        return protocol[0] if isinstance(protocol, tuple | list) else str(protocol)
    return {"gcs": "gs"}.get(fs.type_name, fs.type_name)


def _clean(path: str) -> str:
    """A normalized path inside a filesystem (no trailing slash, no ``.``)."""
    stripped = path.rstrip("/")
    if not stripped:
        return ""
    normal = posixpath.normpath(stripped)
    return ("/" + normal.lstrip("/")) if path.startswith("/") else normal.lstrip("/")


# -- a place in a filesystem -------------------------------------------------------------------
@dataclass(frozen=True)
class Location:
    """A file or prefix in a pyarrow filesystem; behaves like the bits of ``Path`` that shard
    readers use, and prints as its URI (so every error names ``s3://...``). Picklable."""

    filesystem: pafs.FileSystem
    path: str
    scheme: str = "s3"

    @property
    def uri(self) -> str:
        return f"{self.scheme}://{self.path}"

    def __hash__(self) -> int:  # pyarrow filesystems are not hashable; their paths are
        return hash((self.scheme, self.path))

    def __str__(self) -> str:
        return self.path if self.is_local else self.uri

    @property
    def local_path(self) -> Path | None:
        """This place as a local path, where it is one (files a format maps or writes in
        place); None on object storage."""
        return Path(self.path) if self.is_local else None

    def __repr__(self) -> str:
        return f"Location({self.uri!r})"

    @property
    def is_local(self) -> bool:
        return isinstance(self.filesystem, pafs.LocalFileSystem)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    @property
    def suffix(self) -> str:
        return posixpath.splitext(self.name)[1]

    @property
    def parent(self) -> Location:
        parent = posixpath.dirname(self.path)
        return Location(self.filesystem, parent or ("." if self.is_local else ""), self.scheme)

    def joinpath(self, *parts: str) -> Location:
        """A path below this one (``..`` allowed, resolved lexically as URIs are)."""
        return Location(self.filesystem, _clean(posixpath.join(self.path, *parts)), self.scheme)

    def __truediv__(self, part: str) -> Location:
        return self.joinpath(part)

    def relative_to(self, root: Location) -> str:
        if not (self.path == root.path or self.path.startswith(root.path.rstrip("/") + "/")):
            raise PacklabError(f"{self} is not under {root}")
        return self.path[len(root.path):].lstrip("/")

    # -- what is there ----------------------------------------------------------------------
    def info(self) -> pafs.FileInfo:
        try:
            return self.filesystem.get_file_info(self.path)
        except (OSError, pa.ArrowException) as exc:
            raise FormatError(f"{self}: cannot reach it: {error_line(exc)}") from None

    def exists(self) -> bool:
        if self.is_local:  # a dangling link is there too (it would be replaced)
            return os.path.lexists(self.path)
        return self.info().type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        return self.info().type == pafs.FileType.File

    def is_dir(self) -> bool:
        return self.info().type == pafs.FileType.Directory

    def size(self) -> int:
        info = self.info()
        if info.type != pafs.FileType.File:
            raise FormatError(f"{self}: no such object")
        return int(info.size)

    def iterdir(self) -> Iterator[Location]:
        """Children (files and prefixes) directly under this prefix, sorted, hidden ones skipped
        (a local folder's links listed as they are, broken ones too)."""
        if self.is_local:
            try:
                names = sorted(os.listdir(self.path))
            except FileNotFoundError:
                raise FormatError(f"{self}: no such file or directory") from None
            except OSError as exc:
                raise FormatError(f"{self}: cannot list it: {exc.strerror}") from None
            yield from (self / n for n in names if not n.startswith("."))
            return
        try:
            infos = self.filesystem.get_file_info(pafs.FileSelector(self.path, recursive=False))
        except FileNotFoundError:
            raise FormatError(f"{self}: no such file or directory") from None
        except (OSError, pa.ArrowException) as exc:
            raise FormatError(f"{self}: cannot list it: {error_line(exc)}") from None
        for info in sorted(infos, key=lambda i: i.path):
            name = posixpath.basename(info.path.rstrip("/"))
            if name and not name.startswith("."):
                yield self / name

    def is_link(self) -> bool:
        """A symbolic link (a layout's ``splits/`` hold them; object storage has none)."""
        return self.is_local and os.path.islink(self.path)

    def link_target(self) -> str:
        """What a link points at, as written in it."""
        return os.readlink(self.path)

    def resolved(self) -> Location:
        """Where this path really is, links followed (itself on object storage)."""
        return replace(self, path=os.path.realpath(self.path)) if self.is_local else self

    def glob(self) -> list[Location]:
        """What this path, a glob pattern, matches (sorted; ``*`` does not cross ``/``)."""
        if self.is_local:
            return [replace(self, path=p) for p in sorted(globlib.glob(self.path))]
        parts = self.path.split("/")
        fixed = next(i for i, part in enumerate(parts) if globlib.has_magic(part))
        base = replace(self, path="/".join(parts[:fixed]))
        found = set()
        for info in base.walk_files():
            pieces = info.path.split("/")
            if len(pieces) >= len(parts):
                candidate = "/".join(pieces[:len(parts)])
                if fnmatch.fnmatchcase(candidate, self.path):
                    found.add(candidate)
        return [replace(self, path=p) for p in sorted(found)]

    def tree_size(self) -> int:
        """Bytes of this file, or of every file under this folder or prefix."""
        info = self.info()
        if info.type == pafs.FileType.File:
            return int(info.size)
        return sum(int(i.size) for i in self.walk_files())

    def walk_files(self) -> Iterator[pafs.FileInfo]:
        """Every file under this prefix (recursive), hidden names included."""
        try:
            infos = self.filesystem.get_file_info(pafs.FileSelector(self.path, recursive=True,
                                                                    allow_not_found=True))
        except (OSError, pa.ArrowException) as exc:
            raise FormatError(f"{self}: cannot list it: {error_line(exc)}") from None
        yield from (i for i in infos if i.type == pafs.FileType.File)

    # -- bytes ------------------------------------------------------------------------------
    def open_input(self) -> pa.NativeFile:
        """A random-access file (ranged reads on object storage)."""
        try:
            return self.filesystem.open_input_file(self.path)
        except FileNotFoundError:
            raise FormatError(f"{self}: no such file or directory") from None
        except (OSError, pa.ArrowException) as exc:
            raise FormatError(f"{self}: cannot open: {error_line(exc)}") from None

    def open_output(self) -> pa.NativeFile:
        """An output stream to this very key (visible when closed; see the module docstring
        for why writers write a temporary key instead)."""
        try:
            folder = posixpath.dirname(self.path)  # "" for a bare name in the working folder
            if folder and isinstance(self.filesystem, pafs.LocalFileSystem | pafs.PyFileSystem):
                # object stores need no folders (S3 would get empty "dir/" marker objects)
                self.filesystem.create_dir(folder, recursive=True)
            return self.filesystem.open_output_stream(self.path)
        except (OSError, pa.ArrowException) as exc:
            raise PacklabError(f"{self}: cannot write: {error_line(exc)}") from None

    def read_bytes(self) -> bytes:
        with self.open_input() as f:
            return f.read()

    def read_range(self, offset: int, nbytes: int) -> bytes:
        with self.open_input() as f:
            return f.read_at(nbytes, offset)

    def temporary(self) -> Location:
        """A unique hidden sibling (``.name.tmp-<pid>-<rand>``) to write before publishing (a
        local parent folder is made if missing)."""
        if self.is_local:
            Path(self.parent.path).mkdir(parents=True, exist_ok=True)
        return self.parent / f".{self.name}{TMP_MARKER}{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def sync(self) -> None:
        """Make a written file durable: fsync locally; an object is durable once closed."""
        if self.is_local:
            fsync_path(Path(self.path))

    def publish_from(self, tmp: Location, *, overwrite: bool) -> None:
        """Make the finished temporary ``tmp`` appear here in one step, then drop it: one
        rename locally (a directory replaced whole, the folder fsynced), a server-side copy on
        object storage (see the module docstring)."""
        if not overwrite and self.exists():
            tmp.delete()
            raise PacklabError(f"{self}: already exists (pass overwrite=True to replace it)")
        if self.is_local:
            publish(Path(tmp.path), Path(self.path), overwrite=True)
            return
        try:
            self.filesystem.copy_file(tmp.path, self.path)  # server-side CopyObject: atomic
        except (OSError, pa.ArrowException) as exc:
            tmp.delete()
            raise PacklabError(f"{self}: publishing failed: {error_line(exc)}") from None
        tmp.delete()

    def delete(self) -> None:
        """Remove this object, or every object under this prefix; nothing if absent."""
        if self.is_local:
            remove(Path(self.path))
            return
        info = self.info()
        try:
            if info.type == pafs.FileType.File:
                self.filesystem.delete_file(self.path)
            elif info.type == pafs.FileType.Directory:
                self.filesystem.delete_dir(self.path)
        except FileNotFoundError:
            pass
        except (OSError, pa.ArrowException) as exc:
            raise PacklabError(f"{self}: cannot delete: {error_line(exc)}") from None


class RangedFile:
    """One file read by byte ranges where it is: opened on the first read (on object storage
    one HEAD, as pyarrow opens a file), then every :meth:`read` is exactly one ranged GET of
    exactly the bytes asked (locally, a ``pread``). How a reader reads bins in place on object
    storage, as Megatron-core's object-storage path does. Pickles as its Location (a process
    opens its own handle)."""

    __slots__ = ("location", "_file", "requests")

    def __init__(self, location: Location) -> None:
        self.location = location
        self._file: pa.NativeFile | None = None
        self.requests = 0  # ranged reads made through this handle

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["location"])  # type: ignore[misc]

    def size(self) -> int:
        return int(self._opened().size())

    def _opened(self) -> pa.NativeFile:
        if self._file is None:
            self._file = self.location.open_input()
        return self._file

    def read(self, offset: int, nbytes: int) -> bytes:
        """Bytes ``[offset, offset + nbytes)``: one request; fewer bytes than asked (a file
        shorter than its index says) is a FormatError naming the file."""
        try:
            data = self._opened().read_at(nbytes, offset)
        except (OSError, pa.ArrowException) as exc:
            raise FormatError(f"{self.location}: cannot read bytes {offset}..{offset + nbytes}: "
                              f"{error_line(exc)}") from None
        self.requests += 1
        if len(data) != nbytes:
            raise FormatError(f"{self.location}: {len(data)} of the {nbytes} bytes at byte "
                              f"{offset} (truncated or corrupted)")
        return data

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()


def error_line(exc: BaseException) -> str:
    """A filesystem's error on one line (its first, at most 300 characters), for messages."""
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
