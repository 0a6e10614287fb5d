"""Tests for mtgrpo.algo.sampling: filters, prompt pool, iid / dynamic / ratio-preserving
batches."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtgrpo.algo.advantages import compute_advantages
from mtgrpo.algo.sampling import (
    SAMPLERS,
    TARGET_ROUNDINGS,
    ZERO_GRADIENT_FILTERS,
    PromptPool,
    ScoredGroup,
    largest_remainder_counts,
    make_sampler,
)

# Three simulated tasks: easy (10 % zero-gradient groups), medium (50 %), hard (90 %).
ZERO_RATES = (0.1, 0.5, 0.9)


class SimulatedTasks:
    """A seeded stand-in for generation + scoring.

    With probability ``zero_rates[task]`` a group is zero-gradient under every filter (all
    completions fail with reward 0, or all pass with reward 1); otherwise half the completions
    are correct (reward 1) and half wrong (reward 0), which every filter keeps.
    """

    def __init__(self, prompt_tasks, zero_rates=ZERO_RATES, seed=0, group_size=4):
        self.prompt_tasks = np.asarray(prompt_tasks)
        self.zero_rates = np.asarray(zero_rates, dtype=float)
        self.rng = np.random.default_rng(seed)
        self.group_size = group_size
        self.calls: list[list[int]] = []
        self.returned: list[list[ScoredGroup]] = []

    def __call__(self, prompt_ids):
        self.calls.append(list(prompt_ids))
        groups = []
        for prompt_id in prompt_ids:
            task = int(self.prompt_tasks[prompt_id])
            if self.rng.random() < self.zero_rates[task]:
                rewards = np.full((self.group_size, 1), float(self.rng.random() < 0.5))
            else:
                rewards = np.array([[1.0], [0.0]] * (self.group_size // 2))
            constant = bool((rewards == rewards[0]).all())  # the estimator's verdict here
            groups.append(ScoredGroup(prompt_id, task, rewards, rewards[:, 0] >= 1, constant))
        self.returned.append(groups)
        return groups

    def call_tasks(self, call: int) -> np.ndarray:
        return self.prompt_tasks[self.calls[call]]


def prompts(per_task=(400, 400, 400)) -> np.ndarray:
    return np.repeat(np.arange(len(per_task)), per_task)


def group(rewards, correct, prompt_id=0, task=0, aggregation="sum_then_normalize") -> ScoredGroup:
    """A hand-built group whose zero-gradient verdict is the estimator's (mtgrpo.algo.metrics)."""
    values = np.asarray(rewards, dtype=float)
    verdict = compute_advantages(values, len(values), aggregation=aggregation,
                                 on_unscorable="zero_advantage").zero_gradient
    return ScoredGroup(prompt_id, task, values, np.asarray(correct), bool(verdict[0]))


def run_steps(sampler, weights, batch_size, sim, steps):
    """``(groups, report)`` of ``steps`` builds."""
    built = [sampler.build(np.asarray(weights), batch_size, sim) for _ in range(steps)]
    return [(b.groups, b.report) for b in built]


# ---------------------------------------------------------------------------------------------
# Zero-gradient filters
# ---------------------------------------------------------------------------------------------

NAN = math.nan
FILTER_CASES = [
    # (rewards [G, R], correct [G], dropped by lenient, dropped by strict)
    ([[0.5], [0.5], [0.5]], [False] * 3, True, True),  # constant: no contrast at all
    ([[0.1], [0.0], [0.1]], [False] * 3, False, True),  # varies, but none correct
    ([[1.0], [1.2], [1.0]], [True] * 3, False, True),  # varies, but every one correct
    ([[1.0], [0.0], [0.1]], [True, False, False], False, False),  # informative
    ([[1.0, NAN], [1.0, NAN]], [True, True], True, True),  # all-NaN channel is constant
    ([[NAN, 0.0], [1.0, 0.0]], [False, True], True, True),  # one applicable value: constant
    ([[NAN, 0.0], [1.0, 0.0], [0.0, 0.0]], [False, True, False], False, False),  # 1 vs 0 varies
    ([[0.0, 1.0], [0.0, 0.0]], [True, False], False, False),  # second channel varies
    ([[1.0]], [True], True, True),  # a single completion never has contrast
    ([[1.0], [1.0 + 1e-9]], [True, True], True, True),  # below the advantage tolerance
]


@pytest.mark.parametrize(("rewards", "correct", "lenient", "strict"), FILTER_CASES)
def test_filters_on_hand_built_groups(rewards, correct, lenient, strict):
    g = group(rewards, correct)
    assert ZERO_GRADIENT_FILTERS.get("lenient")(g) is lenient
    assert ZERO_GRADIENT_FILTERS.get("strict")(g) is strict
    assert ZERO_GRADIENT_FILTERS.get("none")(g) is False


