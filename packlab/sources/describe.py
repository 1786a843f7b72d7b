"""``packlab inspect`` over any dataset path: what it holds, from headers and listings only;
and what a folder is, in a word, for a command that wanted a file (:func:`what_is`).

One shard: its reader's ``info()`` (format, bins, tokens, pack size, bytes on disk). A dataset
of several shards: the same totals (``format``, ``num_shards``, ``num_bins``, ``num_tokens``,
``pack_size``, ``bytes_on_disk``), per split where the shards carry one, and the shards
themselves. No bin is read; on object storage, sizes come from the listing and counts from each
shard's footer or record file (a shard that must be downloaded to be opened is fetched into the
verified cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packlab.errors import PacklabError
from packlab.formats import detect_format, shard_size
from packlab.pipeline.dataset_record import DATASET_RECORD
from packlab.pipeline.layout.blend import is_layout
from packlab.sources import open_shard
from packlab.sources.outputs import spool_at
from packlab.sources.resolve import Shard, Source


def what_is(folder: Path) -> str:
    """A local folder in a few words, by the record it holds: a spool, a pack or convert
    output, an output layout, a shard of a format, or just a folder."""
    try:
        if spool_at(str(folder)) is not None:
            return "a spool (already tokenized: packlab pack packs it)"
    except PacklabError:
        return "a damaged spool"
    if (folder / DATASET_RECORD).is_file():
        return "a pack output (a folder of shards)"
    if is_layout(folder):
        return "an output layout (splits of shards)"
    try:
        return f"a {detect_format(folder)} shard"
    except PacklabError:
        return "a folder"


def shard_info(shard: Shard) -> dict[str, Any]:
    """Format, bins, tokens, pack size and bytes of one shard (local or remote)."""
    with open_shard(shard.path, format=shard.format) as reader:
        info = {"path": str(shard.path), "format": shard.format,
                "num_bins": int(reader.num_bins), "num_tokens": int(reader.num_tokens),
                "pack_size": int(reader.pack_size)}
        if not shard.remote:
            info = {**dict(reader.info()), **info}
    info["bytes_on_disk"] = shard_size(shard.path)
    return info


def describe_source(source: Source) -> dict[str, Any]:
    """The summary ``packlab inspect`` prints for ``source``."""
    if source.kind == "shard":
        return shard_info(source.shards[0])
    rows = []
    for shard in source.shards:
        row = shard_info(shard)
        rows.append({"name": shard.name, "split": shard.split, "dataset": shard.dataset,
                     **{k: row[k] for k in ("format", "num_bins", "num_tokens", "pack_size",
                                            "bytes_on_disk")}})
    out: dict[str, Any] = {"path": source.given, "kind": source.kind,
                           **_totals(rows), "formats": source.formats}
    if source.splits:
        out["splits"] = {name: _totals([r for r in rows if r["split"] == name], brief=True)
                         for name in source.splits}
        for name in source.empty_splits:
            out["splits"][name] = {"num_shards": 0, "num_bins": 0, "num_tokens": 0}
    out["shards"] = rows
    return out


def _totals(rows: list[dict[str, Any]], *, brief: bool = False) -> dict[str, Any]:
    out = {"num_shards": len(rows), "num_bins": sum(r["num_bins"] for r in rows),
           "num_tokens": sum(r["num_tokens"] for r in rows)}
    if brief:
        return out
    formats = sorted({r["format"] for r in rows})
    return {"format": "+".join(formats), **out,
            "pack_size": max((r["pack_size"] for r in rows), default=0),
            "bytes_on_disk": sum(r["bytes_on_disk"] for r in rows)}
