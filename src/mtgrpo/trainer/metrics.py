"""The per-step metrics record (keys documented in ``docs/architecture.md``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mtgrpo.sampling import SamplingReport, ScoredGroup

__all__ = ["accuracy_summary", "channel_metrics", "length_metrics", "task_metrics"]


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan


def accuracy_summary(task_names: Sequence[str], accuracy: np.ndarray) -> dict[str, Any]:
    """Worst-task and average accuracy over the tasks measured (``accuracy [K]``, NaN absent)."""
    measured = ~np.isnan(accuracy)
    if not measured.any():
        return {"accuracy/worst": math.nan, "accuracy/average": math.nan}
    worst = int(np.nanargmin(accuracy))
    return {
        "accuracy/worst": float(accuracy[worst]),
        "accuracy/average": float(np.nanmean(accuracy)),
        "accuracy/worst_task": task_names[worst],
    }


def task_metrics(
    task_names: Sequence[str],
    generated: Sequence[ScoredGroup],
    scalar_rewards: np.ndarray,
    zero_gradient: np.ndarray,
    weights: np.ndarray,
    report: SamplingReport,
    improvement: np.ndarray | None,
) -> dict[str, Any]:
    """Per-task metrics of one step.

    ``generated``: every group generated this step (before filtering); ``scalar_rewards
    [N]`` and ``zero_gradient [num groups]`` are aligned with them; ``weights [K]`` the
    target weights used for the step.
    """
    k = len(task_names)
    group_tasks = np.array([g.task for g in generated], dtype=np.int64)
    row_tasks = np.concatenate([np.full(g.group_size, g.task) for g in generated]) if generated \
        else np.zeros(0, dtype=np.int64)
    correct = np.concatenate([g.correct for g in generated]) if generated else np.zeros(0)
    batch = report.batch_counts.astype(np.float64)
    out: dict[str, Any] = {}
    accuracy = np.full(k, math.nan)
    for t, name in enumerate(task_names):
        rows, groups = row_tasks == t, group_tasks == t
        accuracy[t] = _mean(correct[rows].astype(np.float64))
        prefix = f"tasks/{name}"
        out[f"{prefix}/accuracy"] = accuracy[t]
        out[f"{prefix}/reward"] = float(np.nanmean(scalar_rewards[rows])) if rows.any() \
            else math.nan
        out[f"{prefix}/zero_gradient_rate"] = _mean(zero_gradient[groups].astype(np.float64))
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
        "reward": float(np.nanmean(scalar_rewards)) if np.isfinite(scalar_rewards).any()
        else math.nan,
        "reward_std": float(np.nanstd(scalar_rewards, ddof=1))
        if np.isfinite(scalar_rewards).sum() > 1 else math.nan,
    }
    for r, name in enumerate(channel_names):
        column = values[:, r]
        present = column[~np.isnan(column)]
        out[f"rewards/{name}/mean"] = _mean(present)
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
        "completions/clipped_ratio": float(1.0 - finished.mean()),
    }
