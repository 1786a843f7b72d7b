"""Synthetic spools: seeded, streamed, and shaped like the SFT data packing has to deal with.

Packing efficiency depends on the length distribution, compression on the token statistics,
and the loss mask on the chat structure; a test spool of uniform random tokens gets all three
wrong. The profiles below model each one, with numbers taken from public SFT corpora (and
checked against real text through ``cl100k_base`` in notebook 01).

Profiles (``PROFILES``; every number is a field of :class:`Profile`):

``uniform``
    Lengths uniform in [16, 2048] (mean ~1032, close to ``chat``'s mean but with no tail),
    token ids uniform over a 50000 vocabulary, masks uniform random 0/1. WHY: what the design
    documents' tests generate; the baseline every other profile is compared with.
``chat`` (the default)
    WHY: a realistic multi-turn SFT mix (Tulu-3 / UltraChat / Nemotron post-training style).
    *Lengths*: 95% from a lognormal body, median 512 tokens, sigma 1.0 (p10 ~140, p90 ~1840),
    like single- and multi-turn chat; 5% from a truncated Pareto tail, alpha 1.5 between 2048
    and 32768, like long reasoning traces, code and tool-use transcripts; clipped to
    [16, 32768]. Mean ~1040 tokens; ~3.5% of sequences exceed 4096 and ~1% exceed 8192, so
    the over-long policy and the packing of long sequences are exercised.
    *Structure*: ``<bos>``, an optional system turn (30%), then 1 + Geometric(0.45) user /
    assistant turn pairs (mean ~2.2, at most 8). A turn is ``<start_header> <role> content...
    <end_of_turn>``. Content is split between turns by exponential weights scaled by the role
    (system 0.5, user 1, assistant 3: replies are longer than questions), each turn at least
    one content token. *Mask*: 1 on assistant content and the assistant's ``<end_of_turn>``
    (the model must learn to stop), 0 on ``<bos>``, every header, system and user turn.
    *Tokens*: Zipf-Mandelbrot frequencies ``p(rank) ~ 1 / (rank + 2.7) ** 1.1`` over the
    content ids (fitted to cl100k_base docstring text: p(1) ~4%, p(10) ~1%, p(100) ~0.1%;
    order-0 entropy ~11.4 bits/token). Ranks map to ids by a fixed, loosely monotone
    permutation (sort of ``log rank + 2 * N(0, 1)``): frequent tokens get small ids, as merge
    order gives them in a BPE vocabulary (median id of the 100 most frequent tokens ~300;
    cl100k on real text: ~440). Vocabulary 131072 (Nemotron / Mistral-NeMo size); the top
    ``NUM_SPECIAL`` ids are reserved for the special tokens (:func:`special_tokens`).
``short``
    Single-turn instruction data (Alpaca / Dolly / FLAN style): lognormal median 160, sigma
    0.8, clipped to [16, 2048], no system turn, assistant weight 2. WHY: many tiny sequences
    are where per-sequence overheads (boundaries, ``seq_start_id``) dominate.
``long``
    Long-context SFT (document QA, summarization): lognormal median 12288, sigma 0.5, clipped
    to [2048, 65536]; 1 + Geometric(0.7) turns (at most 4), 20% with a system turn; the user
    turn carries the document (user weight 8, assistant 1). WHY: bins of 16k-64k tokens and
    sequences longer than typical pack sizes.

Determinism: the spool is a function of (profile, vocab_size, seed, num_sequences) only, and
its first ``n`` sequences do not depend on ``num_sequences`` either. Lengths are drawn per
block of ``LENGTH_BLOCK`` sequences and everything else per group of ``GROUP`` sequences, each
from its own ``SeedSequence(seed, spawn_key=...)``; ``chunk_sequences`` only sets how many
sequences one vectorized step builds (memory), never the result.

Memory: one chunk (about ``CHUNK_TOKENS`` tokens) at a time, so peak memory is flat in
``num_sequences``: 13M sequences never sit in memory.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from packlab.errors import PacklabError
from packlab.progress import progress
from packlab.spool import SpoolReader, SpoolWriter

LENGTH_BLOCK = 1 << 16  # sequences per lengths seed block (a multiple of GROUP)
GROUP = 64  # sequences per content seed group
CHUNK_TOKENS = 1 << 20  # tokens one vectorized step aims at (memory bound)
MAX_VOCAB = 1 << 20  # the Zipf alias table is built once per vocabulary, in Python

# Special tokens, at the top of the vocabulary: vocab_size - NUM_SPECIAL + index.
SPECIAL_NAMES = (
    "<|bos|>",
    "<|start_header|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end_of_turn|>",
    "<|pad|>",
    "<|reserved|>",
)
NUM_SPECIAL = len(SPECIAL_NAMES)
_BOS, _HEADER, _SYSTEM, _USER, _ASSISTANT, _EOT = range(6)

_STREAM_LENGTHS, _STREAM_STRUCTURE, _STREAM_TOKENS = 0, 1, 2
_PERMUTATION_SEED = 20241121  # the "language": the same rank -> id map for every seed


@dataclass(frozen=True)
class LengthModel:
    """Sequence lengths: ``uniform`` in [min_len, max_len], or a lognormal body with an
    optional truncated Pareto tail, rounded and clipped to [min_len, max_len]."""

    kind: str  # "uniform" | "lognormal"
    min_len: int
    max_len: int
    median: float = 0.0
    sigma: float = 0.0
    tail_fraction: float = 0.0
    tail_min: float = 0.0
    tail_alpha: float = 1.5


@dataclass(frozen=True)
class ChatModel:
    """Multi-turn chat structure: turn pairs 1 + Geometric(turn_p) capped at max_turns, a system
    turn with probability system_prob, content split by exponential weights times role factor."""

    turn_p: float = 0.45
    max_turns: int = 8
    system_prob: float = 0.3
    system_weight: float = 0.5
    user_weight: float = 1.0
    assistant_weight: float = 3.0


@dataclass(frozen=True)
class Profile:
    """One synthetic profile: lengths, (optional) chat structure, token statistics."""

    name: str
    description: str
    lengths: LengthModel
    vocab_size: int = 131_072
    chat: ChatModel | None = None  # None: uniform random tokens and random 0/1 masks
    zipf_a: float = 1.1
    zipf_q: float = 2.7
    id_noise: float = 2.0


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "uniform",
            "uniform lengths 16..2048, uniform random tokens (vocab 50000) and 0/1 masks: "
            "the design documents' test data",
            LengthModel("uniform", 16, 2048),
            vocab_size=50_000,
        ),
        Profile(
            "chat",
            "multi-turn chat: lognormal lengths (median 512) + 5% Pareto tail to 32768, "
            "chat template, assistant-only mask, Zipf tokens over 131072 ids",
            LengthModel("lognormal", 16, 32_768, median=512, sigma=1.0,
                        tail_fraction=0.05, tail_min=2048, tail_alpha=1.5),
            chat=ChatModel(),
        ),
        Profile(
            "short",
            "single-turn instructions: lognormal lengths (median 160) clipped to 16..2048",
            LengthModel("lognormal", 16, 2048, median=160, sigma=0.8),
            chat=ChatModel(turn_p=1.0, max_turns=1, system_prob=0.0, assistant_weight=2.0),
        ),
        Profile(
            "long",
            "long-context QA: lognormal lengths (median 12288) clipped to 2048..65536, "
            "the document in the user turn",
            LengthModel("lognormal", 2048, 65_536, median=12_288, sigma=0.5),
            chat=ChatModel(turn_p=0.7, max_turns=4, system_prob=0.2, system_weight=0.2,
                           user_weight=8.0, assistant_weight=1.0),
        ),
    )
}


def get_profile(profile: str | Profile) -> Profile:
    """A registered profile by name, or a custom :class:`Profile` after a sanity check."""
    if not isinstance(profile, Profile):
        try:
            return PROFILES[profile]
        except (KeyError, TypeError):
            raise PacklabError(
                f"unknown synthetic profile {profile!r}; choose from {', '.join(PROFILES)}"
            ) from None
    model = profile.lengths
    shortest = 9 if profile.chat is not None else 1  # <bos> + two turns of 1 content token
    if not shortest <= model.min_len <= model.max_len or model.kind not in ("uniform",
                                                                             "lognormal"):
        raise PacklabError(f"profile {profile.name!r}: lengths must be {model.kind} in "
                           f"[{shortest}, max_len], got [{model.min_len}, {model.max_len}]")
    return profile


def special_tokens(vocab_size: int) -> dict[str, int]:
    """The reserved special token ids of a chat profile's vocabulary (the top ids)."""
    base = vocab_size - NUM_SPECIAL
    return {name: base + i for i, name in enumerate(SPECIAL_NAMES)}


