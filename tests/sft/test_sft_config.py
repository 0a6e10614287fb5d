"""``SFTConfig``: defaults, validation with the fix, step arithmetic, mapping input."""

from __future__ import annotations

import pytest

from mtgrpo.sft import SFTConfig
from mtgrpo.sft.train import step_schedule


def test_trl_defaults():
    config = SFTConfig()
    assert (config.learning_rate, config.num_train_epochs, config.per_device_train_batch_size,
            config.max_length, config.logging_steps, config.lr_scheduler_type,
            config.completion_only_loss, config.max_steps) == (
        2e-5, 3.0, 8, 1024, 10, "linear", True, None)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"learning_rate": 0.0}, r"learning_rate=0.0 must be a finite number > 0"),
        ({"learning_rate": float("nan")}, "learning_rate=nan"),
        ({"num_train_epochs": 0}, r"num_train_epochs=0 .* \(or set max_steps\)"),
        ({"max_steps": 0}, "max_steps=0 must be a positive integer or None"),
        ({"per_device_train_batch_size": 0}, "per_device_train_batch_size=0 must be a positive"),
        ({"gradient_accumulation_steps": 1.5}, "gradient_accumulation_steps=1.5"),
        ({"logging_steps": True}, "logging_steps=True must be a positive integer"),
        ({"max_length": -1}, "max_length=-1"),
        ({"max_tokens_per_microbatch": 0}, "max_tokens_per_microbatch=0"),
        ({"warmup_ratio": 1.5}, r"warmup_ratio=1.5 must be a finite number in \[0, 1\]"),
        ({"weight_decay": -0.1}, "weight_decay=-0.1"),
        ({"max_grad_norm": -1.0}, r"max_grad_norm=-1.0 .* \(0: no clipping\)"),
        ({"eval_fraction": 1.0}, r"eval_fraction=1.0 must be a finite number in \[0, 1\)"),
        ({"eval_steps": -1}, "eval_steps=-1 must be an integer >= 0"),
        ({"seed": "x"}, "seed='x' must be an integer"),
        ({"lr_scheduler_type": "poly"},
         "unknown learning-rate schedule 'poly'; valid names: constant, cosine, linear"),
        ({"on_long_example": "cut"}, "on_long_example='cut' is not one of: truncate, drop, error"),
        ({"output_dir": " "}, "output_dir must be a non-empty path"),
    ],
)
def test_invalid_options_name_the_rule(options, match):
    with pytest.raises(ValueError, match=match):
        SFTConfig(**options)


def test_scheduler_alias_is_canonicalised():
    assert SFTConfig(lr_scheduler_type="constant_with_warmup").lr_scheduler_type == "constant"


@pytest.mark.parametrize(
    ("examples", "batch", "accum", "epochs", "max_steps", "expected"),
    [
        # ceil(10 / (2*2)) = 3 steps per epoch, x 3 epochs
        (10, 2, 2, 3.0, None, 9),
        # fractional epochs: ceil(0.5 * 3) = 2
        (10, 2, 2, 0.5, None, 2),
        # max_steps wins
        (10, 2, 2, 3.0, 7, 7),
        # fewer examples than one step: still one step per epoch
        (3, 8, 1, 2.0, None, 2),
    ],
)
def test_total_steps(examples, batch, accum, epochs, max_steps, expected):
    config = SFTConfig(per_device_train_batch_size=batch, gradient_accumulation_steps=accum,
                       num_train_epochs=epochs, max_steps=max_steps)
    assert config.total_steps(examples) == expected


def test_step_schedule_covers_each_epoch_once_in_a_seeded_order():
    steps = list(step_schedule(10, 4, 7, seed=3))
    assert [len(s) for s in steps] == [4, 4, 2, 4, 4, 2, 4]  # epoch = 4 + 4 + remainder 2
    for epoch in (steps[0:3], steps[3:6]):
        assert sorted(i for s in epoch for i in s) == list(range(10))
    assert steps[0:3] != steps[3:6]  # a new permutation per epoch
    assert steps == list(step_schedule(10, 4, 7, seed=3))
    assert steps != list(step_schedule(10, 4, 7, seed=4))


def test_from_dict_reads_yaml_strings_and_refuses_typos():
    config = SFTConfig.from_dict({"learning_rate": "1e-4", "max_steps": "20", "bf16": False})
    assert (config.learning_rate, config.max_steps) == (1e-4, 20)
    with pytest.raises(ValueError, match=r"'learning_rte' \(did you mean 'learning_rate'\?\)"):
        SFTConfig.from_dict({"learning_rte": 1e-4})
    with pytest.raises(ValueError, match="must be a mapping"):
        SFTConfig.from_dict(["learning_rate"])
    assert SFTConfig.from_dict(SFTConfig(seed=5).to_dict()) == SFTConfig(seed=5)
