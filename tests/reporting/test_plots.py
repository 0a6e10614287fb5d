"""Run and comparison figures: files written, what is drawn, and what is left out and why.

Figures are checked through their artists (lines carry a ``gid`` naming what they show) on
small synthetic logs: two or three tasks, train and eval records, nulls, a run without eval.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mtgrpo.reporting.compare import Series, aggregate_seeds, compare_runs, load_run
from mtgrpo.reporting.plots import (
    COMPARISON_FIGURES,
    RUN_FIGURES,
    RunPlotContext,
    ema,
    plot_comparison,
    plot_run,
    plot_run_figures,
    seed_mean,
    task_colours,
)

TASKS = ("countdown:easy", "countdown:hard", "zebra")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MIN_PNG_BYTES = 5_000  # a figure with axes, text and curves is tens of KB; an empty one ~2 KB


def write_run(directory: Path, records: Sequence[dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(record) + "\n" for record in records)
    (directory / "metrics.jsonl").write_text(text, encoding="utf-8")
    return directory


def synthetic_records(
    tasks: Sequence[str] = TASKS,
    steps: int = 12,
    *,
    with_eval: bool = True,
    with_weights: bool = True,
    with_composition: bool = True,
    with_filter: bool = True,
    offset: float = 0.0,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Train records every step, eval every 4 steps; task k improves from 0.1 (k + 1)."""
    rng = np.random.default_rng(seed)
    records = []
    for step in range(1, steps + 1):
        train: dict[str, Any] = {"step": step, "split": "train", "loss": float(rng.normal()),
                                 "time/step": 1.0 + 0.1 * step}
        for k, task in enumerate(tasks):
            base = min(1.0, 0.1 * (k + 1) + 0.04 * step + offset)
            prefix = f"tasks/{task}/"
            train[prefix + "accuracy"] = float(np.clip(base + rng.normal(0, 0.05), 0, 1))
            train[prefix + "zero_gradient_rate"] = float(rng.uniform(0, 0.6))
            if with_weights:
                train[prefix + "weight"] = (1 + 0.05 * k * step) / len(tasks)
            if with_composition:
                train[prefix + "batch_share"] = float(1 / len(tasks) + rng.normal(0, 0.03))
                train[prefix + "target_share"] = 1 / len(tasks)
            if with_filter:
                train[prefix + "filter_rate"] = None if step == 2 else float(rng.uniform(0, .5))
        records.append(train)
        if with_eval and step % 4 == 0:
            records.append({"step": step, "split": "eval", **{
                f"tasks/{task}/accuracy": min(1.0, 0.1 * (k + 1) + 0.04 * step + offset)
                for k, task in enumerate(tasks)}})
    records[0][f"tasks/{tasks[0]}/accuracy"] = None  # a NaN logged as null
    return records


def lines_by_gid(figure: Any) -> dict[str, Any]:
    return {line.get_gid(): line for ax in figure.axes for line in ax.get_lines()
            if line.get_gid() is not None}


def draw(name: str, records: Sequence[dict[str, Any]], smoothing: float = 0.6) -> Any:
    history = load_run(records)
    return RUN_FIGURES.get(name)(RunPlotContext(history, task_colours(history.tasks), smoothing))


def assert_png(path: Path) -> None:
    assert path.is_file()
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert path.stat().st_size > MIN_PNG_BYTES


# ----------------------------------------------------------------------------- helpers


def test_ema_by_hand() -> None:
    # s = .5, x = (1, NaN, 3): m1 = .5 -> y1 = .5 / (1 − .5) = 1; the NaN stays NaN;
    # m2 = .5 · .5 + .5 · 3 = 1.75 -> y2 = 1.75 / (1 − .25) = 7/3
    out = ema(np.array([1.0, np.nan, 3.0]), 0.5)
    np.testing.assert_allclose(out[[0, 2]], [1.0, 7.0 / 3.0], rtol=0, atol=1e-12)
    assert np.isnan(out[1])
    np.testing.assert_array_equal(ema(np.array([0.2, 0.7]), 0.0), [0.2, 0.7])


