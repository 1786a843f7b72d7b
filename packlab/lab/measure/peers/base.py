"""What every peer adapter shares: the reference bins in RAM, and the interface a peer implements.

A *peer* is another system that stores packed bins (Megatron-core's IndexedDataset, Hugging
Face datasets, LitData, MosaicML streaming, Lance, Modalities, ...) or plain arrays in files (raw CSR
numpy, Arrow IPC). Each adapter writes the :class:`Reference` bins into that system with the
system's own writer, opens them with its own reader, and reads bin ``i`` back as the numpy
arrays the system returns (:class:`Opened`). What it returns is what gets verified and copied:
``COLUMNS`` says which of the three columns (``input_ids``, ``loss_mask``, ``seq_start_id``)
it stores; a system that stores tokens only says so (``COLUMNS = ("input_ids",)``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packlab.bins import PackedBin
from packlab.errors import PacklabError
from packlab.formats.shared.arrow_lists import BinColumns
from packlab.lab.measure.delivery import returned_arrays

COLUMNS = ("input_ids", "loss_mask", "seq_start_id")
TOKENS_ONLY = ("input_ids",)


@dataclass(frozen=True)
class Reference:
    """The bins every system is written from and checked against, as CSR arrays in RAM.

    ``spool`` and ``assignment`` (when known) let packlab's own formats be written by its
    pipeline (``packed_index`` stores no tokens: it needs them).
    """

    columns: BinColumns
    pack_size: int
    vocab_size: int | None = None
    spool: Any = None
    assignment: Any = None

    def __len__(self) -> int:
        return int(self.columns.token_offsets.shape[0]) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.columns.token_offsets[-1])

    def bin(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Bin ``i``'s three columns (views)."""
        c = self.columns
        t0, t1 = int(c.token_offsets[i]), int(c.token_offsets[i + 1])
        s0, s1 = int(c.seq_offsets[i]), int(c.seq_offsets[i + 1])
        return c.input_ids[t0:t1], c.loss_mask[t0:t1], c.seq_start_id[s0:s1]

    def bins(self) -> Iterable[PackedBin]:
        return (PackedBin(*self.bin(i)) for i in range(len(self)))

    def lengths(self) -> np.ndarray:
        return np.diff(self.columns.token_offsets)



def reference_from(spool: Any, assignment: Any) -> Reference:
    """The bins of ``assignment`` over ``spool`` (a :class:`packlab.spool.SpoolReader`),
    materialized once into RAM."""
    from packlab.lab.measure.compression import collect_columns
    from packlab.packing.materialize import iter_bins

    return Reference(collect_columns(iter_bins(spool, assignment)), int(assignment.pack_size),
                     spool.vocab_size, spool, assignment)


@dataclass
class Opened:
    """A system opened for reading: ``read(i)`` returns the arrays bin ``i`` comes back as
    (in ``COLUMNS`` order); ``keep`` holds whatever must stay alive while they are used
    (megatron-core's ``IndexedDataset`` segfaults if its arrays outlive it)."""

    read: Callable[[int], Iterable[Any] | dict[str, Any]]
    close: Callable[[], None] = lambda: None
    keep: Any = None


def arrays_of(got: Any) -> list[Any]:
    """The arrays one read returned, as a list (:func:`~packlab.lab.measure.delivery.returned_arrays`)."""
    return list(returned_arrays(got))


class Peer:
    """One system. Subclasses set the class attributes and implement :meth:`write` and
    :meth:`open`."""

    NAME = ""
    LABEL = ""
    COLUMNS: tuple[str, ...] = COLUMNS
    REQUIRES: tuple[str, ...] = ()  # modules that must import
    ENVIRONMENT = ""  # "" : packlab's environment; "mds": its own (.venv-mds)
    KIND = "peer"  # "peer" or "packlab"
    LIBRARY = True  # a project's own reader; False: a read of the bytes written here by hand
    NOTE = ""

    def unavailable(self) -> str | None:
        """Why this system cannot run here (a module missing), else None."""
        for module in self.REQUIRES:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                return f"{module} is not installed in this environment"
        return None

    def load(self) -> None:
        """Import the system's library before its write is timed: ``write_seconds`` is the
        time to write, not the seconds an import of megatron-core or streaming takes."""
        for module in self.REQUIRES:
            require(module)

    def write(self, reference: Reference, directory: Path) -> None:
        raise NotImplementedError

    def open(self, directory: Path) -> Opened:
        raise NotImplementedError

    def files(self, directory: Path) -> list[Path]:
        """Every file the system's data takes on disk (what bytes per token counts)."""
        return tree_files(directory)

    def as_reference(self, got: Sequence[Any]) -> tuple[np.ndarray, ...]:
        """What a read returned, as the reference's columns (``COLUMNS`` of them), to verify."""
        return tuple(np.asarray(a) for a in got)


def tree_files(directory: str | os.PathLike[str]) -> list[Path]:
    root = Path(directory)
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*") if p.is_file())


def bytes_of(files: Iterable[Path]) -> int:
    return sum(p.stat().st_size for p in files)


def require(module: str) -> Any:
    """Import a peer's library, or one clear error naming it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise PacklabError(f"{module} cannot be imported: {exc}") from None


def arrow_table(reference: Reference) -> Any:
    """The bins as one Arrow table of three list columns (one chunk), the schema packlab's
    Parquet and Arrow IPC use."""
    import pyarrow as pa

    c = reference.columns
    tok = pa.array(c.token_offsets.astype(np.int32))
    seq = pa.array(c.seq_offsets.astype(np.int32))
    return pa.table({
        "input_ids": pa.ListArray.from_arrays(tok, pa.array(c.input_ids, pa.int32())),
        "loss_mask": pa.ListArray.from_arrays(tok, pa.array(c.loss_mask, pa.uint8())),
        "seq_start_id": pa.ListArray.from_arrays(seq, pa.array(c.seq_start_id, pa.int32())),
    })


def list_cell(column: Any) -> np.ndarray:
    """The one list value of a one-row Arrow column (chunked or not), as numpy (zero-copy
    where Arrow allows)."""
    if hasattr(column, "num_chunks"):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column.flatten().to_numpy(zero_copy_only=False)


def table_row(table: Any, names: Sequence[str] = COLUMNS) -> list[np.ndarray]:
    """The columns of a one-row Arrow table as numpy arrays."""
    return [list_cell(table.column(name)) for name in names]
