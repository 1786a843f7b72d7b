"""How a Parquet shard's bytes are laid out: codec and level, column encodings, page size.

A :class:`ParquetEncoding` is one recipe for writing the same bins as Parquet, in standard
Parquet encodings only (every reader decodes them: pyarrow, so Hugging Face datasets and
Megatron-Bridge; DuckDB; polars): codec and level, the token column's Arrow type (int32 or
uint16) and encoding (dictionary, PLAIN, BYTE_STREAM_SPLIT, DELTA_BINARY_PACKED), the loss
mask's and sequence starts' encodings, the data page size. Its ``name`` (``zstd-19 plain
starts-delta``) labels it in notebook 06's rows.

The ``parquet`` writer takes one by name (:data:`ENCODINGS`); notebook 06 measures all three on
real chat text (``cl100k_base`` tokens) and synthetic data, and checks the choice:

- ``"compact"`` (the default): zstd level 9, tokens PLAIN (whole ids, so zstd's matches find
  repeated text; a dictionary of ~100k ids hides them), starts DELTA_BINARY_PACKED, the mask
  dictionary-encoded (runs of 0s and 1s: RLE), 16 MiB data pages (a row group's column in one
  page: zstd sees all of it). On real text about 40% smaller than ``"dictionary"``, decoded as
  fast, written about 3x slower (about 10 M tokens per CPU second against 30 M): the smallest
  encoding that reads as fast and writes at least a quarter as fast as the old default;
- ``"smallest"``: the same at zstd level 19: 3-4 points smaller still, written about 80x
  slower than ``"dictionary"`` (0.4 M tokens per CPU second);
- ``"dictionary"``: what Nemotron writes and packlab wrote before: zstd at pyarrow's default
  level (1), dictionary encoding everywhere, 1 MiB pages (:data:`RFC_ENCODING`, the RFC's
  encoding).

Synthetic ids carry no repeats for PLAIN to find: on uniform random ids ``"compact"`` is about
10% larger than ``"dictionary"`` and BYTE_STREAM_SPLIT smaller (notebook 06 shows it); real
tokenized text is what a packer writes.

Two pyarrow traps this module steps around (both fail silently): ``column_encoding`` and
``use_dictionary`` name the *leaf* path of a list column (``input_ids.list.element``); the
top-level name is ignored without a word. And Parquet has no 16-bit physical type: a uint16
column is stored as INT32 with a logical annotation, so uint16 alone saves nothing on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from packlab.errors import PacklabError
from packlab.formats.shared.arrow_lists import COLUMNS

TOKEN_TYPES = {"int32": np.dtype("<i4"), "uint16": np.dtype("<u2")}
TOKEN_ENCODINGS = {"dictionary": None, "plain": "PLAIN", "byte_stream_split": "BYTE_STREAM_SPLIT",
                   "delta": "DELTA_BINARY_PACKED"}
START_ENCODINGS = {"dictionary": None, "plain": "PLAIN", "delta": "DELTA_BINARY_PACKED"}
MASK_ENCODINGS = {"dictionary": None, "plain": "PLAIN"}
CODECS = ("none", "snappy", "lz4", "gzip", "zstd", "brotli")


@dataclass(frozen=True)
class ParquetEncoding:
    """One way of writing bins as Parquet (same schema names, same bins, same reader); the
    defaults are the RFC's encoding (:data:`RFC_ENCODING`)."""

    codec: str = "zstd"
    level: int | None = None
    token_type: str = "int32"
    tokens: str = "dictionary"
    mask: str = "dictionary"
    starts: str = "dictionary"
    row_group_size: int = 1000
    page_size: int | None = None  # data page bytes before compression (None: pyarrow's 1 MiB)

    def __post_init__(self) -> None:
        for value, allowed, what in (
            (self.codec, CODECS, "codec"), (self.token_type, TOKEN_TYPES, "token_type"),
            (self.tokens, TOKEN_ENCODINGS, "tokens encoding"),
            (self.mask, MASK_ENCODINGS, "mask encoding"),
            (self.starts, START_ENCODINGS, "starts encoding"),
        ):
            if value not in allowed:
                raise PacklabError(f"unknown {what} {value!r}; choose from {', '.join(allowed)}")
        if isinstance(self.row_group_size, bool) or int(self.row_group_size) < 1:
            raise PacklabError(f"row_group_size must be positive, got {self.row_group_size!r}")
        if self.page_size is not None and (isinstance(self.page_size, bool)
                                           or int(self.page_size) < 1024):
            raise PacklabError(f"page_size must be at least 1024 bytes, got {self.page_size!r}")

    @property
    def name(self) -> str:
        """Short label: ``zstd-19 bss uint16``; defaults (dictionary, int32) are left out."""
        parts = [self.codec if self.level is None else f"{self.codec}-{self.level}"]
        short = {"dictionary": "dict", "plain": "plain", "byte_stream_split": "bss",
                 "delta": "delta"}
        if self.tokens != "dictionary":
            parts.append(short[self.tokens])
        if self.token_type != "int32":
            parts.append(self.token_type)
        if self.mask != "dictionary":
            parts.append(f"mask-{short[self.mask]}")
        if self.starts != "dictionary":
            parts.append(f"starts-{short[self.starts]}")
        if self.page_size is not None:
            parts.append(f"page-{self.page_size >> 10}K")
        return " ".join(parts)

    def schema(self) -> pa.Schema:
        return pa.schema([
            ("input_ids", pa.list_(pa.from_numpy_dtype(TOKEN_TYPES[self.token_type]))),
            ("loss_mask", pa.list_(pa.uint8())),
            ("seq_start_id", pa.list_(pa.int32())),
        ])

    def writer_options(self) -> dict[str, Any]:
        """``pq.ParquetWriter`` keywords: leaf paths, dictionary only where no encoding is set,
        page checksums."""
        choices = {"input_ids": TOKEN_ENCODINGS[self.tokens], "loss_mask": MASK_ENCODINGS[self.mask],
                   "seq_start_id": START_ENCODINGS[self.starts]}
        leaf = {name: f"{name}.list.element" for name in COLUMNS}
        dictionary = [leaf[n] for n, enc in choices.items() if enc is None]
        encodings = {leaf[n]: enc for n, enc in choices.items() if enc is not None}
        return {"compression": self.codec, "compression_level": self.level,
                "use_dictionary": dictionary, "column_encoding": encodings or None,
                "write_page_checksum": True,
                **({"data_page_size": self.page_size} if self.page_size else {})}


