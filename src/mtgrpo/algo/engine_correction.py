"""Importance-sampling correction for the gap between a generation engine and the trainer.

An engine with its own kernels (vLLM) samples completions from ``π_engine``, which differs from
the trainer's ``π_θ`` at the same weights by rounding, by another attention kernel, or by a
lower precision. The GRPO ratio ``π_θ / π_θ_old`` assumes the trainer's own policy sampled;
TRL's correction (``vllm_importance_sampling_correction``) multiplies each token's policy loss by
the ratio ``w = exp(log π_θ_old - log π_engine)`` of the trainer's log-probs at the weights
that sampled and the engine's, bounded in one of four ways (``vllm_importance_sampling_mode``):

* ``token_truncate``: ``w`` per token, clamped to ``[clip_min, clip_max]``;
* ``token_mask``: ``w`` per token, ``0`` where it falls outside ``[clip_min, clip_max]``;
* ``sequence_truncate``: one ``w`` per completion, ``exp`` of the summed per-token log-ratio,
  clamped;
* ``sequence_mask`` (TRL's default): one ``w`` per completion, ``0`` (the completion leaves
  the loss) outside the bounds.

``None`` for a bound means no bound on that side. A token whose engine log-prob is NaN gets a
zero log-ratio (weight 1), as in TRL. The weight multiplies the policy term of the per-token
loss after the token masks and before the KL penalty is added, where TRL applies it. The logged
figures are TRL's: ``sampling/sampling_logp_difference/{mean,max}`` (``|log π_θ_old -
log π_engine|`` over the trained tokens) and ``sampling/importance_sampling_ratio/{min,mean,
max}`` (over the trained tokens, or over the completions in the sequence modes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from mtgrpo.algo.registry import IS_CORRECTION_MODES, check_is_correction

__all__ = ["IS_MODES", "EngineCorrection", "correction_figures", "correction_metrics",
           "importance_weights"]

IS_MODES = IS_CORRECTION_MODES  # declared in the registry, so a config validates without torch


@dataclass(frozen=True)
class EngineCorrection:
    """TRL's ``vllm_importance_sampling_mode`` / ``_clip_min`` / ``_clip_max``."""

    # TRL 1.16's GRPOConfig defaults for the vllm_importance_sampling_* options.
    mode: str = "sequence_mask"
    clip_min: float | None = None
    clip_max: float | None = 3.0

    def __post_init__(self) -> None:
        check_is_correction(self.mode, self.clip_min, self.clip_max)

    @property
    def sequence_level(self) -> bool:
        return self.mode.startswith("sequence")


def importance_weights(trainer_logps: Tensor, engine_logps: Tensor, mask: Tensor,
                       correction: EngineCorrection) -> Tensor:
    """The weights of the per-token loss: ``[n, L]`` (token modes) or ``[n, 1]`` (sequence modes).

    ``trainer_logps``: the trainer's log-probs of the sampled tokens at the weights that sampled
    them (``[n, L]``, no gradient); ``engine_logps``: the engine's (``[n, L]``, NaN where it had
    none); ``mask``: the completion tokens (``[n, L]``)."""
    # log(π_θ_old / π_engine): TRL's old_per_token_logps − sampling_per_token_logps, times the
    # mask as there, so padding adds nothing to a sequence's sum.
    diff = (trainer_logps.detach() - engine_logps.to(trainer_logps.dtype)) * mask
    # A token the engine could not score: ratio 1 (no correction) rather than NaN in the loss.
    diff = torch.nan_to_num(diff, nan=0.0)
    if correction.sequence_level:
        # The completion's likelihood ratio: a product of token ratios (a sum, not a mean).
        diff = diff.sum(dim=-1, keepdim=True)  # [n, 1]
    weights = torch.exp(diff)  # TRL's vllm_importance_sampling_ratio
    if correction.mode.endswith("truncate"):
        if correction.clip_min is None and correction.clip_max is None:
            return weights  # no bound on either side (TRL's torch.clamp refuses this case)
        return torch.clamp(weights, min=correction.clip_min, max=correction.clip_max)
    # Mask modes: a missing bound is ±inf, as in TRL's _generate_and_score_completions.
    low = -math.inf if correction.clip_min is None else correction.clip_min
    high = math.inf if correction.clip_max is None else correction.clip_max
    return weights.masked_fill((weights < low) | (weights > high), 0.0)


def correction_figures(trainer_logps: Tensor, engine_logps: Tensor, mask: Tensor,
                       weights: Tensor, correction: EngineCorrection
                       ) -> tuple[np.ndarray, np.ndarray]:
    """One process's raw figures: ``([M] |log-prob differences| over the trained tokens that
    have an engine log-prob, [K] the weights that enter the metrics)``, to pool across
    processes before :func:`correction_metrics`."""
    keep = mask.bool()
    delta = torch.abs(trainer_logps.detach() - engine_logps.to(trainer_logps.dtype))
    # Unscored tokens are left out, as TRL does: counting them as 0 would understate the gap.
    delta = delta[keep & ~torch.isnan(delta)]
    flat = weights.flatten() if correction.sequence_level else weights[keep]
    return (delta.double().cpu().numpy(), flat.detach().double().cpu().numpy())


def correction_metrics(delta: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """TRL's ``sampling/*`` figures from pooled :func:`correction_figures` (0 when empty)."""

    # Over the pooled figures: TRL 1.16 averages the per-process means instead, which agrees
    # only when every process holds as many tokens. Empty: 0, TRL's value.
    def stat(values: np.ndarray, reduce) -> float:
        return float(reduce(values)) if values.size else 0.0

    return {
        "sampling/sampling_logp_difference/mean": stat(delta, np.mean),
        "sampling/sampling_logp_difference/max": stat(delta, np.max),
        "sampling/importance_sampling_ratio/min": stat(weights, np.min),
        "sampling/importance_sampling_ratio/mean": stat(weights, np.mean),
        "sampling/importance_sampling_ratio/max": stat(weights, np.max),
    }
