"""A run file with an environments section, end to end: the agents-cpu recipe shrunk to a few
seconds builds its tiny model with the tools template and a vocabulary from solved episodes,
warm-starts on demonstrations, trains with each environment a task, and evaluates held-out
episodes before and after with tool-call rates."""

from __future__ import annotations

import json

import pytest

from mtgrpo.config import load_run_config
from mtgrpo.models import load_tokenizer
from mtgrpo.recipes import recipe_path
from mtgrpo.reporting import read_metrics
from mtgrpo.trainer.run import run_training


@pytest.fixture
def small_agents_run(tmp_path, monkeypatch):
    monkeypatch.setenv("MTGRPO_CACHE_DIR", str(tmp_path / "cache"))
    overrides = [
        "--output_dir", str(tmp_path / "run"), "--model.name_or_path", str(tmp_path / "model"),
        "--model.tiny_options.hidden_size", "32", "--model.tiny_options.num_layers", "1",
        "--model.tiny_options.intermediate_size", "64", "--model.tiny_options.vocab_size", "400",
        "--environments.train_size", "6", "--environments.eval_size", "3",
        "--sft.num_examples", "6", "--sft.max_steps", "4", "--sft.per_device_train_batch_size", "4",
        "--sft.logging_steps", "2",
        "--max_steps", "2", "--prompts_per_step", "4", "--num_generations", "2",
        "--per_device_train_batch_size", "8", "--eval_steps", "2", "--save_steps", "2",
        "--num_generations_eval", "1", "--max_completion_length", "96",
    ]
    return load_run_config(recipe_path("agents-cpu"), overrides)


def test_agents_recipe_end_to_end(small_agents_run, tmp_path):
    run = small_agents_run
    assert run.training.multitask.task_weighting == "mt_grpo"  # the recipe's own settings survive
    run_training(run)
    out = tmp_path / "run"

    # the tiny model renders tools, and its vocabulary was learned from the episodes' text
    tokenizer = load_tokenizer(str(tmp_path / "model"))
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                             tools=[_calculate])
    assert rendered.startswith("<|im_start|>system\nTools: _calculate(expression)<|im_end|>")
    call = '<tool_call>\n{"name": "guess", "arguments": {"number": 5}}\n</tool_call>'
    assert len(tokenizer(call)["input_ids"]) < len(call.encode()) / 2

    # the warm start trained on demonstrations and is recorded with its environments
    marker = json.loads((out / "sft" / "warm_start.json").read_text())
    assert set(marker["settings"]["environments"]["environments"]) == {"calculator", "guess"}

    evals = read_metrics(out, split="eval")
    assert [record["step"] for record in evals] == [0, 2]  # before and after
    for record in evals:
        for name in ("calculator", "guess"):
            assert 0.0 <= record[f"tasks/{name}/accuracy"] <= 1.0
            assert record[f"tasks/{name}/tool_call_frequency"] >= 0.0
    train = read_metrics(out, split="train")
    assert [record["step"] for record in train] == [1, 2]
    for record in train:  # each environment is a task with its own weight
        assert {"tasks/calculator/weight", "tasks/guess/weight"} <= set(record)
        assert record["tools/call_frequency"] >= 0.0
    # the run's config.yaml loads back with its environments
    again = load_run_config(out / "config.yaml")
    assert again.environments is not None
    assert again.environments.to_dict() == run.environments.to_dict()


def _calculate(expression: str) -> str:
    """Evaluate.

    Args:
        expression: The expression.
    """
    return expression
