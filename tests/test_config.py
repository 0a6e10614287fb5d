"""GRPOConfig / RunConfig: TRL names, derived batch sizes, validation with the fix, YAML."""

from __future__ import annotations

import dataclasses

import pytest

import mtgrpo
from mtgrpo.compat import GRPOConfig, load_run_config
from mtgrpo.config import (
    BatchConfig,
    LossConfig,
    TrainConfig,
    apply_overrides,
    config_fields_help,
    run_config_from_dict,
)


def test_trl_defaults_where_trl_has_the_option():
    args = GRPOConfig()
    assert args.loss_type == "dapo"
    assert args.beta == 0.0
    assert args.epsilon == 0.2
    assert args.resolved_epsilon_high == 0.2
    assert args.scale_rewards == "group"
    assert args.multi_objective_aggregation == "sum_then_normalize"
    assert args.num_generations == 8
    assert args.learning_rate == 1e-6


def test_prompts_per_step_follows_trl_derivation():
    # TRL: a generation batch is 8 completions per micro-batch x steps_per_generation=4
    # micro-batches = 32 completions = 8 prompts of 4; gradient_accumulation_steps=2 makes it
    # 2 optimizer steps of 16 completions
    args = GRPOConfig(per_device_train_batch_size=8, gradient_accumulation_steps=2,
                      steps_per_generation=4, num_generations=4)
    assert args.resolved_prompts_per_step() == 8
    assert args.resolved_prompts_per_step(world_size=2) == 16
    assert args.updates_per_generation() == 2
    assert args.completions_per_optimizer_step() == 16
    # TRL's default steps_per_generation is gradient_accumulation_steps: one optimizer step
    default = GRPOConfig(per_device_train_batch_size=8, gradient_accumulation_steps=2,
                         num_generations=4)
    assert default.steps_per_generation == 2
    assert (default.resolved_prompts_per_step(), default.updates_per_generation()) == (4, 1)
    assert GRPOConfig(prompts_per_step=5, num_generations=4).resolved_prompts_per_step(3) == 5


def test_run_files_count_optimizer_steps_per_generation_batch():
    # TrainConfig (run files, the CLI): steps_per_generation counts optimizer steps, so the
    # same numbers mean 8 x 2 accumulation x 4 optimizer steps / 4 = 16 prompts
    args = TrainConfig(batch=BatchConfig(per_device_train_batch_size=8,
                                         gradient_accumulation_steps=2,
                                         steps_per_generation=4, num_generations=4))
    assert args.resolved_prompts_per_step() == 16
    assert args.updates_per_generation() == 4
    assert args.completions_per_optimizer_step() == 16
    assert TrainConfig().batch.steps_per_generation == 1


def test_aliases_are_merged():
    args = GRPOConfig(reward_aggregation_method="na", scale_rewards=False, report_to="none")
    assert args.multi_objective_aggregation == "normalize_then_sum"
    assert args.reward_aggregation_method is None
    assert args.scale_rewards == "none"
    assert args.report_to == []
    assert GRPOConfig(task_weighting="MTGRPO").task_weighting == "mt_grpo"
    assert GRPOConfig(batch_construction="rp").batch_construction == "ratio_preserving"


@pytest.mark.parametrize(("options", "message"), [
    ({"num_generations": 1}, "needs at least 2"),
    ({"temperature": 0.0}, "identical completions"),
    ({"per_device_train_batch_size": 6, "num_generations": 4},
     "6 completions is not a multiple of num_generations=4"),
    ({"loss_type": "ppo"}, "loss_type='ppo' is not one of"),
    ({"task_weighting": "best_case"}, "unknown weighting strategy 'best_case'"),
    ({"batch_construction": "random"}, "unknown sampler 'random'"),
    ({"report_to": ["mlflow"]}, "valid trackers: tensorboard, wandb, trackio"),
    ({"multi_objective_aggregation": "an", "reward_aggregation_method": "gdpo"},
     "conflicting reward aggregation settings"),
    ({"top_p": 0.0}, "top_p=0.0 is out of range"),
    ({"max_steps": 0}, "max_steps=0 must be a positive integer"),
])
def test_invalid_combinations_fail_with_the_fix(options, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**options)


