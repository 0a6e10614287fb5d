"""Gradient-noise ("Theorem 3") analysis of multi-reward advantage estimators.

Rewards ``[P, S, m, R]`` (prompts × seeds × group size × channels) in; realised and
predicted gradient MSE of the NA and AN orderings and per-channel influence out.

- :mod:`~mtgrpo.analysis.theorem3`: :func:`analyze` and its result dataclasses;
- :mod:`~mtgrpo.analysis.synthetic`: a Gaussian-copula reward backend;
- :mod:`~mtgrpo.analysis.rollouts`: the trainer's ``rollouts.jsonl`` and ``.npz`` files;
- :mod:`~mtgrpo.analysis.report`: rich summary tables;
- :mod:`~mtgrpo.analysis.plots`: the money plot (matplotlib, imported lazily).

Example::

    from mtgrpo.analysis import analyze, correlation_matrix, print_summary, synthetic_rewards

    rewards = synthetic_rewards(correlation_matrix(0.5), seed=0).rewards  # [40, 200, 8, 3]
    result = analyze(rewards, weights=[1.0, 1.0, 0.5])
    print_summary(result)
"""

from __future__ import annotations

from mtgrpo.analysis.plots import plot_influence, plot_mse, save_money_plot
from mtgrpo.analysis.report import print_summary, summary_renderable, summary_text
from mtgrpo.analysis.rollouts import (
    ROLLOUT_FORMATS,
    RolloutRewards,
    load_rollouts,
    load_rollouts_jsonl,
    load_rollouts_npz,
    save_rollouts_npz,
)
from mtgrpo.analysis.synthetic import (
    MARGINALS,
    ChannelMarginal,
    SyntheticRewards,
    correlation_matrix,
    default_marginals,
    sample_latent,
    synthetic_rewards,
    validate_correlation,
)
from mtgrpo.analysis.theorem3 import (
    ANALYSIS_DDOF,
    ANALYSIS_EPS,
    DEFAULT_BAND,
    AnalysisResult,
    AnalysisSummary,
    EstimatorSummary,
    analyze,
    gradient_noise,
    in_band,
)

__all__ = [
    "ANALYSIS_DDOF",
    "ANALYSIS_EPS",
    "DEFAULT_BAND",
    "MARGINALS",
    "ROLLOUT_FORMATS",
    "AnalysisResult",
    "AnalysisSummary",
    "ChannelMarginal",
    "EstimatorSummary",
    "RolloutRewards",
    "SyntheticRewards",
    "analyze",
    "correlation_matrix",
    "default_marginals",
    "gradient_noise",
    "in_band",
    "load_rollouts",
    "load_rollouts_jsonl",
    "load_rollouts_npz",
    "plot_influence",
    "plot_mse",
    "print_summary",
    "sample_latent",
    "save_money_plot",
    "save_rollouts_npz",
    "summary_renderable",
    "summary_text",
    "synthetic_rewards",
    "validate_correlation",
]

