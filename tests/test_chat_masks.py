"""Masks from ChatML role markers: the compiled walk against a naive transcription of
Megatron-LM's segment rules (every role, tool responses included), on conversations built the
way Megatron-LM's own ``test_sft_dataset`` builds them (every turn type, every flag), and the
markers' checks."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packlab.errors import PacklabError
from packlab.spool.masks import ChatMarkers, MarkerTokens, derive_masks

# a character-level "tokenizer", as Megatron-LM's test uses (NullTokenizer): one id per character
MARKERS = ChatMarkers(system_start="[S]", user_start="[U]", assistant_start="[A]", end="[E]",
                      think_start="{", think_end="}", tool_call_start="~\n",
                      tool_call_end="`\n", tool_response_start="^\n")
TOKENS = MARKERS.tokenized(lambda text: [ord(c) for c in text])
FLAG_SETS = [(False, False, False), (True, False, False), (True, True, False),
             (True, False, True), (True, True, True)]


def with_flags(markers: MarkerTokens, responses: bool, thinking: bool, calls: bool,
               end_of_turn: bool = False) -> MarkerTokens:
    return MarkerTokens.from_dict({**markers.to_dict(),
                                   "train_on_assistant_responses_only": responses,
                                   "train_on_thinking_traces": thinking,
                                   "train_on_tool_calls": calls,
                                   "train_on_end_of_turn": end_of_turn})


# -- the reference: the segment rules over Python lists, every role -----------------------------


def find(seq: list[int], pattern: list[int], start: int = 0) -> int:
    for i in range(start, len(seq) - len(pattern) + 1):
        if seq[i:i + len(pattern)] == pattern:
            return i
    return -1


def split_calls(tokens: list[int], offset: int, m: MarkerTokens) -> list[tuple[str, int, int]]:
    start_marker, end_marker = list(m.tool_call_start), list(m.tool_call_end)
    newline = start_marker[-1]
    out: list[tuple[str, int, int]] = []
    pos = 0
    while pos < len(tokens):
        at = find(tokens, start_marker, pos)
        if at == -1:
            out.append(("assistant", offset + pos, offset + len(tokens)))
            break
        if at > pos and not all(t == newline for t in tokens[pos:at]):
            out.append(("assistant", offset + pos, offset + at))
        inner = at + len(start_marker)
        stop = find(tokens, end_marker, inner)
        if stop == -1:
            out.append(("tool_call", offset + inner, offset + len(tokens)))
            break
        out.append(("tool_call", offset + inner, offset + stop))
        pos = stop + len(end_marker)
    if out and out[-1][0] == "assistant" and all(
            t == newline for t in tokens[out[-1][1] - offset:out[-1][2] - offset]):
        out.pop()
    return out


def segments(seq: list[int], m: MarkerTokens) -> list[tuple[str, int, int]]:
    found = []
    for role in ("system", "user", "assistant"):
        marker = list(getattr(m, f"{role}_start"))
        pos = 0
        while (at := find(seq, marker, pos)) != -1:
            found.append((at, role, len(marker)))
            pos = at + len(marker)
    out: list[tuple[str, int, int]] = []
    for at, role, size in sorted(found, key=lambda x: x[0]):
        lo = at + size
        stop = find(seq, list(m.end), lo)
        hi = len(seq) if stop == -1 else stop
        content = seq[lo:hi]
        response = list(m.tool_response_start)
        if role == "user" and content[:len(response)] == response:
            out.append(("tool_response", lo, hi))
            continue
        if role == "assistant":
            ts = find(content, list(m.think_start))
            te = -1 if ts == -1 else find(content, list(m.think_end), ts + len(m.think_start))
            if ts != -1 and te != -1:
                out.append(("reasoning", lo + ts + len(m.think_start), lo + te))
                if content[te + len(m.think_end):]:
                    out += split_calls(content[te + len(m.think_end):],
                                       lo + te + len(m.think_end), m)
                continue
            if find(content, list(m.tool_call_start)) != -1:
                out += split_calls(content, lo, m)
                continue
        out.append((role, lo, hi))
    return out


def naive_mask(seq: list[int], m: MarkerTokens) -> list[int]:
    if not m.train_on_assistant_responses_only:
        return [1] * len(seq)
    mask = [0] * len(seq)
    trained = {"assistant": True, "reasoning": m.train_on_thinking_traces,
               "tool_call": m.train_on_tool_calls}
    for role, lo, hi in segments(seq, m):
        if trained.get(role, False):
            mask[lo:hi] = [1] * (hi - lo)
    if m.train_on_end_of_turn:
        for at in _all(seq, m.assistant_start):
            stop = find(seq, list(m.end), at + len(m.assistant_start))
            if stop != -1:
                mask[stop] = 1
    return mask


def _all(seq: list[int], marker: tuple[int, ...]) -> list[int]:
    out, pos = [], 0
    while (at := find(seq, list(marker), pos)) != -1:
        out.append(at)
        pos = at + len(marker)
    return out


# -- conversations as Megatron-LM's test builds them ----------------------------------------------


def conversation(rng: random.Random, kind: str, system: bool) -> list[int]:
    def text() -> list[int]:  # content ids clear of the ASCII markers
        return [rng.randrange(200, 1000) for _ in range(rng.randint(5, 20))]

    t = {name: list(getattr(TOKENS, name)) for name in ("system_start", "user_start",
                                                         "assistant_start", "end",
                                                         "think_start", "think_end",
                                                         "tool_call_start", "tool_call_end",
                                                         "tool_response_start")}
    response_end = [ord(c) for c in "|\n"]
    out = t["system_start"] + text() + t["end"] if system else []
    out += t["user_start"] + text() + t["end"]
    think = t["think_start"] + text() + t["think_end"] if "thinking" in kind else []
    if "tool" in kind:
        out += (t["assistant_start"] + think + t["tool_call_start"] + text()
                + t["tool_call_end"] + t["end"])
        out += (t["user_start"] + t["tool_response_start"] + text() + response_end
                + t["end"])
        out += t["assistant_start"] + text() + t["end"]
    else:
        out += t["assistant_start"] + think + text() + t["end"]
    return out


KINDS = ["simple", "with_thinking", "with_tool_calls", "with_thinking_and_tool_calls"]


@pytest.mark.parametrize("flags", FLAG_SETS)
@pytest.mark.parametrize("end_of_turn", [False, True])
def test_megatron_lm_style_conversations(flags: tuple[bool, bool, bool],
                                         end_of_turn: bool) -> None:
    rng = random.Random(1234)
    markers = with_flags(TOKENS, *flags, end_of_turn and flags[0])
    convs = [conversation(rng, rng.choice(KINDS), rng.random() < 0.5) for _ in range(200)]
    tokens = np.array([t for c in convs for t in c], dtype=np.int32)
    lengths = np.array([len(c) for c in convs])
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    got = derive_masks(tokens, offsets, lengths, markers)
    want = [v for c in convs for v in naive_mask(c, markers)]
    assert got.tolist() == want
    if flags[0]:  # some trained, some not; a think tag, a tool-call marker never trained
        assert 0 < int(got.sum()) < got.shape[0]
        assert not got[tokens == ord("{")].any() and not got[tokens == ord("~")].any()


def test_what_each_flag_trains_on_one_conversation() -> None:
    t = {name: list(getattr(TOKENS, name)) for name in ("user_start", "assistant_start", "end",
                                                         "think_start", "think_end",
                                                         "tool_call_start", "tool_call_end")}
    seq = (t["user_start"] + [300, 301] + t["end"] + t["assistant_start"] + t["think_start"]
           + [400, 401] + t["think_end"] + [500] + t["tool_call_start"] + [600, 601]
           + t["tool_call_end"] + t["end"])
    tokens = np.array(seq, dtype=np.int32)
    lengths = np.array([len(seq)])

    def trained(*flags: bool) -> list[int]:
        mask = derive_masks(tokens, np.array([0]), lengths, with_flags(TOKENS, *flags))
        return tokens[mask.astype(bool)].tolist()

    assert trained(True, False, False) == [500]
    assert trained(True, True, False) == [400, 401, 500]
    assert trained(True, False, True) == [500, 600, 601]
    assert trained(True, True, True) == [400, 401, 500, 600, 601]
    assert trained(False, False, False) == seq
    end_first = derive_masks(tokens, np.array([0]), lengths,
                             with_flags(TOKENS, True, False, False, True))
    assert tokens[end_first.astype(bool)].tolist() == [500, ord("[")]  # the end marker's first


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from([ord(c) for c in "[SUAE]{}~`^\n"] + [300, 301]),
                         min_size=1, max_size=60), min_size=1, max_size=6),
       st.sampled_from(FLAG_SETS), st.booleans())
def test_any_token_soup(convs: list[list[int]], flags: tuple[bool, bool, bool],
                        end_of_turn: bool) -> None:
    """Marker pieces in every order (unclosed turns, calls and thoughts, stray tags)."""
    markers = with_flags(TOKENS, *flags, end_of_turn and flags[0])
    tokens = np.array([t for c in convs for t in c], dtype=np.int64)
    lengths = np.array([len(c) for c in convs])
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    got = derive_masks(tokens, offsets, lengths, markers)
    assert got.tolist() == [v for c in convs for v in naive_mask(c, markers)]


def test_conversations_in_any_place_of_the_token_array() -> None:
    rng = random.Random(5)
    convs = [conversation(rng, "simple", True) for _ in range(3)]
    tokens = np.array(convs[2] + [7, 7] + convs[0] + convs[1], dtype=np.int32)
    offsets = np.array([len(convs[2]) + 2, len(convs[2]) + 2 + len(convs[0]), 0])
    lengths = np.array([len(c) for c in convs])
    got = derive_masks(tokens, offsets, lengths, TOKENS)
    assert got.tolist() == [v for c in convs for v in naive_mask(c, TOKENS)]


def test_markers_are_checked() -> None:
    with pytest.raises(PacklabError, match="need train_on_assistant_responses_only"):
        ChatMarkers(train_on_assistant_responses_only=False)
    with pytest.raises(PacklabError, match="encodes to no token"):
        ChatMarkers(end="").tokenized(lambda text: [ord(c) for c in text])
    with pytest.raises(PacklabError, match="not a record of chat markers"):
        MarkerTokens.from_dict({"end": [1]})
    with pytest.raises(PacklabError, match="not a non-empty list"):
        MarkerTokens.from_dict({**TOKENS.to_dict(), "end": []})
    assert MarkerTokens.from_dict(TOKENS.to_dict()) == TOKENS
