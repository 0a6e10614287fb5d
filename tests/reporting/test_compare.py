"""Run summaries, comparison tables, Δm%, seed aggregation and the ``report`` / ``compare`` CLIs.

Expectations are worked out by hand from the formulas of ``ALGORITHMS.md`` §6 on small logs
written to temporary run directories.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mtgrpo.cli import COMMANDS, main
from mtgrpo.cli import compare as compare_cli
from mtgrpo.cli import report as report_cli
from mtgrpo.reporting.compare import (
    RunHistory,
    Spread,
    accuracy_curve,
    aggregate_seeds,
    compare_runs,
    delta_m,
    load_run,
    method_of_label,
    parse_thresholds,
    steps_to_threshold,
    summarize_run,
    summarize_tasks,
)

TOL = 1e-12
TASKS = ("a", "b:easy", "c")


def write_run(directory: Path, records: Sequence[dict[str, Any]]) -> Path:
    """A run directory whose metrics.jsonl holds ``records`` (None is JSON null)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps(record) for record in records)
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def eval_record(step: int, accuracy: dict[str, float | None]) -> dict[str, Any]:
    return {"step": step, "split": "eval",
            **{f"tasks/{task}/accuracy": value for task, value in accuracy.items()}}


def train_record(step: int, accuracy: dict[str, float | None], **extra: Any) -> dict[str, Any]:
    return {"step": step, "split": "train",
            **{f"tasks/{task}/accuracy": value for task, value in accuracy.items()}, **extra}


# The hand-built eval log used below. Per step (a, b:easy, c):
#   0: (.10, .20, .30)  worst .10 (a)      average .20
#  10: (.35, .50, null) incomplete: no worst / average (rule 1)
#  20: (.45, .42, .60)  worst .42 (b:easy) average (.45 + .42 + .60) / 3 = .49
#  30: (.50, .41, .38)  worst .38 (c)      average (.50 + .41 + .38) / 3 = .43
EVAL = [
    eval_record(0, {"a": 0.10, "b:easy": 0.20, "c": 0.30}),
    eval_record(10, {"a": 0.35, "b:easy": 0.50, "c": None}),
    eval_record(20, {"a": 0.45, "b:easy": 0.42, "c": 0.60}),
    eval_record(30, {"a": 0.50, "b:easy": 0.41, "c": 0.38}),
]


def hand_run(directory: Path) -> Path:
    train = [
        train_record(step, {"a": 0.2, "b:easy": 0.3, "c": 0.4}, **{
            "time/step": time, "sampling/prompts_per_informative_group": 2.0,
            "tasks/a/weight": 0.5, "tasks/b:easy/weight": 0.3, "tasks/c/weight": 0.2,
        })
        for step, time in ((10, 1.0), (20, None), (30, 2.0))
    ]
    return write_run(directory, [EVAL[0], train[0], EVAL[1], train[1], EVAL[2], train[2],
                                 EVAL[3]])


# ----------------------------------------------------------------------------- history


def test_history_parses_tasks_with_colons_nulls_and_repeated_steps(tmp_path: Path) -> None:
    records = [*EVAL, eval_record(30, {"a": 0.55}), {"step": 3}, {"split": "eval"}]
    history = load_run(write_run(tmp_path / "r", records))
    assert history.tasks == TASKS  # first-appearance order, ':' kept
    assert history.splits == ("eval",)
    assert history.ignored_records == 2  # no split / no step
    a = history.task_series("a", "accuracy", "eval")
    assert a.steps.tolist() == [0, 10, 20, 30]
    assert a.values[-1] == pytest.approx(0.55, abs=TOL)  # the later record of step 30 wins
    c = history.task_series("c", "accuracy", "eval")
    assert math.isnan(c.values[1])  # null -> NaN
    assert c.finite().steps.tolist() == [0, 20, 30]
    assert history.primary_split() == "eval"
    assert history.last_step == 30


def test_load_run_errors_name_the_path_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no metrics\.jsonl; pass a run directory"):
        load_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"loss": 1.0}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="holds no record with a 'step'"):
        load_run(tmp_path)


