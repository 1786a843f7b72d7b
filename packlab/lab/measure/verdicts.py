"""The verdict words and the one rule that decides them, everywhere the same.

Four words, nothing else (the report colours them; the notebooks' tests refuse any other):

- ``holds``: the measured value meets the claim, by :data:`RULE`;
- ``partly``: a claim over several cases (formats, sizes, data kinds) that holds for some of
  them; the measured column says which;
- ``does not hold``: it does not; the measured column says by how much (:func:`deviation`);
- ``not measured``: this run did not reach the claim's conditions (a smaller scale).

How far off a claim is belongs in the measured column (``3.2x more``), never in the verdict.
A verdict is computed from the numbers beside it, never typed in: a reader can check it.

The functions: :func:`holds` (a target's yes/no), :func:`approx` (an approximate amount or a
range), :func:`at_most` and :func:`at_least` (bounds), :func:`claim_verdict` (an amount as an
estimate or a bound), :func:`overall` (several cases in one verdict), :func:`flat` (memory that
does not grow with the data), and the RFC's speed words (:func:`speed_word`).
"""

from __future__ import annotations

from collections.abc import Iterable

HOLDS, PARTLY, DOES_NOT_HOLD, NOT_MEASURED = "holds", "partly", "does not hold", "not measured"
VERDICTS = (HOLDS, PARTLY, DOES_NOT_HOLD, NOT_MEASURED)
#: how far an approximate claim may be from the measurement and still hold (a factor)
TOLERANCE = 1.25
#: memory is flat when its log-log slope against the number of bins is at most this
FLAT_SLOPE = 0.3

RULE = (
    "A packlab target (docs/design.md: \"within 1.1x\", \"under 2 s\", \"at least 100x\") holds when "
    "the measured value meets it. A claim quoted from the RFC or the design documents states an "
    f"approximate amount (\"~4 GB\", \"~0.4x\", \"2-3x\"): it holds when the measured value is "
    f"within a factor of {TOLERANCE:g} of it (of a range's ends); an upper bound (\"~20 MB\", "
    f"\"a few KB\") holds up to {TOLERANCE:g} times it, a lower bound (\"200x less\") down to "
    f"1/{TOLERANCE:g} of it. Memory is flat when its log-log slope against the number of bins is "
    f"at most {FLAT_SLOPE:g}. A claim over several cases holds when every case holds, partly "
    "when some do. Values are compared as printed."
)


def holds(ok: bool) -> str:
    """A target's verdict: ``holds`` or ``does not hold``."""
    return HOLDS if ok else DOES_NOT_HOLD


def approx(measured: float, low: float, high: float | None = None) -> str:
    """An approximate claim (``~low``, or the range ``low..high``): holds within a factor
    :data:`TOLERANCE` of it."""
    high = low if high is None else high
    return holds(low / TOLERANCE <= measured <= high * TOLERANCE)


def at_most(measured: float, bound: float) -> str:
    """An upper bound (``~20 MB``, ``a few KB``): holds up to :data:`TOLERANCE` times it."""
    return holds(measured <= bound * TOLERANCE)


def at_least(measured: float, bound: float) -> str:
    """A lower bound (``200x less``): holds down to ``bound / TOLERANCE``."""
    return holds(measured >= bound / TOLERANCE)


def claim_verdict(measured: float, claimed: float, kind: str) -> str:
    """A claimed amount: ``kind`` ``estimate`` (:func:`approx`) or ``bound`` (:func:`at_most`).
    Amounts below 1 (a byte, a microsecond) count as 1."""
    measured = max(measured, 1.0)
    return at_most(measured, claimed) if kind == "bound" else approx(measured, claimed)


def ratio_verdict(measured: float, low: float, high: float | None = None) -> str:
    """A claimed ratio (``~low`` or ``low..high``) against a measured one: :func:`approx`."""
    return approx(measured, low, high)


def deviation(measured: float, claimed: float) -> str:
    """How far a measurement is from a claim, for the measured column: ``1.04x the claim``,
    ``45x the claim``, ``0.12x the claim``."""
    ratio = max(measured, 1e-12) / max(claimed, 1e-12)
    return f"{ratio:,.0f}x the claim" if ratio >= 10 else f"{ratio:.2f}x the claim"


def overall(verdicts: Iterable[str]) -> str:
    """Several cases of one claim in one verdict: ``holds`` when every measured case holds,
    ``partly`` when some do, ``does not hold`` when none does; ``not measured`` without cases."""
    measured = [v for v in verdicts if v != NOT_MEASURED]
    if not measured:
        return NOT_MEASURED
    if all(v == HOLDS for v in measured):
        return HOLDS
    return PARTLY if any(v in (HOLDS, PARTLY) for v in measured) else DOES_NOT_HOLD


def flat(slope: float) -> str:
    """Peak memory flat as the data grows: log-log slope (as printed, two decimals) at most
    :data:`FLAT_SLOPE`."""
    return holds(round(slope, 2) <= FLAT_SLOPE)


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


#: text and background colour of each word, wherever a verdict is shown in colour
COLOURS = {HOLDS: ("#1a7f37", "#dafbe1"), PARTLY: ("#9a6700", "#fff8c5"),
           DOES_NOT_HOLD: ("#cf222e", "#ffebe9"), NOT_MEASURED: ("#57606a", "#eaeef2")}


def badge(verdict: str) -> str:
    """The verdict as an inline HTML badge in its colour (a word outside the vocabulary is
    shown struck through: the tests refuse it, the report never hides it)."""
    fg, bg = COLOURS.get(verdict, ("#000000", "#ffffff"))
    text = verdict if verdict in COLOURS else f"<s>{verdict}</s>"
    return (f'<span style="color:{fg};background:{bg};padding:0 .4em;border-radius:.3em;'
            f'white-space:nowrap">{text}</span>')
