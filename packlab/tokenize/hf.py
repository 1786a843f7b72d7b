"""The ``--tokenizer`` path: any Hugging Face ``tokenizer.json`` and its Jinja chat template.

``PATH`` is a ``tokenizer.json`` file or a Hugging Face tokenizer folder (``tokenizer.json``,
``tokenizer_config.json``). The chat template is, in this order: ``--chat-template FILE`` (a
Jinja file, or the name of a template packlab ships: :data:`BUILTIN_TEMPLATES`), the folder's
``chat_template.jinja``, the ``chat_template`` of its ``tokenizer_config.json`` (a string, or a
list of named templates: ``tool_use`` for records with tools when there is one, else
``default``). The named special tokens of ``tokenizer_config.json`` (``bos_token``,
``eos_token``, ``unk_token``, ``sep_token``, ``pad_token``, ``cls_token``, ``mask_token``)
are template variables, as in ``transformers`` 5 (a bare ``tokenizer.json`` has none).

One record becomes one sequence, as ``apply_chat_template(messages, tools=...,
tokenize=True, add_generation_prompt=False)`` gives it: the rendered chat (see
:mod:`packlab.tokenize.chat_template`) encoded whole with ``add_special_tokens=False`` (added
tokens, special-token strings included, are matched anywhere in the text, as Hugging Face does
by default: a user who types ``<|im_end|>`` gets the token). Truncation and padding stored in
``tokenizer.json`` are switched off.

The loss mask (unshifted, 1 = learn) is 1 on exactly the assistant turns:

- **generation** (the template has ``{% generation %}`` markers): the tokens of every span the
  markers record (what Hugging Face's ``return_assistant_tokens_mask`` marks);
- **located** (no markers): the tokens of each assistant message's text, found exactly (the
  marker rendering of :func:`~packlab.tokenize.chat_template.locate_assistant_text`), plus the
  end-of-turn token: the token right after the text when it is a special token
  (``<|im_end|>``, ``<|eot_id|>``, ``</s>``), so the model learns to stop. A turn followed by
  no special token is counted (``assistant_turns_without_end_token``).

A token that straddles the edge of a span (the text before or after merged into it) makes the
mask inexact: the record is *unlocated*, counted and named, never written with a guessed mask
(Hugging Face would mark the straddling token). With the templates here that happens only when
assistant text starts or ends with whitespace that merges with the template's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from packlab.errors import PacklabError, one_line
from packlab.storage.files import read_json, sha256_file
from packlab.tokenize.bpe import message_objects
from packlab.tokenize.chat_template import (
    TemplateFailed,
    Unlocated,
    compile_template,
    has_generation_markers,
    locate_assistant_text,
    render_tracked,
    template_messages,
)

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
BUILTIN_TEMPLATES = tuple(sorted(p.stem for p in TEMPLATE_DIR.glob("*.jinja")))
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                      "cls_token", "mask_token")
TOKENIZER_FILE, CONFIG_FILE, TEMPLATE_FILE = ("tokenizer.json", "tokenizer_config.json",
                                              "chat_template.jinja")


def builtin_template(name: str) -> str:
    """The source of a template packlab ships (``templates/NAME.jinja``)."""
    if name not in BUILTIN_TEMPLATES:
        raise PacklabError(f"no chat template named {name!r}; packlab ships "
                           f"{', '.join(BUILTIN_TEMPLATES)}")
    return (TEMPLATE_DIR / f"{name}.jinja").read_text(encoding="utf-8")


@dataclass(frozen=True)
class TokenizerSpec:
    """Everything a worker needs to rebuild the tokenizer: plain values, picklable."""

    tokenizer_file: str
    tokenizer_sha256: str
    templates: tuple[tuple[str, str], ...]  # (name, source); one unnamed template is ("", src)
    template_origin: str
    variables: tuple[tuple[str, str], ...] = field(default=())


def tokenizer_spec(path: str | os.PathLike[str],
                   chat_template: str | os.PathLike[str] | None = None) -> TokenizerSpec:
    """Read ``PATH`` (and ``--chat-template``) into a spec; every defect is one clear error."""
    path = Path(path)
    if path.is_dir():
        file, config = path / TOKENIZER_FILE, _read_config(path / CONFIG_FILE)
        if not file.is_file():
            raise PacklabError(f"{path}: not a Hugging Face tokenizer folder (no "
                               f"{TOKENIZER_FILE})")
    elif path.is_file():
        file, config = path, {}
    else:
        raise PacklabError(f"{path}: no such tokenizer file or folder")
    digest = sha256_file(file)
    load_tokenizer(str(file.resolve()), digest)  # fails here, once, if it is not a tokenizer
    templates, origin = _templates(path, config, chat_template)
    for name, source in templates:
        compile_template(source, f"{origin}{f' ({name})' if name else ''}")
    variables = tuple((key, token) for key in SPECIAL_TOKEN_KEYS
                      if (token := _token_text(config.get(key))) is not None)
    return TokenizerSpec(str(file.resolve()), digest, templates, origin, variables)


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    config = read_json(path, unreadable="not valid JSON")
    if not isinstance(config, dict):
        raise PacklabError(f"{path}: expected a JSON object")
    return config


def _templates(path: Path, config: dict[str, Any], chat_template: str | os.PathLike[str] | None
               ) -> tuple[tuple[tuple[str, str], ...], str]:
    """``((name, source), ...)`` and where they came from."""
    if chat_template is not None:
        file = Path(chat_template)
        if file.is_file():
            return (("", _read_text(file)),), str(file)
        if str(chat_template) in BUILTIN_TEMPLATES:
            return (("", builtin_template(str(chat_template))),), f"packlab:{chat_template}"
        raise PacklabError(f"{chat_template}: no such chat template file (packlab ships "
                           f"{', '.join(BUILTIN_TEMPLATES)})")
    if path.is_dir() and (path / TEMPLATE_FILE).is_file():
        return (("", _read_text(path / TEMPLATE_FILE)),), str(path / TEMPLATE_FILE)
    found = config.get("chat_template")
    where = str(path / CONFIG_FILE)
    if isinstance(found, str):
        return (("", found),), where
    if isinstance(found, list) and found and all(
            isinstance(t, dict) and isinstance(t.get("name"), str)
            and isinstance(t.get("template"), str) for t in found):
        named = tuple((t["name"], t["template"]) for t in found)
        if "default" not in dict(named):
            raise PacklabError(f"{where}: named chat templates without a 'default'")
        return named, where
    if found is not None:
        raise PacklabError(f"{where}: chat_template must be a string or a list of "
                           "{\"name\", \"template\"} objects")
    raise PacklabError(f"{path}: no chat template (pass --chat-template FILE, or one of "
                       f"{', '.join(BUILTIN_TEMPLATES)})")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PacklabError(f"{path}: not UTF-8 text ({exc.reason})") from None


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` stores it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@lru_cache(maxsize=4)
def load_tokenizer(file: str, sha256: str) -> Any:
    """A ``tokenizers.Tokenizer`` from ``tokenizer.json``, ready to encode as Hugging Face does
    in ``apply_chat_template``: no truncation, no padding, raw character offsets. Cached by
    path and content (``sha256``), so a file rewritten in place is loaded again, and a file
    that changed since the spec was made is refused."""
    from tokenizers import Tokenizer

    if sha256_file(Path(file)) != sha256:
        raise PacklabError(f"{file}: changed while tokenizing (its sha256 is not {sha256})")
    try:
        tokenizer = Tokenizer.from_file(file)
    except Exception as exc:  # noqa: BLE001 - the Rust loader's errors are plain Exceptions
        reason = one_line(exc, 200)
        raise PacklabError(f"{file}: not a Hugging Face tokenizer.json ({reason})") from None
    tokenizer.no_truncation()
    tokenizer.no_padding()
    # A post-processor adds nothing without special tokens, but ByteLevel's trims offsets
    # (" world" would start at "w"): spans are checked on the untrimmed ones.
    tokenizer.post_processor = None
    return tokenizer


class HFChatTokenizer:
    """A Hugging Face tokenizer and chat template: chat records into tokens and mask."""

    def __init__(self, spec: TokenizerSpec) -> None:
        self.spec = spec
        self.tokenizer = tokenizer = load_tokenizer(spec.tokenizer_file, spec.tokenizer_sha256)
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1
        added = tokenizer.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        self.templates = {name: compile_template(source) for name, source in spec.templates}
        self.generation = {name: has_generation_markers(source)
                           for name, source in spec.templates}
        self.variables = dict(spec.variables)

    def describe(self) -> dict[str, Any]:
        """What the spool record says about this tokenizer (its ``source``)."""
        marked = set(self.generation.values())
        return {"tokenizer": self.spec.tokenizer_file,
                "tokenizer_sha256": self.spec.tokenizer_sha256,
                "chat_template_origin": self.spec.template_origin,
                "chat_template": (self.spec.templates[0][1] if len(self.spec.templates) == 1
                                  else dict(self.spec.templates)),
                "special_tokens": self.variables,
                "mask": ("assistant_generation" if marked == {True} else
                         "assistant_located" if marked == {False} else
                         "assistant_generation_or_located")}

    def _template(self, tools: Any) -> str:
        if len(self.templates) == 1:
            return next(iter(self.templates))
        return "tool_use" if tools is not None and "tool_use" in self.templates else "default"

    def render(self, record: dict[str, Any], where: str) -> tuple[str, list[tuple[int, int]],
                                                                     bool]:
        """The rendered chat, its assistant spans, and whether they came from markers."""
        messages, tools = chat_inputs(record, where)
        name = self._template(tools)
        variables = {**self.variables, "messages": template_messages(messages), "tools": tools,
                     "documents": None, "add_generation_prompt": False}
        try:
            if self.generation[name]:
                text, spans = render_tracked(self.templates[name], variables)
            else:
                text, spans = locate_assistant_text(self.templates[name], variables)
        except TemplateFailed as exc:
            raise PacklabError(f"{where}: the chat template failed: {exc}") from None
        return text, spans, self.generation[name]

    def encode_record(self, record: dict[str, Any], where: str
                      ) -> tuple[np.ndarray, np.ndarray, int]:
        """Tokens, mask and the number of assistant turns without an end-of-turn token;
        raises :class:`Unlocated` when the mask cannot be exact."""
        text, spans, marked = self.render(record, where)
        try:
            encoding = self.tokenizer.encode(text, add_special_tokens=False)
        except Exception as exc:  # noqa: BLE001 - the Rust encoder's errors
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as bad:  # a lone surrogate ("\ud800" in the JSON)
                raise PacklabError(f"{where}: content is not valid Unicode text "
                                   f"({bad.reason} at position {bad.start})") from None
            raise PacklabError(f"{where}: cannot encode the rendered chat "
                               f"({one_line(exc, 200)})") from None
        mask, missing_end = span_mask(encoding, spans, len(text), end_of_turn=not marked,
                                      special_ids=self.special_ids)
        return np.array(encoding.ids, dtype=np.int32), mask, missing_end

    def decode(self, tokens: Any) -> str:
        """Text of token ids, special tokens included (exact for byte-level BPE)."""
        return self.tokenizer.decode(np.asarray(tokens).tolist(), skip_special_tokens=False)


def chat_inputs(record: dict[str, Any], where: str) -> tuple[list[dict[str, Any]], Any]:
    """A record's ``messages`` (checked: a non-empty list of objects with a string ``role``) and
    ``tools`` (a list, or None); errors start with ``where``."""
    messages = message_objects(record, where)
    for k, message in enumerate(messages):
        if not isinstance(message.get("role"), str):
            raise PacklabError(f"{where}: message {k}: \"role\" must be a string")
    tools = record.get("tools")
    if tools is not None and not (isinstance(tools, list)
                                  and all(isinstance(t, dict) for t in tools)):
        raise PacklabError(f"{where}: \"tools\" must be a list of JSON schemas (objects)")
    return messages, tools


def span_mask(encoding: Any, spans: list[tuple[int, int]], text_length: int, *,
              end_of_turn: bool, special_ids: frozenset[int]) -> tuple[np.ndarray, int]:
    """1 on the tokens of ``encoding`` (a ``tokenizers.Encoding`` of a text of
    ``text_length`` characters) inside ``spans`` (character ranges), plus, with
    ``end_of_turn``, the special token right after each span; and how many spans had none.
    Raises :class:`Unlocated` when a token straddles an edge."""
    ids = encoding.ids
    mask = np.zeros(len(ids), dtype=np.uint8)
    missing = 0
    for a, b in spans:
        first = _token_at(encoding, a, text_length, len(ids))
        stop = _token_at(encoding, b, text_length, len(ids))
        mask[first:stop] = 1
        if end_of_turn:
            if stop < len(ids) and ids[stop] in special_ids:
                mask[stop] = 1
            else:
                missing += 1
    return mask, missing


def _token_at(encoding: Any, char: int, text_length: int, count: int) -> int:
    """The token that starts exactly at character ``char`` (``count`` at the end)."""
    if char >= text_length:
        return count
    token = encoding.char_to_token(char)
    if token is None:
        raise Unlocated(f"no token covers character {char} (the tokenizer drops it)")
    if encoding.token_to_chars(token)[0] != char:
        raise Unlocated(f"a token straddles the edge of assistant text (character {char})")
    return int(token)
