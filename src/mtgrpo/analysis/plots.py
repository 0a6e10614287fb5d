"""Figures of the gradient-noise analysis (matplotlib, imported only when a plot is drawn).

The "money plot" has two panels:

1. realised vs predicted gradient MSE per prompt, NA and AN, on log-log axes with the
   line ``y = x``: NA's points lie on it (Theorem 3), AN's sit near ``1/m`` regardless;
2. per-channel influence as a share of the total, next to the weight share: NA follows
   the weights, AN leans to the highest-variance channel.

The figures are drawn on ``matplotlib.figure.Figure`` with the Agg canvas directly, not
through ``pyplot``, so plotting never touches a global backend or opens a window.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mtgrpo.analysis.theorem3 import DEFAULT_BAND, AnalysisResult

if TYPE_CHECKING:  # annotations only: importing this module never loads matplotlib
    from matplotlib.axes import Axes

__all__ = ["plot_influence", "plot_mse", "save_money_plot"]

_NA_COLOUR = "#1f77b4"
_AN_COLOUR = "#ff7f0e"
_WEIGHT_COLOUR = "#7f7f7f"


def plot_mse(ax: Axes, result: AnalysisResult, band: tuple[float, float] = DEFAULT_BAND) -> None:
    """Scatter realised against predicted MSE per prompt (log-log) with ``y = x`` and the band."""
    predicted = result.predicted  # [P]
    s = result.summary
    series = (
        ("NA", result.realised_na, _NA_COLOUR, "o", s.na.ratio),
        ("AN", result.realised_an, _AN_COLOUR, "s", s.an.ratio),
    )
    shown: list[np.ndarray] = []
    for name, realised, colour, marker, ratio in series:
        positive = (predicted > 0) & (realised > 0)  # log axes cannot show zeros
        ax.scatter(predicted[positive], realised[positive], s=22, alpha=0.75, c=colour,
                   marker=marker, label=f"{name}: realised / predicted = {ratio:.3f}")
        shown.extend((predicted[positive], realised[positive]))
    values = np.concatenate(shown)
    low, high = values.min() / 1.5, values.max() * 1.5  # a margin, so no point sits on the frame
    line = np.array([low, high])
    ax.plot(line, line, color="black", linewidth=1, linestyle="--", label="y = x")
    # ALGORITHMS.md §7: NA's realised / predicted is expected within 15 % of 1.
    ax.fill_between(line, band[0] * line, band[1] * line, color=_NA_COLOUR, alpha=0.1,
                    label=f"accepted NA band ×[{band[0]:g}, {band[1]:g}]")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("predicted MSE  (τ²/m)·wᵀĈ_p w")
    ax.set_ylabel("realised MSE  Var_s(ĝ)")
    ax.set_title(f"Gradient MSE per prompt ({result.num_prompts} prompts, "
                 f"{result.num_seeds} seeds, m = {result.group_size})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)


def plot_influence(ax: Axes, result: AnalysisResult) -> None:
    """Grouped bars per channel: weight share, NA influence share, AN influence share."""
    s = result.summary
    positions = np.arange(result.num_channels)
    width = 0.27  # three bars fill 0.81 of each channel's unit slot
    bars = (
        ("weight share", s.weight_share, _WEIGHT_COLOUR),
        ("NA influence share", s.na.influence_share, _NA_COLOUR),
        ("AN influence share", s.an.influence_share, _AN_COLOUR),
    )
    for offset, (label, values, colour) in zip((-1, 0, 1), bars, strict=True):
        ax.bar(positions + offset * width, values, width, label=label, color=colour)
    std = result.channel_std.mean(axis=0)  # [R]; AN's influence follows w_l σ_l: show σ_l
    ax.set_xticks(positions)
    ax.set_xticklabels([f"{name}\n(std {value:.2g})" for name, value in
                        zip(result.channels, std, strict=True)])
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_ylabel("share of total influence Cov(A_j, z_jl)")
    ax.set_title("Per-channel influence: NA follows the weights, AN the variance")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=9)


def save_money_plot(
    result: AnalysisResult,
    path: str | Path,
    *,
    band: tuple[float, float] = DEFAULT_BAND,
    dpi: int = 120,
) -> Path:
    """Draw both panels side by side and save them as a PNG at ``path``; returns the path."""
    # Imported here, so the analysis without plots needs no matplotlib.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 5.5), layout="constrained")
    FigureCanvasAgg(figure)  # the Agg canvas directly: no pyplot, no global backend, no window
    mse_axes, influence_axes = figure.subplots(1, 2, width_ratios=(1.15, 1))
    plot_mse(mse_axes, result, band)
    plot_influence(influence_axes, result)
    figure.suptitle("Theorem-3 check: normalise-then-aggregate (NA) vs aggregate-then-normalise "
                    "(AN)", fontweight="bold")
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(file, dpi=dpi, format="png")
    return file
