"""GRPOConfig takes every field of TRL 1.16's GRPOConfig (enumerated from the installed TRL):
implemented ones act, no-effect ones warn when set, refused ones name the alternative."""

from __future__ import annotations

import dataclasses
import logging
import math
import typing

import pytest

from mtgrpo.compat import GRPOConfig, reference_markdown
from mtgrpo.compat.trl_fields import (
    OLDER_TRANSFORMERS_FIELDS,
    TRLCompatibleFields,
    compatibility_rows,
)
from mtgrpo.config import config_fields_help

trl = pytest.importorskip("trl")


def trl_fields() -> dict[str, object]:
    """Every field of TRL's GRPOConfig (transformers' TrainingArguments included) and its
    default."""
    out = {}
    for f in dataclasses.fields(trl.GRPOConfig):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING \
            else f.default
        out[f.name] = default
    return out


COMPAT = {f.name: f for f in dataclasses.fields(TRLCompatibleFields)}
REFUSED = sorted(name for name, f in COMPAT.items() if f.metadata["effect"] == "refused")
INERT = sorted(name for name, f in COMPAT.items() if f.metadata["effect"] == "none")


def test_every_trl_field_exists_and_is_classified():
    ours = {f.name for f in dataclasses.fields(GRPOConfig)}
    theirs = trl_fields()
    assert len(theirs) >= 190  # TRL 1.16 on transformers 5: 191
    assert sorted(set(theirs) - ours) == []
    implemented = set(theirs) - set(COMPAT)
    assert len(implemented) > 100
    # every compatibility field is TRL's, on this transformers or an older one mtgrpo admits
    assert set(REFUSED) | set(INERT) <= set(theirs) | set(OLDER_TRANSFORMERS_FIELDS)


def test_trl_defaults_construct_one_at_a_time_and_all_together():
    defaults = trl_fields()
    for name, value in defaults.items():
        GRPOConfig(**{name: value})
    args = GRPOConfig(**defaults)
    assert (args.output_dir, args.max_steps, args.num_train_epochs) == ("trainer_output", -1, 3.0)
    assert args.optim == "adamw_torch_fused"
    assert args.lr_scheduler_type == "linear"  # TRL hands a SchedulerType enum
    assert args.logging_strategy == "steps"
    assert args.save_strategy == "steps"
    assert args.eval_strategy == "no"
    assert args.report_to == []
    assert args.num_generations_eval == args.num_generations == 8  # TRL's None
    assert args.gradient_checkpointing is True  # TRL's default, honoured


def test_trl_value_forms_are_accepted():
    from transformers import IntervalStrategy, SchedulerType

    args = GRPOConfig(lr_scheduler_type=SchedulerType.COSINE, eval_strategy=IntervalStrategy.EPOCH,
                      lr_scheduler_kwargs='{"num_cycles": 0.25}', report_to="none",
                      generation_kwargs='{"num_beams": 2}', trust_remote_code=True)
    assert args.lr_scheduler_type == "cosine"
    assert args.eval_strategy == "epoch"
    assert args.lr_scheduler_kwargs == {"num_cycles": 0.25}
    assert args.generation_kwargs == {"num_beams": 2}
    assert args.model_init_kwargs == {"trust_remote_code": True}
    with pytest.raises(ValueError, match=r"lr_scheduler_kwargs='\{bad' is not a JSON object"):
        GRPOConfig(lr_scheduler_kwargs="{bad")


REFUSED_VALUES = {
    "use_liger_kernel": True, "liger_kernel_config": {"rope": True},
    "use_transformers_continuous_batching": True,
    "transformers_continuous_batching_config": {"max_queue": 2}, "use_transformers_paged": True,
    "torch_compile": True, "torch_compile_backend": "inductor", "torch_compile_mode": "default",
    "deepspeed": "ds_config.json", "fsdp": "full_shard", "fsdp_config": {"version": 2},
    "parallelism_config": object(), "activation_checkpointing": True,
    "activation_checkpointing_kwargs": {"every_n_layers": 2}, "auto_find_batch_size": True,
    "neftune_noise_alpha": 5.0, "log_completions_hub_repo": "me/completions",
}
ALTERNATIVES = {"use_liger_kernel": "chunks",
                "deepspeed": "accelerate launch --use_deepspeed", "fsdp": "accelerate launch",
                "auto_find_batch_size": "max_tokens_per_microbatch",
                "activation_checkpointing": "gradient_checkpointing"}


@pytest.mark.parametrize("name", REFUSED)
def test_refused_fields_name_what_to_use_instead(name):
    GRPOConfig(**{name: COMPAT[name].default})  # the default is fine
    with pytest.raises(ValueError, match=rf"{name}=.* is not supported by mtgrpo: "
                                         rf".*{ALTERNATIVES.get(name, '')}"):
        GRPOConfig(**{name: REFUSED_VALUES[name]})


def _other(value: object, annotation: object) -> object:
    """A value other than ``value`` that has the field's type."""
    if value is None:
        for kind, sample in ((list, ["x"]), (dict, {"x": 1}), (int, 2), (float, 0.5), (str, "x")):
            if kind.__name__ in str(annotation):
                return sample
        return "x"
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.5
    if isinstance(value, str):
        return "other"
    if isinstance(value, list):
        return ["x"]
    return "x"