RFC_ENCODING = ParquetEncoding()
_PAGE = 16 << 20
ENCODINGS: dict[str, ParquetEncoding] = {
    "compact": ParquetEncoding(level=9, tokens="plain", starts="delta", page_size=_PAGE),
    "smallest": ParquetEncoding(level=19, tokens="plain", starts="delta", page_size=_PAGE),
    "dictionary": RFC_ENCODING,
}
DEFAULT_ENCODING = "compact"


def encoding_named(encoding: str | ParquetEncoding) -> ParquetEncoding:
    """An encoding by name (:data:`ENCODINGS`) or as given."""
    if isinstance(encoding, ParquetEncoding):
        return encoding
    if encoding not in ENCODINGS:
        raise PacklabError(f"unknown Parquet encoding {encoding!r}; choose from "
                           f"{', '.join(ENCODINGS)} (or pass a ParquetEncoding)")
    return ENCODINGS[encoding]


def normalize_codec(compression: str | None) -> str:
    """A Parquet codec name as :data:`CODECS` spells it (``None`` and ``"uncompressed"`` are
    ``"none"``); anything else is refused, naming the choices."""
    codec = "none" if compression in (None, "uncompressed") else str(compression).lower()
    if codec not in CODECS:
        raise PacklabError(f"unknown Parquet compression {compression!r}; choose from {CODECS}")
    return codec


def with_options(base: ParquetEncoding, *, row_group_size: int, compression: str | None = None,
                 compression_level: int | None = None, use_dictionary: bool | None = None
                 ) -> ParquetEncoding:
    """``base`` with the writer's explicit keywords applied (``use_dictionary=True``: every
    column dictionary-encoded, ``False``: none; a codec given without a level drops the
    encoding's level, which belongs to its codec)."""
    changes: dict[str, Any] = {"row_group_size": int(row_group_size)}
    if compression is not None:
        codec = normalize_codec(compression)
        changes["codec"] = codec
        if codec != base.codec and compression_level is None:
            changes["level"] = None
    if compression_level is not None:
        changes["level"] = compression_level
    if use_dictionary is True:
        changes.update(tokens="dictionary", mask="dictionary", starts="dictionary")
    elif use_dictionary is False:
        changes.update({k: "plain" for k in ("tokens", "mask", "starts")
                        if getattr(base, k) == "dictionary"})
    return replace(base, **changes)
