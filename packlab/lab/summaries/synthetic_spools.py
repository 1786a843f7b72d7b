"""Notebook 01's summary: the synthetic spools beside real chat text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packlab.lab.records.synthetic_spools import SyntheticSpools


def bullets(n: SyntheticSpools, p: Mapping[str, Any]) -> list[str]:
    closest = n.closest_profile_to_real
    ks = n.ks_real
    return [
        f"**Lengths.** Over {p['length_sequences']:,} sequences, `chat` has median "
        f"{n.chat_length_p50:,.0f} and mean {n.chat_length_mean:,.0f} tokens, p99 "
        f"{n.chat_length_p99:,.0f}; {n.chat_over_4096:.1%} exceed 4096 tokens and "
        f"{n.chat_over_8192:.1%} exceed 8192, so packing meets over-long sequences.",
        f"**Real text.** The docstring corpus ({n.real_num_sequences:,} conversations) has "
        f"median {n.real_length_p50:,.0f} tokens and p99 {n.real_length_p99:,.0f}, "
        f"closest to the `{closest}` profile (KS distance {ks[closest]:.2f}; `chat` "
        f"{ks['chat']:.2f}). Its mask fraction is {n.real_mask_fraction:.0%} (`chat` "
        f"{n.chat_mask_fraction:.0%}, `short` {n.short_mask_fraction:.0%}).",
        f"**Tokens.** Order-0 entropy: `chat` {n.chat_entropy_bits:.2f} bits/token, real "
        f"text {n.real_entropy_bits:.2f} (from only {n.real_num_tokens:,} tokens: a small "
        f"sample underestimates it), `uniform` {n.uniform_entropy_bits:.2f}. The most "
        f"frequent token is {n.top_token_share['chat']:.1%} of `chat` tokens and "
        f"{n.top_token_share['real']:.1%} of real ones; by entropy the Zipf model is "
        f"{'closer to' if n.zipf_closer else 'no closer to'} real BPE text than uniform ids. "
        f"The real corpus uses only {n.distinct_ids['real']:,} distinct ids (`chat`: "
        f"{n.distinct_ids['chat']:,}), so its curve stops early.",
        f"**On disk.** A spool costs {n.chat_bytes_per_token:.2f} bytes per token (4 token, "
        f"1 mask, 12 per sequence). `chat` was written at "
        f"{n.chat_synth_tokens_per_second / 1e6:.1f} M tokens/s here.",
    ] + _tokenizing(n)


def _tokenizing(n: Mapping[str, Any]) -> list[str]:
    if n.tokenize_bpe_tokens_per_cpu_second is None:
        return []
    most = n.tokenize_max_workers
    return [
        f"**Tokenizing.** One core tokenizes {n.tokenize_bpe_tokens_per_cpu_second / 1e6:.2f}M "
        "tokens per CPU second with bpe-openai and "
        f"{n.tokenize_hf_tokens_per_cpu_second / 1e6:.2f}M with the Hugging Face BPE and the "
        "`llama3` template (its tokenizer alone: "
        f"{n.tokenize_hf_floor_tokens_per_cpu_second / 1e6:.2f}M): 13B tokens take "
        f"{n.tokenize_hours_13b_1_cores_bpe:.1f} h and {n.tokenize_hours_13b_1_cores_hf:.1f} h "
        f"on one core, {n.tokenize_hours_13b_32_cores_bpe:.2f} h and "
        f"{n.tokenize_hours_13b_32_cores_hf:.2f} h on 32 (at the CPU rate of {most} workers). "
        f"{most} workers got {n.tokenize_bpe_cpu_efficiency:.0%} and "
        f"{n.tokenize_hf_cpu_efficiency:.0%} of one worker's tokens per CPU second, ran "
        f"{n.tokenize_bpe_speedup:.2f}x and {n.tokenize_hf_speedup:.2f}x faster by the wall "
        f"clock (load average {n.tokenize_load_average:.1f} on {(n.cpu_count if n.cpu_count is not None else '?')} "
        "cores: the wall clock measures the neighbours as much as us) and wrote "
        f"{'the same' if n.tokenize_same_bytes else 'different'} spool bytes as one worker. "
        f"{n.tokenize_unlocated} corpus records were unlocated across the four templates.",
    ]
