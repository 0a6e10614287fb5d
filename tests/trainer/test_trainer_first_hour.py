"""What a TRL user's first script meets: lengths that fit the model by themselves, a warning
when nothing is learned, and a summary and report at the end of ``train()``."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import trainer_helpers as common

from mtgrpo import GRPOConfig, GRPOTrainer
from mtgrpo.reporting import read_metrics
from mtgrpo.trainer.building import _check_context_length


def _model(positions: int) -> SimpleNamespace:
    return SimpleNamespace(config=SimpleNamespace(max_position_embeddings=positions))


def test_a_trl_script_that_sets_only_the_completion_length_trains_on_the_tiny_model(
        tiny_model_dir, tmp_path, caplog):
    # TRL 1.x has no max_prompt_length, so a TRL script leaves it at mtgrpo's default (512),
    # which with 16 completion tokens does not fit the tiny model's 512 positions
    args = GRPOConfig(output_dir=str(tmp_path), max_completion_length=16, max_steps=1,
                      num_generations=4, per_device_train_batch_size=4, bf16=False,
                      report_at_end=False)
    with caplog.at_level(logging.INFO, logger="mtgrpo"):
        trainer = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=common.length_bonus,
                              args=args, train_dataset=common.rows())
    assert args.max_prompt_length == 512 - 16
    assert "max_prompt_length lowered from its default 512 to 496" in caplog.text
    trainer.train()
    assert [r["step"] for r in read_metrics(tmp_path, split="train")] == [1]


def test_a_default_prompt_length_shrinks_to_what_the_completion_leaves():
    args = GRPOConfig(max_completion_length=100).to_native()
    _check_context_length(_model(512), args)
    assert args.rollout.max_prompt_length == 412
    fits = GRPOConfig(max_completion_length=100).to_native()
    _check_context_length(_model(2048), fits)
    assert fits.rollout.max_prompt_length == 512


def test_a_chosen_prompt_length_that_does_not_fit_names_the_largest_that_does():
    args = GRPOConfig(max_prompt_length=400, max_completion_length=200)
    with pytest.raises(ValueError, match=r"max_prompt_length \(400\) \+ max_completion_length "
                       r"\(200\) = 600 tokens exceeds the model's max_position_embeddings=512; "
                       r"set max_prompt_length to at most 312 \(or leave it unset"):
        _check_context_length(_model(512), args)
    unlimited = GRPOConfig(max_prompt_length=None, max_completion_length=200)
    _check_context_length(_model(512), unlimited)  # None keeps whole prompts, as before
    assert unlimited.max_prompt_length is None


def test_a_completion_that_fills_the_context_is_an_error_with_the_fix():
    for completion in (512, 600):
        args = GRPOConfig(max_completion_length=completion)
        with pytest.raises(ValueError, match=rf"max_completion_length={completion} leaves no "
                           r"room for a prompt in the model's max_position_embeddings=512; "
                           r"set max_completion_length below 512"):
            _check_context_length(_model(512), args)


def constant_reward(prompts, completions, **kwargs):
    return [1.0 for _ in completions]


def test_a_run_that_trains_nothing_says_so_with_the_likely_causes(tiny_model_dir, tmp_path,
                                                                  caplog, monkeypatch):
    import mtgrpo.trainer.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "NOTHING_LEARNED_STEPS", 2)  # the streak, shortened
    trainer = GRPOTrainer(str(tiny_model_dir), constant_reward,
                          args=common.args(tmp_path, max_steps=3, report_at_end=False),
                          train_dataset=common.rows())
    with caplog.at_level(logging.WARNING, logger="mtgrpo"):
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "nothing was trained" in r.getMessage()]
    assert len(warnings) == 2, warnings  # once during the run, once at its end
    during, at_end = warnings
    assert during.startswith("nothing was trained in the last 2 steps: within every group")
    assert at_end.startswith("nothing was trained in all 3 steps of this run")
    for cause in ("frac_reward_zero_std=1", "reward_std=0", "tasks/alpha/zero_gradient_rate=1",
                  "a reward function that returns the same value for every completion",
                  "temperature (1.0) too low", "tasks too hard or too easy",
                  "num_generations (4) too small"):
        assert cause in at_end, cause


def test_a_run_that_learns_gives_no_such_warning(tiny_model_dir, tmp_path, caplog):
    trainer = GRPOTrainer(str(tiny_model_dir), common.length_bonus,
                          args=common.args(tmp_path, max_steps=2, report_at_end=False),
                          train_dataset=common.rows())
    with caplog.at_level(logging.WARNING, logger="mtgrpo"):
        trainer.train()
    assert "nothing was trained" not in caplog.text


def test_train_ends_with_the_summary_and_the_report_figures(tiny_model_dir, tmp_path, capsys,
                                                             caplog):
    trainer = GRPOTrainer(str(tiny_model_dir), [common.alpha_reward, common.beta_reward],
                          args=common.args(tmp_path, max_steps=2, report_at_end=True),
                          train_dataset=common.rows())
    with caplog.at_level(logging.INFO, logger="mtgrpo"):
        trainer.train()
    printed = capsys.readouterr().out
    assert f"run directory: {tmp_path}" in printed
    assert "alpha" in printed  # the per-task table
    assert "beta" in printed
    assert sorted(tmp_path.glob("report/*.png")), "no report figures"
    # off a terminal (no live bar), each logged step is one INFO line
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split("  ")[0] for line in lines] == ["step 1/2", "step 2/2"]
    assert all(" loss " in line and "grad_norm" in line for line in lines)


def test_report_at_end_false_prints_and_writes_neither(tiny_model_dir, tmp_path, capsys,
                                                       caplog, monkeypatch):
    import mtgrpo.trainer.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "use_bar", lambda: True)  # a live bar
    trainer = GRPOTrainer(str(tiny_model_dir), [common.alpha_reward, common.beta_reward],
                          args=common.args(tmp_path, max_steps=2, report_at_end=False,
                                           disable_tqdm=False),
                          train_dataset=common.rows())
    with caplog.at_level(logging.INFO, logger="mtgrpo"):
        trainer.train()
    assert "run directory:" not in capsys.readouterr().out
    assert not (tmp_path / "report").exists()
    # the live bar shows each step: no log line repeats it
    assert not [r for r in caplog.records if r.getMessage().startswith("step ")]


def test_the_step_line_shows_loss_reward_accuracies_and_gradient_norm():
    from mtgrpo.trainer.metrics import step_line

    record = {"loss": 0.01234, "reward": 0.5, "accuracy/worst": 0.25,
              "accuracy/worst_task": "alpha", "accuracy/average": 0.5, "grad_norm": 1.5}
    assert step_line(3, 10, record) == (
        "step 3/10  loss 0.01234  reward 0.5  train batch: worst 25.0% (alpha) avg 50.0%  "
        "grad_norm 1.5")
    assert step_line(1, 2, {"loss": float("nan")}) == (
        "step 1/2  loss -  reward -  train batch: worst - avg -  grad_norm -")


def test_mtgrpo_train_prints_the_summary_once(tiny_model_dir, tmp_path, capsys):
    import yaml

    from mtgrpo.cli import main

    config = {"model": {"name_or_path": str(tiny_model_dir)}, "output_dir": str(tmp_path / "run"),
              "tasks": {"tasks": ["countdown:easy"], "train_size": 8, "eval_size": 2,
                        "workers": 0, "cache_dir": str(tmp_path / "cache")},
              "max_steps": 1, "num_generations": 2, "prompts_per_step": 2,
              "max_completion_length": 8, "save_steps": 0}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", str(tmp_path / "run.yaml")]) == 0
    assert capsys.readouterr().out.count("run directory:") == 1  # the trainer's, not twice
    assert sorted((tmp_path / "run" / "report").glob("*.png"))
