"""The trainer end to end on the tiny local model: it learns something, logs per task, saves."""

from __future__ import annotations

import json
import math

import pytest
import torch
import trainer_helpers as _common
from safetensors.torch import load_file

from mtgrpo import GRPOTrainer
from mtgrpo.reporting import read_metrics


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_full_finetune_smoke(tiny_model_dir, tmp_path):
    trainer = GRPOTrainer(
        str(tiny_model_dir), [_common.alpha_reward, _common.beta_reward],
        args=_common.args(tmp_path, max_steps=3), train_dataset=_common.rows(),
    )
    before = _params(trainer.unwrapped)
    trainer.train()
    after = _params(trainer.unwrapped)
    assert any(not torch.equal(before[n], after[n]) for n in before), "no parameter moved"

    records = read_metrics(tmp_path, split="train")
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert math.isfinite(record["loss"])
        for task in ("alpha", "beta"):
            for key in ("accuracy", "reward", "zero_gradient_rate", "weight", "batch_share"):
                assert f"tasks/{task}/{key}" in record
        # worst and average are defined only when every task was measured (mtgrpo.algo.metrics)
        accuracy = [record[f"tasks/{task}/accuracy"] for task in ("alpha", "beta")]
        if None in accuracy:
            assert record["accuracy/worst"] is None
            assert record["accuracy/average"] is None
            assert "accuracy/worst_task" not in record
        else:
            assert record["accuracy/worst"] == min(accuracy)
            assert record["accuracy/average"] == sum(accuracy) / 2  # the same two operations
            assert record["accuracy/worst_task"] == ("alpha", "beta")[accuracy.index(min(accuracy))]
        # a channel's mean is over the rows it applied to: undefined only without alpha rows
        alpha_rows = record["tasks/alpha/groups_generated"] > 0
        assert (record["rewards/alpha_reward/mean"] is not None) == alpha_rows
        assert record["time/generate"] > 0
        assert record["throughput/tokens_per_second"] > 0
    # the final checkpoint holds the trained weights
    saved = load_file(str(tmp_path / "checkpoint-3" / "trainable.safetensors"))
    assert torch.equal(saved["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    assert (tmp_path / "config.yaml").is_file()
    assert (tmp_path / "checkpoint-3" / "model" / "config.json").is_file()


def test_the_log_and_the_summary_name_the_generation_backend(tiny_model_dir, tmp_path):
    import transformers
    from rich.console import Console

    from mtgrpo.reporting.compare import load_run, run_report, summarize_run, summarize_tasks

    trainer = GRPOTrainer(
        str(tiny_model_dir), [_common.alpha_reward, _common.beta_reward],
        args=_common.args(tmp_path, max_steps=1), train_dataset=_common.rows(),
    )
    trainer.train()
    [run] = read_metrics(tmp_path, split="run")
    assert run["step"] == 0
    assert run["generation/backend"] == "static"  # 'auto' picked the fast backend
    assert run["generation/decode_path"] == "llama_modules"
    assert run["policy/padding_free"] is True
    assert run["versions/transformers"] == transformers.__version__
    history = load_run(tmp_path)
    assert history.ignored_records == 0
    summary = summarize_run(history)
    assert summary.generation == "static (decode path llama_modules)"
    console = Console(width=140, record=True)
    console.print(run_report(summary, summarize_tasks(history)))
    assert "generation backend: static (decode path llama_modules)" in console.export_text()


def test_lora_trains_only_the_adapter_and_logs_kl(tiny_model_dir, tmp_path):
    trainer = GRPOTrainer(
        str(tiny_model_dir), [_common.alpha_reward, _common.beta_reward],
        args=_common.args(tmp_path, beta=0.1), train_dataset=_common.rows(),
        peft_config={"r": 4, "lora_alpha": 8},
    )
    before = {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters()}
    trainer.train()
    changed = {n for n, p in trainer.unwrapped.named_parameters()
               if not torch.equal(before[n], p.detach())}
    assert changed
    assert all("lora_" in n for n in changed)
    record = read_metrics(tmp_path, split="train")[-1]
    # after one update the policy differs from the reference (adapter disabled): KL > 0
    assert record["kl"] > 0
    assert (tmp_path / "checkpoint-2" / "model" / "adapter_model.safetensors").is_file()


def test_completions_and_rollouts_logs(tiny_model_dir, tmp_path):
    trainer = GRPOTrainer(
        str(tiny_model_dir), [_common.alpha_reward, _common.beta_reward],
        args=_common.args(tmp_path, max_steps=1, log_completions=True, save_rollouts=True),
        train_dataset=_common.rows(),
    )
    trainer.train()
    completions = [json.loads(x) for x in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert len(completions) == 4 * 4
    assert {c["task"] for c in completions} <= {"alpha", "beta"}
    groups = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert groups[0]["channels"] == ["alpha_reward", "beta_reward"]
    assert len(groups[0]["rewards"]) == 4
    assert len(groups[0]["advantages"]) == 4
    # None (not applicable) is kept as null, never turned into 0
    assert all((r[0] is None) != (r[1] is None) for g in groups for r in g["rewards"])


@pytest.mark.parametrize("also_seen", [False, True])
def test_num_tokens_counts_every_trained_token_at_every_step(tiny_model_dir, tmp_path,
                                                             also_seen):
    # TRL logs num_tokens, the running count of prompt and completion tokens trained on, at
    # every step whatever include_num_input_tokens_seen says; that option adds the Trainer's
    # num_input_tokens_seen.
    trainer = GRPOTrainer(
        str(tiny_model_dir), [_common.alpha_reward, _common.beta_reward],
        args=_common.args(tmp_path, max_steps=2, include_num_input_tokens_seen=also_seen),
        train_dataset=_common.rows(),
    )
    trained: list[int] = []
    update = trainer.updater.update

    def counting_update(batch, **options):
        trained.append(int(batch.prompt_mask.sum() + batch.completion_mask.sum()))
        return update(batch, **options)

    trainer.updater.update = counting_update
    trainer.train()
    records = read_metrics(tmp_path, split="train")
    assert len(trained) == 2
    assert min(trained) > 4 * 4  # 16 rows, each with a prompt and a completion
    assert [r["num_tokens"] for r in records] == [trained[0], trained[0] + trained[1]]
    if also_seen:
        assert [r["num_input_tokens_seen"] for r in records] == [r["num_tokens"] for r in records]
    else:
        assert "num_input_tokens_seen" not in records[0]


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo"])
def test_every_loss_type_trains(tiny_model_dir, tmp_path, loss_type):
    trainer = GRPOTrainer(
        str(tiny_model_dir), [_common.alpha_reward, _common.beta_reward],
        args=_common.args(tmp_path, max_steps=1, loss_type=loss_type, epsilon_high=0.28),
        train_dataset=_common.rows(),
    )
    metrics = trainer.train()
    assert math.isfinite(metrics["loss"])
    assert metrics["grad_norm"] >= 0


def test_periodic_eval_logs_per_task_accuracy(tiny_model_dir, tmp_path):
    trainer = GRPOTrainer(
        str(tiny_model_dir), [_common.alpha_reward, _common.beta_reward],
        args=_common.args(tmp_path, eval_steps=2, num_generations_eval=2),
        train_dataset=_common.rows(), eval_dataset=_common.rows(per_task=3),
    )
    trainer.train()
    evals = read_metrics(tmp_path, split="eval")
    assert [r["step"] for r in evals] == [0, 2]  # eval_on_start, then every 2 steps
    for record in evals:
        assert 0.0 <= record["tasks/alpha/accuracy"] <= 1.0
        assert record["accuracy/worst_task"] in ("alpha", "beta")


def test_a_new_run_sets_an_earlier_run_aside(tiny_model_dir, tmp_path):
    for _ in range(2):
        GRPOTrainer(str(tiny_model_dir), [_common.alpha_reward, _common.beta_reward],
                    args=_common.args(tmp_path, max_steps=1), train_dataset=_common.rows()).train()
    # the new run's log only: its run record, then its step
    assert [(r["split"], r["step"]) for r in read_metrics(tmp_path)] == [("run", 0), ("train", 1)]
    previous = list(tmp_path.glob("previous-*"))
    assert len(previous) == 1
    assert [r["step"] for r in read_metrics(previous[0], split="train")] == [1]
    assert (previous[0] / "checkpoint-1" / "trainer_state.json").is_file()
