"""One definition of each decision and metric that sampling, the trainer, evaluation and reports
share.

Pure functions of numpy arrays and plain values (``K`` tasks, ``N`` completions, ``T`` steps).

Zero gradient
    A group has *zero gradient* when the advantage estimator finds no contrast among its
    completions in the values it normalises: the weighted channel sum under
    ``sum_then_normalize`` (and ``single``), every channel under the per-channel orderings
    (``normalize_then_sum``, ``gdpo``). Its advantages are then 0 whatever the rest of the batch.
    :func:`mtgrpo.algo.advantages.compute_advantages` decides it
    (``AdvantageResult.zero_gradient``), with :func:`lacks_contrast` below as the
    tolerance; the sampler's filters
    (``ScoredGroup.zero_gradient``), the per-task ``zero_gradient_rate`` and TRL's
    ``frac_reward_zero_std`` all read that one verdict. Raw channels are *not* tested
    separately: two channels that vary but sum to a constant give a group no gradient under
    ``sum_then_normalize``, and the sampler drops it.

Task accuracy ``J_k``
    The fraction of task ``k``'s completions counted correct (:mod:`mtgrpo.rewards.accuracy`
    decides "correct"); NaN for a task without completions (:func:`task_accuracy`). It is the
    ``J_k`` of the task-weighting strategies (``TaskStats.accuracy``), the per-task accuracy of
    the trainer's metrics and of evaluation.

Worst-task and average accuracy
    ``min_k Acc(k)`` and ``(1/K) Σ_k Acc(k)`` (MT-GRPO paper, §6), defined only when *every*
    task has a finite accuracy: a minimum over the tasks that happened to be measured would
    overstate the worst. Otherwise both are NaN and there is no worst task
    (:func:`worst_and_average`). The trainer's train and eval records, ``mtgrpo eval`` and the
    reports use this one rule.

``Δm%``
    ``(1/K') Σ_k (Acc(k) − Acc_b(k)) / Acc_b(k) · 100`` against a baseline ``b``
    (:func:`delta_m`): over the baseline's tasks with a finite accuracy in the run and
    ``Acc_b(k) > 0`` (a task whose baseline accuracy is 0 has no relative change: skipped and
    named); None when no task is left.

Steps to a threshold
    The first step whose worst-task accuracy is at least the threshold, None if never
    (:func:`steps_to_threshold`).

Generation log-prob mismatch
    How far the generation engine's distribution is from the trainer's, on the tokens it
    sampled (:func:`logprob_mismatch`): with ``δ_t = log π_train(y_t) − log π_gen(y_t)`` over
    the ``M`` trained completion tokens, ``mean |δ|``, ``max |δ|`` and the ``k3`` estimate of
    ``KL(π_gen ‖ π_train)``, ``(1/M) Σ_t (e^{δ_t} − 1 − δ_t)`` (Schulman, "Approximating KL
    divergence", 2020: unbiased for samples drawn from ``π_gen``, never negative). 0 when the
    engine samples from the trainer's weights in the trainer's precision; the basis of an
    importance-sampling correction for an engine that does not (a bfloat16 replica, an
    external server a step behind).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "CONTRAST_ATOL",
    "CONTRAST_RTOL",
    "DeltaM",
    "delta_m",
    "lacks_contrast",
    "logprob_mismatch",
    "scalar_rewards",
    "steps_to_threshold",
    "task_accuracy",
    "worst_and_average",
]

# Float noise in a reward (say, a reward model's logits) gives no usable gradient and must not
# make a group count as informative: a spread within 1e-7 + 1e-6 · scale is no contrast.
CONTRAST_ATOL = 1e-7
CONTRAST_RTOL = 1e-6


def lacks_contrast(spread: Any, scale: Any) -> Any:
    """True where ``spread`` (the largest centred value of a group) is float noise relative to
    ``scale`` (the largest value): ``spread <= 1e-7 + 1e-6 · scale``. Elementwise on numpy
    arrays or torch tensors alike (the estimator calls it on tensors)."""
    return spread <= CONTRAST_ATOL + CONTRAST_RTOL * scale


def scalar_rewards(rewards: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``[N]``: ``Σ_l w_l r_jl`` over the channels that apply to each row of ``rewards [N, R]``
    (NaN: not applicable) with ``weights [R]``; NaN where no channel applies. The per-completion
    reward the logs and evaluation report (``reward``, ``tasks/<task>/reward``)."""
    values = np.asarray(rewards, dtype=np.float64)  # [N, R]
    applicable = ~np.isnan(values)
    total = (np.where(applicable, values, 0.0) * np.asarray(weights, dtype=np.float64)).sum(axis=1)
    # NaN, not 0, for an unscorable row: it stays out of the logged means, as TRL 1.16 logs it.
    return np.where(applicable.any(axis=1), total, np.nan)


