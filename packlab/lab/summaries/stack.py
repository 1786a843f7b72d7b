"""packlab's answer beside what the training stack reads today, with the run's numbers.

Two things, both printed by the report and the README: what each stack reads, released,
proposed or planned (:func:`stack_inputs_table`, from :mod:`packlab.formats.shared.stacks`), and
packlab's recommendation for local training set beside packed Parquet as Megatron-Bridge reads
it (its one-row-group cache under a shuffled epoch, notebook 05) and beside the planned prefix
path (a spool exported once as a Megatron prefix, repacked by index; notebook 03)
(:func:`beside_stack_table`). Each difference is judged with :mod:`.decide`'s bands: a step
notices it, or it ties.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packlab.formats import format_names, get_format
from packlab.formats.shared import stacks
from packlab.lab.measure.verdicts import NOT_MEASURED
from packlab.lab.records import RandomAccess, WriteFormats, of_run
from packlab.lab.summaries import decide, front
from packlab.lab.tables import fmt_us, human_bytes, markdown_table, times

Run = Mapping[str, Mapping[str, Any]]
#: notebook 05's epochs: Bridge's policy, and packlab's reader with its block shuffle
BRIDGE_EPOCH, PACKLAB_EPOCH = "today", "packlab"


def stack_inputs_table() -> str:
    """What each stack reads, as packlab last read it at its source."""
    return markdown_table(
        ["stack", "reads", "status", "read at", "where", "packlab writes it with"],
        [[i.stack, i.reads, f"**{i.status}**", i.at(), i.where, i.written_by]
         for i in stacks.INPUTS])


def released_defaults() -> list[tuple[stacks.StackInput, str]]:
    """What a released stack reads by default, with the packlab format that is it."""
    return [(i, f) for f in format_names() for i in get_format(f).Reader.STACK_INPUTS
            if i.released]


def _format_of(stack_input: stacks.StackInput) -> str | None:
    return next((f for f in format_names() if stack_input in get_format(f).Reader.STACK_INPUTS),
                None)


def _wait(value_us: float | None, ours_us: float | None, noticed: float) -> str:
    """A read beside the recommendation's: a tie, or how much more a step waits."""
    if value_us is None or ours_us is None:
        return ""
    limit = max(noticed, (decide.SPEED_FACTOR - 1) * ours_us)
    if abs(value_us - ours_us) <= limit:
        return " (a tie)"
    more = value_us - ours_us
    amount = f"{more / 1e3:,.1f} ms" if abs(more) >= 1e3 else f"{fmt_us(abs(more))} µs"
    return (f" (+{amount} a bin: a step notices)" if more > 0
            else f" ({amount} less a bin)")


def _memory(row: Mapping[str, Any] | None, ours: Mapping[str, Any]) -> str:
    if row is None or row["load_peak_bytes"] is None:
        return NOT_MEASURED
    node = row["load_peak_bytes"] * decide.PROCESSES_PER_NODE
    text = f"{human_bytes(node)} ({human_bytes(row['load_peak_bytes'])} a process)"
    if row is ours or ours["load_peak_bytes"] is None:
        return text
    more = node - ours["load_peak_bytes"] * decide.PROCESSES_PER_NODE
    return text + (" (a tie)" if abs(more) <= decide.NODE_MEMORY_BAND else
                   f" ({'+' if more > 0 else '−'}{human_bytes(abs(more))} a node: it counts)")


def _size(value: float | None, ours: float | None) -> str:
    if value is None:
        return NOT_MEASURED
    text = f"{value:.2f} B/token"
    if ours is None or value == ours:
        return text
    ratio = value / ours
    return text + (" (a tie)" if 1 / decide.SIZE_BAND <= ratio <= decide.SIZE_BAND
                   else f" ({ratio:.2f}x)")


def _reads(row: Mapping[str, Any] | None) -> str:
    if row is None or row["warm_p50_us"] is None:
        return NOT_MEASURED
    cold = (f"{fmt_us(row['cold_p50_us'])} µs" if row["cold_p50_us"] is not None
            else "n/a (loads all at open)")
    return f"warm {fmt_us(row['warm_p50_us'])} µs, cold {cold}"


def _bridge_epoch(run: Run, ours: Mapping[str, Any], noticed: float) -> str:
    """Bridge's policy over one shuffled epoch of notebook 05's Parquet shard, per bin."""
    access = of_run(run, RandomAccess)
    if access is None or BRIDGE_EPOCH not in access.epoch_seconds or not access.num_bins:
        return NOT_MEASURED
    per_bin = 1e6 * access.epoch_seconds[BRIDGE_EPOCH] / access.num_bins
    text = (f"{fmt_us(per_bin)} µs a bin, warm{_wait(per_bin, ours['warm_p50_us'], noticed)}: "
            f"one row group cached under a uniform shuffle, "
            f"{access.epoch_seconds[BRIDGE_EPOCH]:,.1f} s an epoch of {access.num_bins:,} bins")
    if PACKLAB_EPOCH in access.epoch_seconds and access.shuffled_epoch_speedup:
        ours_bin = 1e6 * access.epoch_seconds[PACKLAB_EPOCH] / access.num_bins
        text += (f"; packlab's reader of the same file with its block shuffle: "
                 f"{fmt_us(ours_bin)} µs a bin, {times(access.shuffled_epoch_speedup)} less")
    return text + " (notebook 05)"