def test_ema_matches_the_closed_form_weighted_mean() -> None:
    # y_n = Σ_i s^(n−i) x_i / Σ_i s^(n−i) over the finite values seen so far
    rng = np.random.default_rng(0)
    for _ in range(20):
        values = rng.normal(size=int(rng.integers(1, 30)))
        values[rng.random(len(values)) < 0.2] = np.nan
        smoothing = float(rng.uniform(0, 0.95))
        finite = values[np.isfinite(values)]
        powers = [smoothing ** (len(finite[: n + 1]) - 1 - np.arange(n + 1))
                  for n in range(len(finite))]
        expected = [float(np.dot(w, finite[: n + 1]) / w.sum()) for n, w in enumerate(powers)]
        got = ema(values, smoothing)
        np.testing.assert_allclose(got[np.isfinite(values)], expected, rtol=1e-10, atol=1e-12)
        assert np.isnan(got[~np.isfinite(values)]).all()


@pytest.mark.parametrize("smoothing", [-0.1, 1.0])
def test_ema_rejects_smoothing_outside_0_1(smoothing: float) -> None:
    with pytest.raises(ValueError, match=r"smoothing must be in \[0, 1\)"):
        ema(np.zeros(3), smoothing)


@pytest.mark.parametrize("num_tasks", [3, 12, 25])
def test_task_colours_are_distinct_and_stable(num_tasks: int) -> None:
    tasks = [f"task{k}" for k in range(num_tasks)]
    colours = task_colours(tasks)
    assert list(colours) == tasks
    assert len({tuple(np.round(c, 6)) for c in colours.values()}) == num_tasks
    assert task_colours(tasks) == colours


# ----------------------------------------------------------------------------- run figures


