"""Figures of one run and of several runs side by side (matplotlib, imported only to draw).

One run (:func:`plot_run`, written as ``<name>.png``; names in :data:`RUN_FIGURES`):

- ``accuracy``: per-task accuracy vs step, eval solid, train dashed and faded, with the
  worst-task and average accuracy as thick lines (eval when the run has it, else train);
- ``weights``: the task weights ``tasks/<t>/weight`` vs step, with the uniform level ``1/K``;
- ``composition``: one panel per task, the realised batch share against the target share
  (``tasks/<t>/target_share``, else the weight) as a dashed line;
- ``zero_gradient``: the zero-gradient rate per task vs step, and the filter rate when logged.

Several runs (:func:`plot_comparison`; names in :data:`COMPARISON_FIGURES`):

- ``compare_accuracy``: one panel per task, every run a line, or per method the mean over its
  seeds with a shaded min–max band;
- ``compare_worst``: worst-task accuracy vs step per run, or per method as the mean over its
  seeds with a shaded min–max band;
- ``compare_weights``: the final task weights of every run as grouped bars;
- ``compare_weight_curves``: one panel per run (or method, mean over seeds), the task weights
  vs step;
- ``compare_composition``: one panel per run (or method, mean over seeds), each task's realised
  batch share against its target share.

In ``compare_accuracy``, ``compare_weight_curves`` and ``compare_composition`` a mean over
seeds at a step is taken over the runs that logged a finite value there (:func:`seed_mean`),
the band spanning their minimum and maximum; ``compare_worst`` keeps to the steps where every
seed measured every task, since a worst task over fewer seeds is another quantity.

Every task keeps one colour in every figure of a report (:func:`task_colours`). Noisy train
curves can be smoothed (:func:`ema`) and are then drawn over their raw points, which stay
visible. A figure or panel whose metrics a run did not log is left out and the reason is
returned (:attr:`PlotResult.skipped`) and logged, never raised: a run without eval or with
uniform weights still gets every figure it has data for.

Figures are drawn on ``matplotlib.figure.Figure`` with the Agg canvas, not through
``pyplot``, so plotting never touches a global backend or opens a window.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mtgrpo.algo.registry import Registry
from mtgrpo.reporting.compare import (
    ComparisonTable,
    RunHistory,
    SeedAggregateTable,
    Series,
    accuracy_curve,
    load_run,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "COMPARISON_FIGURES",
    "RUN_FIGURES",
    "Drawn",
    "PlotResult",
    "RunPlotContext",
    "ema",
    "plot_comparison",
    "plot_run",
    "plot_run_figures",
    "seed_mean",
    "task_colours",
]

logger = logging.getLogger(__name__)

DEFAULT_SMOOTHING = 0.6
REPORT_DIR = "report"
_WORST_COLOUR = "black"
_AVERAGE_COLOUR = "#6b6b6b"
_DPI = 110
# More tasks than this and the legend moves outside the axes, to the right.
_LEGEND_INSIDE_MAX = 4


@dataclass(frozen=True)
class Drawn:
    """A figure (None when there was nothing to draw) and what was left out of it, and why."""

    figure: Figure | None
    skipped: tuple[str, ...] = ()


@dataclass
class PlotResult:
    """The PNG files written and the figures or panels left out (with the reason)."""

    written: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RunPlotContext:
    """What a run figure is drawn from: the run, task colours, train-curve smoothing."""

    history: RunHistory
    colours: Mapping[str, Any]
    smoothing: float


RunFigure = Callable[[RunPlotContext], Drawn]
RUN_FIGURES: Registry[RunFigure] = Registry("run figure")
ComparisonFigure = Callable[[ComparisonTable, SeedAggregateTable | None, float], Drawn]
COMPARISON_FIGURES: Registry[ComparisonFigure] = Registry("comparison figure")


# ----------------------------------------------------------------------------- helpers


def ema(values: np.ndarray, smoothing: float) -> np.ndarray:
    """Debiased exponential moving average, TensorBoard's smoothing of noisy curves.

    ``m_t = s · m_{t−1} + (1 − s) · x_t`` and ``y_t = m_t / (1 − s^n_t)`` with ``m_0 = 0`` and
    ``n_t`` the finite values seen so far; the debiasing keeps the first points from being
    pulled to 0. NaN entries stay NaN and leave the average untouched. ``smoothing = 0``
    returns the values unchanged.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be in [0, 1) (0: none; 0.6 is light), got {smoothing}")
    values = np.asarray(values, dtype=np.float64)  # [T]
    out = np.full_like(values, np.nan)
    average, seen = 0.0, 0
    for t, value in enumerate(values.tolist()):
        if math.isfinite(value):
            average = smoothing * average + (1.0 - smoothing) * value
            seen += 1
            out[t] = average / (1.0 - smoothing**seen)
    return out


