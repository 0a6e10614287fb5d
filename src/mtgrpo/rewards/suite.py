"""A :class:`RewardSuite`: the reward functions of a run, their routing to tasks, their channels
``[R]`` and reward weights ``[R]``, and the scoring of a batch into a ``[N, R]`` matrix."""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

from mtgrpo.algo.advantages import Gate
from mtgrpo.algo.registry import ON_UNSCORABLE, Registry
from mtgrpo.rewards.core import (
    RewardError,
    RewardFunction,
    as_reward_function,
    callable_name,
    unique_names,
)
from mtgrpo.rewards.deadline import (
    DEFAULT_REWARD_TIMEOUT,
    TIMED_OUT,
    call_with_deadline,
    check_timeout,
    with_deadline,
)
from mtgrpo.rewards.evaluation import (
    RewardBatch,
    coerce_output,
    function_failure,
    run_awaitables,
)
from mtgrpo.rewards.guard import collect_scoring_errors

__all__ = ["UNSCORABLE_POLICIES", "WILDCARD_TASK", "RewardScores", "RewardSuite"]

logger = logging.getLogger(__name__)
_WARNINGS_PER_FUNCTION = 3
_timeout_warnings: dict[str, int] = {}

WILDCARD_TASK = "*"
"""Routing-table key whose functions apply to every task."""

UnscorablePolicy = Callable[["RewardSuite", RewardBatch, np.ndarray], None]
UNSCORABLE_POLICIES: Registry[UnscorablePolicy] = ON_UNSCORABLE  # names in mtgrpo.algo.registry
"""What to do with a completion no reward applies to (every channel NaN): ``raise`` (default),
``warn`` (TRL's behaviour and warning: the row stays all-NaN and the advantage is 0) or
``zero_advantage`` (the same without the warning)."""


@dataclass(frozen=True)
class RewardScores:
    """The scores of one batch.

    Attributes:
        values: ``[N, R]`` float64; NaN where a function returned ``None`` or was not routed
            to the row's task.
        applied: ``[N, R]`` bool, ``~isnan(values)``: the channel scored the completion.
        channel_names: ``[R]`` column names.
        tasks: ``[N]`` task label of each completion.
        errors: ``[N, R]`` bool: a built-in verifier failed on the completion's text and
            scored it 0 (:mod:`mtgrpo.rewards.guard`); all False when not given.
        timeouts: ``[N, R]`` bool: the function's call on the completion ran past its time
            limit, so the channel does not apply there (NaN); all False when not given.
    """

    values: np.ndarray  # [N, R]
    applied: np.ndarray  # [N, R]
    channel_names: list[str]  # [R]
    tasks: list[str]  # [N]
    errors: np.ndarray | None = None  # [N, R]
    timeouts: np.ndarray | None = None  # [N, R]

    def __post_init__(self) -> None:
        assert self.values.shape == (len(self.tasks), len(self.channel_names))
        assert self.applied.shape == self.values.shape
        for name in ("errors", "timeouts"):
            if getattr(self, name) is None:
                # frozen dataclass: the default is stored past its __setattr__
                object.__setattr__(self, name, np.zeros(self.values.shape, dtype=bool))
            assert getattr(self, name).shape == self.values.shape

    @property
    def unscorable(self) -> np.ndarray:
        """``[N]`` bool: no channel applies to the completion."""
        return ~self.applied.any(axis=1)

    def channel_means(self, rows: np.ndarray | None = None) -> dict[str, float]:
        """Mean of each channel over the rows it applied to (NaN where it applied to none);
        ``rows`` (``[N]`` bool) restricts the rows first."""
        values, applied = self.values, self.applied
        if rows is not None:
            values, applied = values[rows], applied[rows]
        count = applied.sum(axis=0)  # [R]
        # zeros where not applied: one NaN would make the whole sum NaN
        total = np.where(applied, values, 0.0).sum(axis=0, dtype=np.float64)  # [R]
        # max(count, 1): no 0/0 warning; those columns are NaN by the where
        means = np.where(count > 0, total / np.maximum(count, 1), math.nan)
        return dict(zip(self.channel_names, means.tolist(), strict=True))

    def per_task_means(self) -> dict[str, dict[str, float]]:
        """``{task: {channel: mean over the task's rows the channel applied to}}``."""
        labels = np.asarray(self.tasks, dtype=object)
        return {task: self.channel_means(labels == task) for task in sorted(set(self.tasks))}

    def metrics(self, prefix: str = "rewards") -> dict[str, float]:
        """Per channel ``{prefix}/{channel}/mean`` and ``/std`` over the applied rows (TRL's
        names; std unbiased as TRL's ``nanstd``, NaN with fewer than two values),
        ``/applied`` (fraction of rows the channel scored), ``/errors`` (completions a
        built-in verifier failed on) and ``/timeouts`` (completions of calls past the time
        limit)."""
        out: dict[str, float] = {}
        assert self.errors is not None
        assert self.timeouts is not None
        for r, name in enumerate(self.channel_names):
            out[f"{prefix}/{name}/errors"] = int(self.errors[:, r].sum())
            out[f"{prefix}/{name}/timeouts"] = int(self.timeouts[:, r].sum())
            present = self.values[self.applied[:, r], r].astype(np.float64)
            # unbiased, as TRL 1.16's nanstd (count / (count - 1))
            std = float(present.std(ddof=1)) if present.size > 1 else math.nan
            mean = float(present.mean()) if present.size else math.nan
            out[f"{prefix}/{name}/mean"] = mean
            out[f"{prefix}/{name}/std"] = std
            # how often a routed or None-returning channel scores
            out[f"{prefix}/{name}/applied"] = present.size / max(len(self.tasks), 1)
        return out

    def as_lists(self) -> list[list[float | None]]:
        """``[N][R]`` nested lists with ``None`` for not applicable (for JSON records)."""
        return [
            [v if ok else None for v, ok in zip(row, mask, strict=True)]
            for row, mask in zip(self.values.tolist(), self.applied.tolist(), strict=True)
        ]


