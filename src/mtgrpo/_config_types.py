"""Type checks of configuration options against their annotations, with errors that name them.

``GRPOConfig(learning_rate="fast")`` would otherwise fail deep inside a range check with
``'>=' not supported between instances of 'str' and 'int'``; here it fails first with
``learning_rate: 'fast' (a str) is not a number; ...``. Annotations understood: ``bool``,
``int``, ``float`` (an int is accepted), ``str``, ``list[...]``, ``dict[...]``, unions with
``None``, dataclasses and ``Any``; anything else is not checked.
"""

from __future__ import annotations

import dataclasses
import numbers
import types
import typing
from collections.abc import Mapping
from typing import Any

__all__ = ["check_option_types"]


def check_option_types(config: Any, section: str = "") -> None:
    """Raise ``TypeError`` naming the first option of the dataclass ``config`` whose value
    does not have its annotated type, the value, the expected type and the fix."""
    hints = typing.get_type_hints(type(config))
    for option in dataclasses.fields(config):
        value, expected = getattr(config, option.name), hints[option.name]
        if not _matches(value, expected):
            name = f"{section}.{option.name}" if section else option.name
            raise TypeError(
                f"{name}: {value!r:.80} ({type(value).__name__}) is not {_describe(expected)}; "
                f"set {name} to {_describe(expected)} in the run file or with --{name}"
            )


def _union_args(kind: Any) -> tuple[Any, ...] | None:
    origin = typing.get_origin(kind)
    return typing.get_args(kind) if origin in (typing.Union, types.UnionType) else None


def _matches(value: Any, kind: Any) -> bool:
    members = _union_args(kind)
    if members is not None:
        return any(_matches(value, member) for member in members)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return True
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple)) and all(
            _matches(item, args[0]) for item in value
        ) if args else isinstance(value, (list, tuple))
    if origin is dict or kind is dict:
        return isinstance(value, Mapping)
    if dataclasses.is_dataclass(kind):
        return isinstance(value, kind)
    return True


def _describe(kind: Any) -> str:
    members = _union_args(kind)
    if members is not None:
        return " or ".join(_describe(member) for member in members)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
             type(None): "null"}  # fmt: skip
    if kind in names:
        return names[kind]
    if origin in (list, tuple):
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s" \
            if args else "a list"
    if origin is dict or kind is dict:
        return "a mapping"
    return getattr(kind, "__name__", str(kind))
