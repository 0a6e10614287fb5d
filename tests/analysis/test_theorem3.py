"""Tests of the Theorem-3 harness: hand-derived values, a plain-loop reference, the law itself."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from mtgrpo.algo.advantages import compute_advantages
from mtgrpo.analysis import (
    ANALYSIS_EPS,
    ChannelMarginal,
    analyze,
    correlation_matrix,
    gradient_noise,
    in_band,
    synthetic_rewards,
)

WEIGHTS = np.array([1.0, 1.0, 0.5])


def _hand_group() -> np.ndarray:
    # channel 0 = [1, 0, 1, 0]: mean 0.5, population std 0.5 -> z0 = [1, -1, 1, -1]
    # channel 1 = [2, 2, 0, 0]: mean 1,   population std 1   -> z1 = [1, 1, -1, -1]
    return np.array([[1.0, 2.0], [0.0, 2.0], [1.0, 0.0], [0.0, 0.0]])  # [m=4, R=2]


def test_hand_built_group_matches_the_formulas():
    rewards = np.stack([_hand_group(), _hand_group()])[None]  # [P=1, S=2, m=4, R=2]
    # g picks completion 0 in seed 0 and completion 3 in seed 1.
    noise = np.zeros((1, 2, 4))
    noise[0, 0, 0] = 1.0
    noise[0, 1, 3] = 1.0
    result = analyze(rewards, [1.0, 1.0], noise=noise)
    # NA: A = z0 + z1 = [2, 0, 0, -2]; ĝ_0 = 2/4 = 0.5, ĝ_1 = -2/4 = -0.5;
    # sample variance (ddof 1) = (0.5² + 0.5²) / 1 = 0.5.
    np.testing.assert_allclose(result.realised_na, [0.5], rtol=1e-6)
    # Ĉ = (1/4) ZᵀZ = [[1, 0], [0, 1]] (z0 ⟂ z1), up to δ = 1e-8 in the denominators.
    np.testing.assert_allclose(result.c_hat[0], np.eye(2), atol=1e-7)
    # prediction (1/m) wᵀĈw = 2 / 4 = 0.5; NA influence Ĉw = [1, 1].
    np.testing.assert_allclose(result.predicted, [0.5], rtol=1e-6)
    np.testing.assert_allclose(result.influence_na[0], [1.0, 1.0], rtol=1e-6)
    # AN: s = [3, 2, 1, 0], σ_s = √1.25; influence corr(s, r_l) = w_l σ_l / σ_s
    # = 0.5/√1.25 = 1/√5 and 1/√1.25 = 2/√5: the wider channel counts twice as much.
    np.testing.assert_allclose(result.influence_an[0], [1 / math.sqrt(5), 2 / math.sqrt(5)],
                               rtol=1e-6)
    # AN's ĝ_0 = A_0/4 = (1.5/√1.25)/4 and ĝ_1 = -ĝ_0, so Var = 2 ĝ_0² = 2 · 2.25/1.25/16.
    np.testing.assert_allclose(result.realised_an, [2 * 2.25 / 1.25 / 16], rtol=1e-6)
    np.testing.assert_allclose(result.channel_std[0], [0.5, 1.0], rtol=1e-12)


def _loop_zscores(group: np.ndarray) -> np.ndarray:
    """Neutral rule: statistics over applicable entries, z = 0 where not applicable."""
    m, num_channels = group.shape
    z = np.zeros((m, num_channels))
    for channel in range(num_channels):
        rows = [j for j in range(m) if not math.isnan(group[j, channel])]
        if not rows:
            continue
        mean = sum(group[j, channel] for j in rows) / len(rows)
        std = math.sqrt(sum((group[j, channel] - mean) ** 2 for j in rows) / len(rows))
        for j in rows:
            z[j, channel] = (group[j, channel] - mean) / (std + ANALYSIS_EPS)
    return z


def _loop_an(group: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """AN with the neutral rule: a missing entry takes its channel's applicable group mean;
    a completion with no applicable channel gets advantage 0 and stays out of mean and std."""
    m, num_channels = group.shape
    filled = group.copy()
    for channel in range(num_channels):
        column = [v for v in group[:, channel] if not math.isnan(v)]
        fill = sum(column) / len(column) if column else 0.0
        for j in range(m):
            if math.isnan(filled[j, channel]):
                filled[j, channel] = fill
    scorable = [j for j in range(m) if not all(math.isnan(v) for v in group[j])]
    s = {j: sum(weights[c] * filled[j, c] for c in range(num_channels)) for j in scorable}
    mean = sum(s.values()) / len(s)
    std = math.sqrt(sum((v - mean) ** 2 for v in s.values()) / len(s))
    return np.array([(s[j] - mean) / (std + ANALYSIS_EPS) if j in s else 0.0 for j in range(m)])


def _loop_reference(rewards: np.ndarray, weights: np.ndarray, noise: np.ndarray) -> dict:
    num_prompts, num_seeds, m, num_channels = rewards.shape
    out = {key: [] for key in ("realised_na", "realised_an", "predicted", "c_hat",
                               "influence_na", "influence_an")}
    for p in range(num_prompts):
        estimates = {"na": [], "an": []}
        c_sum = np.zeros((num_channels, num_channels))
        influence = {"na": np.zeros(num_channels), "an": np.zeros(num_channels)}
        for s in range(num_seeds):
            group = rewards[p, s]
            z = _loop_zscores(group)
            advantages = {
                "na": np.array([sum(weights[c] * z[j, c] for c in range(num_channels))
                                for j in range(m)]),
                "an": _loop_an(group, weights),
            }
            for c in range(num_channels):
                for k in range(num_channels):
                    c_sum[c, k] += sum(z[j, c] * z[j, k] for j in range(m)) / m
            for name, a in advantages.items():
                estimates[name].append(sum(a[j] * noise[p, s, j] for j in range(m)) / m)
                for c in range(num_channels):
                    influence[name][c] += sum(a[j] * z[j, c] for j in range(m)) / m
        c_hat = c_sum / num_seeds
        out["c_hat"].append(c_hat)
        out["predicted"].append(weights @ c_hat @ weights / m)
        for name in ("na", "an"):
            values = estimates[name]
            mean = sum(values) / num_seeds
            out[f"realised_{name}"].append(sum((v - mean) ** 2 for v in values) / (num_seeds - 1))
            out[f"influence_{name}"].append(influence[name] / num_seeds)
    return {key: np.array(value) for key, value in out.items()}


@pytest.mark.parametrize("shape", [(2, 3, 4, 3), (3, 5, 6, 2), (1, 4, 3, 4)])
def test_vectorised_analysis_matches_plain_loop(shape):
    rng = np.random.default_rng(sum(shape))
    rewards = rng.normal(size=shape) * rng.uniform(0.1, 3.0, size=shape[-1])
    rewards[rng.uniform(size=shape) < 0.1] = np.nan  # scattered "not applicable"
    rewards[0, 0, :, 0] = np.nan  # a channel None for a whole group
    rewards[-1, -1, :, -1] = 2.5  # a constant channel
    weights = rng.uniform(0.2, 2.0, size=shape[-1])
    noise = rng.normal(size=shape[:3])
    result = analyze(rewards, weights, noise=noise)
    reference = _loop_reference(rewards, weights, noise)
    for key, expected in reference.items():
        np.testing.assert_allclose(getattr(result, key), expected, rtol=1e-9, atol=1e-12,
                                   err_msg=key)


def test_prediction_is_the_exact_mean_of_the_conditional_variance():
    # Var(ĝ | A) = (1/m²) Σ_j A_j² and Σ_j A_j² = m wᵀĈw for NA, so the per-prompt
    # prediction equals the seed-average of (1/m²) Σ_j A_j² exactly (not only in expectation).
    data = synthetic_rewards(correlation_matrix(0.7), num_prompts=4, num_seeds=6, seed=3)
    result = analyze(data.rewards, WEIGHTS)
    flat = torch.from_numpy(data.rewards.reshape(-1, 3))
    advantages = compute_advantages(flat, 8, reward_weights=WEIGHTS, aggregation="na",
                                    ddof=0, eps=ANALYSIS_EPS).advantages.numpy()
    conditional = (advantages.reshape(4, 6, 8) ** 2).sum(axis=2).mean(axis=1) / 8**2
    np.testing.assert_allclose(result.predicted, conditional, rtol=1e-12)


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9, -0.4])
def test_na_ratio_is_within_the_band_on_synthetic_rewards(rho):
    data = synthetic_rewards(correlation_matrix(rho), seed=11)
    summary = analyze(data.rewards, WEIGHTS, seed=11).summary
    assert in_band(summary.na.ratio), summary.na.ratio
    # the per-prompt ratios scatter around 1 (S = 200): the median sits close to it
    assert abs(summary.na.ratio_quantiles[1] - 1.0) < 0.1


def _diagonal_ratio(result) -> float:
    """Realised / a prediction that ignores the correlation, (1/m) Σ_l w_l² Ĉ_ll."""
    diagonal = np.einsum("pll->pl", result.c_hat) @ result.weights**2 / result.group_size
    return float(result.realised_na.mean() / diagonal.mean())


def test_a_prediction_ignoring_correlation_fails_the_band_when_rho_is_large():
    strong = analyze(synthetic_rewards(correlation_matrix(0.9), seed=5).rewards, WEIGHTS, seed=5)
    # wᵀĈw / wᵀdiag(Ĉ)w = 1 + 2·Ĉ01 / (Ĉ00 + Ĉ11 + 0.25) with Ĉ01 ≈ 0.6, Ĉ00 ≈ 0.88 -> ≈ 1.6
    assert strong.c_pooled[0, 1] > 0.5
    assert _diagonal_ratio(strong) > 1.4
    assert not in_band(_diagonal_ratio(strong))
    assert in_band(strong.summary.na.ratio)
    # with independent channels the diagonal prediction is the right one: the test discriminates
    independent = analyze(synthetic_rewards(correlation_matrix(0.0), seed=5).rewards, WEIGHTS,
                          seed=5)
    assert in_band(_diagonal_ratio(independent))


def test_an_over_weights_the_high_variance_channel():
    # Two independent Gaussian channels, scales 1 and 4, equal weights.
    # NA: influence Ĉw ≈ (1, 1) -> shares 0.5 / 0.5.
    # AN: corr(s, r_l) = σ_l / σ_s = 1/√17 and 4/√17 -> shares 0.2 / 0.8.
    data = synthetic_rewards(
        np.eye(2), num_prompts=20, num_seeds=200, seed=2,
        marginals=[ChannelMarginal("gaussian", 1.0), ChannelMarginal("gaussian", 4.0)],
    )
    summary = analyze(data.rewards, [1.0, 1.0], seed=2).summary
    np.testing.assert_allclose(summary.na.influence_share, [0.5, 0.5], atol=0.01)
    np.testing.assert_allclose(summary.an.influence_share, [0.2, 0.8], atol=0.03)
    np.testing.assert_allclose(summary.an.influence, [1 / math.sqrt(17), 4 / math.sqrt(17)],
                               atol=0.05)


def test_an_noise_is_about_one_over_m_whatever_the_weights():
    # AN advantages are standardised: Σ_j A_j² = m σ²/(σ+δ)² ≈ m, so Var ĝ_AN ≈ 1/m; with
    # 40 · 200 groups the mean realised MSE is within a few percent of 1/8.
    data = synthetic_rewards(correlation_matrix(0.5), seed=4)
    for weights in ([1.0, 1.0, 0.5], [3.0, 0.1, 1.0]):
        summary = analyze(data.rewards, weights, seed=4).summary
        assert summary.zero_gradient_rate == 0.0
        assert summary.an.realised_mse == pytest.approx(1 / 8, rel=0.05)


def test_pooled_prediction_is_the_mean_of_per_prompt_predictions():
    data = synthetic_rewards(correlation_matrix(0.3), num_prompts=7, num_seeds=10, seed=8)
    result = analyze(data.rewards, WEIGHTS)
    assert result.predicted_pooled == pytest.approx(result.predicted.mean(), rel=1e-12)
    np.testing.assert_allclose(result.c_pooled, result.c_hat.mean(axis=0), rtol=1e-12)


def test_same_seed_same_result_and_noise_is_shared_between_estimators():
    data = synthetic_rewards(correlation_matrix(0.5), num_prompts=3, num_seeds=5, seed=1)
    first = analyze(data.rewards, WEIGHTS, seed=9)
    again = analyze(data.rewards, WEIGHTS, seed=9, noise=gradient_noise((3, 5, 8), 9))
    np.testing.assert_array_equal(first.realised_na, again.realised_na)
    np.testing.assert_array_equal(first.realised_an, again.realised_an)
    other = analyze(data.rewards, WEIGHTS, seed=10)
    assert not np.allclose(first.realised_na, other.realised_na)


def test_constant_prompt_gives_nan_ratio_and_json_null():
    data = synthetic_rewards(correlation_matrix(0.5), num_prompts=2, num_seeds=4, seed=0)
    rewards = data.rewards.copy()
    rewards[1] = 1.0  # prompt 1: every completion scores the same -> no gradient, prediction 0
    result = analyze(rewards, WEIGHTS)
    assert result.zero_gradient_rate.tolist() == [0.0, 1.0]
    assert result.predicted[1] == 0.0
    assert math.isnan(result.ratio_na[1])
    encoded = json.dumps(result.to_dict(), allow_nan=False)
    decoded = json.loads(encoded)
    assert decoded["per_prompt"]["ratio_na"][1] is None
    assert decoded["config"]["group_size"] == 8
    assert decoded["summary"]["na"]["ratio"] == pytest.approx(result.summary.na.ratio)


def test_in_band():
    assert in_band(1.0)
    assert in_band(0.85)
    assert in_band(1.15)
    assert not in_band(1.16)
    assert not in_band(float("nan"))
    assert in_band(2.0, (1.5, 2.5))


@pytest.mark.parametrize(
    ("rewards", "weights", "match"),
    [
        (np.zeros((2, 8, 3)), None, r"shape \[P, S, m, R\]"),
        (np.zeros((1, 1, 8, 3)), None, "S >= 2 seeds"),
        (np.zeros((1, 2, 1, 3)), None, "m >= 2"),
        (np.random.default_rng(0).normal(size=(1, 2, 4, 3)), [1.0, 1.0], "2 reward weights"),
        (np.random.default_rng(0).normal(size=(1, 2, 4, 2)), [0.0, 0.0], "every reward weight"),
        (np.full((1, 2, 4, 1), np.inf), None, "±inf"),
        (np.ones((2, 3, 4, 2)), None, "no within-group contrast"),
    ],
)
def test_bad_input_is_refused(rewards, weights, match):
    with pytest.raises(ValueError, match=match):
        analyze(rewards, weights)


def test_bad_noise_and_names_are_refused():
    rewards = np.random.default_rng(0).normal(size=(2, 3, 4, 2))
    with pytest.raises(ValueError, match=r"noise must have shape \[P, S, m\]"):
        analyze(rewards, noise=np.zeros((2, 3, 5)))
    with pytest.raises(ValueError, match="got 1 channels"):
        analyze(rewards, channels=["a"])
