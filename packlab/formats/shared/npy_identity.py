"""The ``.npy`` files of a shard, and the shard's identity in their headers.

A ``.npy`` header is a Python dictionary literal padded with spaces to an alignment boundary.
packlab writes the shard's identity (16 hex digits, the record's ``identity``) as a comment
after the dictionary, inside that padding::

    {'descr': '<i4', 'fortran_order': False, 'shape': (50, 512), } # packlab shard 7d6a674b59d7c9d7

``np.load`` (and every reader that parses the dictionary as a Python literal, as numpy does)
reads the file unchanged; a reader of the shard checks the identity where it reads the header
anyway (:func:`check_identity`), so a file exchanged with another shard's is refused before a
bin is served. Files written before identities carry none (their record records none).
"""

from __future__ import annotations

import io
import re
import struct
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from packlab.errors import FormatError

IDENTITY_MARK = b" # packlab shard "
_IDENTITY = re.compile(re.escape(IDENTITY_MARK) + rb"([0-9a-f]{16})")


def npy_header(dtype: np.dtype, shape: tuple[int, ...], identity: str | None = None) -> bytes:
    """The ``.npy`` v1.0 header for an array; its length does not depend on the first axis.

    With ``identity`` (16 hex digits) the header carries the shard's identity as a comment
    after the dictionary, in the padding the format reserves (``np.load`` and every reader that
    parses the dictionary as a Python literal read it unchanged): so each file knows its shard,
    and a file exchanged with another shard's is refused when its header is read."""
    buffer = io.BytesIO()
    npy_format.write_array_header_1_0(
        buffer, {"descr": npy_format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape})
    header = buffer.getvalue()
    if identity is None:
        return header
    text = header[10:].rstrip(b" \n") + IDENTITY_MARK + identity.encode()
    room = len(header) - 10 - 1
    if len(text) > room:  # one more alignment step of padding (never needed below 10**21 rows)
        room += 64
    body = text + b" " * (room - len(text)) + b"\n"
    return header[:8] + struct.pack("<H", len(body)) + body


def header_identity(raw: bytes) -> str | None:
    """The shard identity a header carries (:func:`npy_header`), or None."""
    found = _IDENTITY.search(raw)
    return found.group(1).decode() if found else None


def check_identity(file: Path, header: bytes, expected: object) -> None:
    """``file``'s header (its raw bytes) names the shard ``expected`` (the record's identity;
    nothing to check when it records none): else one FormatError, the files exchanged."""
    if not isinstance(expected, str):
        return
    found = header_identity(header)
    if found != expected:
        raise FormatError(f"{file}: belongs to another shard (its header names shard {found}, "
                          f"this shard is {expected}): files exchanged between shards; refused")
