"""Lance (``pylance``): the bins as a Lance dataset, read with ``take([i])``.

``lance.write_dataset`` of packlab's three list columns with Lance's default encodings;
``dataset.take([i])`` returns a one-row Arrow table, each column taken out as numpy.
"""

from __future__ import annotations

from pathlib import Path

from packlab.measure.peers.base import Opened, Peer, Reference, arrow_table, table_row


class Lance(Peer):
    NAME = "lance"
    LABEL = "Lance (take)"
    REQUIRES = ("lance",)

    def write(self, reference: Reference, directory: Path) -> None:
        import lance

        lance.write_dataset(arrow_table(reference), str(directory), mode="overwrite")

    def open(self, directory: Path) -> Opened:
        import lance

        dataset = lance.dataset(str(directory))
        take = dataset.take
        return Opened(lambda i: table_row(take([i])), keep=dataset)
