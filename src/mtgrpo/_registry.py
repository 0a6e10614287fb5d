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

    def __init__(self, kind: str, *, provider: str | None = None) -> None:
        self.kind = kind
        self.provider = provider  # the module that registers declared names (for errors)
        self._items: dict[str, T] = {}
        self._aliases: dict[str, str] = {}
        self._declared: set[str] = set()  # names whose object is not registered yet

    def declare(self, name: str, *, aliases: tuple[str, ...] = ()) -> None:
        """Name a choice whose object a module registers later (with :meth:`add`): the name
        and its aliases are known at once (``canonical``, ``in``, ``names``) without importing
        that module; :meth:`get` works once it is registered."""
        self._check_free((name, *aliases))
        self._declared.add(name)
        self._items[name] = None  # type: ignore[assignment]
        for alias in aliases:
            self._aliases[alias] = name

    def add(self, name: str, item: T, *, aliases: tuple[str, ...] = ()) -> T:
        if name in self._declared:  # the object of a declared name: its aliases were declared
            undeclared = [a for a in aliases if self._aliases.get(a) != name]
            if undeclared:
                raise ValueError(f"{self.kind} {name!r} was declared without the aliases "
                                 f"{undeclared}; declare them with the name")
            self._declared.discard(name)
            self._items[name] = item
            return item
        self._check_free((name, *aliases))
        self._items[name] = item
        for alias in aliases:
            self._aliases[alias] = name
        return item

    def _check_free(self, keys: tuple[str, ...]) -> None:
        for key in keys:
            if key in self._items or key in self._aliases:
                raise ValueError(
                    f"{self.kind} {key!r} is already registered; pick another name "
                    f"(registered: {', '.join(self.names())})"
                )

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
        key = self.canonical(name)
        if key in self._declared:
            where = f" (import {self.provider})" if self.provider else ""
            raise LookupError(f"{self.kind} {key!r} is declared but its implementation is not "
                              f"loaded yet{where}")
        return self._items[key]

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
