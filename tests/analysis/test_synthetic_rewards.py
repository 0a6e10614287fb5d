"""Tests of the Gaussian-copula reward backend."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtr, ndtri

from mtgrpo.analysis import (
    ChannelMarginal,
    correlation_matrix,
    default_marginals,
    sample_latent,
    synthetic_rewards,
    validate_correlation,
)

FULL = np.array([
    [1.0, 0.6, -0.3, 0.0],
    [0.6, 1.0, 0.2, 0.1],
    [-0.3, 0.2, 1.0, 0.5],
    [0.0, 0.1, 0.5, 1.0],
])


def test_correlation_matrix_matches_the_seed_example():
    np.testing.assert_array_equal(
        correlation_matrix(0.5, 3), [[1, 0.5, 0], [0.5, 1, 0], [0, 0, 1]]
    )
    np.testing.assert_array_equal(correlation_matrix(-1.0, 2), [[1, -1], [-1, 1]])
    with pytest.raises(ValueError, match=r"rho must be a correlation in \[-1, 1\], got 1.5"):
        correlation_matrix(1.5)
    with pytest.raises(ValueError, match="at least 2 channels"):
        correlation_matrix(0.5, 1)


@pytest.mark.parametrize(
    ("matrix", "match"),
    [
        ([[1.0, 0.5, 0.0]], r"square \[R, R\]"),
        ([[1.0, 0.5], [0.4, 1.0]], r"symmetric: C\[0,1\] = 0.5 but C\[1,0\] = 0.4"),
        ([[2.0, 0.5], [0.5, 1.0]], "unit diagonal"),
        ([[1.0, 0.9, -0.9], [0.9, 1.0, 0.9], [-0.9, 0.9, 1.0]], "positive semi-definite"),
        ([[1.0, np.nan], [np.nan, 1.0]], "finite"),
    ],
)
def test_validate_correlation_refuses_non_correlations(matrix, match):
    with pytest.raises(ValueError, match=match):
        validate_correlation(matrix)


def test_validate_correlation_accepts_singular_matrices():
    np.testing.assert_array_equal(validate_correlation(correlation_matrix(1.0)),
                                  correlation_matrix(1.0))


def test_latent_normals_have_the_requested_correlation():
    # n = 200 000 draws: the sd of a sample correlation is (1 − ρ²)/√n ≤ 0.0023, so 0.01 is
    # over four standard errors.
    latent = sample_latent(FULL, (200_000,), np.random.default_rng(0))  # [n, 4]
    np.testing.assert_allclose(np.corrcoef(latent, rowvar=False), FULL, atol=0.01)
    np.testing.assert_allclose(latent.std(axis=0), 1.0, atol=0.01)
    # singular C (ρ = 1): the two channels coincide exactly
    twins = sample_latent(correlation_matrix(1.0, 2), (1000,), np.random.default_rng(1))
    np.testing.assert_allclose(twins[:, 0], twins[:, 1], atol=1e-12)


def test_synthetic_rewards_latent_follows_the_copula():
    data = synthetic_rewards(FULL, num_prompts=20, num_seeds=100, group_size=8, seed=3,
                             marginals=[ChannelMarginal("gaussian")] * 4)
    assert data.rewards.shape == (20, 100, 8, 4)
    # 16 000 draws: sd of a sample correlation ≤ 0.008, tolerance 0.03 ≈ 4 sd
    flat = data.latent.reshape(-1, 4)
    np.testing.assert_allclose(np.corrcoef(flat, rowvar=False), FULL, atol=0.03)
    np.testing.assert_array_equal(data.rewards, data.latent)  # unit gaussian marginals


def test_marginals_transform_the_latent():
    marginals = [ChannelMarginal("binary"), ChannelMarginal("gaussian", scale=0.5, loc=2.0),
                 ChannelMarginal("uniform", scale=3.0, loc=-1.0)]
    data = synthetic_rewards(np.eye(3), num_prompts=6, num_seeds=300, group_size=8, seed=7,
                             marginals=marginals, success_range=(0.2, 0.8))
    r, x = data.rewards, data.latent
    # binary: 1[x > t_p] with t_p = Φ⁻¹(1 − π_p)
    threshold = -ndtri(data.success_probability)
    np.testing.assert_array_equal(r[..., 0], (x[..., 0] > threshold[:, None, None]) * 1.0)
    assert ((data.success_probability >= 0.2) & (data.success_probability <= 0.8)).all()
    # per-prompt solve rate ≈ π_p: 2 400 Bernoulli draws, sd ≤ 0.0103, tolerance 0.05
    np.testing.assert_allclose(r[..., 0].mean(axis=(1, 2)), data.success_probability, atol=0.05)
    np.testing.assert_allclose(r[..., 1], 2.0 + 0.5 * x[..., 1], rtol=1e-15)
    np.testing.assert_allclose(r[..., 2], -1.0 + 3.0 * ndtr(x[..., 2]), rtol=1e-15)
    assert r[..., 2].min() >= -1.0
    assert r[..., 2].max() <= 2.0
    # Φ(x) ~ Uniform(0, 1): channel mean −1 + 3/2 = 0.5; 14 400 draws, sd 3/√12/120 = 0.0072
    assert r[..., 2].mean() == pytest.approx(0.5, abs=0.03)


def test_same_seed_reproduces_and_other_seed_differs():
    first = synthetic_rewards(correlation_matrix(0.5), num_prompts=3, num_seeds=4, seed=1)
    again = synthetic_rewards(correlation_matrix(0.5), num_prompts=3, num_seeds=4, seed=1)
    other = synthetic_rewards(correlation_matrix(0.5), num_prompts=3, num_seeds=4, seed=2)
    np.testing.assert_array_equal(first.rewards, again.rewards)
    assert not np.array_equal(first.latent, other.latent)


def test_default_marginals_differ_in_scale():
    assert default_marginals(3) == (
        ChannelMarginal("binary"),
        ChannelMarginal("gaussian", scale=0.25),
        ChannelMarginal("gaussian", scale=2.0),
    )
    assert default_marginals(2) == (ChannelMarginal("binary"), ChannelMarginal("gaussian"))
    assert default_marginals(1) == (ChannelMarginal("binary"),)
    scales = [m.scale for m in default_marginals(5)[1:]]
    np.testing.assert_allclose(scales, [0.25, 0.5, 1.0, 2.0])


def test_channel_marginal_parse_and_validation():
    assert ChannelMarginal.parse("gaussian:0.25") == ChannelMarginal("gaussian", scale=0.25)
    assert ChannelMarginal.parse(" Bernoulli ") == ChannelMarginal("binary")
    with pytest.raises(ValueError, match="unknown reward marginal 'cauchy'; valid names: "
                                         "binary, gaussian, uniform"):
        ChannelMarginal.parse("cauchy")
    with pytest.raises(ValueError, match="cannot read the scale of marginal 'gaussian:wide'"):
        ChannelMarginal.parse("gaussian:wide")
    with pytest.raises(ValueError, match=r"scale must be a positive finite number, got -1\.0"):
        ChannelMarginal("uniform", scale=-1.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_prompts": 0}, "num_prompts must be an integer >= 1"),
        ({"num_seeds": 1}, "num_seeds must be an integer >= 2"),
        ({"group_size": 1}, "group_size must be an integer >= 2"),
        ({"marginals": [ChannelMarginal()]}, "got 1 channel marginals for a 3x3"),
        ({"success_range": (0.0, 0.5)}, "success_range must satisfy 0 < low <= high < 1"),
    ],
)
def test_synthetic_rewards_refuses_bad_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        synthetic_rewards(correlation_matrix(0.5), **kwargs)
