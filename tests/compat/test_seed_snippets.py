"""The training calls of the project's two TRL tutorials (seeds 000 and 002), made on mtgrpo
with only the import and the model changed (``from mtgrpo import GRPOConfig, GRPOTrainer,
ModelConfig, get_peft_config``: TRL 1.16 itself no longer runs the second tutorial's calls, it
refuses ``ModelConfig(torch_dtype=...)``, ``max_prompt_length``, ``bf16`` on a CPU and one
completion per device with two generations).

The calls (``GRPOConfig(...)``, ``GRPOTrainer(...)``, ``train()``) take the tutorials'
arguments as they are, defaults included (so a run lasts three epochs, or the 100 steps the
second tutorial asks for). The tutorials take their reward functions and datasets from
elsewhere in their text; here they are small ones with the same signatures and columns.

The model is a tiny local one with 2,048 positions (the second tutorial generates up to 1,024
tokens after 256-token prompts) whose head is set so that it ends every completion at once:
with completions a token long, a hundred steps take seconds, and every call still runs the
whole loop (generation, scoring, advantages, the update, the LoRA adapter and reference,
checkpoints).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from datasets import Dataset

from mtgrpo import GRPOConfig, GRPOTrainer, ModelConfig, get_peft_config
from mtgrpo.models import build_tiny_model


@pytest.fixture(scope="module")
def terse_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Llama (2,048 positions) that emits its EOS token first, whatever the prompt.

    The residual stream is the token's embedding (attention and MLP outputs zeroed) with a
    constant +10 in its first coordinate, and the head's EOS row reads that coordinate, so
    the EOS logit dominates every other by a wide margin."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("terse-tiny")
    build_tiny_model(out, max_position_embeddings=2048, seed=0)
    model = AutoModelForCausalLM.from_pretrained(out)
    eos = AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 10.0
        model.lm_head.weight[eos, 0] = 100.0
    model.save_pretrained(out)
    return str(out)


# ----------------------------------------------------------------- the first tutorial (000)

def check_math_solution(prompt, completion):
    return any(ch.isdigit() for ch in completion)


def test_code_solution(prompt, completion):
    return "def " in completion


test_code_solution.__test__ = False  # a helper, not a pytest test


def math_reward_func(prompts, completions, task, **kwargs):
    return [(1.0 if check_math_solution(p, c) else -1.0) if t == "math" else None
            for p, c, t in zip(prompts, completions, task, strict=True)]


def coding_reward_func(prompts, completions, task, **kwargs):
    return [(1.0 if test_code_solution(p, c) else -1.0) if t == "code" else None
            for p, c, t in zip(prompts, completions, task, strict=True)]


def routed_reward(prompts, completions, task, **kwargs):
    scores = [0.0] * len(prompts)
    for i, t in enumerate(task):
        good = check_math_solution if t == "math" else test_code_solution
        scores[i] = 1.0 if good(prompts[i], completions[i]) else -1.0
    return scores


def mixed_dataset() -> Dataset:
    return Dataset.from_list([
        {"prompt": "What is 2+2?", "task": "math"},
        {"prompt": "Write a function that returns the sum of two numbers.", "task": "code"},
        {"prompt": "What is 3*4?", "task": "math"},
        {"prompt": "Write a function that returns the product of two numbers.", "task": "code"},
    ])


def test_first_tutorial_calls(terse_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default output_dir is relative
    dataset = mixed_dataset()
    trainer = GRPOTrainer(model=terse_model, reward_funcs=[math_reward_func, coding_reward_func],
                          train_dataset=dataset)
    trainer.train()
    # defaults: 8 completions of 8 per step = one prompt, three epochs over four prompts
    assert trainer.state.global_step == 12
    assert trainer.task_names == ["code", "math"]

    trainer = GRPOTrainer(model=terse_model, reward_funcs=routed_reward, train_dataset=dataset)
    trainer.train()
    assert trainer.state.global_step == 12

    config = GRPOConfig(reward_weights=[1.0, 1.0], reward_aggregation_method="sum_then_normalize",
                        scale_rewards="group")
    trainer = GRPOTrainer(model=terse_model, args=config,
                          reward_funcs=[math_reward_func, coding_reward_func],
                          train_dataset=dataset)
    assert trainer.args.multi_objective_aggregation == "sum_then_normalize"
    assert trainer.rewards.reward_weights.tolist() == [1.0, 1.0]


# ----------------------------------------------------------------- the second tutorial (002)

def simple_math_reward_func(completions, target, nums, **kwargs):
    """A Countdown check of the tutorial's signature (mtgrpo's verifier, no eval)."""
    from mtgrpo.rewards import countdown_reward

    return countdown_reward(None, completions, target=target, nums=nums, use_all_numbers=False)


def countdown_rows(count: int, offset: int = 0) -> Dataset:
    rows = []
    for i in range(offset, offset + count):
        nums = [i % 7 + 1, i % 5 + 2, 3]
        rows.append({"prompt": f"Using {nums}, make {sum(nums)}. <think>", "target": sum(nums),
                     "nums": nums, "task": "math"})
    return Dataset.from_list(rows)


def test_second_tutorial_calls(terse_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train_dataset, test_dataset = countdown_rows(8), countdown_rows(2, offset=100)
    model_config = ModelConfig(model_name_or_path=terse_model, torch_dtype="bfloat16",
                               attn_implementation="flash_attention_2", use_peft=True,
                               load_in_4bit=True)
    training_args = GRPOConfig(
        output_dir="qwen-r1-tiny", learning_rate=5e-7, lr_scheduler_type="cosine",
        logging_steps=10, max_steps=100, per_device_train_batch_size=1,
        gradient_accumulation_steps=1, gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False}, bf16=True,
        max_prompt_length=256, max_completion_length=1024, num_generations=2, beta=0.001,
    )
    trainer = GRPOTrainer(
        model=model_config.model_name_or_path,
        reward_funcs=[simple_math_reward_func, math_reward_func], args=training_args,
        train_dataset=train_dataset, eval_dataset=test_dataset,
        peft_config=get_peft_config(model_config),
    )
    trainer.train()
    assert trainer.state.global_step == 100
    assert trainer.is_peft
    assert Path("qwen-r1-tiny/checkpoint-100/model/adapter_config.json").is_file()
    assert [h["step"] for h in trainer.state.log_history if "loss" in h
            and "train_loss" not in h] == [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]


def reward_func(completions, **kwargs):
    avg_length = sum(len(c) for c in completions) / len(completions) if completions else 1
    return [float(len(c) / avg_length) for c in completions]


def test_second_tutorial_mixed_rewards(tmp_path):
    """The mixed reward-function / reward-model call, on the stand-ins of TRL's tiny hub
    models and zen dataset (tests/compat/standins.py)."""
    from datasets import load_dataset

    dataset = load_dataset("trl-internal-testing/zen", "standard_prompt_only", split="train")
    tmp_dir = str(tmp_path)
    training_args = GRPOConfig(output_dir=tmp_dir, learning_rate=0.1,
                               per_device_train_batch_size=3, num_generations=3,
                               max_completion_length=32, report_to="none")
    trainer = GRPOTrainer(
        model="trl-internal-testing/tiny-Qwen2ForCausalLM-2.5",
        reward_funcs=[reward_func, "trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"],
        args=training_args, train_dataset=dataset,
    )
    trainer.train()
    assert trainer.reward_func_names == ["reward_func", "tiny-Qwen2ForSequenceClassification-2.5"]
    assert "rewards/tiny-Qwen2ForSequenceClassification-2.5/mean" in trainer.state.log_history[-1]
