"""TRL's ``environment_factory``: stateful environments whose public methods are tools.

``factory`` is a callable returning an environment, or ``{name: factory}`` with each row naming
its environment in its ``environment`` column. An environment is any object with:

* ``reset(**row)`` (required): called before each rollout with the row's columns (without the
  ``environment`` column); a string (or list of content blocks) it returns is appended to the
  prompt's last message, None leaves the prompt as it is;
* public methods (no leading underscore; not ``reset`` / ``get_reward``): the tools the model
  may call in that rollout, described to it by their signature and docstring;
* ``get_reward()`` (optional, may be ``async``): a reward channel scoring the rollout from the
  environment's state, named after the class, weight 1.

Each rollout gets an instance of its own; instances are pooled and reused (reset) across
batches, so at most as many are built per environment as one batch uses at once (TRL's
"construct once, reset often").
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["Environments", "environment_methods"]

_RESERVED = ("reset", "get_reward")


def environment_methods(environment: Any) -> list[Callable[..., Any]]:
    """The public methods of ``environment``'s class, bound to it, in name order (listed on the
    class, so properties are not evaluated)."""
    return [getattr(environment, name)
            for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
            if name not in _RESERVED and not name.startswith("_")]


class Environments:
    """The environments of a run (module docstring); ``tools`` are the standalone tools every
    rollout also gets."""

    def __init__(self, factory: Callable[[], Any] | Mapping[str, Callable[[], Any]],
                 tools: Sequence[Callable[..., Any]] = ()) -> None:
        self.multiple = isinstance(factory, Mapping)
        factories = dict(factory) if isinstance(factory, Mapping) else {None: factory}
        if not factories:
            raise ValueError("environment_factory is an empty mapping; give at least one "
                             "{name: factory}")
        self.factories: dict[str | None, Callable[[], Any]] = factories
        self.standalone = list(tools)
        self.pool: dict[str | None, list[Any]] = {}
        self.tools: dict[str | None, list[Callable[..., Any]]] = {}
        self.reward_classes: list[type] = []  # classes with get_reward, each once, in order
        for name, make in factories.items():
            if not callable(make):
                raise TypeError(f"environment_factory[{name!r}] is not callable: {make!r}")
            instance = make()  # a probe, kept as the pool's first instance
            if not callable(getattr(instance, "reset", None)):
                raise ValueError("Each environment instance returned by `environment_factory` "
                                 f"must define a callable `reset` ({type(instance).__name__} "
                                 "does not)")
            self.pool[name] = [instance]
            self.tools[name] = self.standalone + environment_methods(instance)
            # one channel per class, as TRL: two names for one class must not score it twice
            if callable(getattr(instance, "get_reward", None)) and \
                    type(instance) not in self.reward_classes:
                self.reward_classes.append(type(instance))

    @property
    def names(self) -> list[str | None]:
        return list(self.factories)

    def all_tools(self) -> list[Callable[..., Any]]:
        """Every tool of every environment (each probe's methods) and the standalone ones."""
        seen: list[Callable[..., Any]] = []
        for tools in self.tools.values():
            seen += [t for t in tools if t not in seen]
        return seen

    def check_names(self, names: Sequence[Any]) -> None:
        unknown = sorted({str(n) for n in names if n not in self.factories})
        if unknown:
            raise ValueError(
                f"Example has `environment={unknown[0]!r}`, which is not among the environments "
                f"passed to `environment_factory`. Expected one of: {self.names}.")

    def instances(self, names: Sequence[str | None]) -> list[Any]:
        """One instance per rollout (``names[i]`` its environment), from the pool."""
        self.check_names(names)
        handed: dict[str | None, int] = {}
        chosen = []
        for name in names:
            pool, index = self.pool[name], handed.get(name, 0)
            if index == len(pool):  # TRL's pool: grows only when a batch needs more at once
                pool.append(self.factories[name]())
            handed[name] = index + 1
            chosen.append(pool[index])
        return chosen

    def rollout_tools(self, environment: Any) -> list[Callable[..., Any]]:
        return self.standalone + environment_methods(environment)

    def reward_function(self, environment_class: type) -> Callable[..., list[float | None]]:
        """A reward function (TRL's contract) reading ``get_reward()`` of the rollouts whose
        environment is exactly ``environment_class`` (None for the others)."""
        # exact type, not isinstance (TRL's rule): a subclass that is itself a registered
        # environment would otherwise be scored by both channels
        if inspect.iscoroutinefunction(environment_class.get_reward):
            async def get_reward(environments: Sequence[Any], **_: Any) -> list[float | None]:
                return [await e.get_reward() if type(e) is environment_class else None
                        for e in environments]
        else:
            def get_reward(environments: Sequence[Any], **_: Any) -> list[float | None]:
                return [e.get_reward() if type(e) is environment_class else None
                        for e in environments]
        get_reward.__name__ = environment_class.__name__
        return get_reward


def with_observation(prompt: Sequence[Mapping[str, Any]], observation: Any) -> list[dict[str, Any]]:
    """``prompt`` with ``observation`` appended to its last message's content (TRL's rule for a
    text or content-block observation); the input is left untouched."""
    messages = [dict(m) for m in prompt]
    if observation is None:
        return messages
    content = messages[-1].get("content", "")
    # text and content blocks do not concatenate: the text side becomes a text block
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    messages[-1]["content"] = content + observation
    return messages
