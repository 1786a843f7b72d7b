"""Writers whose destination is a URI: Parquet streams there, every other format is staged.

:func:`open_writer` picks, for ``format`` and ``uri``:

- ``parquet`` (``direct=True``, the default): :class:`packlab.cloud.parquet.Writer`, straight
  through ``pyarrow.fs`` (no local disk; memory one row group plus an upload part);
- any format (``parquet`` with ``direct=False``): :class:`UploadingWriter`, the format's own
  writer on a local staging folder, uploaded when finalized (:func:`upload_shard`: a directory
  shard's manifest last, a file through a temporary key). Local disk: one shard.

``packed_index`` is the exception: its shard is only an index into a spool, found by the
relative path recorded at write time, which a staging folder would get wrong. Write it beside
its spool locally and upload the tree holding both (:func:`packlab.cloud.upload_tree`, or
:func:`packlab.cloud.upload_layout` for a layout): the relative path then holds on the store,
and readers download both and check the spool against the shard's record of it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from packlab.cloud.transfer import upload_shard
from packlab.errors import PacklabError
from packlab.files import remove
from packlab.formats import get_format
from packlab.formats import open_writer as open_local_writer
from packlab.storage import Location, is_remote, resolve


class UploadingWriter:
    """A shard writer of any format for a remote ``uri``: writes locally, uploads at finalize.

    Same protocol as :class:`~packlab.formats.base.ShardWriter` (context manager, ``write_bin``,
    ``write``, ``finalize``, ``abort``; other attributes are the local writer's). Leaving the
    ``with`` block on an exception uploads nothing; the staging folder (under ``staging_dir``,
    default the system temporary folder: it must hold one shard) is removed in every case but
    a killed process.
    """

    def __init__(self, format: str, uri: str | Location, *, filesystem: Any = None,
                 staging_dir: str | os.PathLike[str] | None = None, overwrite: bool = False,
                 **options: Any) -> None:
        self.location = resolve(uri, filesystem)
        if format == "packed_index":
            raise PacklabError(f"{self.location}: a packed_index shard points at its spool by a "
                               "relative path: write it beside its spool locally, then upload "
                               "both with packlab.cloud.upload_tree (or upload_layout)")
        self.format = format
        self.overwrite = overwrite
        if not overwrite and self.location.exists():
            raise PacklabError(f"{self.location}: already exists (pass overwrite=True to "
                               "replace it)")
        self.staging = Path(tempfile.mkdtemp(prefix="packlab-upload-", dir=staging_dir))
        name = self.location.name or "shard"
        try:
            self.writer = get_format(format).Writer(self.staging / name, **options)
        except BaseException:
            remove(self.staging)
            raise
        self.receipt: dict[str, Any] | None = None

    @property
    def path(self) -> Location:
        return self.location

    def __getattr__(self, name: str) -> Any:
        if name == "writer":  # not set yet: __init__ failed
            raise AttributeError(name)
        return getattr(self.writer, name)

    def write_bin(self, *args: Any, **kwargs: Any) -> None:
        self.writer.write_bin(*args, **kwargs)

    def write(self, packed: Any) -> None:
        self.writer.write(packed)

    def finalize(self) -> dict[str, Any]:
        """Finish the local shard, upload it (manifest or publishing copy last), clean up."""
        try:
            manifest = self.writer.finalize()
            self.receipt = upload_shard(self.writer.path, self.location,
                                        overwrite=self.overwrite)
        finally:
            remove(self.staging)
        return manifest

    def abort(self) -> None:
        try:
            if not self.writer.finished:
                self.writer.abort()
        finally:
            remove(self.staging)

    def __enter__(self) -> UploadingWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        elif not self.writer.finished:
            self.finalize()


def open_writer(format: str, path: str | os.PathLike[str] | Location, *, filesystem: Any = None,
                direct: bool | None = None, **options: Any) -> Any:
    """A writer of ``format`` at ``path``: local paths as :func:`packlab.formats.open_writer`;
    URIs (or a ``filesystem``) as described in the module docstring."""
    if filesystem is None and not is_remote(path):
        if direct:
            raise PacklabError(f"{path}: direct= applies to object storage only")
        return open_local_writer(format, path, **options)
    get_format(format)  # an unknown name is its own error
    if format == "parquet" and direct in (None, True):
        from packlab.cloud.parquet import Writer

        return Writer(path, filesystem=filesystem, **options)
    if direct:
        raise PacklabError(f"{path}: only parquet is written directly to object storage; "
                           f"{format} is written locally and uploaded (direct=False)")
    return UploadingWriter(format, path, filesystem=filesystem, **options)
