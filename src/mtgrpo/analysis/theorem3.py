"""Gradient-noise ("Theorem 3") check of the multi-reward advantage orderings AN and NA.

Source: the U-statistic analysis behind the ``multireward-grpo`` package ("When and Why
Decoupling and Conditioning Beat Reweighting in Multi-Reward GRPO"), ALGORITHMS.md §7.

Notation: rewards ``r [P, S, m, R]`` hold, for each of ``P`` prompts, ``S`` independent
groups ("seeds") of ``m`` completions scored on ``R`` channels with weights ``w [R]``.
Within each group ``(p, s)``, with the population std (ddof 0) and ``δ = 1e-8``:

- per-channel z-scores ``z_jl = (r_jl − mean_l) / (std_l + δ)``;
- NA (normalise-then-aggregate) advantage ``A_j = Σ_l w_l z_jl``;
- AN (aggregate-then-normalise) advantage: ``s_j = Σ_l w_l r_jl`` standardised the same way.

Both come from :func:`mtgrpo.algo.advantages.compute_advantages` and the z-scores from
:func:`mtgrpo.algo.advantages.channel_zscores`, so the analysis measures exactly the estimators
the trainer uses. ``NaN`` (not applicable) follows that module's ``"neutral"`` rule: the
entry's z is 0 and the group statistics use the applicable entries only, so a channel that
is ``None`` for a whole group has z = 0 throughout; a completion with no applicable channel
gets advantage 0.

The gradient model: completion ``j`` contributes a score-function gradient ``g_j``; to
isolate the advantage's contribution, ``g ~ N(0, τ²)`` with ``τ² = 1``, independent of the
rewards, one draw ``g [P, S, m]`` shared by AN and NA. The group's estimate is
``ĝ_{p,s} = (1/m) Σ_j A_j g_{p,s,j}`` and the realised MSE of prompt ``p`` is the sample
variance over seeds (ddof 1, unbiased), ``Var_s ĝ_{p,s}``.

Why NA's realised / predicted ratio is 1 in expectation: ``g`` is independent of ``A`` with
mean 0, so ``E[ĝ | A] = 0`` and ``Var(ĝ | A) = (τ²/m²) Σ_j A_j²``; by the law of total
variance ``Var ĝ = (τ²/m²) E[Σ_j A_j²]``. For NA, ``A = Z w`` with ``Z [m, R]`` the group's
z-scores, so ``Σ_j A_j² = wᵀ ZᵀZ w = m wᵀ Ĉ w`` with ``Ĉ = (1/m) ZᵀZ`` the within-group
channel correlation (exactly the correlation for ``δ → 0``; a constant channel has z = 0
and drops out of it consistently). Hence

    Var ĝ_NA = (τ²/m) wᵀ E[Ĉ] w,

the prediction ``(τ²/m) wᵀ Ĉ_p w`` with ``Ĉ_p`` averaged over the same seeds. The sample
variance (ddof 1) and the seed-averaged ``Ĉ_p`` are unbiased for ``Var ĝ`` and ``E[Ĉ]``, so
realised and predicted MSE have the same expectation and their ratio is 1 up to sampling
noise (per prompt roughly ±10-15 % at ``S = 200``; the overall ratio, mean realised over
mean predicted, within a few percent). A prediction that ignores the correlation
(``wᵀ diag(Ĉ) w``) misses by the factor ``wᵀĈw / wᵀ diag(Ĉ) w``.

AN does not follow this law: its advantages are standardised after aggregation, so
``Σ_j A_j² = m σ_s² / (σ_s + δ)² ≈ m`` for every group with contrast and ``Var ĝ_AN ≈ 1/m``
whatever ``w`` and ``C``; its ratio to the prediction is about ``1 / (wᵀĈw)``.

Per-channel influence ``Cov(A_j, z_jl)``, the mean over groups of ``(1/m) Σ_j A_j z_jl``:
for NA it is ``(Ĉ w)_l``, proportional to ``w_l`` when channels are uncorrelated. For AN it
is ``corr(s, r_l) = Σ_k w_k σ_k Ĉ_kl / σ_s``: each channel counts in proportion to
``w_l σ_l``, so the highest-variance channel is over-weighted.

The pooled prediction uses ``Ĉ`` averaged over all prompts; its mean equals the mean of the
per-prompt predictions (the map is linear), so it changes the per-prompt ratios only, which
shows how much per-prompt correlation structure matters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from mtgrpo.algo.advantages import channel_zscores, compute_advantages

__all__ = [
    "ANALYSIS_DDOF",
    "ANALYSIS_EPS",
    "DEFAULT_BAND",
    "AnalysisResult",
    "AnalysisSummary",
    "EstimatorSummary",
    "analyze",
    "gradient_noise",
    "in_band",
]

ANALYSIS_DDOF = 0  # population std, as the analysis's formulas use
ANALYSIS_EPS = 1e-8  # δ of the analysis
DEFAULT_BAND = (0.85, 1.15)  # accepted NA realised / predicted: ALGORITHMS.md §7's "within 15 %"
REALISED_DDOF = 1  # sample variance over seeds (unbiased)
_NOISE_STREAM = 0x7E03  # entropy prefix: the gradient draws never reuse synthetic draws
_QUANTILES = (0.1, 0.5, 0.9)  # per-prompt spread: ±10-15 % is sampling noise at S = 200


@dataclass(frozen=True, eq=False)
class EstimatorSummary:
    """Headline numbers of one estimator (AN or NA) over all prompts."""

    name: str
    realised_mse: float  # mean over prompts of Var_s ĝ
    ratio: float  # mean realised / mean predicted
    ratio_quantiles: tuple[float, float, float]  # 10 %, 50 %, 90 % of the per-prompt ratio
    influence: np.ndarray  # [R], mean over prompts of Cov(A_j, z_jl)
    influence_share: np.ndarray  # [R], influence / Σ|influence|


@dataclass(frozen=True, eq=False)
class AnalysisSummary:
    """Summary of an :class:`AnalysisResult`."""

    predicted_mse: float  # mean over prompts of (1/m) wᵀ Ĉ_p w (= the pooled prediction)
    pooled_ratio_quantiles: tuple[float, float, float]  # NA per-prompt ratio vs pooled Ĉ
    weight_share: np.ndarray  # [R], w / Σ|w|
    zero_gradient_rate: float  # fraction of groups without contrast
    na: EstimatorSummary
    an: EstimatorSummary


@dataclass(frozen=True, eq=False)
class AnalysisResult:
    """Per-prompt realised and predicted gradient MSE of NA and AN, and channel influence."""

    weights: np.ndarray  # [R]
    channels: tuple[str, ...]  # [R]
    prompt_ids: tuple[str, ...]  # [P]
    group_size: int  # m
    num_seeds: int  # S
    seed: int | None  # seed of the gradient draws (None when they were given)
    realised_na: np.ndarray  # [P], Var_s ĝ_NA (ddof 1)
    realised_an: np.ndarray  # [P], Var_s ĝ_AN (ddof 1)
    predicted: np.ndarray  # [P], (1/m) wᵀ Ĉ_p w
    predicted_pooled: float  # (1/m) wᵀ Ĉ_pooled w
    c_hat: np.ndarray  # [P, R, R], within-group correlation averaged over seeds
    c_pooled: np.ndarray  # [R, R], c_hat averaged over prompts
    influence_na: np.ndarray  # [P, R], Cov(A_j, z_jl) under NA, averaged over seeds
    influence_an: np.ndarray  # [P, R], the same under AN
    channel_std: np.ndarray  # [P, R], within-group std of each raw channel, averaged over seeds
    zero_gradient_rate: np.ndarray  # [P], fraction of seeds whose group has no contrast

    @cached_property
    def summary(self) -> AnalysisSummary:
        return _summarise(self)

    @property
    def num_prompts(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_channels(self) -> int:
        return len(self.channels)

    @property
    def ratio_na(self) -> np.ndarray:  # [P], NaN where the prediction is 0
        return _ratio(self.realised_na, self.predicted)

    @property
    def ratio_an(self) -> np.ndarray:  # [P]
        return _ratio(self.realised_an, self.predicted)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN becomes ``None``)."""
        s = self.summary
        data = {
            "config": {
                "num_prompts": self.num_prompts,
                "num_seeds": self.num_seeds,
                "group_size": self.group_size,
                "channels": list(self.channels),
                "weights": self.weights,
                "seed": self.seed,
                "eps": ANALYSIS_EPS,
                "std_ddof": ANALYSIS_DDOF,
                "realised_ddof": REALISED_DDOF,
                "tau2": 1.0,  # g ~ N(0, 1) by construction
            },
            "summary": {
                "predicted_mse": s.predicted_mse,
                "pooled_ratio_quantiles": s.pooled_ratio_quantiles,
                "weight_share": s.weight_share,
                "zero_gradient_rate": s.zero_gradient_rate,
                "na": _estimator_dict(s.na),
                "an": _estimator_dict(s.an),
            },
            "c_pooled": self.c_pooled,
            "per_prompt": {
                "prompt_id": list(self.prompt_ids),
                "realised_na": self.realised_na,
                "realised_an": self.realised_an,
                "predicted": self.predicted,
                "ratio_na": self.ratio_na,
                "ratio_an": self.ratio_an,
                "influence_na": self.influence_na,
                "influence_an": self.influence_an,
                "channel_std": self.channel_std,
                "zero_gradient_rate": self.zero_gradient_rate,
                "c_hat": self.c_hat,
            },
        }
        return _json_ready(data)


