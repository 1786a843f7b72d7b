"""Packed shards on object storage (``s3://``, any pyarrow or fsspec filesystem).

How each format gets there and back (the RFC's third goal, seeds 000 and 001):

================  ===========================================  ==========================================
format            write                                        read
================  ===========================================  ==========================================
parquet           streamed through ``pyarrow.fs`` to a         in place: footer first, one ranged GET per
                  temporary key, published by a server-side    row group on demand (:mod:`.parquet`)
                  copy (:mod:`.parquet`)
memmap_v1,        written locally, uploaded file by file,      downloaded to a local cache, every file
binidx            ``manifest.json`` last (:mod:`.transfer`)    checked against the manifest's SHA-256
packed_index      written beside its spool locally, the tree   as above, plus the spool (checked against
                  uploaded (:func:`upload_tree`)               the shard's record of it)
arrow_ipc, pbin,  written locally, uploaded through a          downloaded, checked by the format's own
legacy_npy_pickle temporary key and a publishing copy          ``validate()``, cached
================  ===========================================  ==========================================

Entry points: :func:`open_writer`, :func:`open_shard`, :func:`open_dataset` (``split=`` through
``blend.json``), :func:`upload_shard`, :func:`download_shard`, :func:`upload_layout`,
:func:`upload_tree`, :func:`sweep_temporaries`, and DuckDB in :mod:`packlab.cloud.sql`.
Which store ``s3://`` means: :func:`packlab.storage.configure` (or ``AWS_ENDPOINT_URL``); for
tests and notebooks, :class:`packlab.s3server.S3Server` configures a local one.
"""

from __future__ import annotations

from packlab.cloud.datasets import (
    RemoteDataset,
    fetch_spool,
    find_shards,
    is_remote_source,
    open_dataset,
    open_shard,
)
from packlab.cloud.layout import read_remote_blend, split_shards, upload_layout, upload_tree
from packlab.cloud.transfer import (
    default_cache_dir,
    download_shard,
    sweep_temporaries,
    upload_shard,
)
from packlab.cloud.writers import UploadingWriter, open_writer

__all__ = [
    "RemoteDataset", "UploadingWriter", "default_cache_dir", "download_shard", "fetch_spool",
    "find_shards", "is_remote_source", "open_dataset", "open_shard", "open_writer",
    "read_remote_blend", "split_shards", "sweep_temporaries", "upload_layout", "upload_shard",
    "upload_tree",
]