def task_accuracy(row_tasks: np.ndarray, correct: np.ndarray, num_tasks: int) -> np.ndarray:
    """``J [K]``: the mean of ``correct [N]`` (bool) over each task's rows (``row_tasks [N]``,
    task indices); NaN for a task without rows."""
    row_tasks = np.asarray(row_tasks, dtype=np.int64)  # [N]
    count = np.bincount(row_tasks, minlength=num_tasks)  # [K]
    hits = np.bincount(row_tasks, weights=np.asarray(correct, dtype=np.float64),
                       minlength=num_tasks)  # [K]
    # J_k of a task without rollouts is unknown (NaN), not 0: 0 would read as a failing task.
    return np.where(count > 0, hits / np.maximum(count, 1), np.nan)


def worst_and_average(accuracy: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Worst-task and average accuracy over the last axis of ``accuracy [..., K]``, and the
    index of the worst task (the first on a tie).

    Defined only where every task has a finite accuracy (and ``K > 0``): elsewhere the worst and
    the average are NaN and the index is -1. Returns arrays of shape ``[...]``.
    """
    values = np.asarray(accuracy, dtype=np.float64)
    complete = np.isfinite(values).all(axis=-1) & (values.shape[-1] > 0)  # [...]
    # Incomplete rows are masked out below; filling them keeps min / argmin free of NaN.
    filled = np.where(complete[..., None], values, 0.0)
    worst = np.where(complete, filled.min(axis=-1, initial=np.inf), np.nan)  # initial: K = 0
    average = np.where(complete, filled.sum(axis=-1) / max(values.shape[-1], 1), np.nan)
    # argmin over an empty task axis raises: K = 0 gives -1 directly.
    index = np.where(complete, filled.argmin(axis=-1) if values.shape[-1] else -1, -1)
    return worst, average, index.astype(np.int64)


@dataclass(frozen=True)
class DeltaM:
    """Δm% of a run against a baseline, and which tasks entered the mean."""

    value: float | None  # percent; None when no task is usable
    tasks: tuple[str, ...]  # tasks in the mean
    skipped_zero_baseline: tuple[str, ...]  # baseline accuracy 0: relative change undefined
    missing: tuple[str, ...]  # in the baseline but without a finite accuracy in the run


def delta_m(accuracy: Mapping[str, float], baseline: Mapping[str, float]) -> DeltaM:
    """``Δm% = (1/K') Σ_k (Acc(k) − Acc_b(k)) / Acc_b(k) · 100`` (MT-GRPO paper, §6).

    Departure: the mean runs over the ``K'`` tasks of the baseline with ``Acc_b(k) > 0`` and a
    finite accuracy in the run; tasks with ``Acc_b(k) = 0`` have no relative change and are
    skipped (and returned), rather than making the mean infinite.
    """
    used, skipped, missing, changes = [], [], [], []
    for task, base in baseline.items():
        value = accuracy.get(task)
        if value is None or not math.isfinite(value):
            missing.append(task)
        elif base == 0:
            skipped.append(task)  # the paper's ratio is undefined; skipping keeps the mean finite
        else:
            used.append(task)
            changes.append((value - base) / base)
    mean = float(np.mean(changes)) * 100.0 if changes else None
    return DeltaM(mean, tuple(used), tuple(skipped), tuple(missing))


def steps_to_threshold(steps: np.ndarray, worst: np.ndarray, threshold: float) -> int | None:
    """The first of ``steps [T]`` whose worst-task accuracy ``worst [T]`` (NaN: undefined) is
    ``>= threshold``; None if never."""
    with np.errstate(invalid="ignore"):  # NaN (a step with an unmeasured task) never reaches it
        reached = np.flatnonzero(np.asarray(worst) >= threshold)
    return int(np.asarray(steps)[reached[0]]) if len(reached) else None


def logprob_mismatch(generation_logps: np.ndarray, trainer_logps: np.ndarray) -> dict[str, float]:
    """``generation/logprob_mismatch_mean``, ``generation/logprob_mismatch_max`` and
    ``generation/kl_k3`` (see the module docstring) of ``[M]`` aligned token log-probs: the
    generation engine's and the trainer's (old policy, before the update) for the same sampled
    tokens. Empty inputs give ``{}`` (nothing to compare)."""
    generation = np.asarray(generation_logps, dtype=np.float64)
    trainer = np.asarray(trainer_logps, dtype=np.float64)
    if generation.shape != trainer.shape or generation.ndim != 1:
        raise ValueError(
            f"logprob_mismatch needs two [M] arrays of the same tokens, got shapes "
            f"{generation.shape} and {trainer.shape}"
        )
    if generation.size == 0:
        return {}
    delta = trainer - generation  # [M] log(π_train / π_gen) at tokens drawn from π_gen
    return {
        "generation/logprob_mismatch_mean": float(np.abs(delta).mean()),
        "generation/logprob_mismatch_max": float(np.abs(delta).max()),
        # k3 (Schulman 2020) with expm1: accurate for the tiny δ of an engine close to the trainer.
        "generation/kl_k3": float(np.mean(np.expm1(delta) - delta)),
    }
