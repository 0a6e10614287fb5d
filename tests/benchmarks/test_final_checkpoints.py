"""``benchmarks/final_checkpoints.py``: a grid's final checkpoints on a larger held-out split,
the summary checked against hand-derived values and the whole script on the tiny model."""

from __future__ import annotations

import argparse
import json
import math
import sys

import pytest
import yaml

from script_loader import load_script

bench = load_script("benchmarks/final_checkpoints.py")


def assert_close(actual: float, expected: float) -> None:
    """Float64 sums of a few terms: within 8 float64 ulps of max(1, |expected|)."""
    assert abs(actual - expected) <= 8 * sys.float_info.epsilon * max(1.0, abs(expected)), (
        actual, expected)


def _checkpoints(*labels):
    out = [bench.Checkpoint("warm_start", "warm_start", None, None)]
    for label in labels:
        method, seed = label.rsplit("-seed", 1)
        out.append(bench.Checkpoint(label, method, int(seed), None, 75))
    return out


def test_summary_by_hand():
    scores = {
        "a": {"warm_start": 0.5, "grpo-seed1": 0.6, "grpo-seed2": 0.7,
              "mtgrpo_l0.5-seed1": 0.5, "mtgrpo_l0.5-seed2": 0.55},
        "b": {"warm_start": 0.2, "grpo-seed1": 0.1, "grpo-seed2": 0.3,
              "mtgrpo_l0.5-seed1": 0.4, "mtgrpo_l0.5-seed2": 0.35},
    }  # fmt: skip
    scored = {task: {label: {"accuracy": acc, "samples": 100} for label, acc in runs.items()}
              for task, runs in scores.items()}  # fmt: skip
    checkpoints = _checkpoints("grpo-seed1", "grpo-seed2", "mtgrpo_l0.5-seed1",
                               "mtgrpo_l0.5-seed2")
    summary = bench.summarize(scored, checkpoints, ["a", "b"])
    grpo = summary["tasks"]["a"]["methods"]["grpo"]
    assert grpo["seeds"] == [1, 2]
    assert_close(grpo["mean"], 0.65)
    assert_close(grpo["sd"], math.sqrt(2 * 0.05**2))
    # evaluation noise of the seed mean: sqrt(.6·.4/100 + .7·.3/100) / 2
    assert_close(grpo["mean_standard_error"], math.sqrt(0.0045) / 2)
    # the gain's: that and the warm start's sqrt(.5·.5/100) = .05 in quadrature
    assert_close(grpo["gain"], 0.15)
    assert_close(grpo["gain_standard_error"], math.sqrt(0.0045 / 4 + 0.0025))
    assert grpo["gain_above_2se"]  # 0.15 / 0.0602 = 2.49
    mt_b = summary["tasks"]["b"]["methods"]["mtgrpo_l0.5"]
    assert_close(mt_b["gain"], 0.175)
    assert_close(mt_b["gain_standard_error"],
                 math.sqrt((0.4 * 0.6 + 0.35 * 0.65) / 100 / 4 + 0.2 * 0.8 / 100))
    assert mt_b["gain_above_2se"]  # 0.175 against 2 × 0.0526
    mt_a = summary["tasks"]["a"]["methods"]["mtgrpo_l0.5"]
    assert not mt_a["gain_above_2se"]  # +2.5 points, SE ~6
    # worst task per run: grpo 0.1 and 0.3 (b), MT-GRPO 0.4 (b) and 0.35 (b)
    assert summary["worst"]["grpo"]["values"] == [0.1, 0.3]
    assert summary["worst"]["mtgrpo_l0.5"]["values"] == [0.4, 0.35]
    (test,) = summary["tests"]  # no DAPO runs: one test
    assert (test["method"], test["other"]) == ("mtgrpo_l0.5", "grpo")
    # exact permutation: of the 6 ways to pick 2 of {.4, .35, .1, .3}, only the observed one
    # has a difference of means >= 0.375 - 0.2
    assert_close(test["permutation_p"], 1 / 6)
    assert 0 < test["welch_p"] < 0.5
    markdown = bench.render(summary, argparse.Namespace(
        grid="G", config="C", tasks=["a", "b"], eval_size=100, num_samples=1))
    assert "| grpo | 60.0 (s1), 70.0 (s2) | 65.0 ± 7.1 |" in markdown
    assert "permutation p = 0.167" in markdown
    assert "Every run's checkpoint is its final one, step 75." in markdown
    # average over the tasks per run: grpo (.6+.1)/2, (.7+.3)/2; MT-GRPO .45, .45
    assert_close(summary["average"]["grpo"]["mean"], (0.35 + 0.5) / 2)
    assert_close(summary["average"]["mtgrpo_l0.5"]["mean"], (0.45 + 0.45) / 2)
    assert_close(summary["average_warm_start"], 0.35)
    assert ("means over seeds: grpo 42.5 (35.0, 50.0), mtgrpo_l0.5 45.0 (45.0, 45.0); "
            "warm start 35.0.") in markdown
    assert "- grpo: -2.5 points against the best method (mtgrpo_l0.5)" in markdown