def test_method_comes_from_config_yaml(tmp_path: Path) -> None:
    run = hand_run(tmp_path / "r")
    (run / "config.yaml").write_text(
        "training:\n  task_weighting: mt_grpo\n  batch_construction: ratio_preserving\n",
        encoding="utf-8")
    assert load_run(run).method == "mt_grpo + ratio_preserving"
    (run / "config.yaml").write_text("training: [unclosed\n", encoding="utf-8")
    assert load_run(run).method is None  # a malformed config only loses the label


# ----------------------------------------------------------------------------- per-run numbers


def test_summary_matches_hand_computed_worst_average_and_thresholds(tmp_path: Path) -> None:
    summary = summarize_run(load_run(hand_run(tmp_path / "r")), thresholds=(0.3, 0.4, 0.5))
    assert summary.split == "eval"
    assert summary.final_step == 30
    assert summary.final_worst == pytest.approx(0.38, abs=TOL)
    assert summary.final_worst_task == "c"
    assert summary.final_average == pytest.approx((0.50 + 0.41 + 0.38) / 3, abs=TOL)
    assert summary.best_worst == pytest.approx(0.42, abs=TOL)
    assert (summary.best_worst_step, summary.best_worst_task) == (20, "b:easy")
    assert summary.best_average == pytest.approx((0.45 + 0.42 + 0.60) / 3, abs=TOL)
    assert summary.best_average_step == 20
    # Step 10 has worst .35 over the measured tasks but c is missing: not counted (rule 1).
    assert summary.steps_to_threshold == {0.3: 20, 0.4: 20, 0.5: None}
    assert summary.final_accuracy == pytest.approx({"a": 0.50, "b:easy": 0.41, "c": 0.38})
    assert summary.time_per_step == pytest.approx(1.5, abs=TOL)  # mean of 1.0, null, 2.0
    assert summary.prompts_per_informative_group == pytest.approx(2.0, abs=TOL)
    assert summary.final_weights == pytest.approx({"a": 0.5, "b:easy": 0.3, "c": 0.2})
    assert summary.last_step == 30


def test_train_split_and_a_run_without_eval(tmp_path: Path) -> None:
    # train accuracy per step: (.2, .6), (.5, .4) -> worst .2 then .4, average .4 then .45
    run = write_run(tmp_path / "r", [train_record(1, {"x": 0.2, "y": 0.6}),
                                     train_record(2, {"x": 0.5, "y": 0.4})])
    history = load_run(run)
    assert history.primary_split() == "train"
    summary = summarize_run(history)
    assert summary.split == "train"
    assert (summary.final_worst, summary.final_worst_task) == (pytest.approx(0.4), "y")
    assert summary.best_average == pytest.approx(0.45, abs=TOL)
    assert summary.steps_to_threshold[0.4] == 2
    assert summary.time_per_step is None
    assert summary.final_weights == {}


def test_accuracy_curve_matches_a_loop_reference_on_random_logs() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        num_tasks, num_steps = int(rng.integers(1, 5)), int(rng.integers(1, 12))
        tasks = [f"t{k}:lvl" for k in range(num_tasks)]
        table = rng.random((num_steps, num_tasks))
        table[rng.random(table.shape) < 0.2] = np.nan
        records = [eval_record(10 * s, {t: None if np.isnan(v) else float(v)
                                        for t, v in zip(tasks, row, strict=True)})
                   for s, row in enumerate(table)]
        curve = accuracy_curve(RunHistory(records), "eval", tasks)
        for s, row in enumerate(table):
            values = [float(v) for v in row]
            if any(math.isnan(v) for v in values):
                assert math.isnan(curve.worst[s])
                assert curve.worst_index[s] == -1
                continue
            assert curve.worst[s] == pytest.approx(min(values), abs=TOL)
            assert curve.average[s] == pytest.approx(sum(values) / len(values), abs=TOL)
            assert tasks[curve.worst_index[s]] == tasks[values.index(min(values))]
        first = next((10 * s for s, row in enumerate(table)
                      if not np.isnan(row).any() and row.min() >= 0.5), None)
        assert steps_to_threshold(curve, 0.5) == first


def test_task_summaries(tmp_path: Path) -> None:
    rows = {row.task: row for row in summarize_tasks(load_run(hand_run(tmp_path / "r")))}
    # c: .30, null, .60, .38 -> final .38, best .60 at step 20
    assert rows["c"].final_accuracy == pytest.approx(0.38, abs=TOL)
    assert (rows["c"].best_accuracy, rows["c"].best_step) == (pytest.approx(0.60), 20)
    assert rows["a"].final_weight == pytest.approx(0.5, abs=TOL)
    assert rows["a"].mean_batch_share is None


