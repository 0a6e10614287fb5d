"""What a TRL user's first script meets: lengths that fit the model by themselves."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import trainer_helpers as common

from mtgrpo import GRPOConfig, GRPOTrainer
from mtgrpo.reporting import read_metrics
from mtgrpo.trainer.trainer import _check_context_length


def _model(positions: int) -> SimpleNamespace:
    return SimpleNamespace(config=SimpleNamespace(max_position_embeddings=positions))


def test_a_trl_script_that_sets_only_the_completion_length_trains_on_the_tiny_model(
        tiny_model_dir, tmp_path, caplog):
    # TRL 1.x has no max_prompt_length, so a TRL script leaves it at mtgrpo's default (512),
    # which with 16 completion tokens does not fit the tiny model's 512 positions
    args = GRPOConfig(output_dir=str(tmp_path), max_completion_length=16, max_steps=1,
                      num_generations=4, per_device_train_batch_size=4, bf16=False)
    with caplog.at_level(logging.INFO, logger="mtgrpo"):
        trainer = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=common.length_bonus,
                              args=args, train_dataset=common.rows())
    assert args.max_prompt_length == 512 - 16
    assert "max_prompt_length lowered from its default 512 to 496" in caplog.text
    trainer.train()
    assert [r["step"] for r in read_metrics(tmp_path, split="train")] == [1]


def test_a_default_prompt_length_shrinks_to_what_the_completion_leaves():
    args = GRPOConfig(max_completion_length=100)
    _check_context_length(_model(512), args)
    assert args.max_prompt_length == 412
    fits = GRPOConfig(max_completion_length=100)
    _check_context_length(_model(2048), fits)
    assert fits.max_prompt_length == 512


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