# -- lengths ---------------------------------------------------------------------------------


def _rng(seed: int, stream: int, index: int) -> np.random.Generator:
    sequence = np.random.SeedSequence(seed, spawn_key=(stream, index))
    return np.random.Generator(np.random.PCG64(sequence))


def _block_lengths(model: LengthModel, seed: int, block: int, n: int) -> np.ndarray:
    """Lengths of the first ``n`` sequences of lengths block ``block`` (int64).

    Each sequence takes its own row of four uniforms, so the first ``k`` lengths do not depend
    on ``n`` (one call per stream; numpy fills arrays in order).
    """
    u = _rng(seed, _STREAM_LENGTHS, block).random((n, 4))
    if model.kind == "uniform":
        x = model.min_len + np.floor(u[:, 0] * (model.max_len - model.min_len + 1))
    else:  # lognormal body by Box-Muller, then the truncated Pareto tail by inversion
        z = np.sqrt(-2.0 * np.log1p(-u[:, 0])) * np.cos(2.0 * np.pi * u[:, 1])
        x = np.exp(math.log(model.median) + model.sigma * z)
        if model.tail_fraction > 0:
            ratio = (model.tail_min / model.max_len) ** model.tail_alpha
            tail = model.tail_min / (1.0 - u[:, 3] * (1.0 - ratio)) ** (1.0 / model.tail_alpha)
            x = np.where(u[:, 2] < model.tail_fraction, tail, x)
    return np.clip(np.rint(x), model.min_len, model.max_len).astype(np.int64)