# ----------------------------------------------------------------------------- Δm%


def test_delta_m_skips_zero_baseline_tasks() -> None:
    # a: (.50 − .50) / .50 = 0;  c: (.38 − .20) / .20 = .9;  b: baseline 0 -> skipped
    # Δm% = (0 + .9) / 2 · 100 = 45
    change = delta_m({"a": 0.50, "b": 0.41, "c": 0.38}, {"a": 0.50, "b": 0.0, "c": 0.20})
    assert change.value == pytest.approx(45.0, abs=1e-9)
    assert change.tasks == ("a", "c")
    assert change.skipped_zero_baseline == ("b",)
    assert delta_m({"a": 0.3}, {"a": 0.0}).value is None
    missing = delta_m({"a": math.nan}, {"a": 0.5, "b": 0.25})
    assert missing.missing == ("a", "b")
    assert missing.value is None


def test_delta_m_matches_a_loop_reference_on_random_accuracies() -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        k = int(rng.integers(1, 9))
        run, base = rng.random(k), rng.random(k)
        base[rng.random(k) < 0.3] = 0.0
        names = [f"t{i}" for i in range(k)]
        terms = [(r - b) / b for r, b in zip(run, base, strict=True) if b != 0]
        expected = 100 * sum(terms) / len(terms) if terms else None
        got = delta_m(dict(zip(names, run.tolist(), strict=True)),
                      dict(zip(names, base.tolist(), strict=True))).value
        assert got == (None if expected is None else pytest.approx(expected, rel=1e-12))


# ----------------------------------------------------------------------------- comparison


def test_compare_runs_against_a_baseline_with_a_zero_accuracy_task(tmp_path: Path) -> None:
    run = hand_run(tmp_path / "method")
    base = write_run(tmp_path / "base", [eval_record(30, {"a": 0.5, "b:easy": 0.0, "c": 0.2})])
    table = compare_runs([run], baseline=base)
    assert table.labels == ("base", "method")  # a baseline outside the list comes first
    assert table.baseline == "base"
    assert table.run("method").delta_m == pytest.approx(45.0, abs=1e-9)  # see the test above
    assert table.run("method").delta_m_skipped == ("b:easy",)
    assert table.run("base").delta_m == pytest.approx(0.0, abs=TOL)
    assert any("skips 1 task(s) with baseline accuracy 0" in note for note in table.notes())
    same = compare_runs([run, base], baseline="base")  # the baseline by label
    assert same.run("method").delta_m == pytest.approx(45.0, abs=1e-9)


def test_compare_runs_uses_common_tasks_and_unique_labels(tmp_path: Path) -> None:
    # run x/run: a .6, b .2, extra .1 ; run y/run: a .4, b .5 -> common (a, b), extra dropped
    first = write_run(tmp_path / "x" / "run", [eval_record(5, {"a": 0.6, "b": 0.2, "z": 0.1})])
    second = write_run(tmp_path / "y" / "run", [eval_record(5, {"a": 0.4, "b": 0.5})])
    table = compare_runs([first, second])
    assert table.tasks == ("a", "b")
    assert table.dropped_tasks == ("z",)
    assert table.labels == ("x/run", "y/run")
    assert table.run("x/run").final_worst == pytest.approx(0.2, abs=TOL)  # z (.1) left out
    assert table.run("y/run").final_average == pytest.approx(0.45, abs=TOL)
    labelled = compare_runs([first, second], labels=["one", "two"])
    assert labelled.labels == ("one", "two")