def task_colours(tasks: Sequence[str]) -> dict[str, Any]:
    """One colour per task, from ``tab10`` (≤ 10 tasks), ``tab20`` (≤ 20) or ``turbo``."""
    from matplotlib import colormaps

    tasks = list(dict.fromkeys(tasks))
    if len(tasks) <= 10:
        palette = [colormaps["tab10"](i) for i in range(len(tasks))]
    elif len(tasks) <= 20:
        palette = [colormaps["tab20"](i) for i in range(len(tasks))]
    else:
        palette = [colormaps["turbo"](x) for x in np.linspace(0.05, 0.95, len(tasks))]
    return dict(zip(tasks, palette, strict=True))


def _new_figure(rows: int = 1, cols: int = 1, *, width: float = 9.0, height: float = 5.0,
                sharey: bool = False) -> tuple[Figure, np.ndarray]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # constrained: the "outside right upper" figure legends need this layout manager to make
    # room for them (matplotlib's Figure.legend docs)
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)  # Agg, not pyplot: no global backend, no window
    # squeeze=False: always a 2-D array, so one panel and a grid are indexed alike
    axes = figure.subplots(rows, cols, squeeze=False, sharey=sharey)  # [rows, cols]
    return figure, axes


def _grid(panels: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(max_cols, panels)
    return math.ceil(panels / cols), cols


def _curve(ax: Axes, series: Series, colour: Any, *, smoothing: float, label: str | None,
           linestyle: str = "-", alpha: float = 1.0, gid: str | None = None) -> None:
    """A line through ``series``; smoothed over its raw points when ``smoothing > 0``.

    The raw points are a scatter (not a line), so the axes' lines are exactly the curves.
    """
    finite = series.finite()
    if smoothing > 0:
        ax.scatter(finite.steps, finite.values, s=12, color=colour,
                   alpha=max(0.25, 0.45 * alpha), linewidths=0)
        values = ema(finite.values, smoothing)
    else:
        values = finite.values
    marker = "o" if len(finite) <= 30 and smoothing == 0 else None
    (line,) = ax.plot(finite.steps, values, color=colour, linestyle=linestyle, alpha=alpha,
                      linewidth=1.6, marker=marker, markersize=3.5, label=label)
    if gid is not None:
        line.set_gid(gid)


def _legend(ax: Axes, entries: int, *, outside: bool = False, **kwargs: Any) -> None:
    if outside or entries > _LEGEND_INSIDE_MAX:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                  fontsize=8, **kwargs)
    else:
        ax.legend(loc="best", fontsize=8, **kwargs)


def _finish(ax: Axes, *, title: str, ylabel: str, xlabel: str = "training step") -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if xlabel == "training step":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no "step 2.5"


# ----------------------------------------------------------------------------- run figures