def test_the_filters_read_the_estimators_verdict_not_the_raw_channels():
    """Two channels that vary but sum to a constant: under sum_then_normalize every advantage is
    0, so the group has no gradient and both filters drop it (a raw-channel test would keep it:
    each channel varies); under normalize_then_sum each channel is normalised on its own, the
    advantages are +-1 and the group is informative."""
    rewards = [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]
    correct = [True, False, True, False]
    summed = group(rewards, correct)
    assert np.abs(compute_advantages(np.asarray(rewards), 4).advantages).max() == 0
    assert ZERO_GRADIENT_FILTERS.get("lenient")(summed) is True
    assert ZERO_GRADIENT_FILTERS.get("strict")(summed) is True
    per_channel = group(rewards, correct, aggregation="normalize_then_sum")
    assert ZERO_GRADIENT_FILTERS.get("lenient")(per_channel) is False
    assert ZERO_GRADIENT_FILTERS.get("strict")(per_channel) is False


def test_a_group_without_a_verdict_is_refused():
    with pytest.raises(TypeError, match="zero_gradient must be True or False"):
        ScoredGroup(0, 0, np.zeros((2, 1)), np.zeros(2, dtype=bool), None)


# ---------------------------------------------------------------------------------------------
# Target counts
# ---------------------------------------------------------------------------------------------


def test_largest_remainder_hand_examples():
    # 7·[0.5, 0.3, 0.2] = [3.5, 2.1, 1.4]: floors [3, 2, 1] leave 1 unit for the largest
    # fraction (0.5, task 0).
    assert largest_remainder_counts(np.array([0.5, 0.3, 0.2]), 7).tolist() == [4, 2, 1]
    # 32/3 = 10.67 each: 2 leftover units, ties go to the lower task index.
    assert largest_remainder_counts(np.full(3, 1 / 3), 32).tolist() == [11, 11, 10]
    # A zero-weight task never receives a leftover unit.
    assert largest_remainder_counts(np.array([0.5, 0.0, 0.5]), 3).tolist() == [2, 0, 1]


def _largest_remainder_loop(weights, total):
    exact = [total * w for w in weights]
    counts = [math.floor(e) for e in exact]
    fractions = [e - c if w > 0 else -1.0 for e, c, w in zip(exact, counts, weights, strict=True)]
    for _ in range(total - sum(counts)):
        best = max(range(len(fractions)), key=lambda k: (fractions[k], -k))
        counts[best] += 1
        fractions[best] = -math.inf
    return counts


@pytest.mark.parametrize("seed", range(30))
def test_largest_remainder_matches_loop_reference(seed):
    rng = np.random.default_rng(seed)
    num_tasks = int(rng.integers(1, 8))
    weights = rng.dirichlet(np.ones(num_tasks)) * (rng.random(num_tasks) < 0.8)
    weights = weights / weights.sum() if weights.sum() > 0 else np.eye(num_tasks)[0]
    total = int(rng.integers(1, 300))
    counts = largest_remainder_counts(weights, total)
    assert counts.tolist() == _largest_remainder_loop(weights.tolist(), total)
    assert counts.sum() == total
    assert np.all(np.abs(counts - total * weights) < 1)
    assert np.all(counts[weights == 0] == 0)


def test_multinomial_targets_sum_to_batch_and_skip_zero_weights():
    rng = np.random.default_rng(0)
    counts = np.array(
        [
            TARGET_ROUNDINGS.get("multinomial")(np.array([0.6, 0.0, 0.4]), 50, rng)
            for _ in range(200)
        ]
    )
    assert np.all(counts.sum(axis=1) == 50)
    assert np.all(counts[:, 1] == 0)


# ---------------------------------------------------------------------------------------------
# Prompt pool
# ---------------------------------------------------------------------------------------------


def test_prompt_pool_epochs_are_seeded_permutations():
    tasks = np.array([0, 1, 0, 1, 0, 0, 1, 0])  # task 0 holds prompts 0, 2, 4, 5, 7
    pool = PromptPool(tasks, 2, seed=3)
    epochs = [pool.draw(0, 5) for _ in range(4)]
    for order in epochs:
        assert sorted(order.tolist()) == [0, 2, 4, 5, 7]
    # Reshuffled every epoch: four identical permutations out of 120 would be a bug.
    assert len({tuple(order.tolist()) for order in epochs}) > 1
    assert pool.epoch(0) == 4
    again = PromptPool(tasks, 2, seed=3)
    assert [again.draw(0, 5).tolist() for _ in range(4)] == [e.tolist() for e in epochs]
    other = PromptPool(tasks, 2, seed=4)
    assert [other.draw(0, 5).tolist() for _ in range(4)] != [e.tolist() for e in epochs]


def test_prompt_pool_wraps_a_tiny_task_across_epochs():
    pool = PromptPool(np.array([0] * 10 + [1, 1]), 2, seed=0)  # task 1: prompts 10 and 11
    drawn = pool.draw(1, 7).tolist()
    # 7 draws from 2 prompts = 3 full epochs (each a permutation of {10, 11}) and one more.
    for epoch in range(3):
        assert sorted(drawn[2 * epoch : 2 * epoch + 2]) == [10, 11]
    assert drawn[6] in (10, 11)
    assert pool.epoch(1) == 3
    assert pool.draw(1, 1).tolist() == [21 - drawn[6]]  # the rest of epoch 3


