"""The verdict words: how a claim measured against its number is said, everywhere the same.

- :func:`holds`: a yes/no target (``holds`` / ``does not hold``);
- :func:`claim_verdict`: a claimed amount, as an estimate (within a factor either way) or a
  bound (at most a factor over), saying how far off when it is not;
- :func:`ratio_verdict`: a claimed ratio (``~x`` or a range) against a measured one;
- :func:`speed_word` and :func:`words_agree`: the RFC's speed words (``fastest`` ... ``slow``)
  from a rate relative to the fastest of the same run.

A verdict is computed from the numbers beside it, never typed in: a reader can check it.
"""

from __future__ import annotations

from packlab.tables import times


def holds(ok: bool) -> str:
    return "holds" if ok else "does not hold"


def claim_verdict(measured: float, claimed: float, kind: str, tolerance: float = 2.0) -> str:
    """``holds``, or how far off, in words a reader can check against the numbers.

    ``kind``: ``estimate`` (holds within ``tolerance`` either way) or ``bound`` (holds when
    the measurement is at most ``tolerance`` times the claim).
    """
    ratio = max(measured, 1.0) / claimed
    if kind == "bound":
        return "holds" if ratio <= tolerance else f"does not hold ({times(ratio)} more)"
    if 1 / tolerance <= ratio <= tolerance:
        return "holds"
    if ratio < 1:
        return f"overstated (measured {times(1 / ratio)} less)"
    return f"understated (measured {times(ratio)} more)"


def ratio_verdict(measured: float, low: float, high: float | None = None, *,
                  tolerance: float = 0.2) -> str:
    """A claimed ratio (``~low``, or the range ``low..high``) against a measured one.

    ``~x`` holds within ``tolerance`` (relative) either way; a range holds inside it.
    """
    lo, hi = (low * (1 - tolerance), low * (1 + tolerance)) if high is None else (low, high)
    if lo <= measured <= hi:
        return "holds"
    word = "overstated" if measured < lo else "understated"
    return f"{word} (measured {measured:.2g}x)"


def speed_word(rate: float, fastest: float) -> str:
    """The RFC's speed words from a rate relative to the fastest in the same run:
    ``fastest`` within 10% of the top, ``fast`` >= 2/3 of it, ``medium`` >= 1/3, else ``slow``."""
    rel = rate / fastest
    if rel >= 0.9:
        return "fastest"
    return "fast" if rel >= 2 / 3 else "medium" if rel >= 1 / 3 else "slow"


def words_agree(claimed: str, measured: str) -> bool:
    """``fast`` is also met by ``fastest``; otherwise the words must match."""
    return claimed == measured or (claimed == "fast" and measured == "fastest")
