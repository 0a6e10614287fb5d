"""TRL's ``sampling/*`` figures of the engine's importance correction on multi-turn rows: TRL
1.16 (grpo_trainer.py, ``_generate_and_score_completions``) takes them over
``completion_mask * tool_mask``, the tokens the update weights, so a tool's reply (engine
log-prob 0.0 from the agent loop, a real trainer log-prob) is in none of them. mtgrpo's own
``generation/logprob_mismatch_*`` and ``generation/kl_k3`` are over the same tokens."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mtgrpo.config import TrainConfig
from mtgrpo.trainer.generation_checks import GenerationChecks
from mtgrpo.trainer.update import pad_policy_batch
from tolerance import f32_atol


class _Checks(GenerationChecks):
    def __init__(self, mode: str) -> None:
        self.config = TrainConfig.from_flat({
            "use_vllm": True, "vllm_importance_sampling_correction": True,
            "vllm_importance_sampling_mode": mode, "vllm_importance_sampling_clip_max": 10.0})
        self.world = 1

    def _local_groups(self, groups):  # one process: every group is local
        return list(range(len(groups))), True


# row 0: model, tool, tool, model; row 1: model, model, tool
TOOL_MASKS = [[1, 0, 0, 1], [1, 1, 0]]
ENGINE = [[-1.1, 0.0, 0.0, -0.5], [-2.0, -0.3, 0.0]]  # a tool's token: 0.0, as the agent loop
TRAINER = torch.tensor([[-1.0, -5.0, -4.0, -0.7], [-1.8, -0.3, -6.0, 0.0]])


def _batch():
    return pad_policy_batch([[1], [2]], [[5, 6, 7, 8], [5, 6, 7]], torch.zeros(2), 0,
                            sampling_logps=ENGINE, tool_masks=TOOL_MASKS)


def _trl_figures(mode: str) -> dict[str, float]:
    """TRL 1.16's figures, by its formula over mask = completion_mask * tool_mask."""
    batch = _batch()
    trainer = TRAINER
    mask = batch.completion_mask * batch.tool_mask
    diff = (trainer - batch.sampling_logps) * mask
    if mode.startswith("sequence"):
        ratio = torch.exp(diff.sum(-1, keepdim=True)).flatten()
    else:
        ratio = torch.exp(diff)[mask.bool()]
    delta = torch.abs(trainer - batch.sampling_logps)[mask.bool()]
    return {"sampling/sampling_logp_difference/mean": float(delta.mean()),
            "sampling/sampling_logp_difference/max": float(delta.max()),
            "sampling/importance_sampling_ratio/min": float(ratio.min()),
            "sampling/importance_sampling_ratio/mean": float(ratio.mean()),
            "sampling/importance_sampling_ratio/max": float(ratio.max())}


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_truncate"])
def test_sampling_figures_leave_tool_reply_tokens_out(mode):
    batch = _batch()
    got = _Checks(mode)._correction_metrics(batch, TRAINER)
    expected = _trl_figures(mode)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        # one exp of a short sum of float32 differences: a few roundings
        assert math.isclose(got[name], value, rel_tol=0, abs_tol=f32_atol(value, 16)), \
            (name, got[name], value)
    # the tool replies' |-5 - 0| would dominate the mean and the max
    assert got["sampling/sampling_logp_difference/max"] < 1.0


def test_logprob_mismatch_leaves_tool_reply_tokens_out():
    batch = _batch()
    # one group per row, with the engine's log-probs as the agent loop returns them
    groups = [SimpleNamespace(payload=SimpleNamespace(logprobs=[row])) for row in ENGINE]
    got = _Checks("token_truncate")._generation_mismatch(groups, batch, TRAINER)
    mask = (batch.completion_mask * batch.tool_mask).bool()
    delta = (TRAINER - batch.sampling_logps)[mask].double().numpy()  # the model's tokens only
    expected = {"generation/logprob_mismatch_mean": float(np.abs(delta).mean()),
                "generation/logprob_mismatch_max": float(np.abs(delta).max()),
                "generation/kl_k3": float(np.mean(np.expm1(delta) - delta))}
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        # float32 differences of the same values, then float64 reductions: a few roundings
        assert math.isclose(got[name], value, rel_tol=0, abs_tol=f32_atol(value, 8)), \
            (name, got[name], value)
