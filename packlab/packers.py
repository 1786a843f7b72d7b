"""The packing algorithms, registered into :mod:`packlab.packing`.

Each takes lengths already clipped to ``[1, pack_size]`` and returns the bin of each sequence.
"""

from __future__ import annotations

import numpy as np

from packlab.packing import register


@register("next_fit")
def next_fit(lengths: np.ndarray, pack_size: int, rng: np.random.Generator) -> np.ndarray:
    """Concatenative packing in spool order: open a new bin when the next sequence won't fit."""
    bin_of = np.empty(lengths.shape[0], dtype=np.int64)
    current, used = 0, 0
    for i, n in enumerate(lengths.tolist()):
        if used + n > pack_size:
            current += 1
            used = 0
        bin_of[i] = current
        used += n
    return bin_of
