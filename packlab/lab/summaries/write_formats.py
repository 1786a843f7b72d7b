"""Notebook 03's summary: one packing written in every format, bin for bin the same."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packlab.lab.records.write_formats import WriteFormats


def bullets(n: WriteFormats, p: Mapping[str, Any]) -> list[str]:
    per_token = n.bytes_per_token
    stored = {f: v for f, v in per_token.items() if f not in (n.by_reference if n.by_reference is not None else [])}
    smallest = min(stored, key=stored.get)
    largest = max(per_token, key=per_token.get)
    out = [
        f"Every registered format ({n.num_formats}) validated and stored the same "
        f"{n.num_bins:,} bins: **{n.bins_differing == 0}** (bins differing: "
        f"{n.bins_differing}).",
        f"Smallest format that stores its tokens: **{smallest}** at {per_token[smallest]:.2f} "
        f"B/token; largest: **{largest}** at {per_token[largest]:.2f} B/token (raw unpadded "
        f"{n.raw_bytes_per_token:.2f} B/token).",
        f"Conversion round trip {' → '.join(n.roundtrip_chain)}: identical bins "
        f"**{n.roundtrip_identical}**.",
    ]
    if n.repack_index_bytes is not None:
        out.append(
            f"Repacking at pack size {p['repack_size']:,} through `packed_index`: "
            f"{n.repack_index_bytes:,} B of index in {n.repack_index_seconds:.2f} s, "
            f"against {n.repack_parquet_bytes:,} B in {n.repack_parquet_seconds:.2f} s to "
            f"rewrite the bins as Parquet; bins identical: **{n.repack_identical}**.")
    if n.prefix_repack_bytes is not None:
        out.append(
            f"The prefix path: the spool exported once as a Megatron prefix, "
            f"{n.prefix_export_bytes:,} B in {n.prefix_export_seconds:.2f} s; a repack over it "
            f"{n.prefix_repack_bytes:,} B of index in {n.prefix_repack_seconds:.2f} s; bins "
            f"identical to the Parquet repack: **{n.prefix_repack_identical}**.")
    return out
