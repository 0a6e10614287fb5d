"""The per-step metrics record (keys documented in ``docs/architecture.md``); the definitions of
accuracy, worst / average and zero gradient are :mod:`mtgrpo.algo.metrics`'."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mtgrpo.algo.metrics import task_accuracy, worst_and_average
from mtgrpo.algo.sampling import SamplingReport, ScoredGroup

__all__ = [
    "NOTHING_LEARNED_STEPS",
    "accuracy_summary",
    "channel_metrics",
    "length_metrics",
    "nothing_learned_message",
    "step_line",
    "task_metrics",
    "trained_nothing",
]


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan


def _nanmean(values: np.ndarray) -> float:
    """Mean of the finite entries (NaN, without numpy's warning, when there are none)."""
    kept = values[~np.isnan(values)]
    return float(kept.mean()) if kept.size else math.nan


def accuracy_summary(task_names: Sequence[str], accuracy: np.ndarray) -> dict[str, Any]:
    """``accuracy/worst``, ``accuracy/average`` and ``accuracy/worst_task`` of ``accuracy [K]``
    (NaN: a task without completions): :func:`mtgrpo.algo.metrics.worst_and_average`, NaN (and no
    worst task) unless every task has an accuracy."""
    worst, average, index = worst_and_average(accuracy)
    out: dict[str, Any] = {"accuracy/worst": float(worst), "accuracy/average": float(average)}
    if index >= 0:
        out["accuracy/worst_task"] = task_names[int(index)]
    return out


def task_metrics(
    task_names: Sequence[str],
    generated: Sequence[ScoredGroup],
    scalar_rewards: np.ndarray,
    weights: np.ndarray,
    report: SamplingReport,
    improvement: np.ndarray | None,
) -> dict[str, Any]:
    """Per-task metrics of one step.

    ``generated``: every group generated this step (before filtering), each with the
    estimator's zero-gradient verdict; ``scalar_rewards [N]`` is aligned with their rows;
    ``weights [K]`` the target weights used for the step.
    """
    group_tasks = np.array([g.task for g in generated], dtype=np.int64)
    zero_gradient = np.array([g.zero_gradient for g in generated], dtype=np.float64)
    row_tasks = np.concatenate([np.full(g.group_size, g.task) for g in generated]) if generated \
        else np.zeros(0, dtype=np.int64)
    correct = np.concatenate([g.correct for g in generated]) if generated else np.zeros(0)
    # ALGORITHMS.md §4: J_k is the accuracy of every generated rollout, before filtering
    accuracy = task_accuracy(row_tasks, correct, len(task_names))  # [K] J_k
    # ALGORITHMS.md §5's per-step report: target z, realised composition after filtering,
    # filter rate per task
    batch = report.batch_counts.astype(np.float64)
    out: dict[str, Any] = {}
    for t, name in enumerate(task_names):
        rows, groups = row_tasks == t, group_tasks == t
        prefix = f"tasks/{name}"
        out[f"{prefix}/accuracy"] = float(accuracy[t])
        out[f"{prefix}/reward"] = _nanmean(scalar_rewards[rows])
        out[f"{prefix}/zero_gradient_rate"] = _mean(zero_gradient[groups])
        out[f"{prefix}/weight"] = float(weights[t])
        out[f"{prefix}/batch_share"] = float(batch[t] / batch.sum()) if batch.sum() else math.nan
        out[f"{prefix}/target_share"] = float(report.target_counts[t] / max(
            report.target_counts.sum(), 1))
        out[f"{prefix}/filter_rate"] = float(report.filter_rate[t])
        out[f"{prefix}/groups_generated"] = int(report.generated_groups[t])
        if improvement is not None:
            out[f"{prefix}/improvement"] = float(improvement[t])
    out.update(accuracy_summary(task_names, accuracy))
    return out


def channel_metrics(channel_names: Sequence[str], values: np.ndarray,
                    scalar_rewards: np.ndarray,
                    errors: np.ndarray | None = None) -> dict[str, float]:
    """Per reward channel mean and std over the rows it applied to (``values [N, R]``), and
    ``rewards/<channel>/errors``: completions a built-in verifier failed on (``errors [N, R]``
    bool, :mod:`mtgrpo.rewards.guard`)."""
    out = {
        "reward": _nanmean(scalar_rewards),
        # TRL's reward_std: over the whole batch (not per group), with Bessel's correction
        "reward_std": float(np.nanstd(scalar_rewards, ddof=1))
        if np.isfinite(scalar_rewards).sum() > 1 else math.nan,
    }
    for r, name in enumerate(channel_names):
        column = values[:, r]
        present = column[~np.isnan(column)]
        out[f"rewards/{name}/mean"] = _mean(present)
        # ddof 1 and NaN below two values: TRL's nanstd
        out[f"rewards/{name}/std"] = float(present.std(ddof=1)) if present.size > 1 else math.nan
        out[f"rewards/{name}/errors"] = int(errors[:, r].sum()) if errors is not None else 0
    return out


def length_metrics(lengths: np.ndarray, finished: np.ndarray) -> dict[str, float]:
    """Completion lengths in tokens and the fraction cut at ``max_completion_length``."""
    if not lengths.size:
        return {}
    return {
        "completions/mean_length": float(lengths.mean()),
        "completions/min_length": float(lengths.min()),
        "completions/max_length": float(lengths.max()),
        # TRL's clipped_ratio: completions that did not end at a stop token
        "completions/clipped_ratio": float(1.0 - finished.mean()),
    }


# Steps in a row in which nothing was trained before the run warns: enough that a hard task's
# unlucky first batches do not trip it (at 20% accuracy a group of 8 is all wrong 17% of the
# time), few enough that a user hears it in the first minutes rather than at the end.
NOTHING_LEARNED_STEPS = 10


def trained_nothing(metrics: Mapping[str, Any]) -> bool:
    """A step trained nothing: every generated group had zero gradient (rewards equal within
    each group, so every advantage is 0), or the update's gradient norm was exactly 0."""
    return metrics.get("frac_reward_zero_std") == 1.0 or metrics.get("grad_norm") == 0.0


def nothing_learned_message(steps: str, metrics: Mapping[str, Any], temperature: float,
                            num_generations: int) -> str:
    """The warning for ``steps`` ("the last 10 steps", "all 3 steps of the run") that trained
    nothing: the metrics that show it (those of the last such step) and the likely causes."""
    shown = ["frac_reward_zero_std", "reward", "reward_std", "grad_norm"]
    shown += sorted(k for k in metrics if k.endswith(("/zero_gradient_rate", "/accuracy"))
                    and k.startswith("tasks/"))
    values = ", ".join(f"{k}={metrics[k]:.3g}" for k in shown
                       if isinstance(metrics.get(k), int | float))
    return (
        f"nothing was trained in {steps}: within every group of completions the rewards were "
        f"equal, so every advantage was 0 ({values}). Likely causes: a reward function that "
        "returns the same value for every completion (see rewards/<function>/std in "
        f"metrics.jsonl); a temperature ({temperature}) too low for the completions to "
        "differ; tasks too hard or too easy for the model (tasks/<task>/accuracy always 0 or "
        f"1); num_generations ({num_generations}) too small to see a difference")


def step_line(step: int, max_steps: int, record: Mapping[str, Any]) -> str:
    """One logged step on a line (what TRL prints as the record's dict, shortened): loss,
    mean reward, the training batch's worst and average task accuracy, gradient norm."""
    def number(key: str, percent: bool = False) -> str:
        value = record.get(key)
        if not isinstance(value, int | float) or math.isnan(value):
            return "-"
        return f"{100 * value:.1f}%" if percent else f"{value:.4g}"

    worst_task = record.get("accuracy/worst_task")
    return (f"step {step}/{max_steps}  loss {number('loss')}  reward {number('reward')}  "
            f"train batch: worst {number('accuracy/worst', True)}"
            + (f" ({worst_task})" if worst_task else "")
            + f" avg {number('accuracy/average', True)}  grad_norm {number('grad_norm')}")