@RUN_FIGURES.register("accuracy")
def accuracy_figure(ctx: RunPlotContext) -> Drawn:
    """Per-task accuracy (eval solid, train dashed and faded) with worst and average thick."""
    from matplotlib.lines import Line2D

    history = ctx.history
    eval_tasks, train_tasks = (history.tasks_with("accuracy", s) for s in ("eval", "train"))
    if not eval_tasks and not train_tasks:
        return Drawn(None, ("accuracy: no tasks/<task>/accuracy in any record",))
    primary = "eval" if eval_tasks else "train"
    figure, axes = _new_figure(width=10.0)
    ax = axes[0, 0]
    for task in train_tasks:
        faded = primary == "eval"
        _curve(ax, history.task_series(task, "accuracy", "train"), ctx.colours[task],
               smoothing=ctx.smoothing, label=None if faded else task,
               linestyle="--" if faded else "-", alpha=0.45 if faded else 1.0,
               gid=f"train:{task}")
    for task in eval_tasks:
        _curve(ax, history.task_series(task, "accuracy", "eval"), ctx.colours[task],
               smoothing=0.0, label=task, gid=f"eval:{task}")
    curve = accuracy_curve(history, primary)
    # Train worst / average are per-batch and noisy: smoothed like the train task curves.
    smooth = ctx.smoothing if primary == "train" else 0.0
    steps = curve.steps[curve.complete]
    ax.plot(steps, ema(curve.worst[curve.complete], smooth), color=_WORST_COLOUR,
            linewidth=3.2, label="worst task", gid="worst")
    ax.plot(steps, ema(curve.average[curve.complete], smooth), color=_AVERAGE_COLOUR,
            linewidth=3.2, linestyle="-.", label="average", gid="average")
    handles, _ = ax.get_legend_handles_labels()
    skipped = []
    if primary == "eval" and train_tasks:
        handles.append(Line2D([], [], color="grey", linestyle="--", alpha=0.6,
                              label="(dashed: train batches)"))
    if primary == "train":
        skipped.append("accuracy: no eval records, so the curves are train-batch accuracy")
    # a margin, so that curves at 0 and 1 are not hidden by the frame
    ax.set_ylim(-0.02, 1.02)
    _finish(ax, title=f"Per-task accuracy ({primary}), worst task and average",
            ylabel="accuracy")
    _legend(ax, len(handles), handles=handles)
    return Drawn(figure, tuple(skipped))


@RUN_FIGURES.register("weights")
def weights_figure(ctx: RunPlotContext) -> Drawn:
    """The task weights ``z_k`` vs step, with the uniform level ``1/K`` dashed."""
    tasks = ctx.history.tasks_with("weight", "train")
    if not tasks:
        return Drawn(None, ("weights: no tasks/<task>/weight in the train records",))
    figure, axes = _new_figure()
    ax = axes[0, 0]
    for task in tasks:
        _curve(ax, ctx.history.task_series(task, "weight", "train"), ctx.colours[task],
               smoothing=0.0, label=task, gid=f"weight:{task}")
    ax.axhline(1.0 / len(tasks), color="grey", linestyle=":", linewidth=1.2,
               label=f"uniform 1/K = {1.0 / len(tasks):.3g}")
    ax.set_ylim(bottom=0.0)
    _finish(ax, title="Task weights", ylabel="task weight z_k")
    _legend(ax, len(tasks) + 1)
    return Drawn(figure)


