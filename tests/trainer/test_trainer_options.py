"""Trainer options: routing vs None, reward weights, reward models, strategies and samplers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import trainer_helpers as common

from mtgrpo import GRPOTrainer
from mtgrpo.algo.advantages import compute_advantages
from mtgrpo.algo.weighting import softmax
from mtgrpo.reporting import read_metrics
from script_loader import load_script
from tolerance import assert_close_f32


def _rollouts(run_dir) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]


def test_none_pattern_and_routing_table_give_the_same_advantages(tiny_model_dir, tmp_path):
    """Seed 000: functions returning None off-task == a routing table calling each on its task."""
    runs = {
        "none": [common.alpha_reward, common.beta_reward],
        "routed": {"alpha": [common.alpha_reward_routed], "beta": [common.beta_reward_routed]},
    }
    results = {}
    for name, rewards in runs.items():
        out = tmp_path / name
        trainer = GRPOTrainer(str(tiny_model_dir), rewards, train_dataset=common.rows(),
                              args=common.args(out, max_steps=2, save_rollouts=True))
        trainer.train()
        results[name] = _rollouts(out)
    assert len(results["none"]) == len(results["routed"]) > 0
    for a, b in zip(results["none"], results["routed"], strict=True):
        assert a["prompt_id"] == b["prompt_id"]
        assert a["rewards"] == b["rewards"]
        # the same estimator on equal rewards: at most a rounding apart
        assert_close_f32(a["advantages"], b["advantages"], ulps=2)


def test_reward_weights_enter_the_advantages(tiny_model_dir, tmp_path):
    weights = [1.0, 1.0, 3.0]
    trainer = GRPOTrainer(
        str(tiny_model_dir), [common.alpha_reward, common.beta_reward, common.length_bonus],
        args=common.args(tmp_path, max_steps=1, save_rollouts=True, reward_weights=weights),
        train_dataset=common.rows(),
    )
    trainer.train()
    groups = _rollouts(tmp_path)
    rewards = torch.tensor([[math.nan if v is None else v for v in row]
                            for g in groups for row in g["rewards"]], dtype=torch.float64)
    logged = torch.tensor([a for g in groups for a in g["advantages"]], dtype=torch.float64)
    weighted = compute_advantages(rewards, 4, reward_weights=weights).advantages
    unweighted = compute_advantages(rewards, 4).advantages
    torch.testing.assert_close(logged, weighted, atol=1e-12, rtol=0)
    assert not torch.allclose(logged, unweighted, atol=1e-3)


def test_reward_model_mixed_with_a_rule(tiny_model_dir, tmp_path):
    from transformers import AutoConfig, AutoTokenizer, LlamaForSequenceClassification

    config = AutoConfig.from_pretrained(tiny_model_dir, num_labels=1)
    torch.manual_seed(0)
    reward_model_dir = tmp_path / "rm"
    LlamaForSequenceClassification(config).save_pretrained(reward_model_dir)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(reward_model_dir)
    trainer = GRPOTrainer(
        str(tiny_model_dir), [common.length_bonus, str(reward_model_dir)],
        args=common.args(tmp_path / "run", max_steps=1), train_dataset=common.rows(),
    )
    trainer.train()
    record = read_metrics(tmp_path / "run", split="train")[0]
    assert math.isfinite(record["rewards/rm/mean"])
    assert record["rewards/rm/std"] > 0  # the model scores different completions differently


def test_a_reward_model_path_loads_with_one_score_column_as_trl_does(tiny_model_dir):
    """A language model's checkpoint (no trained score head) named as a reward model gets a
    head of one column (TRL 1.16 passes num_labels=1), so its score is that column, not the
    first of transformers' default two."""
    from mtgrpo.rewards.models import RewardModel

    reward = RewardModel(str(tiny_model_dir))
    assert reward.model.config.num_labels == 1
    assert reward.model.score.out_features == 1


STRATEGIES = [
    ("uniform", {}, "iid", {}),
    ("fixed", {"weights": [0.7, 0.3]}, "dynamic", {"max_resample_rounds": 1}),
    ("worst_case", {"step_size": 1.0}, "ratio_preserving", {"max_resample_rounds": 1}),
    ("regularized", {"damping": 1e-2}, "iid", {}),
    ("mt_grpo", {"lam": 0.5}, "ratio_preserving", {"acceptance_aware": False}),
    ("mt_grpo", {"lam": 4.0, "step_size": 20.0, "min_weight": 0.3}, "ratio_preserving", {}),
    ("sec", {"alpha": 0.5, "temperature": 0.2}, "dynamic", {"oversample_factor": 2}),
]


