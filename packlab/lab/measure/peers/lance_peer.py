"""Lance (``pylance``): the bins as a Lance dataset, read with ``take([i])``.

``lance.write_dataset`` of packlab's three list columns with Lance's default encodings;
``dataset.take([i])`` returns a one-row Arrow table, each column taken out as numpy.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from packlab.lab.measure.peers.base import Opened, Peer, Reference, arrow_table, table_row


def _lance() -> Any:
    # Lance logs "No existing dataset ... will be created" as a warning on every first write;
    # errors only, unless the caller chose a level
    os.environ.setdefault("LANCE_LOG", "error")
    import lance

    return lance


class Lance(Peer):
    NAME = "lance"
    LABEL = "Lance (take)"
    REQUIRES = ("lance",)

    def write(self, reference: Reference, directory: Path) -> None:
        _lance().write_dataset(arrow_table(reference), str(directory), mode="overwrite")

    def open(self, directory: Path) -> Opened:
        dataset = _lance().dataset(str(directory))
        take = dataset.take
        return Opened(lambda i: table_row(take([i])), keep=dataset)
