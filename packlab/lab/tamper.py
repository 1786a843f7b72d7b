"""Break one bin of a Parquet shard on purpose, to show that the checks find it.

packlab's writers refuse an invalid bin, so a broken shard is made here with pyarrow directly:
the file is rewritten with one bin changed and the same schema and footer metadata (counts
unchanged), exactly what a buggy external writer could produce. For demonstrations and tests,
never for data.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

from packlab.errors import PacklabError

RULES = ("loss_crosses_boundary", "starts_not_increasing", "loss_mask_not_binary")


def break_bin(path: str | os.PathLike[str], row: int, rule: str) -> None:
    """Rewrite ``path`` (a Parquet shard) so that bin ``row`` breaks ``rule``.

    ``loss_crosses_boundary`` sets the loss mask on the last token of the first sub-sequence,
    ``starts_not_increasing`` swaps two starts, ``loss_mask_not_binary`` writes a 2.
    The first two need a bin with at least two (three) sub-sequences.
    """
    if rule not in RULES:
        raise PacklabError(f"rule must be one of {RULES}, got {rule!r}")
    target = Path(path).resolve()  # a layout link: rewrite the shard it points to
    table = pq.read_table(target)
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    mask, starts = cols["loss_mask"][row], cols["seq_start_id"][row]
    need = {"loss_crosses_boundary": 2, "starts_not_increasing": 3}.get(rule, 1)
    if len(starts) < need:
        raise PacklabError(f"{path}: bin {row} has {len(starts)} sub-sequence(s); {rule} "
                           f"needs {need}")
    if rule == "loss_crosses_boundary":
        mask[starts[1] - 1] = 1
    elif rule == "starts_not_increasing":
        starts[1], starts[2] = starts[2], starts[1]
    else:
        mask[0] = 2
    pq.write_table(pa.table(cols, schema=table.schema), target)


def bin_with_sequences(path: str | os.PathLike[str], at_least: int) -> int:
    """The first bin of a Parquet shard with at least ``at_least`` sub-sequences."""
    starts = pq.read_table(Path(path).resolve(), columns=["seq_start_id"]).column(0)
    for row, n in enumerate(pa.compute.list_value_length(starts).to_pylist()):
        if n >= at_least:
            return row
    raise PacklabError(f"{path}: no bin has {at_least} or more sub-sequences")