@pytest.mark.parametrize(("weighting", "wparams", "sampler", "sparams"), STRATEGIES)
def test_every_weighting_and_batch_construction_runs(tiny_model_dir, tmp_path, weighting,
                                                      wparams, sampler, sparams):
    trainer = GRPOTrainer(
        str(tiny_model_dir), [common.alpha_reward, common.beta_reward],
        args=common.args(tmp_path, max_steps=2, task_weighting=weighting,
                         task_weighting_params=wparams, batch_construction=sampler,
                         batch_construction_params=sparams),
        train_dataset=common.rows(),
    )
    trainer.train()
    records = read_metrics(tmp_path, split="train")
    for record in records:
        weights = [record["tasks/alpha/weight"], record["tasks/beta/weight"]]
        assert sum(weights) == pytest.approx(1.0)
        assert min(weights) >= wparams.get("min_weight", 0.0)
        assert record["sampling/rounds"] >= 1
    if weighting == "fixed":
        assert weights == pytest.approx([0.7, 0.3])
    if weighting == "mt_grpo":
        assert "tasks/alpha/improvement" in records[0]
        # the logged share is the one the strategy computed from that step's terms
        share = records[-1]["weighting/improvement_share"]
        assert share == trainer.weighting.diagnostics()["weighting/improvement_share"]
        assert 0.0 <= share <= 1.0
        # benchmarks/improvement_share.py replays the run from its log to the same weights
        replay = load_script("benchmarks/improvement_share.py").replay(tmp_path)
        assert replay.max_weight_error == 0.0
        logged = np.array([r["weighting/improvement_share"] for r in records], dtype=float)
        np.testing.assert_array_equal(replay.shares, logged)  # NaN where NaN
    else:
        assert not any(key.startswith("weighting/") for key in records[0])
    final = trainer.weighting.weights
    assert final.sum() == pytest.approx(1.0)
    if "min_weight" in wparams:  # what the sampler got: the floored softmax of the logits
        p = softmax(trainer.weighting.logits)
        np.testing.assert_allclose(final, 0.4 * p + 0.3, rtol=0, atol=4 * np.finfo(float).eps)
    if weighting in ("worst_case", "mt_grpo", "sec"):
        assert not np.allclose(final, 0.5), "adaptive weights never moved"


def test_a_step_without_informative_groups_skips_the_update(tiny_model_dir, tmp_path):
    def constant(prompts, completions, **kwargs):
        return [0.0 for _ in completions]

    trainer = GRPOTrainer(
        str(tiny_model_dir), [constant],
        args=common.args(tmp_path, max_steps=1, task_weighting="mt_grpo",
                         batch_construction="ratio_preserving",
                         batch_construction_params={"max_resample_rounds": 0}),
        train_dataset=common.rows(),
    )
    before = {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters()}
    metrics = trainer.train()
    assert metrics["update_skipped"] == 1.0
    assert metrics["tasks/alpha/zero_gradient_rate"] == 1.0
    assert all(torch.equal(before[n], p) for n, p in trainer.unwrapped.named_parameters())
    assert trainer.weighting.weights == pytest.approx([0.5, 0.5])


def test_the_training_step_does_not_depend_on_the_generation_backend(tiny_model_dir, tmp_path):
    """Near-greedy sampling makes both backends produce the same completions; the update
    (loss, gradient, new weights) is then identical: the backend only supplies token ids."""
    results = {}
    for backend in ("hf", "static"):
        trainer = GRPOTrainer(
            str(tiny_model_dir), [common.alpha_reward, common.beta_reward, common.length_bonus],
            args=common.args(tmp_path / backend, max_steps=1, temperature=1e-3,
                             generation_backend=backend, save_rollouts=True),
            train_dataset=common.rows(),
        )
        metrics = trainer.train()
        params = {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters()}
        results[backend] = (metrics, _rollouts(tmp_path / backend), params)
    (m_hf, r_hf, p_hf), (m_static, r_static, p_static) = results["hf"], results["static"]
    assert [g["rewards"] for g in r_hf] == [g["rewards"] for g in r_static]
    assert m_hf["loss"] == pytest.approx(m_static["loss"], rel=1e-6)
    assert m_hf["grad_norm"] == pytest.approx(m_static["grad_norm"], rel=1e-5)
    for name, value in p_hf.items():
        torch.testing.assert_close(value, p_static[name], atol=1e-6, rtol=1e-5)