def _check_listed_once(functions: Sequence[Any]) -> None:
    """The same object twice in a list is almost surely a slip; a weight says "count it more"."""
    seen: set[int] = set()
    for fn in functions:
        # by identity: two distinct functions may share a name (then renamed f_2)
        if id(fn) in seen:
            raise ValueError(
                f"reward function {callable_name(fn)!r} is listed twice; to score the same logic "
                "twice wrap it twice (RewardFunction(fn, name=...)), to count it more raise its "
                "reward weight"
            )
        seen.add(id(fn))


def _check_functions(functions: Sequence[RewardFunction]) -> None:
    if not functions:
        raise ValueError("a reward suite needs at least one reward function; none was given")
    for rf in functions:
        if not isinstance(rf, RewardFunction):
            raise TypeError(
                f"RewardSuite takes RewardFunction objects, got {type(rf).__name__}; use "
                "RewardSuite.from_user(...) to pass plain functions or a routing table"
            )
    _check_listed_once(functions)


def _channel_names(functions: Sequence[RewardFunction]) -> list[str]:
    names = [column for rf in functions for column in rf.column_names]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ValueError(
            f"reward channel name(s) {clashes} occur twice (a function name containing '/' "
            "equals another function's '<name>/<channel>'); rename one of the functions"
        )
    return names


def _resolve_weights(
    functions: Sequence[RewardFunction],
    channel_names: list[str],
    reward_weights: Sequence[float] | np.ndarray | Tensor | None,
) -> np.ndarray:
    declared = [w for rf in functions for w in (rf.weights or (math.nan,) * rf.num_channels)]
    declared_arr = np.asarray(declared, dtype=np.float64)  # [R], NaN = not declared
    if reward_weights is None:
        # 1.0: TRL 1.16's default reward weight
        return np.where(np.isnan(declared_arr), 1.0, declared_arr)
    if isinstance(reward_weights, Tensor):
        reward_weights = reward_weights.detach().cpu().numpy()
    try:
        weights = np.asarray(reward_weights, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"reward_weights must be numbers, got {reward_weights!r}") from exc
    if weights.ndim != 1 or weights.shape[0] != len(channel_names):
        raise ValueError(
            f"reward_weights has {weights.size} entries but the suite has "
            f"{len(channel_names)} reward channels {channel_names}; give one weight per channel"
        )
    if not np.isfinite(weights).all():
        raise ValueError(f"reward_weights must be finite, got {weights.tolist()}")
    # a weight set in two places that disagree: neither silently wins
    mismatch = ~np.isnan(declared_arr) & (declared_arr != weights)
    if mismatch.any():
        names = [n for n, bad in zip(channel_names, mismatch, strict=True) if bad]
        raise ValueError(
            f"reward_weights {weights.tolist()} disagree with the weights declared on the "
            f"reward functions for channel(s) {names} ({declared_arr[mismatch].tolist()}); "
            "set each weight in one place"
        )
    return weights


