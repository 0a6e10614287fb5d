"""Every built-in recipe loads, and runs one step with the model swapped for the tiny one."""

from __future__ import annotations

import pytest

from mtgrpo.config import load_run_config
from mtgrpo.recipes import list_recipes, recipe_path
from mtgrpo.reporting import read_metrics
from mtgrpo.trainer.run import run_training

SMALL = [
    "--max_steps", "1", "--num_generations", "2", "--prompts_per_step", "2",
    "--max_prompt_length", "448", "--max_completion_length", "8", "--eval_steps", "0",
    "--save_steps", "0", "--bf16", "false", "--gradient_checkpointing", "false",
    "--steps_per_generation", "1", "--max_tokens_per_microbatch", "null",
    "--per_device_train_batch_size", "4",
]


def test_recipes_are_listed():
    assert {"paper-exp1-qwen2.5-3b", "paper-exp2-qwen2.5-3b"} <= set(list_recipes())


@pytest.mark.parametrize("name", ["paper-exp1-qwen2.5-3b", "paper-exp2-qwen2.5-3b"])
def test_paper_recipe_runs_one_step_on_the_tiny_model(name, tiny_model_dir, tmp_path):
    overrides = [
        *SMALL, "--model.name_or_path", str(tiny_model_dir),
        "--model.dtype", "auto", "--output_dir", str(tmp_path / "run"),
        "--tasks.train_size", "4", "--tasks.eval_size", "2", "--tasks.workers", "0",
        "--tasks.cache_dir", str(tmp_path / "cache"),
    ]
    run = load_run_config(recipe_path(name), overrides)
    # the recipe's own settings survive the swap
    assert run.training.multitask.task_weighting == "mt_grpo"
    assert run.training.multitask.batch_construction == "ratio_preserving"
    run_training(run)
    record = read_metrics(tmp_path / "run", split="train")[0]
    assert record["step"] == 1
    tasks = {key.split("/")[1] for key in record if key.startswith("tasks/")}
    assert len(tasks) == (3 if "exp1" in name else 9)