def _check_count(num_sequences: int, where: str) -> int:
    if isinstance(num_sequences, bool) or not isinstance(num_sequences, int | np.integer):
        raise PacklabError(f"{where}: num_sequences must be an integer, got {num_sequences!r}")
    if num_sequences <= 0:
        raise PacklabError(f"{where}: num_sequences must be positive, got {num_sequences}")
    return int(num_sequences)


def synth_lengths(num_sequences: int, profile: str = "chat", seed: int = 0) -> np.ndarray:
    """Only the lengths (int64) of the spool ``synthesize`` would write: cheap at 13M scale.

    ``synth_lengths(n, p, s)`` equals ``synthesize(..., num_sequences=n, profile=p,
    seed=s).lengths`` exactly.
    """
    n = _check_count(num_sequences, "synth_lengths")
    model = get_profile(profile).lengths
    out = np.empty(n, dtype=np.int64)
    for block, start in enumerate(range(0, n, LENGTH_BLOCK)):
        stop = min(start + LENGTH_BLOCK, n)
        out[start:stop] = _block_lengths(model, seed, block, stop - start)
    return out


# -- token statistics ------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def zipf_probabilities(num_ids: int, a: float, q: float, id_noise: float) -> np.ndarray:
    """Probability of each content id: Zipf-Mandelbrot over ranks, ranks mapped to ids by a
    fixed loosely monotone permutation (frequent tokens get small ids, as in BPE vocabularies)."""
    ranks = np.arange(1, num_ids + 1, dtype=np.float64)
    weights = (ranks + q) ** -a
    perm_rng = np.random.default_rng(_PERMUTATION_SEED)
    key = np.log(ranks) + id_noise * perm_rng.standard_normal(num_ids)
    id_of_rank = np.empty(num_ids, dtype=np.int64)
    id_of_rank[np.argsort(key, kind="stable")] = np.arange(num_ids)
    probs = np.empty(num_ids, dtype=np.float64)
    probs[id_of_rank] = weights / weights.sum()
    probs.setflags(write=False)
    return probs