def test_prompt_pool_refuses_to_draw_from_an_empty_task():
    pool = PromptPool(np.array([0, 0, 2]), 3)
    assert pool.draw(1, 0).tolist() == []
    with pytest.raises(ValueError, match="task 1 has no prompts but 4 were requested"):
        pool.draw(1, 4)


def test_tiny_task_repeats_prompts_within_a_batch():
    tasks = prompts((100, 2))  # task 1 has only prompts 100 and 101
    sampler = make_sampler("iid", tasks, 2, seed=0)
    sim = SimulatedTasks(tasks, zero_rates=(0.0, 0.0))
    built = sampler.build(np.array([0.5, 0.5]), 40, sim)
    groups, report = built.groups, built.report
    tiny = [g.prompt_id for g in groups if g.task == 1]
    assert len(tiny) == report.batch_counts[1] > 2
    # Whole epochs visit both prompts, so their counts differ by at most one.
    counts = [tiny.count(100), tiny.count(101)]
    assert sum(counts) == len(tiny)
    assert abs(counts[0] - counts[1]) <= 1
    assert sampler.pool.epoch(1) == len(tiny) // 2


# ---------------------------------------------------------------------------------------------
# Ratio-preserving composition vs iid and dynamic
# ---------------------------------------------------------------------------------------------

WEIGHTS = np.array([0.2, 0.3, 0.5])  # the hard (90 %) task gets the largest weight
BATCH = 32
STEPS = 150


def test_ratio_preserving_meets_targets_exactly_and_tracks_weights():
    tasks = prompts()
    sampler = make_sampler("ratio_preserving", tasks, 3, seed=1)
    results = run_steps(sampler, WEIGHTS, BATCH, SimulatedTasks(tasks, seed=2), STEPS)
    met = 0
    for groups, report in results:
        assert len(groups) == BATCH == report.target_counts.sum()
        assert (
            report.batch_counts.tolist()
            == np.bincount([g.task for g in groups], minlength=3).tolist()
        )
        if np.all(report.informative_groups >= report.target_counts):
            met += 1
            assert report.batch_counts.tolist() == report.target_counts.tolist()
    # M_os = 3 and N_rs = 10 give ample budget here; nearly every step must meet its target.
    assert met >= 0.95 * STEPS
    # Per step the share of task k is n_k / B with n ~ Multinomial(B, z): standard error
    # sqrt(z_k (1 - z_k) / B) per step, divided by sqrt(STEPS) for the mean; allow 4 of them.
    shares = np.array([r.batch_counts / BATCH for _, r in results]).mean(axis=0)
    tolerance = 4 * np.sqrt(WEIGHTS * (1 - WEIGHTS) / BATCH / STEPS)  # ≈ [0.026, 0.030, 0.032]
    assert np.all(np.abs(shares - WEIGHTS) <= tolerance), (shares, tolerance)


def test_largest_remainder_targets_give_the_same_composition_every_step():
    tasks = prompts()
    sampler = make_sampler(
        "ratio_preserving", tasks, 3, seed=1, target_rounding="largest_remainder"
    )
    expected = largest_remainder_counts(WEIGHTS, BATCH).tolist()  # 32·z = [6.4, 9.6, 16]
    assert expected == [6, 10, 16]
    for _, report in run_steps(sampler, WEIGHTS, BATCH, SimulatedTasks(tasks, seed=2), 20):
        assert report.target_counts.tolist() == expected
        assert report.batch_counts.tolist() == expected


def test_dynamic_and_iid_under_represent_the_hard_task():
    # Informative share of the hard task under i.i.d. tasks from z:
    # 0.5·0.1 / (0.2·0.9 + 0.3·0.5 + 0.5·0.1) = 0.05 / 0.38 ≈ 0.13, far below z = 0.5.
    tasks = prompts()
    dynamic = make_sampler("dynamic", tasks, 3, seed=1)
    results = run_steps(dynamic, WEIGHTS, BATCH, SimulatedTasks(tasks, seed=2), 60)
    share = np.mean([r.batch_counts[2] / r.batch_size for _, r in results])
    assert share < WEIGHTS[2] - 0.25

    iid = make_sampler("iid", tasks, 3, seed=1)
    results = run_steps(iid, WEIGHTS, BATCH, SimulatedTasks(tasks, seed=2), 60)
    # iid returns every group, so its raw composition follows z, but the groups that carry a
    # gradient (the informative ones) under-represent the hard task just as much.
    assert all(len(groups) == BATCH for groups, _ in results)
    informative = np.sum([r.informative_groups for _, r in results], axis=0)
    assert informative[2] / informative.sum() < WEIGHTS[2] - 0.25


def test_acceptance_aware_sampling_needs_fewer_rounds():
    # Uniform weights, M_os = 6 (measured at B = 32 over 4 seeds: about 1.4 rounds with AAS,
    # 1.85 without). Without AAS the hard task gets B·M_os/3 = 64 prompts, about 6.4
    # informative groups, short of its ~10.7 target, so a second round is almost always
    # needed; with ρ warmed up (ρ ≈ [0.1, 0.5, 0.9] after 30 builds: 1 - 0.9^30 ≈ 96 % of the
    # way) m = [1.11, 2, 5] moves prompts to the hard task and one round usually suffices.
    tasks = prompts()
    mean_rounds = {}
    for aware in (True, False):
        sampler = make_sampler(
            "ratio_preserving", tasks, 3, seed=5, acceptance_aware=aware, oversample_factor=6
        )
        results = run_steps(sampler, np.full(3, 1 / 3), BATCH, SimulatedTasks(tasks, seed=6), 100)
        mean_rounds[aware] = np.mean([r.rounds for _, r in results[30:]])
    assert mean_rounds[True] < mean_rounds[False] - 0.25, mean_rounds


