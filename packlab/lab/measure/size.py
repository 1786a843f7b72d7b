"""Size on disk: all bytes, per token, padding, and against the raw unpadded data and entropy.

Raw unpadded = what the bins hold, with nothing added: 4 bytes per token (int32 ids), 1 byte
per token (the loss mask) and 4 bytes per sequence start. The order-0 entropy of the tokens
(:func:`token_entropy_bits`) is the size a coder that sees each token alone, with a perfect
model, cannot beat (a coder that finds repeats, as zstd's matches do, can go below it on real
text); :func:`byte_plane_entropy_bits` is what byte-wise coding reaches.

- :func:`size_report`: any dataset path (``packlab bench size``), one pass over its bins;
- :func:`format_sizes`: the same bins written in every format (:func:`default_variants`);
- :func:`padding_sweep`: ``memmap_v1``'s bytes against pack efficiency (notebook 06).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packlab.errors import PacklabError
from packlab.formats import files_of_shard, format_names, get_format
from packlab.lab.measure.pagecache import shard_files
from packlab.packing import BinAssignment, pack
from packlab.spool import SpoolReader

RAW_BYTES_PER_TOKEN = 4 + 1
RAW_BYTES_PER_SEQ = 4


def order0_entropy_bits(counts: np.ndarray) -> float:
    """Shannon entropy, in bits per symbol, of a histogram."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum()
    if total == 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log2(p)).sum())


def token_entropy_bits(tokens: np.ndarray) -> float:
    """Order-0 (empirical) entropy of token ids, bits per token."""
    tokens = np.asarray(tokens)
    if tokens.size and int(tokens.min()) < 0:
        raise PacklabError("token ids must be non-negative")
    return order0_entropy_bits(np.bincount(tokens.astype(np.int64, copy=False)))


def byte_plane_entropy_bits(tokens: np.ndarray) -> float:
    """Sum of the order-0 entropies of each byte of the int32 token ids, bits per token.

    What BYTE_STREAM_SPLIT followed by a byte-wise entropy coder (zstd's Huffman literals)
    reaches when it finds no repeats: never below :func:`token_entropy_bits`, equal to it
    when the bytes of an id are independent.
    """
    ids = np.ascontiguousarray(tokens, dtype="<i4")
    if ids.size and int(ids.min()) < 0:
        raise PacklabError("token ids must be non-negative")
    planes = ids.view(np.uint8).reshape(-1, 4)
    return float(sum(order0_entropy_bits(np.bincount(planes[:, k], minlength=256))
                     for k in range(4)))


def _references(readers: Sequence[Any], on_disk: int, raw: int) -> dict[str, Any]:
    """Shards that store no tokens (``packed_index``) need the files they reference: their
    bytes count too (each spool once), or the comparison would flatter them."""
    spools = sorted({str(s) for s in (getattr(r, "spool_path", None) for r in readers) if s})
    if not spools:
        return {}
    referenced = sum(f.stat().st_size for spool in spools for f in shard_files(spool))
    return {"referenced_path": spools[0] if len(spools) == 1 else spools,
            "referenced_bytes": referenced,
            "ratio_to_raw_with_references": (on_disk + referenced) / raw if raw else None}


def _files(shard: Any, single: bool) -> dict[str, int]:
    """Every file of a shard with its size, named relative to the shard (to the dataset when
    there are several); on object storage, every object under it."""
    where = shard.path
    if shard.remote:
        whole = where.is_file()
        sizes = [(f.name, f.size()) for f in files_of_shard(where)] if whole else \
            [(i.path[len(where.path) + 1:], int(i.size)) for i in where.walk_files()]
    else:
        whole = Path(where).is_file()
        sizes = [(Path(f).name if whole else str(f.relative_to(where)), f.stat().st_size)
                 for f in shard_files(where)]
    if single:
        return dict(sizes)
    if whole:  # a file and its companions, beside it in the dataset's folder
        folder = shard.name[:len(shard.name) - len(where.name)]
        return {f"{folder}{name}": size for name, size in sizes}
    return {f"{shard.name}/{name}": size for name, size in sizes}


