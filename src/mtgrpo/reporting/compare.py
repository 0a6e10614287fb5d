"""Reading finished runs and comparing them: worst-task and average accuracy, Δm%, seeds.

A run is its ``metrics.jsonl`` (see "Metrics" in ``docs/architecture.md``) and, when present,
its resolved ``config.yaml``. :func:`load_run` turns either into a :class:`RunHistory` (series
per key and split); :func:`summarize_run` and :func:`compare_runs` reduce histories to the
numbers of the MT-GRPO paper's tables (``ALGORITHMS.md`` §6):

- worst-task accuracy ``min_k Acc(k)`` and average accuracy ``(1/K) Σ_k Acc(k)`` per step;
- final and best of both, and which task was the worst;
- steps to reach a worst-task threshold (30 / 40 / 50 %);
- the relative change against a baseline run
  ``Δm% = (1/K) Σ_k (Acc(k) − Acc_b(k)) / Acc_b(k) · 100`` on the final accuracies.

Rules where the paper is silent (each is also said where it applies):

1. Worst and average at a step are defined only when *every* task has a finite accuracy at
   that step: a minimum over the tasks that happened to be measured would overstate the worst.
   (:mod:`mtgrpo.algo.metrics` defines worst, average, Δm% and steps-to-threshold once; the trainer
   and evaluation log with the same rules.)
2. "Final" is the last such complete step of the split; "best" is the maximum over them
   (the earliest step on a tie).
3. A threshold is reached at the first complete step with ``worst >= threshold``.
4. Δm% leaves out tasks whose baseline accuracy is 0 (the relative change is undefined) and
   reports them in ``delta_m_skipped``; it is None when no task is left.
5. When runs disagree on their tasks, every number is taken over the tasks common to all of
   them; the others are listed in :attr:`ComparisonTable.dropped_tasks`.
6. ``time/step`` and ``sampling/prompts_per_informative_group`` are means over the train
   records that carry a finite value.

:func:`aggregate_seeds` groups runs of one method (directory names such as ``mtgrpo-seed1``,
``mtgrpo-seed2``, or explicit labels) and gives mean, standard deviation and min–max per number.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

import numpy as np

from mtgrpo.algo.metrics import DeltaM, delta_m, worst_and_average
from mtgrpo.algo.metrics import steps_to_threshold as first_step_reaching
from mtgrpo.reporting.metrics import read_metrics
from mtgrpo.reporting.tables import FittedTable

if TYPE_CHECKING:
    from rich.console import Group

__all__ = [
    "DEFAULT_THRESHOLDS",
    "SPLITS",
    "AccuracyCurve",
    "ComparisonTable",
    "DeltaM",
    "MethodAggregate",
    "RunHistory",
    "RunSummary",
    "SeedAggregateTable",
    "Series",
    "Spread",
    "TaskSummary",
    "accuracy_curve",
    "aggregate_seeds",
    "compare_runs",
    "delta_m",
    "load_run",
    "markdown_table",
    "method_of_label",
    "parse_thresholds",
    "run_report",
    "steps_to_threshold",
    "summarize_run",
    "summarize_tasks",
]

logger = logging.getLogger(__name__)

SPLITS = ("train", "eval")
RUN_SPLIT = "run"  # the trainer's record of how a run computes (not a metrics split)
DEFAULT_THRESHOLDS = (0.3, 0.4, 0.5)  # ALGORITHMS.md §6: the paper's steps to 30/40/50 %
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"
TASK_PREFIX = "tasks/"
# A seed suffix: "-seed1", "_seed_2", ".seed3", "-seed=4" or "-s5" (case-insensitive). Bare
# trailing numbers are *not* seeds: "lambda-0.25" or "tasks-9" name a setting.
SEED_SUFFIX = re.compile(r"(?:[-_.]seed[-_=]?|[-_]s)\d+$", re.IGNORECASE)


# ----------------------------------------------------------------------------- run history


@dataclass(frozen=True)
class Series:
    """One metric of one split over steps (the last record wins when a step repeats)."""

    steps: np.ndarray  # [T] int64, strictly increasing
    values: np.ndarray  # [T] float64, NaN where the record held null

    def __len__(self) -> int:
        return len(self.steps)

    def finite(self) -> Series:
        """The points with a finite value."""
        keep = np.isfinite(self.values)
        return Series(self.steps[keep], self.values[keep])

    def last(self) -> float | None:
        """The last finite value, or None."""
        finite = self.values[np.isfinite(self.values)]
        return float(finite[-1]) if len(finite) else None

    def mean(self) -> float | None:
        """The mean of the finite values, or None."""
        finite = self.values[np.isfinite(self.values)]
        return float(finite.mean()) if len(finite) else None


def _number(value: Any) -> float | None:
    """A record value as a float: null -> NaN; text and other non-numbers -> None (ignored)."""
    if value is None:
        return math.nan  # metrics.jsonl writes NaN and ±inf as null
    if isinstance(value, bool | int | float):
        return float(value)
    return None


class RunHistory:
    """The records of one run, indexed by split, key and step.

    Tasks are listed in the order they first appear in the log (the suite's order, which
    reads better than alphabetical: ``countdown:easy`` before ``countdown:hard``).
    """

    def __init__(
        self,
        records: Iterable[Mapping[str, Any]],
        *,
        name: str = "run",
        run_dir: Path | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.run_dir = run_dir
        self.config = dict(config) if config else None
        self.ignored_records = 0  # records without an int "step" or a known "split"
        self.run_info: dict[str, Any] = {}  # the last "run" record: backend, versions
        self.last_step: int | None = None
        self._index: dict[str, dict[str, dict[int, float]]] = {split: {} for split in SPLITS}
        tasks: dict[str, None] = {}  # an ordered set
        for record in records:
            self._add(record, tasks)
        self.tasks: tuple[str, ...] = tuple(tasks)

    def _add(self, record: Mapping[str, Any], tasks: dict[str, None]) -> None:
        if not isinstance(record, Mapping):
            raise TypeError(f"a metrics record must be a dict (one line of metrics.jsonl), got "
                            f"{type(record).__name__} {record!r:.80}; pass a run directory or "
                            "the parsed records")
        step, split = record.get("step"), record.get("split")
        if split == RUN_SPLIT:
            self.run_info = {k: v for k, v in record.items() if k not in ("step", "split")}
            return
        if isinstance(step, bool) or not isinstance(step, int) or split not in SPLITS:
            self.ignored_records += 1
            return
        self.last_step = step if self.last_step is None else max(self.last_step, step)
        index = self._index[split]
        for key, raw in record.items():
            value = _number(raw)
            if key in ("step", "split") or value is None:
                continue
            index.setdefault(key, {})[step] = value
            if key.startswith(TASK_PREFIX) and key.count("/") >= 2:
                tasks[key[len(TASK_PREFIX):key.rindex("/")]] = None

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits with at least one record."""
        return tuple(split for split in SPLITS if self._index[split])

    @property
    def method(self) -> str | None:
        """``"<task_weighting> + <batch_construction>"`` from ``config.yaml``, when known."""
        if not self.config:
            return None
        training = self.config.get("training", self.config)
        if not isinstance(training, Mapping):
            return None
        parts = [training.get(k) for k in ("task_weighting", "batch_construction")]
        named = [str(part) for part in parts if part]
        return " + ".join(named) if named else None

    def has(self, key: str, split: str) -> bool:
        """Whether any record of ``split`` carries ``key`` with a finite value."""
        return any(math.isfinite(v) for v in self._index[split].get(key, {}).values())

    def series(self, key: str, split: str) -> Series:
        """``key`` over steps in ``split`` (empty when the key never appears)."""
        points = self._index[_check_split(split)].get(key, {})
        steps = np.array(sorted(points), dtype=np.int64)
        values = np.array([points[s] for s in steps.tolist()], dtype=np.float64)
        return Series(steps, values)

    def task_series(self, task: str, metric: str, split: str) -> Series:
        """``tasks/<task>/<metric>`` over steps in ``split``."""
        return self.series(f"{TASK_PREFIX}{task}/{metric}", split)

    def tasks_with(self, metric: str, split: str) -> tuple[str, ...]:
        """Tasks that have a finite ``tasks/<task>/<metric>`` somewhere in ``split``."""
        return tuple(t for t in self.tasks if self.has(f"{TASK_PREFIX}{t}/{metric}", split))

    def primary_split(self) -> str:
        """``"eval"`` when the run logged per-task eval accuracy, else ``"train"``."""
        return "eval" if self.tasks_with("accuracy", "eval") else "train"


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    return split