def test_run_config_from_yaml_with_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "model: my/model\n"
        "learning_rate: 1.0e-5\n"
        "num_generations: 4\n"
        "per_device_train_batch_size: 8\n"
        "task_weighting: mt_grpo\n"
        "task_weighting_params: {lam: 0.25}\n"
        "rewards: {countdown: [countdown_reward]}\n"
        "peft: {r: 8}\n"
    )
    run = load_run_config(path, ["--learning_rate", "2e-5", "--model.dtype=bfloat16",
                                 "--task_weighting_params.lam", "0.5"])
    assert run.model.name_or_path == "my/model"
    assert run.model.dtype == "bfloat16"
    assert run.training.optimization.learning_rate == 2e-5
    assert run.training.multitask.task_weighting_params == {"lam": 0.5}
    assert run.rewards.to_value() == {"countdown": ["countdown_reward"]}
    assert run.rewards.by_task == {"countdown": ["countdown_reward"]}
    assert run.peft.to_dict()["r"] == 8
    assert run.peft.lora_alpha == 32  # the section's default
    assert run.to_dict()["rewards"] == {"countdown": ["countdown_reward"]}
    assert run.to_dict()["model"]["name_or_path"] == "my/model"


def test_unknown_options_suggest_the_right_name():
    with pytest.raises(ValueError, match=r"'learning_rat' \(did you mean 'learning_rate'\?\)"):
        run_config_from_dict({"learning_rat": 1e-5})
    with pytest.raises(ValueError, match=r"unknown model option\(s\): 'dtyp'"):
        run_config_from_dict({"model": {"dtyp": "bf16"}})
    with pytest.raises(ValueError, match="needs a value"):
        apply_overrides({}, ["--beta"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run_config("/nonexistent.yaml")


def test_a_misspelled_keyword_names_the_closest_option():
    # Python's own error says only "unexpected keyword argument 'num_generation'"
    with pytest.raises(TypeError, match=r"unknown GRPOConfig option\(s\): 'num_generation' "
                       r"\(did you mean 'num_generations'\?\); correct the name"):
        GRPOConfig(output_dir="out", num_generation=4)
    with pytest.raises(TypeError, match=r"'lerning_rate' \(did you mean 'learning_rate'\?\), "
                       r"'beta2' \(did you mean 'beta'\?\)"):
        GRPOConfig(lerning_rate=1e-5, beta2=0.1)
    assert GRPOConfig(num_generations=4).num_generations == 4


def test_every_field_has_help_text():
    rows = config_fields_help()
    assert len(rows) > 50
    missing = [name for name, _, _, text in rows if not text]
    assert not missing, f"fields without help: {missing}"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"learning_rate": "fast"}, r"learning_rate: 'fast' \(str\) is not a number"),
        ({"max_steps": 2.5}, r"max_steps: 2.5 \(float\) is not an integer"),
        ({"num_generations": True}, r"num_generations: True \(bool\) is not an integer"),
        ({"report_to": 5}, r"report_to: 5 \(int\) is not a string or a list of strings"),
        ({"task_weighting_params": [1]}, r"task_weighting_params: \[1\] \(list\) is not a mapping"),
        ({"beta": None}, r"beta: None \(NoneType\) is not a number"),
    ],
)
def test_a_wrong_type_names_the_option_and_the_expected_type(options, message):
    with pytest.raises(TypeError, match=message):
        GRPOConfig(**options)


