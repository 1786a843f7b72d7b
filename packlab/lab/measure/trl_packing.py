"""TRL's BFD packing (``trl.pack_dataset(strategy="bfd")``) run on packlab's lengths.

TRL packs a ``datasets.Dataset`` of token lists, not lengths, and returns packed rows, not an
assignment. Here each sequence's tokens are its own index (int32, as many as its length), so
the packed rows say which sequence went into which bin, in TRL's order: BFD reads only the
lengths, so this is the assignment TRL gives any sequences of those lengths (what
``SFTTrainer(packing=True)`` builds; ``tests/test_hf_train.py`` checks it against the trainer's
own packed dataset). Over-long sequences are cut to ``pack_size``, as TRL's ``bfd`` does and
packlab's ``overlong="truncate"``.

``map_batch_size``: TRL packs inside ``Dataset.map(batched=True)``, so each map batch is packed
on its own: ``SFTTrainer`` leaves ``datasets``' default of 1,000 sequences
(:data:`SFT_TRAINER_MAP_BATCH`); ``None`` packs everything as one batch. Its seconds include
moving the token lists into their rows, which packlab's ``pack`` leaves to the writer.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packlab.errors import PacklabError
from packlab.lab.hf_quiet import quiet
from packlab.lab.measure.verdicts import holds
from packlab.lab.results import finding
from packlab.packing import BinAssignment, check_lengths, check_pack_size, compare_algorithms

#: the map batch ``SFTTrainer`` packs in (``datasets.Dataset.map``'s default ``batch_size``)
SFT_TRAINER_MAP_BATCH = 1000


def trl_bfd(lengths: np.ndarray, pack_size: int, *,
            map_batch_size: int | None = SFT_TRAINER_MAP_BATCH) -> tuple[BinAssignment, float]:
    """TRL's BFD bins for sequences of ``lengths`` as a :class:`BinAssignment`, and the seconds
    ``pack_dataset`` took."""
    import datasets
    from trl import pack_dataset

    lengths = check_lengths(lengths)
    pack_size = check_pack_size(pack_size)
    total = int(lengths.sum())
    if total >= 2**31:
        raise PacklabError(f"trl_bfd: {total:,} tokens do not fit one Arrow list column")
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    values = np.repeat(np.arange(lengths.shape[0], dtype=np.int32), lengths)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    dataset = datasets.Dataset(pa.table({"input_ids": column}))
    with quiet():
        began = time.perf_counter()
        packed = pack_dataset(dataset, pack_size, "bfd", {"batch_size": map_batch_size})
        seconds = time.perf_counter() - began
    return assignment_of_rows(packed.data.table, pack_size), seconds


def assignment_of_rows(table: pa.Table, pack_size: int) -> BinAssignment:
    """The bins of TRL's packed rows whose tokens are sequence indices: row ``b`` is bin ``b``,
    its sequences those whose first token starts each of its ``seq_lengths``."""
    seq_lengths = table.column("seq_lengths").combine_chunks()
    tokens = pc.list_flatten(table.column("input_ids").combine_chunks()).to_numpy()
    sub = pc.list_flatten(seq_lengths).to_numpy().astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(sub)[:-1]))
    counts = pc.list_value_length(seq_lengths).to_numpy().astype(np.int64)
    bin_offsets = np.concatenate(([0], np.cumsum(counts)))
    return BinAssignment(bin_offsets, tokens[starts].astype(np.int64), pack_size, "truncate")


def packing_row(name: str, assignment: BinAssignment, lengths: np.ndarray, seconds: float
                ) -> dict[str, Any]:
    """What notebook 02 shows of a packing: bins against the lower bound, fill, seconds."""
    tokens = int(assignment.bin_lengths(lengths).sum())
    lower = -(-tokens // assignment.pack_size)
    per_bin = assignment.seqs_per_bin()
    return {"packer": name, "num_bins": assignment.num_bins, "lower_bound_bins": lower,
            "bins_over_lower_bound": assignment.num_bins / lower - 1,
            "fill": tokens / (assignment.num_bins * assignment.pack_size),
            "seconds": float(seconds), "mean_seqs_per_bin": float(per_bin.mean()),
            "max_seqs_per_bin": int(per_bin.max())}


def beside_trl(lengths: np.ndarray, pack_size: int, *, seed: int = 0, repeats: int = 1
               ) -> list[dict[str, Any]]:
    """Every packlab packer and TRL's BFD (as ``SFTTrainer`` packs, and in one map batch) on
    the same lengths: one :func:`packing_row` each, seconds the median of ``repeats`` runs."""
    rows = [packing_row(name, assignment, lengths, report.seconds)
            for name, (assignment, report) in compare_algorithms(
                lengths, pack_size, seed=seed, repeats=repeats).items()]
    for label, batch in ((f"trl_bfd (map batches of {SFT_TRAINER_MAP_BATCH:,})",
                          SFT_TRAINER_MAP_BATCH), ("trl_bfd (one batch)", None)):
        runs = [trl_bfd(lengths, pack_size, map_batch_size=batch) for _ in range(repeats)]
        rows.append(packing_row(label, runs[-1][0], lengths,
                                float(np.median([s for _, s in runs]))))
    return rows


def trl_findings(rows: Mapping[str, Mapping[str, Any]]) -> list[dict[str, str]]:
    """Notebook 02's claims on :func:`beside_trl`'s rows (by packer)."""
    trainer = rows[f"trl_bfd (map batches of {SFT_TRAINER_MAP_BATCH:,})"]
    whole = rows["trl_bfd (one batch)"]
    ours = {name: r for name, r in rows.items() if not name.startswith("trl_bfd")}
    best = min(ours, key=lambda name: (ours[name]["num_bins"], ours[name]["seconds"]))
    fastest = min(("first_fit_decreasing", "best_fit_decreasing"),
                  key=lambda name: ours[name]["seconds"])
    return [
        finding("packlab's decreasing packers use no more bins than TRL's BFD on the same "
                "lengths",
                f"{best} {ours[best]['num_bins']:,} bins; TRL {whole['num_bins']:,} in one "
                f"batch, {trainer['num_bins']:,} as SFTTrainer packs (map batches of "
                f"{SFT_TRAINER_MAP_BATCH:,})",
                holds(min(ours["first_fit_decreasing"]["num_bins"],
                          ours["best_fit_decreasing"]["num_bins"]) <= whole["num_bins"])),
        finding("SFTTrainer's packing, one map batch at a time, costs bins",
                f"{trainer['num_bins']:,} bins against {whole['num_bins']:,} in one batch "
                f"({trainer['num_bins'] / whole['num_bins'] - 1:+.2%}; fill "
                f"{trainer['fill']:.4f} against {whole['fill']:.4f})",
                holds(trainer["num_bins"] > whole["num_bins"])),
        finding("packlab plans the bins faster than TRL's pack_dataset packs them (TRL's time "
                "includes moving the tokens)",
                f"{fastest} {ours[fastest]['seconds']:.3f} s; TRL {trainer['seconds']:.3f} s "
                f"as SFTTrainer packs, {whole['seconds']:.3f} s in one batch",
                holds(ours[fastest]["seconds"] < min(trainer["seconds"], whole["seconds"]))),
    ]
