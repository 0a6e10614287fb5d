"""Advantage parity with TRL 1.16, computed by TRL's own code on random batches.

``GRPOTrainer._generate_and_score_completions`` of the installed TRL runs on a namespace that
holds the attributes its no-vLLM, text-only path reads: generation returns fixed token ids,
TRL's own ``_calculate_rewards`` calls reward functions that return this test's scores
(``None`` where the score is NaN), and its advantages are compared with
:func:`mtgrpo.algo.advantages.compute_advantages` on the same ``[N, R]`` matrix, for every setting
docs/coming-from-trl.md says matches TRL:

* TRL ``sum_then_normalize`` with ``scale_rewards`` group / batch / none = ours with
  ``none_handling="zero"`` (any data), or with the default ``"neutral"`` when no reward is None;
* TRL ``normalize_then_sum`` = our ``gdpo`` with ``scale_rewards="group"`` (TRL ignores
  ``scale_rewards`` there), default ``none_handling="neutral"``;
* unscorable rows (every function returned None): advantage 0 in both
  (``on_unscorable="warn"`` / ``"zero_advantage"``).

Both sides compute in float32 (TRL's precision; the trainer's float64 scores differ from
TRL's float32 results by TRL's rounding, a few ulps of the intermediate sums).
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from types import SimpleNamespace

import pytest
import torch

from mtgrpo.algo.advantages import compute_advantages
from tolerance import f32_atol

grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
TRL = grpo_trainer.GRPOTrainer


def _reward_function(scores: torch.Tensor, channel: int):
    def reward(prompts, completions, row, **kwargs):
        values = scores[row, channel].tolist()
        return [None if math.isnan(v) else v for v in values]

    reward.__name__ = f"channel_{channel}"
    return reward


def trl_advantages(scores: torch.Tensor, group_size: int, weights: list[float],
                   aggregation: str, scale_rewards: str) -> torch.Tensor:
    """TRL 1.16's advantages for the reward matrix ``scores [N, R]`` (NaN = None)."""
    n, r = scores.shape
    funcs = [_reward_function(scores, c) for c in range(r)]
    generated = ([[1, 2]] * n, [[3, 4, 5]] * n, None, ["done"] * n, None, {}, None, None)
    stub = SimpleNamespace(
        accelerator=SimpleNamespace(device=torch.device("cpu"), process_index=0,
                                    num_processes=1, gather=lambda x: x,
                                    is_main_process=True),
        model=SimpleNamespace(training=True, is_gradient_checkpointing=False),
        environment_factories=None, environments=None, tools=None, _is_vlm=False,
        _generate=lambda prompts: generated, _tokenizer=SimpleNamespace(pad_token_id=0),
        pad_to_multiple_of=None, mask_truncated_completions=False, eos_token_ids=[0],
        args=SimpleNamespace(steps_per_generation=1, gradient_accumulation_steps=1,
                             per_device_train_batch_size=n, gradient_checkpointing_kwargs=None,
                             report_to=[]),
        num_iterations=1, use_vllm=False, vllm_importance_sampling_correction=False, beta=0.0,
        num_generations=group_size, multi_objective_aggregation=aggregation,
        scale_rewards=scale_rewards, reward_weights=torch.tensor(weights),
        reward_funcs=funcs, reward_processing_classes=[None] * r,
        reward_func_names=[f.__name__ for f in funcs], state=SimpleNamespace(global_step=0),
        _metrics={"train": defaultdict(list)}, log_multimodal=False,
        _logs={"prompt": deque(), "completion": deque(), "advantages": deque(),
               "rewards": defaultdict(deque), "extra": defaultdict(deque)},
        _pending_extra_logs=defaultdict(list), _pending_metrics=defaultdict(list),
    )
    stub._calculate_rewards = lambda *args: TRL._calculate_rewards(stub, *args)
    stub._log_completion_extra = lambda *args: None
    stub._log_metric = lambda *args: None
    inputs = [{"prompt": "p", "row": i} for i in range(n)]
    return TRL._generate_and_score_completions(stub, inputs)["advantages"]


