"""The reward-function contract: :class:`RewardFunction`, its channels, weights, gates and errors.

A reward function follows TRL's ``GRPOTrainer`` contract::

    f(prompts=[...], completions=[...], completion_ids=[...] | None, **columns, **extra)
        -> Sequence[float | None]                    # one value per completion

``columns`` are the other dataset columns, one value per completion (``task``, ``answer``,
``nums``, ...); ``extra`` holds whatever the trainer passes through unchanged (TRL passes
``trainer_state``). ``async def`` functions return an awaitable and are awaited concurrently.

A *multi-channel* function declares its channel names up front (``channels=("a", "b")``) so the
number of reward channels ``R`` is fixed before training; per completion it returns a tuple in
the declared order, a dict keyed by channel name, or ``None``. The channels become the columns
``"<function name>/<channel>"`` of the ``[N, R]`` score matrix; a single-channel function is
the column ``"<function name>"`` (TRL's column naming).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import torch

from mtgrpo.rewards.deadline import check_timeout

__all__ = [
    "GateSpec",
    "RewardCallable",
    "RewardError",
    "RewardFunction",
    "as_reward_function",
    "callable_name",
    "is_async_callable",
    "unique_names",
]

RewardCallable: TypeAlias = Callable[..., "Sequence[Any] | Awaitable[Sequence[Any]]"]
"""TRL's batched reward contract: ``f(prompts, completions, completion_ids, **columns)``."""


class RewardError(ValueError):
    """A reward function broke the contract, or a batch cannot be scored.

    Raised at the first scoring call, before any training step. The message names the
    function, the task, the sizes and the fix; the attributes carry the same facts for code
    that handles the error.

    Attributes:
        function: name of the reward function at fault, if one is.
        row: index of the first offending completion in the batch, if one is known.
        task: task label of that completion, if known.
    """

    def __init__(
        self,
        message: str,
        *,
        function: str | None = None,
        row: int | None = None,
        task: str | None = None,
    ) -> None:
        super().__init__(message)
        self.function = function
        self.row = row
        self.task = task


@dataclass(frozen=True)
class GateSpec:
    """A conditioning gate declared on a reward function, resolved to indices by the suite.

    Attributes:
        channel: the function's own channel that is gated (``None`` for a single-channel
            function: its only channel).
        on: the gating channel: a column name of the suite (``"format"``,
            ``"fintech/compliance"``) or, for a multi-channel function, one of its own
            channel names.
        mode: ``"zero_fill"`` or ``"subgroup"`` (see :mod:`mtgrpo.algo.advantages`).
        threshold: the gate passes where ``r_on >= threshold``.
    """

    channel: str | None
    on: str
    mode: str
    threshold: float