def test_plot_run_writes_every_figure_under_run_dir_report(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", synthetic_records())
    result = plot_run_figures(run)
    assert [p.name for p in result.written] == ["accuracy.png", "composition.png",
                                                "weights.png", "zero_gradient.png"]
    assert all(p.parent == run / "report" for p in result.written)
    for path in result.written:
        assert_png(path)
    assert result.skipped == []


def test_accuracy_figure_draws_tasks_worst_and_average() -> None:
    figure = draw("accuracy", synthetic_records()).figure
    lines = lines_by_gid(figure)
    eval_lines = [gid for gid in lines if gid.startswith("eval:")]
    # eval is primary: one line per task + worst + average, and the faded train lines
    assert len([*eval_lines, "worst", "average"]) == len(TASKS) + 2
    assert {"worst", "average"} <= set(lines)
    assert sorted(gid for gid in lines if gid.startswith("train:")) == sorted(
        f"train:{t}" for t in TASKS)
    assert len(figure.axes[0].get_lines()) == 2 * len(TASKS) + 2
    # eval at steps 4, 8, 12: task k at 0.1 (k + 1) + 0.04 step -> worst is task 0, average
    # is task 1 (the middle of three evenly spaced values)
    steps = np.array([4, 8, 12])
    np.testing.assert_allclose(lines["worst"].get_xdata(), steps)
    np.testing.assert_allclose(lines["worst"].get_ydata(), 0.1 + 0.04 * steps, atol=1e-12)
    np.testing.assert_allclose(lines["average"].get_ydata(), 0.2 + 0.04 * steps, atol=1e-12)
    assert lines["eval:zebra"].get_linestyle() == "-"
    assert lines["train:zebra"].get_linestyle() == "--"
    assert lines["train:zebra"].get_alpha() < 1
    # one colour per task in every figure: the train and eval lines of a task share it
    assert lines["train:zebra"].get_color() == lines["eval:zebra"].get_color()


def test_a_run_without_eval_plots_train_accuracy_and_says_so() -> None:
    drawn = draw("accuracy", synthetic_records(with_eval=False), smoothing=0.0)
    lines = lines_by_gid(drawn.figure)
    assert len(drawn.figure.axes[0].get_lines()) == len(TASKS) + 2
    assert not any(gid.startswith("eval:") for gid in lines)
    assert lines["train:zebra"].get_linestyle() == "-"
    assert drawn.skipped == ("accuracy: no eval records, so the curves are train-batch accuracy",)
    # step 1 has a null for countdown:easy: worst / average start at step 2 (rule 1)
    assert lines["worst"].get_xdata()[0] == 2


def test_smoothing_keeps_the_raw_points_visible() -> None:
    records = synthetic_records(with_eval=False)
    ax = draw("accuracy", records, smoothing=0.6).figure.axes[0]
    scatters = ax.collections  # one scatter of raw points per task
    assert len(scatters) == len(TASKS)
    raw = load_run(records).task_series("zebra", "accuracy", "train").finite()
    zebra = next(s for s in scatters if len(s.get_offsets()) == len(raw)
                 and np.allclose(s.get_offsets()[:, 1], raw.values))
    np.testing.assert_allclose(zebra.get_offsets()[:, 0], raw.steps)
    smoothed = lines_by_gid(ax.figure)["train:zebra"].get_ydata()
    np.testing.assert_allclose(smoothed, ema(raw.values, 0.6), atol=1e-12)


def test_weights_figure_lines_and_uniform_level() -> None:
    figure = draw("weights", synthetic_records()).figure
    lines = lines_by_gid(figure)
    assert sorted(lines) == sorted(f"weight:{t}" for t in TASKS)
    np.testing.assert_allclose(lines["weight:zebra"].get_ydata(),
                               (1 + 0.1 * np.arange(1, 13)) / 3, atol=1e-12)
    uniform = [ln for ln in figure.axes[0].get_lines() if ln.get_gid() is None]
    assert len(uniform) == 1
    assert uniform[0].get_ydata()[0] == pytest.approx(1 / 3, abs=1e-12)


def test_composition_uses_the_weight_when_no_target_share_is_logged() -> None:
    records = synthetic_records()
    for record in records:
        record.pop("tasks/zebra/target_share", None)
        record.pop("tasks/countdown:hard/batch_share", None)
    drawn = draw("composition", records)
    lines = lines_by_gid(drawn.figure)
    assert sorted(g for g in lines if g.startswith("share:")) == [
        "share:countdown:easy", "share:zebra"]
    assert lines["target:zebra"].get_label() == "weight"
    assert lines["target:countdown:easy"].get_label() == "target share"
    assert drawn.skipped == ("composition: countdown:hard: no tasks/countdown:hard/batch_share",)


def test_zero_gradient_figure_without_filter_rate_has_one_panel() -> None:
    drawn = draw("zero_gradient", synthetic_records(with_filter=False))
    assert len(drawn.figure.axes) == 1
    assert len(lines_by_gid(drawn.figure)) == len(TASKS)
    assert drawn.skipped == ("zero_gradient: no tasks/<task>/filter_rate in the train records",)
    full = draw("zero_gradient", synthetic_records())
    assert len(full.figure.axes) == 2


def test_missing_metrics_skip_figures_without_crashing(tmp_path: Path) -> None:
    records = synthetic_records(with_eval=False, with_weights=False, with_composition=False,
                                with_filter=False)
    result = plot_run_figures(records, tmp_path / "out", smoothing=0.0)
    assert [p.name for p in result.written] == ["accuracy.png", "zero_gradient.png"]
    for path in result.written:
        assert_png(path)
    assert "weights: no tasks/<task>/weight in the train records" in result.skipped
    assert "composition: no tasks/<task>/batch_share in the train records" in result.skipped
    only_loss = [{"step": 1, "split": "train", "loss": 0.5}]
    empty = plot_run_figures(only_loss, tmp_path / "none")
    assert empty.written == []
    assert "accuracy: no tasks/<task>/accuracy in any record" in empty.skipped


def test_plot_run_arguments_are_checked_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs out_dir when given records"):
        plot_run(synthetic_records())
    with pytest.raises(ValueError, match="unknown run figure 'acc'; valid names: accuracy"):
        plot_run(synthetic_records(), tmp_path, figures=["acc"])
    with pytest.raises(FileNotFoundError, match=r"no metrics\.jsonl"):
        plot_run(tmp_path)
    assert plot_run(synthetic_records(), tmp_path, figures=["weights"]) == [
        tmp_path / "weights.png"]


# ----------------------------------------------------------------------------- comparison


def seeded_runs(root: Path) -> list[Path]:
    """grpo with seeds 1, 2 and mtgrpo with seeds 1, 2 (mtgrpo 0.1 better on every task)."""
    return [write_run(root / f"{method}-seed{seed}",
                      synthetic_records(offset=offset + 0.01 * seed, seed=seed))
            for method, offset in (("grpo", 0.0), ("mtgrpo", 0.1)) for seed in (1, 2)]


def test_plot_comparison_writes_every_figure(tmp_path: Path) -> None:
    table = compare_runs(seeded_runs(tmp_path / "runs"))
    result = plot_comparison(table, tmp_path / "cmp")
    assert [p.name for p in result.written] == [
        "compare_accuracy.png", "compare_composition.png", "compare_weight_curves.png",
        "compare_weights.png", "compare_worst.png"]
    for path in result.written:
        assert_png(path)


def test_compare_accuracy_has_a_panel_per_task_and_a_line_per_run(tmp_path: Path) -> None:
    table = compare_runs(seeded_runs(tmp_path))
    figure = COMPARISON_FIGURES.get("compare_accuracy")(table, None, 0.6).figure
    visible = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == list(TASKS)
    assert all(len(ax.get_lines()) == 4 for ax in visible)


def test_compare_worst_per_run_and_per_method_with_a_band(tmp_path: Path) -> None:
    table = compare_runs(seeded_runs(tmp_path))
    per_run = lines_by_gid(COMPARISON_FIGURES.get("compare_worst")(table, None, 0.0).figure)
    assert sorted(per_run) == sorted(table.labels)
    aggregate = aggregate_seeds(table)
    drawn = COMPARISON_FIGURES.get("compare_worst")(table, aggregate, 0.0)
    lines = lines_by_gid(drawn.figure)
    assert sorted(lines) == ["grpo", "mtgrpo"]
    # worst task is countdown:easy: 0.1 + 0.04 step + offset + 0.01 seed; the mean over
    # seeds 1, 2 adds 0.015; the band spans seed 1 to seed 2
    steps = np.array([4, 8, 12])
    np.testing.assert_allclose(lines["mtgrpo"].get_ydata(), 0.1 + 0.04 * steps + 0.115,
                               atol=1e-12)
    bands = drawn.figure.axes[0].collections
    assert len(bands) == 2
    low, high = bands[1].get_paths()[0].vertices[:, 1].min(), 0.1 + 0.04 * 12 + 0.12
    assert low == pytest.approx(0.1 + 0.04 * 4 + 0.11, abs=1e-12)
    assert bands[1].get_paths()[0].vertices[:, 1].max() == pytest.approx(high, abs=1e-12)


def test_compare_weights_bars_per_run_and_task(tmp_path: Path) -> None:
    runs = seeded_runs(tmp_path)
    no_weights = write_run(tmp_path / "uniform", synthetic_records(with_weights=False))
    table = compare_runs([*runs, no_weights])
    drawn = COMPARISON_FIGURES.get("compare_weights")(table, None, 0.0)
    bars = drawn.figure.axes[0].patches
    assert len(bars) == len(runs) * len(TASKS)  # the run without weights has no bars
    # final weight of zebra (k = 2) at step 12: (1 + 0.05 · 2 · 12) / 3
    assert max(bar.get_height() for bar in bars) == pytest.approx(2.2 / 3, abs=1e-12)
    assert drawn.skipped == ("compare_weights: uniform: no tasks/<task>/weight logged",)
    only_uniform = compare_runs([no_weights])
    skipped = COMPARISON_FIGURES.get("compare_weights")(only_uniform, None, 0.0)
    assert skipped.figure is None
    assert skipped.skipped == ("compare_weights: no run logged task weights",)


def test_seed_mean_averages_the_runs_that_have_a_value_at_each_step() -> None:
    # step 1: runs a, b -> mean 0.2, range [0.1, 0.3]; step 2: only b (a is NaN) -> 0.5;
    # step 3: only a -> 0.7; a step no run has is left out
    a = Series(np.array([1, 2, 3]), np.array([0.1, np.nan, 0.7]))
    b = Series(np.array([1, 2]), np.array([0.3, 0.5]))
    mean, low, high = seed_mean([a, b])
    np.testing.assert_array_equal(mean.steps, [1, 2, 3])
    np.testing.assert_allclose(mean.values, [0.2, 0.5, 0.7], atol=1e-15)
    np.testing.assert_allclose(low, [0.1, 0.5, 0.7], atol=1e-15)
    np.testing.assert_allclose(high, [0.3, 0.5, 0.7], atol=1e-15)


def test_seed_mean_matches_a_loop_over_random_runs() -> None:
    rng = np.random.default_rng(3)
    runs = []
    for _ in range(4):
        steps = np.sort(rng.choice(30, size=12, replace=False))
        values = rng.random(12)
        values[rng.random(12) < 0.2] = np.nan
        runs.append(Series(steps, values))
    mean, low, high = seed_mean(runs)
    for t, step in enumerate(mean.steps.tolist()):
        present = [float(r.values[r.steps == step][0]) for r in runs
                   if step in r.steps and np.isfinite(r.values[r.steps == step][0])]
        assert present, "a step without any finite value must be left out"
        assert mean.values[t] == pytest.approx(sum(present) / len(present), abs=1e-12)
        assert (low[t], high[t]) == (min(present), max(present))


def test_compare_accuracy_draws_the_seed_mean_per_method(tmp_path: Path) -> None:
    table = compare_runs(seeded_runs(tmp_path))
    drawn = COMPARISON_FIGURES.get("compare_accuracy")(table, aggregate_seeds(table), 0.0)
    lines = lines_by_gid(drawn.figure)
    assert sorted(lines) == sorted(f"{m}:{t}" for m in ("grpo", "mtgrpo") for t in TASKS)
    # eval accuracy of zebra (k = 2): 0.3 + 0.04 step + offset + 0.01 seed; seeds 1, 2 of
    # mtgrpo (offset 0.1) average to 0.3 + 0.04 step + 0.115
    steps = np.array([4, 8, 12])
    np.testing.assert_allclose(lines["mtgrpo:zebra"].get_ydata(), 0.3 + 0.04 * steps + 0.115,
                               atol=1e-12)
    assert all(len(ax.collections) == 2 for ax in drawn.figure.axes if ax.get_visible())


def test_compare_weight_curves_panel_per_method_and_skips_unweighted(tmp_path: Path) -> None:
    runs = seeded_runs(tmp_path)
    no_weights = write_run(tmp_path / "uniform-seed1", synthetic_records(with_weights=False))
    table = compare_runs([*runs, no_weights])
    drawn = COMPARISON_FIGURES.get("compare_weight_curves")(table, aggregate_seeds(table), 0.0)
    visible = [ax for ax in drawn.figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["grpo", "mtgrpo"]
    lines = lines_by_gid(drawn.figure)
    # zebra (k = 2) at step s: (1 + 0.05 · 2 · s) / 3 in both seeds, so the mean is the same
    steps = np.arange(1, 13)
    np.testing.assert_allclose(lines["grpo:zebra"].get_ydata(), (1 + 0.1 * steps) / 3,
                               atol=1e-12)
    # the shared y axis reaches the largest weight of any panel: (1 + 0.1 · 12) / 3
    assert all(ax.get_ylim()[1] >= 2.2 / 3 for ax in visible)
    assert drawn.skipped == ("compare_weight_curves: uniform: no tasks/<task>/weight logged",)
    alone = COMPARISON_FIGURES.get("compare_weight_curves")(compare_runs([no_weights]), None, 0)
    assert alone.figure is None
    assert alone.skipped == ("compare_weight_curves: no run logged task weights",)


def test_compare_composition_share_against_target_per_method(tmp_path: Path) -> None:
    runs = seeded_runs(tmp_path)
    no_target = write_run(tmp_path / "weights_only-seed1",
                          [{k: v for k, v in r.items() if not k.endswith("/target_share")}
                           for r in synthetic_records()])
    table = compare_runs([*runs, no_target])
    drawn = COMPARISON_FIGURES.get("compare_composition")(table, aggregate_seeds(table), 0.0)
    lines = lines_by_gid(drawn.figure)
    assert [ax.get_title() for ax in drawn.figure.axes if ax.get_visible()] == [
        "grpo", "mtgrpo", "weights_only"]
    np.testing.assert_allclose(lines["target:mtgrpo:countdown:easy"].get_ydata(), 1 / 3,
                               atol=1e-12)
    # without target_share the target is the weight: zebra (1 + 0.1 s) / 3
    np.testing.assert_allclose(lines["target:weights_only:zebra"].get_ydata(),
                               (1 + 0.1 * np.arange(1, 13)) / 3, atol=1e-12)
    history = table.histories["mtgrpo-seed1"], table.histories["mtgrpo-seed2"]
    shares = [h.task_series("zebra", "batch_share", "train").values for h in history]
    np.testing.assert_allclose(lines["share:mtgrpo:zebra"].get_ydata(), np.mean(shares, axis=0),
                               atol=1e-12)
    none = write_run(tmp_path / "none", synthetic_records(with_composition=False))
    empty = COMPARISON_FIGURES.get("compare_composition")(compare_runs([none]), None, 0.0)
    assert empty.figure is None
    assert empty.skipped == ("compare_composition: no run logged its batch composition",)
