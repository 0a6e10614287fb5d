"""The float32 tolerance rule of tests/tolerance.py: what it allows, and that it still fails."""

from __future__ import annotations

import math

import pytest
import torch

from tolerance import EPS32, assert_close_f32, f32_atol


def test_the_tolerance_grows_with_the_magnitude_and_has_a_floor_of_one() -> None:
    assert EPS32 == 2.0**-23
    assert f32_atol(torch.tensor([5.7, -1.0]), ulps=32) == pytest.approx(32 * EPS32 * 5.7)
    assert f32_atol(torch.tensor([-7.0, 2.0]), ulps=4) == pytest.approx(4 * EPS32 * 7.0)
    # near zero the floor holds: the values were computed from O(1) terms
    assert f32_atol(torch.tensor([1e-3, 0.0]), ulps=8) == pytest.approx(8 * EPS32)
    # padding (NaN, inf) does not set the size
    assert f32_atol(torch.tensor([math.nan, math.inf, 3.0]), ulps=2) == pytest.approx(6 * EPS32)


def test_an_entropy_near_6_passes_at_float32_rounding_and_fails_at_a_real_error() -> None:
    expected = torch.tensor([5.7, 2.0, 0.0])
    # issue 11: an entropy of 5.7 off by 2.4e-6 (5 ulps) on one CPU
    assert_close_f32(expected + torch.tensor([2.4e-6, 0.0, 0.0]), expected, ulps=32)
    with pytest.raises(AssertionError, match=r"32 float32 ulps of max\(1, max \|expected\|\)"):
        assert_close_f32(expected + torch.tensor([1e-3, 0.0, 0.0]), expected, ulps=32)
    with pytest.raises(AssertionError, match=r"^lm_head\.weight: "):
        assert_close_f32(expected + 1e-3, expected, ulps=32, msg="lm_head.weight")


def test_scale_replaces_the_magnitude_and_plain_floats_follow_the_actual_dtype() -> None:
    got = torch.tensor([-0.5, -2.0], dtype=torch.float64)
    # rounded at logits near 60: 8 ulps of 60 is 5.7e-5
    assert_close_f32(got + 3e-5, got, ulps=8, scale=60.0)
    with pytest.raises(AssertionError):
        assert_close_f32(got + 3e-5, got, ulps=8)
    assert_close_f32(torch.tensor([1 / 3], dtype=torch.float32), [1 / 3], ulps=1)
    assert_close_f32(0.1 + 0.2, 0.3, ulps=1)


def test_the_log_records_allowed_and_observed_ulps(tmp_path, monkeypatch) -> None:
    log = tmp_path / "tolerances.tsv"
    monkeypatch.setenv("MTGRPO_TOLERANCE_LOG", str(log))
    assert_close_f32(torch.tensor([4.0]), torch.tensor([4.0]) + 4 * EPS32 * 4, ulps=8)
    test, where, allowed, observed = log.read_text().strip().split("\t")
    assert test.endswith("test_the_log_records_allowed_and_observed_ulps")
    assert where.startswith("test_tolerance.py:")
    assert (allowed, float(observed)) == ("8", pytest.approx(4.0, abs=0.01))
