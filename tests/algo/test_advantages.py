"""Advantages: hand-derived values, TRL 1.16's numbers, and a plain-loop reference."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
import torch

from mtgrpo.algo.advantages import (
    AGGREGATIONS,
    Gate,
    apply_gates,
    channel_zscores,
    compute_advantages,
    resolve_aggregation,
    resolve_scale_rewards,
)
from tolerance import assert_close_f32

NAN = float("nan")

# Seed 000's multi-task pattern: rows 0-3 a math prompt (only f_math applies), rows 4-7 a code
# prompt (only f_code applies). TRL 1.16's own code gave the expected numbers below.
MATH_CODE = torch.tensor(
    [[1, NAN], [0, NAN], [1, NAN], [1, NAN], [NAN, 0.2], [NAN, 0.9], [NAN, 0.5], [NAN, 0.5]]
)
# One group of four, two functions: (0,1), (0,2), (1,0), (1,1).
TWO_CHANNELS = torch.tensor([[0.0, 1.0], [0.0, 2.0], [1.0, 0.0], [1.0, 1.0]])


def close(actual: torch.Tensor, expected, atol: float) -> None:
    """Equal to hand values given to ``atol``'s decimals (``atol=0``: exactly). Hand values
    that are exact go through ``assert_close_f32`` instead: the float32 estimator rounds a few
    times at the size of the rewards (tests/tolerance.py), and every wrong formula these tests
    tell apart (another std, baseline or fill) is off by more than 1e-2."""
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


# ---------------------------------------------------------------- TRL 1.16's numbers


def test_trl_sum_then_normalize_group_scale():
    result = compute_advantages(MATH_CODE, 4, reward_weights=[1, 1])
    close(result.advantages, [0.50, -1.50, 0.50, 0.50, -1.13, 1.31, -0.09, -0.09], atol=5e-3)


def test_trl_weights_cannot_matter_when_one_function_applies_per_row():
    ones = compute_advantages(MATH_CODE, 4, reward_weights=[1, 1]).advantages
    tens = compute_advantages(MATH_CODE, 4, reward_weights=[1, 10]).advantages
    close(tens, [0.50, -1.50, 0.50, 0.50, -1.13, 1.31, -0.09, -0.09], atol=5e-3)
    # Only δ = 1e-4 in the denominator distinguishes them: (s - mean) / (std + δ) with std 10x.
    close(tens, ones, atol=1e-3)


def test_trl_scale_none_centres_only():
    result = compute_advantages(MATH_CODE, 4, reward_weights=[1, 10], scale_rewards="none")
    # weighted rewards reach 9 (and 0.9 * 10 rounds in float32): 16 ulps of 3.75 is 7e-6
    assert_close_f32(
        result.advantages, [0.25, -0.75, 0.25, 0.25, -3.25, 3.75, -0.25, -0.25], ulps=16
    )


def test_trl_sum_then_normalize_collapses_distinct_combinations():
    # s = [1, 2, 1, 2], mean 1.5, unbiased std sqrt(4 * 0.25 / 3) = 0.5774 -> ±0.866
    result = compute_advantages(TWO_CHANNELS, 4)
    close(result.advantages, [-0.87, 0.87, -0.87, 0.87], atol=5e-3)


def test_trl_normalize_then_sum_is_our_gdpo():
    # TRL 1.16's "normalize_then_sum" re-normalises over the batch: that is GDPO.
    result = compute_advantages(TWO_CHANNELS, 4, aggregation="gdpo")
    close(result.advantages, [-1.13, 0.47, -0.47, 1.13], atol=5e-3)


def test_our_normalize_then_sum_differs_from_trl_on_purpose():
    # Deliberate difference: our normalize_then_sum is MO-GRPO without the batch step, so each
    # channel's influence stays proportional to its weight (the gradient-noise law holds).
    # z0 = [-1,-1,1,1]*0.866, z1 = [0, 1.2247, -1.2247, 0]; A = z0 + z1.
    result = compute_advantages(TWO_CHANNELS, 4, aggregation="normalize_then_sum")
    close(result.advantages, [-0.866, 0.359, -0.359, 0.866], atol=1e-3)
    trl = compute_advantages(TWO_CHANNELS, 4, aggregation="gdpo").advantages
    assert not torch.allclose(result.advantages, trl, atol=1e-2)


# ---------------------------------------------------------------- hand-derived values


def test_batch_scale_divides_by_batch_std():
    r = torch.tensor([[0.0], [2.0], [1.0], [5.0]])
    # groups of 2: centred [-1, 1, -2, 2]; batch std of [0,2,1,5] (ddof 1) = sqrt(14.75/3)
    std = math.sqrt(((0 - 2) ** 2 + 0**2 + (1 - 2) ** 2 + (5 - 2) ** 2) / 3)
    result = compute_advantages(r, 2, scale_rewards="batch", eps=0.0)
    assert_close_f32(result.advantages, [-1 / std, 1 / std, -2 / std, 2 / std], ulps=8)


def test_population_std_and_eps():
    r = torch.tensor([[0.0], [1.0]])
    # ddof 0: std 0.5 -> ±0.5 / (0.5 + 1e-8); ddof 1: std 0.7071
    # eps = 1e-8 changes ±1 by 2e-8, within a rounding
    assert_close_f32(compute_advantages(r, 2, ddof=0, eps=1e-8).advantages, [-1.0, 1.0], ulps=8)
    close(compute_advantages(r, 2, ddof=1, eps=0.0).advantages, [-0.7071, 0.7071], atol=1e-4)


def test_scale_rewards_bool_aliases():
    assert resolve_scale_rewards(True) == "group"
    assert resolve_scale_rewards(False) == "none"
    assert resolve_scale_rewards("Batch") == "batch"
    with pytest.raises(ValueError, match="scale_rewards='std' is not valid"):
        resolve_scale_rewards("std")


def test_none_handling_neutral_vs_zero_sum_then_normalize():
    # Channel 1 is None for row 2. Rows: (1, 1), (0, 0), (1, None).
    r = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, NAN]])
    # neutral: fill with channel-1 mean over applicable rows (0.5): s = [2, 0, 1.5]
    neutral = compute_advantages(r, 3, scale_rewards="none", none_handling="neutral")
    mean = (2 + 0 + 1.5) / 3
    assert_close_f32(neutral.advantages, [2 - mean, 0 - mean, 1.5 - mean], ulps=8)
    # zero (TRL's nansum): s = [2, 0, 1]
    zero = compute_advantages(r, 3, scale_rewards="none", none_handling="zero")
    assert_close_f32(zero.advantages, [1.0, -1.0, 0.0], ulps=8)


def test_none_handling_neutral_vs_zero_normalize_then_sum():
    r = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, NAN]])
    # neutral: z1 over rows 0,1 only -> centred [0.5, -0.5, (0)]; channel 0 centred [1/3,-2/3,1/3]
    neutral = compute_advantages(
        r, 3, aggregation="na", scale_rewards="none", none_handling="neutral"
    )
    assert_close_f32(neutral.advantages, [1 / 3 + 0.5, -2 / 3 - 0.5, 1 / 3], ulps=8)
    # zero: channel 1 = [1, 0, 0] -> centred [2/3, -1/3, -1/3]
    zero = compute_advantages(r, 3, aggregation="na", scale_rewards="none", none_handling="zero")
    assert_close_f32(zero.advantages, [1 / 3 + 2 / 3, -2 / 3 - 1 / 3, 1 / 3 - 1 / 3], ulps=8)


def test_single_uses_channel_zero_only():
    r = torch.tensor([[1.0, 100.0], [0.0, -50.0], [1.0, 3.0], [1.0, 7.0]])
    single = compute_advantages(r, 4, aggregation="single").advantages
    alone = compute_advantages(r[:, :1], 4).advantages
    close(single, alone, atol=0)


def test_unscorable_rows_raise_by_default_and_name_the_fix():
    r = torch.tensor([[1.0, NAN], [NAN, NAN], [0.0, NAN], [1.0, NAN]])
    expected = r"1 completion\(s\) have no applicable reward.*rows \[1\]"
    with pytest.raises(ValueError, match=expected):
        compute_advantages(r, 4)


def test_unscorable_rows_zero_advantage_and_left_out_of_the_baseline():
    r = torch.tensor([[1.0, NAN], [NAN, NAN], [0.0, NAN], [1.0, NAN]])
    result = compute_advantages(r, 4, on_unscorable="zero_advantage", scale_rewards="none")
    # baseline over rows 0, 2, 3 only: mean 2/3
    assert_close_f32(result.advantages, [1 / 3, 0.0, -2 / 3, 1 / 3], ulps=8)
    assert result.unscorable.tolist() == [False, True, False, False]
    assert math.isnan(result.scalar_rewards[1].item())


def test_zero_gradient_mask_per_group():
    r = torch.tensor([[0.1], [0.1], [0.1], [1.0], [0.0], [1.0], [0.3], [0.3], [0.3]])
    for name in AGGREGATIONS:
        result = compute_advantages(r, 3, aggregation=name)
        assert result.zero_gradient.tolist() == [True, False, True], name
    close(compute_advantages(r, 3).advantages[:3], [0.0, 0.0, 0.0], atol=0)


def test_zero_gradient_needs_every_channel_constant():
    r = torch.tensor([[1.0, 0.0], [1.0, 1.0], [2.0, 5.0], [2.0, 5.0]])
    result = compute_advantages(r, 2, aggregation="na")
    assert result.zero_gradient.tolist() == [False, True]


# ---------------------------------------------------------------- gates


def test_gate_zero_fill():
    # channel 1 counts only where channel 0 == 1
    r = torch.tensor([[1.0, 0.8], [0.0, 0.9], [1.0, 0.2], [NAN, 0.5]])
    gated = apply_gates(r, [Gate(channel=1, on=0, mode="zero_fill")], 4)
    close(gated[:, 1], [0.8, 0.0, 0.2, 0.0], atol=0)
    close(gated[:3, 0], [1.0, 0.0, 1.0], atol=0)


def test_gate_subgroup_centres_over_passing_rows():
    r = torch.tensor([[1.0, 0.8], [0.0, 0.9], [1.0, 0.2], [1.0, 0.5]])
    gated = apply_gates(r, [Gate(channel=1, on=0, mode="subgroup")], 4)
    # passing rows 0, 2, 3: mean 0.5 -> [0.3, 0, -0.3, 0]
    assert_close_f32(gated[:, 1], [0.3, 0.0, -0.3, 0.0], ulps=8)


def test_gate_subgroup_with_fewer_than_two_passing_rows_zeroes_the_channel():
    r = torch.tensor([[1.0, 0.8], [0.0, 0.9], [0.0, 0.2], [0.0, 0.5]])
    gated = apply_gates(r, [Gate(channel=1, on=0, mode="subgroup")], 4)
    close(gated[:, 1], [0.0, 0.0, 0.0, 0.0], atol=0)


def test_gates_apply_before_the_ordering():
    r = torch.tensor([[1.0, 0.8], [0.0, 0.9], [1.0, 0.2], [1.0, 0.5]])
    gate = Gate(channel=1, on=0, mode="zero_fill")
    via_gate = compute_advantages(r, 4, gates=[gate], aggregation="na").advantages
    manual = compute_advantages(apply_gates(r, [gate], 4), 4, aggregation="na").advantages
    close(via_gate, manual, atol=0)


def test_gate_validation():
    with pytest.raises(ValueError, match="gate mode 'mask' is not one of"):
        Gate(channel=1, on=0, mode="mask")
    with pytest.raises(ValueError, match="cannot gate itself"):
        Gate(channel=1, on=1)
    with pytest.raises(ValueError, match="refers to channel 5, but there are 2"):
        apply_gates(torch.zeros(4, 2), [Gate(channel=5, on=0)], 4)


# ---------------------------------------------------------------- names and errors


def test_aggregation_aliases():
    assert resolve_aggregation("an") == "sum_then_normalize"
    assert resolve_aggregation("NA") == "normalize_then_sum"
    assert resolve_aggregation("mo_grpo") == "normalize_then_sum"
    assert resolve_aggregation(reward_aggregation_method="sum_then_normalize") == (
        "sum_then_normalize"
    )
    assert resolve_aggregation(multi_objective_aggregation="gdpo") == "gdpo"
    assert resolve_aggregation() == "sum_then_normalize"
    a = compute_advantages(TWO_CHANNELS, 4, reward_aggregation_method="na").advantages
    b = compute_advantages(TWO_CHANNELS, 4, aggregation="normalize_then_sum").advantages
    close(a, b, atol=0)


def test_conflicting_and_unknown_aggregation_names():
    with pytest.raises(ValueError, match="conflicting reward aggregation settings"):
        resolve_aggregation("an", multi_objective_aggregation="gdpo")
    with pytest.raises(ValueError, match="unknown reward aggregation 'mean'; valid names: gdpo"):
        compute_advantages(TWO_CHANNELS, 4, aggregation="mean")


def test_input_validation():
    with pytest.raises(ValueError, match=r"shape \[N, R\]"):
        compute_advantages(torch.zeros(8), 4)
    with pytest.raises(ValueError, match="positive divisor of the number of rows"):
        compute_advantages(torch.zeros(6, 1), 4)
    with pytest.raises(ValueError, match="reward_weights has 3 values but the rewards have 2"):
        compute_advantages(torch.zeros(4, 2), 4, reward_weights=[1, 1, 1])
    with pytest.raises(ValueError, match=r"±inf \(first at row 2\)"):
        compute_advantages(torch.tensor([[0.0], [1.0], [math.inf], [0.0]]), 4)
    with pytest.raises(ValueError, match="none_handling='skip' is not valid"):
        compute_advantages(torch.zeros(4, 1), 4, none_handling="skip")
    with pytest.raises(ValueError, match="on_unscorable='ignore' is not valid"):
        compute_advantages(torch.zeros(4, 1), 4, on_unscorable="ignore")
    with pytest.raises(ValueError, match="ddof=2"):
        compute_advantages(torch.zeros(4, 1), 4, ddof=2)


def test_accepts_numpy_and_integer_rewards():
    """numpy in, numpy out (integers computed as float32); a tensor in gives tensors."""
    result = compute_advantages(np.array([[1], [0], [1], [1]]), 4)
    assert all(isinstance(v, np.ndarray) for v in (result.advantages, result.zero_gradient,
                                                   result.unscorable, result.scalar_rewards))
    assert result.advantages.dtype == np.float32
    close(torch.from_numpy(result.advantages), [0.4999, -1.4997, 0.4999, 0.4999], atol=1e-4)
    from_tensor = compute_advantages(torch.tensor([[1.0], [0.0], [1.0], [1.0]],
                                                  dtype=torch.float64), 4)
    assert from_tensor.advantages.dtype == torch.float64
    assert from_tensor.zero_gradient.dtype == torch.bool
    np.testing.assert_allclose(from_tensor.advantages.numpy(), result.advantages, rtol=1e-6)


def test_channel_zscores_reassemble_normalize_then_sum():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(12, 3, generator=g)
    r[2, 1] = NAN
    w = torch.tensor([1.0, 0.5, 2.0])
    z = channel_zscores(r, 4)
    na = compute_advantages(r, 4, aggregation="na", reward_weights=w).advantages
    # z-scores weighted and summed here or inside the estimator: a few roundings of values ~3
    assert_close_f32((z * w).sum(-1), na, ulps=8)


# ---------------------------------------------------------------- loop reference


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _std(xs: list[float], ddof: int) -> float:
    if len(xs) - ddof <= 0:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - ddof))


def _scaled(values, valid, batch_values, scale, ddof, eps):
    """Centre `values` on the mean of the valid ones and divide by the chosen std."""
    m = _mean([v for v, ok in zip(values, valid, strict=True) if ok])
    out = [v - m for v in values]
    if scale == "group":
        d = _std([v for v, ok in zip(values, valid, strict=True) if ok], ddof) + eps
        out = [o / d for o in out]
    elif scale == "batch":
        d = _std(batch_values, ddof) + eps
        out = [o / d for o in out]
    return out


def _reference(rows, g, w, aggregation, scale, none_handling, ddof, eps):
    """Plain-Python advantages, one group and one channel at a time."""
    n, r = len(rows), len(rows[0])
    groups = [rows[i : i + g] for i in range(0, n, g)]
    scorable = [[not all(math.isnan(x) for x in row) for row in grp] for grp in groups]
    if aggregation == "sum_then_normalize":
        sums = []
        for grp in groups:
            fills = [_mean([row[c] for row in grp if not math.isnan(row[c])]) for c in range(r)]
            if none_handling == "zero":
                fills = [0.0] * r
            sums.append([
                sum(w[c] * (fills[c] if math.isnan(row[c]) else row[c]) for c in range(r))
                for row in grp
            ])
        batch = [s for grp, ok in zip(sums, scorable, strict=True)
                 for s, k in zip(grp, ok, strict=True) if k]
        out = []
        for s, ok in zip(sums, scorable, strict=True):
            a = _scaled(s, ok, batch, scale, ddof, eps)
            out += [x if k else 0.0 for x, k in zip(a, ok, strict=True)]
        return out
    # normalize_then_sum and gdpo: one channel at a time
    adv = [[0.0] * g for _ in groups]
    for c in range(r):
        cols, valids = [], []
        for grp, ok in zip(groups, scorable, strict=True):
            if none_handling == "neutral":
                valid = [not math.isnan(row[c]) for row in grp]
                col = [row[c] for row in grp]
            else:
                valid = list(ok)
                col = [0.0 if math.isnan(row[c]) else row[c] for row in grp]
            cols.append(col)
            valids.append(valid)
        batch = [v for col, val in zip(cols, valids, strict=True)
                 for v, k in zip(col, val, strict=True) if k]
        for b, (col, val) in enumerate(zip(cols, valids, strict=True)):
            z = _scaled(col, val, batch, scale, ddof, eps)
            for j in range(g):
                if val[j]:
                    adv[b][j] += w[c] * z[j]
    flat = [a if k else 0.0 for grp, ok in zip(adv, scorable, strict=True)
            for a, k in zip(grp, ok, strict=True)]
    if aggregation == "gdpo":
        mask = [k for ok in scorable for k in ok]
        kept = [a for a, k in zip(flat, mask, strict=True) if k]
        m, d = _mean(kept), _std(kept, ddof) + eps
        flat = [(a - m) / d if k else 0.0 for a, k in zip(flat, mask, strict=True)]
    return flat


def _random_rewards(rng: random.Random, b: int, g: int, r: int) -> list[list[float]]:
    rows = []
    for _ in range(b * g):
        row = [rng.choice([0.0, 0.1, 1.0, rng.uniform(-2, 3)]) for _ in range(r)]
        for c in range(r):
            if rng.random() < 0.25:
                row[c] = NAN
        rows.append(row)
    return rows


@pytest.mark.parametrize(
    ("aggregation", "scale", "none_handling", "ddof"),
    list(itertools.product(
        ["sum_then_normalize", "normalize_then_sum", "gdpo"],
        ["group", "batch", "none"],
        ["neutral", "zero"],
        [0, 1],
    )),
)
def test_vectorised_matches_loop_reference(aggregation, scale, none_handling, ddof):
    rng = random.Random(hash((aggregation, scale, none_handling, ddof)) % 10_000)
    for trial in range(6):
        b, g, r = rng.randint(1, 5), rng.randint(1, 6), rng.randint(1, 4)
        rows = _random_rewards(rng, b, g, r)
        w = [rng.uniform(-1, 2) for _ in range(r)]
        eps = 1e-4 if trial % 2 else 1e-8
        expected = _reference(rows, g, w, aggregation, scale, none_handling, ddof, eps)
        result = compute_advantages(
            torch.tensor(rows, dtype=torch.float64), g, reward_weights=w,
            aggregation=aggregation, scale_rewards=scale, none_handling=none_handling,
            on_unscorable="zero_advantage", ddof=ddof, eps=eps,
        )
        torch.testing.assert_close(
            result.advantages, torch.tensor(expected, dtype=torch.float64), atol=1e-9, rtol=1e-9
        )