@RUN_FIGURES.register("composition")
def composition_figure(ctx: RunPlotContext) -> Drawn:
    """Per task: realised batch share (solid, smoothed) against its target (dashed)."""
    history = ctx.history
    tasks = history.tasks_with("batch_share", "train")
    skipped = [f"composition: {t}: no tasks/{t}/batch_share"
               for t in history.tasks if t not in tasks]
    if not tasks:
        return Drawn(None, ("composition: no tasks/<task>/batch_share in the train records",))
    rows, cols = _grid(len(tasks))
    figure, axes = _new_figure(rows, cols, width=4.2 * cols, height=3.2 * rows, sharey=True)
    top = 0.0
    # the grid may hold more axes than tasks: the spare ones are hidden below
    for ax, task in zip(axes.flat, tasks, strict=False):
        _curve(ax, history.task_series(task, "batch_share", "train"), ctx.colours[task],
               smoothing=ctx.smoothing, label="realised share", gid=f"share:{task}")
        target_key = next((k for k in ("target_share", "weight")
                           if history.has(f"tasks/{task}/{k}", "train")), None)
        if target_key is None:
            skipped.append(f"composition: {task}: no target_share or weight to compare with")
        else:
            target = history.task_series(task, target_key, "train").finite()
            ax.plot(target.steps, target.values, color="black", linestyle="--", linewidth=1.2,
                    label=target_key.replace("_", " "), gid=f"target:{task}")
            # initial: the max of an empty array raises
            top = max(top, float(np.max(target.values, initial=0.0)))
        top = max(top, history.task_series(task, "batch_share", "train").finite().values.max())
        _finish(ax, title=task, ylabel="share of the batch")
        ax.legend(loc="best", fontsize=7)
    axes[0, 0].set_ylim(0.0, min(1.02, 1.12 * top))  # shared y: raw points stay inside
    for ax in list(axes.flat)[len(tasks):]:
        ax.set_visible(False)
    figure.suptitle("Batch composition: realised vs target share", fontweight="bold")
    return Drawn(figure, tuple(skipped))


@RUN_FIGURES.register("zero_gradient")
def zero_gradient_figure(ctx: RunPlotContext) -> Drawn:
    """Zero-gradient rate per task and, when logged, the filter rate, vs step."""
    panels = [(metric, ctx.history.tasks_with(metric, "train"))
              for metric in ("zero_gradient_rate", "filter_rate")]
    skipped = tuple(f"zero_gradient: no tasks/<task>/{metric} in the train records"
                    for metric, tasks in panels if not tasks)
    panels = [(metric, tasks) for metric, tasks in panels if tasks]
    if not panels:
        return Drawn(None, skipped)
    figure, axes = _new_figure(1, len(panels), width=6.5 * len(panels), sharey=True)
    for ax, (metric, tasks) in zip(axes.flat, panels, strict=True):
        for task in tasks:
            _curve(ax, ctx.history.task_series(task, metric, "train"), ctx.colours[task],
                   smoothing=ctx.smoothing, label=task, gid=f"{metric}:{task}")
        ax.set_ylim(-0.02, 1.02)
        what = "groups without contrast" if metric == "zero_gradient_rate" else "groups dropped"
        _finish(ax, title=metric.replace("_", " ").capitalize(),
                ylabel=f"fraction of generated {what}")
        _legend(ax, len(tasks))
    return Drawn(figure, skipped)


# ----------------------------------------------------------------------------- entry points


def plot_run_figures(
    run: str | Path | RunHistory | Sequence[Mapping[str, Any]],
    out_dir: str | Path | None = None,
    *,
    smoothing: float = DEFAULT_SMOOTHING,
    figures: Sequence[str] | None = None,
) -> PlotResult:
    """Write the figures of one run as ``<out_dir>/<figure>.png``; see :func:`plot_run`."""
    ema(np.zeros(0), smoothing)  # validate before reading the log
    names = [RUN_FIGURES.canonical(n) for n in (figures or RUN_FIGURES.names())]
    history = load_run(run)
    if out_dir is None and history.run_dir is None:
        raise ValueError("plot_run needs out_dir when given records rather than a run "
                         "directory; pass out_dir=<folder for the PNG files>")
    out = Path(out_dir) if out_dir is not None else history.run_dir / REPORT_DIR
    ctx = RunPlotContext(history, task_colours(history.tasks), smoothing)
    return _save_all(((name, RUN_FIGURES.get(name)(ctx)) for name in names), out)


