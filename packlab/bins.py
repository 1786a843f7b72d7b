"""One packed bin, the unit every format stores and returns (docs/design.md, "One packed
bin").

- ``input_ids``: concatenated tokens, length ``packed_len``, ``0 < packed_len <= pack_size``;
- ``loss_mask``: uint8 0/1, same length, aligned for next-token prediction within each
  sub-sequence (the last position of every sub-sequence is 0);
- ``seq_start_id``: start offsets ``[0, s1, ...]``, strictly increasing, last ``< packed_len``.

What ``pack_size`` counts differs between projects (:data:`CONVENTIONS`): packlab and Nemotron
count the tokens a bin stores; Megatron-Bridge counts the next-token positions it trains on,
``L - 1`` for a sub-sequence of ``L`` tokens (its packer bins ``len(input_ids) - 1``), so its
bins store up to ``pack_size + num_seqs`` tokens. Readers of files without a record take
``convention=`` to check bins under the convention their writer used.

The rules are checked vectorized, errors naming the source and the bin: writers call
:func:`check_bin` on every bin; ``packlab validate`` calls :func:`check_csr` on a whole shard
at once (flat tokens and masks with their offsets), so a million bins cost a few numpy passes,
not a Python loop.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import numpy as np
from xxhash import xxh3_64_intdigest

from packlab.errors import FormatError, InvariantError, PacklabError

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


def cumulative_offsets(counts: Any) -> np.ndarray:
    """``[0, c0, c0 + c1, ...]`` as int64: where each of a run of counted things starts (the
    last entry is their total)."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def seq_boundaries(starts: np.ndarray, packed_len: int) -> np.ndarray:
    """``list(starts) + [packed_len]`` as int32: a bin's ``seq_boundaries``, what
    Megatron-Bridge datasets return."""
    out = np.empty(len(starts) + 1, dtype=np.int32)
    out[:-1] = starts
    out[-1] = packed_len
    return out


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
        return seq_boundaries(self.seq_start_id, self.packed_len)

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


#: The per-bin checksum every format that has room for one stores (its name in records).
CHECKSUM = "xxh3_64"


