"""Vortex (``vortex-data``): the bins as one Vortex file, read with a scan of one index.

``vortex.io.write`` of packlab's three list columns with Vortex's default compression;
``VortexFile.scan(indices=[i])`` returns the row as an Arrow struct array, each field taken
out as numpy.
"""

from __future__ import annotations

from pathlib import Path

from packlab.lab.measure.peers.base import COLUMNS, Opened, Peer, Reference, arrow_table, list_cell

FILE = "bins.vortex"


class Vortex(Peer):
    NAME = "vortex"
    LABEL = "Vortex (scan of one index)"
    REQUIRES = ("vortex",)

    def write(self, reference: Reference, directory: Path) -> None:
        import vortex

        directory.mkdir(parents=True, exist_ok=True)
        vortex.io.write(arrow_table(reference), str(directory / FILE))

    def open(self, directory: Path) -> Opened:
        import pyarrow as pa
        import vortex

        file = vortex.open(str(directory / FILE))

        def read(i: int) -> list:
            row = file.scan(indices=vortex.array(pa.array([i], pa.uint64()))).read_all()
            struct = row.to_arrow_array()
            return [list_cell(struct.field(name)) for name in COLUMNS]

        return Opened(read, keep=file)
