"""The receipt beside every shard the pipeline writes: what it holds and how to recognise it.

A shard is published atomically by its writer; its receipt (``shard_000000<suffix>.receipt.json``)
is written after, so a receipt always vouches for a complete shard::

    {"shard": "shard_000000.parquet", "format": "parquet", "bins": [0, 4096],
     "num_bins": 4096, "num_tokens": 16512331, "pack_size": 4096, "bytes": 21033100,
     "sha256": "...", "sha256_of": "shard_000000.parquet"}

What it holds is decided by the job alone, never by when or how fast it ran: the same job
writes the same receipt, byte for byte, whether run once, interrupted and finished, or run by
other workers.

``sha256`` covers a one-file shard whole (or, for one with a record among its companions,
that record: packlab's sidecar beside a Megatron pair lists both files' checksums), or a
directory shard's record (which lists every file's own checksum). A rerun keeps a shard whose receipt still vouches for it
(:func:`reusable_receipt`); ``packlab validate`` checks every receipt (:func:`check_receipt`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from packlab.errors import FormatError, PacklabError
from packlab.formats import get_format, record_companion, shard_size
from packlab.storage.files import DIRECTORY_RECORD, parse_json, sha256_file, staged
from packlab.storage.location import Location, as_location

RECEIPT_SUFFIX = ".receipt.json"
VERIFY_MODES = ("receipt", "full")


def receipt_path(shard: Any) -> Any:
    return shard.parent / f"{shard.name}{RECEIPT_SUFFIX}"


def shard_bytes(path: Path | Location) -> int:
    """All bytes of a shard: a file's (and its companions'), or every file's of a directory."""
    return shard_size(path)


def shard_checksum(path: Path) -> tuple[str, str]:
    """SHA-256 of a file shard (of its record, when a companion holds one), or of a directory
    shard's record (which lists every file's)."""
    if path.is_file():
        record = record_companion(as_location(path))
        if record is not None:
            return sha256_file(Path(record.path)), record.name
        return sha256_file(path), path.name
    if (path / DIRECTORY_RECORD).is_file():
        return sha256_file(path / DIRECTORY_RECORD), f"{path.name}/{DIRECTORY_RECORD}"
    raise PacklabError(f"{path}: directory shard without a {DIRECTORY_RECORD} to checksum")


def write_receipt(shard: Path, receipt: dict[str, Any]) -> Path:
    """Write ``<shard>.receipt.json`` atomically (after the shard itself is published)."""
    final = receipt_path(shard)
    with staged(final, overwrite=True) as tmp:
        tmp.write_text(json.dumps(receipt, indent=2) + "\n")
    return final


def finish_receipt(shard: Path, *, format: str, bins: tuple[int, int], num_tokens: int,
                   pack_size: int) -> dict[str, Any]:
    """The receipt of a shard just published (bins ``[start, stop)`` of its dataset), written
    beside it; every job that writes a shard (pack, convert) records the same fields."""
    digest, digest_of = shard_checksum(shard)
    receipt = {
        "shard": shard.name,
        "format": format,
        "bins": [bins[0], bins[1]],
        "num_bins": bins[1] - bins[0],
        "num_tokens": num_tokens,
        "pack_size": pack_size,
        "bytes": shard_bytes(shard),
        "sha256": digest,
        "sha256_of": digest_of,
    }
    write_receipt(shard, receipt)
    return receipt


def parse_receipt(raw: bytes, where: object) -> dict[str, Any]:
    """A receipt read from anywhere (a file beside its shard, an object beside a remote one)."""
    receipt = parse_json(raw, where, unreadable="unreadable receipt")
    if not isinstance(receipt, dict):
        raise FormatError(f"{where}: unreadable receipt: not a JSON object")
    return receipt


