"""Train/valid/test splits, decided per *sequence*, before packing.

Why sequences and not bins: a bin mixes several conversations, and which ones depends on the
pack size and the algorithm. Splitting the spool's sequences first (then packing each split on
its own) means

- no conversation is in two splits, and exact duplicates (same tokens and mask) always land in
  the same split, because a sequence's split is a function of its *content*, not its position:
  a duplicated conversation cannot leak from train into valid;
- the validation set does not move when the pack size, the algorithm or the shard size change,
  so validation losses stay comparable across packing experiments;
- adding sequences to a spool never moves the ones already there.

A sequence's key is a seeded 64-bit hash of its tokens, mask and positions (vectorized, in
chunks of about ``CHUNK_TOKENS`` tokens, so memory is flat in the spool size). The key, read as
a number in [0, 1), falls into one split's interval; the intervals follow the order the splits
were given (``train=0.98,valid=0.01,test=0.01``: train is [0, 0.98)).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from packlab.errors import PacklabError
from packlab.spool import SpoolReader

SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
#: the split names training stacks ask for (Megatron-Bridge's train, validation and test data)
STANDARD_SPLITS = ("train", "valid", "test")
DEFAULT_SPLITS = "train=1"
SUM_TOLERANCE = 1e-6
CHUNK_TOKENS = 1 << 20
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def parse_fractions(spec: str | Mapping[str, float] | None) -> dict[str, float]:
    """``"train=0.98,valid=0.01,test=0.01"`` (or a mapping): each split's share of the
    sequences, each in [0, 1], summing to 1 (within ``1e-6``; anything else is refused rather
    than silently rescaled: ``train=0.5,valid=0.6`` is a typo, not a ratio). A split may be 0
    (it is then empty). Order is kept: it places the intervals.
    """
    if spec is None:
        spec = DEFAULT_SPLITS
    if isinstance(spec, str):
        if ";" in spec:
            raise PacklabError(f"splits {spec!r}: separate them with commas "
                               "(train=0.98,valid=0.01,test=0.01)")
        pairs = []
        for part in (p.strip() for p in spec.split(",")):
            name, eq, value = part.partition("=")
            if not eq:
                raise PacklabError(f"split {part!r}: expected NAME=FRACTION "
                                   "(e.g. train=0.98,valid=0.01,test=0.01)")
            pairs.append((name.strip(), value.strip()))
    else:
        pairs = list(spec.items())
    out: dict[str, float] = {}
    for name, value in pairs:
        if not SPLIT_NAME.match(str(name)):
            raise PacklabError(f"split name {name!r}: use letters, digits, '_' or '-'")
        if name in out:
            raise PacklabError(f"split {name!r} given twice")
        meant = misspelt_split(str(name))
        if meant is not None:
            raise PacklabError(f"split {name!r}: did you mean {meant!r}? (a split is read by "
                               f"its name: {', '.join(STANDARD_SPLITS)}; one misspelt is "
                               "data nothing reads)")
        out[name] = _fraction(name, value)
    total = sum(out.values())
    if not out or total <= 0:
        raise PacklabError(f"splits {_spelled(spec)}: at least one fraction must be positive")
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise PacklabError(f"splits {_spelled(spec)}: fractions sum to {total:.6g}, not 1 "
                           "(each is a split's share of the sequences, e.g. "
                           "train=0.98,valid=0.01,test=0.01)")
    return {name: value / total for name, value in out.items()}


def misspelt_split(name: str) -> str | None:
    """The standard split name (:data:`STANDARD_SPLITS`) that ``name`` is one slip away from
    (a letter added, dropped, changed, two swapped, or another case: ``vaild``, ``trian``,
    ``Test``), or None (``validation``, ``holdout`` and the standard names themselves)."""
    for standard in STANDARD_SPLITS:
        if name != standard and _one_slip(name.lower(), standard):
            return standard
    return None


def _one_slip(a: str, b: str) -> bool:
    """Whether ``a`` is ``b`` or one edit from it (insertion, deletion, substitution, or a
    swap of two neighbours)."""
    if a == b:
        return True
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def _spelled(spec: object) -> str:
    if isinstance(spec, Mapping):
        return ",".join(f"{k}={v}" for k, v in spec.items())
    return str(spec)


def _fraction(name: str, value: object) -> float:
    number = _number(f"split {name!r}: fraction", value)
    if number > 1:
        raise PacklabError(f"split {name!r}: fraction {value!r} is over 1 (a share of the "
                           "sequences, in [0, 1])")
    return number


def _number(what: str, value: object) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise PacklabError(f"{what} {value!r} is not a number") from None
    if not np.isfinite(number) or number < 0:
        raise PacklabError(f"{what} {value!r} must be a finite number >= 0")
    return number


def parse_weights(spec: str | Sequence[float] | None, count: int) -> list[float] | None:
    """Blend weights, one per input, normalized to sum 1; None when not given."""
    if spec is None:
        return None
    values = [p.strip() for p in spec.split(",")] if isinstance(spec, str) else list(spec)
    if len(values) != count:
        raise PacklabError(f"{len(values)} weights for {count} inputs: give one per spool")
    weights = [_number(f"weights: weight {i + 1} of {count}", v) for i, v in enumerate(values)]
    if sum(weights) <= 0:
        raise PacklabError("weights: at least one must be positive")
    return [w / sum(weights) for w in weights]


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, in place on a uint64 array (wrapping arithmetic)."""
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


