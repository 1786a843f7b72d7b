"""Hugging Face ``datasets``: the bins as a ``Dataset`` saved to disk, read in two formats.

Written with ``Dataset(table).save_to_disk`` (Arrow files, memory-mapped when loaded), opened
with ``load_from_disk`` and read as ``dataset[i]`` with ``with_format("arrow")`` (a one-row
Arrow table, each column taken out as numpy) or ``with_format("numpy")`` (numpy arrays,
in the dtypes the formatter picks).
"""

from __future__ import annotations

from pathlib import Path

from packlab.lab.measure.peers.base import Opened, Peer, Reference, arrow_table, table_row


class _HfDatasets(Peer):
    REQUIRES = ("datasets",)
    FORMAT = ""

    def write(self, reference: Reference, directory: Path) -> None:
        import datasets

        quiet = datasets.are_progress_bars_disabled()
        datasets.disable_progress_bars()  # no "Saving the dataset" bar in the notebook
        try:
            datasets.Dataset(arrow_table(reference)).save_to_disk(str(directory))
        finally:
            if not quiet:
                datasets.enable_progress_bars()

    def open(self, directory: Path) -> Opened:
        import datasets

        dataset = datasets.load_from_disk(str(directory)).with_format(self.FORMAT)
        get = dataset.__getitem__
        if self.FORMAT == "arrow":
            return Opened(lambda i: table_row(get(i)), keep=dataset)
        return Opened(get, keep=dataset)  # a dict: its values are delivered


class HfArrow(_HfDatasets):
    NAME = "hf_datasets_arrow"
    LABEL = "HF datasets (arrow format)"
    FORMAT = "arrow"


class HfNumpy(_HfDatasets):
    NAME = "hf_datasets_numpy"
    LABEL = "HF datasets (numpy format)"
    FORMAT = "numpy"
