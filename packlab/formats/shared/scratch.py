"""An append-only on-disk array: per-bin values a writer needs again when it finishes.

The writers of ``binidx``, ``megatron_sft`` and ``pbin`` write each bin's data as it comes,
but their indexes (lengths, pointers, starts) are laid out after all the bins; keeping those
values in lists would make the writer's memory grow with the shard. They go to a scratch file
beside the temporary instead and are read back in chunks at ``finalize``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np


class ScratchArray:
    """Values appended one bin at a time, read back ``step`` at a time (memory: one bin)."""

    def __init__(self, path: Path, dtype: str) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self._file = open(path, "wb")  # noqa: SIM115 - closed in finish()/discard()
        self.size = 0

    def append(self, values: np.ndarray) -> None:
        self._file.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self.size += int(np.size(values))

    def finish(self) -> None:
        self._file.close()

    def chunks(self, step: int = 1 << 17) -> Iterator[np.ndarray]:
        """The values back, ``step`` at a time, read with ``fromfile`` (a map held over the
        whole loop would keep every page it touched counted in the writer's memory)."""
        with open(self.path, "rb") as f:
            for lo in range(0, self.size, step):
                yield np.fromfile(f, dtype=self.dtype, count=min(step, self.size - lo))

    def discard(self) -> None:
        if not self._file.closed:
            self._file.close()
        self.path.unlink(missing_ok=True)
