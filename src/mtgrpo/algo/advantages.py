"""Group-relative advantages for multi-reward GRPO: pure functions of a ``[N, R]`` score matrix.

Notation: a batch holds ``B`` prompts (groups), each with ``G`` completions, so ``N = B*G``
rows ordered group by group; each row is scored by ``R`` reward channels with weights
``w [R]``; ``NaN`` marks a channel that does not apply to a row (its function returned
``None`` or was not routed to the row's task).

Aggregations (ALGORITHMS.md §2; names are registered in :data:`AGGREGATIONS`):

``sum_then_normalize`` (alias ``an``; TRL's default, GRPO)
    ``s_j = Σ_l w_l r_jl``, then ``A_j = (s_j − mean(s)) / (std(s) + δ)`` within the group.
``normalize_then_sum`` (aliases ``na``, ``mo_grpo``; MO-GRPO)
    ``z_jl = (r_jl − mean_l) / (std_l + δ)`` per channel within the group, ``A_j = Σ_l w_l z_jl``.
``gdpo`` (GDPO)
    ``normalize_then_sum`` followed by ``Â = (A − mean_batch A) / (std_batch A + δ)``.
    **TRL 1.16's** ``multi_objective_aggregation="normalize_then_sum"`` **is this variant.**
    We keep the name ``normalize_then_sum`` for the plain MO-GRPO estimator on purpose: the
    batch re-normalisation couples groups through a batch statistic and rescales every
    channel's influence, which breaks the weight-proportional influence and the
    ``(τ²/m) wᵀCw`` noise law of the gradient-noise analysis. TRL users who want TRL's numbers
    pick ``gdpo``.
``single``
    Channel 0 only, group-normalised (an ablation).

``scale_rewards`` (TRL's option): ``"group"`` divides by the group std, ``"batch"`` by the std
of the whole batch, ``"none"`` only centres (Dr. GRPO). For the per-channel orderings it applies
to each channel's normalisation.

``None`` semantics (``none_handling``), chosen deliberately:

``"neutral"`` (default)
    A ``None`` neither rewards nor penalises. Under sum-then-normalise the missing entry is
    replaced by that channel's mean over the group's applicable rows before summing; under
    normalise-then-sum its normalised value is 0. This is TRL's behaviour for
    normalise-then-sum, and the reason a reward function may return ``None`` for a completion
    without silently handing it a reward of 0.
``"zero"``
    A ``None`` counts as a reward of 0 (TRL's sum-then-normalise behaviour, which ``nansum``
    gives). Rows where *every* channel is ``None`` are never zero-filled.

A row where every channel is ``NaN`` is *unscorable*: by default an error
(``on_unscorable="raise"``); with ``"zero_advantage"`` or ``"warn"`` (TRL's behaviour; the reward
suite is the one that warns) it gets advantage 0 and
is left out of every mean and std.

Gates (conditioning, ALGORITHMS.md §2) are applied before the ordering: channel ``b`` counts only
where gate channel ``a`` passes (``r_a >= threshold``; a ``NaN`` gate does not pass).
``zero_fill`` sets ``r_b = 0`` where the gate fails; ``subgroup`` centres ``r_b`` over the
passing rows of the group and sets it to 0 elsewhere (with fewer than two passing rows the
channel is 0 for the whole group).

Standard deviations use ``ddof=1`` (unbiased, TRL's choice) with ``δ = 1e-4`` by default; the
gradient-noise analysis uses ``ddof=0`` and ``δ = 1e-8`` as its formulas do. A std over fewer
than ``ddof + 1`` values is 0.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from mtgrpo.algo.metrics import lacks_contrast, scalar_rewards
from mtgrpo.algo.registry import (
    AGGREGATIONS,
    NONE_HANDLING,
    ON_UNSCORABLE,
    SCALE_REWARDS,
    resolve_aggregation,
    resolve_scale_rewards,
)

__all__ = [
    "AGGREGATIONS",
    "GATE_MODES",
    "NONE_HANDLING",
    "SCALE_REWARDS",
    "AdvantageResult",
    "Gate",
    "apply_gates",
    "channel_zscores",
    "compute_advantages",
    "normalises_over_the_batch",
    "resolve_aggregation",
    "resolve_scale_rewards",
]

GATE_MODES = ("zero_fill", "subgroup")


@dataclass(frozen=True)
class Gate:
    """Channel ``channel`` counts only where channel ``on`` passes (``r_on >= threshold``)."""

    channel: int
    on: int
    mode: str = "zero_fill"
    threshold: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in GATE_MODES:
            raise ValueError(
                f"gate mode {self.mode!r} is not one of {', '.join(GATE_MODES)}; "
                "use 'zero_fill' (r_b = 0 where the gate fails) or 'subgroup' "
                "(centre r_b over the passing rows)"
            )
        if self.channel == self.on:
            raise ValueError(f"a channel cannot gate itself (channel {self.channel})")


@dataclass(frozen=True)
class AdvantageResult:
    """Output of :func:`compute_advantages`: numpy arrays, or torch tensors on the rewards'
    device and dtype when the rewards were a tensor.

    Attributes:
        advantages: ``[N]`` one advantage per completion (0 for unscorable rows).
        zero_gradient: ``[B]`` True where the group has no within-group contrast in the values
            the aggregation normalises (the one zero-gradient rule, :mod:`mtgrpo.algo.metrics`),
            decided before any batch-level step.
        unscorable: ``[N]`` True where every channel is NaN.
        scalar_rewards: ``[N]`` ``Σ_l w_l r_jl`` over the applicable channels (NaN for
            unscorable rows), for logging.
    """

    advantages: Any
    zero_gradient: Any
    unscorable: Any
    scalar_rewards: Any


@dataclass(frozen=True)
class _Spec:
    weights: np.ndarray  # [R]
    scale: str
    none_handling: str
    ddof: int
    eps: float


# An aggregation maps gated rewards [B, G, R] (NaN = n/a) and a row mask [B, G] of scorable rows
# to group-level advantages [B, G] and the centred contrast used for the zero-gradient test.
# The names (and aliases) are declared in mtgrpo.algo.registry, so a configuration validates them
# without importing the estimators.
Aggregation = Callable[[np.ndarray, np.ndarray, _Spec], tuple[np.ndarray, np.ndarray]]


def _masked_mean(x: np.ndarray, mask: np.ndarray, axis: int | tuple[int, ...]) -> np.ndarray:
    """Mean of ``x`` over ``axis`` counting only ``mask``; 0 where nothing counts."""
    count = mask.sum(axis=axis, keepdims=True)
    total = np.where(mask, x, 0.0).sum(axis=axis, keepdims=True, dtype=x.dtype)
    # A group with no counted row (all unscorable) gets mean 0, not 0/0 = NaN.
    return total / np.maximum(count, 1).astype(x.dtype)


def _masked_std(x: np.ndarray, mask: np.ndarray, axis: int | tuple[int, ...], ddof: int
                ) -> np.ndarray:
    """Std of ``x`` over ``axis`` counting only ``mask`` (``ddof`` as in numpy); 0 if too few."""
    count = mask.sum(axis=axis, keepdims=True)
    mean = _masked_mean(x, mask, axis)
    # Two passes (centre, then square): no cancellation on large rewards, as E[x²] − E[x]² has.
    sq = np.where(mask, (x - mean) ** 2, 0.0).sum(axis=axis, keepdims=True, dtype=x.dtype)
    dof = count - ddof  # ddof=1: Bessel's correction, as TRL's nanstd (count / (count - 1))
    # Too few values: std 0 where TRL's nanstd gives NaN, so the advantage stays finite.
    var = np.where(dof > 0, sq / np.maximum(dof, 1).astype(x.dtype), 0.0).astype(x.dtype)
    return np.sqrt(var)


def _scale(centred: np.ndarray, x: np.ndarray, mask: np.ndarray, spec: _Spec) -> np.ndarray:
    """Divide centred values by the group or batch std (``x`` [B, G, C] holds the raw values)."""
    if spec.scale == "none":
        return centred  # Dr. GRPO: centre only, no division by a std (ALGORITHMS.md §2)
    # "batch" is TRL's scale_rewards="batch": the std of the raw values over the whole batch
    # (about the batch mean), while the centring stays per group.
    axis: tuple[int, ...] = (1,) if spec.scale == "group" else (0, 1)
    std = _masked_std(x, mask, axis, spec.ddof)
    return centred / (std + x.dtype.type(spec.eps))  # δ on the std, as TRL's (std + 1e-4)


def _has_contrast(centred: np.ndarray, reference: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``[B]`` True where some masked centred value is non-negligible relative to ``reference``
    (the zero-gradient rule, :func:`mtgrpo.algo.metrics.lacks_contrast`)."""
    b = centred.shape[0]
    size = np.where(mask, np.abs(centred), 0.0).reshape(b, -1).max(axis=1, initial=0.0)
    # Relative to the largest raw value: float noise on large rewards (reward-model logits)
    # must not make a group count as informative.
    ref = np.where(mask, np.abs(reference), 0.0).reshape(b, -1).max(axis=1, initial=0.0)
    return ~lacks_contrast(size, ref)


