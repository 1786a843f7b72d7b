"""Notebook 06's summary: bytes per token per format, the RFC's compression claims, and the
smallest Parquet encoding that still reads as fast."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packlab.lab.records.compression import Compression

#: the label of today's Parquet (the RFC's, Nemotron's) among the sizes per format
TODAY = "parquet dictionary"


def default_bullet(n: Mapping[str, Any]) -> str:
    """The writer's default encoding against today's, from the numbers that chose it."""
    d, small = n.default_layout, n.smallest_layout
    saving = d["saving"]
    chosen = ("the encoding the numbers choose" if d["chosen_by_numbers"]
              else f"**not** the encoding the numbers choose (`{n.balanced['real']['layout']}`)")
    return (f"**packlab's default** (`encoding=\"{d['name']}\"`, `{d['layout']}`), {chosen}: on "
            f"real text {saving['real']:.1%} smaller than today's zstd Parquet (chat "
            f"{saving['chat']:+.1%}, uniform ids {saving['uniform']:+.1%}: synthetic ids have no "
            f"repeats for PLAIN tokens to find), read rate {d['read_vs_reference']:.2f}x, written "
            f"{d['write_slowdown']:.1f}x slower ({d['write_tokens_per_s'] / 1e6:.1f} M tokens per "
            f"CPU second). zstd-19 (`encoding=\"smallest\"`, {small['bits_per_token']:.2f} "
            f"bits/token on real text against the default's {d['bits_per_token']:.2f}) writes "
            f"{small['write_slowdown']:.0f}x slower than today; `encoding=\"dictionary\"` writes "
            "today's encoding. Standard encodings only: DuckDB, polars, Hugging Face datasets and "
            "Megatron-Bridge read every encoding unchanged (packlab's tests).")


def bullets(n: Compression, p: Mapping[str, Any]) -> list[str]:
    per_token, kinds = n.bytes_per_token, list(n.bytes_per_token)
    pvl, mvl, zstd = n.parquet_vs_legacy, n.memmap_vs_legacy, n.zstd_ratio_to_raw
    padding = n.memmap_padding
    best, balanced, rfc = n.smallest_fast, n.balanced, n.rfc_layout
    real = best["real"]
    fast = "reads as fast" if real["read_vs_reference"] >= p["read_tolerance"] else "reads slower"
    out = [
        f"**Every format** (chat data): legacy {per_token['chat']['legacy_npy_pickle']:.2f} "
        f"B/token, memmap {per_token['chat']['memmap_v1']:.2f} ({mvl['chat']:.2f}x legacy at "
        f"{n.pack_efficiency['chat']:.1%} pack efficiency), today's zstd Parquet "
        f"{per_token['chat'][TODAY]:.2f} ({pvl['chat']:.2f}x legacy), packlab's default "
        f"Parquet {per_token['chat']['parquet']:.2f}. The legacy pickle's size depends on the ids "
        "(pickle writes small ints in fewer bytes): today's Parquet/legacy is "
        f"{pvl['uniform']:.2f}x on uniform ids, {pvl['real']:.2f}x on real text.",
        f"**Padding**: memmap bytes follow 5 B / efficiency (measured "
        f"{min(r['bytes_per_token'] for r in padding):.2f} to "
        f"{max(r['bytes_per_token'] for r in padding):.2f} B/token over efficiencies "
        f"{min(r['efficiency'] for r in padding):.0%} to "
        f"{max(r['efficiency'] for r in padding):.0%}).",
        f"**zstd**: today's Parquet is {zstd['real']:.2f}x smaller than the raw bins on real "
        f"text, {zstd['chat']:.2f}x on chat, {zstd['uniform']:.2f}x on uniform ids; against "
        "Parquet without a codec only " + ", ".join(
            f"{r['codec']} {r['ratio']:.2f}x" for r in n.codec_table if r["codec"] != "none")
        + " (pyarrow's dictionary encoding has already done most of the work).",
        f"**Smallest encoding that reads as fast** (decode rate at least "
        f"{p['read_tolerance']:.0%} of the RFC encoding's): "
        + ", ".join(f"{k} `{best[k]['layout']}`" for k in kinds)
        + f". On real text it is **{real['saving']:.1%} smaller** than today's zstd Parquet "
        f"({real['bits_per_token']:.2f} against {rfc['real']['bits_per_token']:.2f} bits/token) "
        f"and {fast} ({real['read_vs_reference']:.2f}x the read rate); it writes at "
        f"{real['write_vs_reference']:.2f}x the rate. Writing at least "
        f"{p['write_tolerance']:.0%} as fast as today: `{balanced['real']['layout']}`, "
        f"{balanced['real']['saving']:.1%} smaller, read rate "
        f"{balanced['real']['read_vs_reference']:.2f}x, write rate "
        f"{balanced['real']['write_vs_reference']:.2f}x.",
        "**Against the entropy**: the smallest fast encoding's token column is "
        + ", ".join(f"{k} {n.smallest_fast_tokens_to_entropy[k]:.2f}x" for k in kinds)
        + " the order-0 entropy; the whole shard (mask and starts included) "
        + ", ".join(f"{k} {n.smallest_fast_to_entropy[k]:.2f}x" for k in kinds)
        + ". Real text goes below the order-0 entropy (zstd finds repeats); Zipf ids (chat) "
        f"stay near the byte-plane entropy ({n.byte_plane_entropy_bits['chat']:.2f} bits), "
        "as far as byte-wise coding reaches.",
    ]
    if n.default_layout is not None:
        out.insert(4, default_bullet(n))
    gain = max(n.uint16_gain_uniform.values())
    uniform = per_token["uniform"]
    out.append(f"**uint16 tokens** do not shrink Parquet (stored as INT32; at most {gain:+.1%} "
               "here); they halve `binidx`" + (
                   f" ({uniform['binidx']:.2f} against {uniform['binidx int32']:.2f} B/token on "
                   "uniform ids)." if "binidx int32" in uniform else "."))
    return out