def test_wrong_types_in_a_run_file_and_its_sections(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("learning_rate: fast\n")
    with pytest.raises(TypeError, match=r"learning_rate: 'fast' \(str\) is not a number; set "
                                        r"learning_rate to a number in the run file or with "
                                        r"--learning_rate"):
        load_run_config(path)
    path.write_text("learning_rate: 1e-5\nmodel: {trust_remote_code: maybe}\n")
    with pytest.raises(TypeError, match=r"model.trust_remote_code: 'maybe' \(str\) is not "
                                        r"true or false"):
        load_run_config(path)
    assert load_run_config(path, ["--model.trust_remote_code", "true"]) \
        .training.optimization.learning_rate \
        == 1e-5  # YAML reads 1e-5 as a string; numeric options convert it


# ------------------------------------------------------------------ validated when built
def _weighting_names():
    from mtgrpo.algo.weighting import WEIGHTINGS

    return WEIGHTINGS.names()


def _sampler_names():
    from mtgrpo.algo.sampling import SAMPLERS

    return SAMPLERS.names()


@pytest.mark.parametrize("strategy", _weighting_names())
def test_a_typo_in_task_weighting_params_fails_when_the_config_is_built(strategy):
    """Every strategy: the misspelt key and the valid parameters are named by GRPOConfig
    itself, before a trainer (or a model) exists."""
    from mtgrpo.algo.weighting import WEIGHTINGS

    valid = [p.name for p in WEIGHTINGS.get(strategy).PARAMS]
    params = {"lamm": 0.5, "weights": [1.0]} if strategy == "fixed" else {"lamm": 0.5}
    with pytest.raises(ValueError, match=rf"unknown parameter 'lamm' for weighting strategy "
                                         rf"'{strategy}'.*valid parameters: "
                                         rf"{valid[0] if valid else 'none'}"):
        GRPOConfig(task_weighting=strategy, task_weighting_params=params)


@pytest.mark.parametrize("sampler", _sampler_names())
def test_a_typo_in_batch_construction_params_fails_when_the_config_is_built(sampler):
    from mtgrpo.algo.sampling import SAMPLERS, _options

    valid = ", ".join(_options(SAMPLERS.get(sampler)))
    with pytest.raises(ValueError, match=rf"sampler '{sampler}' has no option\(s\) "
                                         rf"\['oversample'\]; valid options: {valid}$"):
        GRPOConfig(batch_construction=sampler, batch_construction_params={"oversample": 3})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"task_weighting": "mt_grpo", "task_weighting_params": {"lam": -1}},
         r"mt_grpo parameter 'lam' must be a finite number in \[0, inf\); got -1"),
        ({"task_weighting": "fixed"}, r"weighting strategy 'fixed' needs parameter 'weights'"),
        ({"batch_construction": "dynamic",
          "batch_construction_params": {"oversample_factor": 0}},
         r"oversample_factor must be a finite number > 0; got 0"),
        ({"batch_construction": "ratio_preserving",
          "batch_construction_params": {"target_rounding": "nearest"}},
         r"unknown target rounding 'nearest'; valid names: largest_remainder, multinomial"),
        ({"model_init_kwargs": {"dtpye": "bfloat16"}},
         r"model_init_kwargs has unknown option\(s\) \['dtpye'\]"),
        ({"generation_backend": "vllm"}, r"unknown generation backend 'vllm'; valid names: hf, "
                                         r"static"),
        ({"loss_type": "ppo"}, r"loss_type='ppo' is not one of: bnpo, cispo, dapo, dr_grpo, "
                               r"grpo, luspo, sapo, vespo"),
        ({"multi_objective_aggregation": "mean"}, r"unknown reward aggregation 'mean'"),
        ({"on_unscorable": "skip"}, r"on_unscorable='skip' is not one of: auto, raise, warn, "
                                    r"zero_advantage"),
    ],
)
def test_every_choice_and_params_value_is_checked_by_the_config(options, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**options)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"tasks": {"suite": "mtgrpo3", "train_sise": 10}},
         r"unknown tasks option\(s\): 'train_sise' \(did you mean 'train_size'\?\)"),
        ({"tasks": {"suite": "mtgrpo4"}}, r"unknown task suite 'mtgrpo4'; valid names: "),
        ({"tasks": {"tasks": ["countdwn:easy"]}}, r"unknown task family 'countdwn'"),
        ({"tasks": {"suite": "mtgrpo3", "tasks": ["countdown:easy"]}},
         r"needs exactly one of 'suite'"),
        ({"tasks": {"suite": "mtgrpo3", "prompt_format": "markdown"}},
         r"unknown prompt format 'markdown'"),
        ({"tasks": {"suite": "mtgrpo3", "reward_scheme": {"correct": 0.5}}},
         r"the scheme needs correct >= 1"),
        ({"peft": {"rank": 8}}, r"unknown peft \(LoRA\) option\(s\): 'rank'"),
        ({"peft": {"r": 0}}, r"peft.r=0 must be a positive integer"),
        ({"sft": {"num_exmaples": 8}},
         r"unknown sft option\(s\): 'num_exmaples' \(did you mean 'num_examples'\?\)"),
        ({"sft": {"template": "chatty"}}, r"template 'chatty'|is not a valid format string|"
                                          r"template must"),
        ({"sft": {"reasoning": "verbose"}}, r"unknown solution reasoning 'verbose'"),
        ({"sft": {"learning_rate": -1}}, r"learning_rate=-1 must be a finite number > 0"),
        ({"sft": {"output_dir": "elsewhere"}}, r"sft.output_dir is set by the run"),
        ({"rewards": ["math_rewrd"]}, r"reward 'math_rewrd' is not a registered reward"),
        ({"rewards": {"countdown": [{"target_length": 3}]}}, r"needs a 'name'"),
        ({"model": {"name_or_path": "m", "dtype": "float8"}}, r"unknown dtype 'float8'"),
    ],
)
def test_every_section_is_validated_when_the_run_config_is_built(section, message):
    with pytest.raises((ValueError, TypeError), match=message):
        run_config_from_dict({"model": "m", **section})