@AGGREGATIONS.register("sum_then_normalize")
def _sum_then_normalize(rewards: np.ndarray, scorable: np.ndarray, spec: _Spec
                        ) -> tuple[np.ndarray, np.ndarray]:
    applicable = ~np.isnan(rewards)  # [B, G, R]
    if spec.none_handling == "neutral":
        # The channel's group mean: a None moves s neither up nor down relative to the group.
        fill = np.broadcast_to(_masked_mean(rewards, applicable, axis=1), rewards.shape)
    else:
        fill = np.zeros_like(rewards)  # TRL 1.16's nansum in _generate_and_score_completions
    filled = np.where(applicable, rewards, fill)
    # ALGORITHMS.md §2 (AN, TRL's sum_then_normalize): s_j = Σ_l w_l r_jl, then group-normalised
    s = (filled * spec.weights).sum(axis=-1)  # [B, G]
    # Baseline over scorable rows only: TRL sets unscorable rows to NaN before its nanmean.
    centred = s - _masked_mean(s, scorable, axis=1)
    advantages = _scale(centred, s, scorable, spec)
    # Decided before any scaling, so the verdict does not depend on the rest of the batch.
    contrast = _has_contrast(centred, s, scorable)
    # Unscorable rows: advantage 0, TRL's nan_to_num(advantages, nan=0.0).
    return np.where(scorable, advantages, 0.0).astype(rewards.dtype), contrast


