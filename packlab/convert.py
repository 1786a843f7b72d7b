"""Convert shards between formats, streaming bin by bin (reader -> writer).

Memory is bounded by the source reader's one bin plus the destination writer's buffer. A shard
converts into a shard; a directory of shards converts into a directory with one output shard
per input (same stem, the new format's suffix). Formats that keep a reference to the spool
instead of tokens (``packed_index``) cannot be produced from bins alone: pack into them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from packlab.bins import bin_digest
from packlab.dataset import PackedDataset
from packlab.discovery import find_shards
from packlab.errors import PacklabError
from packlab.formats import get_format, open_shard, open_writer
from packlab.pipeline.receipts import shard_bytes


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
        manifest = getattr(reader, "manifest", None) or getattr(reader, "packlab", None) or {}
        vocab = (manifest.get("metadata") or {}).get("vocab_size") or manifest.get("vocab_size")
    return int(vocab) if isinstance(vocab, int) else None


def convert_shard(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    format: str,
    source_format: str | None = None,
    overwrite: bool = False,
    **format_options: Any,
) -> dict[str, Any]:
    """Convert one shard; returns a summary with sizes before and after."""
    check_target_format(format, dst)
    reader = open_shard(Path(src), format=source_format)
    try:
        return convert_reader(reader, dst, format=format, overwrite=overwrite,
                              before=reader.bytes_on_disk(), **format_options)
    finally:
        reader.close()


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
        manifest = writer.finalize()
    return {
        "source": str(reader.path),
        "source_format": reader.FORMAT,
        "destination": str(dst),
        "format": format,
        "num_bins": int(manifest.get("num_bins", reader.num_bins)),
        "num_tokens": int(manifest.get("num_tokens", reader.num_tokens)),
        "bytes_before": int(before),
        "bytes_after": shard_bytes(Path(dst)),
        "seconds": time.perf_counter() - began,
    }


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    format: str,
    overwrite: bool = False,
    **format_options: Any,
) -> list[dict[str, Any]]:
    """Convert a shard (to the shard ``dst``) or a directory of shards (into directory ``dst``)."""
    source = Path(src)
    shards = find_shards(source)
    single = len(shards) == 1 and shards[0][0] == source
    if single:
        return [convert_shard(source, dst, format=format, source_format=shards[0][1],
                              overwrite=overwrite, **format_options)]
    out = Path(dst)
    if out.exists() and not out.is_dir():
        raise PacklabError(f"{out}: exists and is not a directory (the source is a directory)")
    targets = [out / converted_name(path, name, format) for path, name in shards]
    if len(set(targets)) != len(targets):
        raise PacklabError(f"{source}: two shards would convert to the same name in {out}")
    if not overwrite:
        for target in targets:
            if target.exists():
                raise PacklabError(f"{target}: already exists (pass --overwrite to replace it)")
    out.mkdir(parents=True, exist_ok=True)
    return [
        convert_shard(path, target, format=format, source_format=name, overwrite=overwrite,
                      **format_options)
        for (path, name), target in zip(shards, targets, strict=True)
    ]


# -- comparing formats (notebook 03, tests) ---------------------------------------------------
def bin_digests(source: Any) -> list[str]:
    """Content hash of every bin, in order, of a shard, a directory of shards or a dataset.

    Hashes ignore storage dtypes (:func:`packlab.bins.bin_digest`), so formats that store
    uint16 or int32 tokens compare equal when their bins do.
    """
    dataset = source if isinstance(source, PackedDataset) else PackedDataset(find_shards(source))
    return [bin_digest(*packed) for reader in dataset.readers() for packed in reader.iter_bins()]

