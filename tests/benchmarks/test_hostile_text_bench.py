"""``benchmarks/bench_hostile_text.py``: a reward and the sandbox part, at tiny sizes."""

from __future__ import annotations

import pytest

from script_loader import load_script

bench = load_script("benchmarks/bench_hostile_text.py")


def test_prints_a_row_per_reward_and_the_sandbox_cost(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--only", "format_reward,zebra task", "--repeat", "1",
                       "--sandbox-runs", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| reward | slowest hostile text")
    assert [line.split("|")[1].strip() for line in lines[2:4]] == ["format_reward", "zebra task"]
    assert all(line.split("|")[2].strip() in bench.HOSTILE for line in lines[2:4])
    assert lines[-2].startswith("| `python -I -S -c pass` |")
    assert lines[-1].startswith('| `run_python("x = 1", ["assert x == 1"])` |')


def test_hostile_texts_are_at_most_the_extraction_cap() -> None:
    lengths = {name: len(text) for name, text in bench.HOSTILE.items()}
    assert max(lengths.values()) == bench.MAX_TEXT_CHARS