def load_run(
    run: str | Path | RunHistory | Sequence[Mapping[str, Any]], name: str | None = None
) -> RunHistory:
    """A :class:`RunHistory` from a run directory, a ``metrics.jsonl`` path or records.

    Raises ``FileNotFoundError`` when the directory holds no ``metrics.jsonl`` and
    ``ValueError`` when the log holds no usable record. ``config.yaml`` beside the log is read
    when present (a malformed one is logged and ignored: it only labels the run).
    """
    if isinstance(run, RunHistory):
        return run
    if not isinstance(run, str | Path):
        history = RunHistory(run, name=name or "run")
        _require_records(history, "the given records")
        return history
    path = Path(run)
    log = path if path.is_file() else path / METRICS_FILE
    if not log.is_file():
        raise FileNotFoundError(
            f"{str(path)!r} has no {METRICS_FILE}; pass a run directory written by "
            f"`mtgrpo train` (its output_dir), or the path of a {METRICS_FILE} file"
        )
    run_dir = log.parent
    history = RunHistory(read_metrics(log), name=name or run_dir.resolve().name,
                         run_dir=run_dir, config=_read_config(run_dir / CONFIG_FILE))
    _require_records(history, str(log))
    return history


def _require_records(history: RunHistory, source: str) -> None:
    if history.last_step is None:
        raise ValueError(
            f"{source} holds no record with a 'step' and a 'split' ('train' or 'eval'); "
            "the run has not logged a step yet, or this is not an mtgrpo metrics log"
        )


def _read_config(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    import yaml

    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))  # never builds Python objects
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as error:
        logger.warning("ignoring unreadable %s: %s", path, error)
        return None
    return config if isinstance(config, dict) else None


# ----------------------------------------------------------------------------- per-run numbers


@dataclass(frozen=True)
class AccuracyCurve:
    """Per-task accuracy of one split and its worst and average (rule 1 of the module doc)."""

    tasks: tuple[str, ...]  # [K]
    steps: np.ndarray  # [T] steps where any of the tasks has an accuracy record
    per_task: np.ndarray  # [T, K] NaN where the task has no finite accuracy at the step
    worst: np.ndarray  # [T] min over tasks; NaN unless every task has a value
    average: np.ndarray  # [T] mean over tasks; NaN unless every task has a value
    worst_index: np.ndarray  # [T] int64 index into tasks of the worst; -1 where undefined

    @property
    def complete(self) -> np.ndarray:
        """``[T]`` bool: every task has a finite accuracy at the step."""
        return np.isfinite(self.worst)