def sequence_keys(spool: SpoolReader, seed: int = 0, *, chunk_tokens: int = CHUNK_TOKENS
                  ) -> np.ndarray:
    """A seeded 64-bit content hash per sequence (uint64[num_sequences]).

    Equal sequences (tokens, mask, length) get equal keys wherever they are in the spool.
    """
    lengths = spool.lengths.astype(np.int64)
    offsets = spool.offsets.astype(np.int64)
    salt = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) ^ _GOLDEN)[0]
    keys = np.empty(lengths.shape[0], dtype=np.uint64)
    ends = np.cumsum(lengths)
    first = 0
    with np.errstate(over="ignore"):
        while first < lengths.shape[0]:
            budget = int(ends[first] - lengths[first]) + chunk_tokens
            last = max(first + 1, int(np.searchsorted(ends, budget, side="right")))
            keys[first:last] = _chunk_keys(spool, offsets[first:last], lengths[first:last], salt)
            first = last
    return keys


def _chunk_keys(spool: SpoolReader, offsets: np.ndarray, lengths: np.ndarray,
                salt: np.uint64) -> np.ndarray:
    starts = np.zeros(lengths.shape[0], dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    total = int(starts[-1] + lengths[-1])
    pos = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
    lo, hi = int(offsets[0]), int(offsets[-1] + lengths[-1])
    if hi - lo == total and bool(np.all(offsets - lo == starts)):
        tokens, masks = spool.tokens[lo:hi], spool.masks[lo:hi]  # the usual contiguous spool
    else:
        where = np.repeat(offsets, lengths) + pos
        tokens, masks = spool.tokens[where], spool.masks[where]
    v = tokens.astype(np.int64).astype(np.uint64) * _GOLDEN
    v ^= masks.astype(np.uint64) << np.uint64(63)
    v ^= pos.astype(np.uint64) * _M2
    v ^= salt
    sums = np.add.reduceat(_mix(v), starts)
    return _mix(sums ^ _mix(lengths.astype(np.uint64) ^ salt))


def split_of_keys(keys: np.ndarray, fractions: Mapping[str, float]) -> np.ndarray:
    """The split number of each key: keys read as numbers in [0, 1) against the intervals."""
    unit = (keys >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    bounds = np.cumsum(list(fractions.values()))[:-1]
    return np.searchsorted(bounds, unit, side="right").astype(np.int64)


def split_sequences(spool: SpoolReader, fractions: Mapping[str, float], seed: int = 0
                    ) -> dict[str, np.ndarray]:
    """Ascending spool indices of the sequences of each split (every sequence in exactly one)."""
    which = split_of_keys(sequence_keys(spool, seed), fractions)
    return {name: np.flatnonzero(which == k) for k, name in enumerate(fractions)}
