"""Loss masks from a tokenized conversation's ChatML role markers, as Megatron-LM's ``SFTDataset``
derives them at load time (its pre-tokenized prefixes store no mask).

Megatron-LM's pull request #5017 (``megatron/core/datasets/sft_dataset.py``: ``SFTDatasetConfig``,
``extract_segments``, ``_split_tool_calls``; as of commit
``97b2c55e4c373a072c36e79104bcdac1d77c022f``)
tokenizes its marker strings once (:class:`ChatMarkers`, Nemotron-3's by default) and splits
each conversation into segments:

- every occurrence of a role's start marker (system, user, assistant) opens a segment of that
  role, from after the marker to the first end marker after it (or the conversation's end);
  a user segment whose content starts with the tool-response marker is a tool response (none
  of these is ever trained, so only the assistant segments matter to the mask);
- an assistant segment with a think-start marker and, after it, a think-end marker splits
  into the reasoning between them and the response after the think end (the tags themselves in
  neither); a response (or a whole assistant segment without think tags) that holds a
  tool-call start marker splits into assistant text and tool calls: each call from after its
  start marker to its end marker (or the segment's end), assistant fragments between calls
  dropped when they are nothing but the newline token that ends the tool-call start marker.

The mask is 1 on the assistant segments, on reasoning with ``train_on_thinking_traces``, on
tool calls with ``train_on_tool_calls``, 0 elsewhere (markers, system, user, tool responses);
all 1 when ``train_on_assistant_responses_only`` is off. The mask is per token, unshifted, as a
spool stores it (Megatron-LM pairs ``loss_mask[:-1]`` with ``labels = tokens[1:]``).

``train_on_end_of_turn`` is packlab's, not Megatron-LM's: it also marks the first token of the
end marker that closes each assistant segment (``<|im_end|>``), as packlab's tokenizers and
``{% generation %}`` templates mark it, so the model learns to stop. With it, the mask of a
conversation packlab tokenized with a ChatML template is recovered exactly (the tests check it).

The per-conversation walk is compiled with numba (:func:`packlab.compiled.compiled`, as the
packers' loops are); a mask of billions of tokens is derived in chunks of conversations
(:func:`derive_masks`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from packlab.compiled import compiled
from packlab.errors import PacklabError

MARKERS = ("system_start", "user_start", "assistant_start", "end", "think_start", "think_end",
           "tool_call_start", "tool_call_end", "tool_response_start")
# what the mask depends on: system, user and tool-response segments are never trained, so their
# markers change no mask (they are kept, as Megatron-LM's config keeps them)
TRAINED = ("assistant_start", "end", "think_start", "think_end", "tool_call_start",
           "tool_call_end")
FLAGS = ("train_on_assistant_responses_only", "train_on_thinking_traces",
         "train_on_tool_calls", "train_on_end_of_turn")


@dataclass(frozen=True, kw_only=True)
class TrainOn:
    """What to train on: Megatron-LM's ``SFTDatasetConfig`` flags, and packlab's end of turn."""

    train_on_assistant_responses_only: bool = True
    train_on_thinking_traces: bool = True
    train_on_tool_calls: bool = True
    train_on_end_of_turn: bool = False

    def __post_init__(self) -> None:
        check_flags(self)


@dataclass(frozen=True, kw_only=True)
class ChatMarkers(TrainOn):
    """The marker strings (Megatron-LM's ``Nemotron3ChatTemplateConfig``) and what to train."""

    system_start: str = "<|im_start|>system\n"
    user_start: str = "<|im_start|>user\n"
    assistant_start: str = "<|im_start|>assistant\n"
    end: str = "<|im_end|>\n"
    think_start: str = "<think>"
    think_end: str = "</think>"
    tool_call_start: str = "<tool_call>\n"
    tool_call_end: str = "</tool_call>\n"
    tool_response_start: str = "<tool_response>\n"

    def tokenized(self, encode: Callable[[str], Sequence[int]]) -> MarkerTokens:
        """The markers as token ids, each encoded alone (as Megatron-LM's config does with its
        tokenizer, special-token strings matched: see :func:`packlab.tokenize.records.marker_encoder`)."""
        ids = {}
        for name in MARKERS:
            text = getattr(self, name)
            ids[name] = tuple(int(t) for t in encode(text))
            if not ids[name]:
                raise PacklabError(f"chat marker {name} {json.dumps(text)} encodes to no token")
        return MarkerTokens(**ids, **{flag: getattr(self, flag) for flag in FLAGS})


def check_flags(markers: TrainOn) -> None:
    """Megatron-LM's rule: thinking traces and tool calls are trained only on top of
    assistant responses (its ``SFTDatasetConfig`` asserts it)."""
    if not markers.train_on_assistant_responses_only and (
            markers.train_on_thinking_traces or markers.train_on_tool_calls):
        raise PacklabError("train_on_thinking_traces and train_on_tool_calls need "
                           "train_on_assistant_responses_only (Megatron-LM's rule); turn them "
                           "off to train on every token")


@dataclass(frozen=True, kw_only=True)
class MarkerTokens(TrainOn):
    """:class:`ChatMarkers` as token ids: what a mask is derived from (and recorded with)."""

    system_start: tuple[int, ...]
    user_start: tuple[int, ...]
    assistant_start: tuple[int, ...]
    end: tuple[int, ...]
    think_start: tuple[int, ...]
    think_end: tuple[int, ...]
    tool_call_start: tuple[int, ...]
    tool_call_end: tuple[int, ...]
    tool_response_start: tuple[int, ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in MARKERS:
            ids = getattr(self, name)
            if not ids or any(not isinstance(t, int) or t < 0 for t in ids):
                raise PacklabError(f"chat marker {name}: {json.dumps(list(ids))} is not a non-empty "
                                   "list of token ids")

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Any, where: object = "markers") -> MarkerTokens:
        """Markers recorded by :meth:`to_dict`; one clear error when they are not."""
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or set(data) - names or not set(MARKERS) <= set(data):
            raise PacklabError(f"{where}: not a record of chat markers ({', '.join(sorted(names))})")
        try:
            return cls(**{k: tuple(v) if k in MARKERS else bool(v) for k, v in data.items()})
        except TypeError:
            raise PacklabError(f"{where}: a chat marker is not a list of token ids") from None


def derive_masks(tokens: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
                 markers: MarkerTokens, out: np.ndarray | None = None) -> np.ndarray:
    """The masks of the conversations ``tokens[offsets[i]:offsets[i] + lengths[i]]``,
    concatenated (uint8, ``lengths.sum()`` values; into ``out`` when given)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if out is None:
        out = np.empty(total, dtype=np.uint8)
    if out.shape != (total,):
        raise PacklabError(f"derive_masks: out holds {out.shape} values, the conversations "
                           f"{total}")
    if not markers.train_on_assistant_responses_only:
        out[:] = 1
        return out
    ids = [np.array(getattr(markers, name), dtype=np.int64) for name in TRAINED]
    starts = np.zeros(lengths.shape[0], dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    compiled(_derive)(tokens, np.asarray(offsets).astype(np.int64), lengths, starts, out, *ids,
                       markers.train_on_thinking_traces, markers.train_on_tool_calls,
                       markers.train_on_end_of_turn)
    return out


def _derive(tokens: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, starts: np.ndarray,
            out: np.ndarray, assistant: np.ndarray, end: np.ndarray, think_start: np.ndarray,
            think_end: np.ndarray, call_start: np.ndarray, call_end: np.ndarray,
            thinking: bool, calls: bool, end_of_turn: bool) -> None:
    """One walk per conversation over its assistant segments (see the module docstring);
    conversation ``c``'s mask goes to ``out[starts[c]:starts[c] + lengths[c]]``."""

    def find(seq: np.ndarray, pattern: np.ndarray, lo: int, hi: int) -> int:
        """The first ``i`` in ``[lo, hi - len(pattern)]`` where ``pattern`` starts, or -1."""
        m = pattern.shape[0]
        for i in range(lo, hi - m + 1):
            j = 0
            while j < m and seq[i + j] == pattern[j]:
                j += 1
            if j == m:
                return i
        return -1

    def blank(seq: np.ndarray, lo: int, hi: int) -> bool:
        """Nothing but the newline that ends the tool-call start marker."""
        newline = call_start[call_start.shape[0] - 1]
        for i in range(lo, hi):
            if seq[i] != newline:
                return False
        return True

    def split_calls(seq: np.ndarray, mask: np.ndarray, lo: int, hi: int) -> None:
        """Assistant text and tool calls of ``seq[lo:hi]`` (Megatron-LM's ``_split_tool_calls``:
        blank fragments before a call, and a blank last fragment, are not assistant text)."""
        pos = lo
        while pos < hi:
            start = find(seq, call_start, pos, hi)
            if start == -1:
                if not blank(seq, pos, hi):
                    mask[pos:hi] = 1
                return
            if start > pos and not blank(seq, pos, start):
                mask[pos:start] = 1
            inner = start + call_start.shape[0]
            stop = find(seq, call_end, inner, hi)
            if calls:
                mask[inner:hi if stop == -1 else stop] = 1
            if stop == -1:
                return
            pos = stop + call_end.shape[0]

    for c in range(offsets.shape[0]):
        seq = tokens[offsets[c]:offsets[c] + lengths[c]]
        n = seq.shape[0]
        mask = out[starts[c]:starts[c] + n]
        mask[:] = 0
        pos = find(seq, assistant, 0, n)
        while pos != -1:
            content = pos + assistant.shape[0]
            stop = find(seq, end, content, n)
            hi = n if stop == -1 else stop
            if end_of_turn and stop != -1:
                mask[stop] = 1
            ts = find(seq, think_start, content, hi)
            te = -1 if ts == -1 else find(seq, think_end, ts + think_start.shape[0], hi)
            if ts != -1 and te != -1:
                if thinking:
                    mask[ts + think_start.shape[0]:te] = 1
                split_calls(seq, mask, te + think_end.shape[0], hi)
            elif find(seq, call_start, content, hi) != -1:
                split_calls(seq, mask, content, hi)
            else:
                mask[content:hi] = 1
            pos = find(seq, assistant, content, n)
