"""``packlab convert`` over any dataset path: bin by bin, into one shard or a whole dataset.

A source that is one shard converts into one shard. Anything else (a directory of shards, a
layout's split, a glob, a run folder; local or remote) converts into a folder that is a
packlab output like ``pack``'s: one shard per source shard (same name, the new format's
suffix; a layout's link names keep their dataset prefix), a receipt beside each, and
``dataset.json`` written first (``"writing"``) and finished last, so an interrupted
conversion is refused by readers, and the folder is recognised (and replaceable with
``--overwrite``) later. Each converted shard records its place (``bins``) in its metadata.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from packlab.cloud.discovery import remote_size
from packlab.convert import check_target_format, convert_reader, converted_name
from packlab.errors import PacklabError
from packlab.files import remove
from packlab.layout.blend import LINK_SEPARATOR
from packlab.pipeline.manifest import (
    completed,
    new_manifest,
    read_manifest,
    write_manifest,
    writing_lock,
)
from packlab.pipeline.receipts import finish_receipt, receipt_path
from packlab.progress import progress_bar
from packlab.sources import open_shard
from packlab.sources.resolve import Shard, Source


def convert_source(source: Source, dst: Path, *, format: str, overwrite: bool,
                   **format_options: Any) -> list[dict[str, Any]]:
    """Convert ``source`` into ``dst`` (local: the caller stages remote destinations); one
    summary row per shard, sizes before and after."""
    check_target_format(format, dst)
    source.only_split("convert")
    total = sum(_bins(s) for s in source.shards)
    with progress_bar(total=total or None, desc=f"convert to {format}", unit="bin") as bar:
        if source.kind == "shard":
            return [_convert_one(source.shards[0], dst, format, overwrite, bar, None,
                                 format_options)]
        return _convert_many(source, dst, format, bar, format_options)


def _bins(shard: Shard) -> int:
    return 0 if shard.bins is None else shard.bins[1] - shard.bins[0]


def _convert_one(shard: Shard, dst: Path, format: str, overwrite: bool, bar: Any,
                 bins: tuple[int, int] | None, format_options: dict[str, Any]) -> dict[str, Any]:
    with open_shard(shard.path, format=shard.format) as reader:
        before = remote_size(shard.path) if shard.remote else int(reader.bytes_on_disk())
        row = convert_reader(reader, dst, format=format, before=before, overwrite=overwrite,
                             metadata={"bins": list(bins)} if bins is not None else None,
                             on_bin=lambda: bar.update(1), **format_options)
    row["source"] = str(shard.path)
    return row


def _convert_many(source: Source, dst: Path, format: str, bar: Any,
                  format_options: dict[str, Any]) -> list[dict[str, Any]]:
    """Every shard into ``dst``, with receipts and ``dataset.json`` (see the module doc); what
    ``dst`` held was checked replaceable by the caller (:mod:`packlab.sources.outputs`)."""
    names = [converted_name(Path(s.name.replace("/", LINK_SEPARATOR)), s.format, format)
             for s in source.shards]
    if len(set(names)) != len(names):
        raise PacklabError(f"{source.given}: two shards would convert to the same name in "
                           f"{dst} (name the shards apart, or convert them one by one)")
    counts = []
    for shard in source.shards:
        if shard.bins is not None:
            counts.append(shard.bins[1] - shard.bins[0])
        else:
            with open_shard(shard.path, format=shard.format) as reader:
                counts.append(int(reader.num_bins))
    ranges, at = [], 0
    for n in counts:
        ranges.append((at, at + n))
        at += n
    if not bar.total:
        bar.total = at
    job = {"converted_from": [{"name": s.name, "format": s.format, "sha256": s.sha256}
                              for s in source.shards],
           "format": format, "format_options": format_options}
    with open_shard(source.shards[0].path, format=source.shards[0].format) as first:
        pack_size = int(first.pack_size)
    manifest = new_manifest(format=format, pack_size=pack_size, job=job,
                            shards=list(zip(names, ranges, strict=True)))
    rows, receipts = [], []
    dst.mkdir(parents=True, exist_ok=True)
    with writing_lock(dst):
        old = _old_names(dst)
        write_manifest(dst, manifest)
        for shard, name, place in zip(source.shards, names, ranges, strict=True):
            began = time.perf_counter()
            target = dst / name
            remove(receipt_path(target))
            row = _convert_one(shard, target, format, True, bar, place, format_options)
            receipts.append(finish_receipt(target, format=format, bins=place,
                                           num_tokens=row["num_tokens"],
                                           pack_size=manifest["pack_size"], began=began))
            rows.append(row)
        for stale in old - set(names):  # a larger earlier conversion's leftovers
            remove(dst / stale)
            remove(receipt_path(dst / stale))
        write_manifest(dst, completed(manifest, receipts))  # last: "complete"
    return rows


def _old_names(dst: Path) -> set[str]:
    """Shards an earlier output in ``dst`` listed (to remove those this one does not)."""
    try:
        manifest = read_manifest(dst)
    except PacklabError:
        return set()
    return {s["name"] for s in manifest["shards"]} if manifest else set()