def test_sections_are_typed_and_round_trip_through_a_run_file(tmp_path):
    import yaml

    raw = {
        "model": "m",
        "tasks": {"suite": "mtgrpo3", "train_size": 50, "reward_scheme": {"formatted": 0.2}},
        "rewards": {"*": ["format_reward"], "countdown:easy": ["countdown_reward"]},
        "peft": {"r": 4, "init_lora_weights": "gaussian"},
        "sft": {"num_examples": 8, "template": "answer_only", "learning_rate": "1e-3",
                "lora": {"r": 2}},
    }
    run = run_config_from_dict(raw)
    from mtgrpo.tasks import SUITES

    assert run.tasks.task_list == list(SUITES.get("mtgrpo3"))
    assert run.tasks.scheme().formatted == 0.2
    assert run.tasks.eval_size == 200  # the suite's default
    assert run.rewards.every_task == ["format_reward"]
    assert run.rewards.by_task == {"countdown:easy": ["countdown_reward"]}
    assert (run.peft.r, run.peft.lora_alpha, run.peft.other) == (4, 32,
                                                                 {"init_lora_weights": "gaussian"})
    assert run.sft.num_examples == 8
    assert run.sft.training == {"learning_rate": "1e-3"}
    sft = run.sft.sft_config("out/sft", seed=5)
    assert (sft.learning_rate, sft.seed, sft.merge_lora, sft.output_dir) == \
        (1e-3, 5, True, "out/sft")
    written = tmp_path / "config.yaml"
    written.write_text(yaml.safe_dump(run.to_dict()))
    again = load_run_config(written)
    assert again.to_dict() == run.to_dict()


# ------------------------------------------------------------------ the native, nested tree
def test_the_native_config_is_nested_and_every_option_is_named_once():
    from mtgrpo.config import FIELD_SECTION, SECTIONS

    config = TrainConfig()
    assert config.loss.beta == 0.0
    assert config.batch.num_generations == 8
    assert len(FIELD_SECTION) == sum(len(dataclasses.fields(k)) for k in SECTIONS.values())
    assert set(config.to_flat()) == set(FIELD_SECTION)
    assert TrainConfig.from_flat(config.to_flat()) == config  # the run file's form round-trips
    nested = TrainConfig.from_flat({"loss": {"beta": 0.04}, "learning_rate": "1e-5"})
    assert (nested.loss.beta, nested.optimization.learning_rate) == (0.04, 1e-5)
    assert TrainConfig(loss={"beta": 0.04}).loss.beta == 0.04  # a section as a mapping
    with pytest.raises(ValueError, match=r"unknown config option\(s\): 'betta' \(did you mean "
                                         r"'beta'\?\)"):
        TrainConfig.from_flat({"betta": 0.1})
    with pytest.raises(ValueError, match=r"unknown loss option\(s\): 'learning_rate'"):
        TrainConfig.from_flat({"loss": {"learning_rate": 0.1}})  # an option of another section
    with pytest.raises(TypeError, match=r"LossConfig.*'betta' \(did you mean 'beta'\?\)"):
        LossConfig(betta=0.1)


