"""Tests of mtgrpo.algo.weighting: formulas on hand-built inputs, loop references, torch's Adam,
absent-task rules, validation messages, the simplex property and state round trips."""

from __future__ import annotations

import inspect
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtgrpo.algo.weighting import (
    DEFAULT_ADAM_STEP_SIZE,
    DEFAULT_SGD_STEP_SIZE,
    TASK_WEIGHTING_SIGNALS,
    WEIGHTINGS,
    FixedWeighting,
    MTGRPOWeighting,
    TaskStats,
    ValidationSignal,
    WeightingStrategy,
    floored,
    gradient_parts,
    improvement_by_task,
    improvement_sizes,
    make_weighting,
    reads_task_stats,
    simplex_gradient,
    softmax,
)
from script_loader import load_script

NAN = math.nan
TIGHT = {"rtol": 0.0, "atol": 1e-12}


def full_stats(reward, improvement=None, mean_abs_advantage=None, count=None) -> TaskStats:
    """Every task present with 4 rollouts unless ``count`` says otherwise."""
    count = [4] * len(reward) if count is None else count
    return TaskStats(
        accuracy=reward, count=count, improvement=improvement, mean_abs_advantage=mean_abs_advantage
    )


def assert_on_simplex(weights: np.ndarray, size: int) -> None:
    assert weights.shape == (size,)
    assert np.isfinite(weights).all()
    assert (weights >= 0).all()
    assert abs(weights.sum() - 1.0) <= 1e-12


def all_strategies(num_tasks: int, **overrides) -> list[WeightingStrategy]:
    weights = list(range(1, num_tasks + 1))
    return [
        make_weighting("uniform", num_tasks),
        make_weighting("fixed", num_tasks, weights=weights),
        make_weighting("worst_case", num_tasks, **overrides),
        make_weighting("regularized", num_tasks, **overrides),
        make_weighting("mt_grpo", num_tasks, improvement_clip=0.2, **overrides),
        make_weighting("mt_grpo", num_tasks, optimizer="adam", reward_ema=0.5, **overrides),
        make_weighting("sec", num_tasks),
    ]


def random_stats(rng: np.random.Generator, num_tasks: int, absent_rate: float = 0.3) -> TaskStats:
    """Random stats: absent tasks hold NaN, inf or stale garbage; some present tasks have a
    field that was not measured (NaN)."""
    count = rng.integers(1, 9, size=num_tasks) * (rng.random(num_tasks) >= absent_rate)
    absent = count == 0
    garbage = rng.choice([NAN, math.inf, -math.inf, 7.0], size=num_tasks)

    def measured(values: np.ndarray, rate: float) -> np.ndarray:
        return np.where(rng.random(num_tasks) < rate, NAN, values)

    reward = np.where(absent, garbage, measured(rng.random(num_tasks), 0.1))
    improvement = np.where(absent, garbage, measured(rng.normal(0.0, 0.1, num_tasks), 0.2))
    mean_abs = np.where(absent, np.abs(garbage), measured(rng.random(num_tasks), 0.1))
    return TaskStats(reward, count, improvement, mean_abs)


# ---------------------------------------------------------------------------------------------
# Pure helpers


def test_softmax_hand_values_and_stability():
    # softmax([0, ln 3]) = [1, 3] / 4; shifting by 1000 must not overflow and gives the same.
    expected = np.array([0.25, 0.75])
    np.testing.assert_allclose(softmax(np.array([0.0, math.log(3.0)])), expected, **TIGHT)
    np.testing.assert_allclose(
        softmax(np.array([1000.0, 1000.0 + math.log(3.0)])), expected, rtol=0, atol=1e-12
    )
    # A gap of 1e300 is a one-hot, not a NaN.
    np.testing.assert_array_equal(softmax(np.array([-1e300, 1e300])), [0.0, 1.0])
    np.testing.assert_array_equal(softmax(np.array([math.inf, 0.0, math.inf])), [0.5, 0.0, 0.5])
    np.testing.assert_array_equal(softmax(np.array([-math.inf, -math.inf])), [0.5, 0.5])
    with pytest.raises(ValueError, match="softmax got NaN logits"):
        softmax(np.array([0.0, NAN]))


def test_simplex_gradient_matches_loop_and_finite_differences():
    rng = np.random.default_rng(0)
    for num_tasks in (1, 2, 5, 17):
        logits = rng.normal(size=num_tasks)
        signal = rng.normal(size=num_tasks)
        weights = softmax(logits)
        gradient = simplex_gradient(weights, signal)
        # Loop reference: g_k = z_k (s_k − Σ_j z_j s_j).
        baseline = sum(weights[j] * signal[j] for j in range(num_tasks))
        loop = [weights[k] * (signal[k] - baseline) for k in range(num_tasks)]
        np.testing.assert_allclose(gradient, loop, **TIGHT)
        # It is the derivative of Σ_k softmax(ξ)_k s_k: central differences, O(h²) error.
        h = 1e-6
        numeric = []
        for k in range(num_tasks):
            step = np.zeros(num_tasks)
            step[k] = h
            up, down = softmax(logits + step) @ signal, softmax(logits - step) @ signal
            numeric.append((up - down) / (2 * h))
        np.testing.assert_allclose(gradient, numeric, rtol=0, atol=1e-9)


def test_simplex_gradient_zeroes_inf_times_zero():
    # Weight 0 (underflow) times an infinite difference would be NaN; it must be 0 instead.
    gradient = simplex_gradient(np.array([0.0, 1.0]), np.array([math.inf, 0.0]))
    assert np.isfinite(gradient).all()
    assert gradient[0] == 0.0


# ---------------------------------------------------------------------------------------------
# worst_case and regularized


def test_worst_case_first_step_by_hand():
    # K=3, J=[0.2, 0.5, 0.8], z=1/3: z·J = 0.5, g = (1/3)[−0.3, 0, 0.3] = [−0.1, 0, 0.1];
    # β = 0.5: ξ = −β g = [0.05, 0, −0.05].
    strategy = make_weighting("worst_case", 3, step_size=0.5)
    weights = strategy.update(full_stats([0.2, 0.5, 0.8]))
    np.testing.assert_allclose(strategy.logits, [0.05, 0.0, -0.05], **TIGHT)
    np.testing.assert_allclose(weights, softmax(np.array([0.05, 0.0, -0.05])), **TIGHT)
    assert strategy.steps == 1


def test_worst_case_concentrates_on_the_worst_task():
    strategy = make_weighting("worst_case", 4, step_size=20.0)
    stats = full_stats([0.6, 0.3, 0.9, 0.5])
    for _ in range(500):
        weights = strategy.update(stats)
    assert np.argmax(weights) == 1
    assert weights[1] > 0.99