def test_acceptance_estimate_and_inflation_follow_the_formula():
    tasks = prompts((50, 50, 50))
    sim = SimulatedTasks(tasks, zero_rates=(0.0, 1.0, 0.0), seed=0)  # task 1 always filtered
    sampler = make_sampler("ratio_preserving", tasks, 3, seed=0, max_resample_rounds=0)
    first = sampler.build(np.full(3, 1 / 3), 12, sim).report
    # ρ_k ← 0.9 ρ_k + 0.1 f_k from ρ = 0 with f = [0, 1, 0]; m was 1 for this build.
    np.testing.assert_allclose(first.acceptance, [0.0, 0.1, 0.0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(first.inflation, [1.0, 1.0, 1.0], rtol=0, atol=0)
    second = sampler.build(np.full(3, 1 / 3), 12, sim).report
    # m_1 = min(1 / max(1 - 0.1, 0.01), 5) = 1/0.9; then ρ_1 = 0.9·0.1 + 0.1·1 = 0.19.
    np.testing.assert_allclose(second.inflation, [1.0, 1 / 0.9, 1.0], rtol=1e-12, atol=0)
    np.testing.assert_allclose(second.acceptance, [0.0, 0.19, 0.0], rtol=0, atol=1e-15)


def test_inflation_cap_and_generation_weights():
    tasks = prompts((500, 500, 500))
    sampler = make_sampler(
        "ratio_preserving", tasks, 3, seed=0, max_resample_rounds=0, zero_gradient_filter="none"
    )
    state = sampler.state_dict()
    state["filter_rate_ema"] = [0.999, 0.5, 0.0]
    sampler.load_state_dict(state)
    report = sampler.build(np.full(3, 1 / 3), 100, SimulatedTasks(tasks, seed=1)).report
    # m = [min(1 / max(0.001, 0.01), 5), 1 / 0.5, 1] = [5, 2, 1]: the cap binds for task 0.
    np.testing.assert_allclose(report.inflation, [5.0, 2.0, 1.0], rtol=1e-12, atol=0)
    # 300 prompts from ẑ ∝ z ⊙ m = [5, 2, 1] / 8; counts are Multinomial(300, ẑ): allow 4 SE.
    z_hat = np.array([5.0, 2.0, 1.0]) / 8
    se = np.sqrt(300 * z_hat * (1 - z_hat))
    assert np.all(np.abs(report.generated_groups - 300 * z_hat) <= 4 * se)
    # Without the filter every group is informative, so the batch is exactly the target.
    assert report.batch_counts.tolist() == report.target_counts.tolist()


def test_tasks_not_generated_keep_their_estimate_and_zero_weight_is_never_generated():
    tasks = prompts((50, 50, 50))
    for name in SAMPLERS:
        sampler = make_sampler(name, tasks, 3, seed=0)
        state = sampler.state_dict()
        state["filter_rate_ema"] = [0.0, 0.5, 0.3]
        sampler.load_state_dict(state)
        sim = SimulatedTasks(tasks, zero_rates=(0.5, 0.5, 0.5))
        report = sampler.build(np.array([1.0, 0.0, 0.0]), 8, sim).report
        assert report.generated_groups[1:].tolist() == [0, 0], name
        assert report.acceptance[1:].tolist() == [0.5, 0.3], name
        assert np.isnan(report.filter_rate[1:]).all(), name
        assert all(tasks[pid] == 0 for call in sim.calls for pid in call), name


def test_resampling_rounds_ask_only_for_tasks_in_deficit():
    tasks = prompts((500, 500, 500))
    sim = SimulatedTasks(tasks, zero_rates=(0.0, 0.0, 1.0), seed=0)
    sampler = make_sampler(
        "ratio_preserving",
        tasks,
        3,
        seed=0,
        max_resample_rounds=2,
        target_rounding="largest_remainder",
    )
    built = sampler.build(np.full(3, 1 / 3), 30, sim)
    groups, report = built.groups, built.report
    # Targets [10, 10, 10]; round 1 (90 prompts) covers tasks 0 and 1, task 2 is never
    # informative, so both extra rounds draw only task 2 (weights ∝ deficit = [0, 0, 10]).
    assert report.rounds == 3 == len(sim.calls)
    assert report.prompts_generated == 270
    assert set(sim.call_tasks(1).tolist()) == set(sim.call_tasks(2).tolist()) == {2}
    # The budget ran out: tasks 0 and 1 fill the batch with top-ups.
    assert len(groups) == 30
    assert report.batch_counts[2] == 0
    assert np.all(report.batch_counts[:2] >= 10)
    assert report.filter_rate.tolist() == [0.0, 0.0, 1.0]


def test_exhausted_budget_tops_up_from_other_tasks():
    tasks = prompts((500, 500, 500))
    sim = SimulatedTasks(tasks, zero_rates=(0.0, 0.0, 1.0), seed=0)
    sampler = make_sampler("ratio_preserving", tasks, 3, seed=0, max_resample_rounds=0)
    built = sampler.build(np.full(3, 1 / 3), 30, sim)
    groups, report = built.groups, built.report
    assert report.rounds == 1
    assert len(groups) == 30 == report.batch_size
    assert report.batch_counts[2] == 0
    assert (
        report.batch_counts.tolist() == np.bincount([g.task for g in groups], minlength=3).tolist()
    )
    # Tasks 0 and 1 keep their own targets and share the top-up of task 2's n_2 groups.
    assert np.all(report.batch_counts[:2] >= report.target_counts[:2])
    assert report.prompts_per_informative_group == pytest.approx(
        90 / report.informative_groups.sum(), rel=1e-12
    )


@pytest.mark.parametrize("name", ["ratio_preserving", "dynamic"])
def test_fewer_informative_groups_than_batch_returns_all_of_them(name):
    tasks = prompts((500, 500, 500))
    sim = SimulatedTasks(tasks, zero_rates=(1.0, 1.0, 0.0), seed=0)
    sampler = make_sampler(name, tasks, 3, seed=0, oversample_factor=1, max_resample_rounds=0)
    built = sampler.build(np.array([0.45, 0.45, 0.1]), 32, sim)
    groups, report = built.groups, built.report
    # One round of 32 prompts; only task 2's (about 3) groups are informative: all returned.
    available = int(report.informative_groups.sum())
    assert 0 < available < 32
    assert len(groups) == available == report.batch_size
    assert all(g.task == 2 for g in groups)
    strict = ZERO_GRADIENT_FILTERS.get("strict")
    assert not any(strict(g) for g in groups)


def test_no_informative_group_gives_an_empty_batch():
    tasks = prompts((20, 20))
    sim = SimulatedTasks(tasks, zero_rates=(1.0, 1.0))
    sampler = make_sampler("ratio_preserving", tasks, 2, max_resample_rounds=1)
    built = sampler.build(np.array([0.5, 0.5]), 8, sim)
    groups, report = built.groups, built.report
    assert groups == []
    assert report.rounds == 2
    assert math.isnan(report.prompts_per_informative_group)
    assert all(math.isnan(report.to_dict()[f"sampling/batch_share/task_{k}"]) for k in (0, 1))


def test_dynamic_stops_at_the_first_round_with_enough_informative_groups():
    tasks = prompts()
    sim = SimulatedTasks(tasks, zero_rates=(0.5, 0.5, 0.5), seed=3)
    sampler = make_sampler("dynamic", tasks, 3, seed=3, oversample_factor=1)
    strict = ZERO_GRADIENT_FILTERS.get("strict")
    for _ in range(10):
        sim.calls.clear()
        sim.returned.clear()
        built = sampler.build(np.full(3, 1 / 3), 32, sim)
        groups, report = built.groups, built.report
        # 32 prompts per round give about 16 informative groups, so 2 or more rounds.
        per_call = [sum(not strict(g) for g in call) for call in sim.returned]
        assert report.rounds == len(per_call) >= 2
        assert sum(per_call[:-1]) < 32 <= sum(per_call) == report.informative_groups.sum()
        # More than B informative: a subset of exactly B distinct informative groups.
        assert len(groups) == 32 == len({id(g) for g in groups})
        assert not any(strict(g) for g in groups)


def test_iid_returns_every_group_and_reports_what_the_filter_would_drop():
    tasks = prompts()
    sim = SimulatedTasks(tasks, seed=4)
    sampler = make_sampler("iid", tasks, 3, seed=4)
    built = sampler.build(WEIGHTS, 64, sim)
    groups, report = built.groups, built.report
    assert len(groups) == 64 == report.prompts_generated
    assert report.rounds == 1
    assert report.batch_counts.tolist() == report.target_counts.tolist()
    assert report.generated_groups.tolist() == report.batch_counts.tolist()
    strict = ZERO_GRADIENT_FILTERS.get("strict")
    dropped = np.bincount([g.task for g in groups if strict(g)], minlength=3)
    assert (report.generated_groups - report.informative_groups).tolist() == dropped.tolist()
    assert report.informative_groups.sum() < 64  # the hard task makes some groups dropped


def test_prompts_per_round_is_the_ceiling_of_oversampled_batch():
    tasks = prompts((500, 500))
    for factor, expected in ((0.1, 3), (0.15, 5), (1.0, 30), (1e-6, 1)):  # ⌈factor·30⌉, >= 1
        sampler = make_sampler("dynamic", tasks, 2, oversample_factor=factor, max_resample_rounds=0)
        report = sampler.build(np.array([0.5, 0.5]), 30, SimulatedTasks(tasks, (0.0, 0.0))).report
        assert report.prompts_generated == expected, factor


def test_batch_is_shuffled_so_mini_batches_mix_tasks():
    tasks = prompts()
    sampler = make_sampler("ratio_preserving", tasks, 3, seed=0)
    groups = sampler.build(np.full(3, 1 / 3), 32, SimulatedTasks(tasks, seed=0)).groups
    order = [g.task for g in groups]
    assert order != sorted(order)


# ---------------------------------------------------------------------------------------------
# Invariants on random settings (hypothesis)
# ---------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["ratio_preserving", "dynamic"]),
    num_tasks=st.integers(1, 4),
    seed=st.integers(0, 10_000),
    batch_size=st.integers(1, 20),
    oversample=st.sampled_from([0.5, 1.0, 3.0]),
    resample_rounds=st.integers(0, 3),
    filter_name=st.sampled_from(["strict", "lenient", "none"]),
)
def test_batch_invariants(
    name, num_tasks, seed, batch_size, oversample, resample_rounds, filter_name
):
    rng = np.random.default_rng(seed)
    weights = rng.dirichlet(np.ones(num_tasks)) * (rng.random(num_tasks) < 0.7)
    weights = weights / weights.sum() if weights.sum() > 0 else np.eye(num_tasks)[0]
    tasks = prompts(rng.integers(1, 30, size=num_tasks))
    sim = SimulatedTasks(tasks, zero_rates=rng.random(num_tasks), seed=seed)
    sampler = make_sampler(
        name,
        tasks,
        num_tasks,
        seed=seed,
        zero_gradient_filter=filter_name,
        oversample_factor=oversample,
        max_resample_rounds=resample_rounds,
    )
    built = sampler.build(weights, batch_size, sim)
    groups, report = built.groups, built.report
    is_zero_gradient = ZERO_GRADIENT_FILTERS.get(filter_name)
    assert not any(is_zero_gradient(g) for g in groups)
    assert len({id(g) for g in groups}) == len(groups)
    assert len(groups) == min(batch_size, int(report.informative_groups.sum()))
    assert (
        report.batch_counts.tolist()
        == np.bincount([g.task for g in groups], minlength=num_tasks).tolist()
    )
    assert np.all(report.batch_counts <= report.informative_groups)
    assert np.all(report.generated_groups[weights == 0] == 0)
    assert 1 <= report.rounds <= 1 + resample_rounds
    assert report.prompts_generated == report.rounds * math.ceil(oversample * batch_size)
    if name == "ratio_preserving":
        assert report.target_counts.sum() == batch_size
        kept = np.minimum(report.target_counts, report.informative_groups)
        assert np.all(report.batch_counts >= kept)
        if report.rounds < 1 + resample_rounds:  # stopped early: every target was met
            assert np.all(report.informative_groups >= report.target_counts)


# ---------------------------------------------------------------------------------------------
# Report and state
# ---------------------------------------------------------------------------------------------


def test_report_to_dict_is_flat_and_named():
    tasks = prompts()
    sampler = make_sampler("ratio_preserving", tasks, 3, seed=0)
    report = sampler.build(WEIGHTS, BATCH, SimulatedTasks(tasks, seed=0)).report
    metrics = report.to_dict(["countdown", "zebra", "arc"])
    assert all(isinstance(v, float) for v in metrics.values())
    shares = [metrics[f"sampling/batch_share/{t}"] for t in ("countdown", "zebra", "arc")]
    assert sum(shares) == pytest.approx(1.0, abs=1e-12)
    assert metrics["sampling/rounds"] == report.rounds
    assert metrics["sampling/target_weight/arc"] == 0.5
    assert metrics["sampling/filter_rate/zebra"] == report.filter_rate[1]
    assert metrics["sampling/filter_rate_ema/arc"] == report.acceptance[2]
    json.dumps(metrics)
    assert "sampling/batch_share/task_0" in report.to_dict()
    with pytest.raises(ValueError, match="task_names must hold 3 distinct names"):
        report.to_dict(["a", "b"])


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_state_dict_round_trip_reproduces_batches(name):
    tasks = prompts((40, 7, 3))  # small tasks so that the pool wraps epochs meanwhile
    weights = np.array([0.3, 0.3, 0.4])
    original = make_sampler(name, tasks, 3, seed=11)
    sim = SimulatedTasks(tasks, seed=12)
    run_steps(original, weights, 16, sim, 3)
    state = json.loads(json.dumps(original.state_dict()))
    sim_copy = copy.deepcopy(sim)
    expected = run_steps(original, weights, 16, sim, 4)

    restored = make_sampler(name, tasks, 3, seed=999)  # the state overrides the seed
    restored.load_state_dict(state)
    actual = run_steps(restored, weights, 16, sim_copy, 4)
    for (groups_a, report_a), (groups_b, report_b) in zip(expected, actual, strict=True):
        assert [g.prompt_id for g in groups_a] == [g.prompt_id for g in groups_b]
        assert json.dumps(report_a.to_dict()) == json.dumps(report_b.to_dict())
    assert original.state_dict() == restored.state_dict()


def test_load_state_dict_refuses_a_different_sampler_or_dataset():
    tasks = prompts((10, 10))
    state = make_sampler("dynamic", tasks, 2).state_dict()
    with pytest.raises(ValueError, match="belongs to sampler 'dynamic'"):
        make_sampler("ratio_preserving", tasks, 2).load_state_dict(state)
    with pytest.raises(ValueError, match="the prompt set differs"):
        make_sampler("dynamic", prompts((11, 9)), 2).load_state_dict(state)
    shuffled = np.array(prompts((10, 10))[::-1])  # same sizes, different mapping
    with pytest.raises(ValueError, match="the prompt set differs"):
        make_sampler("dynamic", shuffled, 2).load_state_dict(state)
    # A refused state leaves the sampler untouched.
    sampler = make_sampler("dynamic", tasks, 2, seed=5)
    before = sampler.state_dict()
    broken = {**state, "pool": {**state["pool"], "task_sizes": [3, 17]}}
    with pytest.raises(ValueError, match="the prompt set differs"):
        sampler.load_state_dict(broken)
    with pytest.raises(ValueError, match=r"sampler state is missing \['rng'\]"):
        sampler.load_state_dict({k: v for k, v in state.items() if k != "rng"})
    assert sampler.state_dict() == before


@pytest.mark.parametrize("saved_shuffle", [True, False])
def test_load_state_dict_refuses_a_different_shuffle(saved_shuffle):
    """A resume whose shuffle_dataset differs would read the prompts in another order."""
    tasks = prompts((10, 10))
    state = make_sampler("dynamic", tasks, 2, shuffle=saved_shuffle).state_dict()
    sampler = make_sampler("dynamic", tasks, 2, shuffle=not saved_shuffle)
    before = sampler.state_dict()
    with pytest.raises(ValueError, match=rf"saved with shuffle={saved_shuffle} .*"
                                         r"resume with the checkpoint's shuffle_dataset"):
        sampler.load_state_dict(state)
    assert sampler.state_dict() == before  # refused: nothing changed
    # the same flag resumes; a state from before the flag was recorded is not refused
    make_sampler("dynamic", tasks, 2, shuffle=saved_shuffle).load_state_dict(state)
    legacy = {**state, "pool": {k: v for k, v in state["pool"].items() if k != "shuffle"}}
    make_sampler("dynamic", tasks, 2, shuffle=not saved_shuffle).load_state_dict(legacy)


# ---------------------------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ([0.5, 0.4, 0.0], "must lie on the simplex"),
        ([0.5, 0.5], r"must have shape \[K\] = \(3,\)"),
        ([0.5, math.nan, 0.5], "must lie on the simplex"),
        ([1.2, -0.2, 0.0], "must lie on the simplex"),
    ],
)
def test_bad_weights(weights, match):
    tasks = prompts((5, 5, 5))
    sampler = make_sampler("ratio_preserving", tasks, 3)
    sim = SimulatedTasks(tasks)
    with pytest.raises(ValueError, match=match):
        sampler.build(np.array(weights), 4, sim)
    assert sim.calls == []  # rejected before any generation