def test_runs_sharing_name_and_parent_are_labelled_by_their_full_path(tmp_path: Path) -> None:
    # a/x/run and b/x/run: "x/run" twice, so each label is the run's absolute path, written
    # once with its root ("/tmp/...", not "//tmp/...")
    first = write_run(tmp_path / "a" / "x" / "run", [eval_record(5, {"a": 0.6})])
    second = write_run(tmp_path / "b" / "x" / "run", [eval_record(5, {"a": 0.4})])
    table = compare_runs([first, second])
    assert table.labels == (first.resolve().as_posix(), second.resolve().as_posix())
    assert not any(label.startswith("//") for label in table.labels)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"split": "dev"}, ValueError, "unknown split 'dev'; valid splits: train, eval"),
        ({"thresholds": (50,)}, ValueError, r"fractions in \(0, 1\].*write 50% as 0.5"),
        ({"labels": ["only-one"]}, ValueError, "got 1 labels .* for 2 runs"),
        ({"labels": ["same", "same"]}, ValueError, "labels must be unique"),
        ({"baseline": "nowhere"}, FileNotFoundError, "neither a run directory nor the label"),
    ],
)
def test_compare_runs_rejects_bad_input(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    runs = [hand_run(tmp_path / "one"), hand_run(tmp_path / "two")]
    with pytest.raises(error, match=match):
        compare_runs(runs, **kwargs)


def test_compare_runs_explains_missing_eval_and_disjoint_tasks(tmp_path: Path) -> None:
    no_eval = write_run(tmp_path / "no-eval", [train_record(1, {"a": 0.5})])
    with pytest.raises(ValueError, match=r"no-eval.*no eval records.*--split train"):
        compare_runs([hand_run(tmp_path / "r"), no_eval])
    other = write_run(tmp_path / "other", [eval_record(1, {"q": 0.5})])
    with pytest.raises(ValueError, match="share no task"):
        compare_runs([hand_run(tmp_path / "r2"), other])


def test_markdown_and_json_outputs(tmp_path: Path) -> None:
    table = compare_runs([hand_run(tmp_path / "m|x"), hand_run(tmp_path / "b")], baseline="b")
    markdown = table.to_markdown()
    lines = markdown.splitlines()
    assert lines[0].startswith("| run | steps | worst | worst task | best worst (step) |")
    assert lines[1] == "| --- |" + " ---: |" * (lines[0].count("|") - 2)
    assert lines[2].startswith("| m\\|x | 30 | 38.0 | c | 42.0 (20) | 43.0 | 49.0 | 20 | 20 "
                               "| never | +0.0 | 1.50 | 2.00 |")
    assert "| run | a | b:easy | c |" in markdown
    assert "| b | 50.0 | 41.0 | 38.0 |" in markdown
    record = json.loads(table.to_json())
    assert record["baseline"] == "b"
    assert record["tasks"] == list(TASKS)
    assert record["runs"][0]["steps_to_threshold"] == {"0.3": 20, "0.4": 20, "0.5": None}
    assert record["runs"][1]["final_worst_task"] == "c"


def test_parse_thresholds() -> None:
    assert parse_thresholds("0.5, 0.3,0.4") == (0.3, 0.4, 0.5)
    with pytest.raises(ValueError, match="comma-separated fractions"):
        parse_thresholds("30%,40%")


# ----------------------------------------------------------------------------- seeds


@pytest.mark.parametrize(
    ("label", "method"),
    [("mtgrpo-seed1", "mtgrpo"), ("grpo_seed_2", "grpo"), ("dapo.seed=3", "dapo"),
     ("sec-s4", "sec"), ("lambda-0.25", "lambda-0.25"), ("tasks-9", "tasks-9"),
     ("seed1", "seed1")],
)
def test_method_of_label(label: str, method: str) -> None:
    assert method_of_label(label) == method


def test_spread_is_mean_sample_std_and_range() -> None:
    # values .3, .4, .5: mean .4; sample variance ((.1)² + 0 + (.1)²) / (3 − 1) = .01
    spread = Spread.of([0.3, None, 0.4, math.nan, 0.5])
    assert spread is not None
    assert (spread.mean, spread.std, spread.min, spread.max, spread.n) == (
        pytest.approx(0.4), pytest.approx(0.1), 0.3, 0.5, 3)
    assert spread.format(100.0) == "40.0 ± 10.0 [30.0–50.0]"
    single = Spread.of([0.7])
    assert single is not None
    assert single.std is None
    assert single.format(100.0) == "70.0"
    assert Spread.of([None, math.nan]) is None


def seed_run(directory: Path, worst: float, reach_step: int | None) -> Path:
    """Two tasks; worst-task accuracy 0.1 at step 10, then ``worst`` from ``reach_step``."""
    records = [eval_record(10, {"p": 0.1, "q": 0.9})]
    if reach_step is not None:
        records.append(eval_record(reach_step, {"p": worst, "q": 0.9}))
    return write_run(directory, records)


def test_aggregate_seeds_by_prefix(tmp_path: Path) -> None:
    runs = [seed_run(tmp_path / "mt-seed1", 0.5, 20), seed_run(tmp_path / "mt-seed2", 0.7, 40),
            seed_run(tmp_path / "mt-seed3", 0.6, None), seed_run(tmp_path / "grpo-seed1", 0.4, 30)]
    table = compare_runs(runs, thresholds=(0.5,))
    aggregate = aggregate_seeds(table)
    assert [m.method for m in aggregate.methods] == ["mt", "grpo"]
    mt = aggregate.methods[0]
    assert mt.members == ("mt-seed1", "mt-seed2", "mt-seed3")
    # final worst: .5, .7 and .1 (seed3 never left step 10) -> mean .4333, sample std
    values = [0.5, 0.7, 0.1]
    mean = sum(values) / 3
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
    assert mt.final_worst is not None
    assert mt.final_worst.mean == pytest.approx(mean, abs=TOL)
    assert mt.final_worst.std == pytest.approx(std, abs=TOL)
    assert (mt.final_worst.min, mt.final_worst.max) == (0.1, 0.7)
    # steps to worst ≥ .5: 20 and 40 (seed3 never): mean 30 over 2 runs that reached it
    assert mt.reached[0.5] == 2
    assert mt.steps_to_threshold[0.5] is not None
    assert mt.steps_to_threshold[0.5].mean == pytest.approx(30.0, abs=TOL)
    grpo = aggregate.methods[1]
    assert grpo.reached[0.5] == 0
    assert grpo.steps_to_threshold[0.5] is None
    assert grpo.final_worst is not None
    assert grpo.final_worst.std is None
    markdown = aggregate.to_markdown()
    assert "| mt | 3 | 43.3 ± 30.6 [10.0–70.0] |" in markdown
    assert "| 30 ± 14 [20–40] (2/3) |" in markdown
    assert json.loads(aggregate.to_json())["methods"][0]["reached"] == {"0.5": 2}


def test_aggregate_seeds_with_explicit_groups(tmp_path: Path) -> None:
    runs = [seed_run(tmp_path / "r1", 0.5, 20), seed_run(tmp_path / "r2", 0.7, 40)]
    table = compare_runs(runs)
    together = aggregate_seeds(table, group_by={"r1": "ours", "r2": "ours"})
    assert [m.members for m in together.methods] == [("r1", "r2")]
    assert together.methods[0].final_worst.mean == pytest.approx(0.6, abs=TOL)
    apart = aggregate_seeds([table], group_by="label")
    assert len(apart.methods) == 2
    with pytest.raises(ValueError, match=r"maps no method for runs \['r2'\]"):
        aggregate_seeds(table, group_by={"r1": "ours"})
    with pytest.raises(ValueError, match="unknown group_by 'suffix'"):
        aggregate_seeds(table, group_by="suffix")


# ----------------------------------------------------------------------------- CLIs


def run_cli(module: Any, argv: Sequence[str]) -> int:
    """Parse ``argv`` with the module's own parser and run it (as ``mtgrpo.cli.main`` will)."""
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return module.run(parser.parse_args(list(argv)))


def test_report_cli_writes_figures_and_prints_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = hand_run(tmp_path / "r")
    assert run_cli(report_cli, [str(run), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "worst task: 38.0% (c) at step 30" in out
    assert "1.50 s/step" in out
    assert run_cli(report_cli, [str(run), "--out", str(tmp_path / "figs")]) == 0
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["accuracy.png",
                                                                     "weights.png"]


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["{empty}"], "has no metrics.jsonl; pass a run directory"),
        (["{run}", "--split", "dev"], "unknown --split 'dev'"),
        (["{no_eval}", "--split", "eval"], "has no eval records; report on --split train"),
        (["{run}", "--thresholds", "x"], "comma-separated fractions"),
        (["{run}", "--smoothing", "1.5"], r"smoothing must be in \[0, 1\)"),
    ],
)
def test_report_cli_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], match: str
) -> None:
    paths = {"empty": tmp_path / "empty", "run": hand_run(tmp_path / "r"),
             "no_eval": write_run(tmp_path / "t", [train_record(1, {"a": 0.5})])}
    paths["empty"].mkdir()
    assert run_cli(report_cli, [arg.format(**paths) for arg in argv]) == 2
    error = capsys.readouterr().err
    assert error.startswith("mtgrpo report: error: ")
    assert re.search(match, error)


