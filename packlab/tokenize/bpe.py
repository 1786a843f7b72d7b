"""The ``--encoding`` path: bpe-openai's cl100k/o200k with packlab's fixed ChatML template.

Input: one JSON object per line with ``"messages"``: a non-empty list of
``{"role": "system" | "user" | "assistant" | "tool", "content": str}``. Other top-level keys
(ids, metadata) are ignored; other keys inside a message are refused, since dropping them
(``tool_calls``, ``name``) would silently change the conversation.

The chat template (ChatML-style), applied to every message in order, nothing appended::

    <|im_start|>{role}\\n{content}<|im_end|>\\n

``<|im_start|>`` and ``<|im_end|>`` are single special tokens with ids just past the BPE
vocabulary, so no text can produce them (a literal ``"<|im_end|>"`` inside content is encoded
as ordinary text)::

    encoding      BPE ids (n_vocab)  <|im_start|>  <|im_end|>  vocab_size (in the record)
    cl100k_base   0..100276          100277        100278      100279
    o200k_base    0..200018          200019        200020      200021

``{role}\\n``, ``{content}`` and ``\\n`` are encoded separately, so token boundaries fall on the
template boundaries and the decode of a message's content tokens is exactly its content.

Mask (response-only, unshifted, as the spool stores it): 1 on an assistant message's content
tokens and its ``<|im_end|>`` (the model must learn to stop), 0 everywhere else (special
tokens, role headers, the newline after ``<|im_end|>``, all other roles).

Encoding calls the Rust backend of ``bpe-openai`` directly: its tiktoken-style wrapper caps a
call at 200k tokens and silently replaces lone surrogates, both wrong here (a lone surrogate
is an error naming the line instead).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

import numpy as np

from packlab.errors import PacklabError
from packlab.storage.files import json_kind

# One past the largest id each encoding defines (BPE ranks and its own special tokens); fixed
# here so encoding never loads the Python rank tables (a test checks them against bpe-openai).
N_VOCAB = {"cl100k_base": 100_277, "o200k_base": 200_019}
ENCODINGS = tuple(N_VOCAB)
ROLES = ("system", "user", "assistant", "tool")
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TEMPLATE = "chatml"


class ChatTokenizer:
    """One BPE encoding plus the two template tokens; encodes chats into tokens and mask."""

    def __init__(self, encoding: str = "cl100k_base") -> None:
        if encoding not in ENCODINGS:
            raise PacklabError(f"unknown encoding {encoding!r}: choose one of "
                               f"{', '.join(ENCODINGS)} (offline, shipped in bpe-openai)")
        self.encoding = encoding
        self._backend = _backend(encoding)
        self.n_vocab = N_VOCAB[encoding]
        self.im_start = self.n_vocab
        self.im_end = self.n_vocab + 1
        self.vocab_size = self.n_vocab + 2
        self.special_tokens = {IM_START: self.im_start, IM_END: self.im_end}
        self._headers = {role: self._with(self.im_start, f"{role}\n") for role in ROLES}
        self._im_end = np.array([self.im_end], dtype=np.int32)
        self._newline = self.encode_text("\n")

    def _with(self, first: int, text: str) -> np.ndarray:
        return np.concatenate(([first], self.encode_text(text))).astype(np.int32)

    def encode_text(self, text: str) -> np.ndarray:
        """Plain text to BPE ids (int32); special-token strings are encoded as ordinary text."""
        if not text:
            return np.empty(0, dtype=np.int32)
        return np.array(self._backend.encode(text), dtype=np.int32)

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and response-only mask of one validated conversation (see the module doc)."""
        pieces: list[np.ndarray] = []
        values: list[int] = []
        for message in messages:
            learn = int(message["role"] == "assistant")
            content = self.encode_text(message["content"])
            pieces += [self._headers[message["role"]], content, self._im_end, self._newline]
            values += [0, learn, learn, 0]
        tokens = np.concatenate(pieces)
        lengths = [p.shape[0] for p in pieces]
        return tokens, np.repeat(np.array(values, dtype=np.uint8), lengths)

    def encode_record(self, record: dict[str, Any], where: str
                      ) -> tuple[np.ndarray, np.ndarray, int]:
        """Tokens, mask and 0 (every assistant turn ends with ``<|im_end|>``) of one JSONL
        record; errors start with ``where`` (file and line)."""
        messages = validate_messages(record, where)
        try:
            return (*self.encode_chat(messages), 0)
        except UnicodeEncodeError as exc:
            raise PacklabError(f"{where}: content is not valid Unicode text "
                               f"({exc.reason} at position {exc.start})") from None

    def describe(self) -> dict[str, Any]:
        """What the spool record says about this tokenizer (its ``source``)."""
        return {"encoding": self.encoding, "template": TEMPLATE,
                "special_tokens": self.special_tokens, "mask": "response_only"}

    def render_text(self, messages: Sequence[dict[str, str]]) -> str:
        """The template as text: what :meth:`decode` of :meth:`encode_chat` returns."""
        return "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)

    def decode_bytes(self, tokens: Iterable[int] | np.ndarray) -> bytes:
        """Exact bytes of any token sequence; template tokens become their strings."""
        table = _byte_table(self.encoding)
        specials = {v: k.encode() for k, v in self.special_tokens.items()}
        out = []
        for token in np.asarray(tokens, dtype=np.int64).tolist():
            if token in specials:
                out.append(specials[token])
            elif 0 <= token < len(table) and table[token]:
                out.append(table[token])
            else:
                raise PacklabError(f"token id {token} is not defined in {self.encoding} "
                                   f"with the {TEMPLATE} template")
        return b"".join(out)

    def decode(self, tokens: Iterable[int] | np.ndarray, errors: str = "strict") -> str:
        """Text of a token sequence; ``errors="replace"`` for slices that split a character."""
        return self.decode_bytes(tokens).decode("utf-8", errors=errors)