def test_min_weight_floor_by_hand():
    # worst_case as in the test above, with ε = 0.1: the logits move exactly as without the
    # floor (ξ = [0.05, 0, −0.05]) and the weights are 0.7 · softmax(ξ) + 0.1.
    strategy = make_weighting("worst_case", 3, step_size=0.5, min_weight=0.1)
    np.testing.assert_allclose(strategy.weights, [1 / 3] * 3, **TIGHT)
    weights = strategy.update(full_stats([0.2, 0.5, 0.8]))
    np.testing.assert_allclose(strategy.logits, [0.05, 0.0, -0.05], **TIGHT)
    e = np.exp([0.05, 0.0, -0.05])
    np.testing.assert_allclose(weights, 0.7 * e / e.sum() + 0.1, **TIGHT)
    # Step 2 descends the gradient of the softmax p, not of the floored z:
    # g_k = p_k (J_k − p·J).
    p = e / e.sum()
    j = np.array([0.2, 0.5, 0.8])
    strategy.update(full_stats(j.tolist()))
    np.testing.assert_allclose(strategy.logits, [0.05, 0.0, -0.05] - 0.5 * p * (j - p @ j),
                               **TIGHT)


def test_min_weight_keeps_every_task_above_the_floor_as_the_logits_collapse():
    plain = make_weighting("worst_case", 4, step_size=20.0)
    floored_strategy = make_weighting("worst_case", 4, step_size=20.0, min_weight=0.05)
    stats = full_stats([0.6, 0.3, 0.9, 0.5])
    for _ in range(500):
        plain.update(stats)
        weights = floored_strategy.update(stats)
    np.testing.assert_array_equal(floored_strategy.logits, plain.logits)
    assert plain.weights[1] > 0.99  # collapsed onto task 1
    # The others keep ε: (1 − 4·0.05)·p + 0.05 with p ≈ one-hot on task 1.
    np.testing.assert_allclose(weights, [0.05, 0.85, 0.05, 0.05], rtol=0, atol=0.8 * 0.01)
    assert weights.min() >= 0.05
    assert_on_simplex(weights, 4)


def test_floored_by_hand_and_at_its_ends():
    p = np.array([0.7, 0.2, 0.1])
    np.testing.assert_allclose(floored(p, 0.1), [0.59, 0.24, 0.17], **TIGHT)  # 0.7 p + 0.1
    assert floored(p, 0.0) is p
    np.testing.assert_allclose(floored(p, 1 / 3), [1 / 3] * 3, **TIGHT)
    # a strategy at ε = 1/K hands out uniform weights whatever it learns
    strategy = make_weighting("mt_grpo", 3, lam=5.0, step_size=50.0, min_weight=1 / 3)
    for _ in range(3):
        weights = strategy.update(full_stats([0.1, 0.9, 0.5], [0.0, 0.0, 0.0]))
    assert np.abs(strategy.logits).max() > 1.0
    np.testing.assert_allclose(weights, [1 / 3] * 3, rtol=0, atol=4 * np.finfo(float).eps)


def test_sec_min_weight_by_hand():
    # softmax([0, ln 2]) = [1/3, 2/3] (test below); ε = 0.25: 0.5 · [1/3, 2/3] + 0.25.
    strategy = make_weighting("sec", 2, alpha=1.0, temperature=1.0, min_weight=0.25)
    weights = strategy.update(full_stats([0.0, 0.0], mean_abs_advantage=[0.0, math.log(2.0)]))
    np.testing.assert_allclose(weights, [5 / 12, 7 / 12], **TIGHT)
    restored = make_weighting("sec", 2, alpha=1.0, temperature=1.0, min_weight=0.25)
    restored.load_state_dict(strategy.state_dict())
    np.testing.assert_allclose(restored.weights, [5 / 12, 7 / 12], **TIGHT)


def test_mt_grpo_diagnostics_use_the_softmax_the_gradient_used():
    strategy = make_weighting("mt_grpo", 3, lam=1.0, step_size=5.0, min_weight=0.2)
    strategy.update(full_stats([0.1, 0.5, 0.9], [0.0, 0.0, 0.0]))
    before = strategy.logits
    p = softmax(before)
    assert strategy.weights.min() >= 0.2
    assert not np.allclose(strategy.weights, p)
    strategy.update(full_stats([0.1, 0.5, 0.9], [0.01, -0.02, 0.03]))
    improvement, reward, weights = strategy.last_terms
    np.testing.assert_allclose(weights, p, **TIGHT)
    part_i, part_j = gradient_parts(improvement, reward, weights)
    # the strategy's own step: ξ ← ξ − β (g + η ξ), g = part_i + part_j, β = 5, η = 1e-5
    expected = before - 5.0 * (part_i + part_j + 1e-5 * before)
    np.testing.assert_allclose(strategy.logits, expected, rtol=0,
                               atol=16 * np.finfo(float).eps * np.abs(before).max())


def test_regularized_two_steps_by_hand():
    # K=2, J=[0.0, 1.0], β=1, η=0.1.
    # Step 1: z=[.5,.5], z·J=.5, g=[−.25, .25], ξ=0 → ξ = −(g + ηξ) = [.25, −.25].
    # Step 2: z=softmax([.25,−.25]) = [σ(.5), 1−σ(.5)], g_0 = z_0 (0 − z_1) = −z_0 z_1,
    #         g_1 = z_1 (1 − z_1) = z_0 z_1; ξ_0 = .25 − (−z_0 z_1 + .025), ξ_1 = −ξ_0.
    strategy = make_weighting("regularized", 2, step_size=1.0, damping=0.1)
    stats = full_stats([0.0, 1.0])
    strategy.update(stats)
    np.testing.assert_allclose(strategy.logits, [0.25, -0.25], **TIGHT)
    strategy.update(stats)
    z0 = 1.0 / (1.0 + math.exp(-0.5))
    xi0 = 0.25 - (-z0 * (1 - z0) + 0.025)
    np.testing.assert_allclose(strategy.logits, [xi0, -xi0], **TIGHT)


def test_regularized_stops_short_of_collapse_at_its_fixed_point():
    stats = full_stats([0.2, 0.5, 0.8])
    damped = make_weighting("regularized", 3, step_size=2.0, damping=0.05)
    undamped = make_weighting("worst_case", 3, step_size=2.0)
    for _ in range(3000):
        damped.update(stats)
        undamped.update(stats)
    # At the fixed point the update vanishes: g + η ξ = 0.
    weights = damped.weights
    gradient = simplex_gradient(weights, np.array([0.2, 0.5, 0.8]))
    np.testing.assert_allclose(gradient + 0.05 * damped.logits, 0.0, rtol=0, atol=1e-10)
    assert 0.34 < weights[0] < undamped.weights[0]
    assert undamped.weights[0] > 0.99


# ---------------------------------------------------------------------------------------------
# mt_grpo


def test_mt_grpo_with_large_lambda_behaves_like_worst_case():
    rng = np.random.default_rng(1)
    reward = np.array([0.55, 0.1, 0.8, 0.35, 0.6])
    # s = I + λJ with β/λ equals worst_case's update of step β up to the O(I/λ) term.
    mt = make_weighting("mt_grpo", 5, lam=1e3, step_size=1.0 / 1e3, damping=0.0)
    worst = make_weighting("worst_case", 5, step_size=1.0)
    for _ in range(200):
        improvement = rng.normal(0.0, 0.05, 5)
        mt_weights = mt.update(full_stats(reward, improvement))
        worst_weights = worst.update(full_stats(reward))
    assert np.argmax(mt_weights) == np.argmax(worst_weights) == 1
    np.testing.assert_array_equal(np.argsort(mt_weights), np.argsort(-reward))
    np.testing.assert_allclose(mt_weights, worst_weights, rtol=0, atol=1e-3)