def in_band(value: float, band: tuple[float, float] = DEFAULT_BAND) -> bool:
    """``low <= value <= high``; False for NaN."""
    low, high = band
    return bool(low <= value <= high)


def gradient_noise(shape: tuple[int, int, int], seed: int) -> np.ndarray:
    """The default gradient draws ``g ~ N(0, 1)`` of shape ``[P, S, m]`` for ``seed``."""
    return np.random.default_rng([_NOISE_STREAM, seed]).standard_normal(shape)


def analyze(
    rewards: np.ndarray,
    weights: Sequence[float] | np.ndarray | None = None,
    *,
    seed: int = 0,
    noise: np.ndarray | None = None,
    channels: Sequence[str] | None = None,
    prompt_ids: Sequence[str] | None = None,
) -> AnalysisResult:
    """Run the Theorem-3 check on rewards ``[P, S, m, R]`` (see the module docstring).

    Args:
        rewards: ``[P, S, m, R]``; ``NaN`` = not applicable (the ``"neutral"`` rule).
        weights: ``[R]`` reward weights (default all 1).
        seed: seeds the gradient draws ``g`` (ignored when ``noise`` is given).
        noise: optional ``g [P, S, m]`` to use instead of drawing it.
        channels: ``[R]`` channel names (default ``r0, r1, ...``).
        prompt_ids: ``[P]`` prompt names (default ``p0, p1, ...``).
    """
    r, w = _check_inputs(rewards, weights)
    num_prompts, num_seeds, group_size, num_channels = r.shape
    names = _names(channels, num_channels, "r", "channels")
    ids = _names(prompt_ids, num_prompts, "p", "prompt_ids")
    # One draw shared by NA and AN: their difference is the estimator's, not the noise's.
    g = gradient_noise(r.shape[:3], seed) if noise is None else _check_noise(noise, r.shape[:3])

    # The trainer's own estimator, not a re-derivation, so the check measures what trains.
    a_na, zero_gradient = _advantages(r, w, "normalize_then_sum")  # [P, S, m], [P, S]
    a_an, _ = _advantages(r, w, "sum_then_normalize")
    if zero_gradient.all():  # every prediction would be 0 and every ratio NaN
        raise ValueError(
            "every group is constant in every channel (no within-group contrast), so there is "
            "no gradient noise to analyse; check that the rewards vary between completions"
        )
    z = _zscores(r)  # [P, S, m, R]
    # Ĉ = (1/m) ZᵀZ of each group, averaged over seeds: unbiased for the E[Ĉ] of the law.
    c_hat = np.einsum("psjl,psjk->plk", z, z) / (group_size * num_seeds)  # [P, R, R]
    c_pooled = c_hat.mean(axis=0)  # [R, R]
    predicted = np.einsum("l,plk,k->p", w, c_hat, w) / group_size  # [P]; (τ²/m) wᵀĈw, τ² = 1
    return AnalysisResult(
        weights=w,
        channels=names,
        prompt_ids=ids,
        group_size=group_size,
        num_seeds=num_seeds,
        seed=seed if noise is None else None,
        realised_na=_realised_mse(a_na, g),
        realised_an=_realised_mse(a_an, g),
        predicted=predicted,
        # The map is linear: same mean as `predicted`, only the per-prompt ratios change.
        predicted_pooled=float(w @ c_pooled @ w) / group_size,
        c_hat=c_hat,
        c_pooled=c_pooled,
        influence_na=_influence(a_na, z),
        influence_an=_influence(a_an, z),
        channel_std=_channel_std(r),
        zero_gradient_rate=zero_gradient.mean(axis=1),  # explains a prompt's low realised MSE
    )


