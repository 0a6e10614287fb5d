"""Small adapters onto the batched reward contract: channel declaration, per-completion
functions (the ``multireward-grpo`` shape) and conditioning gates."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mtgrpo.algo.advantages import GATE_MODES
from mtgrpo.rewards.core import (
    GateSpec,
    RewardCallable,
    RewardFunction,
    _channel_tuple,
    _finite_float,
    as_reward_function,
    callable_name,
    is_async_callable,
)

__all__ = ["conditioned", "per_completion", "reward_channels"]


def reward_channels(
    *channels: str, name: str | None = None, weights: Sequence[float] | None = None
) -> Callable[[RewardCallable], RewardFunction]:
    """Decorator declaring the channels of a multi-channel batched reward function.

    >>> @reward_channels("compliance", "politeness", weights=(1.0, 0.5))
    ... def judge(prompts, completions, **kwargs):
    ...     return [(1.0, 0.2) for _ in completions]
    >>> judge.column_names
    ['judge/compliance', 'judge/politeness']

    Per completion the function returns a tuple in the declared order, a dict keyed by channel
    name, or ``None``; an element may itself be ``None`` (that channel does not apply).
    ``@reward_channels(("a", "b"))`` (one sequence) is accepted as well.
    """
    if len(channels) == 1 and not isinstance(channels[0], str):
        channels = tuple(channels[0])
    declared = _channel_tuple(channels, name or "<decorated function>")

    def decorate(fn: RewardCallable) -> RewardFunction:
        return RewardFunction(fn, name=name, channels=declared, weights=weights)

    return decorate


def per_completion(
    fn: Callable[..., Any],
    channels: Sequence[str] | None = None,
    name: str | None = None,
    *,
    weights: float | Sequence[float] | None = None,
    row_columns: Sequence[str] = (),
) -> RewardFunction:
    """Adapt a per-sample ``fn(completion, prompt) -> float | tuple | dict | None`` to the
    batched contract (the reward signature of the ``multireward-grpo`` package).

    ``prompt`` is passed as given: a string, chat messages, or a dict with metadata. With
    ``channels`` declared, ``fn`` returns a tuple in that order (or a dict keyed by channel);
    without, one number. ``row_columns`` names dataset columns passed to ``fn`` as keyword
    arguments, one value per completion (e.g. ``row_columns=("answer",)`` calls
    ``fn(completion, prompt, answer=...)``); other columns and trainer extras are not passed.
    An ``async def fn`` is awaited concurrently over the batch.
    """
    # a batched function would be called once per sample, with the wrong arguments
    if isinstance(fn, RewardFunction):
        raise TypeError(
            f"per_completion expects a per-sample fn(completion, prompt), got the batched "
            f"RewardFunction {fn.name!r}; pass the per-sample function itself"
        )
    if not callable(fn):
        raise TypeError(f"per_completion expects a callable, got {type(fn).__name__}")
    if isinstance(row_columns, str):  # 'answer' would otherwise be the columns 'a', 'n', ...
        row_columns = (row_columns,)
    # an async fn keeps an async wrapper, so the suite awaits it with the others
    adapter_type = _AsyncPerCompletion if is_async_callable(fn) else _PerCompletion
    batched = adapter_type(fn, tuple(row_columns))
    return RewardFunction(
        batched, name=name or callable_name(fn), channels=channels, weights=weights
    )


@dataclass(frozen=True)
class _PerCompletion:
    """The batched form of a per-sample reward (a class, not a closure, so it pickles)."""

    fn: Callable[..., Any]
    row_columns: tuple[str, ...]

    def _rows(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[tuple[Any, Any, dict[str, Any]]]:
        missing = [c for c in self.row_columns if c not in columns]
        if missing:
            raise KeyError(f"row_columns {missing} are not dataset columns (got {sorted(columns)})")
        kwargs = [{c: columns[c][i] for c in self.row_columns} for i in range(len(completions))]
        return list(zip(prompts, completions, kwargs, strict=True))

    def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> list[Any]:
        # completion first: multireward-grpo's order fn(completion, prompt)
        return [self.fn(c, p, **kw) for p, c, kw in self._rows(prompts, completions, columns)]


@dataclass(frozen=True)
class _AsyncPerCompletion(_PerCompletion):
    """Awaits the per-sample coroutines of a batch concurrently."""

    async def __call__(  # type: ignore[override]
        self, prompts: list[Any], completions: list[Any], **columns: Any
    ) -> list[Any]:
        rows = self._rows(prompts, completions, columns)
        return list(await asyncio.gather(*(self.fn(c, p, **kw) for p, c, kw in rows)))


def conditioned(
    reward: RewardCallable | RewardFunction,
    on: str,
    mode: str = "zero_fill",
    threshold: float = 1.0,
    *,
    channels: Sequence[str] | None = None,
) -> RewardFunction:
    """Make the channel(s) of ``reward`` count only where channel ``on`` passes
    (``r_on >= threshold``): conditioning, ALGORITHMS.md §2, from the ``multireward-grpo``
    analysis.

    ``mode="zero_fill"``: the gated reward becomes 0 where the gate fails;
    ``mode="subgroup"``: it is centred over the passing rows of the group and 0 elsewhere.
    The gate is applied by :func:`mtgrpo.algo.advantages.compute_advantages` before the ordering;
    :attr:`RewardSuite.gates` resolves it to channel indices.

    ``on`` is a column name of the suite (``"format"``, ``"fintech/compliance"``) or, for a
    multi-channel ``reward``, one of its own channel names (seed 003: channel 0 gates the
    others). For a multi-channel ``reward``, ``channels`` picks which of its channels are
    gated; by default all of them except ``on``. Returns a new :class:`RewardFunction`; the
    original is unchanged.
    """
    rf = as_reward_function(reward)
    if mode not in GATE_MODES:
        raise ValueError(f"gate mode {mode!r} is not valid; use one of {', '.join(GATE_MODES)}")
    # a NaN threshold would make every r_on >= threshold false: the gate would never pass
    threshold = _finite_float(threshold, "gate threshold")
    if not isinstance(on, str) or not on:
        raise TypeError(f"'on' must name the gating channel, got {on!r}")
    targets = _gated_channels(rf, on, channels)
    specs = tuple(GateSpec(channel, on, mode, threshold) for channel in targets)
    # a copy: the same reward may be used ungated elsewhere
    return dataclasses.replace(rf, gates=rf.gates + specs)


def _gated_channels(
    rf: RewardFunction, on: str, channels: Sequence[str] | None
) -> tuple[str | None, ...]:
    if rf.channels is None:
        if channels is not None:
            raise ValueError(
                f"reward function {rf.name!r} has a single channel; omit channels={channels!r}"
            )
        return (None,)
    if channels is None:
        targets = tuple(c for c in rf.channels if c != on)
    else:
        targets = _channel_tuple(channels, str(rf.name)) or ()
        unknown = [c for c in targets if c not in rf.channels]
        if unknown:
            raise ValueError(
                f"reward function {rf.name!r} has no channel(s) {unknown}; its channels are "
                f"{list(rf.channels)}"
            )
        if on in targets:
            raise ValueError(f"channel {on!r} of {rf.name!r} cannot gate itself")
    if not targets:
        raise ValueError(
            f"reward function {rf.name!r} has no channel left to gate on {on!r}; "
            f"its channels are {list(rf.channels)}"
        )
    return targets