def test_every_native_option_acts():
    """No option of the native tree is accepted without effect: each is read by the code
    (the TRL fields that do not act live in mtgrpo.compat.trl_fields)."""
    import pathlib
    import re

    from mtgrpo.config import FIELD_SECTION

    source = "\n".join(p.read_text() for p in pathlib.Path(mtgrpo.__file__).parent.rglob("*.py")
                       if p.name != "config.py" and "compat" not in p.parts)
    read_elsewhere = {
        # DDP's options, read as f"ddp_{name}" (trainer/building.py)
        "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers",
        "ddp_static_graph",
        # read by TrainConfig's own step counting (training_steps, optimizer_interval)
        "step_unit",
    }
    unread = [name for name in FIELD_SECTION
              if name not in read_elsewhere and not re.search(rf"\b{name}\b", source)]
    assert unread == []
    assert 'f"ddp_{name}"' in source


def test_trls_flat_config_builds_the_native_tree():
    args = GRPOConfig(beta=0.04, gradient_accumulation_steps=2, steps_per_generation=4,
                      per_device_train_batch_size=4, num_generations=4, max_steps=6)
    native = args.to_native()
    assert native.loss.beta == 0.04
    assert native.schedule.step_unit == "optimizer"
    assert native.batch.steps_per_generation == 2  # 4 micro-batches of 2 per optimizer step
    assert native.training_steps() == args.training_steps() == 3
    assert args.to_native() is native  # built once while no field changes
    args.beta = 0.1
    assert args.to_native().loss.beta == 0.1  # a changed field is read again
    assert args.loss.beta == 0.1  # the sections read through the native tree
    with pytest.raises(AttributeError, match=r"read-only views; set the flat field instead "
                                             r"\(args.beta = 0.5\)"):
        args.loss.beta = 0.5  # the tree is rebuilt from the flat fields, so it cannot be written
    assert not hasattr(args, "set")


def test_a_flat_view_serves_code_written_for_training_arguments():
    from mtgrpo.config import FlatOptions

    config = TrainConfig()
    view = FlatOptions(config)
    assert view.logging_steps == config.output.logging_steps
    view.logging_steps = 5
    assert config.output.logging_steps == 5
    assert view.to_sanitized_dict()["logging_steps"] == 5
    with pytest.raises(AttributeError, match="not an option"):
        view.logging_stepz = 1


def test_run_files_may_hold_trls_fields(tmp_path, caplog):
    import logging

    path = tmp_path / "run.yaml"
    path.write_text("dataloader_num_workers: 4\nreward_aggregation_method: na\n"
                    "vllm_importance_sampling_cap: 2.0\n")
    with caplog.at_level(logging.WARNING, logger="mtgrpo.config"):
        run = load_run_config(path)
    assert "dataloader_num_workers" in caplog.text  # accepted, named as having no effect
    assert run.training.advantage.multi_objective_aggregation == "normalize_then_sum"
    assert run.training.vllm.vllm_importance_sampling_clip_max == 2.0
    path.write_text("use_liger_kernel: true\n")
    with pytest.raises(ValueError, match="use_liger_kernel=True is not supported"):
        load_run_config(path)
    from mtgrpo.config import load_run_config as native_only

    path.write_text("dataloader_num_workers: 4\n")
    with pytest.raises(ValueError, match=r"unknown config option\(s\): 'dataloader_num_workers'"):
        native_only(path)  # the native reader knows only the options that act


def test_trls_flat_config_survives_copies_and_pickling():
    import copy
    import pickle

    args = GRPOConfig(beta=0.04, task_weighting="mt_grpo", report_to="none")
    for again in (copy.deepcopy(args), pickle.loads(pickle.dumps(args))):
        assert again == args
        assert again.to_native() == args.to_native()
        again.beta = 0.5  # a copy's native tree follows the copy, not the original
        assert (again.to_native().loss.beta, args.to_native().loss.beta) == (0.5, 0.04)


def test_warmup_ratio_none_is_trls_unset_default_on_older_transformers():
    # TRL 1.16 on transformers 5.4 defaults warmup_ratio to None: a config built from TRL's
    # defaults there must construct, with no warm-up
    assert GRPOConfig(warmup_ratio=None).to_native().optimization.warmup_ratio == 0.0
    assert GRPOConfig(warmup_ratio=None, max_steps=10).resolved_warmup_steps(10) == 0