def plot_run(
    run_dir_or_records: str | Path | RunHistory | Sequence[Mapping[str, Any]],
    out_dir: str | Path | None = None,
    *,
    smoothing: float = DEFAULT_SMOOTHING,
    figures: Sequence[str] | None = None,
) -> list[Path]:
    """Write the PNG figures of one run and return their paths.

    ``run_dir_or_records``: a run directory, its ``metrics.jsonl``, a :class:`RunHistory` or
    the records themselves (then ``out_dir`` is required). ``out_dir`` defaults to
    ``RUN_DIR/report``. ``smoothing`` (EMA weight in [0, 1)) applies to train curves only.
    ``figures``: names from :data:`RUN_FIGURES` (default: all). Figures or panels without
    data are skipped and logged; :func:`plot_run_figures` also returns those reasons.
    """
    return plot_run_figures(run_dir_or_records, out_dir, smoothing=smoothing,
                            figures=figures).written


def _save_all(drawn: Any, out: Path) -> PlotResult:
    result = PlotResult()
    for name, figure in drawn:
        result.skipped.extend(figure.skipped)
        if figure.figure is None:
            continue
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{name}.png"
        # "tight" grows the file to hold the legends placed outside the axes
        figure.figure.savefig(path, dpi=_DPI, format="png", bbox_inches="tight")
        result.written.append(path)
    for reason in result.skipped:
        logger.info("left out %s", reason)
    return result


# ----------------------------------------------------------------------------- comparison


def _run_colours(table: ComparisonTable, aggregate: SeedAggregateTable | None) -> dict[str, Any]:
    """A colour per run; the runs of one method share their method's colour."""
    group_of = aggregate.group_of if aggregate is not None else {}
    keys = [group_of.get(label, label) for label in table.labels]
    by_key = task_colours(keys)
    return {label: by_key[key] for label, key in zip(table.labels, keys, strict=True)}


def _first_of_group(
    table: ComparisonTable, aggregate: SeedAggregateTable | None
) -> dict[str, str | None]:
    """Legend label per run: the method for its first run, nothing for the other seeds."""
    if aggregate is None:
        return dict(zip(table.labels, table.labels, strict=True))
    seen: set[str] = set()
    out: dict[str, str | None] = {}
    for label in table.labels:
        method = aggregate.group_of.get(label, label)
        out[label] = None if method in seen else method
        seen.add(method)
    return out


def _groups(
    table: ComparisonTable, aggregate: SeedAggregateTable | None
) -> dict[str, tuple[str, ...]]:
    """Method -> its run labels with an aggregate; else every run its own group."""
    if aggregate is None:
        return {label: (label,) for label in table.labels}
    return {m.method: m.members for m in aggregate.methods}


def seed_mean(series: Sequence[Series]) -> tuple[Series, np.ndarray, np.ndarray]:
    """Mean of several runs' series per step, with the min and max: ``(mean, low, high)``.

    At each step the statistics run over the series with a finite value there; steps where
    none has one are left out. ``low`` and ``high`` are ``[T]`` arrays aligned with the mean.
    """
    finite = [s.finite() for s in series]
    # the empty int64 array: concatenate refuses an empty list
    steps = np.unique(np.concatenate([s.steps for s in finite] + [np.zeros(0, np.int64)]))
    values = np.full((len(finite), len(steps)), np.nan)  # [S, T]
    for row, s in enumerate(finite):
        values[row, np.searchsorted(steps, s.steps)] = s.values
    counts = np.isfinite(values).sum(axis=0)  # [T] >= 1 by construction
    mean = np.where(np.isfinite(values), values, 0.0).sum(axis=0) / np.maximum(counts, 1)
    # initial: with no series at all (S = 0) numpy's min and max have no identity and raise
    low = np.min(np.where(np.isfinite(values), values, np.inf), axis=0, initial=np.inf)
    high = np.max(np.where(np.isfinite(values), values, -np.inf), axis=0, initial=-np.inf)
    return Series(steps, mean), low, high


