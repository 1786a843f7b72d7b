"""DuckDB over Parquet shards on object storage, without DuckDB's network extension.

``INSTALL httpfs`` needs a download (impossible offline, and a second S3 client to configure).
Instead DuckDB is handed packlab's own pyarrow filesystem, two ways:

- :func:`connect` registers it as an fsspec filesystem (``ArrowFSWrapper``), so
  ``read_parquet('s3://bucket/out/*.parquet')`` works in plain SQL; DuckDB then reads the
  footer and only the column chunks a query needs, with ranged requests (plus a few HEADs);
- :func:`arrow_dataset` builds a ``pyarrow.dataset`` over the shards, which DuckDB scans by
  name (``con.register("bins", ds)``), with projection pushed down to pyarrow.

:func:`create_view` makes a view over a split of a remote layout (or a prefix of shards), so
``SELECT count(*), avg(len(input_ids)) FROM bins`` needs no path at all.
"""

from __future__ import annotations

from typing import Any

from packlab.cloud.discovery import find_shards, split_shards
from packlab.cloud.storage import Location, as_arrow_filesystem, filesystem_for, resolve
from packlab.errors import PacklabError
from packlab.formats import get_format


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError:
        raise PacklabError("DuckDB is not installed (pip install duckdb)") from None
    return duckdb


def connect(filesystem: Any = None, *, con: Any = None) -> Any:
    """A DuckDB connection (new, or ``con``) that reads ``s3://`` (or ``filesystem``'s scheme)
    through pyarrow."""
    from fsspec.implementations.arrow import ArrowFSWrapper

    duckdb = _duckdb()
    con = con if con is not None else duckdb.connect()
    fs = as_arrow_filesystem(filesystem) if filesystem is not None else filesystem_for("s3")
    con.register_filesystem(ArrowFSWrapper(fs))
    return con


def parquet_shards(uri: str | Location, *, split: str | None = None,
                   filesystem: Any = None) -> list[Location]:
    """The Parquet shards of a remote prefix, or of a layout's split; other formats refused."""
    location = resolve(uri, filesystem)
    shards = split_shards(location, split) if split else find_shards(location)
    other = [loc for loc, name in shards if not get_format(name).Reader.SQL_READABLE]
    if other:
        raise PacklabError(f"{other[0]}: not Parquet; SQL reads Parquet shards only")
    return [loc for loc, _ in shards]


def create_view(con: Any, name: str, uri: str | Location, *, split: str | None = None,
                filesystem: Any = None) -> list[str]:
    """``CREATE VIEW name`` over the remote Parquet shards (connection from :func:`connect`);
    returns the URIs it reads."""
    if not name.isidentifier():
        raise PacklabError(f"view name {name!r} is not an identifier")
    uris = [loc.uri for loc in parquet_shards(uri, split=split, filesystem=filesystem)]
    listed = ", ".join("'" + u.replace("'", "''") + "'" for u in uris)
    con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet([{listed}])")
    return uris


def arrow_dataset(uri: str | Location, *, split: str | None = None,
                  filesystem: Any = None) -> Any:
    """A ``pyarrow.dataset.Dataset`` over the remote Parquet shards (DuckDB scans it)."""
    import pyarrow.dataset as ds

    shards = parquet_shards(uri, split=split, filesystem=filesystem)
    return ds.dataset([loc.path for loc in shards], filesystem=shards[0].filesystem,
                      format="parquet")