def accuracy_curve(
    history: RunHistory, split: str, tasks: Sequence[str] | None = None
) -> AccuracyCurve:
    """Per-task accuracy ``[T, K]`` with worst ``min_k`` and average ``(1/K) Σ_k`` per step."""
    tasks = tuple(history.tasks_with("accuracy", split) if tasks is None else tasks)
    series = [history.task_series(task, "accuracy", split) for task in tasks]
    # the empty int64 array: concatenate refuses an empty list (a run without tasks)
    steps = np.unique(np.concatenate([s.steps for s in series] + [np.zeros(0, np.int64)]))
    per_task = np.full((len(steps), len(tasks)), np.nan)  # [T, K]
    # steps is the sorted union of every series' steps: searchsorted finds each step's row exactly
    for k, s in enumerate(series):
        per_task[np.searchsorted(steps, s.steps), k] = s.values
    worst, average, worst_index = worst_and_average(per_task)  # [T] each
    return AccuracyCurve(tasks, steps, per_task, worst, average, worst_index)


def steps_to_threshold(curve: AccuracyCurve, threshold: float) -> int | None:
    """The first step whose worst-task accuracy is ``>= threshold``; None if never."""
    return first_step_reaching(curve.steps, curve.worst, threshold)


@dataclass(frozen=True)
class RunSummary:
    """The headline numbers of one run on one split (accuracies are fractions in [0, 1])."""

    label: str
    run_dir: str | None
    method: str | None  # "<task_weighting> + <batch_construction>" from config.yaml
    split: str
    tasks: tuple[str, ...]  # [K] the tasks the numbers are over
    last_step: int  # training steps completed (largest step logged)
    final_step: int | None  # the last step where every task has an accuracy
    final_accuracy: dict[str, float]  # [K] per task at final_step
    final_worst: float | None
    final_worst_task: str | None
    final_average: float | None
    best_worst: float | None
    best_worst_step: int | None
    best_worst_task: str | None
    best_average: float | None
    best_average_step: int | None
    steps_to_threshold: dict[float, int | None]  # threshold -> first step reaching it
    delta_m: float | None = None  # percent against the table's baseline
    delta_m_tasks: tuple[str, ...] = ()
    delta_m_skipped: tuple[str, ...] = ()  # baseline accuracy 0
    time_per_step: float | None = None  # mean seconds ("time/step", train records)
    prompts_per_informative_group: float | None = None  # mean over train records
    final_weights: dict[str, float] = field(default_factory=dict)  # last tasks/<t>/weight
    generation: str | None = None  # the generation backend (and decode path) the run used

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["tasks"] = list(self.tasks)
        out["steps_to_threshold"] = {f"{t:g}": s for t, s in self.steps_to_threshold.items()}
        out["delta_m_tasks"] = list(self.delta_m_tasks)
        out["delta_m_skipped"] = list(self.delta_m_skipped)
        return out


def summarize_run(
    history: RunHistory,
    *,
    split: str | None = None,
    tasks: Sequence[str] | None = None,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    label: str | None = None,
) -> RunSummary:
    """Final and best worst-task / average accuracy, steps to thresholds and timing of a run.

    ``split`` defaults to the run's primary split (eval when it has per-task accuracy);
    ``tasks`` to the tasks with an accuracy in that split. See the module doc for the rules.
    """
    split = history.primary_split() if split is None else _check_split(split)
    curve = accuracy_curve(history, split, tasks)
    complete = np.flatnonzero(curve.complete)
    # rule 2: "final" is the last step at which every task has an accuracy
    final = int(complete[-1]) if len(complete) else None
    # argmax takes the first maximum: the earliest step on a tie (rule 2)
    best_worst = int(complete[np.argmax(curve.worst[complete])]) if final is not None else None
    best_avg = int(complete[np.argmax(curve.average[complete])]) if final is not None else None

    def at(row: int | None, values: np.ndarray) -> float | None:
        return None if row is None else float(values[row])

    def worst_task(row: int | None) -> str | None:
        return None if row is None else curve.tasks[int(curve.worst_index[row])]

    return RunSummary(
        label=label or history.name,
        run_dir=None if history.run_dir is None else str(history.run_dir),
        method=history.method,
        split=split,
        tasks=curve.tasks,
        last_step=int(history.last_step or 0),
        final_step=None if final is None else int(curve.steps[final]),
        final_accuracy=({} if final is None else
                        dict(zip(curve.tasks, curve.per_task[final].tolist(), strict=True))),
        final_worst=at(final, curve.worst),
        final_worst_task=worst_task(final),
        final_average=at(final, curve.average),
        best_worst=at(best_worst, curve.worst),
        best_worst_step=None if best_worst is None else int(curve.steps[best_worst]),
        best_worst_task=worst_task(best_worst),
        best_average=at(best_avg, curve.average),
        best_average_step=None if best_avg is None else int(curve.steps[best_avg]),
        steps_to_threshold={float(t): steps_to_threshold(curve, t) for t in thresholds},
        # rule 6: means over the train records with a finite value
        time_per_step=history.series("time/step", "train").mean(),
        prompts_per_informative_group=history.series(
            "sampling/prompts_per_informative_group", "train").mean(),
        final_weights=_final_weights(history, curve.tasks),
        generation=_generation(history.run_info),
    )