@cache
def _backend(encoding: str) -> Any:
    with warnings.catch_warnings():  # bpe-openai uses the deprecated resources.open_binary
        warnings.simplefilter("ignore", DeprecationWarning)
        from bpe_openai import _bindings

        return _bindings.tokenizer_for_encoding(encoding)


@cache
def _byte_table(encoding: str) -> tuple[bytes, ...]:
    """Bytes of every id (b"" where undefined); built once, only when decoding."""
    from bpe_openai import registry

    with warnings.catch_warnings():  # bpe-openai uses the deprecated resources.open_binary
        warnings.simplefilter("ignore", DeprecationWarning)
        meta = registry.ENCODING_CONSTRUCTORS[encoding]()
    table = [b""] * N_VOCAB[encoding]
    for piece, rank in meta["mergeable_ranks"].items():
        table[rank] = piece
    for name, rank in meta["special_tokens"].items():
        table[rank] = name.encode()
    return tuple(table)


def decode(tokens: Iterable[int] | np.ndarray, *, encoding: str = "cl100k_base",
           errors: str = "strict") -> str:
    """Tokens of a spool written by :func:`tokenize_chat_jsonl` back to text (exact)."""
    return ChatTokenizer(encoding).decode(tokens, errors=errors)


detokenize = decode


def message_objects(record: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The record's ``messages``: a non-empty list of objects (what every template needs);
    errors start with ``where`` (file and line)."""
    messages = record.get("messages")
    if not isinstance(messages, list):
        raise PacklabError(f"{where}: expected \"messages\": a list of "
                           f"{{\"role\", \"content\"}} objects")
    if not messages:
        raise PacklabError(f"{where}: \"messages\" is empty")
    for k, message in enumerate(messages):
        if not isinstance(message, dict):
            raise PacklabError(f"{where}: message {k}: expected an object, "
                               f"got {json_kind(message)}")
    return messages


def validate_messages(record: dict[str, Any], where: str) -> list[dict[str, str]]:
    """The record's messages, checked for this template: ``role`` and string ``content``
    only; errors start with ``where`` (file and line)."""
    messages = message_objects(record, where)
    for k, message in enumerate(messages):
        extra = sorted(set(message) - {"role", "content"})
        if extra:
            raise PacklabError(f"{where}: message {k}: unsupported keys {', '.join(extra)} "
                               f"(only \"role\" and \"content\")")
        role = message.get("role")
        if role not in ROLES:
            raise PacklabError(f"{where}: message {k}: role {role!r} is not one of "
                               f"{', '.join(ROLES)}")
        if not isinstance(message.get("content"), str):
            raise PacklabError(f"{where}: message {k}: \"content\" must be a string, "
                               f"got {json_kind(message.get('content'))}")
    return messages