def test_the_commonest_answers_are_reported_when_the_evaluations_recorded_them():
    answers = {"warm_start": ("1", 0.586), "grpo-seed1": ("1", 0.99), "grpo-seed2": ("1", 0.98),
               "mtgrpo_l0.5-seed1": ("1", 0.794), "mtgrpo_l0.5-seed2": ("2", 0.5)}
    scored = {"a": {label: {"accuracy": 0.5, "samples": 800, "top_answer": answer,
                            "top_answer_share": share, "baseline_answer": "1",
                            "constant_baseline": 0.545}
                    for label, (answer, share) in answers.items()},
              "b": {label: {"accuracy": 0.1, "samples": 800} for label in answers}}
    checkpoints = _checkpoints("grpo-seed1", "grpo-seed2", "mtgrpo_l0.5-seed1",
                               "mtgrpo_l0.5-seed2")
    summary = bench.summarize(scored, checkpoints, ["a", "b"])
    assert summary["tasks"]["a"]["answers"]["grpo-seed2"] == ["1", 0.98]
    assert summary["tasks"]["a"]["constant"] == ["1", 0.545]
    assert "answers" not in summary["tasks"]["b"]  # results files from before: no line
    markdown = bench.render(summary, argparse.Namespace(
        grid="G", config="C", tasks=["a", "b"], eval_size=800, num_samples=1))
    assert ("Commonest answer given, share of the completions: warm start '1' 58.6 %; grpo '1' "
            "98.0-99.0 %; mtgrpo_l0.5 '1'/'2' 50.0-79.4 %. Always answering '1', the commonest "
            "gold answer, scores 54.5 %.") in markdown
    assert markdown.count("Commonest answer given") == 1


def _tiny_grid(tmp_path, tiny_model_dir):
    """A run file on the tiny model and a grid of it: GRID, RUN_FILE."""
    config = {"model": {"name_or_path": str(tiny_model_dir)}, "max_steps": 2,
              "tasks": {"tasks": [{"family": "basic_arithmetic", "name": "add",
                                   "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                              "max_digits": 1, "operators": ["+"],
                                              "allow_parentheses": False,
                                              "allow_negation": False}}],
                        "train_size": 60, "eval_size": 4, "workers": 0,
                        "cache_dir": str(tmp_path / "cache")},
              "sft": {"num_examples": 10}, "max_completion_length": 4}  # fmt: skip
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(config))
    grid = tmp_path / "grid"
    for label in ("grpo-seed1", "grpo-seed2", "mtgrpo_l0.5-seed1", "mtgrpo_l0.5-seed2"):
        (grid / label / "checkpoint-2").mkdir(parents=True)
        (grid / label / "checkpoint-2" / "model").symlink_to(tiny_model_dir)
    (grid / "grpo-seed3" / "checkpoint-1").mkdir(parents=True)  # unfinished: left out
    # a run trained with the grid's --max-steps 3 ends at its own saved max_steps: found at 3
    for label, step in (("dapo-seed1", 3), ("dapo-seed2", 2)):  # seed 2 stopped before 3
        (grid / label / f"checkpoint-{step}").mkdir(parents=True)
        (grid / label / f"checkpoint-{step}" / "model").symlink_to(tiny_model_dir)
        (grid / label / "config.yaml").write_text(yaml.safe_dump({"max_steps": 3}))
    (grid / "warm_start" / "sft").mkdir(parents=True)
    (grid / "warm_start" / "sft" / "model").symlink_to(tiny_model_dir)
    return grid, run_file


def test_the_script_on_a_grid_of_the_tiny_model(tmp_path, tiny_model_dir, capsys):
    grid, run_file = _tiny_grid(tmp_path, tiny_model_dir)
    argv = ["--grid", str(grid), "--config", str(run_file), "--tasks", "add",
            "--eval-size", "20", "--jobs", "2"]
    summary = bench.main(argv)
    out = grid / "final_checkpoints"
    labels = sorted(p.name for p in (out / "add").iterdir())
    assert labels == ["dapo-seed1", "grpo-seed1", "grpo-seed2", "mtgrpo_l0.5-seed1",
                      "mtgrpo_l0.5-seed2", "warm_start"]
    for label in labels:
        result = json.loads((out / "add" / label / "results.json").read_text())
        assert result["tasks"]["add"]["prompts"] == 20
        # one-digit sums repeat: past the run's own 4 prompts, trained problems were replaced
        assert result["replaced_problems"]["add"] > 0
        assert summary["replaced_problems"]["add"][label] == result["replaced_problems"]["add"]
        accuracy = result["tasks"]["add"]["accuracy"]
        if label == "warm_start":
            assert summary["tasks"]["add"]["warm_start"]["accuracy"] == accuracy
        else:
            method, seed = label.rsplit("-seed", 1)
            entry = summary["tasks"]["add"]["methods"][method]
            assert entry["accuracy"][entry["seeds"].index(int(seed))] == accuracy
    assert json.loads((out / "results.json").read_text())["worst"] == summary["worst"]
    report = (out / "results.md").read_text()
    assert "# Final checkpoints on a larger held-out split" in report
    assert "## Average" not in report  # one task: its average is the worst task
    assert summary["final_steps"] == {"dapo-seed1": 3, "grpo-seed1": 2, "grpo-seed2": 2,
                                      "mtgrpo_l0.5-seed1": 2, "mtgrpo_l0.5-seed2": 2}
    assert ("**The runs end at different steps**: dapo-seed1 3, grpo-seed1 2, grpo-seed2 2, "
            "mtgrpo_l0.5-seed1 2, mtgrpo_l0.5-seed2 2.") in report
    # resumable: a finished evaluation is kept, not run again
    stamp = (out / "add" / "grpo-seed1" / "results.json").stat().st_mtime_ns
    bench.main(argv)
    assert (out / "add" / "grpo-seed1" / "results.json").stat().st_mtime_ns == stamp
    # ... but never mixed with a request for another size
    with pytest.raises(ValueError, match=r"scored 20 prompts × 1 samples, not 30 × 1"):
        bench.main([*argv[:-4], "--eval-size", "30", "--jobs", "2"])
    capsys.readouterr()