def callable_name(fn: Callable[..., Any]) -> str:
    """``fn.__name__`` (lambdas give ``"<lambda>"``), unwrapping ``functools.partial``; the
    class name for a callable instance. The same rule as TRL's ``get_callable_name``."""
    # TRL 1.16's get_callable_name: names match the reward columns TRL logs
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """True when calling ``fn`` returns a coroutine: ``async def`` functions, partials of them,
    and instances whose ``__call__`` is ``async def``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    # TRL 1.16 awaits async reward functions concurrently; they are found here
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an instance's async __call__ is the point
    )


def unique_names(names: Iterable[str]) -> list[str]:
    """Make names unique deterministically: the first ``f`` keeps its name, later ones become
    ``f_2``, ``f_3``, ...; a suffix that is another function's own name is skipped, so no
    function is renamed into a name the user gave to a different one."""
    names = list(names)
    reserved = set(names)
    used: set[str] = set()
    result = []
    for name in names:
        candidate, k = name, 2
        # never rename into a name the user chose for another function
        while candidate in used or (candidate != name and candidate in reserved):
            candidate, k = f"{name}_{k}", k + 1
        used.add(candidate)
        result.append(candidate)
    return result


def _finite_float(value: Any, what: str) -> float:
    # float("1") and float(True) succeed: a weight written as text or a flag is a slip
    if isinstance(value, (str, bytes, bool)):
        raise TypeError(f"{what} must be a number, got {value!r} ({type(value).__name__})")
    try:
        result = float(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be a number, got {value!r} ({type(value).__name__})") from exc
    if not math.isfinite(result):  # a NaN weight would make every advantage NaN
        raise ValueError(f"{what} must be finite, got {result}")
    return result


def _channel_tuple(channels: Sequence[str] | None, name: str) -> tuple[str, ...] | None:
    if channels is None:
        return None
    # tuple("ab") would silently declare channels "a" and "b"
    if isinstance(channels, str):
        raise TypeError(
            f"channels of reward function {name!r} must be a sequence of names, got the string "
            f"{channels!r}; write channels=({channels!r},)"
        )
    result = tuple(channels)
    bad = [c for c in result if not isinstance(c, str) or not c]
    if not result or bad:
        raise ValueError(
            f"channels of reward function {name!r} must be non-empty strings, got {result!r}"
        )
    duplicates = sorted({c for c in result if result.count(c) > 1})
    if duplicates:
        raise ValueError(
            f"reward function {name!r} declares channel(s) {duplicates} more than once; "
            "channel names must be unique"
        )
    return result


def _weight_tuple(
    weights: float | Sequence[float] | None, num_channels: int, name: str
) -> tuple[float, ...] | None:
    if weights is None:
        return None
    # one number for a single-channel function, as TRL's reward_weights entry is
    if isinstance(weights, (int, float)) and not isinstance(weights, bool):
        weights = (weights,)
    result = tuple(_finite_float(w, f"reward weight of {name!r}") for w in weights)
    if len(result) != num_channels:
        raise ValueError(
            f"reward function {name!r} has {num_channels} channel(s) but {len(result)} "
            f"weight(s) {list(result)}; give one weight per channel"
        )
    return result


# eq=False: identity equality and hashing, so two wrappers of one function are two channels
@dataclass(frozen=True, eq=False)
class RewardFunction:
    """A reward function with its name, declared channels, weights and gates.

    Calling it calls ``fn`` unchanged, so a single-channel ``RewardFunction`` is still a valid
    TRL reward function. Equality is identity: two wrappers of one function are two channels.

    Attributes:
        fn: the batched callable (TRL's contract, sync or ``async def``).
        name: unique name within a suite; defaults to :func:`callable_name` of ``fn``.
        channels: declared channel names of a multi-channel function, ``None`` for a
            single-channel one.
        weights: one reward weight per channel; ``None`` leaves the choice to the suite
            (its ``reward_weights`` or 1.0).
        gates: conditioning gates on this function's channels (see :func:`conditioned`).
        timeout: seconds one call may take (:mod:`mtgrpo.rewards.deadline`); ``None`` for
            no limit; ``"default"`` takes the suite's (``reward_timeout``).
    """

    fn: RewardCallable
    name: str | None = None
    channels: tuple[str, ...] | None = None
    weights: tuple[float, ...] | None = None
    gates: tuple[GateSpec, ...] = ()
    timeout: float | Literal["default"] | None = "default"

    def __post_init__(self) -> None:
        # a wrapper of a wrapper would hide which channels and weights apply
        if isinstance(self.fn, RewardFunction):
            raise TypeError(
                f"{self.fn.name!r} is already a RewardFunction; use dataclasses.replace(rf, "
                "name=..., channels=..., weights=...) to change it"
            )
        if not callable(self.fn):
            raise TypeError(
                f"a reward function must be callable, got {self.fn!r} ({type(self.fn).__name__})"
            )
        name = callable_name(self.fn) if self.name is None else self.name
        if not isinstance(name, str) or not name:
            raise ValueError(f"a reward function name must be a non-empty string, got {name!r}")
        channels = _channel_tuple(self.channels, name)
        weights = _weight_tuple(self.weights, 1 if channels is None else len(channels), name)
        # frozen: the normalised values are stored past the dataclass's __setattr__
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "channels", channels)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "gates", tuple(self.gates))
        if self.timeout != "default":
            object.__setattr__(self, "timeout",
                               check_timeout(self.timeout, f"the timeout of {name!r}"))  # fmt: skip

    # still a TRL reward function: GRPOTrainer can call the wrapper as it is
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def __name__(self) -> str:  # read by TRL's get_callable_name and by logging
        assert self.name is not None
        return self.name

    @property
    def num_channels(self) -> int:
        return 1 if self.channels is None else len(self.channels)

    @property
    def column_names(self) -> list[str]:
        """This function's columns of the score matrix: ``[name]`` or ``[name/channel, ...]``."""
        if self.channels is None:
            return [str(self.name)]
        return [f"{self.name}/{channel}" for channel in self.channels]

    @property
    def is_async(self) -> bool:
        return is_async_callable(self.fn)

    def renamed(self, name: str) -> RewardFunction:
        """A copy under another name (same ``fn``, channels, weights and gates)."""
        return dataclasses.replace(self, name=name)


def as_reward_function(obj: Any) -> RewardFunction:
    """Wrap a user's reward callable; a :class:`RewardFunction` is returned as is.

    Strings (TRL's model ids) and ``torch.nn.Module`` reward models are refused with the fix:
    a reward model needs its tokenizer, so it must be wrapped into a function that returns
    ``logits[:, 0]`` on ``prompt + completion`` first.
    """
    if isinstance(obj, RewardFunction):
        return obj
    # TRL 1.16 loads a reward model from a model id; here the user must wrap it
    if isinstance(obj, (str, bytes)):
        raise TypeError(
            f"reward function {obj!r} is a string; mtgrpo does not load reward models by name "
            "here: load the model and its tokenizer and pass a function that scores "
            "prompt + completion (logits[:, 0])"
        )
    if isinstance(obj, torch.nn.Module):
        raise TypeError(
            f"reward function {type(obj).__name__} is a torch.nn.Module; wrap it in a function "
            "that tokenises prompt + completion and returns logits[:, 0] per completion"
        )
    return RewardFunction(obj)
