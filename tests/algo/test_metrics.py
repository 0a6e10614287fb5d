"""mtgrpo.algo.metrics: each decision and metric, checked against hand-derived values and a loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mtgrpo import evaluation
from mtgrpo.algo import metrics
from mtgrpo.algo.advantages import compute_advantages
from mtgrpo.algo.metrics import (
    delta_m,
    lacks_contrast,
    logprob_mismatch,
    scalar_rewards,
    steps_to_threshold,
    task_accuracy,
    worst_and_average,
)
from mtgrpo.algo.weighting import TaskStats
from mtgrpo.reporting import compare

NAN = math.nan


def test_task_accuracy_is_the_fraction_correct_per_task_and_nan_when_absent():
    tasks = np.array([0, 0, 0, 2, 2])
    correct = np.array([True, False, True, False, False])
    assert np.array_equal(task_accuracy(tasks, correct, 3), [2 / 3, NAN, 0.0], equal_nan=True)


@pytest.mark.parametrize("seed", range(10))
def test_task_accuracy_matches_a_loop_and_is_the_weighting_signal(seed):
    rng = np.random.default_rng(seed)
    k, n = int(rng.integers(1, 6)), int(rng.integers(0, 40))
    tasks, correct = rng.integers(0, k, n), rng.random(n) < 0.4
    expected = [np.mean(correct[tasks == t]) if (tasks == t).any() else NAN for t in range(k)]
    got = task_accuracy(tasks, correct, k)
    assert np.array_equal(got, expected, equal_nan=True)  # one division of the same integers
    assert np.array_equal(TaskStats.from_rollouts(tasks, correct, k).accuracy, got,
                          equal_nan=True)


def test_worst_and_average_need_every_task():
    worst, average, index = worst_and_average(np.array([0.5, 0.2, 0.8]))
    assert (float(worst), float(average), int(index)) == (0.2, 1.5 / 3, 1)
    worst, average, index = worst_and_average(np.array([0.5, NAN, 0.8]))  # a task unmeasured
    assert math.isnan(worst)
    assert math.isnan(average)
    assert int(index) == -1
    _, _, tie = worst_and_average(np.array([0.3, 0.3]))
    assert int(tie) == 0  # the first on a tie
    worst, average, index = worst_and_average(np.zeros(0))
    assert math.isnan(worst)
    assert int(index) == -1


@pytest.mark.parametrize("seed", range(10))
def test_worst_and_average_of_a_curve_match_a_loop(seed):
    rng = np.random.default_rng(seed)
    per_task = np.where(rng.random((12, 4)) < 0.2, NAN, rng.random((12, 4)))  # [T, K]
    worst, average, index = worst_and_average(per_task)
    for t, row in enumerate(per_task):
        if np.isnan(row).any():
            assert math.isnan(worst[t])
            assert math.isnan(average[t])
            assert index[t] == -1
        else:
            assert worst[t] == min(row)
            assert average[t] == np.mean(row)  # numpy's mean is the same sum / K
            assert index[t] == list(row).index(min(row))


def test_delta_m_skips_zero_baselines_and_names_missing_tasks():
    change = delta_m({"a": 0.5, "b": 0.41, "c": 0.3}, {"a": 0.25, "b": 0.0, "c": 0.2, "d": 0.4})
    # ((0.5 - 0.25) / 0.25 + (0.3 - 0.2) / 0.2) / 2 * 100 = (100 + 50) / 2
    assert change.value == pytest.approx(75.0, rel=4 * np.finfo(np.float64).eps)
    assert (change.tasks, change.skipped_zero_baseline, change.missing) == (("a", "c"), ("b",),
                                                                            ("d",))
    assert delta_m({"a": 0.3}, {"a": 0.0}).value is None


def test_steps_to_threshold_is_the_first_defined_step_reaching_it():
    steps, worst = np.array([0, 10, 20, 30]), np.array([0.1, NAN, 0.45, 0.5])
    assert steps_to_threshold(steps, worst, 0.4) == 20
    assert steps_to_threshold(steps, worst, 0.6) is None


def test_scalar_rewards_sum_the_applicable_channels_and_nan_when_none_applies():
    rewards = np.array([[1.0, NAN], [0.5, 2.0], [NAN, NAN]])
    assert np.array_equal(scalar_rewards(rewards, np.array([1.0, 0.5])), [1.0, 1.5, NAN],
                          equal_nan=True)
    result = compute_advantages(rewards, 1, reward_weights=[1.0, 0.5],
                                on_unscorable="zero_advantage")
    assert np.array_equal(result.scalar_rewards, [1.0, 1.5, NAN], equal_nan=True)


def test_the_contrast_tolerance_is_relative_and_works_on_tensors_and_arrays():
    # 1e-5 apart: no contrast at scale 100 (1e-7 + 1e-6 * 100 = 1e-4) but contrast at scale 1.
    assert lacks_contrast(np.float64(1e-5), np.float64(100.0))
    assert not lacks_contrast(np.float64(1e-5), np.float64(1.0))
    assert lacks_contrast(torch.tensor([1e-5, 1e-5]), torch.tensor([100.0, 1.0])).tolist() == \
        [True, False]


@pytest.mark.parametrize("seed", range(20))
def test_the_estimators_zero_gradient_verdict_matches_a_loop_of_the_rule(seed):
    """sum_then_normalize, neutral None handling: a group has zero gradient when the weighted
    sums of its completions (a None replaced by its channel's mean over the group) are constant
    within the tolerance."""
    rng = np.random.default_rng(seed)
    g, r = int(rng.integers(1, 6)), int(rng.integers(1, 4))
    rewards = rng.choice([0.0, 0.5, 1.0, NAN], size=(3 * g, r))
    rewards[np.isnan(rewards).all(axis=1), 0] = 1.0
    weights = rng.choice([0.5, 1.0, 2.0], size=r)
    verdict = compute_advantages(rewards, g, reward_weights=weights).zero_gradient.tolist()
    for b in range(3):
        group = rewards[b * g:(b + 1) * g]
        means = [np.nanmean(c) if not np.isnan(c).all() else 0.0 for c in group.T]
        sums = [sum(w * (m if math.isnan(v) else v) for v, w, m in zip(row, weights, means,
                                                                       strict=True))
                for row in group]
        centred = max(abs(s - np.mean(sums)) for s in sums)
        assert verdict[b] == bool(centred <= 1e-7 + 1e-6 * max(abs(s) for s in sums))


def test_each_metric_has_one_definition():
    assert compare.delta_m is metrics.delta_m
    assert compare.DeltaM is metrics.DeltaM
    assert not hasattr(evaluation, "delta_m")


def test_logprob_mismatch_by_hand():
    generation = np.array([-1.0, -2.0, -0.5])
    trainer = np.array([-1.0, -1.5, -0.7])  # δ = trainer - generation = [0, 0.5, -0.2]
    out = logprob_mismatch(generation, trainer)
    k3 = (0.0 + (math.exp(0.5) - 1 - 0.5) + (math.exp(-0.2) - 1 + 0.2)) / 3
    # float64 throughout: a few roundings of values below 2
    assert out == pytest.approx({"generation/logprob_mismatch_mean": 0.7 / 3,
                                 "generation/logprob_mismatch_max": 0.5,
                                 "generation/kl_k3": k3}, rel=0, abs=8 * np.finfo(float).eps)
    same = logprob_mismatch(generation, generation)
    assert same == {"generation/logprob_mismatch_mean": 0.0,
                    "generation/logprob_mismatch_max": 0.0, "generation/kl_k3": 0.0}
    assert logprob_mismatch(np.zeros(0), np.zeros(0)) == {}
    with pytest.raises(ValueError, match=r"two \[M\] arrays of the same tokens"):
        logprob_mismatch(generation, trainer[:2])