def _mean_band(ax: Axes, series: Sequence[Series], colour: Any, *, smoothing: float,
               label: str | None, gid: str, linestyle: str = "-") -> None:
    """The seed mean as a curve (smoothed like :func:`_curve`) over a min–max band."""
    mean, low, high = seed_mean(series)
    ax.fill_between(mean.steps, low, high, color=colour, alpha=0.18, linewidth=0)
    _curve(ax, mean, colour, smoothing=smoothing, label=label, linestyle=linestyle, gid=gid)


def _group_panels(count: int) -> tuple[Figure, np.ndarray]:
    rows, cols = _grid(count)
    return _new_figure(rows, cols, width=4.4 * cols + 1.5, height=3.3 * rows, sharey=True)


@COMPARISON_FIGURES.register("compare_accuracy")
def compare_accuracy_figure(table: ComparisonTable, aggregate: SeedAggregateTable | None,
                            smoothing: float) -> Drawn:
    """One panel per common task: its accuracy vs step per run, or per method (mean, band)."""
    colours, legend = _run_colours(table, aggregate), _first_of_group(table, aggregate)
    rows, cols = _grid(len(table.tasks))
    figure, axes = _new_figure(rows, cols, width=4.6 * cols + 1.5, height=3.4 * rows,
                               sharey=True)
    # train accuracy is per batch, noisy; eval accuracy is a fixed test set, drawn as measured
    smooth = smoothing if table.split == "train" else 0.0
    groups = _groups(table, aggregate)
    for ax, task in zip(axes.flat, table.tasks, strict=False):
        for method, members in groups.items():
            series = [table.histories[m].task_series(task, "accuracy", table.split)
                      for m in members]
            if len(members) > 1:
                _mean_band(ax, series, colours[members[0]], smoothing=smooth,
                           label=f"{method} (n = {len(members)})", gid=f"{method}:{task}")
                continue
            _curve(ax, series[0], colours[members[0]], smoothing=smooth,
                   label=legend[members[0]], gid=f"{members[0]}:{task}")
        ax.set_ylim(-0.02, 1.02)
        _finish(ax, title=task, ylabel=f"{table.split} accuracy")
    for ax in list(axes.flat)[len(table.tasks):]:
        ax.set_visible(False)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    # "outside" locations need the constrained layout _new_figure sets
    figure.legend(handles, labels, loc="outside right upper", fontsize=8)
    figure.suptitle(f"Per-task {table.split} accuracy", fontweight="bold")
    return Drawn(figure)


@COMPARISON_FIGURES.register("compare_worst")
def compare_worst_figure(table: ComparisonTable, aggregate: SeedAggregateTable | None,
                         smoothing: float) -> Drawn:
    """Worst-task accuracy vs step per run, or per method: mean with a min–max band."""
    colours, legend = _run_colours(table, aggregate), _first_of_group(table, aggregate)
    curves = {label: accuracy_curve(h, table.split, table.tasks)
              for label, h in table.histories.items()}
    figure, axes = _new_figure(width=10.0)
    ax = axes[0, 0]
    skipped: list[str] = []
    groups = _groups(table, aggregate)
    for method, members in groups.items():
        if len(members) > 1 and _band(ax, [curves[m] for m in members],
                                      colours[members[0]], method):
            continue
        if len(members) > 1:
            skipped.append(f"compare_worst: {method}: its runs share no step with every task "
                           "measured; drawn run by run")
        for member in members:
            curve = curves[member]
            ax.plot(curve.steps[curve.complete], curve.worst[curve.complete],
                    color=colours[member], linewidth=1.8, label=legend[member], gid=member)
    ax.set_ylim(-0.02, 1.02)
    for threshold in table.thresholds:
        ax.axhline(threshold, color="grey", linestyle=":", linewidth=0.9)
    band = " (mean over seeds, band: min–max)" if aggregate is not None else ""
    _finish(ax, title=f"Worst-task {table.split} accuracy{band}",
            ylabel=f"worst-task accuracy ({len(table.tasks)} tasks)")
    _legend(ax, len(groups))
    return Drawn(figure, tuple(skipped))


