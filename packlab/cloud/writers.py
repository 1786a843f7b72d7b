"""Writers whose destination is a URI: formats that stream go there directly, others are staged.

:func:`remote_writer` picks, by the format contract
(:class:`~packlab.formats.shared.base.FormatFacts`):

- a format whose writer ``STREAMS`` (Parquet), with ``direct=True`` (the default): its own
  writer, given the remote location: the file streams to a temporary key through
  ``pyarrow.fs`` and a server-side copy publishes it (no local disk; memory one row group
  plus an upload part; why a temporary key: :mod:`packlab.storage.location`);
- any other format (or ``direct=False``): :class:`UploadingWriter`, the format's own writer on
  a local staging folder, uploaded when finalized (:func:`upload_shard`: a directory shard's
  record last, a file through a temporary key). Local disk: one shard.

A format that ``NEEDS_SPOOL`` is the exception: its shard is only an index into a spool, found
by the relative path recorded at write time, which a staging folder would get wrong. Write it
beside its spool locally and upload the tree holding both (:func:`packlab.cloud.upload_tree`,
or :func:`packlab.cloud.upload_layout` for a layout): the relative path then holds on the
store, and readers download both and check the spool against the shard's record of it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from packlab.cloud.transfer import upload_shard
from packlab.errors import PacklabError
from packlab.formats import get_format
from packlab.storage.files import remove
from packlab.storage.location import Location, resolve


class UploadingWriter:
    """A shard writer of any format for a remote ``uri``: writes locally, uploads at finalize.

    Same protocol as :class:`~packlab.formats.shared.base.ShardWriter` (context manager, ``write_bin``,
    ``write``, ``finalize``, ``abort``; other attributes are the local writer's). Leaving the
    ``with`` block on an exception uploads nothing; the staging folder (under ``staging_dir``,
    default the system temporary folder: it must hold one shard) is removed in every case but
    a killed process.
    """

    def __init__(self, format: str, uri: str | Location, *, filesystem: Any = None,
                 staging_dir: str | os.PathLike[str] | None = None, overwrite: bool = False,
                 **options: Any) -> None:
        self.location = resolve(uri, filesystem)
        if get_format(format).Writer.NEEDS_SPOOL:
            raise PacklabError(f"{self.location}: a {format} shard points at its spool by a "
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
        """Finish the local shard, upload it (record or publishing copy last), clean up."""
        try:
            record = self.writer.finalize()
            self.receipt = upload_shard(self.writer.path, self.location,
                                        overwrite=self.overwrite)
        finally:
            remove(self.staging)
        return record

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


def remote_writer(format: str, path: str | os.PathLike[str] | Location, *,
                  filesystem: Any = None, direct: bool | None = None, **options: Any) -> Any:
    """A writer of ``format`` at the URI ``path`` (or a path in ``filesystem``), as described in
    the module docstring."""
    writer = get_format(format).Writer  # an unknown name is its own error
    if writer.STREAMS and direct in (None, True):
        return writer(resolve(path, filesystem), **options)
    if direct:
        raise PacklabError(f"{path}: {format} is written locally and uploaded (direct=False); "
                           "only formats that stream are written to object storage directly")
    return UploadingWriter(format, path, filesystem=filesystem, **options)
