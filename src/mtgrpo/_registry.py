"""A small name -> object registry shared by every extension point that users pick by name.

It refuses duplicate names and, when a lookup fails, lists the valid names, so a
typo in a config file is answered with the fix rather than a ``KeyError``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

__all__ = ["Registry", "import_object"]


def import_object(path: str) -> Any:
    """``"package.module:attribute"`` -> the attribute, with an error naming what failed."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{path!r} is not an import path; write it as 'package.module:name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} (from {path!r}): {exc}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError as exc:
        raise ValueError(f"module {module_name!r} has no attribute {attribute!r}") from exc


class Registry(Generic[T]):
    """Maps names (and optional aliases) to objects of one kind.

    >>> colours = Registry[int]("colour")
    >>> colours.add("red", 1, aliases=("rouge",))
    1
    >>> colours.get("rouge")
    1
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    def add(self, name: str, item: T, *, aliases: tuple[str, ...] = ()) -> T:
        for key in (name, *aliases):
            if key in self._items or key in self._aliases:
                raise ValueError(
                    f"{self.kind} {key!r} is already registered; pick another name "
                    f"(registered: {', '.join(self.names())})"
                )
        self._items[name] = item
        for alias in aliases:
            self._aliases[alias] = name
        return item

    def register(self, name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""

        def decorator(item: T) -> T:
            return self.add(name, item, aliases=aliases)

        return decorator

    def canonical(self, name: str) -> str:
        """The registered name for ``name`` or one of its aliases (case-insensitive)."""
        key = name.strip()
        for candidate in (key, key.lower()):
            if candidate in self._items:
                return candidate
            if candidate in self._aliases:
                return self._aliases[candidate]
        valid = ", ".join(self.names())
        aliases = ", ".join(f"{a} (= {n})" for a, n in sorted(self._aliases.items()))
        hint = f"; aliases: {aliases}" if aliases else ""
        raise ValueError(f"unknown {self.kind} {name!r}; valid names: {valid}{hint}")

    def get(self, name: str) -> T:
        return self._items[self.canonical(name)]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self.canonical(name)
        except ValueError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)