def test_positive_weight_on_a_task_without_prompts():
    tasks = np.array([0, 0, 2, 2])
    sampler = make_sampler("iid", tasks, 3)
    with pytest.raises(ValueError, match=r"task\(s\) \[1\] have positive weight but no prompts"):
        sampler.build(np.full(3, 1 / 3), 4, SimulatedTasks(tasks))
    groups = sampler.build(np.array([0.5, 0.0, 0.5]), 4, SimulatedTasks(tasks)).groups
    assert len(groups) == 4


@pytest.mark.parametrize(("num_groups", "error"), [(0, ValueError), (2.0, TypeError)])
def test_bad_num_groups(num_groups, error):
    tasks = prompts((5, 5))
    with pytest.raises(error, match="num_groups must be"):
        make_sampler("iid", tasks, 2).build(np.array([0.5, 0.5]), num_groups, SimulatedTasks(tasks))


def _bad_generate(kind, prompt_tasks):
    sim = SimulatedTasks(prompt_tasks, zero_rates=(0.0, 0.0))

    def generate(prompt_ids):
        groups = sim(prompt_ids)
        if kind == "short":
            return groups[:-1]
        if kind == "task":
            g = groups[0]
            return [ScoredGroup(g.prompt_id, 1 - g.task, g.rewards, g.correct, g.zero_gradient),
                    *groups[1:]]
        if kind == "order":
            return groups[::-1]
        return [("not", "a group")] * len(groups)

    return generate


