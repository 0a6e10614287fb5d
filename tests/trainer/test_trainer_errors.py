"""Bad input fails before training, with the value and the fix in the message."""

from __future__ import annotations

import logging

import pytest
import trainer_helpers as common

from mtgrpo import GRPOTrainer
from mtgrpo.rewards import RewardError


def _trainer(model, tmp_path, rewards=None, rows=None, **overrides):
    return GRPOTrainer(
        str(model), rewards if rewards is not None else [common.alpha_reward, common.beta_reward],
        args=common.args(tmp_path, max_steps=1, **overrides),
        train_dataset=rows if rows is not None else common.rows(),
    )


def test_a_task_without_any_routed_reward_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="beta"):
        _trainer(tiny_model_dir, tmp_path, rewards={"alpha": [common.alpha_reward_routed]})


def test_missing_task_column_names_the_columns(tiny_model_dir, tmp_path):
    # Without any task column the rows are single-task data (task 'default', see
    # test_trainer_trl_surface.py); a column named explicitly, or one some rows lack, must exist.
    rows = [{"prompt": "hi"}]
    with pytest.raises(ValueError, match=r"no task column 'family'; columns present: \['prompt'\]"):
        _trainer(tiny_model_dir, tmp_path, rows=rows, task_column="family")
    mixed = [{"prompt": "hi", "task": "alpha"}, {"prompt": "ho"}]
    with pytest.raises(ValueError, match=r"row 1 has no task column 'task'"):
        _trainer(tiny_model_dir, tmp_path, rows=mixed)


def test_missing_prompt_column(tiny_model_dir, tmp_path):
    rows = [{"question": "hi", "task": "alpha"}]
    with pytest.raises(ValueError, match="no prompt column 'prompt'"):
        _trainer(tiny_model_dir, tmp_path, rewards=[common.length_bonus], rows=rows)


def test_long_prompt_error_and_truncation(tiny_model_dir, tmp_path, caplog):
    rows = [{"prompt": "x" * 80, "task": "alpha"}, {"prompt": "short", "task": "alpha"}]
    with pytest.raises(ValueError, match="80-token prompt, longer than max_prompt_length=32"):
        _trainer(tiny_model_dir, tmp_path, rewards=[common.length_bonus], rows=rows,
                 max_prompt_length=32, on_long_prompt="error")
    with caplog.at_level(logging.WARNING):
        trainer = _trainer(tiny_model_dir, tmp_path, rewards=[common.length_bonus], rows=rows,
                           max_prompt_length=32)
    assert len(trainer.train_prompts.tokens(0)) == 32
    assert "truncated to their last 32 tokens" in caplog.text


def test_a_reward_function_missing_a_column_fails_before_anything_is_generated(tiny_model_dir,
                                                                              tmp_path):
    def needs_answer(prompts, completions, answer, **kwargs):
        return [1.0 for _ in completions]

    with pytest.raises(RewardError, match=r"'needs_answer' needs the dataset column\(s\) "
                                          r"\['answer'\]"):
        _trainer(tiny_model_dir, tmp_path, rewards=[needs_answer])
    assert not list(tmp_path.glob("checkpoint-*")), "no training happened"


def test_unscorable_completions_raise_by_default(tiny_model_dir, tmp_path):
    def only_alpha(prompts, completions, task, **kwargs):
        return [1.0 if t == "alpha" else None for t in task]

    trainer = _trainer(tiny_model_dir, tmp_path, rewards=[only_alpha])
    with pytest.raises(RewardError, match="beta"):
        trainer.train()


def test_unknown_reward_name_and_empty_rewards(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="'countdown_rewrd' is not a registered reward"):
        _trainer(tiny_model_dir, tmp_path, rewards=["countdown_rewrd"])
    with pytest.raises(ValueError, match="reward_funcs is empty"):
        _trainer(tiny_model_dir, tmp_path, rewards=[])


def test_test_split_rows_are_refused_for_training(tiny_model_dir, tmp_path):
    rows = [{"prompt": "hi", "task": "alpha", "split": "test"}]
    with pytest.raises(ValueError, match="is test data"):
        _trainer(tiny_model_dir, tmp_path, rewards=[common.length_bonus], rows=rows)


def test_missing_tracker_fails_before_loading_the_model(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ImportError, match="pip install wandb"):
        # the model path does not exist: the tracker check must come first
        _trainer(tmp_path / "no-model", tmp_path, report_to=["wandb"])


def test_tokenizer_without_pad_token_gets_eos(tiny_model_dir, tmp_path, caplog):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.pad_token = None
    with caplog.at_level(logging.WARNING):
        trainer = GRPOTrainer(str(tiny_model_dir), [common.length_bonus],
                              args=common.args(tmp_path, max_steps=1),
                              train_dataset=common.rows(), processing_class=tokenizer)
    assert trainer.tokenizer.pad_token == trainer.tokenizer.eos_token
    assert "no pad token" in caplog.text


def test_resume_without_a_checkpoint_is_a_clear_error(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, resume_from_checkpoint=True)
    with pytest.raises(FileNotFoundError, match="no checkpoint to resume from"):
        trainer.train()


def test_lengths_beyond_the_model_context_are_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings=512"):
        _trainer(tiny_model_dir, tmp_path, max_prompt_length=500, max_completion_length=100)


@pytest.mark.parametrize(
    ("weighting", "params", "message"),
    [
        ("mt_grpo", {"min_weight": 0.6}, r"'min_weight' is 0.6, but 2 tasks .* 1/K = 0.5"),
        ("fixed", {"weights": [1.0, 2.0, 3.0]},
         r"fixed weights need one number per task \(2\); got shape \(3,\)"),
    ],
)
def test_weighting_settings_that_do_not_fit_the_tasks_fail_before_loading_the_model(
        tmp_path, weighting, params, message):
    # the model path does not exist: the weighting, checked against the data's two tasks,
    # must fail first
    with pytest.raises(ValueError, match=message):
        _trainer(tmp_path / "no-model", tmp_path, task_weighting=weighting,
                 task_weighting_params=params)
