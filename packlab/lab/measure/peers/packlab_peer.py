"""packlab's own formats, as peers: written by ``packlab pack``'s pipeline, read by
``packlab.open_dataset(shard)[i]``. Those are the items training gets: ``input_ids``,
``loss_mask``, ``seq_boundaries``, where ``seq_boundaries`` is ``seq_start_id`` plus the bin's
length.

Every registered format is one :class:`PacklabFormat`, at its writer's defaults (Parquet: one
row group per 1,000 bins, zstd; its reader's LRU of decoded row groups). Bytes on disk are
every file the shard's reads touch, the spool included for a format that stores no tokens
(``packed_index``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from packlab.errors import PacklabError
from packlab.lab.measure.peers.base import Opened, Peer, Reference
from packlab.lab.measure.reading import data_files
from packlab.loading.discovery import find_shards
from packlab.pipeline.shards import write_shards
from packlab.sources import open_dataset


class PacklabFormat(Peer):
    KIND = "packlab"

    def __init__(self, format: str) -> None:
        self.NAME = f"packlab_{format}"
        self.LABEL = f"packlab {format}"
        self.format = format

    def shard(self, directory: Path) -> Path:
        """The one shard the pipeline wrote (found as every reader finds shards: a Megatron
        pair's ``.bin`` and packlab's sidecar are its companions, not shards)."""
        found = find_shards(directory)
        if len(found) != 1:
            raise PacklabError(f"{directory}: expected one packlab shard, found {len(found)}")
        return Path(found[0][0])

    def write(self, reference: Reference, directory: Path) -> None:
        if reference.spool is None or reference.assignment is None:
            raise PacklabError(f"packlab {self.format}: the reference needs its spool and "
                               "assignment to be written by packlab's pipeline")
        write_shards(reference.spool, reference.assignment, directory, format=self.format,
                     bins_per_shard=len(reference), workers=1, existing="overwrite")

    def open(self, directory: Path) -> Opened:
        dataset = open_dataset(self.shard(directory))
        return Opened(dataset.__getitem__, close=dataset.close, keep=dataset)

    def files(self, directory: Path) -> list[Path]:
        dataset = open_dataset(self.shard(directory))
        try:
            return data_files(dataset)
        finally:
            dataset.close()

    def as_reference(self, got):  # noqa: D102 - seq_boundaries -> seq_start_id
        ids, mask, bounds = (np.asarray(a) for a in got)
        if bounds.shape[0] == 0 or int(bounds[-1]) != ids.shape[0]:
            raise PacklabError(f"{self.LABEL}: seq_boundaries do not end at the bin's length")
        return ids, mask, bounds[:-1]