def _generation(run_info: Mapping[str, Any]) -> str | None:
    """``"static (decode path llama_modules)"`` from a run record, None without one."""
    backend = run_info.get("generation/backend")
    if backend is None:
        return None
    decode = run_info.get("generation/decode_path")
    return f"{backend} (decode path {decode})" if decode else str(backend)


def _final_weights(history: RunHistory, tasks: Sequence[str]) -> dict[str, float]:
    weights = {}
    for task in tasks:
        last = history.task_series(task, "weight", "train").last()
        if last is not None:
            weights[task] = last
    return weights


@dataclass(frozen=True)
class TaskSummary:
    """One task of one run: accuracy and the diagnostics of why it may lag."""

    task: str
    final_accuracy: float | None  # last finite accuracy of the split
    best_accuracy: float | None
    best_step: int | None
    final_weight: float | None  # last tasks/<t>/weight (train)
    mean_batch_share: float | None  # realised share of the trained batch (train mean)
    mean_target_share: float | None  # the sampler's target share (train mean)
    mean_zero_gradient_rate: float | None  # groups without contrast (train mean)


def summarize_tasks(history: RunHistory, split: str | None = None) -> list[TaskSummary]:
    """Per-task rows for ``mtgrpo report``: accuracy in ``split`` plus train diagnostics."""
    split = history.primary_split() if split is None else _check_split(split)
    rows = []
    for task in history.tasks:
        accuracy = history.task_series(task, "accuracy", split).finite()
        best = int(np.argmax(accuracy.values)) if len(accuracy) else None  # earliest on a tie
        rows.append(TaskSummary(
            task=task,
            final_accuracy=accuracy.last(),
            best_accuracy=None if best is None else float(accuracy.values[best]),
            best_step=None if best is None else int(accuracy.steps[best]),
            final_weight=history.task_series(task, "weight", "train").last(),
            mean_batch_share=history.task_series(task, "batch_share", "train").mean(),
            mean_target_share=history.task_series(task, "target_share", "train").mean(),
            mean_zero_gradient_rate=history.task_series(
                task, "zero_gradient_rate", "train").mean(),
        ))
    return rows


def run_report(summary: RunSummary, tasks: Sequence[TaskSummary]) -> Group:
    """The summary ``mtgrpo report`` prints: per-task table, worst, average, steps, timing."""
    from rich.console import Group

    columns = (("final acc", lambda t: _pct(t.final_accuracy)),
               ("best acc", lambda t: _pct(t.best_accuracy)),
               ("best at step", lambda t: "—" if t.best_step is None else str(t.best_step)),
               ("final weight", lambda t: _num(t.final_weight, 3)),
               ("batch share", lambda t: _num(t.mean_batch_share, 3)),
               ("target share", lambda t: _num(t.mean_target_share, 3)),
               ("zero-grad rate", lambda t: _num(t.mean_zero_gradient_rate, 3)))
    cells = [[cell(task) for _, cell in columns] for task in tasks]  # [K, columns]
    shown = [i for i in range(len(columns)) if any(row[i] != "—" for row in cells)]
    headers = ["task", *(f"{columns[i][0]}" for i in shown)]
    rows = [[task.task, *(row[i] for i in shown)] for task, row in zip(tasks, cells, strict=True)]
    method = f", {summary.method}" if summary.method else ""
    title = f"{summary.label}{method}: accuracy in % ({summary.split} split), train means"
    # at 80 columns the task stays whole and the diagnostics go first
    table = FittedTable(headers, rows, title=title, kept_in="metrics.jsonl",
                        drop_order=("zero-grad rate", "target share", "best at step",
                                    "batch share", "final weight", "best acc"))
    return Group(table, *_rich_notes(_report_lines(summary, tasks)))


def _report_lines(s: RunSummary, tasks: Sequence[TaskSummary] = ()) -> list[str]:
    if s.final_step is None:
        lines = [f"no {s.split} step with an accuracy for every task: no worst / average"]
    else:
        # the worst-task curve's highest point, worded so it cannot read as "the best task"
        lines = [
            f"worst task: {_pct(s.final_worst)}% ({s.final_worst_task}) at step {s.final_step}; "
            f"highest worst-task accuracy: {_pct(s.best_worst)}% at step {s.best_worst_step} "
            f"(worst task then: {s.best_worst_task})",
            f"average: {_pct(s.final_average)}% at step {s.final_step}; highest "
            f"{_pct(s.best_average)}% at step {s.best_average_step}",
            *_lagging_line(s, tasks),
        ]
    reach = ", ".join(f"≥ {t * 100:g}% {'at step ' + str(n) if n is not None else 'never'}"
                      for t, n in s.steps_to_threshold.items())
    lines.append(f"steps: {s.last_step} trained; worst task {reach}")
    timing = [f"{s.time_per_step:.2f} s/step" if s.time_per_step is not None else None,
              f"{s.prompts_per_informative_group:.2f} prompts generated per informative group"
              if s.prompts_per_informative_group is not None else None]
    if any(timing):
        lines.append("timing: " + "; ".join(t for t in timing if t))
    if s.generation:
        lines.append(f"generation backend: {s.generation}")
    return lines


