"""`mtgrpo train CONFIG --field value` and `mtgrpo eval` end to end on the tiny model."""

from __future__ import annotations

import json

import pytest
import yaml

from mtgrpo.cli import main
from mtgrpo.reporting import read_metrics


def _config(tmp_path, tiny_model_dir) -> str:
    config = {
        "model": {"name_or_path": str(tiny_model_dir)},
        "tasks": {"tasks": ["countdown:easy", "arc_1d:easy"], "train_size": 8, "eval_size": 2,
                  "workers": 0, "cache_dir": str(tmp_path / "cache")},
        "output_dir": str(tmp_path / "run"),
        "max_steps": 1, "num_generations": 2, "prompts_per_step": 2,
        "max_completion_length": 8, "max_prompt_length": 400, "save_steps": 0,
        "task_weighting": "mt_grpo", "batch_construction": "ratio_preserving",
        "zero_gradient_filter": "none",
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_train_from_yaml_with_overrides(tmp_path, tiny_model_dir, capsys):
    config = _config(tmp_path, tiny_model_dir)
    assert main(["train", config, "--learning_rate", "1e-4", "--eval_steps", "1"]) == 0
    run = tmp_path / "run"
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["learning_rate"] == 1e-4
    assert resolved["tasks"]["tasks"] == ["countdown:easy", "arc_1d:easy"]
    train = read_metrics(run, split="train")
    assert "tasks/countdown:easy/accuracy" in train[0]
    assert read_metrics(run, split="eval")
    assert (run / "checkpoint-1" / "trainer_state.json").is_file()
    assert "run directory" in capsys.readouterr().out


def test_train_print_config_and_bad_option(tmp_path, tiny_model_dir, capsys):
    config = _config(tmp_path, tiny_model_dir)
    assert main(["train", config, "--print-config", "--beta", "0.04"]) == 0
    assert "beta: 0.04" in capsys.readouterr().out
    assert main(["train", config, "--learning_rat", "1"]) == 2
    assert "did you mean 'learning_rate'" in capsys.readouterr().err
    assert main(["train", "no-such-recipe"]) == 2
    capsys.readouterr()
    assert main(["train", config, "--learning_rate", "fast"]) == 2
    err = capsys.readouterr().err
    assert "learning_rate: 'fast' (str) is not a number" in err
    assert "Traceback" not in err


def test_an_error_after_the_config_check_is_one_line_unless_debug(tmp_path, tiny_model_dir,
                                                                  capsys):  # fmt: skip
    missing = str(tmp_path / "no-model-here")
    argv = ["train", _config(tmp_path, tiny_model_dir), "--model.name_or_path", missing]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("mtgrpo train: ")
    assert "no-model-here" in err
    assert "(add --debug to see the traceback)" in err
    assert "Traceback" not in err
    for debug in (["--debug", *argv], [*argv, "--debug"]):
        with pytest.raises(Exception, match="no-model-here"):
            main(debug)


def test_eval_writes_results_and_delta_m(tmp_path, tiny_model_dir, capsys):
    common = ["eval", "--model", str(tiny_model_dir), "--tasks", "countdown:easy,arc_1d:easy",
              "--eval-size", "2", "--num-samples", "2", "--max-new-tokens", "8"]
    assert main([*common, "--out", str(tmp_path / "base")]) == 0
    results = json.loads((tmp_path / "base" / "results.json").read_text())
    assert set(results["tasks"]) == {"countdown:easy", "arc_1d:easy"}
    assert results["tasks"]["arc_1d:easy"]["prompts"] == 2
    assert 0 <= results["worst_accuracy"] <= results["average_accuracy"] <= 1
    baseline = str(tmp_path / "base" / "results.json")
    assert main([*common, "--out", str(tmp_path / "new"), "--baseline", baseline]) == 0
    assert "delta_m" in json.loads((tmp_path / "new" / "results.json").read_text())
    assert main(["eval", "--model", str(tiny_model_dir)]) == 2
    assert "give --tasks" in capsys.readouterr().err


def test_eval_on_a_run_files_tasks(tmp_path, tiny_model_dir, capsys):
    config = _config(tmp_path, tiny_model_dir)
    common = ["eval", "--model", str(tiny_model_dir), "--config", config, "--num-samples", "1"]
    assert main([*common, "--out", str(tmp_path / "a")]) == 0
    results = json.loads((tmp_path / "a" / "results.json").read_text())
    # the config's tasks and eval_size (2), and its max_completion_length (8) as the length cap
    assert {t: r["prompts"] for t, r in results["tasks"].items()} == {
        "countdown:easy": 2, "arc_1d:easy": 2}
    assert all(r["mean_length"] <= 8 for r in results["tasks"].values())
    assert main([*common, "--eval-size", "1", "--out", str(tmp_path / "b")]) == 0
    results = json.loads((tmp_path / "b" / "results.json").read_text())
    assert {r["prompts"] for r in results["tasks"].values()} == {1}
    # --tasks picks some of the config's tasks (same prompts); one it lacks is an error
    assert main([*common, "--tasks", "countdown:easy", "--out", str(tmp_path / "c")]) == 0
    picked = json.loads((tmp_path / "c" / "results.json").read_text())
    assert {t: r["prompts"] for t, r in picked["tasks"].items()} == {"countdown:easy": 2}
    capsys.readouterr()
    assert main([*common, "--tasks", "zebra_puzzles:easy", "--out", str(tmp_path / "d")]) == 2
    assert ("zebra_puzzles:easy is not a task of this config; its tasks are countdown:easy, "
            "arc_1d:easy") in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_help_of_every_command(capsys):
    import pytest

    from mtgrpo.cli import COMMANDS

    for name in [None, *COMMANDS]:
        with pytest.raises(SystemExit) as exit_info:
            main(["--help"] if name is None else [name, "--help"])
        assert exit_info.value.code == 0
        assert "usage: mtgrpo" in capsys.readouterr().out