def _band(ax: Axes, curves: Sequence[Any], colour: Any, label: str) -> bool:
    """Mean worst-task curve with a min–max band over the steps every curve has; False if none."""
    steps = None
    for curve in curves:
        own = curve.steps[curve.complete]
        # only steps every seed measured fully: a worst over fewer seeds is another quantity
        steps = own if steps is None else np.intersect1d(steps, own)
    if steps is None or not len(steps):
        return False
    worst = np.stack([c.worst[np.searchsorted(c.steps, steps)] for c in curves])  # [S, T]
    ax.fill_between(steps, worst.min(axis=0), worst.max(axis=0), color=colour, alpha=0.2,
                    linewidth=0)
    ax.plot(steps, worst.mean(axis=0), color=colour, linewidth=2.2,
            label=f"{label} (n = {len(curves)})", gid=label)
    return True


@COMPARISON_FIGURES.register("compare_weights")
def compare_weights_figure(table: ComparisonTable, aggregate: SeedAggregateTable | None,
                           smoothing: float) -> Drawn:
    """The final task weights of every run, grouped by run, one bar colour per task."""
    runs = [run for run in table.runs if run.final_weights]
    skipped = tuple(f"compare_weights: {run.label}: no tasks/<task>/weight logged"
                    for run in table.runs if not run.final_weights)
    if not runs:
        return Drawn(None, ("compare_weights: no run logged task weights",))
    colours = task_colours(table.tasks)
    figure, axes = _new_figure(width=min(16.0, 3.0 + 0.45 * len(runs) * len(table.tasks)))
    ax = axes[0, 0]
    width = 0.8 / len(table.tasks)  # a run's bars fill 0.8 of its slot: a gap between runs
    positions = np.arange(len(runs))
    for k, task in enumerate(table.tasks):
        heights = [run.final_weights.get(task, np.nan) for run in runs]
        ax.bar(positions + (k - (len(table.tasks) - 1) / 2) * width, heights, width,
               color=colours[task], label=task)
    ax.axhline(1.0 / len(table.tasks), color="grey", linestyle=":", linewidth=1.2,
               label="uniform 1/K")
    ax.set_xticks(positions)
    ax.set_xticklabels([run.label for run in runs], rotation=20, ha="right")
    _finish(ax, title="Final task weights", ylabel="task weight z_k", xlabel="run")
    _legend(ax, len(table.tasks) + 1, outside=True)  # bars fill the axes
    return Drawn(figure, skipped)


def _groups_logging(table: ComparisonTable, aggregate: SeedAggregateTable | None, metric: str,
                    figure_name: str) -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
    """The run groups of which some member logged ``tasks/<task>/<metric>``, and a skip note
    for each group that did not."""
    groups = _groups(table, aggregate)
    logged = {name: members for name, members in groups.items()
              if any(table.histories[m].tasks_with(metric, "train") for m in members)}
    skipped = tuple(f"{figure_name}: {name}: no tasks/<task>/{metric} logged"
                    for name in groups if name not in logged)
    return logged, skipped


def _close_panels(figure: Figure, axes: np.ndarray, used: int, title: str) -> None:
    """Hide the unused panels; one legend (the first panel's) and the title for the figure."""
    for ax in list(axes.flat)[used:]:
        ax.set_visible(False)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside right upper", fontsize=8)
    figure.suptitle(title, fontweight="bold")


