"""`mtgrpo eval --paper-test-sets`: a trained run's checkpoint on the papers' levels, end to end
on the tiny model, with the released problems asked in the run's formats or verbatim."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtgrpo.cli import main
from paper_release import CLOSING, PREAMBLE, TAG_COUNTDOWN, countdown_question, write_release

# A run trained like the smollm2-cpu recipe: chat prompts, <answer> tags, a Countdown task at
# a config of its own (3 numbers up to 20) beside a family without released test sets.
OWN_COUNTDOWN = {"family": "countdown", "name": "countdown:3x20",
                 "config": {"min_numbers": 3, "max_numbers": 3, "min_value": 1, "max_value": 20,
                            "min_target": 1, "max_target": 400}}  # fmt: skip
LETTERS = {"family": "letter_counting", "name": "letter_counting:3-6",
           "config": {"min_words": 3, "max_words": 6}}  # fmt: skip
MAX_COMPLETION_LENGTH = 8


def _run_file(tmp_path: Path, model: Path, tasks: list[Any]) -> str:
    config = {
        "model": {"name_or_path": str(model)},
        "tasks": {"tasks": tasks, "prompt_format": "chat", "answer_format": "answer_tag",
                  "workers": 0, "cache_dir": str(tmp_path / "cache")},
        "output_dir": str(tmp_path / "run"), "max_completion_length": MAX_COMPLETION_LENGTH,
    }  # fmt: skip
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture
def release(tmp_path: Path) -> str:
    return str(write_release(tmp_path / "release"))


@pytest.fixture
def evaluated(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What ``mtgrpo eval`` hands to the evaluation: its rows and its rewards (then it runs)."""
    import mtgrpo.evaluation

    seen: dict[str, Any] = {}
    real = mtgrpo.evaluation.run_evaluation

    def spy(model: Any, rows: Any, rewards: Any, **options: Any) -> Any:
        seen.update(rows=list(rows), rewards=rewards, options=options)
        return real(model, rows, rewards, **options)

    monkeypatch.setattr(mtgrpo.evaluation, "run_evaluation", spy)
    return seen


def _reward(seen: dict[str, Any], row: dict, completion: str) -> float | None:
    (function,) = seen["rewards"][row["task"]]
    return function([row["prompt"]], [completion], answer=[row["answer"]],
                    metadata=[row["metadata"]], task=[row["task"]])[0]  # fmt: skip


def test_a_runs_checkpoint_on_a_papers_level_in_the_runs_formats(
    tmp_path, tiny_model_dir, release, evaluated
):
    config = _run_file(tmp_path, tiny_model_dir, [OWN_COUNTDOWN, LETTERS])
    out = tmp_path / "out"
    argv = ["eval", "--model", str(tiny_model_dir), "--config", config, "--paper-test-sets",
            release, "--tasks", "countdown:easy", "--num-samples", "2", "--out", str(out)]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert {task: r["prompts"] for task, r in results["tasks"].items()} == {"countdown:easy": 2}
    assert results["tasks"]["countdown:easy"]["mean_length"] <= MAX_COMPLETION_LENGTH
    assert results["max_new_tokens"] == MAX_COMPLETION_LENGTH  # the run's completion length
    assert {key: results[key] for key in ("paper_test_sets", "paper_prompts", "prompt_format",
                                          "answer_format", "think_prefix", "system_prompt")} == {
        "paper_test_sets": release, "paper_prompts": "config", "prompt_format": "chat",
        "answer_format": "answer_tag", "think_prefix": False, "system_prompt": None}
    first, second = evaluated["rows"]
    assert first["prompt"] == [{"role": "user", "content": TAG_COUNTDOWN}]
    assert json.loads(first["metadata"])["answer_format"] == "answer_tag"
    assert _reward(evaluated, first, "<answer> 8 * 96 + 73 </answer>") == 1.0
    assert _reward(evaluated, first, "\\boxed{8 * 96 + 73}") == 0.0
    assert _reward(evaluated, second, "<answer> 3 * 5 + 7 </answer>") == 1.0


