"""The engine's importance-sampling correction against TRL 1.16's own code on the same tensors.

TRL computes the correction inline in ``GRPOTrainer._generate_and_score_completions``; the two
blocks (the ratio, then its logged figures) are cut out of the installed TRL's source by their
own first lines and run as they are, with the trainer replaced by a namespace holding the
attributes they read. The loss with the weights is TRL's ``_compute_loss``
(``loss_helpers.trl_compute_loss``)."""

from __future__ import annotations

import inspect
import math
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from loss_helpers import trl_compute_loss

from mtgrpo.algo.engine_correction import (
    IS_MODES,
    EngineCorrection,
    correction_figures,
    correction_metrics,
    importance_weights,
)
from mtgrpo.policy import LossNormalizer, policy_loss
from tolerance import assert_close_f32

_RATIO_START = "# Compute the importance sampling ratio when using vLLM"
_RATIO_END = "# Compute the per-token log probabilities for the reference model"
_METRICS_START = "if self.use_vllm and self.vllm_importance_sampling_correction:\n" \
                 "            delta = torch.abs"
_METRICS_END = "output = {"


def _trl_block(start: str, end: str) -> str:
    grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    source = inspect.getsource(grpo_trainer.GRPOTrainer._generate_and_score_completions)
    begin = source.index(start)
    block = source[begin: source.index(end, begin)]
    lines = block.splitlines()
    indent = len(lines[1]) - len(lines[1].lstrip()) if start.startswith("#") else \
        len(source[:begin].splitlines()[-1])
    return textwrap.dedent("\n".join(" " * indent + lines[0].lstrip() if i == 0 else line
                                     for i, line in enumerate(lines)))


def _trl_trainer(correction: EngineCorrection) -> SimpleNamespace:
    return SimpleNamespace(
        use_vllm=True, vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=correction.mode,
        vllm_importance_sampling_clip_min=correction.clip_min,
        vllm_importance_sampling_clip_max=correction.clip_max,
        accelerator=SimpleNamespace(gather=lambda x: x.reshape(1)),
        _metrics=defaultdict(lambda: defaultdict(list)),
    )  # fmt: skip


