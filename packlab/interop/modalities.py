"""packlab's counterparts of Modalities' two data commands.

- ``modalities data create_raw_index SRC`` -> :func:`write_raw_index` (``packlab raw-index``):
  the line index of a JSONL file in Modalities' own format, a pickled list of ``(byte_offset,
  byte_length)`` per record, written where Modalities looks for it (``SRC`` with its suffix
  replaced by ``.idx``), so ``LargeFileLinesReader`` and ``pack_encoded_data`` use it. Built
  streaming (memory: one buffer of entries), every line parsed once (a bad one is named by
  its line number), published atomically. For a file with ``\\n`` endings, no blank line and no
  byte-order mark the entries equal Modalities' ``IndexGenerator``'s; otherwise packlab's
  leave out the ``\\r`` and the BOM and skip blank lines (Modalities refuses a blank line).
- ``modalities data pack_encoded_data CONFIG`` -> :func:`encode_jsonl_pbin` (``packlab
  pbin``): a Modalities packed data file from a JSONL of documents: each record's text field
  (``text``; a dotted path for nested keys, Modalities' ``jq_pattern`` ``.text``) tokenized
  with an offline BPE encoding, the end-of-document token appended unless the document
  already ends with it, records whose text encodes to nothing skipped (Modalities skips them
  too); the token width from the vocabulary (1, 2 or 4 bytes, Modalities' rule). From a spool,
  :func:`packlab.formats.pbin.codec.write_pbin` (one document per sequence, no EOD added).

Modalities reads both with its own code (``tests/test_modalities.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from packlab.codecs.jsonl_index import iter_jsonl_lines, parse_json_line
from packlab.errors import PacklabError
from packlab.formats.pbin.codec import (
    TOKEN_DTYPES,
    IndexWriter,
    check_width,
    finish_output,
    open_output,
)
from packlab.storage.files import HashedFile, json_kind, refuse_existing, require_file, staged
from packlab.tokenize import ChatTokenizer

INDEX_SUFFIX = ".idx"
# "<|endoftext|>" in each encoding packlab's tokenizer ships (its id there; a test decodes it)
END_OF_TEXT = {"cl100k_base": 100_257, "o200k_base": 199_999}
_FLUSH = 1 << 16  # entries (or documents) per write


def raw_index_path(jsonl: str | os.PathLike[str]) -> Path:
    """Where Modalities looks for the index of ``jsonl``: its suffix replaced by ``.idx``."""
    jsonl = Path(jsonl)
    return jsonl.with_name(jsonl.stem + INDEX_SUFFIX)


def _chunks(jsonl: Path, validate: bool) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(offsets, lengths)`` of the records, a buffer at a time."""
    offsets = np.empty(_FLUSH, dtype=np.int64)
    lengths = np.empty(_FLUSH, dtype=np.int64)
    filled = 0
    for line, offset, raw in iter_jsonl_lines(jsonl):
        if validate:
            parse_json_line(jsonl, line, raw)
        offsets[filled], lengths[filled] = offset, len(raw)
        filled += 1
        if filled == _FLUSH:
            yield offsets.copy(), lengths.copy()
            filled = 0
    yield offsets[:filled], lengths[:filled]


def write_raw_index(jsonl: str | os.PathLike[str], index: str | os.PathLike[str] | None = None,
                    *, overwrite: bool = False, validate: bool = True) -> dict[str, Any]:
    """Modalities' raw index of ``jsonl`` (see the module doc); returns what it wrote."""
    source = Path(jsonl)
    require_file(source, "a JSONL file")
    final = Path(index) if index is not None else raw_index_path(source)
    if final.resolve() == source.resolve():
        raise PacklabError(f"{final}: the index would replace its own JSONL")
    refuse_existing(final, overwrite=overwrite)
    final.parent.mkdir(parents=True, exist_ok=True)
    before = source.stat()
    count = 0
    with staged(final, overwrite=overwrite) as tmp, HashedFile(tmp) as out:
        writer = IndexWriter(out, 1)
        for offsets, lengths in _chunks(source, validate):
            writer.add_entries(offsets, lengths)
            count += int(offsets.shape[0])
        writer.close()
        out.close()
        after = source.stat()
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise PacklabError(f"{source}: changed while it was being indexed")
    return {"path": str(final), "source": str(source), "records": count,
            "source_bytes": before.st_size, "bytes": final.stat().st_size}


def _text_of(record: dict[str, Any], field: str, where: str) -> str:
    """``record[field]`` (``a.b`` for nested keys; a leading ``.`` as in a jq pattern)."""
    value: Any = record
    for key in field.lstrip(".").split("."):
        if not isinstance(value, dict) or key not in value:
            raise PacklabError(f"{where}: no {field!r} in the record")
        value = value[key]
    if not isinstance(value, str):
        raise PacklabError(f"{where}: {field!r} is {json_kind(value)}, not text")
    return value


def encode_jsonl_pbin(
    jsonl: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    encoding: str = "cl100k_base",
    field: str = "text",
    eod_id: int | None = None,
    token_width: int | str | None = "auto",
    overwrite: bool = False,
) -> dict[str, Any]:
    """A Modalities pbin of the documents of ``jsonl`` (see the module doc); returns what it
    wrote. Memory: one buffer of tokens plus 8 bytes per document (the index comes last)."""
    source, final = Path(jsonl), Path(path)
    require_file(source, "a JSONL file")
    refuse_existing(final, overwrite=overwrite)
    tokenizer = ChatTokenizer(encoding)
    eod = END_OF_TEXT[encoding] if eod_id is None else int(eod_id)
    width = check_width(token_width, tokenizer.vocab_size, str(final))
    dtype = TOKEN_DTYPES[width]
    if not 0 <= eod <= np.iinfo(dtype).max:
        raise PacklabError(f"{final}: end-of-document id {eod} does not fit {width}-byte tokens")
    lengths: list[np.ndarray] = []
    pending: list[int] = []
    tokens = skipped = 0
    final.parent.mkdir(parents=True, exist_ok=True)
    with staged(final, overwrite=overwrite) as tmp, open_output(tmp) as out:
        for line, _, raw in iter_jsonl_lines(source):
            where = f"{source}: line {line}"
            ids = tokenizer.encode_text(_text_of(parse_json_line(source, line, raw), field,
                                                 where))
            if ids.size == 0:
                skipped += 1
                continue
            if int(ids.max()) > np.iinfo(dtype).max:
                raise PacklabError(f"{where}: token {int(ids.max())} does not fit {width}-byte "
                                   "tokens")
            if int(ids[-1]) != eod:
                ids = np.append(ids, eod)
            out.write(ids.astype(dtype))
            pending.append(int(ids.shape[0]))
            tokens += int(ids.shape[0])
            if len(pending) == _FLUSH:
                lengths.append(np.array(pending, dtype=np.int64))
                pending = []
        lengths.append(np.array(pending, dtype=np.int64))
        index = IndexWriter(out, width)
        for chunk in lengths:
            index.add(chunk)
        index.close()
        finish_output(out, tokens * width, width)
    documents = sum(int(c.shape[0]) for c in lengths)
    return {"path": str(final), "source": str(source), "documents": documents,
            "skipped_empty": skipped, "num_tokens": tokens, "token_width": width,
            "eod_id": eod, "encoding": encoding, "bytes": final.stat().st_size}