@pytest.mark.parametrize(
    ("kind", "error", "match"),
    [
        ("short", ValueError, "generate returned 7 groups for 8 prompt ids"),
        ("task", ValueError, r"\(task 1\) at position 0, where prompt \d+ \(task 0\)"),
        ("order", ValueError, "return the groups in the order of the prompt ids"),
        ("type", TypeError, "generate must return ScoredGroup objects; got tuple"),
    ],
)
def test_bad_generate_output(kind, error, match):
    tasks = prompts((30, 30))
    sampler = make_sampler("iid", tasks, 2, seed=0)
    with pytest.raises(error, match=match):
        sampler.build(
            np.array([1.0, 0.0]) if kind == "task" else np.array([0.5, 0.5]),
            8,
            _bad_generate(kind, tasks),
        )


def test_unknown_names_list_the_valid_ones():
    tasks = prompts((5, 5))
    with pytest.raises(
        ValueError,
        match="unknown sampler 'rp_sampling'; valid names: dynamic, iid, ratio_preserving",
    ):
        make_sampler("rp_sampling", tasks, 2)
    with pytest.raises(
        ValueError,
        match="unknown zero-gradient filter 'strcit'; valid names: lenient, none, strict",
    ):
        make_sampler("dynamic", tasks, 2, zero_gradient_filter="strcit")
    with pytest.raises(
        ValueError,
        match="unknown target rounding 'floor'; valid names: largest_remainder, multinomial",
    ):
        make_sampler("ratio_preserving", tasks, 2, target_rounding="floor")
    with pytest.raises(
        ValueError,
        match=r"sampler 'iid' has no option\(s\) \['oversample_factor'\]"
        "; valid options: acceptance_ema",
    ):
        make_sampler("iid", tasks, 2, oversample_factor=2)
    assert make_sampler("rp", tasks, 2).name == "ratio_preserving"
    assert make_sampler("DAPO", tasks, 2).name == "dynamic"


