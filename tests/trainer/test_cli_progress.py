"""`mtgrpo train` with its output in a log (not a terminal): plain progress lines for the warm
start, the GRPO steps and the evaluation, instead of a bar drawn once at the end."""

from __future__ import annotations

import re

import yaml

from mtgrpo.cli import main

TASKS = {"tasks": ["countdown:easy"], "train_size": 12, "eval_size": 4, "workers": 0,
         "prompt_format": "chat"}


def test_train_off_a_terminal_prints_plain_progress_lines_for_every_phase(
        tmp_path, tiny_model_dir, capsys, monkeypatch):  # fmt: skip
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    # a line per update rather than per 30 s: the phases here take seconds, not minutes
    monkeypatch.setenv("MTGRPO_PROGRESS_SECONDS", "0")
    config = {
        "model": str(tiny_model_dir), "output_dir": str(tmp_path / "run"),
        "tasks": {**TASKS, "cache_dir": str(tmp_path / "cache")},
        "sft": {"num_examples": 8, "template": "answer_only", "max_steps": 3,
                "per_device_train_batch_size": 4, "learning_rate": 1e-3},
        "max_steps": 2, "num_generations": 2, "prompts_per_step": 2, "eval_steps": 1,
        "max_prompt_length": 300, "max_completion_length": 8, "save_steps": 0,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out  # no bar, no cursor moves in a log
    line = r"  elapsed \d+:\d\d:\d\d  eta (\d+:\d\d:\d\d|-)"
    warm = re.findall(r"^\[warm start\] (\d)/3 steps" + line + "  loss [0-9.]+  lr ", out, re.M)
    assert [done for done, _ in warm] == ["1", "2", "3"]  # each step (the last: the end)
    train = re.findall(r"^\[train\] (\d)/2 steps" + line + "  train batch: worst .*avg ",
                       out, re.M)
    assert [done for done, _ in train] == ["1", "2"]
    evals = re.findall(r"^\[eval\] (\d)/4 prompts \(1 sample each\)" + line + "(.*)$", out,
                       re.M)
    # one line per evaluation (done in one chunk), with what it found
    assert len(evals) >= 2
    assert all(done == "4" for done, _, _ in evals)
    assert all(found.startswith("  eval: worst ") for _, _, found in evals)
    # the step after an evaluation says what it found, apart from the training batch
    assert re.search(r"^\[train\] 2/2 steps.*train batch: worst .*  eval: worst ", out, re.M)
