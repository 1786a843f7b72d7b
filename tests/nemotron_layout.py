"""Nemotron's on-disk layouts for the tests: the writers are the lab's
(:mod:`packlab.lab.interop_inputs`, which the README's interop section calls too), written
byte for byte from Nemotron's documentation; here, the sequences the tests fill them with."""

from __future__ import annotations

import numpy as np

from packlab.lab.interop_inputs import (  # noqa: F401 - the tests' names for them
    chat_sft_extra,
    write_nemotron_parquet,
    write_nemotron_spool,
)


def length_mix(count: int, seed: int) -> np.ndarray:
    """Sequence lengths from a mix packlab's defaults were never tuned to: short chat turns,
    a lognormal body, a long tail past common pack sizes, and single tokens."""
    rng = np.random.default_rng(seed)
    kind = rng.choice(4, size=count, p=[0.4, 0.53, 0.02, 0.05])
    short = rng.integers(2, 48, size=count)
    body = np.rint(rng.lognormal(4.6, 0.8, size=count)).astype(np.int64)
    long = rng.integers(1200, 6000, size=count)
    lengths = np.choose(kind, [short, body, long, np.ones(count, dtype=np.int64)])
    return np.maximum(lengths, 1)


def random_sequences(lengths: np.ndarray, seed: int, vocab: int = 131_072
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Tokens and chat-like masks (a prompt of 0s, then a response of 1s) for each length."""
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths.tolist():
        prompt = int(rng.integers(0, n + 1))
        mask = np.zeros(n, dtype=np.uint8)
        mask[prompt:] = 1
        out.append((rng.integers(0, vocab, size=n, dtype=np.int32), mask))
    return out