def placed_receipt(shard: Path, receipt: dict[str, Any], where: object) -> dict[str, Any]:
    """``receipt`` checked for what places ``shard``: it names this very shard, and its
    ``bins`` (when it has them) are a ``[start, stop)`` pair."""
    if receipt.get("shard") != shard.name:
        raise FormatError(f"{shard}: its receipt is {receipt.get('shard')!r:.80}'s (shards or "
                          "receipts swapped, or a shard copied over another)")
    bins = receipt.get("bins")
    if bins is not None and not (isinstance(bins, list) and len(bins) == 2 and all(
            type(b) is int and b >= 0 for b in bins) and bins[0] < bins[1]):
        raise FormatError(f"{where}: bins {bins!r:.80} is not a [start, stop) pair (damaged "
                          "receipt)")
    return receipt


def read_receipt(shard: Path | Location) -> dict[str, Any] | None:
    """The receipt beside ``shard`` (a local path, or an object on object storage; None
    without one), checked for what places the shard (:func:`placed_receipt`). Cheap: no
    hash."""
    where = as_location(receipt_path(shard))
    if not where.is_file():
        return None
    return placed_receipt(shard, parse_receipt(where.read_bytes(), where), where)


def receipt_places(shards: list[Path]) -> dict[Path, tuple[int, int]]:
    """Where the receipts of a directory's shards (in name order) put them: ``bins`` per
    shard with a receipt. The places must follow one another: a gap is a missing shard, an
    overlap a duplicated one (how an output written before dataset records is checked)."""
    places: dict[Path, tuple[int, int]] = {}
    previous: tuple[Path, int] | None = None
    for shard in shards:
        receipt = read_receipt(shard)
        bins = None if receipt is None else receipt.get("bins")
        if bins is None:
            previous = None
            continue
        if previous is not None and bins[0] != previous[1]:
            what = "missing" if bins[0] > previous[1] else "also in another shard"
            raise FormatError(f"{shard}: its receipt puts it at bins {bins[0]}..{bins[1] - 1}, "
                              f"{previous[0].name} ends at {previous[1]}: bins "
                              f"{min(previous[1], bins[0])}..{max(previous[1], bins[0]) - 1} "
                              f"are {what}")
        places[shard] = (bins[0], bins[1])
        previous = (shard, bins[1])
    return places


def check_receipt(shard: Path, receipt: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Compare a shard with its receipt (``receipt``, found by the caller beside a remote
    shard; or the one beside it, which must name it and place it: :func:`read_receipt`, if it
    has one): bytes and checksum."""
    if receipt is None:
        receipt = read_receipt(shard)
        if receipt is None:
            return None
    size = shard_bytes(shard)
    if size != receipt.get("bytes"):
        raise FormatError(f"{shard}: {size} bytes, its receipt says {receipt.get('bytes')} "
                          "(truncated or replaced?)")
    digest, _ = shard_checksum(shard)
    if digest != receipt.get("sha256"):
        raise FormatError(f"{shard}: checksum differs from its receipt (corrupted)")
    return receipt


def reusable_receipt(shard: Path, *, format: str, bins: tuple[int, int], pack_size: int,
                     verify: str = "receipt") -> dict[str, Any] | None:
    """The receipt of a shard that can be kept as it is, or None (missing, damaged, no receipt,
    or written for other bins / another format / another pack size).

    ``verify="receipt"`` trusts size + SHA-256 against the receipt (a directory shard's checksum
    covers its record, which lists every file's); ``"full"`` also runs the reader's
    ``validate`` (every file checksum and every bin's invariants).
    """
    if verify not in VERIFY_MODES:
        raise PacklabError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
    if not shard.exists():
        return None
    try:
        receipt = check_receipt(shard)
        if receipt is None:
            return None
        if (receipt.get("format") != format or receipt.get("bins") != [int(b) for b in bins]
                or receipt.get("pack_size") != pack_size):
            return None
        if verify == "full":
            with get_format(format).Reader(shard) as reader:
                reader.validate()
    except Exception:  # noqa: BLE001 - whatever a damaged shard raises, it is written again
        return None
    return receipt