def test_mt_grpo_with_zero_lambda_follows_improvement_only():
    improvement = np.array([0.05, -0.03, 0.01])
    # The task with the smallest I (#1) has the best J: J must not matter at all.
    a = make_weighting("mt_grpo", 3, lam=0.0)
    b = make_weighting("mt_grpo", 3, lam=0.0)
    for _ in range(20):
        weights_a = a.update(full_stats([0.1, 0.9, 0.5], improvement))
        weights_b = b.update(full_stats([0.7, 0.2, 0.3], improvement))
    np.testing.assert_array_equal(weights_a, weights_b)
    assert np.argmax(weights_a) == 1
    np.testing.assert_array_equal(np.argsort(weights_a), np.argsort(-improvement))


def test_mt_grpo_needs_improvement():
    strategy = make_weighting("mt_grpo", 2)
    with pytest.raises(ValueError, match=r"needs TaskStats.improvement .*'regularized'"):
        strategy.update(full_stats([0.1, 0.2]))


def test_improvement_clip_equals_clipped_input():
    # With c = 0.1, I = [0.5, −0.5, 0.05] is fed as [0.1, −0.1, 0.05].
    clipped = make_weighting("mt_grpo", 3, improvement_clip=0.1)
    manual = make_weighting("mt_grpo", 3)
    for _ in range(3):
        clipped.update(full_stats([0.2, 0.4, 0.6], [0.5, -0.5, 0.05]))
        manual.update(full_stats([0.2, 0.4, 0.6], [0.1, -0.1, 0.05]))
    np.testing.assert_array_equal(clipped.logits, manual.logits)
    unclipped = make_weighting("mt_grpo", 3)
    unclipped.update(full_stats([0.2, 0.4, 0.6], [0.5, -0.5, 0.05]))
    assert not np.allclose(unclipped.logits, manual.logits)


def test_reward_ema_by_hand():
    # decay 0.5: the first J is taken as is (0.2), then J = 0.5·0.2 + 0.5·0.6 = 0.4.
    smoothed = make_weighting("mt_grpo", 2, reward_ema=0.5)
    raw = make_weighting("mt_grpo", 2)
    improvement = [0.0, 0.0]
    smoothed.update(full_stats([0.2, 0.8], improvement))
    smoothed.update(full_stats([0.6, 0.8], improvement))
    np.testing.assert_allclose(smoothed.task_rewards, [0.4, 0.8], **TIGHT)
    raw.update(full_stats([0.2, 0.8], improvement))
    raw.update(full_stats([0.4, 0.8], improvement))
    np.testing.assert_allclose(smoothed.weights, raw.weights, **TIGHT)


def test_default_step_sizes_follow_the_optimizer():
    assert make_weighting("mt_grpo", 2).params["step_size"] == DEFAULT_SGD_STEP_SIZE
    adam = make_weighting("mt_grpo", 2, optimizer="ADAM")
    assert adam.params["optimizer"] == "adam"
    assert adam.params["step_size"] == DEFAULT_ADAM_STEP_SIZE == 0.025


def reference_signal_weights(history, num_tasks, *, lam, beta, optimizer, eta, clip, ema):
    """Plain-Python MT-GRPO (λ=1 with I unmeasured is worst_case/regularized), loop over tasks.

    Returns the logits after each step. Adam is the textbook form (m̂, v̂), not torch's order.
    ``z`` here is ``softmax(ξ)``: a ``min_weight`` floor changes the weights handed out, not
    the logits' path.
    """
    xi, held = [0.0] * num_tasks, [None] * num_tasks
    m, v, t, out = [0.0] * num_tasks, [0.0] * num_tasks, 0, []
    for stats in history:
        top = max(xi)
        exps = [math.exp(x - top) for x in xi]
        z = [e / sum(exps) for e in exps]
        observed = [
            stats.count[k] > 0 and not math.isnan(stats.accuracy[k]) for k in range(num_tasks)
        ]
        if not any(observed):
            out.append(list(xi))
            continue
        for k in range(num_tasks):
            if observed[k]:
                r = float(stats.accuracy[k])
                held[k] = r if held[k] is None else ema * held[k] + (1 - ema) * r
        signal = [None] * num_tasks
        for k in range(num_tasks):
            if held[k] is None:
                continue
            imp = stats.improvement[k] if stats.improvement is not None else NAN
            i = float(imp) if stats.count[k] > 0 and not math.isnan(imp) else 0.0
            if clip is not None:
                i = min(max(i, -clip), clip)
            signal[k] = i + lam * held[k]
        seen_mass = sum(z[k] for k in range(num_tasks) if signal[k] is not None)
        mean = sum(z[k] * signal[k] for k in range(num_tasks) if signal[k] is not None) / seen_mass
        signal = [mean if s is None else s for s in signal]
        baseline = sum(z[k] * signal[k] for k in range(num_tasks))
        gradient = [
            z[k] * (signal[k] - baseline) if held[k] is not None else 0.0 for k in range(num_tasks)
        ]  # a never-observed task: exactly 0
        direction = [gradient[k] + eta * xi[k] for k in range(num_tasks)]
        t += 1
        for k in range(num_tasks):
            if optimizer == "sgd":
                xi[k] -= beta * direction[k]
            else:
                m[k] = 0.9 * m[k] + 0.1 * direction[k]
                v[k] = 0.999 * v[k] + 0.001 * direction[k] ** 2
                m_hat, v_hat = m[k] / (1 - 0.9**t), v[k] / (1 - 0.999**t)
                xi[k] -= beta * m_hat / (math.sqrt(v_hat) + 1e-8)
        out.append(list(xi))
    return out


@pytest.mark.parametrize(
    ("name", "options", "reference"),
    [
        ("mt_grpo", {"lam": 0.3, "damping": 1e-2}, {"optimizer": "sgd", "clip": None, "ema": 0.0}),
        (
            "mt_grpo",
            {
                "lam": 1.2,
                "optimizer": "adam",
                "damping": 1e-4,
                "improvement_clip": 0.1,
                "reward_ema": 0.5,
            },
            {"optimizer": "adam", "clip": 0.1, "ema": 0.5},
        ),
        ("worst_case", {"step_size": 3.0}, {"lam": 1.0, "beta": 3.0, "eta": 0.0}),
        ("regularized", {"damping": 5e-4}, {"lam": 1.0, "eta": 5e-4}),
        ("mt_grpo", {"lam": 0.8, "step_size": 2.0, "min_weight": 0.1}, {"beta": 2.0}),
        ("worst_case", {"step_size": 3.0, "min_weight": 0.125}, {"beta": 3.0}),
    ],
)
@pytest.mark.parametrize("num_tasks", [1, 3, 8])
def test_signal_strategies_match_loop_reference(name, options, reference, num_tasks):
    rng = np.random.default_rng(num_tasks)
    strategy = make_weighting(name, num_tasks, **options)
    params = strategy.params
    settings_ = {
        "lam": params.get("lam", 1.0),
        "beta": params["step_size"],
        "optimizer": params.get("optimizer", "sgd"),
        "eta": params.get("damping", 0.0),
        "clip": params.get("improvement_clip"),
        "ema": params["reward_ema"],
    }
    assert {k: settings_[k] for k in reference} == reference  # the factory resolved as expected
    history = [random_stats(rng, num_tasks, absent_rate=0.4) for _ in range(12)]
    if name != "mt_grpo":  # their signal is J only: the reference reads I as unmeasured
        history = [TaskStats(s.accuracy, s.count) for s in history]
    expected = reference_signal_weights(history, num_tasks, **settings_)
    floor = params["min_weight"]
    for stats, logits in zip(history, expected, strict=True):
        strategy.update(stats)
        np.testing.assert_allclose(strategy.logits, logits, rtol=0, atol=1e-12)
        top = max(logits)
        exps = [math.exp(x - top) for x in logits]
        weights = [(1 - num_tasks * floor) * e / sum(exps) + floor for e in exps]
        np.testing.assert_allclose(strategy.weights, weights, rtol=0, atol=1e-12)


