"""Chat templates rendered the way Hugging Face renders them, and where the assistant text lands.

Rendering follows ``transformers``' ``apply_chat_template`` (its ``chat_template_utils``):

- a sandboxed Jinja environment (``ImmutableSandboxedEnvironment``: templates are untrusted
  code) with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a
  ``tojson`` filter that does not escape HTML (``json.dumps``, ``ensure_ascii=False``),
  ``raise_exception(message)``, ``strftime_now(format)``, and ``dict``/``namespace`` that
  refuse underscore names;
- variables ``messages`` (each message with its ``None``-valued keys dropped, reasoning copied
  under ``reasoning_content`` and ``thinking``), ``tools`` (or ``None``), ``documents``
  (``None``), ``add_generation_prompt`` (``False`` here: training data has the answers) and the
  tokenizer's named special tokens (``bos_token``, ``eos_token``, ...);
- ``{% generation %}...{% endgeneration %}``: the text rendered inside is recorded as a
  character span ``(start, end)`` of the rendered chat (what Hugging Face's
  ``return_assistant_tokens_mask`` reads).

Where a template has no ``{% generation %}`` markers, :func:`locate_assistant_text` finds each
assistant message's text by rendering the chat a second time with every assistant content
replaced by a unique marker (``\\ue000packlab{k}\\ue001``, private-use characters): putting
the contents back in place of the markers must give exactly the first rendering, character for
character (or, for templates that ``| trim`` the content, with the stripped contents). Then
the spans are exact by construction; otherwise the record is *unlocated* (:class:`Unlocated`)
and never guessed. A template whose output depends on the content beyond copying it (a branch
on ``'</think>' in content`` that the marker takes the other way), one that renders it twice or
changes it, and an assistant message with anything beside ``role`` and ``content``
(``tool_calls``, ``reasoning_content``: text the mask would miss) leave the record unlocated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from packlab.errors import PacklabError, one_line

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
MARK_OPEN, MARK_CLOSE = "\ue000packlab", "\ue001"
# (rendered characters so far, spans) while a tracked rendering runs, None otherwise.
_TRACKING: ContextVar[tuple[list[int], list[tuple[int, int]]] | None] = ContextVar(
    "packlab_generation", default=None)


class Unlocated(Exception):  # noqa: N818 - a verdict about one record, not a failure
    """A record whose assistant text cannot be located exactly (the reason is the message)."""


class TemplateFailed(PacklabError):
    """The template raised while rendering a record (``raise_exception`` or a Jinja error)."""


class _GenerationSpans(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: records the span of what the body renders."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_span"), [], [], body).set_lineno(lineno)

    def _span(self, caller: Callable[[], str]) -> str:
        text = caller()
        tracking = _TRACKING.get()
        if tracking is not None:
            rendered, spans = tracking
            spans.append((rendered[0], rendered[0] + len(text)))
        return text


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format: str) -> str:  # noqa: A002 - the name templates call it with
    return datetime.now().strftime(format)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            f"chat templates cannot store underscore names on a namespace ({name!r})")


class _Namespace(jinja2.utils.Namespace):
    """Jinja's ``namespace`` without underscore attributes (no way to CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's own signature
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


class _Dict:
    """``dict(...)`` for templates, without exposing the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


@lru_cache(maxsize=16)
def compile_template(source: str, name: str = "chat template") -> jinja2.Template:
    """The compiled template (cached: a worker compiles each template once)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationSpans, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                       dict=_Dict(), namespace=_Namespace)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise PacklabError(f"{name}: line {exc.lineno}: not a valid Jinja template: "
                           f"{exc.message}") from None


def has_generation_markers(source: str) -> bool:
    return GENERATION.search(source) is not None


def template_messages(messages: list[Any]) -> list[Any]:
    """Messages as Hugging Face hands them to a template: ``None`` values dropped (templates
    test ``is defined``), reasoning under each name templates read."""
    out = []
    for message in messages:
        if isinstance(message, dict):
            message = {k: v for k, v in message.items() if v is not None}
            reasoning = next((message[k] for k in REASONING_KEYS if k in message), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def render(template: jinja2.Template, variables: dict[str, Any]) -> str:
    """The template rendered with ``variables``; a failure is a :class:`TemplateFailed`."""
    try:
        text = template.render(**variables)
    except Exception as exc:  # noqa: BLE001 - any error inside untrusted template code
        raise TemplateFailed(_reason(exc)) from None
    return _not_empty(text)


def render_tracked(template: jinja2.Template,
                   variables: dict[str, Any]) -> tuple[str, list[tuple[int, int]]]:
    """The rendering and the character spans of its ``{% generation %}`` blocks."""
    rendered, spans, blocks = [0], [], []
    token = _TRACKING.set((rendered, spans))
    try:
        for block in template.generate(**variables):
            blocks.append(block)
            rendered[0] += len(block)
    except Exception as exc:  # noqa: BLE001 - any error inside untrusted template code
        raise TemplateFailed(_reason(exc)) from None
    finally:
        _TRACKING.reset(token)
    return _not_empty("".join(blocks)), [(a, b) for a, b in spans if b > a]


def locate_assistant_text(template: jinja2.Template, variables: dict[str, Any]
                          ) -> tuple[str, list[tuple[int, int]]]:
    """The rendering and the span of each assistant message's text in it (see the module
    doc); raises :class:`Unlocated` when the spans cannot be proven exact."""
    messages = variables["messages"]
    text = render(template, variables)
    contents = []
    marked_messages = []
    for k, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            content = message.get("content")
            extra = sorted(set(message) - {"role", "content"})
            if extra:
                raise Unlocated(f"assistant message {k} has {', '.join(extra)}: only a template "
                                "with {% generation %} markers can mask it")
            if not isinstance(content, str):
                raise Unlocated(f"assistant message {k} has no text content: only a template "
                                "with {% generation %} markers can mask it")
            if MARK_OPEN in content:
                raise Unlocated(f"assistant message {k} contains packlab's marker characters")
            message = {**message, "content": f"{MARK_OPEN}{len(contents)}{MARK_CLOSE}"}
            contents.append(content)
        marked_messages.append(message)
    if not contents:
        return text, []
    marked = render(template, {**variables, "messages": marked_messages})
    pieces = re.split(f"{MARK_OPEN}(\\d+){MARK_CLOSE}", marked)
    order = [int(i) for i in pieces[1::2]]
    if sorted(order) != list(range(len(contents))):
        raise Unlocated("the template does not render each assistant message once, verbatim")
    for variant in (lambda c: c, str.strip):
        spans, rebuilt, at = [], [], 0
        for j, piece in enumerate(pieces):
            if j % 2:
                piece = variant(contents[int(piece)])
                spans.append((at, at + len(piece)))
            rebuilt.append(piece)
            at += len(piece)
        if "".join(rebuilt) == text:
            return text, sorted(spans)
    raise Unlocated("the template changes or inspects assistant text (rendering with the text "
                    "swapped for markers differs)")


def _not_empty(text: str) -> str:
    if not text:
        raise TemplateFailed("it renders the record as no text at all")
    return text


def _reason(exc: BaseException) -> str:
    message = one_line(exc) or type(exc).__name__
    return message[:300]