def _routing_from_table(
    table: Mapping[str, Any],
) -> tuple[list[RewardFunction], list[frozenset[str] | None]]:
    """Functions in order of first appearance and the tasks each is routed to (``None``: every
    task). One function object listed under several tasks is one channel."""
    objects: dict[int, Any] = {}
    tasks: dict[int, set[str] | None] = {}
    for task, entry in table.items():
        if not isinstance(task, str) or not task:
            raise TypeError(f"routing-table keys must be task names (strings), got {task!r}")
        # a string is kept so as_reward_function refuses it with the fix
        if callable(entry) or isinstance(entry, (str, bytes)):
            entry = [entry]
        elif not isinstance(entry, (list, tuple)):
            raise TypeError(
                f"routing-table entry for task {task!r} must be a reward function or a list of "
                f"them, got {type(entry).__name__}"
            )
        for obj in entry:
            key = id(obj)  # by identity: one function under several tasks is one channel
            objects.setdefault(key, obj)
            routed = tasks.setdefault(key, set())
            # "*" wins over any task list: the function applies everywhere
            if task == WILDCARD_TASK:
                tasks[key] = None
            elif routed is not None:
                routed.add(task)
    functions = [as_reward_function(obj) for obj in objects.values()]
    routes = [None if t is None else frozenset(t) for t in tasks.values()]
    return functions, routes