def _zscores(rewards: np.ndarray, scorable: np.ndarray, spec: _Spec
             ) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel normalised rewards ``[B, G, R]`` (0 where not counted) and the contrast."""
    applicable = ~np.isnan(rewards)
    if spec.none_handling == "neutral":
        # A None is left out of its channel's mean and std and gets z = 0: TRL 1.16's
        # nanmean / nanstd / nansum in its normalize_then_sum branch.
        valid, values = applicable, rewards
    else:
        # "zero": a None is a reward of 0 on every scorable row; unscorable rows stay out.
        valid = np.broadcast_to(scorable[..., None], rewards.shape)
        values = np.where(applicable, rewards, 0.0).astype(rewards.dtype)
    # ALGORITHMS.md §2 (NA, MO-GRPO): z_jl = (r_jl − mean_l) / (std_l + δ) within the group
    centred = values - _masked_mean(values, valid, axis=1)
    z = _scale(centred, values, valid, spec)
    contrast = _has_contrast(centred, values, valid)
    return np.where(valid, z, 0.0).astype(rewards.dtype), contrast


@AGGREGATIONS.register("normalize_then_sum")
def _normalize_then_sum(rewards: np.ndarray, scorable: np.ndarray, spec: _Spec
                        ) -> tuple[np.ndarray, np.ndarray]:
    z, contrast = _zscores(rewards, scorable, spec)
    # MO-GRPO weighs after normalising, so channel l's influence is proportional to w_l (the
    # (τ²/m) wᵀCw noise law that mtgrpo.analysis.theorem3 checks).
    advantages = (z * spec.weights).sum(axis=-1)  # A_j = Σ_l w_l z_jl
    return np.where(scorable, advantages, 0.0).astype(rewards.dtype), contrast


@AGGREGATIONS.register("gdpo")
def _gdpo(rewards: np.ndarray, scorable: np.ndarray, spec: _Spec
          ) -> tuple[np.ndarray, np.ndarray]:
    # The zero-gradient verdict stays the group-level one, decided before the batch step.
    group_level, contrast = _normalize_then_sum(rewards, scorable, spec)
    # GDPO's batch step, TRL 1.16's normalize_then_sum: (A − nanmean) / (nanstd + 1e-4) over
    # the batch. Each group's A sums to 0, so this mean is ~0 and the step mostly rescales.
    batch_mean = _masked_mean(group_level, scorable, axis=(0, 1))
    batch_std = _masked_std(group_level, scorable, axis=(0, 1), ddof=spec.ddof)
    advantages = (group_level - batch_mean) / (batch_std + rewards.dtype.type(spec.eps))
    return np.where(scorable, advantages, 0.0).astype(rewards.dtype), contrast


@AGGREGATIONS.register("single")
def _single(rewards: np.ndarray, scorable: np.ndarray, spec: _Spec
            ) -> tuple[np.ndarray, np.ndarray]:
    channel0 = rewards[..., :1]
    # ALGORITHMS.md §2 'single': channel 0 alone, with weight 1.
    one = _Spec(np.ones(1, dtype=rewards.dtype), spec.scale, spec.none_handling, spec.ddof,
                spec.eps)
    # A row where channel 0 is None has no reward in this ablation: treated as unscorable.
    return _sum_then_normalize(channel0, scorable & ~np.isnan(channel0[..., 0]), one)


def normalises_over_the_batch(aggregation: str, scale_rewards: str | bool) -> bool:
    """Whether an advantage depends on the other groups of the batch: ``scale_rewards="batch"``
    (the batch's std) or ``gdpo`` (a batch re-normalisation). Otherwise every group's advantages
    are a function of its own rewards alone, whatever batch it is computed in."""
    return (resolve_scale_rewards(scale_rewards) == "batch"
            or AGGREGATIONS.canonical(aggregation) == "gdpo")


def _torch_tensor(value: Any) -> Any:
    """``value`` if it is a torch tensor, else None. The estimators are numpy; a caller's
    tensors are converted at the edge (torch is only consulted if the caller loaded it)."""
    torch = sys.modules.get("torch")
    return value if torch is not None and isinstance(value, torch.Tensor) else None


def _numpy(value: Any) -> np.ndarray:
    """A numpy view of ``value`` (a tensor on any device is copied to the host once)."""
    tensor = _torch_tensor(value)
    return tensor.detach().cpu().numpy() if tensor is not None else np.asarray(value)


def _like(tensor: Any) -> Callable[[np.ndarray], Any]:
    """Results in the caller's kind: tensors on ``tensor``'s device (floats in its dtype) when
    the rewards came as one, numpy otherwise."""
    if tensor is None:
        return lambda array: array
    torch = sys.modules["torch"]

    def convert(array: np.ndarray) -> Any:
        out = torch.from_numpy(np.ascontiguousarray(array)).to(tensor.device)
        return out.to(tensor.dtype) if out.is_floating_point() else out

    return convert


def _as_array(rewards: Any) -> np.ndarray:
    x = _numpy(rewards)
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float32)  # 0/1 verifier scores arrive as integers; NaN needs a float
    if x.ndim != 2:
        raise ValueError(
            f"rewards must have shape [N, R] (completions × reward channels), got "
            f"{tuple(x.shape)}; use rewards[:, None] for a single channel"
        )
    # ±inf would turn a group's mean and std into NaN (the whole batch's under "batch" or gdpo).
    if np.isinf(x).any():
        row = int(np.flatnonzero(np.isinf(x).any(axis=1))[0])
        raise ValueError(
            f"rewards contain ±inf (first at row {row}); rewards must be finite or NaN"
        )
    return x


def _weights(reward_weights: Any, r: int, like: np.ndarray) -> np.ndarray:
    if reward_weights is None:
        return np.ones(r, dtype=like.dtype)
    w = _numpy(reward_weights).astype(like.dtype).reshape(-1)
    if w.size != r:
        raise ValueError(
            f"reward_weights has {w.size} values but the rewards have {r} channels; "
            "give one weight per reward channel"
        )
    if not np.isfinite(w).all():
        raise ValueError(f"reward_weights must be finite, got {w.tolist()}")
    return w


def _check_unscorable(unscorable: np.ndarray, on_unscorable: str, group_size: int) -> None:
    if on_unscorable not in ON_UNSCORABLE:
        raise ValueError(
            f"on_unscorable={on_unscorable!r} is not valid; use one of "
            f"{', '.join(ON_UNSCORABLE.names())}"
        )
    # DESIGN.md: a task with no applicable reward must never train silently.
    if on_unscorable == "raise" and unscorable.any():
        rows = np.flatnonzero(unscorable)
        first = [int(i) for i in rows[:5]]
        raise ValueError(
            f"{rows.size} completion(s) have no applicable reward (every channel is None), "
            f"first rows {first} (groups {sorted({i // group_size for i in first})}); make at "
            "least one reward function apply to every task, or pass "
            "on_unscorable='zero_advantage' to give such completions advantage 0 (TRL's behaviour)"
        )


def _gated(x: np.ndarray, gates: Sequence[Gate], group_size: int) -> np.ndarray:
    """``apply_gates`` on numpy ``[N, R]``."""
    if not gates:
        return x
    r = x.shape[1]
    x = x.reshape(-1, group_size, r).copy()  # [B, G, R]; the caller's rewards stay as given
    # In order: a gate reads its gate channel as earlier gates left it, so gates can chain.
    for gate in gates:
        for index in (gate.channel, gate.on):
            if not 0 <= index < r:
                raise ValueError(f"gate {gate} refers to channel {index}, but there are {r}")
        target = x[..., gate.channel]
        applicable = ~np.isnan(target)
        with np.errstate(invalid="ignore"):  # a NaN gate compares False: it does not pass
            passed = (x[..., gate.on] >= gate.threshold) & applicable
        if gate.mode == "zero_fill":
            # ALGORITHMS.md §2: r_b ← r_b · 1[gate passes]; a None in b stays None.
            x[..., gate.channel] = np.where(applicable & ~passed, 0.0, target)
            continue
        # ALGORITHMS.md §2: fewer than two passing rows leave no contrast, the channel is zero.
        enough = passed.sum(axis=1, keepdims=True) >= 2  # [B, 1]
        centred = target - _masked_mean(target, passed, axis=1)
        gated = np.where(passed & enough, centred, 0.0)
        # Keep b's NaN so none_handling still decides how a None enters the advantage.
        x[..., gate.channel] = np.where(applicable, gated, target)
    return x.reshape(-1, r)


def apply_gates(rewards: Any, gates: Sequence[Gate], group_size: int) -> Any:
    """Apply conditioning gates to ``rewards [N, R]`` in order; returns a new ``[N, R]`` array
    (a tensor like ``rewards`` when it is one)."""
    if not gates:
        return rewards
    return _like(_torch_tensor(rewards))(_gated(_as_array(rewards), gates, group_size))


def _spec(rewards: np.ndarray, group_size: int, reward_weights, scale_rewards, none_handling,
          ddof: int, eps: float) -> _Spec:
    if group_size < 1 or rewards.shape[0] % group_size:
        raise ValueError(
            f"group_size={group_size} must be a positive divisor of the number of rows "
            f"({rewards.shape[0]}); rows are ordered group by group, G per prompt"
        )
    if none_handling not in NONE_HANDLING:
        raise ValueError(
            f"none_handling={none_handling!r} is not valid; use 'neutral' (None neither rewards "
            "nor penalises) or 'zero' (None counts as a reward of 0, TRL's sum-then-normalise)"
        )
    if ddof not in (0, 1):
        raise ValueError(f"ddof={ddof} must be 0 (population std) or 1 (unbiased, TRL)")
    if not eps >= 0:  # `not >= 0`, not `< 0`: NaN is refused too
        raise ValueError(f"eps={eps} must be >= 0")
    weights = _weights(reward_weights, rewards.shape[1], rewards)
    return _Spec(weights, resolve_scale_rewards(scale_rewards), none_handling, ddof, eps)


def compute_advantages(
    rewards: Any,
    group_size: int,
    *,
    reward_weights: Any = None,
    aggregation: str | None = None,
    scale_rewards: str | bool = "group",
    gates: Sequence[Gate] = (),
    none_handling: str = "neutral",
    on_unscorable: str = "raise",
    ddof: int = 1,
    eps: float = 1e-4,
    multi_objective_aggregation: str | None = None,
    reward_aggregation_method: str | None = None,
) -> AdvantageResult:
    """Advantages ``[N]`` from reward channels ``[N, R]`` (see the module docstring).

    Computed in numpy, in the rewards' float precision (integers as float32). The result holds
    numpy arrays, or torch tensors on the rewards' device and in their dtype when ``rewards``
    is a tensor.

    Args:
        rewards: ``[N, R]`` scores (numpy, torch, or nested lists), ``NaN`` = not applicable;
            rows grouped ``G`` at a time.
        group_size: ``G``, completions per prompt.
        reward_weights: ``[R]`` channel weights (default all 1).
        aggregation: a name in :data:`AGGREGATIONS` (default ``sum_then_normalize``);
            ``multi_objective_aggregation`` and ``reward_aggregation_method`` are accepted as
            aliases of this argument.
        scale_rewards: ``"group"``, ``"batch"``, ``"none"`` (or TRL's ``True``/``False``).
        gates: conditioning gates applied before the ordering.
        none_handling: ``"neutral"`` or ``"zero"`` (how a ``None`` enters the advantage).
        on_unscorable: rows with no applicable channel: ``"raise"``, or advantage 0 with
            ``"zero_advantage"`` or ``"warn"`` (the reward suite has warned about them).
        ddof: 1 (unbiased std, TRL) or 0 (population std, the analysis).
        eps: ``δ`` added to every std before dividing.

    >>> r = np.array([[1.0], [0.0], [1.0], [1.0]])
    >>> compute_advantages(r, 4).advantages.round(4)
    array([ 0.4999, -1.4997,  0.4999,  0.4999])
    """
    name = resolve_aggregation(
        aggregation,
        multi_objective_aggregation=multi_objective_aggregation,
        reward_aggregation_method=reward_aggregation_method,
    )
    x = _as_array(rewards)
    spec = _spec(x, group_size, reward_weights, scale_rewards, none_handling, ddof, eps)
    # Taken before the gates, which is safe: a gate writes values, never NaN.
    unscorable = np.isnan(x).all(axis=1)  # [N]
    _check_unscorable(unscorable, on_unscorable, group_size)

    gated = _gated(x, gates, group_size).reshape(-1, group_size, x.shape[1])  # [B, G, R]
    scorable = ~unscorable.reshape(-1, group_size)  # [B, G]
    advantages, contrast = AGGREGATIONS.get(name)(gated, scorable, spec)
    # The logged reward is ungated, like TRL's logged "reward" (the weighted nansum).
    scalar = scalar_rewards(x, spec.weights).astype(x.dtype)
    result = AdvantageResult(advantages=advantages.reshape(-1), zero_gradient=~contrast,
                             unscorable=unscorable, scalar_rewards=scalar)
    convert = _like(_torch_tensor(rewards))
    return AdvantageResult(**{f.name: convert(getattr(result, f.name)) for f in fields(result)})


def channel_zscores(
    rewards: Any,
    group_size: int,
    *,
    scale_rewards: str | bool = "group",
    none_handling: str = "neutral",
    ddof: int = 1,
    eps: float = 1e-4,
) -> Any:
    """The per-channel group-normalised rewards ``z [N, R]`` of ``normalize_then_sum`` (numpy,
    or a tensor like ``rewards`` when it is one).

    Entries that do not count (not applicable under ``"neutral"``, unscorable rows) are 0.
    ``compute_advantages(..., aggregation="normalize_then_sum").advantages`` equals
    ``(channel_zscores(...) * w).sum(-1)``.
    """
    x = _as_array(rewards)
    spec = _spec(x, group_size, None, scale_rewards, none_handling, ddof, eps)
    grouped = x.reshape(-1, group_size, x.shape[1])
    scorable = ~np.isnan(grouped).all(axis=-1)
    z, _ = _zscores(grouped, scorable, spec)
    return _like(_torch_tensor(rewards))(z.reshape(x.shape))
