"""``benchmarks/bench_tasks.py``: one task end to end, at tiny sizes."""

from __future__ import annotations

import pytest

from script_loader import load_script

bench = load_script("benchmarks/bench_tasks.py")


def test_prints_a_rate_row_per_task(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--tasks", "arc_1d:easy,countdown:easy", "--seconds", "0.05",
                       "--min-items", "2", "--score-rows", "4"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| task | generated items")
    rows = [line.split("|")[1:-1] for line in lines[2:]]
    assert [cells[0].strip() for cells in rows] == ["arc_1d:easy", "countdown:easy"]
    for cells in rows:
        assert int(cells[1]) >= 2
        assert float(cells[2].replace(",", "")) > 0
        assert float(cells[3].replace(",", "")) > 0


def test_a_wrong_answer_differs_from_the_gold_one() -> None:
    for answer in ("", "1", "12", "[1, 2]", "Alice"):
        assert bench._wrong(answer) != answer
