"""Calling reward functions on a batch: argument slicing, awaiting, checking what they return.

Everything a reward function can get wrong is turned into a :class:`RewardError` here, with
the function's name, the offending row and task, the sizes and the fix.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import math
import numbers
import os
import threading
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mtgrpo.rewards.core import RewardError, RewardFunction
from mtgrpo.rewards.deadline import call_with_deadline

__all__ = [
    "PROBE_LIMIT",
    "RewardBatch",
    "call_once",
    "coerce_output",
    "function_failure",
    "run_awaitables",
]

PROBE_LIMIT = 64
"""At most this many single-row calls are made to locate the sample a failing function trips on."""

# TRL 1.16 passes these three by name, never as dataset columns
_RESERVED = ("prompts", "completions", "completion_ids")


@dataclass(frozen=True)
class RewardBatch:
    """One scoring call's inputs, checked for alignment. ``N`` = number of completions.

    ``columns`` always holds a ``task`` column: the ``tasks`` labels are added under that name
    when the caller's columns have none, because seed-style functions read ``task``.
    """

    prompts: list[Any]  # [N]
    completions: list[Any]  # [N]
    completion_ids: list[Any] | None  # [N] token ids, or None
    columns: dict[str, list[Any]]  # each [N]
    tasks: list[str]  # [N]
    extra: dict[str, Any]  # passed to every call unchanged

    @classmethod
    def build(
        cls,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Any] | None,
        columns: Mapping[str, Sequence[Any]],
        tasks: Sequence[str],
        extra: Mapping[str, Any] | None,
    ) -> RewardBatch:
        n = len(completions)
        sized = {"prompts": prompts, "completion_ids": completion_ids, "tasks": tasks}
        for what, seq in {**sized, **{f"column {k!r}": v for k, v in columns.items()}}.items():
            # a str has a len() but is one value, not one per completion
            if seq is not None and (isinstance(seq, (str, bytes)) or not hasattr(seq, "__len__")):
                raise RewardError(
                    f"{what} must be a sequence with one entry per completion, got "
                    f"{type(seq).__name__}"
                )
            if seq is not None and len(seq) != n:
                raise RewardError(
                    f"{what} has {len(seq)} entries for {n} completions; every input to "
                    "scoring needs one entry per completion"
                )
        bad_tasks = sorted({repr(t) for t in tasks if not isinstance(t, str)})
        if bad_tasks:
            raise RewardError(f"task labels must be strings, got {', '.join(bad_tasks[:5])}")
        extra = dict(extra or {})
        clashes = sorted((set(columns) | set(extra)) & set(_RESERVED))
        # in kwargs() an extra would silently replace the column of the same name
        clashes += sorted(set(columns) & set(extra))
        if clashes:
            raise RewardError(
                f"argument name(s) {clashes} are given twice (as a column, an extra or one of "
                f"{', '.join(_RESERVED)}); rename the column or the extra argument"
            )
        cols = {k: list(v) for k, v in columns.items()}
        cols.setdefault("task", list(tasks))
        ids = None if completion_ids is None else list(completion_ids)
        return cls(list(prompts), list(completions), ids, cols, list(tasks), extra)

    def __len__(self) -> int:
        return len(self.completions)

    def kwargs(self, rows: Sequence[int]) -> dict[str, Any]:
        """Keyword arguments for one call on ``rows``: every per-completion input sliced the
        same way (fresh lists, so one function cannot mutate another's inputs), plus extras."""

        def pick(seq: list[Any]) -> list[Any]:
            return [seq[i] for i in rows]

        ids = None if self.completion_ids is None else pick(self.completion_ids)
        sliced = {k: pick(v) for k, v in self.columns.items()}
        return {
            "prompts": pick(self.prompts),
            "completions": pick(self.completions),
            "completion_ids": ids,
            **sliced,
            **self.extra,
        }

    def task_summary(self, rows: Sequence[int]) -> str:
        labels = sorted({self.tasks[i] for i in rows})
        shown = ", ".join(repr(t) for t in labels[:5]) + (", ..." if len(labels) > 5 else "")
        return f"task {shown}" if len(labels) == 1 else f"tasks {shown}"


class _EventLoopThread:
    """A private event loop on a daemon thread, started on first use.

    Async reward functions run here rather than under ``asyncio.run`` in the caller's thread
    for two reasons: the caller may already be inside a running loop (Jupyter), where
    ``asyncio.run`` is refused; and async clients (HTTP pools, LLM-judge SDKs) bind to the loop
    they were first used on, so every scoring call must reuse one loop. TRL's GRPOTrainer keeps
    a daemon loop for the same reason.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = -1  # no real pid: the first _ensure starts the loop

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            # After a fork the loop object is copied but its thread is not: start a new one.
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                # a daemon, like TRL's loop thread: it must not keep the process alive
                thread = threading.Thread(
                    target=loop.run_forever, name="mtgrpo-reward-loop", daemon=True
                )
                thread.start()
                self._loop, self._thread, self._pid = loop, thread, os.getpid()
                # stopped at exit as TRL's shutdown_event_loop_in_daemon does
                atexit.register(loop.call_soon_threadsafe, loop.stop)
            return self._loop

    def run(self, awaitables: Sequence[Awaitable[Any]]) -> list[Any]:
        """Await ``awaitables`` concurrently; each result is a value or the exception raised."""
        loop = self._ensure()
        # waiting here would block the very loop that must run gather(): a deadlock
        if threading.current_thread() is self._thread:
            raise RuntimeError("reward scoring was called from inside an async reward function")

        async def gather() -> list[Any]:
            # one failing function must not cancel the others; each error is reported by name
            return await asyncio.gather(*awaitables, return_exceptions=True)

        # the time limit is the awaitables' own: RewardSuite.score wraps each in with_deadline
        return asyncio.run_coroutine_threadsafe(gather(), loop).result()


_LOOP = _EventLoopThread()


def run_awaitables(awaitables: Sequence[Awaitable[Any]]) -> list[Any]:
    """Await concurrently (``asyncio.gather``) on the private loop; exceptions are returned."""
    # a suite without async functions never starts the loop thread
    return _LOOP.run(awaitables) if awaitables else []


def call_once(rf: RewardFunction, kwargs: dict[str, Any]) -> Any:
    """Call ``rf`` and await its result if it is awaitable; exceptions propagate."""
    out = rf.fn(**kwargs)
    # tested on the result: a plain function or partial may return a coroutine
    if inspect.isawaitable(out):
        (out,) = run_awaitables([out])
        if isinstance(out, BaseException):
            raise out
    return out


def _preview(obj: Any, width: int = 80) -> str:
    """A one-line preview: the text of a string, of the last chat message, or the repr."""
    if isinstance(obj, str):
        text = obj
    elif isinstance(obj, list) and obj and isinstance(obj[-1], Mapping) and "content" in obj[-1]:
        text = str(obj[-1]["content"])
    else:
        text = repr(obj)
    return repr(text if len(text) <= width else text[: width - 3] + "...")


def function_failure(
    rf: RewardFunction, batch: RewardBatch, rows: Sequence[int], exc: Exception,
    timeout: float | None = None,
) -> RewardError:
    """The error for a reward function that raised on ``rows``: locates the first sample it
    fails on by calling it on single rows (at most :data:`PROBE_LIMIT`), each call within the
    function's ``timeout`` (seconds; None: no limit). Raise it ``from exc``."""
    message = (
        f"reward function '{rf.name}' raised {type(exc).__name__}: {exc} while scoring "
        f"{len(rows)} completion(s) ({batch.task_summary(rows)})"
    )
    if isinstance(exc, TypeError) and "unexpected keyword argument" in str(exc):
        message += (
            "; a reward function is called with every dataset column as a keyword argument "
            "(TRL's contract): add **kwargs to its signature"
        )
    # bounded: each probe is a full call, and a slow function would be re-run N times
    probed = rows[:PROBE_LIMIT]
    # no wait without a limit: a function that raised on the batch may hang on a row; all the
    # probes together take at most the function's own limit (one call's), not one per row
    budget_end = None if timeout is None else time.monotonic() + timeout
    for row in probed:
        left = None if budget_end is None else budget_end - time.monotonic()
        try:
            ended, _ = (False, None) if left is not None and left <= 0 else call_with_deadline(
                lambda: call_once(rf, batch.kwargs([row])), left)  # noqa: B023
        except Exception as row_exc:
            task = batch.tasks[row]
            return RewardError(
                f"{message}; first failing sample: row {row} (task '{task}'), prompt "
                f"{_preview(batch.prompts[row])}, completion {_preview(batch.completions[row])}"
                f", which alone raises {type(row_exc).__name__}: {row_exc}. Fix the function, "
                "or make it return None for completions it cannot score",
                function=rf.name,
                row=row,
                task=task,
            )
        if not ended:  # the probes' time is spent: the search stops here
            return RewardError(
                f"{message}; called on one completion at a time (rows up to {row}) it ran past "
                f"its {timeout} s limit, so the failing sample was not located. Fix the "
                "function, or make it return None for completions it cannot score",
                function=rf.name,
            )
    return RewardError(
        f"{message}; called on each of the first {len(probed)} of these completions alone it "
        "raised nothing, so the failure depends on the batch as a whole. Fix the function",
        function=rf.name,
    )


class _BadValueError(Exception):
    """Internal: a returned value is not a reward; ``args[0]`` says why and what to do."""


def _scalar(value: Any) -> float:
    """One returned reward as a float (NaN for ``None``); raises :class:`_BadValueError`."""
    if value is None:
        return math.nan  # None = not applicable: kept as NaN, never silently 0 (DESIGN.md)
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 0:
        value = value.item()
    # np.bool_ is no numbers.Real, so it needs its own branch
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if isinstance(value, numbers.Real):
        result = float(value)
        # NaN already means None, and an inf would poison the group's mean and std
        if not math.isfinite(result):
            raise _BadValueError(
                f"{result}; rewards must be finite: return None where a reward does not apply"
            )
        return result
    if isinstance(value, (str, bytes)):
        raise _BadValueError(f"the string {value!r}; return a float (e.g. float(x)), not a string")
    hint = ""
    if isinstance(value, (tuple, list, Mapping)):
        hint = (
            "; a function that scores several channels must declare them: "
            "RewardFunction(fn, channels=(...)) or @reward_channels(...)"
        )
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    raise _BadValueError(
        f"{text} ({type(value).__name__}); a reward must be a number (bool, int, float, "
        f"numpy scalar, 0-d tensor) or None{hint}"
    )


def _channel_row(value: Any, channels: tuple[str, ...]) -> list[float]:
    """One completion's values of a multi-channel function, in declared channel order."""
    if value is None:
        return [math.nan] * len(channels)
    if isinstance(value, Mapping):
        missing = [c for c in channels if c not in value]
        # a misspelt key must not silently drop a channel
        unknown = [k for k in value if k not in channels]
        if missing or unknown:
            raise _BadValueError(
                f"a dict with missing channel(s) {missing} and unknown channel(s) {unknown}; "
                f"the declared channels are {list(channels)}"
            )
        return [_scalar(value[c]) for c in channels]
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 1:
        value = value.tolist()
    if isinstance(value, (tuple, list)):
        if len(value) != len(channels):
            raise _BadValueError(
                f"{len(value)} values but the function declares {len(channels)} channels "
                f"{list(channels)}; return one value per channel in that order"
            )
        return [_scalar(v) for v in value]
    raise _BadValueError(
        f"{value!r} ({type(value).__name__}); a multi-channel function returns per completion "
        f"a tuple of {len(channels)} values, a dict keyed by channel, or None"
    )


def _as_list(output: Any) -> list[Any] | None:
    if isinstance(output, torch.Tensor):
        # torch refuses .numpy() on a tensor that requires grad or lives on a GPU
        output = output.detach().cpu().numpy()
    if isinstance(output, np.ndarray):
        return list(output) if output.ndim >= 1 else None  # 0-d: one value, not one per completion
    # a str is a Sequence too, of characters, not of rewards
    if isinstance(output, (str, bytes, Mapping)) or not isinstance(output, Sequence):
        return None
    return list(output)


def coerce_output(
    rf: RewardFunction, output: Any, batch: RewardBatch, rows: Sequence[int]
) -> np.ndarray:
    """Check what ``rf`` returned for ``rows`` and convert it: ``[len(rows), C]`` float64,
    NaN where a value is ``None`` (``C`` = the function's channels)."""
    values = _as_list(output)
    where = f"{len(rows)} completions ({batch.task_summary(rows)})"
    if values is None:
        raise RewardError(
            f"reward function '{rf.name}' returned {type(output).__name__} instead of a list "
            f"of values for {where}; a reward function must return one value (or None) per "
            "completion",
            function=rf.name,
        )
    if len(values) != len(rows):
        raise RewardError(
            f"reward function '{rf.name}' returned {len(values)} rewards for {where}; a reward "
            "function must return one value (or None) per completion",
            function=rf.name,
        )
    result = np.empty((len(rows), rf.num_channels), dtype=np.float64)  # [n, C]
    for j, (row, value) in enumerate(zip(rows, values, strict=True)):
        try:
            result[j] = _scalar(value) if rf.channels is None else _channel_row(value, rf.channels)
        except _BadValueError as bad:
            task = batch.tasks[row]
            raise RewardError(
                f"reward function '{rf.name}' returned {bad.args[0]} (row {row}, task '{task}')",
                function=rf.name,
                row=row,
                task=task,
            ) from None  # _BadValueError is internal; the RewardError says it all
    return result
