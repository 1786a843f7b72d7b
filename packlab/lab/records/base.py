"""A notebook's recorded numbers as a dataclass: built from the stored JSON, written back to it.

Every notebook fills one :class:`Record` subclass (its module under :mod:`packlab.lab.records`)
and hands it to :func:`packlab.lab.results.record`; summaries, the report and the README read it
back by attribute (:func:`packlab.lab.records.load`). The JSON is the dataclass itself
(:meth:`Record.to_json`: fields by name, nested dataclasses as objects, ``dict[int, ...]`` keys
as strings, as JSON has them), and :meth:`Record.from_json` builds the dataclass from it by its
type hints: what a field holds is said once, in its annotation.

A record whose notebook once stored its numbers under flat names (``memmap_v1_warm_p50_us``:
the run kept in ``results/recorded/``) reads that shape with :meth:`Record.from_flat`, building
each name from the dimensions it knows (formats, phases, sizes from the parameters), never
parsing one.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from packlab.errors import PacklabError


@dataclasses.dataclass
class Record:
    """A notebook's headline numbers. ``NOTEBOOK`` names the notebook (``05_random_access``)."""

    NOTEBOOK: ClassVar[str] = ""

    @classmethod
    def from_json(cls, numbers: Mapping[str, Any]) -> Self:
        """The record from its stored JSON (unknown names are an error naming them)."""
        return build(cls, numbers)

    @classmethod
    def from_flat(cls, numbers: Mapping[str, Any], parameters: Mapping[str, Any]) -> Self:
        """The record from the flat names of an older run (default: the same names as the
        fields: nothing was flat)."""
        return cls.from_json(numbers)

    def to_json(self) -> dict[str, Any]:
        return to_json(self)


def to_json(value: Any) -> Any:
    """A dataclass (and what it holds) as JSON values: objects by field name, keys as strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


def build(cls: type, data: Mapping[str, Any]) -> Any:
    """A dataclass ``cls`` from a JSON object, each field converted by its type hint."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise PacklabError(f"{cls.__name__}: unknown recorded numbers {', '.join(unknown)}")
    return cls(**{name: convert(hints[name], value) for name, value in data.items()})


def convert(hint: Any, value: Any) -> Any:
    """``value`` (from JSON) as the type ``hint`` says: dataclasses built, dict keys typed."""
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return convert(inner[0], value) if len(inner) == 1 else value
    if dataclasses.is_dataclass(hint):
        return build(hint, value)
    if origin is dict:
        key, item = args
        return {convert(key, k): convert(item, v) for k, v in value.items()}
    if origin is list:
        return [convert(args[0], v) for v in value]
    if hint is int and isinstance(value, str):
        return int(value)
    return value
