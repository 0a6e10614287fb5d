"""What drove MT-GRPO's task weights in finished runs: the improvement ``I_k`` or ``λ J_k``.

    python benchmarks/improvement_share.py RUN [RUN ...] [--out FILE]

MT-GRPO's weight update moves the logits along ``g_k = z_k (s_k − Σ_j z_j s_j)`` with
``s_k = I_k + λ J_k``. When ``I_k`` (the change of task k's GRPO objective across the policy
update) is small beside ``λ J_k``, the weights follow the rewards alone and MT-GRPO acts as a
reward-only update (``regularized`` without damping). Runs now log ``I``'s share of ``g``
each step (``weighting/improvement_share``: L1 sizes of the two parts of ``g``, before the
optimizer); this script recovers it for any ``mt_grpo`` run, older ones included, by
replaying the run's weighting from its own log: a fresh strategy with the run's parameters
(``RUN/config.yaml``) is fed each step's logged task accuracy ``J``, improvement ``I`` and
presence, in order (the last record of a step; every step must be logged, as with
``logging_steps: 1``), and asked for :func:`mtgrpo.algo.weighting.improvement_share` after each
update (a step whose update was skipped has no ``I`` and no share). The replayed weights must
reproduce the logged ones (the weights each step used): the largest difference is reported
and a mismatch beyond float rounding is an error, so a share is only ever reported for the
weights the run really had.

Per run: the mean, median and largest share over the steps that have one, the mean sizes
``Σ z |centred I|`` and ``Σ z |centred λJ|``, and per task the weight at a quarter, half and
the end of the run, its mean over the steps, and which way each term pushed it: the mean over
the updates of ``−g``'s part from ``I`` and from ``λJ``
(:func:`mtgrpo.algo.weighting.gradient_parts`; with ``optimizer: sgd``, the default, the update
steps against ``g``, so a positive push raises the task's logit, and its weight when it rises
more than the ``z``-weighted mean of the logits' moves). Prints Markdown tables; ``--out``
appends them to a file.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from mtgrpo.algo.weighting import TaskStats, gradient_parts, make_weighting
from mtgrpo.reporting.metrics import read_metrics

# logged weights are float64 values written by json (repr round-trips): the replay is the same
# arithmetic, so only a handful of float64 roundings may separate them
_WEIGHT_TOLERANCE = 64 * np.finfo(np.float64).eps


@dataclass(frozen=True)
class Replay:
    """One run's replayed weighting."""

    run: Path
    params: dict[str, Any]  # the strategy's, defaults filled in
    tasks: list[str]
    steps: np.ndarray  # [T] training step of each update
    weights: np.ndarray  # [T, K] the weights each step used (logged)
    shares: np.ndarray  # [T] improvement share of each update (NaN: nothing moved)
    improvement_push: np.ndarray  # [T, K] −(g's part from I) (NaN: no task observed)
    reward_push: np.ndarray  # [T, K] −(g's part from λJ) (NaN: no task observed)
    max_weight_error: float  # largest |replayed − logged| weight

    @property
    def improvement_size(self) -> np.ndarray:
        """``[T]`` Σ z |centred I|, the L1 size of g's part from I (NaN: no task observed)."""
        return np.abs(self.improvement_push).sum(axis=1)

    @property
    def reward_size(self) -> np.ndarray:
        """``[T]`` Σ z |centred λJ|, the L1 size of g's part from λJ (NaN: no task observed)."""
        return np.abs(self.reward_push).sum(axis=1)


def _run_config(run: Path) -> dict[str, Any]:
    saved = run / "config.yaml"
    if not saved.is_file():
        raise FileNotFoundError(f"{run}: no config.yaml; pass a run directory of mtgrpo train "
                                "(it saves the resolved config there)")
    config = yaml.safe_load(saved.read_text()) or {}
    if config.get("task_weighting") not in ("mt_grpo", "mtgrpo", "iwu"):
        raise ValueError(f"{run}: task_weighting is {config.get('task_weighting')!r}, not "
                         "mt_grpo; only MT-GRPO's weights have an improvement term")
    return config


def _train_records(run: Path) -> list[dict[str, Any]]:
    """The step records (those with the task weights; not a ``log()`` call's) by step, the
    last of a step kept; every step from 1 must be there, as the replay needs each update."""
    by_step: dict[int, dict[str, Any]] = {}
    for record in read_metrics(run, split="train"):
        if any(key.startswith("tasks/") and key.endswith("/weight") for key in record):
            by_step[int(record["step"])] = record  # a step logged again replaces it
    if not by_step:
        raise ValueError(f"{run}: no training step in metrics.jsonl yet")
    steps = sorted(by_step)
    missing = sorted(set(range(1, steps[-1] + 1)) - set(steps))
    if missing:
        raise ValueError(f"{run}: steps {missing[:5]}{' ...' if len(missing) > 5 else ''} are "
                         f"not in metrics.jsonl ({len(steps)} of {steps[-1]} logged); the replay "
                         "needs every update: train with logging_steps 1")
    return [by_step[step] for step in steps]


