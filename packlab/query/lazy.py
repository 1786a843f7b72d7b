"""The same shards as polars lazy frames, for comparing engines on the same questions.

``frames(data)`` returns ``raw`` (the three list columns plus split, dataset, shard, row,
pack_size), ``bins`` and ``sequences`` with the columns of the DuckDB views of the same names.
``row`` comes from a global row index minus each shard's first bin (known from the footers),
so no per-file window is needed and the scan stays streamable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from packlab.errors import FormatError
from packlab.formats import get_format
from packlab.query.sources import PathLike, resolve_sources


def frames(data: PathLike | Sequence[PathLike], *, split: str | None = None) -> dict[str, Any]:
    import polars as pl

    shards = resolve_sources(data, split=split)
    other = [s for s in shards if not get_format(s.format).Reader.SQL_READABLE]
    if other:
        raise FormatError(f"{other[0].path}: a {other[0].format} shard; polars reads Parquet "
                          "shards (packlab query transcodes others; or convert first)")
    first, at = [], 0
    for s in shards:
        first.append(at)
        at += s.num_bins
    meta = pl.LazyFrame(
        {"path": [s.path for s in shards], "split": [s.split for s in shards],
         "dataset": [s.dataset for s in shards], "shard": [s.shard for s in shards],
         "pack_size": [s.pack_size for s in shards], "first": first},
        schema={"path": pl.String, "split": pl.String, "dataset": pl.String,
                "shard": pl.String, "pack_size": pl.Int64, "first": pl.Int64})
    raw = (
        pl.scan_parquet([s.path for s in shards], include_file_paths="path",
                        row_index_name="_index")
        .join(meta, on="path", how="left")
        .with_columns((pl.col("_index").cast(pl.Int64) - pl.col("first")).alias("row"))
    )
    keys = [pl.col("split"), pl.col("dataset"), pl.col("shard"), pl.col("row")]
    bins = raw.select(
        *keys,
        pl.col("input_ids").list.len().cast(pl.Int64).alias("packed_len"),
        pl.col("seq_start_id").list.len().cast(pl.Int64).alias("num_seqs"),
        pl.col("loss_mask").list.sum().cast(pl.Int64).alias("loss_tokens"),
        pl.col("pack_size"),
    )
    ends = pl.concat_list(pl.col("seq_start_id").list.slice(1),
                          pl.col("input_ids").list.len().cast(pl.Int32))
    sequences = (
        raw.select(*keys, pl.col("seq_start_id").alias("start"), ends.alias("end"))
        .explode(["start", "end"])
        .with_columns((pl.col("end") - pl.col("start")).cast(pl.Int64).alias("length"))
        .drop("end")
    )
    return {"raw": raw, "bins": bins, "sequences": sequences}
