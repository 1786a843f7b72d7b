"""One packed bin, the unit every format stores and returns (docs/design.md, "One packed
bin").

- ``input_ids``: concatenated tokens, length ``packed_len``, ``0 < packed_len <= pack_size``;
- ``loss_mask``: uint8 0/1, same length, aligned for next-token prediction within each
  sub-sequence (the last position of every sub-sequence is 0);
- ``seq_start_id``: start offsets ``[0, s1, ...]``, strictly increasing, last ``< packed_len``.

What ``pack_size`` counts differs between projects (:data:`CONVENTIONS`): packlab and Nemotron
count the tokens a bin stores; Megatron-Bridge counts the next-token positions it trains on,
``L - 1`` for a sub-sequence of ``L`` tokens (its packer bins ``len(input_ids) - 1``), so its
bins store up to ``pack_size + num_seqs`` tokens. Readers of files without a manifest take
``convention=`` to check bins under the convention their writer used.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import numpy as np
from xxhash import xxh3_64_intdigest

from packlab.errors import FormatError, PacklabError

CONVENTIONS = {
    "packlab": "pack_size counts stored tokens: packed_len <= pack_size (also Nemotron's)",
    "megatron_bridge": "pack_size counts next-token positions: packed_len - num_seqs <= "
                       "pack_size (Megatron-Bridge's packer)",
}


def check_convention(convention: str) -> str:
    """``convention`` if it is one of :data:`CONVENTIONS`, else a PacklabError listing them."""
    if convention not in CONVENTIONS:
        raise PacklabError(f"unknown pack-size convention {convention!r}: "
                           f"{', '.join(CONVENTIONS)}")
    return convention


def budget_used(packed_len: np.ndarray | int, num_seqs: np.ndarray | int, convention: str
                ) -> np.ndarray | int:
    """What a bin spends of its ``pack_size`` under ``convention`` (elementwise for arrays)."""
    return packed_len - num_seqs if convention == "megatron_bridge" else packed_len


class PackedBin(NamedTuple):
    input_ids: np.ndarray
    loss_mask: np.ndarray
    seq_start_id: np.ndarray

    @property
    def packed_len(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_start_id.shape[0])

    def seq_boundaries(self) -> np.ndarray:
        """``list(seq_start_id) + [packed_len]`` as int32: what Megatron-Bridge datasets return."""
        out = np.empty(self.num_seqs + 1, dtype=np.int32)
        out[:-1] = self.seq_start_id
        out[-1] = self.packed_len
        return out

    def item(self) -> dict[str, np.ndarray]:
        """The dict a Megatron-Bridge packed dataset returns for this bin (``dataset[i]``)."""
        return {"input_ids": self.input_ids, "loss_mask": self.loss_mask,
                "seq_boundaries": self.seq_boundaries()}

    def copy(self) -> PackedBin:
        return PackedBin(self.input_ids.copy(), self.loss_mask.copy(), self.seq_start_id.copy())


def bin_digest(input_ids: np.ndarray, loss_mask: np.ndarray, seq_start_id: np.ndarray) -> str:
    """A content hash of one bin that ignores storage dtypes (uint16 vs int32 tokens hash alike)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(np.ascontiguousarray(input_ids, dtype="<i8").tobytes())
    digest.update(b"|")
    digest.update(np.ascontiguousarray(loss_mask, dtype="|u1").tobytes())
    digest.update(b"|")
    digest.update(np.ascontiguousarray(seq_start_id, dtype="<i8").tobytes())
    return digest.hexdigest()


#: The per-bin checksum every format that has room for one stores (its name in manifests).
CHECKSUM = "xxh3_64"


def records_checksum(record: dict[str, Any], where: object) -> bool:
    """Whether a manifest, footer or metadata ``record`` says its shard stores per-bin
    checksums (``"bin_checksum"``; shards written before them have none); one this packlab
    does not know is a FormatError naming ``where``, never a shard read unchecked."""
    if "bin_checksum" not in record:
        return False
    if record["bin_checksum"] != CHECKSUM:
        raise FormatError(f"{where}: per-bin checksum {record['bin_checksum']!r}, this packlab "
                          f"knows {CHECKSUM!r}")
    return True


def bin_checksum(input_ids: np.ndarray, loss_mask: np.ndarray, seq_start_id: np.ndarray) -> int:
    """The per-bin checksum shards store: xxh3_64 of the tokens' bytes *as stored* (their
    storage dtype, little-endian), seeding the hash of the loss mask's bytes (uint8), seeding
    the hash of the starts' bytes (int32). ~0.7 us for a 4096-token bin (zlib.crc32: ~10 us).

    Each array must be C-contiguous in those dtypes (a bin's views and the writers' buffers
    are); a uint64 (Python int) comes back.
    """
    return xxh3_64_intdigest(seq_start_id,
                             xxh3_64_intdigest(loss_mask, xxh3_64_intdigest(input_ids)))


def stored_checksum(input_ids: np.ndarray, loss_mask: np.ndarray, seq_start_id: np.ndarray,
                    token_dtype: np.dtype | str) -> int:
    """:func:`bin_checksum` of a bin as a writer stores it (tokens in ``token_dtype``)."""
    return bin_checksum(np.ascontiguousarray(input_ids, dtype=token_dtype),
                        np.ascontiguousarray(loss_mask, dtype="|u1"),
                        np.ascontiguousarray(seq_start_id, dtype="<i4"))


def bins_equal(a: PackedBin, b: PackedBin) -> bool:
    return (
        np.array_equal(a.input_ids, b.input_ids)
        and np.array_equal(a.loss_mask, b.loss_mask)
        and np.array_equal(a.seq_start_id, b.seq_start_id)
    )
