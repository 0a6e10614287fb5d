"""Tests of the money plot and the summary tables."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from mtgrpo.analysis import (
    analyze,
    correlation_matrix,
    print_summary,
    save_money_plot,
    summary_text,
    synthetic_rewards,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def result():
    data = synthetic_rewards(correlation_matrix(0.5), num_prompts=12, num_seeds=60, seed=0)
    return analyze(data.rewards, [1.0, 1.0, 0.5], channels=["correct", "quality", "length"])


def test_money_plot_is_a_non_empty_png(tmp_path: Path, result):
    path = save_money_plot(result, tmp_path / "nested" / "money.png")
    content = path.read_bytes()
    assert content.startswith(PNG_SIGNATURE)
    assert len(content) > 20_000


def test_money_plot_skips_prompts_it_cannot_place_on_log_axes(tmp_path: Path):
    data = synthetic_rewards(correlation_matrix(0.5), num_prompts=3, num_seeds=10, seed=1)
    rewards = data.rewards.copy()
    rewards[0] = 0.0  # prompt 0 has zero predicted and realised MSE
    path = save_money_plot(analyze(rewards, [1.0, 1.0, 0.5]), tmp_path / "m.png")
    assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_summary_text_shows_the_numbers(result):
    text = summary_text(result)
    s = result.summary
    assert "12 prompts × 60 seeds × m = 8" in text
    assert f"{s.na.ratio:.3g}" in text
    assert f"{s.an.ratio:.3g}" in text
    for channel in ("correct", "quality", "length"):
        assert channel in text
    assert "Pooled within-group correlation" in text
    assert f"{result.c_pooled[0, 1]:+.3f}" in text


def test_print_summary_writes_to_the_given_console(result):
    buffer = io.StringIO()
    print_summary(result, Console(file=buffer, width=120, color_system=None))
    assert buffer.getvalue() == summary_text(result, width=120)
    assert np.isfinite(result.summary.na.ratio)
