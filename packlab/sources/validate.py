"""Validate: prove a dataset, a shard or a spool whole, in its place (the one home of
``packlab validate`` and of :func:`validate_path` in Python).

Per shard (:func:`validate_shard`): the reader's ``validate`` (its format's own checks: sizes,
checksums, every invariant of every bin), its receipt, and, where a dataset record lists it,
its bins and checksum there. Per directory without a dataset record: no receipt left without its
shard. Per layout: every split's bins and tokens against ``blend.json``. An output still being
written was refused already by the resolver (:mod:`packlab.sources.resolve`). A spool: its
files against its record's sizes and checksums.

A shard on object storage is downloaded into the verified cache first (directory shards file by
file against their record), then checked exactly as a local one, against the receipt stored
beside it; errors name its URI.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from packlab.cloud.datasets import fetch_spool
from packlab.cloud.transfer import download_shard
from packlab.errors import FormatError, PacklabError, one_line
from packlab.formats import get_format
from packlab.loading.dataset import check_place
from packlab.pipeline.dataset_record import DATASET_RECORD, read_dataset_record
from packlab.pipeline.receipts import (
    RECEIPT_SUFFIX,
    check_receipt,
    parse_receipt,
    shard_checksum,
)
from packlab.progress import progress_bar
from packlab.sources.file_records import describe_file, file_output
from packlab.sources.outputs import spool_at
from packlab.sources.resolve import Shard, Source, resolve_source
from packlab.spool import SPOOL_RECORD
from packlab.storage.files import sha256_file
from packlab.storage.location import Location


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
        # after the shards' own checks (which name a damaged spool's fault): a spool that
        # passes them all may still be another one than the output was packed from
        check_source_identity(directory, source)
    out: dict[str, Any] = {"path": source.given, "kind": source.kind, **totals(rows),
                           "dataset_record": any(s.sha256 is not None for s in source.shards)}
    if source.splits:
        out["splits"] = _split_totals(source, rows)
    return out


def validate_path(path: Any, *, split: str | None = None,
                  cache_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """``packlab validate PATH [--split]``: a spool, or any dataset path or URI, resolved and
    validated. Returns ``kind`` (``spool``, or the dataset's), counts and, for a dataset, one
    row per shard; raises on the first problem, naming it."""
    if split is None and file_output(path, check=False) is not None:
        # a one-file output packlab wrote: its record, its bytes, its contents
        return {**describe_file(path, check=True), "kind": "file"}
    spool = spool_at(str(path)) if split is None else None
    if spool is not None:
        spool.verify()
        return {"path": str(path), "kind": "spool", "num_sequences": spool.num_sequences,
                "num_tokens": spool.num_tokens}
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
    """Bins to validate, for the progress bar: from dataset records, else from the local
    readers' headers (cheap); None (no ETA) for remote shards no dataset record describes."""
    total = 0
    for shard in source.shards:
        if shard.bins is not None:
            total += shard.bins[1] - shard.bins[0]
        elif shard.remote:
            return None
        else:
            try:
                with get_format(shard.format).Reader(shard.path) as reader:
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


def validate_shard(path: Path, format: str, *, bins: tuple[int, int] | None = None,
                   sha256: str | None = None, receipt: dict[str, Any] | None = None,
                   reader_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Prove one shard whole (the reader's ``validate``) and consistent with its receipt (the
    one beside it, or ``receipt``), and, where a dataset record places it, that it holds
    exactly ``bins`` and is the shard whose checksum the dataset record lists (``sha256``).

    Whatever a reader raises on damaged bytes becomes one :class:`FormatError` naming the shard.
    """
    try:
        reader = get_format(format).Reader(path, **(reader_options or {}))
        try:
            if bins is not None:
                check_place(path, reader, bins)
            summary = dict(reader.validate())
            summary.setdefault("num_bins", reader.num_bins)
            summary.setdefault("num_tokens", reader.num_tokens)
            summary["bytes"] = reader.bytes_on_disk()
        finally:
            reader.close()
    except PacklabError:
        raise
    except Exception as exc:  # damaged bytes surface as library errors: name the file, one line
        detail = one_line(exc, 300)
        raise FormatError(f"{path}: unreadable {format} shard ({type(exc).__name__}: {detail})"
                          ) from None
    # a split's link: the receipt is beside the shard it links to
    receipt = check_receipt(path.resolve() if receipt is None and path.is_symlink() else path,
                            receipt)
    if receipt is not None and receipt.get("num_bins") != summary["num_bins"]:
        raise FormatError(f"{path}: {summary['num_bins']} bins, its receipt says "
                          f"{receipt.get('num_bins')}")
    if receipt is not None and bins is not None and receipt.get("bins") not in (None, list(bins)):
        raise FormatError(f"{path}: its receipt puts it at bins {_span(receipt['bins'])}, its "
                          f"place in the dataset is bins {bins[0]}..{bins[1] - 1}")
    if sha256 is not None and shard_checksum(path)[0] != sha256:
        raise FormatError(f"{path}: checksum differs from {DATASET_RECORD}'s (replaced or "
                          "corrupted)")
    summary["path"] = str(path)
    summary["format"] = format
    summary["receipt"] = receipt is not None
    return summary


def check_source_identity(directory: Path, source: Source) -> None:
    """The chain of custody: a folder whose shards read their spool at read time
    (``packed_index``) must find the spool its ``dataset.json`` says it was packed from (the
    SHA-256 of that spool's record), not another one put in its place."""
    record = read_dataset_record(directory)
    spool = ((record or {}).get("job") or {}).get("spool")
    if not isinstance(spool, dict) or not isinstance(spool.get("manifest_sha256"), str):
        return
    for shard in source.shards:
        reader = get_format(shard.format).Reader
        if not reader.NEEDS_SPOOL:
            continue
        relative = reader.spool_reference(Path(shard.path))["relative"]
        found = Path(os.path.normpath(Path(shard.path).absolute() / relative))
        if not (found / SPOOL_RECORD).is_file():
            continue  # the shard's own check names a missing spool
        if sha256_file(found / SPOOL_RECORD) != spool["manifest_sha256"]:
            raise FormatError(f"{found}: not the spool {directory} was packed from (its record "
                              f"differs from the one {DATASET_RECORD} names): the spool was "
                              "replaced; put the original back, or pack this spool again")


def check_orphan_receipts(directory: Path, names: set[str]) -> None:
    """A receipt whose shard is not among ``names`` (the shards found): the shard is gone."""
    for receipt in sorted(directory.glob(f"*{RECEIPT_SUFFIX}")):
        shard = receipt.name[: -len(RECEIPT_SUFFIX)]
        if shard not in names:
            raise FormatError(f"{directory / shard}: missing (its receipt {receipt.name} exists)")


def check_split_counts(where: object, blend: dict[str, Any], split: str,
                       result: dict[str, Any]) -> None:
    """A split's bins and tokens as ``blend.json`` records them."""
    expected = blend.get("splits", {}).get(split, {})
    for key in ("num_bins", "num_tokens"):
        if key in expected and expected[key] != result[key]:
            raise FormatError(f"{where}: {result[key]} {key[4:]}, blend.json says "
                              f"{expected[key]}")


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Shard, bin, token and byte counts over validated shards, the rows kept beside them."""
    return {
        "num_shards": len(rows),
        "num_bins": sum(int(r["num_bins"]) for r in rows),
        "num_tokens": sum(int(r["num_tokens"]) for r in rows),
        "bytes": sum(int(r["bytes"]) for r in rows),
        "shards": rows,
    }


def _span(bins: Any) -> str:
    """A receipt's ``[start, stop]`` in words (``0..4``); anything else as it was written."""
    if isinstance(bins, list) and len(bins) == 2 and all(type(b) is int for b in bins):
        return f"{bins[0]}..{bins[1] - 1}"
    return repr(bins)