def _lagging_line(s: RunSummary, tasks: Sequence[TaskSummary]) -> list[str]:
    """The task the run's accuracy shows lagging at the end, and what the task weighting and
    the sampler gave it: a lagging task held below a uniform share is worth a look."""
    row = next((t for t in tasks if t.task == s.final_worst_task), None)
    if row is None or len(tasks) < 2:
        return []
    uniform = 1 / len(tasks)
    given = [f"final task weight {_num(row.final_weight, 3)}" if row.final_weight is not None
             else None,
             f"mean batch share {_num(row.mean_batch_share, 3)}"
             if row.mean_batch_share is not None else None]
    if not any(given):
        return []
    line = (f"lagging on {s.split}: {row.task} ({_pct(s.final_worst)}% at step {s.final_step});"
            f" {', '.join(g for g in given if g)} (uniform share {uniform:.3f})")
    shares = [v for v in (row.final_weight, row.mean_batch_share) if v is not None]
    # a margin for rounding: a logged weight of exactly 1/K may differ from 1/K in its last digit
    if min(shares) < uniform - 1e-9:
        line += ": the task weighting gave it less than a uniform share"
    return [line]


# ----------------------------------------------------------------------------- comparison


@dataclass
class ComparisonTable:
    """Runs side by side on the tasks they share (rule 5 of the module doc)."""

    split: str
    thresholds: tuple[float, ...]
    tasks: tuple[str, ...]  # [K] common to every run
    dropped_tasks: tuple[str, ...]  # present in some runs only
    baseline: str | None  # label of the Δm% baseline
    runs: tuple[RunSummary, ...]
    histories: dict[str, RunHistory] = field(default_factory=dict, repr=False, compare=False)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(run.label for run in self.runs)

    def run(self, label: str) -> RunSummary:
        for summary in self.runs:
            if summary.label == label:
                return summary
        raise KeyError(f"no run labelled {label!r}; labels: {', '.join(self.labels)}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "thresholds": list(self.thresholds),
            "tasks": list(self.tasks),
            "dropped_tasks": list(self.dropped_tasks),
            "baseline": self.baseline,
            "runs": [run.to_dict() for run in self.runs],
        }

    def to_json(self) -> str:
        # allow_nan=False: a NaN left behind raises rather than writing a token JSON lacks
        return json.dumps(_json_safe(self.to_dict()), indent=2, allow_nan=False) + "\n"

    def headline_rows(self) -> tuple[list[str], list[list[str]]]:
        """Headers and rows of the headline table (accuracies in %)."""
        with_method = any(run.method for run in self.runs)
        headers = ["run", *(["method"] if with_method else []), "steps", "worst", "worst task",
                   "best worst (step)", "avg", "best avg",
                   *(f"steps→{t * 100:g}%" for t in self.thresholds), "Δm%", "s/step",
                   "prompts/inf. group"]
        rows = []
        for run in self.runs:
            rows.append([
                run.label, *([run.method or "—"] if with_method else []), str(run.last_step),
                _pct(run.final_worst), run.final_worst_task or "—",
                _pct_with(run.best_worst, run.best_worst_step),
                _pct(run.final_average), _pct(run.best_average),
                *(_steps(run.steps_to_threshold[t]) for t in self.thresholds),
                _signed(run.delta_m), _num(run.time_per_step, 2),
                _num(run.prompts_per_informative_group, 2),
            ])
        return headers, rows

    def task_rows(self) -> tuple[list[str], list[list[str]]]:
        """Headers and rows of final per-task accuracy (%), one row per run."""
        headers = ["run", *self.tasks]
        rows = [[run.label, *(_pct(run.final_accuracy.get(t)) for t in self.tasks)]
                for run in self.runs]
        return headers, rows

    def notes(self) -> list[str]:
        """The rules that changed a number, said in words."""
        notes = [f"accuracy (%) on the {self.split} split over {len(self.tasks)} common "
                 "task(s); worst / avg: final worst-task and average accuracy, only at steps "
                 "where every task was measured",
                 "steps→T%: first step with worst-task accuracy ≥ T%; s/step: mean time/step; "
                 "prompts/inf. group: prompts generated per informative group"]
        if self.baseline:
            notes.append(f"Δm%: mean relative change of the final per-task accuracy against "
                         f"{self.baseline}")
        if self.dropped_tasks:
            notes.append("left out (not in every run): " + ", ".join(self.dropped_tasks))
        for run in self.runs:
            if run.delta_m_skipped:
                notes.append(f"{run.label}: Δm% skips {len(run.delta_m_skipped)} task(s) with "
                             f"baseline accuracy 0 ({', '.join(run.delta_m_skipped)})")
            if run.final_step is None:
                notes.append(f"{run.label}: no step with an accuracy for every task")
        return notes

    def to_markdown(self) -> str:
        parts = [markdown_table(*self.headline_rows()), "Final accuracy per task (%):",
                 markdown_table(*self.task_rows()), *(f"- {note}" for note in self.notes())]
        return "\n\n".join(parts[:3]) + "\n\n" + "\n".join(parts[3:]) + "\n"

    def to_rich(self) -> Group:
        """A renderable for ``rich.console.Console.print``: both tables and the notes."""
        from rich.console import Group

        headers, rows = self.headline_rows()
        # names stay whole; what goes first when the terminal is narrow: timing, then the
        # later thresholds, the method, the best values
        drop = ["prompts/inf. group", "s/step",
                *(f"steps→{t * 100:g}%" for t in self.thresholds[1:][::-1]), "method",
                "best avg", "best worst (step)", "steps"]
        headline = FittedTable(headers, rows, title=f"Runs ({self.split} split)",
                               whole=[i for i, h in enumerate(headers)
                                      if h in ("run", "method", "worst task")],
                               drop_order=drop, kept_in="comparison.md")
        task_headers, task_rows = self.task_rows()
        per_task = FittedTable(task_headers, task_rows, title="Final accuracy per task (%)",
                               whole=range(len(task_headers)), transpose=True)
        return Group(headline, per_task, *_rich_notes(self.notes()))