def _check_inputs(
    rewards: np.ndarray, weights: Sequence[float] | np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 4:
        raise ValueError(
            f"rewards must have shape [P, S, m, R] (prompts, seeds, group size, channels), "
            f"got shape {r.shape}; add a channel axis with rewards[..., None] for one channel"
        )
    num_prompts, num_seeds, group_size, num_channels = r.shape
    if num_prompts < 1 or num_channels < 1 or num_seeds < 2 or group_size < 2:
        raise ValueError(
            f"rewards of shape {r.shape} need P >= 1 prompts, S >= 2 seeds (a variance over "
            "seeds), m >= 2 completions per group and R >= 1 channels"
        )
    if np.isinf(r).any():
        raise ValueError("rewards contain ±inf; rewards must be finite, or NaN = not applicable")
    w = np.ones(num_channels) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (num_channels,):
        raise ValueError(
            f"got {w.size} reward weights {w.tolist()} for {num_channels} reward channels; "
            "give one weight per channel"
        )
    if not np.isfinite(w).all():
        raise ValueError(f"reward weights must be finite, got {w.tolist()}")
    if not w.any():
        raise ValueError(
            "every reward weight is 0, so every advantage is 0; give a non-zero weight"
        )
    return r, w


def _check_noise(noise: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    g = np.asarray(noise, dtype=np.float64)
    if g.shape != shape:
        raise ValueError(f"noise must have shape [P, S, m] = {shape}, got {g.shape}")
    if not np.isfinite(g).all():
        raise ValueError("noise must be finite")
    return g


def _names(given: Sequence[str] | None, count: int, prefix: str, what: str) -> tuple[str, ...]:
    if given is None:
        return tuple(f"{prefix}{i}" for i in range(count))
    names = tuple(str(name) for name in given)
    if len(names) != count:
        raise ValueError(f"got {len(names)} {what} {list(names)} for {count} entries")
    return names


def _flat(r: np.ndarray) -> np.ndarray:
    return r.reshape(-1, r.shape[-1])  # [P*S*m, R]


def _advantages(r: np.ndarray, w: np.ndarray, aggregation: str) -> tuple[np.ndarray, np.ndarray]:
    """Advantages ``[P, S, m]`` and zero-gradient flags ``[P, S]`` of every group."""
    num_prompts, num_seeds, group_size, _ = r.shape
    result = compute_advantages(
        _flat(r),
        group_size,
        reward_weights=w,
        aggregation=aggregation,
        scale_rewards="group",
        none_handling="neutral",
        # A completion with no applicable channel gets advantage 0 rather than stopping the check.
        on_unscorable="zero_advantage",
        ddof=ANALYSIS_DDOF,  # the analysis's population std and δ, not TRL's ddof 1 and 1e-4
        eps=ANALYSIS_EPS,
    )
    advantages = result.advantages.reshape(num_prompts, num_seeds, group_size)
    return advantages, result.zero_gradient.reshape(num_prompts, num_seeds)


def _zscores(r: np.ndarray) -> np.ndarray:
    """Per-channel z-scores ``[P, S, m, R]`` under the analysis's convention."""
    z = channel_zscores(
        _flat(r), r.shape[2], none_handling="neutral", ddof=ANALYSIS_DDOF, eps=ANALYSIS_EPS
    )
    return z.reshape(r.shape)


def _realised_mse(advantages: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``Var_s ĝ_{p,s}`` (ddof 1) with ``ĝ = (1/m) Σ_j A_j g_j``, shape ``[P]``."""
    estimate = (advantages * g).mean(axis=2)  # [P, S]
    # ddof 1: unbiased for Var ĝ, which the ratio-1 argument of the module docstring needs.
    return estimate.var(axis=1, ddof=REALISED_DDOF)


def _influence(advantages: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Mean over seeds of ``(1/m) Σ_j A_j z_jl``, shape ``[P, R]``."""
    num_seeds, group_size = z.shape[1], z.shape[2]
    # A plain mean of products is the covariance: z is centred within every group.
    return np.einsum("psj,psjl->pl", advantages, z) / (num_seeds * group_size)


def _channel_std(r: np.ndarray) -> np.ndarray:
    """Within-group population std of each channel (applicable entries), seed mean. [P, R]"""
    # σ_l of the raw channel: AN's influence grows with w_l σ_l, so the report shows it.
    applicable = ~np.isnan(r)  # [P, S, m, R]
    count = applicable.sum(axis=2)  # [P, S, R]
    values = np.where(applicable, r, 0.0)
    # maximum(count, 1): a channel that is None for a whole group has std 0, not 0/0
    mean = values.sum(axis=2) / np.maximum(count, 1)
    square = (np.where(applicable, r - mean[:, :, None], 0.0) ** 2).sum(axis=2)
    return np.sqrt(square / np.maximum(count, 1)).mean(axis=1)


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):  # 0 predictions give NaN just below
        return np.where(denominator > 0, numerator / denominator, np.nan)


def _quantiles(values: np.ndarray) -> tuple[float, float, float]:
    finite = values[np.isfinite(values)]  # prompts without a prediction have no ratio
    if finite.size == 0:
        return (float("nan"),) * 3
    low, mid, high = np.quantile(finite, _QUANTILES)
    return float(low), float(mid), float(high)


def _share(values: np.ndarray) -> np.ndarray:
    # Σ|·|, not Σ: an anti-correlated channel's influence (or a weight) can be negative.
    total = np.abs(values).sum()
    return values / total if total > 0 else np.full_like(values, np.nan)


def _estimator(name: str, realised: np.ndarray, result: AnalysisResult) -> EstimatorSummary:
    influence = (result.influence_na if name == "NA" else result.influence_an).mean(axis=0)
    return EstimatorSummary(
        name=name,
        realised_mse=float(realised.mean()),
        # Mean over mean: a mean of ratios would be dominated by prompts with tiny predictions.
        ratio=float(realised.mean() / result.predicted.mean()),
        ratio_quantiles=_quantiles(_ratio(realised, result.predicted)),
        influence=influence,
        influence_share=_share(influence),
    )


def _summarise(result: AnalysisResult) -> AnalysisSummary:
    pooled = np.full_like(result.predicted, result.predicted_pooled)
    return AnalysisSummary(
        predicted_mse=float(result.predicted.mean()),
        pooled_ratio_quantiles=_quantiles(_ratio(result.realised_na, pooled)),
        weight_share=_share(result.weights),
        zero_gradient_rate=float(result.zero_gradient_rate.mean()),
        na=_estimator("NA", result.realised_na, result),
        an=_estimator("AN", result.realised_an, result),
    )


def _estimator_dict(summary: EstimatorSummary) -> dict[str, Any]:
    return {
        "realised_mse": summary.realised_mse,
        "ratio": summary.ratio,
        "ratio_quantiles": summary.ratio_quantiles,
        "influence": summary.influence,
        "influence_share": summary.influence_share,
    }


def _json_ready(value: Any) -> Any:
    """Arrays to lists, numpy scalars to Python, NaN and ±inf to None."""
    if isinstance(value, dict):
        return {key: _json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(item) for item in value]
    if isinstance(value, np.ndarray):
        return _json_ready(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None  # JSON has no NaN or inf
    if isinstance(value, np.integer):
        return int(value)
    return value
