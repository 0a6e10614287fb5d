"""Names users pick things by: the registry every extension point uses, and the run's choices.

:class:`Registry` maps names (and aliases) to objects of one kind. It refuses duplicate names
and, when a lookup fails, lists the valid names, so a typo in a run file is answered with the
fix rather than a ``KeyError``.

The choices whose implementations need torch are declared here without it: the configuration
validates every option the moment it is built, before any model loads, and building it imports
no torch. So the names of reward aggregations, loss types, generation backends, ``on_unscorable``
policies and learning-rate schedules are declared here, and the modules that implement them
(:mod:`mtgrpo.algo.advantages`, :mod:`mtgrpo.algo.losses`, :mod:`mtgrpo.rollout`,
:mod:`mtgrpo.rewards.suite`) register their objects under these names
(``@AGGREGATIONS.register("gdpo")``). A declared name is known at once (``canonical``, ``in``,
``names``) and usable (``get``) once its module is imported. Closed choices that users cannot
extend are ``Literal`` types with their values as a tuple (``ScaleRewards`` / ``SCALE_REWARDS``).

The choices of the numpy modules (task weightings, samplers, zero-gradient filters) are their own
registries, :data:`mtgrpo.algo.weighting.WEIGHTINGS` and :data:`mtgrpo.algo.sampling.SAMPLERS`,
which import no torch either.
"""


from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, Literal, TypeVar, get_args

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
        # A placeholder: names(), canonical() and `in` know it before its module loads.
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
        # Exact first, so a name registered with capitals stays reachable; then case-insensitively.
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


__all__ += [
    "AGGREGATIONS",
    "BACKENDS",
    "IMPORTANCE_SAMPLING_LEVELS",
    "IS_CORRECTION_MODES",
    "LOSS_TYPES",
    "MALFORMED_TOOL_CALLS",
    "NONE_HANDLING",
    "ON_UNSCORABLE",
    "SCALE_REWARDS",
    "SCHEDULERS",
    "TRACKERS",
    "ISCorrectionMode",
    "ImportanceSamplingLevel",
    "MalformedToolCalls",
    "NoneHandling",
    "ScaleRewards",
    "Tracker",
    "check_is_correction",
    "check_optimizer_name",
    "check_scheduler_name",
    "resolve_aggregation",
    "resolve_scale_rewards",
]

AGGREGATIONS: Registry[Callable[..., Any]] = Registry(
    "reward aggregation", provider="mtgrpo.algo.advantages")
"""How reward channels become one advantage (:mod:`mtgrpo.algo.advantages` documents each)."""
# an / na: the multireward-grpo package's AN / NA orderings (ALGORITHMS.md §2); mo_grpo: MO-GRPO's
AGGREGATIONS.declare("sum_then_normalize", aliases=("an", "sum_normalize"))
AGGREGATIONS.declare("normalize_then_sum", aliases=("na", "mo_grpo", "normalise_then_sum"))
AGGREGATIONS.declare("gdpo")
AGGREGATIONS.declare("single")

ScaleRewards = Literal["group", "batch", "none"]
SCALE_REWARDS: tuple[str, ...] = get_args(ScaleRewards)
"""What centred rewards are divided by: the group's std, the batch's, or nothing (Dr. GRPO)."""

NoneHandling = Literal["neutral", "zero"]
NONE_HANDLING: tuple[str, ...] = get_args(NoneHandling)
"""How a reward function's ``None`` enters the advantage (:mod:`mtgrpo.algo.advantages`)."""

ON_UNSCORABLE: Registry[Callable[..., Any]] = Registry(
    "on_unscorable policy", provider="mtgrpo.rewards.suite")
"""A completion no reward applies to: ``raise``; ``warn`` (TRL's behaviour and warning:
advantage 0); ``zero_advantage`` (the same, silently). The configuration also accepts ``auto``
(``raise`` with a task column, ``warn`` without one), which the trainer resolves."""
for _name in ("raise", "warn", "zero_advantage"):
    ON_UNSCORABLE.declare(_name)

LOSS_TYPES: Registry[Callable[..., Any]] = Registry("loss type", provider="mtgrpo.algo.losses")
"""How per-token policy terms are summed into the loss (:mod:`mtgrpo.algo.losses`)."""
# TRL 1.16's loss_type names; sequence_mean / token_mean are ALGORITHMS.md §3's
LOSS_TYPES.declare("grpo", aliases=("sequence_mean",))
LOSS_TYPES.declare("dapo", aliases=("token_mean",))
for _name in ("dr_grpo", "bnpo", "cispo", "vespo", "sapo", "luspo"):
    LOSS_TYPES.declare(_name)

Tracker = Literal["tensorboard", "wandb", "trackio"]
TRACKERS: tuple[str, ...] = get_args(Tracker)
"""The experiment trackers ``report_to`` may name: each is also the name of its package and of
mtgrpo's extra (``pip install 'mtgrpo[wandb]'``); ``metrics.jsonl`` is always written."""

ImportanceSamplingLevel = Literal["token", "sequence"]
IMPORTANCE_SAMPLING_LEVELS: tuple[str, ...] = get_args(ImportanceSamplingLevel)
"""One importance ratio per token, or one per completion (GSPO)."""

