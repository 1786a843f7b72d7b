"""Arrow IPC through numpy views: one uncompressed IPC file, memory-mapped, read as numpy.

The file holds the bins as one record batch of three list columns (packlab's schema); the
reader maps it and takes each column's values and offsets as zero-copy numpy views once, so
bin ``i`` is three slices, as in raw CSR. What a hand-written Arrow reader can reach.
"""

from __future__ import annotations

from pathlib import Path

from packlab.lab.measure.peers.base import COLUMNS, Opened, Peer, Reference, arrow_table

FILE = "bins.arrow"


class ArrowViews(Peer):
    NAME = "arrow_numpy_views"
    LABEL = "Arrow IPC, numpy views"
    LIBRARY = False

    def write(self, reference: Reference, directory: Path) -> None:
        import pyarrow as pa

        directory.mkdir(parents=True, exist_ok=True)
        table = arrow_table(reference)
        with pa.OSFile(str(directory / FILE), "wb") as sink, \
                pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=len(reference))

    def open(self, directory: Path) -> Opened:
        import pyarrow as pa

        source = pa.memory_map(str(directory / FILE), "r")
        batch = pa.ipc.open_file(source).get_batch(0)
        views = []
        for name in COLUMNS:
            column = batch.column(name)
            views.append((column.values.to_numpy(), column.offsets.to_numpy()))
        (ids, tok), (mask, _), (starts, seq) = views

        def read(i: int) -> tuple:
            t0, t1 = tok[i], tok[i + 1]
            s0, s1 = seq[i], seq[i + 1]
            return ids[t0:t1], mask[t0:t1], starts[s0:s1]

        return Opened(read, close=source.close, keep=(batch, views))
