"""Which tokens a policy loss trains on, and how much: masks and weights from TRL 1.16's options.

Notation as in :mod:`mtgrpo.algo.losses`: ``n`` rows, ``L`` completion tokens, ``m [n, L]``
the completion mask, ``A [n]`` the advantages, ``logp`` / ``old`` the current and the sampling
policy's token log-probabilities.

* :func:`off_policy_mask` (DeepSeek-V3.2's off-policy sequence mask, TRL's
  ``off_policy_mask_threshold``): a completion is dropped when ``A_j < 0`` and its mean token
  KL estimate ``mean_t (old - logp)`` exceeds the threshold; everything else is kept.
* :func:`entropy_threshold` and :func:`high_entropy_mask` ("Beyond the 80/20 rule", TRL's
  ``top_entropy_quantile = ρ``): keep the tokens whose entropy is at least the
  ``1 − ρ`` quantile (``torch.quantile``, linear interpolation) of the non-padding entropies.
* :func:`gamma_weights` (VESPO, TRL's ``vespo`` loss): with the sequence ratio
  ``w = exp(Σ_t m (logp − old))`` (each token's log-ratio clamped to ±20, ``log w`` to
  ``[ln 1e-8, 20]``), ``φ(w) = exp(λ + k ln w − λ w)`` (so ``φ(1) = 1``), with ``(k, λ)`` the
  positive pair for ``A ≥ 0`` and the negative pair otherwise; no gradient flows through φ.
* :class:`AdaptiveEntropy` (Skywork-OR1, TRL's ``use_adaptive_entropy``): the entropy bonus
  applies only while the last optimizer step's entropy was at or below the target, and its
  coefficient moves by ``delta`` towards keeping it there, within ``[min, max]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "AdaptiveEntropy",
    "entropy_threshold",
    "gamma_weights",
    "high_entropy_mask",
    "off_policy_mask",
]


def off_policy_mask(
    advantages: Tensor, logps: Tensor, sampling_logps: Tensor, mask: Tensor, threshold: float
) -> Tensor:
    """``[n]`` True where completion ``j`` is kept: ``A_j >= 0`` or mean token KL <= threshold.

    ``advantages [n]``; ``logps, sampling_logps, mask [n, L]``. The KL estimate per token is
    ``sampling_logp − logp`` (detached); NaN tokens (unscored by the sampler) count as 0, and
    padding is excluded.
    """
    # An unscored token gives no KL evidence; as NaN it would make the mean NaN and drop a
    # negative-advantage completion on one token (TRL 1.16's get_off_policy_mask does the same).
    kl = torch.nan_to_num(sampling_logps - logps.detach(), nan=0.0)
    kept = torch.where(mask.bool(), kl, torch.zeros_like(kl))
    # TRL's avg_seq_kl; clamp: a completion without tokens has KL 0, kept
    mean_kl = kept.sum(-1) / mask.sum(-1).clamp(min=1)  # [n]
    # DeepSeek-V3.2's Eq. 9 (per TRL's docs): only negative-advantage completions that drifted go.
    return (advantages >= 0) | (mean_kl <= threshold)


def entropy_threshold(entropies: Tensor, quantile: float) -> Tensor | None:
    """The ``quantile`` of the 1-D tensor of non-padding ``entropies`` (None when empty)."""
    if not 0 <= quantile <= 1:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    values = entropies.float().flatten()  # torch.quantile takes float32 / float64 only
    if values.numel() == 0:
        return None
    return torch.quantile(values, quantile)


def high_entropy_mask(entropies: Tensor, mask: Tensor, threshold: Tensor | None) -> Tensor:
    """``[n, L]`` True at non-padding tokens whose entropy is >= ``threshold`` (none if None)."""
    keep = mask.bool()
    if threshold is None:
        return torch.zeros_like(keep)  # no entropies anywhere: TRL's get_high_entropy_mask
    # & keep: padding never trains, as TRL 1.16's `entropy_mask & mask.bool()`.
    return (entropies.detach() >= threshold) & keep


@torch.no_grad()
def gamma_weights(
    advantages: Tensor,
    log_ratio: Tensor,
    mask: Tensor,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> Tensor:
    """VESPO's ``φ(w) [n]`` (see the module docstring); ``log_ratio = logp − old  [n, L]``."""
    # ln 1e-8 ≈ −18.42: TRL 1.16's get_gamma_weights clamps here to match VESPO's original code.
    floor = math.log(1e-8)
    clamped = torch.clamp(log_ratio, -20.0, 20.0)  # TRL 1.16's per-token clamp
    # VESPO's sequence ratio is a product of token ratios: a sum of log-ratios, not a mean.
    summed = torch.where(mask.bool(), clamped, torch.zeros_like(clamped)).sum(-1)  # [n]
    log_w = torch.clamp(summed, floor, 20.0)  # w in [1e-8, e^20], TRL's log_w_seq
    positive = advantages >= 0

    def pick(pos: float, neg: float) -> Tensor:
        as_tensor = [torch.tensor(v, dtype=log_w.dtype, device=log_w.device) for v in (pos, neg)]
        return torch.where(positive, *as_tensor)

    k, lam = pick(k_pos, k_neg), pick(lambda_pos, lambda_neg).clamp(min=1e-4)  # TRL's clamp
    # φ = e^λ w^k e^{−λw}, computed in log space as TRL 1.16's get_gamma_weights does.
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)  # as TRL: non-finite weighs 0


@dataclass
class AdaptiveEntropy:
    """The entropy coefficient of the loss, constant or adapted once per optimizer step.

    ``applied`` is the coefficient every micro-batch of the current optimizer step uses;
    :meth:`update` takes the step's token-mean entropy (over all processes) afterwards.
    Without ``adaptive`` the coefficient is constant and :meth:`update` only records.
    """

    coef: float
    adaptive: bool = False
    # TRL 1.16's defaults: entropy_target, entropy_coef_delta, entropy_coef_min / _max.
    target: float = 0.2
    delta: float = 0.005
    minimum: float = 0.0
    maximum: float = 1.0
    # inf: no adaptive bonus before the first measurement (TRL's _last_world_entropy).
    last_entropy: float = math.inf

    @property
    def enabled(self) -> bool:
        """The bonus term is computed (a constant non-zero coefficient, or adaptive)."""
        # Adaptive stays enabled at coef 0 so the bonus can recover (TRL's _entropy_bonus_enabled).
        return self.coef != 0.0 or self.adaptive

    @property
    def applied(self) -> float:
        # Read from the previous step's entropy, so every micro-batch of a step applies the same
        # bonus (TRL's apply_coef); the bonus acts only while entropy is at or below the target.
        if self.adaptive and self.last_entropy > self.target:
            return 0.0
        return self.coef

    def update(self, entropy: float) -> None:
        """After an optimizer step whose trained tokens had mean entropy ``entropy``."""
        if self.adaptive:
            # TRL 1.16 _compute_loss's controller, step for step
            if entropy <= self.target:
                self.coef = min(self.coef + self.delta, self.maximum)
            else:
                self.coef = max(self.coef - self.delta, self.minimum)
        self.last_entropy = entropy

    def state_dict(self) -> dict[str, float]:
        # What resume needs: TRL keeps the same two (entropy_coef, _last_world_entropy).
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef = float(state["coef"])
        self.last_entropy = float(state["last_entropy"])