def test_compare_cli_writes_tables_and_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [seed_run(tmp_path / "mt-seed1", 0.5, 20), seed_run(tmp_path / "mt-seed2", 0.7, 40),
            seed_run(tmp_path / "grpo-seed1", 0.4, 30)]
    out = tmp_path / "cmp"
    argv = [*map(str, runs), "--baseline", str(runs[2]), "--group-by-prefix",
            "--out", str(out), "--thresholds", "0.5"]
    assert run_cli(compare_cli, argv) == 0
    assert "Methods over seeds" in capsys.readouterr().out
    record = json.loads((out / "comparison.json").read_text(encoding="utf-8"))
    assert [m["method"] for m in record["methods"]] == ["mt", "grpo"]
    assert record["baseline"] == "grpo-seed1"
    # Δm% of mt-seed1: p (.5 − .4) / .4 = .25, q 0 -> 12.5
    assert record["runs"][0]["delta_m"] == pytest.approx(12.5, abs=1e-9)
    markdown = (out / "comparison.md").read_text(encoding="utf-8")
    assert markdown.startswith("## Runs\n\n| run |")
    assert "## Methods over seeds" in markdown
    assert {"compare_accuracy.png", "compare_worst.png"} <= {p.name for p in out.iterdir()}


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["{run}", "{empty}"], r"empty'? has no metrics\.jsonl"),
        (["{run}", "{other}"], "share no task"),
        (["{run}", "--split", "test"], "unknown split 'test'"),
        (["{run}", "{other}", "--labels", "a"], "--labels needs 2 non-empty"),
        (["{run}", "--thresholds", "0"], r"fractions in \(0, 1\]"),
    ],
)
def test_compare_cli_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], match: str
) -> None:
    paths = {"empty": tmp_path / "empty", "run": hand_run(tmp_path / "r"),
             "other": write_run(tmp_path / "o", [eval_record(1, {"q": 0.5})])}
    paths["empty"].mkdir()
    out = tmp_path / "out"
    assert run_cli(compare_cli, [*(a.format(**paths) for a in argv), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("mtgrpo compare: error: ")
    assert re.search(match, error)
    assert not out.exists()  # nothing written on bad input


@pytest.mark.skipif("compare" not in COMMANDS or "report" not in COMMANDS,
                    reason="report / compare not registered in mtgrpo.cli.COMMANDS yet")
def test_commands_through_main(tmp_path: Path) -> None:
    run = hand_run(tmp_path / "r")
    assert main(["report", str(run), "--no-plots"]) == 0
    assert main(["compare", str(run), str(tmp_path / "missing"), "--no-plots"]) == 2


def test_the_summary_words_cannot_be_read_as_the_best_task_and_name_the_lagging_one(
    tmp_path: Path,
) -> None:
    from rich.console import Console

    from mtgrpo.reporting.compare import run_report

    history = load_run(hand_run(tmp_path / "r"))
    console = Console(width=300, record=True, color_system=None)
    console.print(run_report(summarize_run(history), summarize_tasks(history)))
    out = console.export_text()
    # the worst-task curve peaks at .42 (step 20, b:easy the worst then); final worst c .38
    assert ("worst task: 38.0% (c) at step 30; highest worst-task accuracy: 42.0% at step 20 "
            "(worst task then: b:easy)") in out
    assert "best 42.0% (b:easy)" not in out
    # c's final weight .2 is below the uniform 1/3
    assert ("lagging on eval: c (38.0% at step 30); final task weight 0.200 (uniform share "
            "0.333): the task weighting gave it less than a uniform share") in out


def test_a_lagging_task_given_its_share_has_no_note(tmp_path: Path) -> None:
    from mtgrpo.reporting.compare import _report_lines

    records = [eval_record(10, {"a": 0.2, "b": 0.4}),
               train_record(10, {"a": 0.2, "b": 0.4}, **{
                   "tasks/a/weight": 0.7, "tasks/b/weight": 0.3,
                   "tasks/a/batch_share": 0.6, "tasks/b/batch_share": 0.4})]
    history = load_run(write_run(tmp_path / "r", records))
    lines = _report_lines(summarize_run(history), summarize_tasks(history))
    assert ("lagging on eval: a (20.0% at step 10); final task weight 0.700, mean batch share "
            "0.600 (uniform share 0.500)") in lines