@pytest.mark.parametrize(
    ("params", "error", "match"),
    [
        ({"oversample_factor": 0}, ValueError, "oversample_factor must be a finite number > 0"),
        ({"oversample_factor": math.inf}, ValueError, "oversample_factor must be a finite"),
        ({"oversample_factor": "3"}, TypeError, "oversample_factor must be a number"),
        ({"max_resample_rounds": -1}, ValueError, "max_resample_rounds must be an integer >= 0"),
        ({"max_resample_rounds": 1.5}, TypeError, "max_resample_rounds must be an integer"),
        ({"acceptance_ema": 1.0}, ValueError, r"acceptance_ema .* must lie in \[0, 1\)"),
        ({"acceptance_ema": math.nan}, ValueError, r"acceptance_ema .* must lie in \[0, 1\)"),
        ({"acceptance_ema": "0.9"}, TypeError, "acceptance_ema must be a number"),
        ({"max_acceptance_inflation": 0.5}, ValueError, "max_acceptance_inflation .* >= 1"),
        ({"acceptance_aware": 1}, TypeError, "acceptance_aware must be True or False"),
        ({"seed": -1}, ValueError, "seed must be a non-negative integer"),
    ],
)
def test_bad_sampler_options(params, error, match):
    with pytest.raises(error, match=match):
        make_sampler("ratio_preserving", prompts((5, 5)), 2, **params)


