"""``benchmarks/agents_cpu.py``: the before/after summary of an agents run, checked against
hand-derived values on a written metrics log."""

from __future__ import annotations

import json
import math
import sys

import pytest
import yaml

from script_loader import load_script

bench = load_script("benchmarks/agents_cpu.py")


def _close(actual: float, expected: float) -> bool:
    return abs(actual - expected) <= 8 * sys.float_info.epsilon * max(1.0, abs(expected))


def _write_run(run, records, eval_size=100):
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(
        {"environments": {"environments": {"calc": {"kind": "calculator"}},
                          "eval_size": eval_size}}))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_summary_by_hand(tmp_path):
    run = tmp_path / "seed-0"
    _write_run(run, [
        {"split": "eval", "step": 0, "tasks/calc/accuracy": 0.5,
         "tasks/calc/tool_call_frequency": 1.9, "tasks/calc/tool_failure_frequency": 0.1},
        {"split": "train", "step": 1, "tasks/calc/weight": 0.6, "tasks/calc/batch_share": 0.5},
        {"split": "train", "step": 2, "tasks/calc/weight": 0.7, "tasks/calc/batch_share": 0.7},
        {"split": "eval", "step": 2, "tasks/calc/accuracy": 0.9,
         "tasks/calc/tool_call_frequency": 2.0, "tasks/calc/tool_failure_frequency": 0.0},
    ])
    summary = bench.summarize_run(run)
    row = summary["environments"]["calc"]
    assert (summary["steps"], summary["episodes"]) == (2, 100)
    assert (row["before"], row["after"]) == (0.5, 0.9)
    assert _close(row["before_se"], math.sqrt(0.25 / 100))  # 0.05
    assert _close(row["after_se"], math.sqrt(0.09 / 100))  # 0.03
    assert (row["before_calls"], row["after_calls"], row["after_failures"]) == (1.9, 2.0, 0.0)
    assert row["weight"] == 0.7
    assert _close(row["batch_share"], 0.6)
    table = bench.markdown([summary])
    expected = ("| seed-0 | calc | 50.0 ± 5.0 | 90.0 ± 3.0 | 1.90 → 2.00 | 10.0 → 0.0 | 0.700 | "
                "0.600 |")
    assert expected in table


def test_a_run_without_an_evaluation_at_step_0_is_refused(tmp_path):
    run = tmp_path / "r"
    _write_run(run, [{"split": "eval", "step": 5, "tasks/calc/accuracy": 0.5},
                     {"split": "eval", "step": 10, "tasks/calc/accuracy": 0.6}])
    with pytest.raises(ValueError, match="eval_on_start"):
        bench.summarize_run(run)