def test_adam_matches_torch_adam_with_weight_decay():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    num_tasks, damping, step_size = 5, 1e-3, 0.025
    strategy = make_weighting(
        "mt_grpo", num_tasks, lam=0.5, optimizer="adam", damping=damping, step_size=step_size
    )
    xi = torch.zeros(num_tasks, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam(
        [xi], lr=step_size, betas=(0.9, 0.999), eps=1e-8, weight_decay=damping
    )
    for _ in range(25):
        reward, improvement = rng.random(num_tasks), rng.normal(0.0, 0.1, num_tasks)
        # Every task present: s = I + λJ and g = z (s − z·s) from the weights before the step.
        weights = strategy.weights
        signal = improvement + 0.5 * reward
        xi.grad = torch.from_numpy(weights * (signal - weights @ signal))
        optimizer.step()
        strategy.update(full_stats(reward, improvement))
        np.testing.assert_allclose(strategy.logits, xi.detach().numpy(), rtol=0, atol=1e-14)


# ---------------------------------------------------------------------------------------------
# Absent tasks


def test_absent_task_holds_its_last_reward_and_no_improvement():
    a = make_weighting("mt_grpo", 3, lam=0.5)
    b = make_weighting("mt_grpo", 3, lam=0.5)
    first = full_stats([0.3, 0.6, 0.9], [0.02, 0.01, -0.01])
    a.update(first)
    b.update(first)
    # Task 2 absent (garbage values) ≡ task 2 present with its last J = 0.9 and I = 0.
    a.update(TaskStats([0.4, 0.5, math.inf], [4, 4, 0], [0.01, 0.03, NAN]))
    b.update(full_stats([0.4, 0.5, 0.9], [0.01, 0.03, 0.0]))
    np.testing.assert_array_equal(a.logits, b.logits)
    np.testing.assert_array_equal(a.task_rewards, [0.4, 0.5, 0.9])


def test_unmeasured_values_of_a_present_task():
    # A present task with NaN improvement counts as I = 0; with NaN reward its J is held.
    a = make_weighting("mt_grpo", 2, lam=0.5)
    b = make_weighting("mt_grpo", 2, lam=0.5)
    a.update(full_stats([0.3, 0.6], [0.02, NAN]))
    b.update(full_stats([0.3, 0.6], [0.02, 0.0]))
    np.testing.assert_array_equal(a.logits, b.logits)
    a.update(full_stats([NAN, 0.5], [0.01, 0.03]))
    b.update(full_stats([0.3, 0.5], [0.01, 0.03]))
    np.testing.assert_array_equal(a.logits, b.logits)


def test_never_observed_task_gets_zero_gradient():
    # Task 2 never appears: with damping 0 its logit must stay exactly 0 (g_2 = 0) while the
    # others move, and the observed tasks move as if the unseen task had their mean signal.
    strategy = make_weighting("regularized", 3, damping=0.0)
    for reward in ([0.2, 0.8, NAN], [0.1, 0.7, NAN], [0.3, 0.9, NAN]):
        strategy.update(TaskStats(reward, [4, 4, 0]))
        assert strategy.logits[2] == 0.0
    assert strategy.logits[0] > 0 > strategy.logits[1]
    # Step 1 by hand: z = 1/3, m = (0.2 + 0.8)/2 = 0.5, g = (1/3)[−0.3, 0.3, 0], β = 0.5.
    fresh = make_weighting("regularized", 3, damping=0.0)
    fresh.update(TaskStats([0.2, 0.8, NAN], [4, 4, 0]))
    np.testing.assert_allclose(fresh.logits, [0.05, -0.05, 0.0], **TIGHT)


@pytest.mark.parametrize("strategy", all_strategies(3), ids=lambda s: s.name)
def test_step_without_any_observed_task_changes_nothing(strategy):
    strategy.update(full_stats([0.2, 0.5, 0.7], [0.01, 0.0, -0.01], [0.3, 0.2, 0.1]))
    before = strategy.state_dict()
    weights = strategy.update(
        TaskStats([NAN, math.inf, 0.5], [0, 0, 0], [NAN, NAN, 1.0], [NAN, math.inf, 2.0])
    )
    assert strategy.state_dict() == before
    np.testing.assert_array_equal(weights, strategy.weights)


# ---------------------------------------------------------------------------------------------
# SEC


def test_sec_q_update_and_boltzmann_weights_by_hand():
    strategy = make_weighting("sec", 3)  # α = 0.5, τ = 0.2
    # Step 1: r = [0.4, 0 (absent), 0.8]; Q = 0.5·r = [0.2, 0, 0.4]; Q/τ = [1, 0, 2].
    weights = strategy.update(TaskStats([0.1, NAN, 0.3], [4, 0, 4], None, [0.4, NAN, 0.8]))
    np.testing.assert_allclose(strategy.q_values, [0.2, 0.0, 0.4], **TIGHT)
    e = math.e
    np.testing.assert_allclose(weights, np.array([e, 1.0, e**2]) / (e + 1 + e**2), **TIGHT)
    # Step 2: r = [0.2, 0.6, 0 (absent)]; Q = 0.5·[0.2, 0, 0.4] + 0.5·[0.2, 0.6, 0]
    #         = [0.2, 0.3, 0.2]; Q/τ = [1, 1.5, 1].
    weights = strategy.update(TaskStats([0.1, 0.2, NAN], [4, 4, 0], None, [0.2, 0.6, NAN]))
    np.testing.assert_allclose(strategy.q_values, [0.2, 0.3, 0.2], **TIGHT)
    expected = np.array([e, e**1.5, e]) / (2 * e + e**1.5)
    np.testing.assert_allclose(weights, expected, **TIGHT)


def test_sec_parameters_and_required_field():
    strategy = make_weighting("sec", 2, alpha=1.0, temperature=1.0)
    weights = strategy.update(full_stats([0.0, 0.0], mean_abs_advantage=[0.0, math.log(2.0)]))
    np.testing.assert_allclose(weights, [1 / 3, 2 / 3], **TIGHT)  # softmax([0, ln 2])
    with pytest.raises(ValueError, match=r"needs TaskStats.mean_abs_advantage"):
        strategy.update(full_stats([0.1, 0.2]))
    with pytest.raises(ValueError, match=r"must be >= 0 .* negative for task\(s\) #1"):
        strategy.update(full_stats([0.1, 0.2], mean_abs_advantage=[0.1, -0.2]))
    with pytest.raises(ValueError, match=r"'alpha' must be a finite number in \(0, 1\]; got 0"):
        make_weighting("sec", 2, alpha=0)


# ---------------------------------------------------------------------------------------------
# uniform and fixed


def test_uniform_and_fixed_weights():
    uniform = make_weighting("uniform", 4)
    np.testing.assert_array_equal(uniform.update(full_stats([0.1, 0.2, 0.3, 0.4])), [0.25] * 4)
    fixed = make_weighting("fixed", 3, weights=[1, 0, 3])
    np.testing.assert_allclose(fixed.weights, [0.25, 0.0, 0.75], **TIGHT)
    np.testing.assert_allclose(
        fixed.update(full_stats([0.1, 0.2, 0.3])), [0.25, 0.0, 0.75], **TIGHT
    )
    by_name = FixedWeighting(3, weights={"b": 2.0, "a": 1.0, "c": 1.0}, task_names=["a", "b", "c"])
    np.testing.assert_allclose(by_name.weights, [0.25, 0.5, 0.25], **TIGHT)


@pytest.mark.parametrize(
    ("weights", "names", "message"),
    [
        ([1.0, -0.5, 1.0], ["a", "b", "c"], r"finite and >= 0; .* task\(s\) 'b'"),
        ([0.0, 0.0, 0.0], None, "all 0; give at least one task a positive weight"),
        ([1.0, 2.0], None, r"one number per task \(3\); got shape \(2,\)"),
        ([1.0, NAN, 1.0], None, r"finite and >= 0; .* task\(s\) #1"),
        ({"a": 1.0, "b": 1.0}, None, "mapping need task_names"),
        ({"a": 1.0, "x": 1.0}, ["a", "b", "c"], r"unknown \['x'\], missing \['b', 'c'\]"),
    ],
)
def test_fixed_weight_validation(weights, names, message):
    with pytest.raises(ValueError, match=message):
        make_weighting("fixed", 3, weights=weights, task_names=names)


# ---------------------------------------------------------------------------------------------
# Registry, parameters and stats validation


def test_registry_names_and_aliases():
    assert WEIGHTINGS.names() == [
        "fixed",
        "mt_grpo",
        "regularized",
        "sec",
        "uniform",
        "worst_case",
    ]
    assert isinstance(make_weighting("MTGRPO", 2), MTGRPOWeighting)
    for name in WEIGHTINGS:
        assert WEIGHTINGS.get(name).name == name
    with pytest.raises(ValueError, match="'mt_grpo' is already registered"):
        WEIGHTINGS.add("mt_grpo", MTGRPOWeighting)


def test_params_rules_match_constructor_keywords():
    for name in WEIGHTINGS:
        cls = WEIGHTINGS.get(name)
        keywords = {
            p
            for p, spec in inspect.signature(cls.__init__).parameters.items()
            if spec.kind == spec.KEYWORD_ONLY
        }
        assert keywords - {"task_names"} == {p.name for p in cls.PARAMS}, name


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda: make_weighting("mt-grpo-x", 3),
            ValueError,
            r"unknown weighting strategy 'mt-grpo-x'; valid names: fixed, mt_grpo, regularized",
        ),
        (
            lambda: make_weighting("mt_grpo", 3, lamb=0.1),
            ValueError,
            r"unknown parameter 'lamb' .*did you mean 'lam'.*lam \(a finite number in \[0, inf\)",
        ),
        (
            lambda: make_weighting("worst_case", 3, damping=0.1),
            ValueError,
            r"unknown parameter 'damping' for weighting strategy 'worst_case'; valid parameters: "
            r"step_size",
        ),
        (
            lambda: make_weighting("fixed", 3),
            ValueError,
            "weighting strategy 'fixed' needs parameter 'weights'",
        ),
        (
            lambda: make_weighting("mt_grpo", 3, lam=-0.1),
            ValueError,
            r"'lam' must be a finite number in \[0, inf\); got -0.1",
        ),
        (
            lambda: make_weighting("mt_grpo", 3, step_size=math.inf),
            ValueError,
            r"'step_size' must be a finite number in \(0, inf\) or None; got inf",
        ),
        (
            lambda: make_weighting("mt_grpo", 3, optimizer="rmsprop"),
            ValueError,
            r"'optimizer' must be one of 'sgd', 'adam'; got 'rmsprop'",
        ),
        (
            lambda: make_weighting("mt_grpo", 3, damping=2.0),
            ValueError,
            r"'damping' must be a finite number in \[0, 1\]; got 2.0",
        ),
        (
            lambda: make_weighting("mt_grpo", 3, reward_ema=1.0),
            ValueError,
            r"'reward_ema' must be a finite number in \[0, 1\); got 1.0",
        ),
        (
            lambda: make_weighting("mt_grpo", 3, improvement_clip=0.0),
            ValueError,
            r"'improvement_clip' must be a finite number in \(0, inf\) or None",
        ),
        (lambda: make_weighting("mt_grpo", 3, lam=True), ValueError, "'lam' must be"),
        (
            lambda: make_weighting("mt_grpo", 3, min_weight=0.4),
            ValueError,
            r"'min_weight' is 0.4, but 3 tasks cannot each keep 0.4 of the weight \(the floors "
            r"alone sum to 1.2 > 1\). Fix: min_weight <= 1/K = 0.333333",
        ),
        (
            lambda: make_weighting("sec", 4, min_weight=0.3),
            ValueError,
            r"sec parameter 'min_weight' is 0.3, but 4 tasks .* 1/K = 0.25",
        ),
        (
            lambda: make_weighting("regularized", 3, min_weight=-0.1),
            ValueError,
            r"'min_weight' must be a finite number in \[0, 1\]; got -0.1",
        ),
        (lambda: make_weighting("uniform", 0), ValueError, "num_tasks must be >= 1"),
        (lambda: make_weighting("uniform", 2.0), TypeError, "num_tasks must be an int"),
        (
            lambda: make_weighting("uniform", 2, task_names=["a"]),
            ValueError,
            "task_names has 1 names for num_tasks=2",
        ),
        (
            lambda: make_weighting("uniform", 2, task_names=["a", "a"]),
            ValueError,
            "task_names must be unique; repeated: a",
        ),
        (
            lambda: make_weighting("uniform", 2, task_names="ab"),
            TypeError,
            "task_names must be a sequence of strings",
        ),
    ],
)
def test_factory_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_stats_validation_messages():
    strategy = make_weighting("mt_grpo", 3, task_names=["countdown", "zebra", "arc"])
    with pytest.raises(
        ValueError,
        match=r"4 entries per field but this mt_grpo strategy "
        r"weights 3 tasks \(countdown, zebra, arc\)",
    ):
        strategy.update(full_stats([0.1] * 4, [0.0] * 4))
    with pytest.raises(
        ValueError,
        match=r"TaskStats.accuracy is infinite for present task\(s\) "
        r"'zebra'",
    ):
        strategy.update(full_stats([0.1, math.inf, 0.2], [0.0] * 3))
    with pytest.raises(ValueError, match=r"improvement is infinite .* 'countdown', 'arc'"):
        strategy.update(full_stats([0.1] * 3, [-math.inf, 0.0, math.inf]))
    with pytest.raises(TypeError, match="update\\(\\) takes a TaskStats; got dict"):
        strategy.update({"accuracy": [0.1] * 3})
    assert strategy.steps == 0  # nothing was applied by the failed calls


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"accuracy": [0.1, 0.2], "count": [1, 2, 3]},
            ValueError,
            r"one entry per task; got sizes \{'accuracy': 2, 'count': 3\}",
        ),
        ({"accuracy": [0.1, 0.2], "count": [1, -1]}, ValueError, "count must be >= 0"),
        ({"accuracy": [0.1, 0.2], "count": [1.5, 2]}, ValueError, "whole numbers of rollouts"),
        ({"accuracy": [0.1, 0.2], "count": ["a", "b"]}, TypeError, "count must be integers"),
        ({"accuracy": [[0.1, 0.2]], "count": [1, 2]}, ValueError, r"got shape \(1, 2\)"),
        ({"accuracy": ["x", 0.2], "count": [1, 2]}, TypeError, "sequence of numbers"),
        (
            {"accuracy": [0.1, 0.2], "count": [1, 2], "improvement": [0.1]},
            ValueError,
            "'improvement': 1",
        ),
    ],
)
def test_task_stats_validation(kwargs, error, message):
    with pytest.raises(error, match=message):
        TaskStats(**kwargs)