def rank_probabilities(profile: str | Profile = "chat", vocab_size: int | None = None
                       ) -> np.ndarray:
    """The profile's model token frequencies sorted from the most frequent down (content ids;
    the template's special tokens aside): the curve its spools' rank plots should follow."""
    prof = get_profile(profile)
    vocab = prof.vocab_size if vocab_size is None else vocab_size
    if prof.chat is None:
        return np.full(vocab, 1.0 / vocab)
    probs = zipf_probabilities(vocab - NUM_SPECIAL, prof.zipf_a, prof.zipf_q, prof.id_noise)
    return np.sort(probs)[::-1]


@functools.lru_cache(maxsize=4)
def _alias_table(num_ids: int, a: float, q: float, id_noise: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Walker/Vose alias table: O(1) per draw, ~4x faster than inverse-CDF search.

    Returns the keep thresholds in units of 2**-24 (uint32) and the alias ids (int32): small
    tables keep the gathers in cache."""
    scaled = zipf_probabilities(num_ids, a, q, id_noise) * num_ids
    threshold = np.ones(num_ids, dtype=np.float64)
    alias = np.arange(num_ids, dtype=np.int32)
    small = np.flatnonzero(scaled < 1.0).tolist()
    large = np.flatnonzero(scaled >= 1.0).tolist()
    work = scaled.tolist()
    while small and large:
        s, g = small.pop(), large.pop()
        threshold[s] = work[s]
        alias[s] = g
        work[g] += work[s] - 1.0
        (small if work[g] < 1.0 else large).append(g)
    return np.rint(threshold * (1 << 24)).astype(np.uint32), alias


def _uniform_ids(raw: np.ndarray, num_ids: int) -> np.ndarray:
    """Ids in [0, num_ids) from the high 32 bits of raw 64-bit draws (multiply-shift)."""
    return ((raw >> np.uint64(32)) * np.uint64(num_ids)) >> np.uint64(32)


def _zipf_tokens(raw: np.ndarray, profile: Profile, vocab_size: int) -> np.ndarray:
    """One Zipf token per raw 64-bit draw: high bits pick a slot, low 24 bits decide alias."""
    threshold, alias = _alias_table(vocab_size - NUM_SPECIAL, profile.zipf_a, profile.zipf_q,
                                    profile.id_noise)
    pick = _uniform_ids(raw, threshold.shape[0]).astype(np.intp)
    keep = (raw & np.uint64(0xFFFFFF)).astype(np.uint32) < threshold[pick]
    return np.where(keep, pick.astype(np.int32), alias[pick])


# -- one chunk -------------------------------------------------------------------------------


@dataclass
class _Draws:
    """What one chunk needs from its groups' random streams (concatenated over the groups)."""

    turns: list[np.ndarray] = field(default_factory=list)
    system: list[np.ndarray] = field(default_factory=list)
    weights: list[np.ndarray] = field(default_factory=list)
    tokens: list[np.ndarray] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)


