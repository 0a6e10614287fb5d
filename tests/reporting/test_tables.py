"""Tables at 80 columns: names whole, no empty column, no line past the width, and a note of
what was left out (the files keep every column)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from rich.console import Console

from mtgrpo.cli.eval import _print as print_evaluation
from mtgrpo.evaluation import EvaluationResult, TaskResult
from mtgrpo.reporting.compare import (
    compare_runs,
    load_run,
    run_report,
    summarize_run,
    summarize_tasks,
)
from mtgrpo.reporting.tables import FittedTable

TASKS = ("countdown:2x20", "countdown:3x9")


def _run(directory: Path, offset: float) -> Path:
    directory.mkdir(parents=True)
    records = []
    for step in (25, 50, 75):
        accuracy = {"countdown:2x20": 0.10 + offset + step / 1000,
                    "countdown:3x9": 0.15 + offset}
        records.append({"step": step, "split": "train", "time/step": 3.2,
                        "sampling/prompts_per_informative_group": 1.7,
                        **{f"tasks/{t}/accuracy": a for t, a in accuracy.items()},
                        **{f"tasks/{t}/weight": 0.5 for t in TASKS},
                        **{f"tasks/{t}/batch_share": 0.5 for t in TASKS}})
        records.append({"step": step, "split": "eval",
                        **{f"tasks/{t}/accuracy": a for t, a in accuracy.items()}})
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return directory


def _lines(renderable, width: int = 80) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text().splitlines()


def _no_empty_column(lines: list[str]) -> None:
    """Every cell between two column rules holds something on some line of the table."""
    body = [line for line in lines if line.startswith("│")]
    assert body
    width = max(len(line) for line in body)
    rules = [i for i in range(width) if all(i < len(line) and line[i] == "│" for line in body)]
    for left, right in itertools.pairwise(rules):
        assert any(line[left + 1:right].strip() for line in body), (left, right, body)


def test_compare_at_80_columns_keeps_task_names_whole_and_says_what_it_left_out(tmp_path):
    runs = [_run(tmp_path / "mtgrpo-seed1", 0.05), _run(tmp_path / "grpo-seed1", 0.0)]
    table = compare_runs(runs, baseline=str(runs[1]))
    lines = _lines(table.to_rich())
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= 80
    for task in TASKS:
        assert task in text
    assert "countd…" not in text
    assert "left out at 80 columns: prompts/inf. group, s/step" in text
    assert "comparison.md keeps every column" in text
    for part in text.split("Final accuracy per task"):
        _no_empty_column(part.splitlines())
    assert "prompts/inf. group" in table.to_markdown()  # the file keeps all
    wide = "\n".join(_lines(table.to_rich(), width=200))
    assert "left out" not in wide


def test_report_at_80_columns(tmp_path):
    history = load_run(_run(tmp_path / "run", 0.0))
    lines = _lines(run_report(summarize_run(history), summarize_tasks(history)))
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    for task in TASKS:
        assert task in text
    _no_empty_column(lines)


def test_eval_table_at_80_columns_keeps_two_countdown_tasks_apart(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    tasks = {name: TaskResult(task=name, prompts=80, samples=8, accuracy=acc, mean_reward=0.3,
                              format_rate=0.9, mean_length=12.5, top_answer="12",
                              top_answer_share=0.25, top_answer_gold_share=0.1,
                              constant_baseline=0.1, baseline_answer="12")
             for name, acc in zip(TASKS, (0.1875, 0.25), strict=True)}
    print_evaluation(EvaluationResult(tasks))
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    assert "countdown:2x20 (worst)" in text
    assert "countdown:3x9" in text
    _no_empty_column([line for line in lines if line.startswith("│")])


def test_a_table_that_fits_is_left_whole():
    table = FittedTable(["task", "accuracy"], [["countdown:2x20", "18.8"]], title="t",
                        drop_order=("accuracy",))
    text = "\n".join(_lines(table))
    assert "accuracy" in text
    assert "left out" not in text


def test_a_table_of_names_too_wide_for_the_terminal_is_turned_on_its_side():
    tasks = [f"countdown:{n}x{m}" for n in (2, 3, 4) for m in (9, 20, 50)]
    table = FittedTable(["run", *tasks], [["mtgrpo", *("18.8" for _ in tasks)]], title="t",
                        whole=range(len(tasks) + 1), transpose=True)
    lines = _lines(table)
    assert max(len(line) for line in lines) <= 80
    assert sum(any(task in line for task in tasks) for line in lines) == len(tasks)  # one a row
