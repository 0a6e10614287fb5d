"""Synthetic multi-channel rewards from a Gaussian copula, for the Theorem-3 check.

Model (the mock backend of the ``multireward-grpo`` analysis, written from its
description): every completion ``j`` of group ``(p, s)`` gets a latent vector

    x_{p,s,j} ~ N(0, C),   C [R, R] a correlation matrix,

drawn independently across prompts, seeds and completions, and channel ``l`` of its
reward is a monotone transform of the latent: ``r_l = F_l(x_l)``. The transforms set
the marginals (and so the very different reward scales that make aggregate-then-
normalise (AN) favour one channel) while ``C`` sets the dependence. Transforms
(registry ``MARGINALS``, chosen per channel with :class:`ChannelMarginal`):

- ``binary``: ``loc + scale * 1[x_l > t_p]``, a correctness reward. The threshold
  ``t_p = Φ⁻¹(1 − π_p)`` makes prompt ``p`` solved with probability ``π_p``, its
  difficulty, drawn once per prompt from ``Uniform(success_range)``.
- ``gaussian``: ``loc + scale * x_l``.
- ``uniform``: ``loc + scale * Φ(x_l)``, a bounded score in ``[loc, loc + scale]``.

Difficulty enters only through the binary threshold: group-normalised statistics are
invariant to a per-prompt shift of a continuous channel, so shifting those would not
change anything the analysis measures.

Randomness: one ``numpy`` generator seeded from ``seed`` on a stream of its own, so
the same seed reproduces the same rewards and never shares draws with the analysis's
gradient noise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri

from mtgrpo.algo.registry import Registry

__all__ = [
    "MARGINALS",
    "ChannelMarginal",
    "SyntheticRewards",
    "correlation_matrix",
    "default_marginals",
    "sample_latent",
    "synthetic_rewards",
    "validate_correlation",
]

# Distinct entropy prefix so synthetic draws never coincide with the analysis noise.
_SYNTHETIC_STREAM = 0x5E7D
_TOLERANCE = 1e-8  # slack for a matrix typed in decimals or computed in floating point

# (latent of one channel [P, S, m], its marginal, per-prompt threshold [P]) -> rewards [P, S, m]
MarginalTransform = Callable[[np.ndarray, "ChannelMarginal", np.ndarray], np.ndarray]
MARGINALS: Registry[MarginalTransform] = Registry("reward marginal")


@MARGINALS.register("binary", aliases=("bernoulli", "correctness"))
def _binary(latent: np.ndarray, marginal: ChannelMarginal, threshold: np.ndarray) -> np.ndarray:
    passed = latent > threshold[:, None, None]  # [P, S, m]; P(pass) = π_p, the difficulty
    return marginal.loc + marginal.scale * passed.astype(np.float64)


@MARGINALS.register("gaussian", aliases=("normal",))
def _gaussian(latent: np.ndarray, marginal: ChannelMarginal, threshold: np.ndarray) -> np.ndarray:
    return marginal.loc + marginal.scale * latent


@MARGINALS.register("uniform")
def _uniform(latent: np.ndarray, marginal: ChannelMarginal, threshold: np.ndarray) -> np.ndarray:
    return marginal.loc + marginal.scale * ndtr(latent)  # Φ(x) ~ Uniform(0, 1) for x ~ N(0, 1)


@dataclass(frozen=True)
class ChannelMarginal:
    """The marginal of one reward channel: a transform name from ``MARGINALS``, scale, offset."""

    kind: str = "gaussian"
    scale: float = 1.0
    loc: float = 0.0

    def __post_init__(self) -> None:
        # The canonical name, so marginals given by an alias compare and print alike.
        object.__setattr__(self, "kind", MARGINALS.canonical(self.kind))
        if not (np.isfinite(self.scale) and self.scale > 0):
            raise ValueError(
                f"marginal scale must be a positive finite number, got {self.scale!r}; "
                "use e.g. ChannelMarginal('gaussian', scale=0.5)"
            )
        if not np.isfinite(self.loc):
            raise ValueError(f"marginal loc must be finite, got {self.loc!r}")

    @classmethod
    def parse(cls, text: str) -> ChannelMarginal:
        """``"kind"`` or ``"kind:scale"`` (e.g. ``"gaussian:0.25"``) -> a marginal."""
        kind, _, scale = text.strip().partition(":")
        if not scale:
            return cls(kind)
        try:
            value = float(scale)
        except ValueError:
            raise ValueError(
                f"cannot read the scale of marginal {text!r}; write 'kind' or 'kind:scale', "
                "e.g. 'gaussian:0.25'"
            ) from None
        return cls(kind, scale=value)


def default_marginals(num_channels: int) -> tuple[ChannelMarginal, ...]:
    """Channel 0 binary correctness; the others Gaussian with spreads from 0.25 to 2.0.

    The spreads are geometric so that channels differ in scale by up to 8x, which is
    the heterogeneity under which AN and NA part ways.
    """
    if num_channels < 1:
        raise ValueError(f"need at least one reward channel, got {num_channels}")
    # geomspace of one point would be 0.25 alone: two channels get a unit-scale Gaussian.
    spreads = np.geomspace(0.25, 2.0, num_channels - 1) if num_channels > 2 else [1.0]
    rest = [ChannelMarginal("gaussian", scale=float(s)) for s in spreads[: num_channels - 1]]
    return (ChannelMarginal("binary"), *rest)


def correlation_matrix(rho: float, num_channels: int = 3) -> np.ndarray:
    """``C [R, R]`` with channels 0 and 1 correlated by ``rho``, all other pairs independent.

    For ``R = 3`` this is the example of the ``multireward-grpo`` description,
    ``[[1, ρ, 0], [ρ, 1, 0], [0, 0, 1]]``.
    """
    if not (np.isfinite(rho) and -1.0 <= rho <= 1.0):
        raise ValueError(f"rho must be a correlation in [-1, 1], got {rho!r}")
    if num_channels < 2:
        raise ValueError(
            f"a correlation between channels 0 and 1 needs at least 2 channels, got "
            f"{num_channels}; for a single channel use the 1x1 matrix [[1]] (--correlation 1)"
        )
    correlation = np.eye(num_channels)
    correlation[0, 1] = correlation[1, 0] = rho
    return correlation


def validate_correlation(correlation: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    """Return ``correlation`` as float64 ``[R, R]`` after checking it is a correlation matrix.

    Rules: square, finite, symmetric, unit diagonal, positive semi-definite (smallest
    eigenvalue ≥ -1e-8). Singular matrices (e.g. ``rho = 1``) are allowed.
    """
    matrix = np.asarray(correlation, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] == 0:
        raise ValueError(
            f"a correlation matrix must be square [R, R], got shape {matrix.shape}; "
            "write it as rows separated by ';', e.g. '1,0.5;0.5,1'"
        )
    if not np.isfinite(matrix).all():
        raise ValueError(f"a correlation matrix must be finite, got {matrix.tolist()}")
    asymmetry = np.abs(matrix - matrix.T).max()
    if asymmetry > _TOLERANCE:
        i, j = np.unravel_index(np.abs(matrix - matrix.T).argmax(), matrix.shape)
        raise ValueError(
            f"a correlation matrix must be symmetric: C[{i},{j}] = {matrix[i, j]} but "
            f"C[{j},{i}] = {matrix[j, i]}; make the two entries equal"
        )
    diagonal = np.diag(matrix)
    if np.abs(diagonal - 1.0).max() > _TOLERANCE:
        raise ValueError(
            f"a correlation matrix has a unit diagonal, got diagonal {diagonal.tolist()}; "
            "set every C[l,l] to 1 (scales belong in the channel marginals)"
        )
    # Semi-definite, not Cholesky's definite: ρ = ±1 (singular) is a valid copula.
    smallest = float(np.linalg.eigvalsh(matrix).min())
    if smallest < -_TOLERANCE:
        raise ValueError(
            f"a correlation matrix must be positive semi-definite, but its smallest eigenvalue "
            f"is {smallest:.4g}; the pairwise correlations {matrix.tolist()} are inconsistent "
            "with each other, so shrink the off-diagonal entries"
        )
    return matrix


def sample_latent(
    correlation: np.ndarray, size: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """Draws of ``N(0, C)``, shape ``[*size, R]``.

    Uses the symmetric square root ``C = V Λ Vᵀ = L Lᵀ`` with ``L = V Λ^{1/2}`` rather than
    Cholesky, so positive semi-definite (singular) ``C`` works too.
    """
    matrix = validate_correlation(correlation)
    eigenvalues, eigenvectors = np.linalg.eigh(matrix)
    # eigh of a singular C may return eigenvalues like −1e-17: clip before the square root.
    factor = eigenvectors * np.sqrt(np.clip(eigenvalues, 0.0, None))  # [R, R], L Lᵀ = C
    standard = rng.standard_normal((*size, matrix.shape[0]))  # [*size, R]
    return standard @ factor.T  # x = L u with u ~ N(0, I): Cov x = L Lᵀ = C


@dataclass(frozen=True, eq=False)
class SyntheticRewards:
    """Synthetic rewards and the draws that produced them."""

    rewards: np.ndarray  # [P, S, m, R]
    latent: np.ndarray  # [P, S, m, R], the copula's normals
    success_probability: np.ndarray  # [P], π_p of each prompt (binary channels)
    correlation: np.ndarray  # [R, R]
    marginals: tuple[ChannelMarginal, ...]  # [R]


def synthetic_rewards(
    correlation: np.ndarray | Sequence[Sequence[float]],
    *,
    num_prompts: int = 40,
    num_seeds: int = 200,
    group_size: int = 8,
    marginals: Sequence[ChannelMarginal] | None = None,
    success_range: tuple[float, float] = (0.1, 0.9),
    seed: int = 0,
) -> SyntheticRewards:
    """Draw rewards ``[P, S, m, R]`` from the Gaussian copula described in the module docstring.

    ``marginals`` defaults to :func:`default_marginals`; ``success_range`` bounds the
    per-prompt solve probability ``π_p`` of binary channels.
    """
    matrix = validate_correlation(correlation)
    num_channels = matrix.shape[0]
    chosen = tuple(marginals) if marginals is not None else default_marginals(num_channels)
    _check_sizes(num_prompts, num_seeds, group_size, len(chosen), num_channels, success_range)
    rng = np.random.default_rng([_SYNTHETIC_STREAM, seed])
    # Difficulties first, then latents, from one generator: this order is what makes a seed
    # reproduce the same rewards.
    success = rng.uniform(*success_range, size=num_prompts)  # [P]
    threshold = -ndtri(success)  # [P]; t = Φ⁻¹(1 − π) = −Φ⁻¹(π), so P(x > t) = π
    latent = sample_latent(matrix, (num_prompts, num_seeds, group_size), rng)  # [P, S, m, R]
    channels = [
        MARGINALS.get(marginal.kind)(latent[..., channel], marginal, threshold)
        for channel, marginal in enumerate(chosen)
    ]
    return SyntheticRewards(
        rewards=np.stack(channels, axis=-1),
        latent=latent,
        success_probability=success,
        correlation=matrix,
        marginals=chosen,
    )


def _check_sizes(
    num_prompts: int,
    num_seeds: int,
    group_size: int,
    num_marginals: int,
    num_channels: int,
    success_range: tuple[float, float],
) -> None:
    for name, value, minimum in (
        ("num_prompts", num_prompts, 1),
        ("num_seeds", num_seeds, 2),  # a variance over seeds needs two
        ("group_size", group_size, 2),  # so does a within-group std
    ):
        if not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if num_marginals != num_channels:
        raise ValueError(
            f"got {num_marginals} channel marginals for a {num_channels}x{num_channels} "
            "correlation matrix; give one marginal per channel"
        )
    low, high = success_range
    # π = 0 or 1 gives an infinite threshold and a constant channel.
    if not 0.0 < low <= high < 1.0:
        raise ValueError(
            f"success_range must satisfy 0 < low <= high < 1, got {success_range!r}; "
            "e.g. (0.1, 0.9)"
        )
