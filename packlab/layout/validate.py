"""``packlab validate``: prove a shard, a directory of shards or an output layout whole.

Per shard: the reader's ``validate`` (sizes, checksums, every invariant of every bin) and the
shard's receipt, when it has one (:mod:`packlab.pipeline.receipts`). Per directory: every
receipt's shard present. Per layout: every split, and each split's bins and tokens against
``blend.json``. The first problem raises, naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packlab.dataset import check_place
from packlab.errors import FormatError, PacklabError, one_line
from packlab.formats import open_shard
from packlab.pipeline.manifest import MANIFEST_FILE
from packlab.pipeline.receipts import RECEIPT_SUFFIX, check_receipt, shard_checksum


def validate_shard(path: Path, format: str, *, bins: tuple[int, int] | None = None,
                   sha256: str | None = None, receipt: dict[str, Any] | None = None,
                   reader_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Prove one shard whole (the reader's ``validate``) and consistent with its receipt (the
    one beside it, or ``receipt``), and, where a dataset manifest places it, that it holds
    exactly ``bins`` and is the shard whose checksum the manifest recorded (``sha256``).

    Whatever a reader raises on damaged bytes becomes one :class:`FormatError` naming the shard.
    """
    try:
        reader = open_shard(path, format=format, **(reader_options or {}))
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
        raise FormatError(f"{path}: its receipt puts it at bins {receipt['bins']}, its place in "
                          f"the dataset is {list(bins)}")
    if sha256 is not None and shard_checksum(path)[0] != sha256:
        raise FormatError(f"{path}: checksum differs from {MANIFEST_FILE}'s (replaced or "
                          "corrupted)")
    summary["path"] = str(path)
    summary["format"] = format
    summary["receipt"] = receipt is not None
    return summary


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