def test_released_prompts_verbatim_on_request_and_without_a_config(
    tmp_path, tiny_model_dir, release, evaluated
):
    config = _run_file(tmp_path, tiny_model_dir, [OWN_COUNTDOWN])
    common = ["eval", "--model", str(tiny_model_dir), "--paper-test-sets", release, "--tasks",
              "countdown:easy", "--eval-size", "1", "--num-samples", "1"]  # fmt: skip
    released = PREAMBLE + countdown_question([8, 73, 96], 841) + CLOSING
    for extra, max_new_tokens in (
        (["--config", config, "--paper-prompts", "released"], MAX_COMPLETION_LENGTH),
        (["--max-new-tokens", "4"], 4),
    ):
        out = tmp_path / f"out{max_new_tokens}"
        assert main([*common, *extra, "--out", str(out)]) == 0
        results = json.loads((out / "results.json").read_text())
        assert (results["paper_prompts"], results["prompt_format"], results["answer_format"]) == (
            "released", "paper", "boxed")
        assert results["max_new_tokens"] == max_new_tokens
        (row,) = evaluated["rows"]
        assert row["prompt"] == [{"role": "user", "content": released}]
        assert _reward(evaluated, row, "\\boxed{8 * 96 + 73}") == 1.0
        assert _reward(evaluated, row, "<answer> 8 * 96 + 73 </answer>") == 0.0


def test_a_config_of_the_papers_levels_chooses_them(tmp_path, tiny_model_dir, release, evaluated):
    config = _run_file(tmp_path, tiny_model_dir, ["countdown:easy", "arc_1d:easy", LETTERS])
    out = tmp_path / "out"
    argv = ["eval", "--model", str(tiny_model_dir), "--config", config, "--paper-test-sets",
            release, "--eval-size", "1", "--num-samples", "1", "--out", str(out)]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert {task: r["prompts"] for task, r in results["tasks"].items()} == {
        "countdown:easy": 1, "arc_1d:easy": 1}
    arc = next(row for row in evaluated["rows"] if row["task"] == "arc_1d:easy")
    assert arc["prompt"][0]["content"].endswith(
        "Your final answer must be placed in <answer> </answer> tags and should be just the test "
        "output grid itself.\n\nInput:\n9 9 9 0 0 0 0 1 0 0")


def test_clear_errors_before_any_model_loads(tmp_path, tiny_model_dir, release, capsys):
    missing = str(tmp_path / "no-model-here")  # never loaded: every error comes first
    own = _run_file(tmp_path, tiny_model_dir, [OWN_COUNTDOWN, LETTERS])
    cases = [
        (["--config", own, "--paper-test-sets", release],
         ["(countdown:3x20, letter_counting:3-6)",
          "countdown:3x20 is countdown at a config of its own, not one of the papers' levels",
          "--tasks countdown:easy", "valid: countdown:easy, countdown:medium",
          "arc_1d:very_hard"]),
        (["--config", own, "--paper-test-sets", release, "--tasks", "countdown:3x20"],
         ["'countdown:3x20' is not a task of the papers' test sets",
          "countdown:easy, countdown:medium"]),
        (["--tasks", "countdown:extreme", "--paper-test-sets", release],
         ["'countdown:extreme' is not a task of the papers' test sets", "zebra_puzzles:easy"]),
        (["--tasks", "countdown:easy", "--paper-prompts", "released"],
         ["--paper-prompts released", "add --paper-test-sets DIR"]),
        (["--tasks", "countdown:easy", "--paper-test-sets", release, "--paper-prompts", "config"],
         ["--paper-prompts config", "add --config RUN"]),
        (["--tasks", "countdown:easy", "--paper-test-sets", release, "--answer-format", "tags"],
         ["released prompts have their own format", "drop --prompt-format/--answer-format"]),
        (["--paper-test-sets", release], ["needs the levels to evaluate: --tasks"]),
        (["--config", own, "--tasks", "countdown:easy"],
         ["countdown:easy is not a task of this config", "countdown:3x20, letter_counting:3-6"]),
    ]  # fmt: skip
    for extra, messages in cases:
        assert main(["eval", "--model", missing, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("mtgrpo eval: "), err
        for message in messages:
            assert message in err, (extra, err)


def test_help_tells_how_to_evaluate_a_run_on_the_papers_levels(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--paper-prompts {config,released}" in text
    assert "mtgrpo eval --model CHECKPOINT --config smollm2-cpu \\ --paper-test-sets DIR" in text
    assert "Δm% against a baseline" in text  # the description is printed as written
