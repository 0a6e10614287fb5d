"""GRPOConfig / RunConfig: TRL names, derived batch sizes, validation with the fix, YAML."""

from __future__ import annotations

import pytest

from mtgrpo.config import (
    GRPOConfig,
    apply_overrides,
    config_fields_help,
    load_run_config,
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
    # 8 completions per device x 2 accumulation x 2 steps per generation / 4 per prompt = 8
    args = GRPOConfig(per_device_train_batch_size=8, gradient_accumulation_steps=2,
                      steps_per_generation=2, num_generations=4)
    assert args.resolved_prompts_per_step() == 8
    assert args.resolved_prompts_per_step(world_size=2) == 16
    assert args.completions_per_optimizer_step() == 16
    assert GRPOConfig(prompts_per_step=5, num_generations=4).resolved_prompts_per_step(3) == 5


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
    assert run.training.learning_rate == 2e-5
    assert run.training.task_weighting_params == {"lam": 0.5}
    assert run.rewards == {"countdown": ["countdown_reward"]}
    assert run.peft == {"r": 8}
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
    assert load_run_config(path, ["--model.trust_remote_code", "true"]).training.learning_rate \
        == 1e-5  # YAML reads 1e-5 as a string; numeric options convert it