def test_the_papers_test_sets_score_every_checkpoint(tmp_path, tiny_model_dir, capsys):
    from paper_release import write_release

    grid, run_file = _tiny_grid(tmp_path, tiny_model_dir)
    release = write_release(tmp_path / "release")  # two countdown:easy problems
    argv = ["--grid", str(grid), "--config", str(run_file), "--paper-test-sets", str(release),
            "--tasks", "countdown:easy", "--num-samples", "2", "--jobs", "2"]
    summary = bench.main(argv)
    out = grid / "paper_test"  # beside final_checkpoints, not in it
    assert not (grid / "final_checkpoints").exists()
    labels = sorted(p.name for p in (out / "countdown_easy").iterdir())
    assert labels == ["dapo-seed1", "grpo-seed1", "grpo-seed2", "mtgrpo_l0.5-seed1",
                      "mtgrpo_l0.5-seed2", "warm_start"]
    for label in labels:
        result = json.loads((out / "countdown_easy" / label / "results.json").read_text())
        # the release's problems, all of them (fewer than a level's 200), in the run's formats
        assert result["tasks"]["countdown:easy"]["prompts"] == 2
        assert result["tasks"]["countdown:easy"]["samples"] == 2
        assert result["paper_prompts"] == "config"
    assert summary["tasks"]["countdown:easy"]["samples"]["grpo-seed1"] == 4
    report = (out / "results.md").read_text()
    assert report.startswith("# Final checkpoints on the papers' test sets")
    assert "the first 200 of each level × 2 sample(s)" in report
    assert f"--paper-test-sets {release}`" in report
    capsys.readouterr()
    # a level the release does not hold fails before any evaluation
    with pytest.raises(ValueError, match="countdown:medium"):
        bench.main([*argv[:6], "--tasks", "countdown:medium", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_bad_input_fails_before_any_evaluation(tmp_path, tiny_model_dir):
    from mtgrpo.config import load_run_config
    from mtgrpo.recipes import recipe_path

    recipe_steps = load_run_config(recipe_path("smollm2-cpu")).training.schedule.max_steps
    (tmp_path / "grid").mkdir()
    with pytest.raises(ValueError, match="not a task of this config"):
        bench.main(["--grid", str(tmp_path / "grid"), "--config", "smollm2-cpu",
                    "--tasks", "countdown:easy"])
    with pytest.raises(ValueError, match=r"no finished run in .*checkpoint-<max_steps>/model "
                       rf"\(max_steps from each run's config.yaml, else {recipe_steps} of the "
                       r"config\)"):
        bench.main(["--grid", str(tmp_path / "grid"), "--config", "smollm2-cpu",
                    "--tasks", "countdown:3x20"])
    damaged = tmp_path / "grid" / "grpo-seed1"
    damaged.mkdir()
    for unset in ("{}\n", "max_steps: -1\n"):  # not saved, or epochs: the config's 75
        (damaged / "config.yaml").write_text(unset)
        assert bench.final_step(damaged, 75) == 75
    (damaged / "config.yaml").write_text("max_steps: many\n")
    with pytest.raises(ValueError, match=r"grpo-seed1/config.yaml: max_steps is 'many'"):
        bench.main(["--grid", str(tmp_path / "grid"), "--config", "smollm2-cpu",
                    "--tasks", "countdown:3x20"])
    with pytest.raises(SystemExit, match="--eval-size must be >= 1"):
        bench.main(["--grid", str(tmp_path / "grid"), "--config", "smollm2-cpu",
                    "--tasks", "countdown:3x20", "--eval-size", "0"])
    assert not (tmp_path / "grid" / "final_checkpoints").exists()