@COMPARISON_FIGURES.register("compare_weight_curves")
def compare_weight_curves_figure(table: ComparisonTable, aggregate: SeedAggregateTable | None,
                                 smoothing: float) -> Drawn:
    """One panel per run or method: each task's weight ``z_k`` vs step (mean over seeds)."""
    logged, skipped = _groups_logging(table, aggregate, "weight", "compare_weight_curves")
    if not logged:
        return Drawn(None, ("compare_weight_curves: no run logged task weights",))
    colours = task_colours(table.tasks)
    figure, axes = _group_panels(len(logged))
    top = 1.0 / len(table.tasks)
    for ax, (name, members) in zip(axes.flat, logged.items(), strict=False):
        for task in table.tasks:
            series = [table.histories[m].task_series(task, "weight", "train") for m in members]
            mean = seed_mean(series)[0]
            _curve(ax, mean, colours[task], smoothing=0.0, label=task, gid=f"{name}:{task}")
            top = max(top, float(np.max(mean.values, initial=0.0)))
        ax.axhline(1.0 / len(table.tasks), color="grey", linestyle=":", linewidth=1.2)
        _finish(ax, title=name, ylabel="task weight z_k")
    axes[0, 0].set_ylim(0.0, min(1.02, 1.1 * top))  # shared y: every panel's curves inside
    _close_panels(figure, axes, len(logged), "Task weights (dotted: uniform 1/K)")
    return Drawn(figure, skipped)


@COMPARISON_FIGURES.register("compare_composition")
def compare_composition_figure(table: ComparisonTable, aggregate: SeedAggregateTable | None,
                               smoothing: float) -> Drawn:
    """One panel per run or method: realised batch share (solid) against the target (dashed).

    The target is ``tasks/<t>/target_share`` where logged, else the weight; both are means
    over the seeds, and the realised share is smoothed over its raw points.
    """
    logged, skipped = _groups_logging(table, aggregate, "batch_share", "compare_composition")
    if not logged:
        return Drawn(None, ("compare_composition: no run logged its batch composition",))
    colours = task_colours(table.tasks)
    figure, axes = _group_panels(len(logged))
    for ax, (name, members) in zip(axes.flat, logged.items(), strict=False):
        histories = [table.histories[m] for m in members]
        for task in table.tasks:
            shares = [h.task_series(task, "batch_share", "train") for h in histories]
            _curve(ax, seed_mean(shares)[0], colours[task], smoothing=smoothing, label=task,
                   gid=f"share:{name}:{task}")
            key = ("target_share" if any(h.has(f"tasks/{task}/target_share", "train")
                                         for h in histories) else "weight")
            targets = [h.task_series(task, key, "train") for h in histories]
            _curve(ax, seed_mean(targets)[0], colours[task], smoothing=0.0, label=None,
                   linestyle="--", gid=f"target:{name}:{task}")
        ax.set_ylim(-0.02, 1.02)
        _finish(ax, title=name, ylabel="share of the trained batch")
    _close_panels(figure, axes, len(logged),
                  "Batch composition: realised share (solid) vs target (dashed)")
    return Drawn(figure, skipped)


def plot_comparison(
    table: ComparisonTable,
    out_dir: str | Path,
    *,
    aggregate: SeedAggregateTable | None = None,
    smoothing: float = DEFAULT_SMOOTHING,
    figures: Sequence[str] | None = None,
) -> PlotResult:
    """Write the figures comparing the runs of ``table`` as ``<out_dir>/<figure>.png``.

    With ``aggregate`` (from :func:`~mtgrpo.reporting.compare.aggregate_seeds`), the runs of one
    method share a colour and ``compare_worst`` draws their mean with a min–max band.
    ``smoothing`` applies only when the table is on the train split.
    """
    ema(np.zeros(0), smoothing)  # validate before drawing
    names = [COMPARISON_FIGURES.canonical(n) for n in (figures or COMPARISON_FIGURES.names())]
    if not table.histories:
        raise ValueError("the comparison table carries no run histories to plot; build it "
                         "with compare_runs")
    drawn = ((name, COMPARISON_FIGURES.get(name)(table, aggregate, smoothing))
             for name in names)
    return _save_all(drawn, Path(out_dir))
