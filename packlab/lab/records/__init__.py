"""Each notebook's recorded numbers as a typed record: what summaries, the report and the
README read, by attribute.

A notebook fills its record (a dataclass of :mod:`.base`'s :class:`~.base.Record`, one module
per notebook, named as its summary is: ``05_random_access`` -> :mod:`.random_access`) and
passes it to :func:`packlab.lab.results.record`, which stores its JSON with the record's name;
:func:`load` builds it back from a notebook's results (a results file without that name is a
run recorded before the records, read from its flat names: :meth:`~.base.Record.from_flat`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packlab.errors import PacklabError
from packlab.lab.records.at_scale import AtScale
from packlab.lab.records.base import Record
from packlab.lab.records.cloud_storage import CloudStorage
from packlab.lab.records.compression import Compression
from packlab.lab.records.duckdb_queries import DuckdbQueries
from packlab.lab.records.packing import Packing
from packlab.lab.records.peak_memory import PeakMemory
from packlab.lab.records.peers import Peers
from packlab.lab.records.random_access import RandomAccess
from packlab.lab.records.sharded_loading import ShardedLoading
from packlab.lab.records.synthetic_spools import SyntheticSpools
from packlab.lab.records.training import Training
from packlab.lab.records.write_formats import WriteFormats

__all__ = [
    "RECORDS", "AtScale", "CloudStorage", "Compression", "DuckdbQueries", "Packing", "PeakMemory", "Peers",
    "RandomAccess", "Record", "ShardedLoading", "SyntheticSpools", "Training", "WriteFormats",
    "load", "of_run",
]

RECORDS: dict[str, type[Record]] = {cls.NOTEBOOK: cls for cls in (
    SyntheticSpools, Packing, WriteFormats, PeakMemory, RandomAccess, Compression,
    DuckdbQueries, ShardedLoading, CloudStorage, Training, Peers, AtScale)}
#: the key of a results file naming the record its numbers are
KEY = "record"


def load(notebook: str, recorded: Mapping[str, Any]) -> Record | None:
    """The typed record of a notebook's results (None: the notebook has no record type)."""
    cls = RECORDS.get(notebook)
    if cls is None:
        return None
    numbers = recorded.get("numbers", {})
    if KEY not in recorded:
        return cls.from_flat(numbers, recorded.get("parameters", {}))
    if recorded[KEY] != cls.__name__:
        raise PacklabError(f"{notebook}: results hold a {recorded[KEY]} record, expected "
                           f"{cls.__name__}")
    return cls.from_json(numbers)


def of_run(run: Mapping[str, Mapping[str, Any]], cls: type[Record]) -> Any:
    """The record of ``cls``'s notebook in a run (``{notebook: results}``), or None when that
    notebook did not run."""
    recorded = run.get(cls.NOTEBOOK)
    return None if recorded is None else load(cls.NOTEBOOK, recorded)