def test_the_padding_free_update_equals_the_padded_one(tiny_model_dir, tmp_path):
    """Same completions (seeded), same update: loss, gradient norm and the gradient the optimizer
    steps on agree whether the policy forward runs padding-free or padded in length buckets."""
    results = {}
    for padding_free in (True, False):
        out = tmp_path / str(padding_free)
        trainer = GRPOTrainer(
            str(tiny_model_dir), [common.alpha_reward, common.beta_reward, common.length_bonus],
            args=common.args(out, max_steps=1, padding_free=padding_free, save_rollouts=True,
                             max_padding_fraction=0.2, per_device_train_batch_size=16),
            train_dataset=common.rows(),
        )
        plans, grads = [], {}
        trainer.updater._plan = _recording(trainer.updater._plan, plans)
        step = trainer.optimizer.step

        def recorded_step(*args, step=step, grads=grads, trainer=trainer, **kwargs):
            grads.update({n: p.grad.clone() for n, p in trainer.unwrapped.named_parameters()
                          if p.grad is not None})
            return step(*args, **kwargs)

        trainer.optimizer.step = recorded_step
        metrics = trainer.train()
        results[padding_free] = (metrics, _rollouts(out), grads, plans)
    (m_free, r_free, g_free, plans_free), (m_pad, r_pad, g_pad, plans_pad) = (
        results[True], results[False])
    assert [g["rewards"] for g in r_free] == [g["rewards"] for g in r_pad]
    assert [g["advantages"] for g in r_free] == [g["advantages"] for g in r_pad]
    assert len(plans_free[0]) == 1  # all 16 rows in one micro-batch
    assert len(plans_pad[0]) > 1  # length buckets
    # Float32 rounding only (tests/tolerance.py): the padding-free forward runs other attention
    # kernels and matmul shapes, and the loss and gradients are summed in another order. A token
    # attending across rows, or a micro-batch normalised on its own, changes them by more than
    # 1e-2 of their size.
    assert_close_f32(m_free["loss"], m_pad["loss"], ulps=16)
    assert_close_f32(m_free["grad_norm"], m_pad["grad_norm"], ulps=16)
    assert m_free["grad_norm"] > 0
    assert g_free.keys() == g_pad.keys()
    assert len(g_free) > 0
    for name, grad in g_pad.items():
        assert_close_f32(g_free[name], grad, ulps=64, msg=name)


def _recording(plan, calls):
    def wrapper(*args, **kwargs):
        result = plan(*args, **kwargs)
        calls.append(result)
        return result

    return wrapper


def test_rows_left_out_of_the_loss_add_no_improvement(tiny_model_dir, tmp_path):
    # the engine cuts the first sample of every prompt at max_new_tokens: under
    # mask_truncated_completions it trains no token, so its objective is 0 before the update as
    # after; with a learning rate of 1e-30 nothing changes, so I_k is 0 up to float32 rounding
    # (it was -A of the truncated rows: -0.22 on the first step here)
    trainer = GRPOTrainer(
        str(tiny_model_dir), [common.alpha_reward, common.beta_reward],
        args=common.args(tmp_path, max_steps=2, learning_rate=1e-30, task_weighting="mt_grpo",
                         mask_truncated_completions=True),
        train_dataset=common.rows(), generation_backend="scripted_backend:OffsetLogprobBackend")
    trainer.train()
    measured = [value for record in read_metrics(tmp_path, split="train")
                for key, value in record.items() if key.endswith("/improvement")
                and value is not None]
    assert measured
    # float32 rounding of the objectives: z-scored advantages of groups of 4 are at most 1.5
    from tolerance import f32_atol

    assert max(abs(v) for v in measured) < f32_atol(1.5, ulps=64)


def test_a_run_without_entropies_logs_its_figures(tiny_model_dir, tmp_path):
    # log_entropy off, no entropy bonus, no high-entropy mask: the update computes no entropy
    trainer = GRPOTrainer(
        str(tiny_model_dir), [common.alpha_reward, common.beta_reward],
        args=common.args(tmp_path, max_steps=1, log_entropy=False), train_dataset=common.rows())
    trainer.train()
    record = read_metrics(tmp_path, split="train")[0]
    assert "entropy" not in record
    assert math.isfinite(record["loss"])
    assert record["clip_ratio/region"] == 0.0