def compare_runs(
    run_dirs: Sequence[str | Path | RunHistory],
    baseline: str | Path | RunHistory | None = None,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    split: str = "eval",
    *,
    labels: Sequence[str] | None = None,
) -> ComparisonTable:
    """Summaries of several runs on their common tasks, with Δm% against ``baseline``.

    ``baseline`` is one of ``run_dirs`` (by path or label) or another run directory, which is
    then added as the first row. Labels default to the directory names (made unique with
    the parent directory when two runs share a name).
    """
    split = _check_split(split)
    thresholds = _check_thresholds(thresholds)
    if not run_dirs:
        raise ValueError("compare_runs needs at least one run directory")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"got {len(labels)} labels {list(labels)} for {len(run_dirs)} runs; "
                         "give one label per run")
    histories = [load_run(run) for run in run_dirs]
    names = list(labels) if labels is not None else _unique_names(histories)
    if len(set(names)) != len(names):
        raise ValueError(f"run labels must be unique, got {names}; pass distinct labels")
    base = None if baseline is None else _find_baseline(histories, names, baseline)
    if base is not None and not isinstance(base, int):
        name = base.name if base.name not in names else f"{base.name} (baseline)"
        histories, names, base = [base, *histories], [name, *names], 0
    tasks, dropped = _common_tasks(histories, names, split)
    summaries = [summarize_run(h, split=split, tasks=tasks, thresholds=thresholds, label=n)
                 for h, n in zip(histories, names, strict=True)]
    base_label = None if base is None else names[base]
    if base is not None:
        summaries = _with_delta_m(summaries, summaries[base])
    return ComparisonTable(split, thresholds, tasks, dropped, base_label, tuple(summaries),
                           dict(zip(names, histories, strict=True)))


def parse_thresholds(text: str) -> tuple[float, ...]:
    """Comma-separated worst-task thresholds (fractions), e.g. ``"0.3,0.4,0.5"``."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"thresholds must be comma-separated fractions such as 0.3,0.4,0.5; "
                         f"got {text!r}") from None
    return _check_thresholds(values)


def _check_thresholds(thresholds: Sequence[float]) -> tuple[float, ...]:
    values = tuple(sorted({float(t) for t in thresholds}))
    bad = [t for t in values if not 0.0 < t <= 1.0]
    if bad or not values:
        raise ValueError(
            f"worst-task accuracy thresholds must be fractions in (0, 1], got {list(thresholds)}"
            "; write 50% as 0.5"
        )
    return values


def _find_baseline(
    histories: Sequence[RunHistory], names: Sequence[str], baseline: str | Path | RunHistory
) -> int | RunHistory:
    """The baseline's index among the compared runs, or its history when it is another run."""
    if isinstance(baseline, RunHistory):
        return next((i for i, h in enumerate(histories) if h is baseline), baseline)
    path = Path(baseline)
    if path.exists():
        target = (path if path.is_dir() else path.parent).resolve()
        for i, history in enumerate(histories):
            if history.run_dir is not None and history.run_dir.resolve() == target:
                return i
        return load_run(path)
    if str(baseline) in names:
        return list(names).index(str(baseline))
    raise FileNotFoundError(
        f"baseline {str(baseline)!r} is neither a run directory nor the label of a compared run "
        f"({', '.join(names)}); pass the baseline's run directory or one of those labels"
    )


def _unique_names(histories: Sequence[RunHistory]) -> list[str]:
    """Directory names; the parent joins in where two runs share a name, then the full path."""
    names = [h.name for h in histories]
    for depth in (2, None):
        duplicated = {n for n in names if names.count(n) > 1}
        if not duplicated:
            break
        for i, history in enumerate(histories):
            if names[i] in duplicated and history.run_dir is not None:
                path = history.run_dir.resolve()
                # PurePath joins the parts: "/".join would double the root's own "/"
                names[i] = (PurePath(*path.parts[-depth:]) if depth else path).as_posix()
    return names