def _run_trl(correction: EngineCorrection, old: torch.Tensor, sampling: torch.Tensor,
             mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """TRL's ratio block, then its metrics block, in one namespace."""
    grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    trainer = _trl_trainer(correction)
    names = {"self": trainer, "torch": torch, "math": math, "old_per_token_logps": old,
             "sampling_per_token_logps": sampling, "completion_mask": mask, "tool_mask": None,
             "mode": "train", "device": old.device, "nanmin": grpo_trainer.nanmin,
             "nanmax": grpo_trainer.nanmax}
    exec(_trl_block(_RATIO_START, _RATIO_END), names)  # TRL's installed code, not a copy
    exec(_trl_block(_METRICS_START, _METRICS_END), names)
    metrics = {k: v[0] for k, v in trainer._metrics["train"].items()}
    return names["vllm_importance_sampling_ratio"], metrics


def _tensors(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Trainer and engine log-probs whose per-token and per-sequence ratios straddle every
    bound tested (0.5 and 3), a NaN engine log-prob, and right padding."""
    g = torch.Generator().manual_seed(seed)
    rows, length = 6, 7
    old = -torch.rand(rows, length, generator=g) * 4  # [n, L] log-probs in (-4, 0]
    gap = torch.randn(rows, length, generator=g) * 0.6
    gap[2, 1], gap[5, 3] = 1.5, -1.2  # token ratios e^1.5 = 4.5 > 3 and e^-1.2 = 0.30 < 0.5
    sampling = old - gap
    sampling[1, 2] = float("nan")  # the engine had no log-prob for this token
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[0, 5:] = 0
    mask[3, 2:] = 0
    mask[4, 6:] = 0
    return old, sampling, mask


CORRECTIONS = [EngineCorrection(mode, low, high) for mode in IS_MODES
               for low, high in ((None, 3.0), (0.5, 3.0), (0.5, None), (None, None))
               if not (mode.endswith("truncate") and low is None and high is None)]


@pytest.mark.parametrize("correction", CORRECTIONS, ids=lambda c: f"{c.mode}-{c.clip_min}-"
                         f"{c.clip_max}")
def test_weights_and_metrics_equal_trls_code(correction: EngineCorrection) -> None:
    old, sampling, mask = _tensors()
    expected, trl_metrics = _run_trl(correction, old, sampling, mask)
    weights = importance_weights(old, sampling, mask, correction)
    # the same elementwise float32 operations in the same order: bit for bit
    assert torch.equal(weights, expected)
    # the data must exercise the bound: some weight clipped or masked, some not
    level = correction.mode.split("_")[0]
    raw = importance_weights(old, sampling, mask, EngineCorrection(f"{level}_mask", None, None))
    if correction.clip_max is not None or correction.clip_min is not None:
        assert not torch.equal(raw, weights)
    ours = correction_metrics(*correction_figures(old, sampling, mask, weights, correction))
    assert set(ours) == set(trl_metrics)
    for name, value in trl_metrics.items():
        # TRL reduces in float32, ours in float64: a short reduction's roundings (16 ulps)
        assert_close_f32(ours[name], value, ulps=16, msg=name)


@pytest.mark.parametrize("mode", IS_MODES)
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo", "cispo"])
def test_loss_with_weights_equals_trls_compute_loss(mode: str, loss_type: str) -> None:
    """The weights enter the loss where TRL's ``_compute_loss`` applies them: after the policy
    term, before the KL penalty (beta > 0 here, so a KL weighted by mistake shows)."""
    old, sampling, mask = _tensors(1)
    g = torch.Generator().manual_seed(2)
    logps = old + torch.randn(old.shape, generator=g) * 0.1
    ref = old + torch.randn(old.shape, generator=g) * 0.1
    advantages = torch.randn(old.shape[0], generator=g)
    correction = EngineCorrection(mode, 0.5, 3.0)
    weights = importance_weights(old, sampling, mask, correction)
    trl_loss, _ = trl_compute_loss(
        logps, old, ref, advantages, mask, loss_type=loss_type, eps_low=0.2, eps_high=0.28,
        beta=0.04, max_len=old.shape[1], extra_inputs={"importance_sampling_ratio": weights},
        use_vllm=True, vllm_importance_sampling_correction=True,
    )  # fmt: skip
    ours = policy_loss(
        logps, advantages, mask, old_logps=old, ref_logps=ref, loss_type=loss_type,
        epsilon_low=0.2, epsilon_high=0.28, beta=0.04,
        normalizer=LossNormalizer.for_batch(mask, max_completion_length=old.shape[1]),
        token_weight=weights,
    )  # fmt: skip
    # one loss summed by another implementation (16 ulps)
    assert_close_f32(ours.loss.detach(), trl_loss.detach(), ulps=16)
    unweighted = policy_loss(
        logps, advantages, mask, old_logps=old, ref_logps=ref, loss_type=loss_type,
        epsilon_low=0.2, epsilon_high=0.28, beta=0.04,
        normalizer=LossNormalizer.for_batch(mask, max_completion_length=old.shape[1]),
    )  # fmt: skip
    assert abs(float(unweighted.loss) - float(ours.loss)) > 1e-3  # the weights matter here


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_truncate"])
def test_truncation_without_bounds_is_the_plain_ratio(mode: str) -> None:
    """TRL's torch.clamp refuses two None bounds; here they mean no bound, as in the mask
    modes."""
    old, sampling, mask = _tensors()
    unbounded = importance_weights(old, sampling, mask, EngineCorrection(mode, None, None))
    level = mode.split("_")[0]
    assert torch.equal(unbounded, importance_weights(
        old, sampling, mask, EngineCorrection(f"{level}_mask", None, None)))


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match=r"vllm_importance_sampling_mode='token'.*token_truncate"):
        EngineCorrection("token")
    with pytest.raises(ValueError, match=r"clip_min=4\.0 exceeds clip_max=3\.0"):
        EngineCorrection("token_mask", 4.0, 3.0)
    with pytest.raises(ValueError, match="clip_max=-1 must be a number >= 0"):
        EngineCorrection("token_mask", None, -1)