def test_task_stats_coerces_lists_and_whole_float_counts():
    stats = TaskStats(accuracy=[0.5, NAN], count=[3.0, 0.0], improvement=(0.1, 0.2))
    assert stats.accuracy.dtype == np.float64
    assert stats.count.dtype == np.int64
    np.testing.assert_array_equal(stats.count, [3, 0])
    assert isinstance(stats.improvement, np.ndarray)


def test_weights_are_copies():
    strategy = make_weighting("worst_case", 2)
    strategy.weights[0] = 5.0
    returned = strategy.update(full_stats([0.1, 0.2]))
    returned[:] = 0.0
    assert_on_simplex(strategy.weights, 2)


# ---------------------------------------------------------------------------------------------
# Simplex property


@settings(max_examples=60, deadline=None)
@given(
    num_tasks=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    step_size=st.sampled_from([1e-3, 0.5, 1e3, 1e100, 1e300]),
    absent_rate=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
)
def test_weights_stay_on_the_simplex(num_tasks, seed, step_size, absent_rate):
    rng = np.random.default_rng(seed)
    strategies = all_strategies(num_tasks, step_size=step_size)
    floor = 0.5 / num_tasks
    with_floor = [make_weighting("mt_grpo", num_tasks, step_size=step_size, min_weight=floor),
                  make_weighting("sec", num_tasks, min_weight=floor)]
    for _ in range(6):
        stats = random_stats(rng, num_tasks, absent_rate)
        for strategy in strategies:
            assert_on_simplex(strategy.update(stats), num_tasks)
        for strategy in with_floor:
            weights = strategy.update(stats)
            assert_on_simplex(weights, num_tasks)
            assert weights.min() >= floor * (1 - 1e-12)