def _common_tasks(
    histories: Sequence[RunHistory], names: Sequence[str], split: str
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    per_run = [h.tasks_with("accuracy", split) for h in histories]
    for tasks, name, history in zip(per_run, names, histories, strict=True):
        if not tasks:
            where = str(history.run_dir) if history.run_dir else name
            hint = (" (it has no eval records: evaluate with eval_steps > 0, or compare with "
                    "--split train)" if split == "eval" and "eval" not in history.splits else "")
            raise ValueError(
                f"run {where!r} has no per-task accuracy (tasks/<task>/accuracy) in the {split} "
                f"split{hint}"
            )
    # rule 5: the numbers are over the tasks every run has; the order of first appearance
    union = list(dict.fromkeys(t for tasks in per_run for t in tasks))
    common = tuple(t for t in union if all(t in tasks for tasks in per_run))
    if not common:
        listing = "; ".join(f"{n}: {', '.join(t)}" for n, t in zip(names, per_run, strict=True))
        raise ValueError(f"the runs share no task, so there is nothing to compare ({listing}); "
                         "compare runs trained and evaluated on the same tasks")
    return common, tuple(t for t in union if t not in common)


def _with_delta_m(summaries: list[RunSummary], base: RunSummary) -> list[RunSummary]:
    from dataclasses import replace

    if base.final_step is None:
        raise ValueError(
            f"baseline {base.label!r} has no {base.split} step with an accuracy for every task "
            f"({', '.join(base.tasks)}), so Δm% has nothing to compare against; pick another "
            "baseline"
        )
    out = []
    for summary in summaries:
        # ALGORITHMS.md §6's Δm% on final accuracies; rule 4 leaves out baseline-0 tasks
        change = delta_m(summary.final_accuracy, base.final_accuracy)
        out.append(replace(summary, delta_m=change.value, delta_m_tasks=change.tasks,
                           delta_m_skipped=change.skipped_zero_baseline))
    return out


# ----------------------------------------------------------------------------- seeds


@dataclass(frozen=True)
class Spread:
    """Mean, sample standard deviation (ddof = 1; None for one run) and range of a number."""

    mean: float
    std: float | None
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread | None:
        finite = np.array([v for v in values if v is not None and math.isfinite(v)], float)
        if not len(finite):
            return None
        # one run has no sample spread: ddof=1 divides by n - 1 = 0
        std = float(finite.std(ddof=1)) if len(finite) > 1 else None
        return cls(float(finite.mean()), std, float(finite.min()), float(finite.max()),
                   len(finite))

    def format(self, scale: float = 1.0, digits: int = 1) -> str:
        """``mean ± std [min–max]`` with values multiplied by ``scale``."""
        mean, std, low, high = (f"{v * scale:.{digits}f}" if v is not None else None
                                for v in (self.mean, self.std, self.min, self.max))
        return mean if std is None else f"{mean} ± {std} [{low}–{high}]"


_SPREAD_NOTE = ("cells: mean ± sample std [min–max] over the runs of a method; steps to a "
                "threshold over the runs that reached it (reached / runs)")
_AGGREGATED = ("final_worst", "best_worst", "final_average", "best_average", "delta_m",
               "time_per_step", "prompts_per_informative_group")


@dataclass(frozen=True)
class MethodAggregate:
    """The numbers of one method over its runs (seeds)."""

    method: str
    members: tuple[str, ...]  # run labels
    final_worst: Spread | None
    best_worst: Spread | None
    final_average: Spread | None
    best_average: Spread | None
    delta_m: Spread | None
    time_per_step: Spread | None
    prompts_per_informative_group: Spread | None
    steps_to_threshold: dict[float, Spread | None]  # over the runs that reached it
    reached: dict[float, int]  # how many runs reached each threshold
    final_accuracy: dict[str, Spread | None]  # [K] per task

    def to_dict(self) -> dict[str, Any]:
        def plain(spread: Spread | None) -> dict[str, Any] | None:
            return None if spread is None else vars(spread).copy()

        out: dict[str, Any] = {"method": self.method, "members": list(self.members)}
        out.update({name: plain(getattr(self, name)) for name in _AGGREGATED})
        out["steps_to_threshold"] = {f"{t:g}": plain(s) for t, s in self.steps_to_threshold.items()}
        out["reached"] = {f"{t:g}": n for t, n in self.reached.items()}
        out["final_accuracy"] = {t: plain(s) for t, s in self.final_accuracy.items()}
        return out


@dataclass(frozen=True)
class SeedAggregateTable:
    """Methods side by side, each the mean ± std [min–max] over its runs."""

    split: str
    thresholds: tuple[float, ...]
    tasks: tuple[str, ...]
    baseline: str | None
    methods: tuple[MethodAggregate, ...]

    @property
    def group_of(self) -> dict[str, str]:
        """Run label -> method."""
        return {label: m.method for m in self.methods for label in m.members}

    def to_dict(self) -> dict[str, Any]:
        return {"split": self.split, "thresholds": list(self.thresholds),
                "tasks": list(self.tasks), "baseline": self.baseline,
                "methods": [m.to_dict() for m in self.methods]}

    def to_json(self) -> str:
        return json.dumps(_json_safe(self.to_dict()), indent=2, allow_nan=False) + "\n"

    def rows(self) -> tuple[list[str], list[list[str]]]:
        """Headers and rows: accuracies in %, each cell ``mean ± std [min–max]``."""
        headers = ["method", "runs", "worst", "best worst", "avg", "best avg",
                   *(f"steps→{t * 100:g}% (reached)" for t in self.thresholds),
                   f"Δm% vs {self.baseline}" if self.baseline else "Δm%", "s/step",
                   "prompts/inf. group"]
        rows = []
        for m in self.methods:
            rows.append([
                m.method, str(len(m.members)),
                *(_spread(getattr(m, n), 100.0) for n in _AGGREGATED[:4]),
                *(f"{_spread(m.steps_to_threshold[t], 1.0, 0)} ({m.reached[t]}/{len(m.members)})"
                  for t in self.thresholds),
                _spread(m.delta_m, 1.0), _spread(m.time_per_step, 1.0, 2),
                _spread(m.prompts_per_informative_group, 1.0, 2),
            ])
        return headers, rows

    def to_markdown(self) -> str:
        return markdown_table(*self.rows()) + f"\n\n- {_SPREAD_NOTE}\n"

    def to_rich(self) -> Group:
        from rich.console import Group

        headers, _ = self.rows()
        drop = ["prompts/inf. group", "s/step",
                *(h for h in headers[6:][::-1] if h.startswith("steps→")), "best avg",
                "best worst"]
        table = FittedTable(*self.rows(), title=f"Methods over seeds ({self.split} split)",
                            drop_order=drop, kept_in="comparison.md")
        return Group(table, *_rich_notes([_SPREAD_NOTE]))


def method_of_label(label: str) -> str:
    """The method part of a run label: ``label`` without a trailing seed suffix.

    ``mtgrpo-seed1`` -> ``mtgrpo``; ``grpo_s2`` -> ``grpo``; ``dapo.seed=3`` -> ``dapo``.
    Bare trailing numbers are kept (``lambda-0.25`` names a setting, not a seed).
    """
    method = SEED_SUFFIX.sub("", label)
    return method or label


def aggregate_seeds(
    tables: ComparisonTable | Sequence[ComparisonTable] | Sequence[RunSummary],
    group_by: str | Mapping[str, str] | Callable[[str], str] = "prefix",
) -> SeedAggregateTable:
    """Group runs by method and give mean ± spread of every number of :class:`RunSummary`.

    ``group_by``: ``"prefix"`` (:func:`method_of_label` on each run label), ``"label"`` (every
    run its own group), a mapping run label -> method (every run must be mapped), or a
    callable label -> method. Methods appear in the order of their first run.
    """
    summaries, split, thresholds, tasks, baseline = _flatten(tables)
    method_of = _grouping(group_by, [s.label for s in summaries])
    groups: dict[str, list[RunSummary]] = {}
    for summary in summaries:
        groups.setdefault(method_of(summary.label), []).append(summary)
    methods = tuple(_aggregate(name, runs, thresholds, tasks) for name, runs in groups.items())
    return SeedAggregateTable(split, thresholds, tasks, baseline, methods)


def _flatten(
    tables: ComparisonTable | Sequence[ComparisonTable] | Sequence[RunSummary],
) -> tuple[list[RunSummary], str, tuple[float, ...], tuple[str, ...], str | None]:
    items = [tables] if isinstance(tables, ComparisonTable) else list(tables)
    if not items:
        raise ValueError("aggregate_seeds needs at least one run")
    summaries = [s for item in items for s in (item.runs if isinstance(item, ComparisonTable)
                                               else (item,))]
    labels = [s.label for s in summaries]
    if len(set(labels)) != len(labels):
        raise ValueError(f"run labels must be unique across tables, got {labels}")
    splits = {s.split for s in summaries}
    if len(splits) > 1:
        raise ValueError(f"cannot aggregate runs measured on different splits {sorted(splits)}")
    thresholds = tuple(sorted({t for s in summaries for t in s.steps_to_threshold}))
    tasks = tuple(dict.fromkeys(t for s in summaries for t in s.tasks))
    baselines = {item.baseline for item in items if isinstance(item, ComparisonTable)}
    # tables against different baselines: no one baseline to name
    baseline = baselines.pop() if len(baselines) == 1 else None
    return summaries, splits.pop(), thresholds, tasks, baseline


def _grouping(
    group_by: str | Mapping[str, str] | Callable[[str], str], labels: Sequence[str]
) -> Callable[[str], str]:
    if isinstance(group_by, str):
        rules = {"prefix": method_of_label, "label": lambda label: label}
        if group_by not in rules:
            raise ValueError(f"unknown group_by {group_by!r}; use 'prefix', 'label', a mapping "
                             "label -> method, or a callable")
        return rules[group_by]
    if isinstance(group_by, Mapping):
        unmapped = [label for label in labels if label not in group_by]
        if unmapped:
            raise ValueError(f"group_by maps no method for runs {unmapped}; map every run label")
        return lambda label: str(group_by[label])
    if callable(group_by):
        return lambda label: str(group_by(label))
    raise TypeError(f"group_by must be a str, a mapping or a callable, got {type(group_by)}")


def _aggregate(
    name: str, runs: Sequence[RunSummary], thresholds: Sequence[float], tasks: Sequence[str]
) -> MethodAggregate:
    numbers = {n: Spread.of(getattr(run, n) for run in runs) for n in _AGGREGATED}
    steps = {t: Spread.of(run.steps_to_threshold.get(t) for run in runs) for t in thresholds}
    reached = {t: sum(run.steps_to_threshold.get(t) is not None for run in runs)
               for t in thresholds}
    accuracy = {t: Spread.of(run.final_accuracy.get(t) for run in runs) for t in tasks}
    return MethodAggregate(method=name, members=tuple(run.label for run in runs),
                           steps_to_threshold=steps, reached=reached, final_accuracy=accuracy,
                           **numbers)


# ----------------------------------------------------------------------------- formatting


def _pct(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value * 100:.1f}"


def _pct_with(value: float | None, detail: object) -> str:
    return "—" if value is None else f"{_pct(value)} ({detail})"


def _signed(value: float | None) -> str:
    return "—" if value is None else f"{value:+.1f}"


def _num(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _steps(value: int | None) -> str:
    return "never" if value is None else str(value)


def _spread(spread: Spread | None, scale: float, digits: int = 1) -> str:
    return "—" if spread is None else spread.format(scale, digits)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
                   numeric: bool = True) -> str:
    """A GitHub-flavoured Markdown table ('|' inside cells escaped); with ``numeric`` every
    column but the first is right-aligned (numbers)."""

    def line(cells: Sequence[str]) -> str:
        # GitHub Markdown: an unescaped "|" inside a cell would start a new column
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    # GitHub Markdown: a colon on the right of the rule right-aligns the column
    align = ["---", *(("---:" if numeric else "---") for _ in headers[1:])]
    return "\n".join([line(headers), "| " + " | ".join(align) + " |", *map(line, rows)])


def _rich_notes(notes: Iterable[str]) -> list[Any]:
    from rich.text import Text

    return [Text(f"• {note}", style="dim") for note in notes]


def _json_safe(value: Any) -> Any:
    """NaN / inf -> None (JSON has none), tuples -> lists, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value