def size_report(path: str | os.PathLike[str], *, split: str | None = None) -> dict[str, Any]:
    """Bytes on disk (every file), bytes per token, padding waste, ratio to raw and entropy of
    any dataset path (one shard, a directory of shards, a layout's split, ``s3://``...), in one
    pass over its bins."""
    from packlab.sources import open_shard, resolve_source

    source = resolve_source(path, split=split)
    single = source.kind == "shard"
    files: dict[str, int] = {}
    counts = np.zeros(0, dtype=np.int64)
    bins = tokens = seqs = pack_size = 0
    readers = []
    for shard in source.shards:
        files.update(_files(shard, single))
        reader = open_shard(shard.path, format=shard.format)
        readers.append(reader)
        for packed in reader.iter_bins():
            ids = np.asarray(packed.input_ids, dtype=np.int64)
            here = np.bincount(ids)
            if here.shape[0] > counts.shape[0]:
                counts = np.concatenate((counts, np.zeros(here.shape[0] - counts.shape[0],
                                                          np.int64)))
            counts[: here.shape[0]] += here
            bins += 1
            tokens += ids.shape[0]
            seqs += packed.num_seqs
        pack_size = max(pack_size, int(reader.pack_size))
    on_disk = sum(files.values())
    capacity = bins * pack_size
    raw = tokens * RAW_BYTES_PER_TOKEN + seqs * RAW_BYTES_PER_SEQ
    entropy_bits = order0_entropy_bits(counts)
    entropy_bytes = entropy_bits * tokens / 8
    report = {
        "path": str(path),
        "format": "+".join(source.formats),
        "num_shards": len(source.shards),
        "files": files,
        "bytes_on_disk": on_disk,
        "num_bins": bins,
        "num_tokens": tokens,
        "num_seqs": seqs,
        "pack_size": pack_size,
        "bytes_per_token": on_disk / tokens if tokens else None,
        "padding_tokens": capacity - tokens,
        "padding_fraction": (capacity - tokens) / capacity if capacity else None,
        "raw_unpadded_bytes": raw,
        "ratio_to_raw": on_disk / raw if raw else None,
        **_references(readers, on_disk, raw),
        "token_entropy_bits": entropy_bits,
        "token_entropy_bytes": entropy_bytes,
        "ratio_to_token_entropy": on_disk / entropy_bytes if entropy_bytes else None,
    }
    for reader in readers:
        reader.close()
    return report


# -- every format, and padding ------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """A registered format with writer options (``binidx`` with ``dtype="int32"``, ...)."""

    label: str
    format: str
    options: tuple[tuple[str, Any], ...] = ()


_NO_OPTION = object()


def default_variants(vocab_size: int | None = None) -> list[Variant]:
    """Every registered format at its writer's defaults, then the variants its writer's options
    offer: int32 tokens where the default token ``dtype`` (``auto``) picks uint16 for this
    vocabulary (``binidx``), zstd buffers where the default is uncompressed (``arrow_ipc``),
    each other named encoding where the writer has several (``parquet``'s ``ENCODING_NAMES``, the
    default first). The options are read from each writer's signature and attributes, never
    decided by a format's name."""
    names = format_names()
    out = [Variant(name, name) for name in names]
    if vocab_size is not None and vocab_size <= 1 << 16:
        out += [Variant(f"{name} int32", name, (("dtype", "int32"),)) for name in names
                if _writer_default(name, "dtype") == "auto"]
    encodings = {name: getattr(get_format(name).Writer, "ENCODING_NAMES", ()) for name in names}
    out += [Variant(f"{name} zstd", name, (("compression", "zstd"),)) for name in names
            if _writer_default(name, "compression") is None and not encodings[name]]
    out += [Variant(f"{name} {encoding}", name, (("encoding", encoding),)) for name in names
            for encoding in encodings[name][1:]]
    return out