@pytest.mark.parametrize("num_tasks", [1, 1000])
def test_simplex_at_the_extremes_of_k(num_tasks):
    rng = np.random.default_rng(num_tasks)
    for strategy in all_strategies(num_tasks, step_size=1e6):
        for _ in range(5):
            assert_on_simplex(strategy.update(random_stats(rng, num_tasks)), num_tasks)
        if num_tasks == 1:
            np.testing.assert_array_equal(strategy.weights, [1.0])


def test_extreme_signals_keep_weights_finite():
    strategy = make_weighting("mt_grpo", 3, lam=1e300, step_size=1e300, damping=1.0)
    for _ in range(5):
        weights = strategy.update(full_stats([1e300, -1e300, 0.0], [1e308, -1e308, 0.0]))
        assert_on_simplex(weights, 3)
        assert np.isfinite(strategy.logits).all()
    sec = make_weighting("sec", 2, temperature=1e-300)
    assert_on_simplex(sec.update(full_stats([0.0, 0.0], mean_abs_advantage=[1e300, 1.0])), 2)


# ---------------------------------------------------------------------------------------------
# state_dict


@pytest.mark.parametrize("index", range(7))
def test_state_dict_round_trip_continues_exactly(index):
    rng = np.random.default_rng(index)
    names = ["a", "b", "c", "d"]
    original = all_strategies(4)[index]
    for _ in range(5):
        original.update(random_stats(rng, 4))
    saved = json.loads(json.dumps(original.state_dict(), allow_nan=False))
    restored = make_weighting(original.name, 4, **original.params)
    restored.load_state_dict(saved)
    np.testing.assert_array_equal(restored.weights, original.weights)
    for _ in range(5):
        stats = random_stats(rng, 4)
        np.testing.assert_array_equal(restored.update(stats), original.update(stats))
    assert restored.state_dict() == original.state_dict()
    assert restored.steps == original.steps
    named = make_weighting(original.name, 4, task_names=names, **original.params)
    with pytest.raises(ValueError, match="task order"):
        named.load_state_dict({**saved, "task_names": ["d", "c", "b", "a"]})


def test_load_state_dict_refuses_a_mismatch():
    saved = make_weighting("mt_grpo", 3, lam=0.25).state_dict()
    with pytest.raises(
        ValueError,
        match=r"for strategy 'mt_grpo' over 3 tasks, but this is "
        r"'regularized' over 3 tasks",
    ):
        make_weighting("regularized", 3).load_state_dict(saved)
    with pytest.raises(
        ValueError,
        match=r"saved with mt_grpo parameter lam=0.25, but this "
        r"strategy has lam=0.5",
    ):
        make_weighting("mt_grpo", 3, lam=0.5).load_state_dict(saved)
    with pytest.raises(ValueError, match="over 3 tasks, but this is 'mt_grpo' over 4 tasks"):
        make_weighting("mt_grpo", 4).load_state_dict(saved)
    with pytest.raises(ValueError, match=r"missing keys \['steps'\]"):
        make_weighting("mt_grpo", 3).load_state_dict(
            {k: v for k, v in saved.items() if k != "steps"}
        )
    with pytest.raises(ValueError, match=r"state_dict\['logits'\] must be a list of 3 numbers"):
        make_weighting("mt_grpo", 3).load_state_dict({**saved, "logits": [0.0]})
    with pytest.raises(ValueError, match="is not a sgd state"):
        make_weighting("mt_grpo", 3).load_state_dict({**saved, "optimizer": {"kind": "adam"}})


def test_state_saved_before_min_weight_existed_still_resumes():
    strategy = make_weighting("mt_grpo", 3, lam=0.5, min_weight=0.1)
    for _ in range(3):
        strategy.update(full_stats([0.2, 0.4, 0.9], [0.01, 0.0, -0.01]))
    saved = strategy.state_dict()
    assert saved["params"]["min_weight"] == 0.1
    restored = make_weighting("mt_grpo", 3, lam=0.5, min_weight=0.1)
    restored.load_state_dict(json.loads(json.dumps(saved)))
    np.testing.assert_array_equal(restored.weights, strategy.weights)
    assert restored.weights.min() >= 0.1
    # a checkpoint written before the parameter existed: no key, which meant no floor
    old = {**saved, "params": {k: v for k, v in saved["params"].items() if k != "min_weight"}}
    make_weighting("mt_grpo", 3, lam=0.5).load_state_dict(old)
    with pytest.raises(ValueError, match=r"saved with mt_grpo parameter min_weight=0.0, but this "
                                         r"strategy has min_weight=0.1"):
        make_weighting("mt_grpo", 3, lam=0.5, min_weight=0.1).load_state_dict(old)