MalformedToolCalls = Literal["end", "reply"]
MALFORMED_TOOL_CALLS: tuple[str, ...] = get_args(MalformedToolCalls)
"""What a malformed tool call (not JSON, no name) does: end the rollout (TRL's rule) or get an
error reply the model reads, as a failing call does."""

ISCorrectionMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
IS_CORRECTION_MODES: tuple[str, ...] = get_args(ISCorrectionMode)
"""TRL's ``vllm_importance_sampling_mode``: the engine's importance-correction ratio per token or
per completion, clamped to or masked outside its bounds (:mod:`mtgrpo.algo.engine_correction`)."""


def check_is_correction(mode: str, clip_min: float | None, clip_max: float | None) -> None:
    """TRL's ``vllm_importance_sampling_mode`` and its bounds, or an error naming the value."""
    if mode not in IS_CORRECTION_MODES:
        raise ValueError(
            f"vllm_importance_sampling_mode={mode!r} is not valid; use one of "
            f"{', '.join(IS_CORRECTION_MODES)}"
        )
    for name, value in (("clip_min", clip_min), ("clip_max", clip_max)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not value >= 0):  # `not >= 0`: NaN too
            raise ValueError(
                f"vllm_importance_sampling_{name}={value!r} must be a number >= 0 or None "
                "(no bound on that side)"
            )
    if clip_min is not None and clip_max is not None and clip_min > clip_max:
        raise ValueError(
            f"vllm_importance_sampling_clip_min={clip_min} exceeds clip_max={clip_max}; the "
            "bounds [clip_min, clip_max] would admit no ratio"
        )

BACKENDS: Registry[Callable[..., Any]] = Registry("generation backend", provider="mtgrpo.rollout")
"""Generation backends by name (:mod:`mtgrpo.rollout`); ``auto`` picks ``static`` where the
model supports it, else ``hf``."""
BACKENDS.declare("hf", aliases=("transformers", "hf_generate"))
BACKENDS.declare("static", aliases=("static_cache", "fast"))

# Our schedule names -> transformers.get_scheduler names. "constant" keeps the warm-up when one
# is asked for (transformers' plain "constant" would silently ignore it).
SCHEDULERS: Registry[str] = Registry("learning-rate schedule")
SCHEDULERS.add("constant", "constant_with_warmup", aliases=("constant_with_warmup",))
SCHEDULERS.add("linear", "linear")
SCHEDULERS.add("cosine", "cosine")

# Optimizers mtgrpo builds itself (with the Trainer's parameter groups): known without asking
# transformers, whose list of names imports torch.
_OWN_OPTIMIZERS = ("adamw_torch", "adamw_torch_fused")


def check_scheduler_name(kind: str) -> str:
    """The transformers schedule name for ``kind`` (ours, or any transformers ``SchedulerType``:
    only a name that is not ours asks transformers, which imports torch)."""
    if kind in SCHEDULERS:
        return SCHEDULERS.get(kind)
    from transformers import SchedulerType

    valid = [member.value for member in SchedulerType]
    if kind not in valid:
        raise ValueError(
            f"unknown learning-rate schedule {kind!r}; valid names: constant, linear, cosine "
            f"and transformers' {', '.join(valid)} (lr_scheduler_type)"
        )
    return kind


def check_optimizer_name(name: str) -> str:
    """``name`` when transformers knows the optimizer; an error listing them otherwise (only a
    name mtgrpo does not build itself asks transformers, which imports torch)."""
    if name in _OWN_OPTIMIZERS:
        return name
    from transformers.training_args import OptimizerNames

    valid = [member.value for member in OptimizerNames]
    if name not in valid:
        raise ValueError(f"optim={name!r} is not an optimizer name; valid: {', '.join(valid)}")
    return name


def resolve_aggregation(
    aggregation: str | None = None,
    *,
    multi_objective_aggregation: str | None = None,
    reward_aggregation_method: str | None = None,
) -> str:
    """The canonical aggregation name from any of the names users know it by.

    ``multi_objective_aggregation`` is TRL's field name, ``reward_aggregation_method`` the
    name some TRL tutorials use; ``an`` / ``na`` / ``single`` are the ``multireward-grpo``
    vocabulary. Giving two different values is an error.
    """
    given = {
        "aggregation": aggregation,
        "multi_objective_aggregation": multi_objective_aggregation,
        "reward_aggregation_method": reward_aggregation_method,
    }
    named = {k: AGGREGATIONS.canonical(v) for k, v in given.items() if v is not None}
    if len(set(named.values())) > 1:
        raise ValueError(
            "conflicting reward aggregation settings "
            + ", ".join(f"{k}={given[k]!r}" for k in named)
            + "; set only one of them"
        )
    return next(iter(named.values()), "sum_then_normalize")  # TRL 1.16's default


def resolve_scale_rewards(scale_rewards: str | bool) -> str:
    """TRL accepts ``True`` (= "group") and ``False`` (= "none") as well as the three names."""
    if scale_rewards is True:
        return "group"  # TRL 1.16 GRPOConfig: {True: "group", False: "none"}
    if scale_rewards is False:
        return "none"
    if isinstance(scale_rewards, str) and scale_rewards.lower() in SCALE_REWARDS:
        return scale_rewards.lower()
    raise ValueError(
        f"scale_rewards={scale_rewards!r} is not valid; use one of {', '.join(SCALE_REWARDS)} "
        "(or True = 'group', False = 'none')"
    )