class RewardSuite:
    """The reward functions of a run, routed to tasks, scored into ``[N, R]``.

    Channels: a single-channel function is the column ``name``; a multi-channel one gives
    ``name/channel`` per declared channel, in declaration order. Function names come from
    ``__name__`` (the class name for callable instances, ``<lambda>`` for lambdas); duplicates
    are made unique in order of appearance (``f``, ``f_2``, ``f_3``, ...).

    Routing: with ``routes`` (built from a ``{task: [functions]}`` table by :meth:`from_user`)
    a function is called only on the rows of its tasks, with prompts, completions,
    completion ids and every column sliced alike; the other rows are NaN without a call.
    ``None`` as a route (the ``"*"`` key) means every task. Without routes every function is
    called on every row and may return ``None`` where it does not apply (TRL's form); both
    forms give the same matrix for the same logic.
    """

    def __init__(
        self,
        functions: Sequence[RewardFunction],
        *,
        routes: Sequence[Collection[str] | None] | None = None,
        reward_weights: Sequence[float] | np.ndarray | Tensor | None = None,
        on_unscorable: str = "raise",
        timeout: float | None = DEFAULT_REWARD_TIMEOUT,
    ) -> None:
        _check_functions(functions)
        names = unique_names(str(rf.name) for rf in functions)
        self._functions = [
            rf if rf.name == name else rf.renamed(name)
            for rf, name in zip(functions, names, strict=True)
        ]
        self._channel_names = _channel_names(self._functions)
        # function i owns columns offsets[i]:offsets[i + 1] of [N, R]
        self._offsets = np.cumsum([0] + [rf.num_channels for rf in self._functions]).tolist()
        self._routes = self._check_routes(routes)
        self._reward_weights = _resolve_weights(
            self._functions, self._channel_names, reward_weights
        )
        self._on_unscorable = UNSCORABLE_POLICIES.canonical(on_unscorable)
        self._gates = self._resolve_gates()
        default = check_timeout(timeout, "reward_timeout")
        self._timeouts = [default if rf.timeout == "default" else rf.timeout
                          for rf in self._functions]  # fmt: skip
        self._timed_out = dict.fromkeys(self._channel_names, 0)  # since the last pop

    @classmethod
    def from_user(
        cls,
        reward_funcs: Any,
        reward_weights: Sequence[float] | np.ndarray | Tensor | None = None,
        *,
        on_unscorable: str = "raise",
        timeout: float | None = DEFAULT_REWARD_TIMEOUT,
    ) -> RewardSuite:
        """Build a suite from what a user passes: one function, a list of functions, or a
        routing table ``{"math": [f1], "code": [f2, f3], "*": [fmt]}`` (a value may be one
        function or a list; ``"*"`` means every task). Plain callables and
        :class:`RewardFunction` objects mix freely.

        ``reward_weights``: ``[R]``, one per channel (default 1.0, or the weights declared on
        the functions; declaring a different value in both places is an error). ``timeout``:
        seconds one call of a function may take, unless the function sets its own
        (:mod:`mtgrpo.rewards.deadline`); ``None`` for no limit.
        """
        if isinstance(reward_funcs, RewardSuite):
            raise TypeError("reward_funcs is already a RewardSuite; use it directly")
        routes: list[frozenset[str] | None] | None = None
        if isinstance(reward_funcs, Mapping):
            functions, routes = _routing_from_table(reward_funcs)
        elif isinstance(reward_funcs, (list, tuple)):
            _check_listed_once(reward_funcs)
            functions = [as_reward_function(f) for f in reward_funcs]
        else:
            functions = [as_reward_function(reward_funcs)]
        return cls(functions, routes=routes, reward_weights=reward_weights,
                   on_unscorable=on_unscorable, timeout=timeout)  # fmt: skip

    def _check_routes(
        self, routes: Sequence[Collection[str] | None] | None
    ) -> list[frozenset[str] | None] | None:
        if routes is None:
            return None
        if len(routes) != len(self._functions):
            raise ValueError(
                f"routes has {len(routes)} entries for {len(self._functions)} reward functions; "
                "give each function its tasks (None for every task)"
            )
        checked: list[frozenset[str] | None] = []
        for rf, route in zip(self._functions, routes, strict=True):
            if route is not None and (
                # a bare string would route to its characters
                isinstance(route, str) or not all(isinstance(t, str) for t in route)
            ):
                raise TypeError(
                    f"the route of {rf.name!r} must be a collection of task names, got {route!r}"
                )
            checked.append(None if route is None else frozenset(route))
        return checked

    def _column_index(self, name: str, owner: int) -> int:
        if name in self._channel_names:
            return self._channel_names.index(name)
        rf = self._functions[owner]
        if rf.channels is not None and name in rf.channels:
            return self._offsets[owner] + rf.channels.index(name)
        raise ValueError(
            f"a gate on reward function {rf.name!r} refers to unknown channel {name!r}; the "
            f"channels are {self._channel_names}"
        )

    def _resolve_gates(self) -> list[Gate]:
        gates = []
        for owner, rf in enumerate(self._functions):
            for spec in rf.gates:
                own = 0 if rf.channels is None else rf.channels.index(str(spec.channel))
                channel = self._offsets[owner] + own
                on = self._column_index(spec.on, owner)
                if on == channel:
                    raise ValueError(
                        f"channel {self._channel_names[channel]!r} cannot gate itself; pass "
                        "another channel as 'on'"
                    )
                gates.append(Gate(channel, on, spec.mode, spec.threshold))
        return gates

    @property
    def functions(self) -> list[RewardFunction]:
        """The reward functions under their unique names, in channel order."""
        return list(self._functions)

    @property
    def channel_names(self) -> list[str]:
        """``[R]`` column names of the score matrix."""
        return list(self._channel_names)

    @property
    def num_channels(self) -> int:
        return len(self._channel_names)

    @property
    def reward_weights(self) -> np.ndarray:
        """``[R]`` float64 reward weights."""
        return self._reward_weights.copy()

    @property
    def gates(self) -> list[Gate]:
        """Conditioning gates with channel indices, for
        :func:`mtgrpo.algo.advantages.compute_advantages` (``gates=suite.gates``)."""
        return list(self._gates)

    @property
    def routed(self) -> bool:
        """True when built from a routing table (functions are called on their tasks only)."""
        return self._routes is not None

    @property
    def on_unscorable(self) -> str:
        return self._on_unscorable

    def tasks_of(self, channel: str | int) -> frozenset[str] | None:
        """The tasks a channel's function is routed to; ``None`` means every task."""
        if isinstance(channel, int) and not isinstance(channel, bool):
            if not 0 <= channel < self.num_channels:
                raise ValueError(
                    f"channel index {channel} is out of range [0, {self.num_channels})"
                )
            index = channel
        elif channel in self._channel_names:
            index = self._channel_names.index(channel)
        else:
            raise ValueError(f"unknown reward channel {channel!r}; channels: {self._channel_names}")
        # the function whose column block holds the index
        # side="right": an index equal to a block's start belongs to that block
        owner = int(np.searchsorted(self._offsets, index, side="right")) - 1
        return None if self._routes is None else self._routes[owner]

    def _applies(self, owner: int, task: str) -> bool:
        route = None if self._routes is None else self._routes[owner]
        return route is None or task in route

    def functions_for(self, task: str) -> list[RewardFunction]:
        """The functions called on rows of ``task`` (all of them without a routing table)."""
        return [rf for owner, rf in enumerate(self._functions) if self._applies(owner, task)]

    def validate_tasks(self, task_names: Collection[str]) -> dict[str, list[str]]:
        """Check that every task has a reward function; returns ``{task: channel names routed
        to it}``. With a routing table, a task that no entry (and no ``"*"`` entry) covers is a
        :class:`RewardError` listing the known tasks and the fix. Without one, every function
        is called on every task and decides per row, so nothing can fail here."""
        if isinstance(task_names, str):
            task_names = [task_names]
        self._check_task_labels(task_names)
        return {
            task: [name for rf in self.functions_for(task) for name in rf.column_names]
            for task in task_names
        }

    def check_columns(self, columns: Collection[str], extras: Collection[str] = ()) -> None:
        """Every parameter a function requires must be something it will be called with (the
        dataset's ``columns``, TRL's ``extras``, ``prompts``, ``completions``,
        ``completion_ids``): a missing column is a :class:`RewardError` naming it and the
        function before anything is generated, not a ``TypeError`` from inside the first
        call."""
        # what TRL 1.16 passes every reward function, plus the dataset's columns
        available = {"prompts", "completions", "completion_ids", *columns, *extras}
        for rf in self._functions:
            missing = [name for name in _required_keywords(rf.fn) if name not in available]
            if missing:
                shown = sorted(c for c in columns if not c.startswith("_"))
                raise RewardError(
                    f"reward function '{rf.name}' needs the dataset column(s) {missing}, which "
                    f"the training data does not have (its columns: {shown}). Add the column, "
                    "give the parameter a default, or take it from **kwargs",
                    function=str(rf.name),
                )

    def check_routes_have_rows(self, task_names: Collection[str]) -> None:
        """A routing entry for a task the data never holds (a typo, or a task left out) is a
        :class:`RewardError` naming it and the tasks there are, before any model loads."""
        known = set(task_names)
        routed = {t for route in self._routes or () if route is not None for t in route}
        empty = sorted(routed - known)
        if empty:
            raise RewardError(
                f"the reward routing table names task(s) {empty} that no row of the data has; "
                f"the data's tasks are {sorted(known)}. Fix the task names in the routing "
                "table (or the dataset's task column), or remove the entries"
            )

    def _check_task_labels(
        self, labels: Collection[str], row_tasks: Sequence[str] | None = None
    ) -> None:
        """Every label must have a function (only a routing table can miss one)."""
        missing = sorted({t for t in labels if not self.functions_for(t)})
        if not missing:
            return
        known = sorted({t for route in self._routes or () if route is not None for t in route})
        where = ""
        if row_tasks is not None:
            rows = [i for i, t in enumerate(row_tasks) if t == missing[0]]
            where = f" (task {missing[0]!r} at rows {rows[:5]}{', ...' if len(rows) > 5 else ''})"
        raise RewardError(
            f"no reward function is routed to task(s) {missing}{where}: the routing table "
            f"knows tasks {known} and has no '*' entry. Add the task to the routing table "
            f"({missing[0]!r}: [reward_fn]) or a '*' entry for functions that apply to every "
            "task",
            task=missing[0],
        )

    def _rows_of(self, owner: int, tasks: list[str]) -> list[int]:
        route = None if self._routes is None else self._routes[owner]
        if route is None:
            return list(range(len(tasks)))
        return [i for i, task in enumerate(tasks) if task in route]

    def score(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None,
        columns: Mapping[str, Sequence[Any]],
        tasks: Sequence[str],
        extra: Mapping[str, Any] | None = None,
    ) -> RewardScores:
        """Score ``N`` completions with every channel: ``values [N, R]`` float64, NaN = the
        function returned ``None`` or is not routed to the row's task.

        ``columns`` are the other dataset columns, one value per completion (``task`` is
        added from ``tasks`` when absent); ``extra`` (e.g. TRL's ``trainer_state``) is passed
        to every call unchanged. Sync functions run in order, then all async ones (and any
        awaitable a function returns) are awaited concurrently. Every contract violation is a
        :class:`RewardError` raised here, before any advantage is computed.
        """
        batch = RewardBatch.build(prompts, completions, completion_ids, columns, tasks, extra)
        self._check_task_labels(set(batch.tasks), batch.tasks)
        # NaN until scored: not routed and None stay NaN (ALGORITHMS.md §1)
        values = np.full((len(batch), self.num_channels), np.nan)  # [N, R]
        errors = np.zeros(values.shape, dtype=bool)  # [N, R]
        timeouts = np.zeros(values.shape, dtype=bool)  # [N, R]
        pending: list[tuple[int, list[int], Any]] = []
        try:
            for owner, rf in enumerate(self._functions):
                # routing: a function sees only its tasks' rows, never a None to return
                rows = self._rows_of(owner, batch.tasks)
                if not rows:
                    continue
                kwargs = batch.kwargs(rows)
                try:
                    with collect_scoring_errors() as failed:
                        # called at once: the loop variables the lambda reads are this iteration's
                        ended, out = call_with_deadline(lambda: rf.fn(**kwargs),  # noqa: B023
                                                        self._timeouts[owner])  # fmt: skip
                except Exception as exc:
                    # a crash is a RewardError naming the function and task, never a silent 0
                    raise function_failure(rf, batch, rows, exc) from exc
                start, stop = self._offsets[owner], self._offsets[owner + 1]
                if failed:
                    # failed holds rows of the call (as the function saw them): mapped back here
                    errors[[rows[i] for i in failed], start:stop] = True
                if not ended:
                    self._note_timeout(owner, batch, rows, timeouts)
                # awaited below, all together: TRL 1.16 gathers async functions the same way
                elif inspect.isawaitable(out):
                    pending.append((owner, rows, out))
                else:
                    self._store(values, owner, rows, coerce_output(rf, out, batch, rows))
        except BaseException:
            for *_, awaitable in pending:  # never awaited: close to avoid a RuntimeWarning
                if inspect.iscoroutine(awaitable):
                    awaitable.close()
            raise
        results = run_awaitables([with_deadline(awaitable, self._timeouts[owner])
                                  for owner, _, awaitable in pending])  # fmt: skip
        for (owner, rows, _), out in zip(pending, results, strict=True):
            rf = self._functions[owner]
            if out is TIMED_OUT:
                self._note_timeout(owner, batch, rows, timeouts)
                continue
            if isinstance(out, Exception):
                raise function_failure(rf, batch, rows, out) from out
            # KeyboardInterrupt and the like are not the function's fault: re-raised as they are
            if isinstance(out, BaseException):
                raise out
            self._store(values, owner, rows, coerce_output(rf, out, batch, rows))
        # after every function: a row is unscorable only if all of them passed on it
        UNSCORABLE_POLICIES.get(self._on_unscorable)(self, batch, values)
        # float64 from the reward functions' Python floats to the advantages, numpy until the
        # policy batch: one dtype, no rounding on the way (PolicyBatch reads them as float32)
        return RewardScores(values, ~np.isnan(values), self.channel_names, batch.tasks,
                            errors, timeouts)

    def _note_timeout(self, owner: int, batch: RewardBatch, rows: list[int],
                      timeouts: np.ndarray) -> None:  # fmt: skip
        """A call past its limit: its rows stay NaN for the function's channels (then
        ``on_unscorable`` decides for rows no other function scores), counted and told."""
        start, stop = self._offsets[owner], self._offsets[owner + 1]
        timeouts[rows, start:stop] = True
        for name in self._channel_names[start:stop]:
            self._timed_out[name] += len(rows)
        rf, seconds = self._functions[owner], self._timeouts[owner]
        seen = _timeout_warnings.get(str(rf.name), 0)
        # a slow function would otherwise warn every step
        if seen < _WARNINGS_PER_FUNCTION:
            _timeout_warnings[str(rf.name)] = seen + 1
            logger.warning(
                "reward function '%s' ran past its %.3g s time limit on %d completion(s) (%s); "
                "it does not apply to them (counted in rewards/%s/timeouts). Make it faster, "
                "or raise reward_timeout (or the function's own timeout)%s", rf.name, seconds,
                len(rows), batch.task_summary(rows), rf.column_names[0],
                "; further timeouts of this function are counted silently"
                if seen + 1 == _WARNINGS_PER_FUNCTION else "",
            )  # fmt: skip

    def pop_timeouts(self) -> dict[str, int]:
        """``{rewards/<channel>/timeouts: completions}`` since the last call (for logging)."""
        counts = {f"rewards/{name}/timeouts": count for name, count in self._timed_out.items()}
        # counts since the last pop: one step's worth per log line
        self._timed_out = dict.fromkeys(self._channel_names, 0)
        return counts

    def _store(self, values: np.ndarray, owner: int, rows: list[int], block: np.ndarray) -> None:
        start, stop = self._offsets[owner], self._offsets[owner + 1]
        values[rows, start:stop] = block  # block: [len(rows), C]

    def __repr__(self) -> str:
        parts = []
        for owner, rf in enumerate(self._functions):
            route = None if self._routes is None else self._routes[owner]
            where = "every task" if route is None else ", ".join(sorted(route))
            parts.append(f"{rf.name} -> {rf.column_names} on {where}")
        return f"RewardSuite({'; '.join(parts)}; on_unscorable={self._on_unscorable!r})"