def test_failed_load_leaves_the_strategy_untouched():
    strategy = make_weighting("mt_grpo", 2, optimizer="adam")
    strategy.update(full_stats([0.2, 0.7], [0.01, 0.02]))
    before = strategy.state_dict()
    other = make_weighting("mt_grpo", 2, optimizer="adam")
    for _ in range(3):
        other.update(full_stats([0.9, 0.1], [0.05, -0.05]))
    broken = other.state_dict()
    broken["optimizer"]["exp_avg_sq"] = [0.0]  # wrong length: found after the other fields
    with pytest.raises(ValueError, match=r"state_dict\['exp_avg_sq'\] must be a list of 2"):
        strategy.load_state_dict(broken)
    assert strategy.state_dict() == before


# ---------------------------------------------------------------------------------------------
# Benchmark script


def test_benchmark_quick_run_reports_every_strategy():
    module = load_script("benchmarks/bench_weighting.py")
    rows = module.run(quick=True)
    assert {row["strategy"] for row in rows} == set(WEIGHTINGS.names())
    for row in rows:
        assert row["median_us"] > 0
        assert row["repeats"] > 0


def test_task_stats_from_rollouts_hand_values():
    # task 0: rollouts correct [1, 0, 1] -> J = 2/3, mean |A| = (0.5 + 1 + 0.5) / 3
    # task 1: absent -> NaN; task 2: [0] -> J = 0, |A| = 0.2
    stats = TaskStats.from_rollouts(
        np.array([0, 0, 2, 0]), np.array([True, False, False, True]), 3,
        abs_advantages=np.array([0.5, 1.0, 0.2, 0.5]),
    )
    np.testing.assert_allclose(stats.accuracy, [2 / 3, np.nan, 0.0])
    np.testing.assert_array_equal(stats.count, [3, 0, 1])
    np.testing.assert_allclose(stats.mean_abs_advantage, [2 / 3, np.nan, 0.2])
    assert stats.improvement is None


def test_improvement_by_task_sums_the_change_per_task():
    # task 0: (0.3 - 0.1) + (0.0 - 0.4) = -0.2 summed, -0.1 as a mean over its 2 samples;
    # task 1: 0.5 - 0.5 = 0; task 2 absent
    args = (np.array([0, 1, 0]), np.array([0.1, 0.5, 0.4]), np.array([0.3, 0.5, 0.0]), 3)
    np.testing.assert_allclose(improvement_by_task(*args, reduction="sum"),
                               [-0.2, 0.0, np.nan], atol=1e-12)
    np.testing.assert_allclose(improvement_by_task(*args), [-0.1, 0.0, np.nan], atol=1e-12)
    with pytest.raises(ValueError, match="'mean' \\(paper\\) or 'sum' \\(code\\)"):
        improvement_by_task(*args, reduction="max")


# ---------------------------------------------------------------------------------------------
# mt_grpo diagnostics


def test_improvement_share_by_hand():
    strategy = make_weighting("mt_grpo", 2, lam=0.5)
    assert strategy.diagnostics() == {}  # nothing before the first update
    # z = (½, ½); I = (0.1, −0.1) centres to ±0.1, size ½·0.1 + ½·0.1 = 0.1; λJ = (0.4, 0.1)
    # centres to ±0.15, size 0.15; share 0.1 / 0.25 = 0.4
    strategy.update(full_stats([0.8, 0.2], [0.1, -0.1]))
    share = strategy.diagnostics()["weighting/improvement_share"]
    assert abs(share - 0.4) <= 4 * np.finfo(np.float64).eps
    # the second update uses the weights the first one left: a loop reference
    z = strategy.weights
    improvement, reward = np.array([0.02, 0.0]), 0.5 * np.array([0.6, 0.3])
    strategy.update(full_stats([0.6, 0.3], improvement))

    def size(term):
        return sum(z[k] * abs(term[k] - sum(z[j] * term[j] for j in range(2))) for k in range(2))

    expected = size(improvement) / (size(improvement) + size(reward))
    share = strategy.diagnostics()["weighting/improvement_share"]
    assert abs(share - expected) <= 16 * np.finfo(np.float64).eps
    # equal rewards and equal improvements: nothing moves the weights, no share
    strategy.update(full_stats([0.5, 0.5], [0.01, 0.01]))
    assert math.isnan(strategy.diagnostics()["weighting/improvement_share"])


def test_gradient_parts_by_hand():
    # z = (½, ½); I = (0.1, −0.1) centres to ±0.1, times ½; λJ = (0.4, 0.1) centres to ±0.15
    part_i, part_j = gradient_parts([0.1, -0.1], [0.4, 0.1], [0.5, 0.5])
    eps = np.finfo(np.float64).eps
    np.testing.assert_allclose(part_i, [0.05, -0.05], rtol=0, atol=4 * eps)
    np.testing.assert_allclose(part_j, [0.075, -0.075], rtol=0, atol=4 * eps)
    # together they are the gradient the update steps against
    z, improvement, reward = np.array([0.2, 0.5, 0.3]), np.array([0.03, -0.01, 0.0]), \
        np.array([0.45, 0.05, 0.25])
    part_i, part_j = gradient_parts(improvement, reward, z)
    np.testing.assert_allclose(part_i + part_j, simplex_gradient(z, improvement + reward),
                               rtol=0, atol=8 * eps)
    assert improvement_sizes(improvement, reward, z) == (np.abs(part_i).sum(),
                                                         np.abs(part_j).sum())
    # a task without J: 0; the others centred on their own z-weighted mean (I: 0.05, λJ: 0.3)
    # and scaled by their own z; an unmeasured I counts 0
    part_i, part_j = gradient_parts([0.1, NAN, -0.1], [0.4, 0.2, NAN], [0.25, 0.25, 0.5])
    np.testing.assert_allclose(part_i, [0.0125, -0.0125, 0.0], rtol=0, atol=4 * eps)
    np.testing.assert_allclose(part_j, [0.025, -0.025, 0.0], rtol=0, atol=4 * eps)
    # equal values: nothing moves; no task observed: zeros
    for stays in (gradient_parts([0.01, 0.01], [0.3, 0.3], [0.7, 0.3]),
                  gradient_parts([0.1, 0.2], [NAN, NAN], [0.5, 0.5])):
        assert (stays[0] == 0).all()
        assert (stays[1] == 0).all()


