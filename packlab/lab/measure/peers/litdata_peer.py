"""LitData: the bins written by its ``BinaryWriter`` into chunk files, read by ``StreamingDataset``.

A local directory of ``chunk-*.bin`` files and ``index.json`` (no compression); the reader
memory-maps the chunks. Two settings of ``batch_decode``: ``0`` decodes only the item asked
for (what random access wants); the default ``"auto"`` decodes a window of rows around it and
serves the window's other rows from memory (fast when the next index falls inside the window,
a whole window's decode when it does not).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packlab.lab.measure.peers.base import COLUMNS, Opened, Peer, Reference

CHUNK_BYTES = "64MB"


class _LitData(Peer):
    REQUIRES = ("litdata",)
    BATCH_DECODE: Any = 0

    def write(self, reference: Reference, directory: Path) -> None:
        from litdata.streaming.writer import BinaryWriter

        directory.mkdir(parents=True, exist_ok=True)
        writer = BinaryWriter(str(directory), chunk_bytes=CHUNK_BYTES)
        for i in range(len(reference)):
            writer[i] = dict(zip(COLUMNS, reference.bin(i), strict=True))
        writer.done()
        writer.merge()

    def open(self, directory: Path) -> Opened:
        import litdata

        dataset = litdata.StreamingDataset(str(directory), batch_decode=self.BATCH_DECODE)
        get = dataset.__getitem__
        return Opened(get, keep=dataset)  # a dict: its values are delivered


class LitDataPerItem(_LitData):
    NAME = "litdata"
    LABEL = "LitData (batch_decode=0)"
    BATCH_DECODE = 0


class LitDataAuto(_LitData):
    NAME = "litdata_auto"
    LABEL = "LitData (batch_decode=auto)"
    BATCH_DECODE = "auto"