def _required_keywords(fn: Callable[..., Any]) -> list[str]:
    """Parameters of ``fn`` a keyword call must supply (no default); none when its
    signature cannot be read."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return []
    # reward functions are called by keyword only, as TRL 1.16 does
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in parameters
            if p.kind in kinds and p.default is inspect.Parameter.empty]  # fmt: skip


@UNSCORABLE_POLICIES.register("raise")
def _raise_on_unscorable(suite: RewardSuite, batch: RewardBatch, values: np.ndarray) -> None:
    """A completion no channel scores would train on nothing: name it and the functions."""
    unscorable = np.isnan(values).all(axis=1)  # [N]
    if not unscorable.any():
        return
    rows = np.flatnonzero(unscorable).tolist()
    row, task = rows[0], batch.tasks[rows[0]]
    routed = [rf.name for rf in suite.functions_for(task)]
    skipped = [rf.name for rf in suite.functions if rf.name not in routed]
    reasons = f"{routed} returned None"
    if skipped:
        reasons += f" and {skipped} are not routed to task {task!r}"
    raise RewardError(
        f"no reward applies to row {row} (task {task!r}): {reasons}; {len(rows)} of "
        f"{len(batch)} completions are unscorable ({batch.task_summary(rows)}). Add a reward "
        "function for the task (a '*' routing entry applies to every task), make one return a "
        "number for these completions, or pass on_unscorable='zero_advantage' to give them "
        "advantage 0 (TRL's behaviour)",
        row=row,
        task=task,
    )


@UNSCORABLE_POLICIES.register("zero_advantage")
def _keep_unscorable(suite: RewardSuite, batch: RewardBatch, values: np.ndarray) -> None:
    """Keep all-NaN rows as they are: ``compute_advantages(on_unscorable="zero_advantage")``
    gives them advantage 0 and leaves them out of every statistic (TRL's behaviour)."""


@UNSCORABLE_POLICIES.register("warn")
def _warn_on_unscorable(suite: RewardSuite, batch: RewardBatch, values: np.ndarray) -> None:
    """TRL 1.16's behaviour: keep the all-NaN rows (advantage 0) and warn in TRL's words,
    with the first such row's reward arguments."""
    unscorable = np.flatnonzero(np.isnan(values).all(axis=1))
    if unscorable.size == 0:
        return
    row = int(unscorable[0])
    arguments = {key: value[row] for key, value in batch.columns.items()}
    arguments.update(prompt=batch.prompts[row], completion=batch.completions[row])
    logger.warning(
        # TRL 1.16's message, word for word (grpo_trainer.py)
        "All reward functions returned None for the following kwargs:\n%s\nPlease ensure that "
        "at least one reward function returns a valid reward.", arguments,
    )