def random_scores(kind: str, seed: int, groups: int = 6, group_size: int = 4,
                  channels: int = 3) -> torch.Tensor:
    """``[B*G, R]`` float32 rewards, NaN where a function returned None.

    dense: no None. routed: two tasks (alternate groups), channel 0 applies to the first,
    channel 1 to the second, channel 2 to both. partial: random None inside groups (some
    groups with a single applicable value). unscorable: partial plus whole rows of None.
    """
    generator = torch.Generator().manual_seed(seed)
    n = groups * group_size
    scores = torch.randn(n, channels, generator=generator) * 1.5
    scores[:, 0] = (scores[:, 0] > 0).float()  # a 0/1 correctness channel
    if kind == "routed":
        task = (torch.arange(n) // group_size) % 2
        scores[task == 1, 0] = math.nan
        scores[task == 0, 1] = math.nan
    elif kind in ("partial", "unscorable"):
        scores[torch.rand(n, channels, generator=generator) < 0.3] = math.nan
        scores[1:group_size, 1] = math.nan  # group 0: channel 1 applies to one row only
    if kind == "unscorable":
        scores[[2, 7, 8, 13]] = math.nan
        scores[group_size * 3: group_size * 4] = math.nan  # a group with no score at all
    return scores


KINDS = ("dense", "routed", "partial", "unscorable")
# (TRL aggregation, TRL scale_rewards) -> our settings that reproduce it
MATCHING = {
    ("sum_then_normalize", "group"): {"aggregation": "sum_then_normalize", "none_handling": "zero",
                                      "scale_rewards": "group"},
    ("sum_then_normalize", "batch"): {"aggregation": "sum_then_normalize", "none_handling": "zero",
                                      "scale_rewards": "batch"},
    ("sum_then_normalize", "none"): {"aggregation": "sum_then_normalize", "none_handling": "zero",
                                     "scale_rewards": "none"},
    ("normalize_then_sum", "group"): {"aggregation": "gdpo", "scale_rewards": "group"},
    ("normalize_then_sum", "batch"): {"aggregation": "gdpo", "scale_rewards": "group"},
    ("normalize_then_sum", "none"): {"aggregation": "gdpo", "scale_rewards": "group"},
}


def _tolerance(expected: torch.Tensor) -> float:
    # float32 on both sides, a handful of operations (sums over at most 24 values, one
    # division by std + 1e-4 with std ~1): 8 ulps of the largest magnitude, <= 1e-6 at ~1.
    return f32_atol(expected, ulps=8)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("trl_setting", sorted(MATCHING))
@pytest.mark.parametrize("seed", [0, 1])
def test_advantages_match_trl(kind: str, trl_setting: tuple[str, str], seed: int) -> None:
    scores = random_scores(kind, seed)
    weights = [1.0, 0.5, 2.0] if seed else [1.0, 1.0, 1.0]
    expected = trl_advantages(scores, 4, weights, *trl_setting)
    ours = compute_advantages(scores, 4, reward_weights=weights, on_unscorable="zero_advantage",
                              **MATCHING[trl_setting]).advantages
    assert torch.isfinite(expected).all()
    assert float((ours - expected).abs().max()) <= _tolerance(expected)
    assert float(expected.abs().max()) > 0.5  # a real comparison, not of zeros


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_neutral_none_handling_matches_trl_on_dense_rewards(scale_rewards: str) -> None:
    scores = random_scores("dense", 3)
    expected = trl_advantages(scores, 4, [1.0, 1.0, 1.0], "sum_then_normalize", scale_rewards)
    ours = compute_advantages(scores, 4, scale_rewards=scale_rewards).advantages
    assert float((ours - expected).abs().max()) <= _tolerance(expected)


@pytest.mark.parametrize(("trl_setting", "ours", "kind"), [
    (("sum_then_normalize", "group"), {"aggregation": "sum_then_normalize"}, "partial"),
    (("normalize_then_sum", "group"), {"aggregation": "normalize_then_sum"}, "dense"),
    (("normalize_then_sum", "batch"), {"aggregation": "gdpo", "scale_rewards": "batch"}, "dense"),
])
def test_the_documented_differences_are_real(trl_setting, ours, kind) -> None:
    """The settings the migration page lists as different do differ (so the matching cases
    above are not matching by accident)."""
    scores = random_scores(kind, 0)
    expected = trl_advantages(scores, 4, [1.0, 1.0, 1.0], *trl_setting)
    got = compute_advantages(scores, 4, on_unscorable="zero_advantage", **ours).advantages
    assert float((got - expected).abs().max()) > 0.05