@pytest.mark.parametrize(
    ("prompt_tasks", "num_tasks", "error", "match"),
    [
        ([0, 1, 3], 3, ValueError, r"prompt_tasks must lie in 0\.\.2 \(num_tasks=3\); got \[3\]"),
        ([], 2, ValueError, "prompt_tasks must be a non-empty 1-D array"),
        ([0.0, 1.0], 2, TypeError, "prompt_tasks must hold integer task indices"),
        ([0, 1], 0, ValueError, "num_tasks must be >= 1"),
    ],
)
def test_bad_prompt_tasks(prompt_tasks, num_tasks, error, match):
    with pytest.raises(error, match=match):
        make_sampler("iid", np.array(prompt_tasks), num_tasks)


def test_bad_scored_groups():
    with pytest.raises(ValueError, match=r"rewards must have shape \[G, R\]"):
        ScoredGroup(0, 0, np.zeros(4), np.zeros(4, dtype=bool), True)
    with pytest.raises(TypeError, match="correct must be a boolean array"):
        ScoredGroup(0, 0, np.zeros((4, 1)), np.zeros(4), True)
    with pytest.raises(ValueError, match=r"correct must have shape \[G\] = \(4,\)"):
        ScoredGroup(0, 0, np.zeros((4, 1)), np.zeros(3, dtype=bool), True)
    with pytest.raises(TypeError, match="prompt_id must be an integer"):
        ScoredGroup("7", 0, np.zeros((4, 1)), np.zeros(4, dtype=bool), True)
    with pytest.raises(ValueError, match=r"advantages must have shape \[G\] = \(4,\)"):
        ScoredGroup(0, 0, np.zeros((4, 1)), np.zeros(4, dtype=bool), True, np.zeros(3))


def test_build_returns_every_group_it_generated_in_generation_order():
    tasks = prompts((200, 200, 200))
    sampler = make_sampler("ratio_preserving", tasks, 3, seed=4, max_resample_rounds=3)
    sim = SimulatedTasks(tasks, seed=5)
    built = sampler.build(np.full(3, 1 / 3), 24, sim)
    returned = [g for call in sim.returned for g in call]
    assert built.generated == returned  # the same objects, every round, in order
    assert len(built.generated) == built.report.prompts_generated
    kept = {id(g) for g in built.groups}
    assert kept <= {id(g) for g in built.generated}
    dropped = [g for g in built.generated if id(g) not in kept]
    assert np.bincount([g.task for g in built.generated], minlength=3).tolist() == \
        built.report.generated_groups.tolist()
    assert any(g.zero_gradient for g in dropped)  # the filter dropped zero-gradient groups
