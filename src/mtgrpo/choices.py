"""The named choices of a run whose implementations need torch, declared once and without torch.

The configuration validates every option the moment it is built, before any model loads, and
building it imports no torch (:class:`mtgrpo.config.GRPOConfig`). So the names of reward
aggregations, loss types, generation backends, ``on_unscorable`` policies and learning-rate
schedules are declared here; the modules that implement them (:mod:`mtgrpo.advantages`,
:mod:`mtgrpo.policy.losses`, :mod:`mtgrpo.rollout`, :mod:`mtgrpo.rewards.suite`) register their
objects under these names (``@AGGREGATIONS.register("gdpo")``). A declared name is known at
once (``canonical``, ``in``, ``names``) and usable (``get``) once its module is imported.

The choices of the numpy modules (task weightings, samplers, zero-gradient filters) are their own
registries, :data:`mtgrpo.weighting.WEIGHTINGS` and :data:`mtgrpo.sampling.SAMPLERS`, which import
no torch either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mtgrpo._registry import Registry

__all__ = [
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
    "check_is_correction",
    "check_optimizer_name",
    "check_scheduler_name",
    "resolve_aggregation",
    "resolve_scale_rewards",
]

AGGREGATIONS: Registry[Callable[..., Any]] = Registry(
    "reward aggregation", provider="mtgrpo.advantages")
"""How reward channels become one advantage (:mod:`mtgrpo.advantages` documents each)."""
AGGREGATIONS.declare("sum_then_normalize", aliases=("an", "sum_normalize"))
AGGREGATIONS.declare("normalize_then_sum", aliases=("na", "mo_grpo", "normalise_then_sum"))
AGGREGATIONS.declare("gdpo")
AGGREGATIONS.declare("single")

SCALE_REWARDS = ("group", "batch", "none")
"""What centred rewards are divided by: the group's std, the batch's, or nothing (Dr. GRPO)."""

NONE_HANDLING = ("neutral", "zero")
"""How a reward function's ``None`` enters the advantage (:mod:`mtgrpo.advantages`)."""

ON_UNSCORABLE: Registry[Callable[..., Any]] = Registry(
    "on_unscorable policy", provider="mtgrpo.rewards.suite")
"""A completion no reward applies to: ``raise``; ``warn`` (TRL's behaviour and warning:
advantage 0); ``zero_advantage`` (the same, silently). The configuration also accepts ``auto``
(``raise`` with a task column, ``warn`` without one), which the trainer resolves."""
for _name in ("raise", "warn", "zero_advantage"):
    ON_UNSCORABLE.declare(_name)

LOSS_TYPES: Registry[Callable[..., Any]] = Registry("loss type", provider="mtgrpo.policy.losses")
"""How per-token policy terms are summed into the loss (:mod:`mtgrpo.policy.losses`)."""
LOSS_TYPES.declare("grpo", aliases=("sequence_mean",))
LOSS_TYPES.declare("dapo", aliases=("token_mean",))
for _name in ("dr_grpo", "bnpo", "cispo", "vespo", "sapo", "luspo"):
    LOSS_TYPES.declare(_name)

TRACKERS = ("tensorboard", "wandb", "trackio")
"""The experiment trackers ``report_to`` may name: each is also the name of its package and of
mtgrpo's extra (``pip install 'mtgrpo[wandb]'``); ``metrics.jsonl`` is always written."""

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
"""One importance ratio per token, or one per completion (GSPO)."""

MALFORMED_TOOL_CALLS = ("end", "reply")
"""What a malformed tool call (not JSON, no name) does: end the rollout (TRL's rule) or get an
error reply the model reads, as a failing call does."""

IS_CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""TRL's ``vllm_importance_sampling_mode``: the engine's importance-correction ratio per token or
per completion, clamped to or masked outside its bounds (:mod:`mtgrpo.policy.engine_correction`)."""


def check_is_correction(mode: str, clip_min: float | None, clip_max: float | None) -> None:
    """TRL's ``vllm_importance_sampling_mode`` and its bounds, or an error naming the value."""
    if mode not in IS_CORRECTION_MODES:
        raise ValueError(
            f"vllm_importance_sampling_mode={mode!r} is not valid; use one of "
            f"{', '.join(IS_CORRECTION_MODES)}"
        )
    for name, value in (("clip_min", clip_min), ("clip_max", clip_max)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not value >= 0):
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
    return next(iter(named.values()), "sum_then_normalize")


def resolve_scale_rewards(scale_rewards: str | bool) -> str:
    """TRL accepts ``True`` (= "group") and ``False`` (= "none") as well as the three names."""
    if scale_rewards is True:
        return "group"
    if scale_rewards is False:
        return "none"
    if isinstance(scale_rewards, str) and scale_rewards.lower() in SCALE_REWARDS:
        return scale_rewards.lower()
    raise ValueError(
        f"scale_rewards={scale_rewards!r} is not valid; use one of {', '.join(SCALE_REWARDS)} "
        "(or True = 'group', False = 'none')"
    )