def _tasks(record: dict[str, Any]) -> list[str]:
    """Task names in the trainer's order (the order their keys were logged in)."""
    return [key[len("tasks/"):-len("/weight")] for key in record
            if key.startswith("tasks/") and key.endswith("/weight")]


def replay(run: Path) -> Replay:
    """Replay ``run``'s MT-GRPO weighting from its log (module docstring)."""
    config = _run_config(run)
    records = _train_records(run)
    tasks = _tasks(records[0])
    strategy = make_weighting("mt_grpo", len(tasks), task_names=tasks,
                              **dict(config.get("task_weighting_params") or {}))
    group = int(config.get("num_generations") or 1)
    steps, weights, shares, parts = [], [], [], []
    error = 0.0
    for record in records:
        logged = np.array([record[f"tasks/{t}/weight"] for t in tasks], dtype=np.float64)  # [K]
        error = max(error, float(np.abs(strategy.weights - logged).max()))
        if error > _WEIGHT_TOLERANCE:
            raise ValueError(
                f"{run}: the replay's weights {strategy.weights.tolist()} differ from the "
                f"logged {logged.tolist()} at step {record['step']} (by {error:.3g}); the log "
                "or config.yaml is not this run's (or the run resumed from a state the log "
                "does not hold), so no share is reported")
        groups = np.array([record.get(f"tasks/{t}/groups_generated", 0) for t in tasks])
        stats = TaskStats(
            accuracy=[record.get(f"tasks/{t}/accuracy", math.nan) for t in tasks],
            count=groups * group,
            improvement=[record.get(f"tasks/{t}/improvement", math.nan) for t in tasks],
        )
        strategy.update(stats)
        terms = strategy.last_terms
        steps.append(int(record["step"]))
        weights.append(logged)
        shares.append(strategy.diagnostics().get("weighting/improvement_share", math.nan))
        parts.append(gradient_parts(*terms) if terms is not None
                     else np.full((2, len(tasks)), math.nan))
    part = np.array(parts, dtype=np.float64)  # [T, 2, K]: the parts from I and from λJ
    return Replay(run, dict(strategy.params), tasks, np.array(steps), np.array(weights),
                  np.array(shares), -part[:, 0], -part[:, 1], error)


def _mean(values: np.ndarray) -> float:
    """Mean over the updates that observed a task (the finite rows); NaN when none did."""
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else math.nan


def markdown(replays: Sequence[Replay], command: str) -> str:
    """The per-run table and a weights table per run."""
    lines = ["### What moved MT-GRPO's weights: the improvement share", "",
             f"Command: `{command}`", "",
             "| run | λ | steps | share of I: mean / median / max | mean Σz\\|centred I\\| | "
             "mean Σz\\|centred λJ\\| | replay vs log (max \\|Δz\\|) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in replays:
        shares = r.shares[np.isfinite(r.shares)]
        shown = (f"{shares.mean():.3f} / {np.median(shares):.3f} / {shares.max():.3f}"
                 if shares.size else "-")
        lines.append(f"| {r.run.name} | {r.params['lam']} | {len(r.steps)} | {shown} "
                     f"| {_mean(r.improvement_size):.4f} | {_mean(r.reward_size):.4f} "
                     f"| {r.max_weight_error:.1e} |")
    lines += ["", "Weights `z` (the ones each step used) at a quarter, half and the last step, "
              "their mean over the steps, and the mean push on the task's logit from each term "
              "(`−g`'s part; with SGD, positive raises the task's logit):", "",
              "| run | task | z at ¼ / ½ / end | mean z | push from I | push from λJ |",
              "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in replays:
        n = len(r.steps)
        at = [max(n // 4 - 1, 0), max(n // 2 - 1, 0), n - 1]
        for k, task in enumerate(r.tasks):
            marks = " / ".join(f"{r.weights[i, k]:.2f}" for i in at)
            lines.append(f"| {r.run.name} | {task} | {marks} | {r.weights[:, k].mean():.2f} "
                         f"| {_mean(r.improvement_push[:, k]):+.1e} "
                         f"| {_mean(r.reward_push[:, k]):+.1e} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> str:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="mt_grpo run directories")
    parser.add_argument("--out", type=Path, default=None, help="append the table to this file")
    options = parser.parse_args(argv)
    replays = [replay(run) for run in options.runs]  # every run checked before any output
    text = markdown(replays, shlex.join(["python", "benchmarks/improvement_share.py", *argv]))
    print(text)
    if options.out is not None:
        with open(options.out, "a") as handle:
            handle.write(text + "\n")
    return text


if __name__ == "__main__":
    main()
