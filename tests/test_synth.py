"""Synthetic spools: deterministic by seed, the profiles' promised shapes, flat memory in N."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packlab.errors import PacklabError
from packlab.spool import SpoolReader
from packlab.spool.stats import order0_entropy_bits, rank_frequency, token_counts
from packlab.spool.synth import (
    GROUP,
    LENGTH_BLOCK,
    NUM_SPECIAL,
    PROFILES,
    LengthModel,
    rank_probabilities,
    special_tokens,
    synth_lengths,
    synthesize,
)

CHAT_PROFILES = [name for name, p in PROFILES.items() if p.chat is not None]


def _arrays(reader: SpoolReader) -> tuple[np.ndarray, ...]:
    return tuple(np.array(a) for a in (reader.tokens, reader.masks, reader.lengths))


def _small(profile: str) -> int:
    return 40 if profile == "long" else 600


# -- determinism -----------------------------------------------------------------------------


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_same_seed_same_spool_other_seed_other_spool(tmp_path: Path, profile: str) -> None:
    n = _small(profile)
    a = _arrays(synthesize(tmp_path / "a", num_sequences=n, profile=profile, seed=7))
    b = _arrays(synthesize(tmp_path / "b", num_sequences=n, profile=profile, seed=7))
    c = _arrays(synthesize(tmp_path / "c", num_sequences=n, profile=profile, seed=8))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[2], c[2])
    tokens_bin = [(tmp_path / d / "tokens.bin").read_bytes() for d in "ab"]
    assert tokens_bin[0] == tokens_bin[1]


def test_chunk_size_does_not_change_the_spool(tmp_path: Path) -> None:
    a = _arrays(synthesize(tmp_path / "a", num_sequences=700, seed=3, chunk_sequences=GROUP))
    b = _arrays(synthesize(tmp_path / "b", num_sequences=700, seed=3, chunk_sequences=5 * GROUP))
    c = _arrays(synthesize(tmp_path / "c", num_sequences=700, seed=3))
    for x, y, z in zip(a, b, c, strict=True):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)


def test_a_longer_spool_starts_with_the_shorter_one(tmp_path: Path) -> None:
    short = synthesize(tmp_path / "a", num_sequences=150, seed=1)
    long = synthesize(tmp_path / "b", num_sequences=400, seed=1)
    np.testing.assert_array_equal(long.lengths[:150], short.lengths)
    np.testing.assert_array_equal(long.tokens[: short.num_tokens], short.tokens)
    np.testing.assert_array_equal(long.masks[: short.num_tokens], short.masks)


def test_lengths_are_prefix_stable_across_blocks() -> None:
    n = LENGTH_BLOCK + 1000
    full = synth_lengths(n, "chat", seed=2)
    np.testing.assert_array_equal(full[:5000], synth_lengths(5000, "chat", seed=2))
    assert full.dtype == np.int64 and full.shape == (n,)
    assert not np.array_equal(full[:1000], full[LENGTH_BLOCK:])  # blocks are not repeats


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_synth_lengths_matches_the_spool(tmp_path: Path, profile: str) -> None:
    n = _small(profile)
    reader = synthesize(tmp_path / "s", num_sequences=n, profile=profile, seed=5)
    np.testing.assert_array_equal(reader.lengths, synth_lengths(n, profile, seed=5))
    reader.verify()
    assert reader.record["source"] == {"generator": "packlab.synth", "profile": profile,
                                         "seed": 5}


# -- profile properties ----------------------------------------------------------------------


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_lengths_within_the_profile_bounds(profile: str) -> None:
    model = PROFILES[profile].lengths
    lengths = synth_lengths(100_000, profile, seed=0)
    assert lengths.min() >= model.min_len and lengths.max() <= model.max_len
    assert lengths.min() < model.min_len * 4  # the range is actually used
    assert len(np.unique(lengths)) > 500


def test_chat_lengths_have_the_documented_shape() -> None:
    lengths = synth_lengths(200_000, "chat", seed=0)
    assert 450 < np.median(lengths) < 640  # lognormal body, median 512 (+ the 5% tail)
    assert 900 < lengths.mean() < 1200
    assert 0.025 < np.mean(lengths > 4096) < 0.05
    assert 0.005 < np.mean(lengths > 8192) < 0.02
    assert lengths.max() > 20_000  # the heavy tail reaches long reasoning traces


def test_uniform_profile_is_the_design_documents_test_data(tmp_path: Path) -> None:
    reader = synthesize(tmp_path / "s", num_sequences=500, profile="uniform", seed=0)
    tokens, masks, lengths = _arrays(reader)
    assert reader.vocab_size == 50_000
    assert tokens.min() >= 0 and tokens.max() < 50_000
    assert abs(masks.mean() - 0.5) < 0.01
    counts = np.bincount(tokens // 5000, minlength=10)  # flat over the vocabulary
    assert counts.min() > 0.9 * counts.mean()
    assert 16 <= lengths.min() and lengths.max() <= 2048


def _parse_turns(tokens: np.ndarray, mask: np.ndarray, vocab: int) -> list[str]:
    """Check one chat sequence against the template; return its roles in order."""
    sp = special_tokens(vocab)
    base = vocab - NUM_SPECIAL
    names = {sp["<|system|>"]: "system", sp["<|user|>"]: "user", sp["<|assistant|>"]: "assistant"}
    assert tokens[0] == sp["<|bos|>"] and mask[0] == 0
    roles, i = [], 1
    while i < tokens.shape[0]:
        assert tokens[i] == sp["<|start_header|>"] and int(tokens[i + 1]) in names
        role = names[int(tokens[i + 1])]
        end = i + 2 + int(np.argmax(tokens[i + 2 :] == sp["<|end_of_turn|>"]))
        assert tokens[end] == sp["<|end_of_turn|>"] and end > i + 2  # content is not empty
        assert (tokens[i + 2 : end] < base).all()  # content holds no special token
        assert mask[i] == 0 and mask[i + 1] == 0  # the header is prompt
        learned = mask[i + 2 : end + 1]  # content and <end_of_turn>
        assert (learned == (1 if role == "assistant" else 0)).all(), role
        roles.append(role)
        i = end + 1
    return roles


@pytest.mark.parametrize("profile", CHAT_PROFILES)
def test_chat_template_and_masks(tmp_path: Path, profile: str) -> None:
    reader = synthesize(tmp_path / "s", num_sequences=_small(profile), profile=profile, seed=4)
    vocab = reader.vocab_size
    assert vocab == 131_072
    seen_system = 0
    for i in range(reader.num_sequences):
        roles = _parse_turns(*reader.read_sequence(i), vocab)
        if roles[0] == "system":
            seen_system += 1
            roles = roles[1:]
        assert roles == ["user", "assistant"] * (len(roles) // 2) and roles
        assert len(roles) // 2 <= PROFILES[profile].chat.max_turns
    expected = PROFILES[profile].chat.system_prob * reader.num_sequences
    assert abs(seen_system - expected) <= max(4, 0.35 * expected)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(profile=st.sampled_from(CHAT_PROFILES), n=st.integers(1, 150),
       vocab=st.sampled_from([256, 1000, None]), seed=st.integers(0, 2**32))
def test_any_chat_spool_follows_the_template(tmp_path_factory: pytest.TempPathFactory,
                                             profile: str, n: int, vocab: int | None,
                                             seed: int) -> None:
    n = min(n, 20) if profile == "long" else n
    path = tmp_path_factory.mktemp("synth") / "s"
    reader = synthesize(path, num_sequences=n, profile=profile, vocab_size=vocab, seed=seed)
    reader.verify()
    np.testing.assert_array_equal(reader.lengths, synth_lengths(n, profile, seed))
    for i in range(n):
        assert _parse_turns(*reader.read_sequence(i), reader.vocab_size)[-1] == "assistant"


def test_chat_turn_mix_and_mask_fraction(tmp_path: Path) -> None:
    reader = synthesize(tmp_path / "s", num_sequences=1500, seed=0)
    pairs = [len(_parse_turns(*reader.read_sequence(i), reader.vocab_size)) // 2
             for i in range(300)]
    assert 1.6 < np.mean(pairs) < 2.8 and max(pairs) > 3  # multi-turn, 1 + Geometric(0.45)
    fraction = float(np.asarray(reader.masks).mean())
    assert 0.55 < fraction < 0.8  # assistant replies carry most tokens


def test_chat_tokens_follow_zipf(tmp_path: Path) -> None:
    reader = synthesize(tmp_path / "s", num_sequences=2000, seed=0)
    counts = token_counts(reader.tokens, reader.vocab_size)
    counts[-NUM_SPECIAL:] = 0  # template tokens aside
    freq = rank_frequency(counts)
    assert 0.03 < freq[0] < 0.05 and 0.008 < freq[9] < 0.013  # p(1) ~4%, p(10) ~1%
    slope = np.polyfit(np.log(np.arange(10, 1001)), np.log(freq[9:1000]), 1)[0]
    assert -1.25 < slope < -0.95
    assert 10.5 < order0_entropy_bits(counts) < 12.0
    assert np.median(np.argsort(-counts)[:100]) < 2000  # frequent tokens get small ids


def test_custom_vocabulary(tmp_path: Path) -> None:
    reader = synthesize(tmp_path / "s", num_sequences=200, vocab_size=1000, seed=0)
    assert reader.vocab_size == 1000
    tokens = np.asarray(reader.tokens)
    assert tokens.max() == 1000 - NUM_SPECIAL + 5  # <|end_of_turn|> is the highest id used
    _parse_turns(*reader.read_sequence(0), 1000)


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_sequences": 0}, "num_sequences must be positive, got 0"),
        ({"num_sequences": -3}, "num_sequences must be positive"),
        ({"num_sequences": True}, "must be an integer"),
        ({"num_sequences": 5, "profile": "nope"}, "unknown synthetic profile 'nope'"),
        ({"num_sequences": 5, "vocab_size": 100}, "vocab_size must be"),
        ({"num_sequences": 5, "vocab_size": 0, "profile": "uniform"}, "vocab_size must be"),
        ({"num_sequences": 5, "seed": -1}, "seed must be"),
        ({"num_sequences": 5, "chunk_sequences": 0}, "chunk_sequences must be positive"),
    ],
)
def test_bad_arguments_name_the_path(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(PacklabError, match=message):
        synthesize(tmp_path / "s", **kwargs)
    assert not (tmp_path / "s").exists()


def test_existing_output_is_kept_unless_overwrite(tmp_path: Path) -> None:
    first = synthesize(tmp_path / "s", num_sequences=20, seed=0)
    before = np.array(first.tokens)
    with pytest.raises(PacklabError, match="already exists"):
        synthesize(tmp_path / "s", num_sequences=30, seed=1)
    np.testing.assert_array_equal(SpoolReader(tmp_path / "s").tokens, before)
    assert synthesize(tmp_path / "s", num_sequences=30, seed=1, overwrite=True).num_sequences == 30


def test_custom_profiles(tmp_path: Path) -> None:
    tiny = dataclasses.replace(PROFILES["chat"], name="tiny",
                               lengths=LengthModel("uniform", 9, 12))
    reader = synthesize(tmp_path / "s", num_sequences=100, profile=tiny, seed=0)
    for i in range(100):  # the shortest possible chats still follow the template
        assert _parse_turns(*reader.read_sequence(i), reader.vocab_size) == ["user", "assistant"]
    too_short = dataclasses.replace(tiny, lengths=LengthModel("uniform", 8, 12))
    with pytest.raises(PacklabError, match="lengths must be"):
        synthesize(tmp_path / "t", num_sequences=10, profile=too_short)


def test_synth_lengths_refuses_bad_counts() -> None:
    with pytest.raises(PacklabError, match="positive"):
        synth_lengths(0)


# -- memory ----------------------------------------------------------------------------------

_CHILD = """
import json, sys
from packlab.cli import main
code = main(sys.argv[1:])
status = open("/proc/self/status").read().split("\\n")
hwm = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(json.dumps({"code": code, "vmhwm_kb": hwm}))
"""


def _synth_peak_rss(out: Path, num_sequences: int) -> int:
    """Peak RSS (VmHWM, bytes) of a fresh process that runs ``packlab synth``."""
    args = [sys.executable, "-c", _CHILD, "synth", str(out), "--num-sequences",
            str(num_sequences), "--profile", "short", "--json"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, done.stderr
    return result["vmhwm_kb"] * 1024


def test_peak_rss_does_not_grow_with_the_number_of_sequences(tmp_path: Path) -> None:
    small = _synth_peak_rss(tmp_path / "small", 50_000)
    large = _synth_peak_rss(tmp_path / "large", 400_000)
    tokens = SpoolReader(tmp_path / "large").num_tokens
    assert tokens > 60_000_000  # 240 MB of tokens went through the writer
    assert large - small < 24 << 20, (small, large)  # flat: growth is noise, not data
    assert large < 400 << 20


def test_rank_probabilities_are_the_model_curve(tmp_path: Path) -> None:
    model = rank_probabilities("chat")
    assert model.shape == (131_072 - NUM_SPECIAL,) and model.sum() == pytest.approx(1.0)
    assert (np.diff(model) <= 0).all()
    reader = synthesize(tmp_path / "s", num_sequences=1000, seed=2)
    counts = token_counts(reader.tokens, reader.vocab_size)[: -NUM_SPECIAL]
    observed = rank_frequency(counts)
    np.testing.assert_allclose(observed[:20], model[:20], rtol=0.1)
    uniform = rank_probabilities("uniform", vocab_size=10)
    np.testing.assert_allclose(uniform, 0.1)
