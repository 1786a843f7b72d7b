"""Packed shards on object storage (``s3://``, any pyarrow or fsspec filesystem).

How a shard gets there and back is decided by its format's contract
(:class:`~packlab.formats.shared.base.FormatFacts`), never by its name:

====================  ===========================================  ==========================================
the format ...        write                                        read
====================  ===========================================  ==========================================
``STREAMS`` /         streamed through ``pyarrow.fs`` to a         in place: footer first, one ranged GET per
``READS_IN_PLACE``    temporary key, published by a server-side    row group on demand
(parquet)             copy (:mod:`.writers`)
``READS_IN_PLACE``    written locally, uploaded file by file,      in place: the index files fetched once
table formats         the record last (a pair: the ``.idx``)       into the cache (checked against the
(binidx,                                                           record), then one ranged GET of exactly
megatron_sft)                                                      a bin's bytes per data file
directory shards      written locally, uploaded file by file,      downloaded to a local cache, every file
(memmap_v1)           the record last (:mod:`.transfer`)           checked against the record's SHA-256
``NEEDS_SPOOL``       written beside its spool locally, the tree   as above, plus the spool (checked against
(packed_index)        uploaded (:func:`upload_tree`)               the shard's record of it)
other one-file        written locally, uploaded through a          downloaded, checked by the format's own
shards                temporary key and a publishing copy          ``validate()``, cached
====================  ===========================================  ==========================================

Entry points (the facade :func:`packlab.open_dataset`, ``open_shard`` and ``open_writer``
send URIs here): :func:`remote_writer`, :func:`remote_shard`, :func:`upload_shard`,
:func:`download_shard`,
:func:`upload_layout`, :func:`upload_tree`, :func:`sweep_temporaries`; DuckDB in :mod:`.sql`.
Which store ``s3://`` means: :func:`packlab.storage.location.configure` (or ``AWS_ENDPOINT_URL``);
for tests and notebooks, :class:`packlab.lab.s3server.S3Server` configures a local one.
"""

from __future__ import annotations

from packlab.cloud.datasets import (
    RemoteDataset,
    fetch_spool,
    is_remote_source,
    remote_shard,
)
from packlab.cloud.transfer import (
    download_shard,
    sweep_temporaries,
    upload_shard,
)
from packlab.cloud.upload import upload_layout, upload_tree
from packlab.cloud.writers import UploadingWriter, remote_writer

__all__ = [
    "RemoteDataset", "UploadingWriter", "download_shard", "fetch_spool",
    "is_remote_source", "remote_shard", "remote_writer", "sweep_temporaries", "upload_layout",
    "upload_shard", "upload_tree",
]
