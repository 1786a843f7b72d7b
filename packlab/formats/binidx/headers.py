"""The headers of a ``binidx`` shard's files (:mod:`packlab.formats.binidx` describes the
shard): packlab's three sidecar headers (version 1, or 2 ending with the shard's identity).
``data.idx`` is megatron-core's MMIDIDX index, whose one home is :mod:`packlab.codecs.mmidx`;
it and ``data.bin`` have no room for an identity of their own: the record records their
fingerprints (:mod:`packlab.formats.shared.fingerprints`)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from packlab.errors import FormatError
from packlab.formats.shared.base import head
from packlab.storage.location import Location


class Sidecar:
    """A packlab sidecar's header: version 1 (``STRUCT``) or version 2, the same fields then
    the shard's identity (8 bytes)."""

    MAGIC: bytes
    STRUCT: struct.Struct
    VERSION = 2

    @classmethod
    def struct_of(cls, version: int) -> struct.Struct:
        return cls.STRUCT if version == 1 else struct.Struct(cls.STRUCT.format + "8s")

    @classmethod
    def size(cls, version: int = 2) -> int:
        return cls.struct_of(version).size


class LossHeader(Sidecar):
    """``loss_mask.bin`` header: 40 bytes (32 in version 1), then uint8 per token."""

    MAGIC = b"PLKLOSS\x00"
    STRUCT = struct.Struct("<8sQQQ")  # magic, version, num_bins, num_tokens (v2: identity)


class SeqHeader(Sidecar):
    """``seq_starts.bin`` header: 56 bytes (48 in version 1), then int64 offsets[num_bins + 1],
    int32 starts."""

    MAGIC = b"PLKSEQS\x00"
    STRUCT = struct.Struct("<8sQQQQB7x")  # magic, version, num_bins, num_starts, pack_size, code


class SumsHeader(Sidecar):
    """``checksums.bin`` header: 40 bytes (32 in version 1), then uint64 per bin."""

    MAGIC = b"PLKSUMS\x00"
    STRUCT = struct.Struct("<8sQQ8s")  # magic, version, num_bins, algorithm (v2: identity)


class VersionPrefix:
    """What every sidecar header starts with: its magic and version."""

    STRUCT = struct.Struct("<8sQ")


def unpack(file: Path | Location, header: Any, fields: struct.Struct | None = None
           ) -> tuple[Any, ...]:
    """The header fields of ``file`` (``fields``, or the header's ``STRUCT``); a FormatError
    when the file is missing or too short."""
    fields = fields or header.STRUCT
    return unpack_raw(head(file, fields.size), fields, file)


def unpack_raw(raw: bytes, fields: struct.Struct, file: object) -> tuple[Any, ...]:
    """The fields ``fields`` packs, from the first bytes of ``file`` read as ``raw``; a FormatError
    naming it when they are too few (truncated)."""
    if len(raw) < fields.size:
        raise FormatError(f"{file}: {len(raw)} bytes, shorter than its {fields.size}-byte header "
                          "(truncated)")
    return fields.unpack(raw[:fields.size])
