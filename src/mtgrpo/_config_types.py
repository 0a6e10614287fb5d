"""The building blocks of every configuration dataclass: help text, type checks, unknown keys.

:func:`option` declares a field with its help text (written once; docs/configuration.md and
the command-line flags are derived from it); :func:`build_section` builds a section from a run
file's mapping, refusing unknown keys with the closest valid name and reading numbers YAML left
as strings.

``GRPOConfig(learning_rate="fast")`` would otherwise fail deep inside a range check with
``'>=' not supported between instances of 'str' and 'int'``; here it fails first with
``learning_rate: 'fast' (a str) is not a number; ...``. Annotations understood: ``bool``,
``int``, ``float`` (an int is accepted), ``str``, ``list[...]``, ``dict[...]``, unions with
``None``, dataclasses and ``Any``; anything else is not checked.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import numbers
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["build_section", "check_option_types", "checked_keywords", "coerce_numbers", "option",
           "parse_bytes", "refuse_unknown"]


def option(text: str, **kwargs: Any) -> Any:
    """A dataclass field whose help text is written once, in its metadata."""
    return dataclasses.field(metadata={"help": text}, **kwargs)


def refuse_unknown(keys: Sequence[str], valid: Sequence[str], where: str, *,
                   error: type[Exception] = ValueError, fix: str = "") -> None:
    """``error`` (``ValueError``; a keyword argument's is a ``TypeError``) naming every key of
    ``keys`` (not in ``valid``) with the closest valid name, the valid names when there are few
    enough to read, and ``fix``; nothing when ``keys`` is empty."""
    if keys:
        hints = []
        for key in keys:
            close = difflib.get_close_matches(str(key), list(valid), n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        listing = f"; valid: {', '.join(sorted(valid))}" if len(valid) <= 40 else ""
        raise error(f"unknown {where} option(s): {', '.join(hints)}{listing}"
                    + (f"; {fix}" if fix else ""))


def checked_keywords(cls: type, fix: str | None = None) -> type:
    """Wrap the dataclass ``__init__`` of ``cls``: a misspelled keyword is a ``TypeError`` that
    names the closest options (the run file's check, :func:`refuse_unknown`), where Python
    says only "unexpected keyword argument"; ``fix`` says where the options are listed."""
    generated = cls.__init__
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    fix = fix or f"correct the name ({cls.__name__}'s options are listed in docs/configuration.md)"

    # wraps: inspect.signature and help() follow __wrapped__ to the generated parameters
    @functools.wraps(generated)
    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        refuse_unknown([key for key in kwargs if key not in names], names, cls.__name__,
                       error=TypeError, fix=fix)
        generated(self, *args, **kwargs)

    cls.__init__ = checked_init  # type: ignore[assignment]
    return cls


def coerce_numbers(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """Numbers written as strings (YAML reads ``1e-5`` as a string) become numbers when the
    field is numeric; anything unparseable is left for validation to report."""
    hints = typing.get_type_hints(cls)
    out = dict(values)
    for name, value in values.items():
        if not isinstance(value, str) or name not in hints:
            continue
        # a union's members, or the bare type
        kinds = set(typing.get_args(hints[name])) or {hints[name]}
        for kind in (int, float):  # int first: "8" stays an int
            if kind in kinds:
                try:
                    out[name] = kind(value)
                    break
                except ValueError:
                    continue
    return out


def build_section(cls: type, values: Any, where: str) -> Any:
    """``cls(**values)`` for a run file's section ``where``: a mapping, unknown keys refused."""
    if not isinstance(values, Mapping):
        raise ValueError(f"the {where} section must be a mapping of options, got "
                         f"{type(values).__name__} {values!r:.80}")
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    refuse_unknown([k for k in values if k not in names], names, where)
    return cls(**coerce_numbers(cls, values))


def check_option_types(config: Any, section: str = "") -> None:
    """Raise ``TypeError`` naming the first option of the dataclass ``config`` whose value
    does not have its annotated type, the value, the expected type and the fix."""
    # resolved: under `from __future__ import annotations` field.type is a string
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
    if origin is typing.Literal:  # the type here; the value where the choice is checked, which
        return isinstance(value, tuple({type(a) for a in args}))  # lists the valid names
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    # numbers.Integral takes numpy's integers too; bool, an int subclass, is no count
    if kind is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    # an int is a number here (module docstring); a bool is not
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
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (list, tuple):
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s" \
            if args else "a list"
    if origin is dict or kind is dict:
        return "a mapping"
    return getattr(kind, "__name__", str(kind))


# SI units count in 1000s, IEC units (KiB, MiB, ...) in 1024s
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)


def parse_bytes(value: str | int, name: str) -> int:
    """``"4GiB"``, ``"512MiB"``, ``"1.5GB"`` or a byte count -> bytes, or an error naming the
    value and the accepted forms."""
    if isinstance(value, bool):  # an int subclass: True is no size
        raise ValueError(f"{name}={value!r} is not a size; write e.g. '4GiB' or a byte count")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"{name}={value} must be a positive number of bytes")
        return value
    match = _SIZE.match(str(value))
    if match is None:
        raise ValueError(f"{name}={value!r} is not a size; write a number with an optional "
                         "unit: B, KB, MB, GB, KiB, MiB, GiB (e.g. '4GiB', '512MiB')")
    size = int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])
    if size <= 0:
        raise ValueError(f"{name}={value!r} must be more than 0 bytes")
    return size