def _chat_turns(chat: ChatModel, rng: np.random.Generator, lengths: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Turn pairs and system flag per sequence, capped so every turn has content to hold:
    at most ``(L - 1) // 8`` turns (so about 4+ content tokens each), and at least one pair.
    Always draws a whole group, so a partial last group matches the full one's prefix."""
    n = lengths.shape[0]
    turns = np.minimum(rng.geometric(chat.turn_p, size=GROUP)[:n], chat.max_turns)
    system = rng.random(GROUP)[:n] < chat.system_prob
    max_segments = np.maximum(2, (lengths - 1) // 8)
    system &= max_segments >= 3
    turns = np.clip(turns, 1, (max_segments - system) // 2).astype(np.int64)
    return turns, system


def _draw_groups(profile: Profile, vocab_size: int, seed: int, first_group: int,
                 lengths: np.ndarray) -> _Draws:
    draws = _Draws()
    for g, start in enumerate(range(0, lengths.shape[0], GROUP)):
        group_lengths = lengths[start : start + GROUP]
        raw = _rng(seed, _STREAM_TOKENS, first_group + g).bit_generator.random_raw(
            int(group_lengths.sum())
        )
        if profile.chat is None:
            draws.tokens.append(_uniform_ids(raw, vocab_size).astype(np.int32))
            draws.masks.append((raw & np.uint64(1)).astype(np.uint8))
            continue
        rng = _rng(seed, _STREAM_STRUCTURE, first_group + g)
        turns, system = _chat_turns(profile.chat, rng, group_lengths)
        draws.turns.append(turns)
        draws.system.append(system)
        draws.weights.append(rng.standard_exponential(int((2 * turns + system).sum())))
        draws.tokens.append(_zipf_tokens(raw, profile, vocab_size))
    return draws


def _chat_chunk(chat: ChatModel, vocab_size: int, lengths: np.ndarray, draws: _Draws
                ) -> tuple[np.ndarray, np.ndarray]:
    """Lay out a chunk of chat sequences (vectorized, no per-token Python)."""
    turns = np.concatenate(draws.turns)
    system = np.concatenate(draws.system).astype(np.int64)
    tokens = np.concatenate(draws.tokens).astype(np.int32, copy=False)
    n = lengths.shape[0]
    turn_segments = system + 2 * turns  # turns with content (not <bos>)
    segments = 1 + turn_segments
    seg_seq = np.repeat(np.arange(n), segments)
    first_seg = np.concatenate(([0], np.cumsum(segments)[:-1]))
    pos = np.arange(seg_seq.shape[0]) - first_seg[seg_seq]
    role = np.where((pos - 1 - system[seg_seq]) % 2 == 0, _USER, _ASSISTANT)
    role[(pos == 1) & (system[seg_seq] == 1)] = _SYSTEM
    role[pos == 0] = _BOS
    is_turn = pos > 0
    # split each sequence's content budget between its turns
    factor = np.select([role == _SYSTEM, role == _USER],
                       [chat.system_weight, chat.user_weight], chat.assistant_weight)
    weights = np.concatenate(draws.weights) * factor[is_turn]
    turn_seq = seg_seq[is_turn]
    weight_sum = np.bincount(turn_seq, weights=weights, minlength=n)
    spare = lengths - 1 - 4 * turn_segments  # content beyond one token per turn
    share = weights / weight_sum[turn_seq] * (1.0 - 1e-12)  # never round past the budget
    content = 1 + np.floor(share * spare[turn_seq]).astype(np.int64)
    leftover = lengths - 1 - 3 * turn_segments - np.bincount(turn_seq, weights=content,
                                                             minlength=n).astype(np.int64)
    last_turn = np.cumsum(turn_segments) - 1  # index into the turn array
    content[last_turn] += leftover  # the final assistant turn takes the rounding
    seg_len = np.ones(seg_seq.shape[0], dtype=np.int64)
    seg_len[is_turn] = content + 3
    # per token: its segment's role
    seg_start = np.concatenate(([0], np.cumsum(seg_len)[:-1]))
    token_role = np.repeat(role.astype(np.int8), seg_len)
    masks = (token_role == _ASSISTANT).astype(np.uint8)
    base = vocab_size - NUM_SPECIAL
    turn_start = seg_start[is_turn]
    tokens[seg_start[~is_turn]] = base + _BOS
    tokens[turn_start] = base + _HEADER
    tokens[turn_start + 1] = base + role[is_turn]
    tokens[turn_start + seg_len[is_turn] - 1] = base + _EOT
    masks[turn_start] = 0
    masks[turn_start + 1] = 0  # headers are prompt; the assistant's <end_of_turn> stays 1
    return tokens, masks


def _chunk(profile: Profile, vocab_size: int, seed: int, first_group: int,
           lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    draws = _draw_groups(profile, vocab_size, seed, first_group, lengths)
    if profile.chat is None:
        return np.concatenate(draws.tokens), np.concatenate(draws.masks)
    return _chat_chunk(profile.chat, vocab_size, lengths, draws)


# -- the spool -------------------------------------------------------------------------------


def _check_vocab(profile: Profile, vocab_size: int | None, path: Path) -> int:
    vocab = profile.vocab_size if vocab_size is None else vocab_size
    low = 2 if profile.chat is None else 256
    if isinstance(vocab, bool) or not isinstance(vocab, int | np.integer) or not (
        low <= vocab <= MAX_VOCAB
    ):
        raise PacklabError(
            f"{path}: vocab_size must be an integer in [{low}, {MAX_VOCAB}] for profile "
            f"{profile.name!r}, got {vocab!r}"
        )
    return int(vocab)


def _plan(num_sequences: int, chunk_sequences: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of every chunk; chunks never straddle a lengths block and start on a group."""
    for block_start in range(0, num_sequences, LENGTH_BLOCK):
        block_stop = min(block_start + LENGTH_BLOCK, num_sequences)
        for start in range(block_start, block_stop, chunk_sequences):
            yield start, min(start + chunk_sequences, block_stop)


def _chunk_size(chunk_sequences: int | None, lengths: np.ndarray, path: Path) -> int:
    if chunk_sequences is None:
        chunk_sequences = int(CHUNK_TOKENS / max(float(lengths.mean()), 1.0))
    elif isinstance(chunk_sequences, bool) or chunk_sequences <= 0:
        raise PacklabError(f"{path}: chunk_sequences must be positive, got {chunk_sequences}")
    groups = max(1, int(chunk_sequences) // GROUP)
    return min(groups * GROUP, LENGTH_BLOCK)


def synthesize(
    path: str | os.PathLike[str],
    *,
    num_sequences: int,
    profile: str = "chat",
    vocab_size: int | None = None,
    seed: int = 0,
    chunk_sequences: int | None = None,
    overwrite: bool = False,
    show_progress: bool = False,
) -> SpoolReader:
    """Write a synthetic spool of ``num_sequences`` sequences and return its reader.

    Streams one chunk (about ``CHUNK_TOKENS`` tokens; or ``chunk_sequences`` sequences, rounded
    to a multiple of ``GROUP``) at a time into the spool writer, so memory is flat in
    ``num_sequences``. The result depends only on (profile, vocab_size, seed, num_sequences).
    """
    path = Path(path)
    num_sequences = _check_count(num_sequences, str(path))
    prof = get_profile(profile)
    vocab = _check_vocab(prof, vocab_size, path)
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise PacklabError(f"{path}: seed must be a non-negative integer, got {seed!r}")
    source = {"generator": "packlab.synth", "profile": prof.name, "seed": int(seed)}
    first_block = _block_lengths(prof.lengths, seed, 0, min(LENGTH_BLOCK, num_sequences))
    step = _chunk_size(chunk_sequences, first_block, path)
    plan = list(_plan(num_sequences, step))
    chunks = progress(plan, total=len(plan), desc=f"synth {prof.name}") if show_progress else plan
    block_lengths = first_block
    with SpoolWriter(path, vocab_size=vocab, source=source, overwrite=overwrite) as writer:
        for start, stop in chunks:
            block, offset = divmod(start, LENGTH_BLOCK)
            if offset == 0 and block > 0:
                block_lengths = _block_lengths(
                    prof.lengths, seed, block, min(LENGTH_BLOCK, num_sequences - start)
                )
            lengths = block_lengths[offset : offset + (stop - start)]
            tokens, masks = _chunk(prof, vocab, seed, start // GROUP, lengths)
            writer.append_many(tokens, masks, lengths)
    return SpoolReader(path)
