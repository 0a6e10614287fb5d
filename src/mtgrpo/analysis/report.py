"""Readable summaries of an :class:`~mtgrpo.analysis.theorem3.AnalysisResult` (rich tables).

:func:`print_summary` writes the tables to a terminal; :func:`summary_text` renders the same
tables to plain text (for logs and tests), so there is one layout, not two.
"""

from __future__ import annotations

import io

import numpy as np
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from mtgrpo.analysis.theorem3 import AnalysisResult, EstimatorSummary

__all__ = ["print_summary", "summary_renderable", "summary_text"]

_MSE_NOTE = (
    "NA follows the law (ratio ≈ 1); AN's standardised advantages give ≈ 1/m whatever w and Ĉ. "
    "'pooled Ĉ': one Ĉ averaged over all prompts."
)
_INFLUENCE_NOTE = (
    "NA's influence is Ĉw (weight-proportional for uncorrelated channels); AN's grows with "
    "w_l · std_l, so the highest-variance channel dominates."
)


def _number(value: float, digits: int = 4) -> str:
    return "n/a" if not np.isfinite(value) else f"{value:.{digits}g}"


def _quantiles(values: tuple[float, float, float]) -> str:
    return " / ".join("n/a" if not np.isfinite(v) else f"{v:.2f}" for v in values)


def _header(result: AnalysisResult) -> Text:
    s = result.summary
    weights = ", ".join(f"{name}={w:g}" for name, w in zip(result.channels, result.weights,
                                                          strict=True))
    return Text.assemble(
        ("Gradient-noise check (Theorem 3)", "bold"),
        f"\n{result.num_prompts} prompts × {result.num_seeds} seeds × m = {result.group_size}"
        f" completions, {result.num_channels} channels; weights {weights}"
        f"\ngroups without contrast (zero gradient): {100 * s.zero_gradient_rate:.1f} %",
    )


def _mse_table(result: AnalysisResult) -> Table:
    s = result.summary
    table = Table(
        title="Gradient MSE: realised Var_s(ĝ) vs predicted (τ²/m)·wᵀĈ_p w",
        title_justify="left",
    )
    table.add_column("estimator")
    table.add_column("realised\nMSE", justify="right")
    table.add_column("predicted\nMSE", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("per-prompt ratio\np10 / p50 / p90", justify="right")

    def add(label: str, estimator: EstimatorSummary, quantiles: tuple[float, float, float]) -> None:
        table.add_row(
            label,
            _number(estimator.realised_mse),
            _number(s.predicted_mse),
            _number(estimator.ratio, 3),
            _quantiles(quantiles),
        )

    add("NA", s.na, s.na.ratio_quantiles)
    # Same predicted MSE: the pooled Ĉ's prediction has the mean of the per-prompt ones (a
    # linear map, theorem3); only the per-prompt quantiles differ.
    add("NA, pooled Ĉ", s.na, s.pooled_ratio_quantiles)
    add("AN", s.an, s.an.ratio_quantiles)
    return table


def _influence_table(result: AnalysisResult) -> Table:
    s = result.summary
    table = Table(
        title="Per-channel influence Cov(A_j, z_jl) (share of total)",
        title_justify="left",
    )
    for name in ("channel", "weight", "within-group std", "NA influence", "AN influence"):
        table.add_column(name, justify="left" if name == "channel" else "right")
    std = result.channel_std.mean(axis=0)  # [R]; the scale AN's influence follows
    for index, channel in enumerate(result.channels):
        table.add_row(
            channel,
            f"{result.weights[index]:g} ({_number(s.weight_share[index], 2)})",
            _number(std[index], 3),
            f"{_number(s.na.influence[index], 3)} ({_number(s.na.influence_share[index], 2)})",
            f"{_number(s.an.influence[index], 3)} ({_number(s.an.influence_share[index], 2)})",
        )
    return table


def _correlation_table(result: AnalysisResult) -> Table:
    table = Table(title="Pooled within-group correlation Ĉ", title_justify="left")
    table.add_column("")
    for channel in result.channels:
        table.add_column(channel, justify="right")
    for channel, row in zip(result.channels, result.c_pooled, strict=True):
        table.add_row(channel, *(f"{value:+.3f}" for value in row))
    return table


def summary_renderable(result: AnalysisResult) -> Group:
    """The header and the three tables as one rich renderable."""
    return Group(
        _header(result),
        _mse_table(result),
        Text(_MSE_NOTE, style="dim"),
        _influence_table(result),
        Text(_INFLUENCE_NOTE, style="dim"),
        _correlation_table(result),
    )


def print_summary(result: AnalysisResult, console: Console | None = None) -> None:
    """Print the summary tables to ``console`` (default: a new stdout console)."""
    (console or Console()).print(summary_renderable(result))


def summary_text(result: AnalysisResult, width: int = 110) -> str:
    """The summary tables as plain text, ``width`` columns wide."""
    buffer = io.StringIO()
    # No colour, no terminal codes: the text goes to logs and test assertions.
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False)
    console.print(summary_renderable(result))
    return buffer.getvalue()