def _writer_default(format: str, option: str) -> Any:
    """The default of keyword ``option`` of a format's writer (a sentinel when it has none)."""
    param = inspect.signature(get_format(format).Writer.__init__).parameters.get(option)
    return _NO_OPTION if param is None else param.default


def format_sizes(spool: SpoolReader, assignment: BinAssignment, out_dir: str | os.PathLike[str],
                 variants: Sequence[Variant], *, bins_per_shard: int | None = None
                 ) -> list[dict[str, Any]]:
    """Write the same bins in each variant (``packlab pack``'s pipeline); all bytes on disk.

    ``padding_fraction`` is the share of the bins' capacity (``num_bins * pack_size``) left
    empty: what a padded format stores for nothing. A format that ``NEEDS_SPOOL``
    (``packed_index``) stores no token (its bytes are the index; it needs the spool beside it):
    ``stores_tokens`` is False.
    """
    from packlab.pipeline.shards import write_shards

    tokens = int(assignment.bin_lengths(spool.lengths).sum())
    seqs = int(assignment.seq_indices.shape[0])
    capacity = assignment.num_bins * assignment.pack_size
    raw = RAW_BYTES_PER_TOKEN * tokens + RAW_BYTES_PER_SEQ * seqs
    per_shard = bins_per_shard or assignment.num_bins
    rows = []
    for i, variant in enumerate(variants):
        receipts = write_shards(spool, assignment, Path(out_dir) / f"v{i:02d}_{variant.format}",
                                format=variant.format, bins_per_shard=per_shard, workers=1,
                                existing="overwrite", **dict(variant.options))
        size = sum(int(r["bytes"]) for r in receipts)
        rows.append({"label": variant.label, "format": variant.format,
                     "options": dict(variant.options), "bytes": size,
                     "bytes_per_token": size / tokens, "ratio_to_raw": size / raw,
                     "num_tokens": tokens, "num_bins": assignment.num_bins,
                     "padding_fraction": 1 - tokens / capacity, "stores_tokens":
                     not get_format(variant.format).Writer.NEEDS_SPOOL})
    return rows


def padding_sweep(spool: SpoolReader, out_dir: str | os.PathLike[str],
                  packings: Sequence[tuple[str, int]], *, seed: int = 0) -> list[dict[str, Any]]:
    """``memmap_v1`` bytes per token against pack efficiency, one packing per (algorithm,
    pack_size). ``predicted_bytes_per_token`` is memmap_v1's arithmetic: 5 B per slot of
    capacity (int32 + uint8, padded) + 4 B per bin (length) + 4 B per bin and per sequence
    (the CSR of starts), over the tokens; headers and record excluded."""
    from packlab.pipeline.shards import write_shards

    rows = []
    for algorithm, pack_size in packings:
        part, report = pack(spool.lengths, pack_size, algorithm=algorithm, seed=seed)
        shard_dir = Path(out_dir) / f"memmap_{algorithm}_{pack_size}"
        receipts = write_shards(spool, part, shard_dir, format="memmap_v1",
                                bins_per_shard=part.num_bins, workers=1, existing="overwrite")
        size = sum(int(r["bytes"]) for r in receipts)
        tokens = int(report.num_tokens)
        bins, seqs = part.num_bins, int(part.seq_indices.shape[0])
        predicted = 5 * bins * pack_size + 4 * bins + 4 * (bins + 1) + 4 * seqs
        rows.append({"algorithm": algorithm, "pack_size": pack_size, "num_bins": bins,
                     "efficiency": tokens / (bins * pack_size), "bytes": size,
                     "bytes_per_token": size / tokens,
                     "predicted_bytes_per_token": predicted / tokens})
    return rows