def test_gradient_parts_sum_to_the_step_the_strategy_takes():
    # plain SGD from ξ = 0: the first step is ξ = −β g exactly (damping η ξ is 0 there); the
    # third task is absent, so never observed, and the second task's I was not measured
    strategy = make_weighting("mt_grpo", 3, lam=0.5, step_size=0.1, improvement_clip=0.05)
    strategy.update(TaskStats([0.8, 0.2, NAN], [8, 8, 0], [0.09, NAN, NAN]))
    gradient = -strategy.logits / 0.1
    assert gradient[2] == 0.0
    assert np.abs(gradient).max() > 0.01
    part_i, part_j = gradient_parts(*strategy.last_terms)
    scale = float(np.abs(gradient).max())
    np.testing.assert_allclose(part_i + part_j, gradient, rtol=0,
                               atol=16 * np.finfo(np.float64).eps * scale)
    # by hand: z = ⅓ each; I (clipped) = (0.05, 0) centres to ±0.025, times ⅓
    np.testing.assert_allclose(part_i, [0.025 / 3, -0.025 / 3, 0.0], rtol=0,
                               atol=8 * np.finfo(np.float64).eps)


def test_improvement_share_extremes_and_unobserved_tasks():
    reward_only = make_weighting("mt_grpo", 3, lam=0.5)
    reward_only.update(full_stats([0.9, 0.1, 0.5], [0.0, 0.0, 0.0]))
    assert reward_only.diagnostics()["weighting/improvement_share"] == 0.0
    improvement_only = make_weighting("mt_grpo", 3, lam=0.0)
    improvement_only.update(full_stats([0.9, 0.1, 0.5], [0.03, -0.01, 0.0]))
    assert improvement_only.diagnostics()["weighting/improvement_share"] == 1.0
    # a task never observed (no J) takes no part: the share of the other two, renormalised z
    partial = make_weighting("mt_grpo", 3, lam=0.5)
    partial.update(TaskStats([0.8, 0.2, NAN], [4, 4, 0], [0.1, -0.1, NAN]))
    share = partial.diagnostics()["weighting/improvement_share"]
    assert abs(share - 0.4) <= 4 * np.finfo(np.float64).eps
    # strategies without diagnostics say nothing
    assert make_weighting("regularized", 3).diagnostics() == {}


# ---------------------------------------------------------------------------------------------
# The held-out signal (task_weighting_signal: validation)


def _validation(accuracy, count=(8, 8), mean_abs_advantage=None) -> TaskStats:
    return TaskStats(accuracy=accuracy, count=list(count),
                     mean_abs_advantage=mean_abs_advantage)


def test_validation_signal_by_hand():
    signal = ValidationSignal(2)
    assert signal.task_stats() is None
    assert signal.last_step is None
    signal.observe(0, _validation([0.5, 0.25], mean_abs_advantage=[0.3, 0.1]))
    first = signal.task_stats()
    np.testing.assert_array_equal(first.accuracy, [0.5, 0.25])
    np.testing.assert_array_equal(first.count, [8, 8])
    assert np.isnan(first.improvement).all()  # nothing to compare with yet
    np.testing.assert_array_equal(first.mean_abs_advantage, [0.3, 0.1])
    signal.observe(4, _validation([0.75, 0.25]))
    second = signal.task_stats()
    assert signal.last_step == 4
    # I_k = (a_k(4) − a_k(0)) / (4 − 0)
    np.testing.assert_allclose(second.improvement, [0.25 / 4, 0.0], **TIGHT)
    np.testing.assert_array_equal(second.accuracy, [0.75, 0.25])
    assert second.mean_abs_advantage is None
    # a task the last (or the previous) evaluation did not score has no improvement
    signal.observe(6, _validation([NAN, 0.5], count=(0, 8)))
    third = signal.task_stats()
    assert np.isnan(third.improvement[0])
    np.testing.assert_allclose(third.improvement[1], (0.5 - 0.25) / 2, **TIGHT)
    signal.observe(9, _validation([0.5, 0.5]))
    assert np.isnan(signal.task_stats().improvement[0])


def test_mt_grpo_reads_the_validation_signal_by_hand():
    signal = ValidationSignal(2)
    signal.observe(0, _validation([0.5, 0.25]))
    signal.observe(4, _validation([0.75, 0.25]))
    strategy = make_weighting("mt_grpo", 2, lam=0.5, damping=0.0)  # sgd, β = 0.5
    weights = strategy.update(signal.task_stats())
    # s = I + λJ = [0.0625 + 0.375, 0 + 0.125]; g = z (s − z·s) with z = [½, ½]
    s = np.array([0.0625 + 0.375, 0.125])
    g = 0.5 * (s - s.mean())
    np.testing.assert_allclose(strategy.logits, -0.5 * g, **TIGHT)
    np.testing.assert_allclose(weights, softmax(-0.5 * g), **TIGHT)
    assert weights[1] > weights[0]  # the task that lags on held-out problems gains weight
    # until the next evaluation every step reads the same signal again
    z = softmax(-0.5 * g)
    g2 = z * (s - z @ s)
    np.testing.assert_allclose(strategy.update(signal.task_stats()),
                               softmax(-0.5 * g - 0.5 * g2), **TIGHT)


def test_a_task_scoring_zero_on_validation_gets_the_formula_weight():
    signal = ValidationSignal(2)
    signal.observe(0, _validation([0.8, 0.0]))
    strategy = make_weighting("worst_case", 2)  # β = 0.5
    weights = strategy.update(signal.task_stats())
    # g = ½ (J − 0.4) = [0.2, −0.2]; ξ = −β g = [−0.1, 0.1]
    np.testing.assert_allclose(weights[1], 1.0 / (1.0 + math.exp(-0.2)), **TIGHT)


def test_sec_reads_the_validation_advantages():
    signal = ValidationSignal(2)
    signal.observe(0, _validation([0.5, 0.5], mean_abs_advantage=[0.4, 0.0]))
    strategy = make_weighting("sec", 2)  # α = 0.5, τ = 0.2
    weights = strategy.update(signal.task_stats())
    np.testing.assert_allclose(weights, softmax(np.array([0.2, 0.0]) / 0.2), **TIGHT)


def test_validation_signal_state_round_trip_and_errors():
    signal = ValidationSignal(2)
    fresh = ValidationSignal(2)
    fresh.load_state_dict(json.loads(json.dumps(signal.state_dict())))
    assert fresh.task_stats() is None
    signal.observe(0, _validation([0.5, NAN], count=(8, 0), mean_abs_advantage=[0.2, NAN]))
    signal.observe(3, _validation([0.75, 0.5]))
    fresh.load_state_dict(json.loads(json.dumps(signal.state_dict())))
    ours, theirs = signal.task_stats(), fresh.task_stats()
    assert fresh.last_step == 3
    for field in ("accuracy", "count", "improvement"):
        np.testing.assert_array_equal(getattr(theirs, field), getattr(ours, field))
    assert theirs.mean_abs_advantage is None
    with pytest.raises(ValueError, match="in step order: step 3 after step 3"):
        signal.observe(3, _validation([0.5, 0.5]))
    with pytest.raises(ValueError, match="has 3 tasks but the weights cover 2"):
        signal.observe(4, _validation([0.5, 0.5, 0.5], count=(1, 1, 1)))
    with pytest.raises(ValueError, match="not a validation-signal state over 3 tasks"):
        ValidationSignal(3).load_state_dict(signal.state_dict())


def test_which_strategies_read_task_stats():
    assert TASK_WEIGHTING_SIGNALS == ("train", "validation")
    assert not reads_task_stats("uniform")
    assert not reads_task_stats("fixed")
    assert all(reads_task_stats(n) for n in ("mt_grpo", "worst_case", "regularized", "sec"))
