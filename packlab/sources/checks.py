"""``packlab validate`` over any dataset path: prove every shard whole, in its place.

Per shard (:func:`packlab.layout.validate.validate_shard`): the reader's ``validate`` (sizes,
checksums, every invariant of every bin), its receipt, and, where a dataset manifest lists it,
its bins and checksum there. Per directory without a manifest: no receipt left without its
shard. Per layout: every split's bins and tokens against ``blend.json``. An output still being
written was refused already by the resolver (:mod:`packlab.sources.resolve`).

A shard on object storage is downloaded into the verified cache first (directory shards file by
file against their manifest), then checked exactly as a local one, against the receipt stored
beside it; errors name its URI.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from packlab.cloud.datasets import fetch_spool
from packlab.cloud.transfer import download_shard
from packlab.errors import PacklabError
from packlab.formats import get_format, open_shard
from packlab.layout.validate import (
    check_orphan_receipts,
    check_split_counts,
    totals,
    validate_shard,
)
from packlab.pipeline.receipts import RECEIPT_SUFFIX, parse_receipt
from packlab.progress import progress_bar
from packlab.sources.resolve import Shard, Source, resolve_source
from packlab.storage import Location


def validate_source(source: Source, *, cache_dir: str | os.PathLike[str] | None = None
                    ) -> dict[str, Any]:
    """Validate every shard of ``source``; raises on the first problem, naming it. Returns the
    totals, one row per shard, and per split counts when the shards carry splits."""
    rows: list[dict[str, Any]] = []
    with progress_bar(total=_bins_to_check(source), desc="validate", unit="bin") as bar:
        for shard in source.shards:
            row = _validate_remote(shard, cache_dir) if shard.remote else validate_shard(
                shard.path, shard.format, bins=shard.bins, sha256=shard.sha256)
            row.update(split=shard.split, dataset=shard.dataset, name=shard.name)
            rows.append(row)
            bar.update(int(row["num_bins"]))
    if source.kind == "directory" and not source.remote:
        directory = Path(source.given)
        check_orphan_receipts(directory, {Path(s.path).name for s in source.shards})
    out: dict[str, Any] = {"path": source.given, "kind": source.kind, **totals(rows),
                           "manifest": any(s.sha256 is not None for s in source.shards)}
    if source.splits:
        out["splits"] = _split_totals(source, rows)
    return out


def validate_path(path: Any, *, split: str | None = None,
                  cache_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """``packlab validate PATH [--split]``: any dataset path or URI, resolved, validated."""
    return validate_source(resolve_source(path, split=split), cache_dir=cache_dir)


def _split_totals(source: Source, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per split: shards, bins, tokens; checked against ``blend.json`` for a layout."""
    splits: dict[str, Any] = {name: {"num_shards": 0, "num_bins": 0, "num_tokens": 0}
                              for name in source.empty_splits}
    for name in source.splits:
        mine = totals([r for r in rows if r["split"] == name])
        if source.blend is not None:
            check_split_counts(f"{source.layout}/splits/{name}", source.blend, name, mine)
        splits[name] = {k: mine[k] for k in ("num_shards", "num_bins", "num_tokens")}
    order = list((source.blend or {}).get("splits", {})) or list(splits)
    return {name: splits[name] for name in order if name in splits}


def _bins_to_check(source: Source) -> int | None:
    """Bins to validate, for the progress bar: from dataset manifests, else from the local
    readers' headers (cheap); None (no ETA) for remote shards no manifest describes."""
    total = 0
    for shard in source.shards:
        if shard.bins is not None:
            total += shard.bins[1] - shard.bins[0]
        elif shard.remote:
            return None
        else:
            try:
                with open_shard(shard.path, format=shard.format) as reader:
                    total += reader.num_bins
            except PacklabError:
                return None  # validate names the problem
    return total


def _validate_remote(shard: Shard, cache_dir: str | os.PathLike[str] | None) -> dict[str, Any]:
    """Download (verified) into the cache, then validate the copy as a local shard."""
    location: Location = shard.path
    reader = get_format(shard.format).Reader
    local = download_shard(location, cache_dir=cache_dir, format=shard.format, validate=False)
    try:
        options = {}
        if reader.NEEDS_SPOOL:
            options["spool"] = fetch_spool(location, local, reader, cache_dir=cache_dir)
        receipt_at = location.parent / f"{location.name}{RECEIPT_SUFFIX}"
        receipt = parse_receipt(receipt_at.read_bytes(), receipt_at) \
            if receipt_at.is_file() else None
        row = validate_shard(local, shard.format, bins=shard.bins, sha256=shard.sha256,
                             receipt=receipt, reader_options=options)
    except PacklabError as exc:
        raise type(exc)(str(exc).replace(str(local), location.uri)) from None
    row["path"] = location.uri
    return row