def _prefix_bytes(writes: WriteFormats | None) -> str:
    if writes is None or writes.prefix_export_bytes is None or not writes.num_tokens:
        return "the exported prefix: not measured in this run"
    return (f"{writes.prefix_export_bytes / writes.num_tokens:.2f} B/token once (the prefix: "
            "tokens, masks, index), then an index a packing")


def _repacks(writes: WriteFormats | None, ours: Mapping[str, Any]
             ) -> tuple[str, str, str]:
    """A repack at another pack size: the recommendation, Parquet, and the prefix path."""
    rewrite = (f"rewrites every bin: {ours['bytes_per_token']:.2f} B/token again"
               if ours["bytes_per_token"] is not None else NOT_MEASURED)
    if writes is None or writes.repack_parquet_bytes is None:
        return rewrite, NOT_MEASURED, NOT_MEASURED
    parquet = (f"rewrites every bin: {human_bytes(writes.repack_parquet_bytes)} in "
               f"{writes.repack_parquet_seconds:.2f} s (notebook 03)")
    if writes.prefix_repack_bytes is not None:
        prefix = (f"the index only: {human_bytes(writes.prefix_repack_bytes)} in "
                  f"{writes.prefix_repack_seconds:.2f} s over the prefix, after one export of "
                  f"{human_bytes(writes.prefix_export_bytes)} in "
                  f"{writes.prefix_export_seconds:.2f} s (notebook 03)")
    elif writes.repack_index_bytes is not None:
        prefix = (f"the index only: {human_bytes(writes.repack_index_bytes)} in "
                  f"{writes.repack_index_seconds:.2f} s over a spool (notebook 03; this run "
                  "did not repack over an exported prefix)")
    else:
        prefix = NOT_MEASURED
    return rewrite, parquet, prefix


def beside_stack(run: Run) -> dict[str, Any] | None:
    """Local training's recommendation beside packed Parquet as Bridge reads it and beside the
    prefix path, aspect by aspect: ``{"local", "parquet", "index", "aspects": [(aspect, ours,
    Bridge's, the prefix path's)]}``; None when local training was not decided."""
    rows = {r["format"]: r for r in front.format_rows(run)}
    local = next(c for c in front.recommendations(run) if c["use_case"] == "local training")
    if local["format"] is None:
        return None
    ours = rows[local["format"]]
    parquet_name, index_name = _format_of(stacks.PACKED_PARQUET), next(
        (f for f in format_names() if get_format(f).Reader.NEEDS_SPOOL), None)
    parquet = rows.get(parquet_name) if parquet_name else None
    index = rows.get(index_name) if index_name else None
    noticed = decide.noticed_us(front.pack_size_of(run))
    writes = of_run(run, WriteFormats)
    repack = _repacks(writes, ours)
    readers = ", ".join(ours["token_readers"]) or "packlab only"
    defaults = [i for i in ours["stack_inputs"] if i.released]
    default = ("; " + ", ".join(f"{i.stack}'s default ({i.status})" for i in defaults)
               if defaults else "; no released stack reads it as packed SFT by default")
    prefix, plan = stacks.PRETOKENIZED_PREFIX, stacks.PREPARED_PLAN
    aspects = [
        ("who reads it", readers + default,
         f"{stacks.BRIDGE} {stacks.PACKED_PARQUET.version} (its default, "
         f"{stacks.PACKED_PARQUET.status}), "
         + ", ".join(r for r in (parquet or {}).get("token_readers", [])
                     if r != stacks.BRIDGE),
         f"{prefix.stack}'s `SFTDataset` ({prefix.change}, {prefix.status}); {plan.stack} "
         f"plans it (its `data-preparation.md` at `{plan.commit}`); megatron-core's `IndexedDataset` reads the prefix"),
        ("a random bin, shuffled", f"{_reads(ours)} (notebook 05)",
         _bridge_epoch(run, ours, noticed),
         f"`{index_name}` over its tokens: {_reads(index)}"
         + (_wait(index["cold_p50_us"], ours["cold_p50_us"], noticed) if index else "")
         + f" (notebook 05, over a spool; {stacks.MEGATRON_LM} packs online, not measured)"),
        (f"memory per node ({decide.PROCESSES_PER_NODE} processes)", _memory(ours, ours),
         f"packlab's Parquet reader: {_memory(parquet, ours)}",
         f"`{index_name}`: {_memory(index, ours)}"),
        ("bytes on disk", _size(ours["bytes_per_token"], None),
         _size(parquet["bytes_per_token"] if parquet else None, ours["bytes_per_token"]),
         _prefix_bytes(writes)),
        ("a repack at another pack size", *repack),
    ]
    return {"local": local["format"], "parquet": parquet_name, "index": index_name,
            "aspects": aspects}


def beside_stack_table(run: Run) -> str:
    beside = beside_stack(run)
    if beside is None:
        return NOT_MEASURED
    return markdown_table(
        ["", f"packlab's recommendation for local training: `{beside['local']}`",
         f"packed Parquet as {stacks.BRIDGE} {stacks.BRIDGE_RELEASE} reads it "
         f"(`{beside['parquet']}`)",
         f"the planned prefix path: `packlab export` once, `{beside['index']}` to repack"],
        [list(a) for a in beside["aspects"]])