def records_checksum(record: dict[str, Any], where: object) -> bool:
    """Whether ``record`` (a record file, footer or metadata) says its shard stores per-bin
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


def check_bin_checksum(packed: PackedBin, expected: int, source: object, b: int) -> None:
    """Bin ``b`` of ``source`` against the checksum recorded when it was written: a
    FormatError naming the bin when they differ."""
    if bin_checksum(*packed) != expected:
        raise FormatError(f"{source}: bin {b}: checksum mismatch: its tokens, loss mask or "
                          "starts changed since it was written (corrupted)")


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

def check_bin(
    input_ids: np.ndarray,
    loss_mask: np.ndarray,
    seq_start_id: np.ndarray,
    *,
    pack_size: int,
    source: str = "<bin>",
    bin_id: int = 0,
    convention: str = "packlab",
) -> None:
    """Raise :class:`InvariantError` naming ``source`` and ``bin_id`` if the bin breaks a rule
    (``pack_size`` counted as ``convention`` says: :data:`packlab.bins.CONVENTIONS`)."""
    where = f"{source}: bin {bin_id}"
    n = int(np.shape(input_ids)[0]) if np.ndim(input_ids) == 1 else -1
    if n < 0 or np.ndim(loss_mask) != 1 or np.ndim(seq_start_id) != 1:
        raise InvariantError(f"{where}: input_ids, loss_mask and seq_start_id must be 1-D")
    used = budget_used(n, int(np.shape(seq_start_id)[0]), check_convention(convention))
    if not 0 < n or used > pack_size:
        raise InvariantError(f"{where}: {_over(n, n - used, pack_size, convention)}")
    if loss_mask.shape[0] != n:
        raise InvariantError(f"{where}: loss_mask has {loss_mask.shape[0]} values, input_ids {n}")
    if input_ids.dtype.kind not in "iu":
        raise InvariantError(f"{where}: input_ids dtype {input_ids.dtype} is not integer")
    if input_ids.dtype.kind == "i" and int(input_ids.min()) < 0:
        raise InvariantError(f"{where}: negative token id {int(input_ids.min())}")
    if loss_mask.dtype.kind not in "biu":
        raise InvariantError(f"{where}: loss_mask dtype {loss_mask.dtype} is not integer")
    if loss_mask.dtype != np.bool_ and (int(loss_mask.max()) > 1 or int(loss_mask.min()) < 0):
        raise InvariantError(f"{where}: loss_mask values must be 0 or 1")
    starts = np.asarray(seq_start_id, dtype=np.int64)
    if starts.shape[0] == 0:
        raise InvariantError(f"{where}: seq_start_id is empty")
    if starts[0] != 0:
        raise InvariantError(f"{where}: seq_start_id[0] is {int(starts[0])}, must be 0")
    if starts.shape[0] > 1 and not bool(np.all(starts[1:] > starts[:-1])):
        i = int(np.argmax(starts[1:] <= starts[:-1])) + 1
        raise InvariantError(f"{where}: seq_start_id not strictly increasing at position {i}")
    if starts[-1] >= n:
        raise InvariantError(f"{where}: last seq_start_id {int(starts[-1])} >= packed_len {n}")
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    ends[-1] = n
    if bool(np.any(loss_mask[ends - 1])):
        j = int(np.argmax(loss_mask[ends - 1] != 0))
        raise InvariantError(
            f"{where}: loss_mask is 1 at position {int(ends[j] - 1)}, the last token of "
            f"sub-sequence {j}: loss would cross a sequence boundary"
        )


def check_token_ids(ids: np.ndarray, token_offsets: np.ndarray, *, token_limit: int,
                    source: str, first_bin: int = 0) -> None:
    """Every token id of the bins whose tokens are ``ids`` (bin ``first_bin + i`` from
    ``token_offsets[i]``) in ``[0, token_limit)``; a FormatError naming the first bin that
    holds one outside."""
    bad = (ids < 0) | (ids >= token_limit)
    if bad.any():
        at = int(np.argmax(bad))
        b = first_bin + int(np.searchsorted(token_offsets, at, side="right")) - 1
        raise FormatError(f"{source}: bin {b}: token id {int(ids[at])} outside [0, {token_limit})")


def check_csr(
    token_offsets: np.ndarray,
    seq_offsets: np.ndarray,
    seq_starts: np.ndarray,
    loss_mask: np.ndarray | None,
    *,
    pack_size: int,
    source: str,
    first_bin: int = 0,
    input_ids: np.ndarray | None = None,
    convention: str = "packlab",
) -> None:
    """Check many bins at once, given in CSR form.

    ``token_offsets`` (num_bins+1) delimit each bin's tokens in the flat ``loss_mask`` (and
    the flat ``input_ids``, when given: integer, non-negative);
    ``seq_offsets`` (num_bins+1) delimit each bin's starts in the flat ``seq_starts``;
    ``pack_size`` is counted as ``convention`` says (:data:`packlab.bins.CONVENTIONS`).
    """
    check_convention(convention)
    tok = np.asarray(token_offsets, dtype=np.int64)
    so = np.asarray(seq_offsets, dtype=np.int64)
    starts = np.asarray(seq_starts, dtype=np.int64)
    num_bins = tok.shape[0] - 1

    def fail(bin_index: int, what: str) -> InvariantError:
        return InvariantError(f"{source}: bin {first_bin + bin_index}: {what}")

    if so.shape[0] != num_bins + 1:
        raise InvariantError(f"{source}: {so.shape[0]} sequence offsets for {num_bins} bins")
    if tok[0] != 0 or so[0] != 0:
        raise InvariantError(f"{source}: offsets must start at 0")
    packed_len = np.diff(tok)
    nseq = np.diff(so)
    bad = (packed_len <= 0) | (budget_used(packed_len, np.maximum(nseq, 0), convention)
                               > pack_size)
    if bad.any():
        b = int(np.argmax(bad))
        raise fail(b, _over(int(packed_len[b]), int(nseq[b]), pack_size, convention))
    if (nseq <= 0).any():
        raise fail(int(np.argmax(nseq <= 0)), "seq_start_id is empty")
    if so[-1] != starts.shape[0]:
        raise InvariantError(f"{source}: seq offsets end at {int(so[-1])}, {starts.shape[0]} starts")
    first = starts[so[:-1]]
    if (first != 0).any():
        b = int(np.argmax(first != 0))
        raise fail(b, f"seq_start_id[0] is {int(first[b])}, must be 0")
    bin_of_start = np.repeat(np.arange(num_bins), nseq)
    if starts.shape[0] > 1:
        same_bin = bin_of_start[1:] == bin_of_start[:-1]
        not_increasing = same_bin & (starts[1:] <= starts[:-1])
        if not_increasing.any():
            b = int(bin_of_start[1:][np.argmax(not_increasing)])
            raise fail(b, "seq_start_id not strictly increasing")
    last = starts[so[1:] - 1]
    if (last >= packed_len).any():
        b = int(np.argmax(last >= packed_len))
        raise fail(b, f"last seq_start_id {int(last[b])} >= packed_len {int(packed_len[b])}")
    def bin_at(position: int) -> int:
        return int(np.searchsorted(tok, position, side="right") - 1)

    def flat(values: np.ndarray, name: str) -> np.ndarray:
        """A flat per-token array: 1-D, integer, one value per token (else name the bin)."""
        if values.ndim != 1:
            raise InvariantError(f"{source}: {name} must be 1-D")
        if values.shape[0] != tok[-1]:
            b = min(bin_at(values.shape[0]), num_bins - 1)
            raise fail(b, f"{name} ends at {values.shape[0]} values, bins need {int(tok[-1])}")
        if values.dtype.kind not in "biu":
            raise fail(0, f"{name} dtype {values.dtype} is not integer")
        if values.dtype.kind == "i" and values.size and int(values.min()) < 0:
            pos = int(np.argmax(values < 0))
            raise fail(bin_at(pos), f"negative {name} value {int(values[pos])}")
        return values

    if input_ids is not None:
        flat(np.asarray(input_ids), "input_ids")
    if loss_mask is None:
        return
    mask = flat(np.asarray(loss_mask), "loss_mask")
    if mask.size and mask.dtype != np.bool_ and int(mask.max()) > 1:
        pos = int(np.argmax(mask > 1))
        raise fail(bin_at(pos), "loss_mask values must be 0 or 1")
    # the last token of every sub-sequence: next start - 1 within a bin, packed_len - 1 at the end
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    ends[so[1:] - 1] = packed_len
    last_token = tok[:-1][bin_of_start] + ends - 1
    leaking = mask[last_token] != 0
    if leaking.any():
        k = int(np.argmax(leaking))
        b = int(bin_of_start[k])
        raise fail(b, f"loss_mask is 1 at position {int(ends[k] - 1)}, the last token of a "
                      "sub-sequence: loss would cross a sequence boundary")


def _over(packed_len: int, num_seqs: int, pack_size: int, convention: str) -> str:
    """Why a bin's length breaks ``pack_size`` (or is empty), in its convention's words."""
    if convention == "megatron_bridge" and packed_len > 0:
        return (f"{packed_len - num_seqs} next-token positions ({packed_len} tokens, "
                f"{num_seqs} sequences) over pack_size {pack_size} (Megatron-Bridge's "
                "convention)")
    return f"packed_len {packed_len} not in (0, {pack_size}]"
