"""Convert: any dataset into another format, bin by bin (the one home of ``packlab convert``
and of :func:`convert` in Python).

Memory is bounded by the source reader's one bin plus the destination writer's buffer.

A source that is one shard converts into one shard. Anything else (a directory of shards, a
layout's split, a glob, a run folder; local or remote) converts into a folder that is a
packlab output like ``pack``'s: one shard per source shard (same name, the new format's
suffix; a layout's link names keep their dataset prefix), a receipt beside each, and
``dataset.json`` written first (``"writing"``) and finished last, so an interrupted
conversion is refused by readers, and the folder is recognised (and replaceable with
``--overwrite``) later. Each converted shard records its place (``bins``) in its metadata.

**Chain of custody.** Every source bin is checked as it is read: against its per-bin checksum
where the source format records one (``verify=True``; Parquet's page CRCs), so a corrupted
source is refused naming its file and bin, never laundered into fresh checksums. The output's
``dataset.json`` records its source (each shard's name, format and checksum, and the source
dataset record's SHA-256) and ``validate`` checks the shards against it.

**Resumed.** Interrupted, the same command finishes the job: ``dataset.json`` names the job (the
source's identity, the format and its options); shards whose receipts vouch for them are kept,
the rest written. Another job's output in DST is refused unless ``--overwrite``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from packlab.errors import PacklabError
from packlab.formats import delete_shard, format_names, get_format, shard_size
from packlab.pipeline.dataset_record import (
    DATASET_RECORD,
    completed,
    new_dataset_record,
    read_dataset_record,
    write_dataset_record,
    writing_lock,
)
from packlab.pipeline.layout.blend import LINK_SEPARATOR
from packlab.pipeline.receipts import (
    finish_receipt,
    receipt_path,
    reusable_receipt,
    shard_bytes,
)
from packlab.pipeline.shards import sweep_own_temporaries
from packlab.progress import progress_bar
from packlab.sources import open_shard, open_writer
from packlab.sources.outputs import output
from packlab.sources.resolve import Shard, Source, resolve_source
from packlab.storage.files import remove, sha256_file


def convert(src: Any, dst: str, *, format: str, split: str | None = None,
            overwrite: bool = False, **format_options: Any) -> list[dict[str, Any]]:
    """Convert the dataset ``src`` (any dataset path or URI, or a list: one shard converts into
    the shard ``dst``, anything else into the folder ``dst``; a URI is written locally and
    uploaded) into ``format``; ``overwrite`` replaces only packlab's own output of that kind.
    One row per shard: source, destination (as named), sizes before and after."""
    check_target_format(format, dst)  # unknown or impossible: before any work
    source = resolve_source(src, split=split).only_split("convert")
    if str(dst).rstrip("/") == source.given.rstrip("/"):
        raise PacklabError(f"{dst}: DST is SRC (convert writes a new output)")
    kind = "shard" if source.kind == "shard" else "dataset"
    if kind == "dataset":
        _refuse_a_shards_name(dst, source)
    with output(str(dst), kind=kind, overwrite=overwrite, format=format,
                resume=kind == "dataset") as local:
        rows = convert_source(source, local, format=format, overwrite=overwrite,
                              **format_options)
    for row in rows:
        row["destination"] = _named(row["destination"], str(local), str(dst))
    return rows


def _refuse_a_shards_name(dst: str, source: Source) -> None:
    """A folder of shards is not written under a one-file shard's name (``x.parquet``,
    ``x.sft.idx``, or ``x.sft``, the prefix a pair's index is named by): whoever reads
    ``x.parquet`` expects one file."""
    files = [s for s in (get_format(n).Writer.SUFFIX for n in format_names()) if s]
    suffixes = [*files, *(s.removesuffix(".idx") for s in files if s.endswith(".sft.idx"))]
    named = next((s for s in suffixes if str(dst).rstrip("/").endswith(s)), None)
    if named is not None:
        count = len(source.shards)
        raise PacklabError(f"{dst}: a shard's name ({named}), but {source.given} is a "
                           f"{source.kind} of {count} shard{'s' if count != 1 else ''}: name a "
                           "folder for its shards, or convert one shard into a file")


def _named(path: str, local: str, given: str) -> str:
    """A staged path as the destination the user named (its URI)."""
    return given + path[len(local):] if path.startswith(local) else path


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
        return _convert_many(source, dst, format, bar, format_options, overwrite)


def _bins(shard: Shard) -> int:
    return 0 if shard.bins is None else shard.bins[1] - shard.bins[0]


def open_verified(shard: Shard) -> Any:
    """A reader of ``shard`` that checks every bin it serves against the shard's per-bin
    checksums, where the format records them (a format without leaves its invariants, which
    every reader checks, as the check)."""
    reader = open_shard(shard.path, format=shard.format)
    if not getattr(reader, "has_checksums", False) or getattr(reader, "verify", True):
        return reader
    reader.close()
    return open_shard(shard.path, format=shard.format, verify=True)


def _convert_one(shard: Shard, dst: Path, format: str, overwrite: bool, bar: Any,
                 bins: tuple[int, int] | None, format_options: dict[str, Any]) -> dict[str, Any]:
    with open_verified(shard) as reader:
        before = shard_size(shard.path)
        row = convert_reader(reader, dst, format=format, before=before, overwrite=overwrite,
                             metadata={"bins": list(bins)} if bins is not None else None,
                             on_bin=lambda: bar.update(1), **format_options)
    row["source"] = str(shard.path)
    return row


def _convert_many(source: Source, dst: Path, format: str, bar: Any,
                  format_options: dict[str, Any], overwrite: bool = False) -> list[dict[str, Any]]:
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
           "source_record_sha256": source_record_sha256(source),
           "format": format, "format_options": format_options}
    with open_shard(source.shards[0].path, format=source.shards[0].format) as first:
        pack_size = int(first.pack_size)
    record = new_dataset_record(format=format, pack_size=pack_size, job=job,
                                shards=list(zip(names, ranges, strict=True)),
                                command="convert")
    rows, receipts = [], []
    dst.mkdir(parents=True, exist_ok=True)
    with writing_lock(dst):
        sweep_own_temporaries(dst)  # a killed run's: nobody else writes here now
        before = _record_before(dst)
        same_job = before is not None and before.get("job_hash") == record["job_hash"]
        if before is not None and not same_job and not overwrite:
            raise PacklabError(f"{dst}: already holds another output ({DATASET_RECORD}); pass "
                               "overwrite=True to replace it")
        old = {s["name"] for s in before["shards"]} if before else set()
        write_dataset_record(dst, record)
        for shard, name, place in zip(source.shards, names, ranges, strict=True):
            target = dst / name
            kept = reusable_receipt(target, format=format, bins=place,
                                    pack_size=record["pack_size"]) if same_job else None
            if kept is not None:  # the same job, interrupted: this shard is done
                bar.update(place[1] - place[0])
                receipts.append(kept)
                rows.append(_kept_row(shard, target, format, kept))
                continue
            remove(receipt_path(target))
            row = _convert_one(shard, target, format, True, bar, place, format_options)
            receipts.append(finish_receipt(target, format=format, bins=place,
                                           num_tokens=row["num_tokens"],
                                           pack_size=record["pack_size"]))
            rows.append(row)
        for stale in old - set(names):  # a larger earlier conversion's leftovers
            delete_shard(dst / stale)
            remove(receipt_path(dst / stale))
        write_dataset_record(dst, completed(record, receipts))  # last: "complete"
    return rows


def _record_before(dst: Path) -> dict[str, Any] | None:
    """The dataset record an earlier job left in ``dst`` (a damaged one counts as none: the
    caller checked the folder is packlab's to replace)."""
    try:
        return read_dataset_record(dst)
    except PacklabError:
        return None


def _kept_row(shard: Shard, target: Path, format: str, receipt: dict[str, Any]) -> dict[str, Any]:
    """The summary row of a shard an interrupted run of the same job had finished."""
    return {"source": str(shard.path), "source_format": shard.format,
            "destination": str(target), "format": format,
            "num_bins": int(receipt["num_bins"]), "num_tokens": int(receipt["num_tokens"]),
            "bytes_before": int(shard_size(shard.path)),
            "bytes_after": int(receipt["bytes"]), "seconds": 0.0}


def source_record_sha256(source: Source) -> str | None:
    """The SHA-256 of the source's dataset record, when the source is one local dataset
    folder that has one: the source's identity, as ``dataset.json`` records it."""
    if source.remote or source.kind != "directory":
        return None
    record = Path(source.given) / DATASET_RECORD
    return sha256_file(record) if record.is_file() else None


def converted_name(source: Path, source_format: str, target_format: str) -> str:
    """``shard_000000.parquet`` (parquet) -> ``shard_000000.arrow`` (arrow_ipc), say."""
    name = source.name
    old = get_format(source_format).Writer.SUFFIX
    if old and name.endswith(old):
        name = name[: -len(old)]
    return name + get_format(target_format).Writer.SUFFIX


def source_vocab_size(reader: Any) -> int | None:
    """The vocabulary size a reader knows (lets a target pick a narrower token dtype)."""
    vocab = getattr(reader, "vocab_size", None)
    if vocab is None:
        record = getattr(reader, "record", None) or getattr(reader, "packlab", None) or {}
        vocab = (record.get("metadata") or {}).get("vocab_size") or record.get("vocab_size")
    return int(vocab) if isinstance(vocab, int) else None


def check_target_format(format: str, dst: object) -> None:
    """Refuse a target format that cannot be produced from bins alone."""
    if get_format(format).Writer.NEEDS_SPOOL:
        raise PacklabError(f"{dst}: format {format!r} stores a reference to the spool, not "
                           "tokens; it cannot be converted into (use `packlab pack` instead)")


def convert_reader(
    reader: Any,
    dst: str | os.PathLike[str],
    *,
    format: str,
    before: int,
    overwrite: bool = False,
    metadata: dict[str, Any] | None = None,
    on_bin: Any = None,
    **format_options: Any,
) -> dict[str, Any]:
    """Stream every bin of an open shard ``reader`` (local or remote) into a new shard at
    ``dst``; ``before`` is the source's size in bytes, ``metadata`` more to record (the
    shard's place in a converted dataset), ``on_bin()`` is called after each bin."""
    check_target_format(format, dst)
    began = time.perf_counter()
    recorded = {"converted_from": {"path": str(reader.path), "format": reader.FORMAT},
                "vocab_size": source_vocab_size(reader), **(metadata or {})}
    with open_writer(format, dst, pack_size=reader.pack_size, num_bins=reader.num_bins,
                     overwrite=overwrite, metadata=recorded, **format_options) as writer:
        for packed in reader.iter_bins():
            writer.write(packed)
            if on_bin is not None:
                on_bin()
        record = writer.finalize()
    written = writer.path  # where the writer put it (a pair named by its prefix: its .idx)
    return {
        "source": str(reader.path),
        "source_format": reader.FORMAT,
        "destination": str(written),
        "format": format,
        "num_bins": int(record.get("num_bins", reader.num_bins)),
        "num_tokens": int(record.get("num_tokens", reader.num_tokens)),
        "bytes_before": int(before),
        "bytes_after": shard_bytes(Path(written)),
        "seconds": time.perf_counter() - began,
    }