@pytest.mark.parametrize("name", INERT)
def test_no_effect_fields_are_accepted_and_named_in_a_warning(name, caplog):
    default = COMPAT[name].default_factory() if COMPAT[name].default_factory is not \
        dataclasses.MISSING else COMPAT[name].default
    annotation = typing.get_type_hints(TRLCompatibleFields)[name]
    value = {"accelerator_config": {"split_batches": True}}.get(name, _other(default, annotation))
    with caplog.at_level(logging.WARNING, logger="mtgrpo.config"):
        GRPOConfig(**{name: value})
    assert name in caplog.text


def test_implemented_fields_are_documented_and_validated():
    own = {row[0] for row in config_fields_help(GRPOConfig, own_only=True)}
    for name in ("num_train_epochs", "eval_strategy", "save_strategy", "push_to_hub",
                 "hub_model_id", "optim", "lr_scheduler_kwargs", "gradient_checkpointing_kwargs",
                 "use_cpu", "generation_kwargs", "repetition_penalty", "min_p",
                 "shuffle_dataset", "disable_dropout", "cast_lm_head_to_fp32", "sync_ref_model",
                 "importance_sampling_level", "delta", "top_entropy_quantile", "entropy_coef",
                 "advantage_std_ddof"):
        assert name in own
    reference = reference_markdown()
    assert all(f"`{name}`" in reference for name, *_ in compatibility_rows())
    for options, message in [
        ({"save_strategy": "best"}, "needs metric_for_best_model"),
        ({"eval_strategy": "sometimes"}, "eval_strategy='sometimes' is not one of"),
        ({"optim": "adamw_magic"}, "optim='adamw_magic' is not an optimizer name"),
        ({"lr_scheduler_type": "zigzag"}, "unknown learning-rate schedule 'zigzag'"),
        ({"delta": 1.1}, r"delta=1.1 must exceed 1 \+ epsilon_high"),
        ({"top_entropy_quantile": 1.5}, "top_entropy_quantile=1.5 must be in"),
        ({"sync_ref_model": True}, "set beta > 0"),
        ({"advantage_std_ddof": 2}, "advantage_std_ddof=2 is out of range"),
        ({"importance_sampling_level": "group"}, "importance_sampling_level='group' is not one"),
        ({"max_steps": 0}, "or -1 to train for num_train_epochs"),
        ({"eval_strategy": "steps", "eval_steps": 0}, "needs eval_steps > 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            GRPOConfig(**options)


def test_epochs_size_the_run_when_max_steps_is_unset():
    args = GRPOConfig(per_device_train_batch_size=4, num_generations=4, num_train_epochs=2.5)
    assert args.resolved_prompts_per_step() == 1
    assert args.steps_per_epoch(17) == 17
    assert args.training_steps(17) == math.ceil(2.5 * 17) == 43
    assert GRPOConfig(per_device_train_batch_size=8, num_generations=4).training_steps(17) == 24
    assert GRPOConfig(max_steps=5).training_steps(1000) == 5
    with pytest.raises(ValueError, match="iterable dataset"):
        GRPOConfig().training_steps(None)
    # fractions of the run, rounded up (transformers)
    fractional = GRPOConfig(warmup_steps=0.1, logging_steps=0.25, save_steps=0.5)
    assert fractional.resolved_warmup_steps(43) == 5
    assert fractional.interval(fractional.logging_steps, 43) == 11
    assert fractional.interval(0, 43) == 0


def test_eval_strategy_follows_eval_steps_unless_given():
    assert GRPOConfig().eval_strategy == "no"
    assert GRPOConfig(eval_steps=5).eval_strategy == "steps"
    steps = GRPOConfig(eval_strategy="steps", logging_steps=3)
    assert steps.eval_steps == 3  # TRL: eval_steps defaults to logging_steps


def test_sequence_level_warning_is_trls(caplog):
    with caplog.at_level(logging.WARNING, logger="mtgrpo.config"):
        GRPOConfig(importance_sampling_level="sequence", loss_type="dapo")
    assert "weights each sequence by its completion length" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mtgrpo.config"):
        GRPOConfig(importance_sampling_level="sequence", loss_type="grpo")
    assert caplog.text == ""


def test_tool_loop_fields_act_and_are_checked(caplog: pytest.LogCaptureFixture) -> None:
    from mtgrpo.trainer.agents import agent_setup

    def ping(text: str) -> str:
        """Ping.

        Args:
            text: Anything.
        """
        return text

    with caplog.at_level(logging.WARNING, logger="mtgrpo.config"):
        config = GRPOConfig(max_tool_calling_iterations=3, tool_call_timeout=2.5)
    assert "max_tool_calling_iterations" not in caplog.text  # acts: no "no effect" warning
    assert "max_tool_calling_iterations" not in COMPAT
    helps = {name: text for name, _, _, text in config_fields_help(GRPOConfig, own_only=True)}
    assert "rounds of tool calls" in helps["max_tool_calling_iterations"]
    assert "seconds one tool call may take" in helps["tool_call_timeout"]
    rollouts = agent_setup([ping], None).rollouts(None, None, config, None, False)
    assert (rollouts.loop.max_iterations, rollouts.loop.timeout) == (3, 2.5)
    assert GRPOConfig().tool_call_timeout == 60.0
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match=rf"tool_call_timeout={bad!r} must be a positive "
                                             r"number of seconds .*tool_call_timeout=60"):
            GRPOConfig(tool_call_timeout=bad)
    with pytest.raises(ValueError, match=r"max_tool_calling_iterations=-1 must be an integer"):
        GRPOConfig(max_tool_calling_iterations=-1)
