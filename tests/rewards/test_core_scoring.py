"""Scoring a batch: routed vs. None-returning forms, channels, value types, slicing, helpers."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from mtgrpo.algo.advantages import compute_advantages
from mtgrpo.rewards import (
    RewardFunction,
    RewardScores,
    RewardSuite,
    conditioned,
    countdown_reward,
    format_reward,
    per_completion,
)


def assert_same_matrix(actual: np.ndarray, expected) -> None:
    """Equal bit for bit, NaN where ``expected`` has NaN, and of its dtype (scores are numpy)."""
    expected = np.asarray(expected)
    assert isinstance(actual, np.ndarray), type(actual)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    np.testing.assert_array_equal(actual, expected)


def batch(tasks: list[str]) -> dict:
    """A batch whose every input carries its row index, so a mis-sliced call is detectable."""
    n = len(tasks)
    return {
        "prompts": [f"p{i}" for i in range(n)],
        "completions": [f"c{i}" + "x" * (i % 3) for i in range(n)],
        "completion_ids": [[i, i] for i in range(n)],
        "columns": {"answer": [f"a{i}" for i in range(n)], "task": list(tasks)},
        "tasks": list(tasks),
    }


# Task logic shared by the two forms of seed 000.
def math_logic(completion: str) -> float:
    return 1.0 if len(completion) % 2 else -1.0


def code_logic(completion: str) -> float:
    return 0.25 * len(completion)


def math_reward_func(prompts, completions, task, **kwargs):
    return [math_logic(c) if t == "math" else None for c, t in zip(completions, task, strict=True)]


def coding_reward_func(prompts, completions, task, **kwargs):
    return [code_logic(c) if t == "code" else None for c, t in zip(completions, task, strict=True)]


def math_reward(prompts, completions, **kwargs):
    return [math_logic(c) for c in completions]


def code_reward(prompts, completions, **kwargs):
    return [code_logic(c) for c in completions]


def test_seed_000_none_form_and_routed_form_give_the_same_matrix():
    tasks = ["math", "code", "math", "code"]
    plain = RewardSuite.from_user([math_reward_func, coding_reward_func])
    routed = RewardSuite.from_user({"math": [math_reward], "code": code_reward})
    a = plain.score(**batch(tasks))
    b = routed.score(**batch(tasks))
    # completions c0, c1x, c2xx, c3: math rows 0 (len 2 -> -1) and 2 (len 4 -> -1);
    # code rows 1 (len 3 -> 0.75) and 3 (len 2 -> 0.5).
    nan = math.nan
    expected = torch.tensor([[-1.0, nan], [nan, 0.75], [-1.0, nan], [nan, 0.5]],
                            dtype=torch.float64)
    assert_same_matrix(a.values, expected)
    assert_same_matrix(b.values, expected)
    assert a.values.dtype == np.float64  # the reward functions' floats, not rounded
    assert np.array_equal(a.applied, ~expected.isnan().numpy())
    assert a.channel_names == ["math_reward_func", "coding_reward_func"]


@pytest.mark.parametrize("seed", range(8))
def test_routed_and_plain_forms_match_a_loop_reference_on_random_batches(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 40)
    tasks = [rng.choice(["math", "code", "chat"]) for _ in range(n)]
    # 'chat' rows may be all-NaN (len_or_none returns None): keep them to compare them too.
    routed = RewardSuite.from_user(
        {"math": [math_reward], "code": [code_reward], "*": [per_completion(len_or_none)]},
        on_unscorable="zero_advantage",
    )
    plain = RewardSuite.from_user(
        [math_reward_func, coding_reward_func, per_completion(len_or_none)],
        on_unscorable="zero_advantage",
    )
    data = batch(tasks)
    expected = torch.full((n, 3), math.nan, dtype=torch.float64)  # [N, R], row by row
    for i, (task, completion) in enumerate(zip(tasks, data["completions"], strict=True)):
        if task == "math":
            expected[i, 0] = math_logic(completion)
        if task == "code":
            expected[i, 1] = code_logic(completion)
        value = len_or_none(completion, data["prompts"][i])
        expected[i, 2] = math.nan if value is None else value
    assert_same_matrix(routed.score(**data).values, expected)
    assert_same_matrix(plain.score(**batch(tasks)).values, expected)


def len_or_none(completion, prompt):
    return None if completion.endswith("x") else float(len(completion))


def test_routed_function_is_called_only_on_its_tasks_rows_with_aligned_inputs():
    calls: list[list[int]] = []

    def code_only(prompts, completions, completion_ids, answer, task, **kwargs):
        rows = [int(p[1:]) for p in prompts]
        calls.append(rows)
        # Every input must be sliced to the same rows.
        assert [int(c[1:].rstrip("x")) for c in completions] == rows
        assert [ids[0] for ids in completion_ids] == rows
        assert [int(a[1:]) for a in answer] == rows
        assert task == ["code"] * len(rows)
        return [1.0] * len(rows)

    never: list[int] = []

    def poetry_only(prompts, completions, **kwargs):
        never.append(len(prompts))
        return [0.0] * len(prompts)

    suite = RewardSuite.from_user({"code": code_only, "poetry": poetry_only, "math": math_reward})
    tasks = ["math", "code", "code", "math", "math", "code"]
    scores = suite.score(**batch(tasks))
    assert calls == [[1, 2, 5]]
    assert never == []  # no poetry row in the batch: not called at all
    assert np.array_equal(scores.applied[:, 0], [t == "code" for t in tasks])
    assert scores.applied[:, 1].sum() == 0


def test_a_function_under_several_tasks_is_called_once_on_the_union():
    calls = []

    def shared(prompts, completions, task, **kwargs):
        calls.append(list(task))
        return [1.0] * len(task)

    suite = RewardSuite.from_user({"math": [shared], "code": [shared], "chat": [code_reward]})
    suite.score(**batch(["chat", "math", "code", "chat", "math"]))
    assert calls == [["math", "code", "math"]]


def test_extra_kwargs_pass_through_unchanged_and_task_column_is_added():
    state = object()
    seen = []

    def reward(prompts, completions, completion_ids, task, trainer_state, log_metric, **kwargs):
        seen.append((trainer_state, log_metric, task, completion_ids, kwargs))
        return [0.5] * len(prompts)

    suite = RewardSuite.from_user({"math": reward, "code": reward})
    suite.score(
        prompts=["a", "b"],
        completions=["x", "y"],
        completion_ids=None,
        columns={"answer": ["1", "2"]},
        tasks=["math", "code"],
        extra={"trainer_state": state, "log_metric": print},
    )
    assert len(seen) == 1
    trainer_state, log_metric, task, completion_ids, kwargs = seen[0]
    assert trainer_state is state
    assert log_metric is print
    assert task == ["math", "code"]  # added from `tasks` because the columns had none
    assert completion_ids is None
    assert kwargs == {"answer": ["1", "2"]}


def test_a_function_cannot_corrupt_anothers_inputs():
    def greedy(prompts, completions, **kwargs):
        completions.reverse()
        return [0.0] * len(completions)

    suite = RewardSuite.from_user([greedy, code_reward])
    scores = suite.score(**batch(["t", "t", "t"]))
    assert scores.values[:, 1].tolist() == [code_logic(c) for c in ["c0", "c1x", "c2xx"]]


def test_seed_002_signatures_without_prompts_read_their_columns():
    def format_reward_func(completions, target, **kwargs):
        return [float(c.endswith("</answer>")) for c in completions]

    def equation_reward_func(completions, target, nums, **kwargs):
        return [float(sum(n) == int(t)) for n, t in zip(nums, target, strict=True)]

    suite = RewardSuite.from_user([format_reward_func, equation_reward_func])
    scores = suite.score(
        prompts=["p", "p"],
        completions=["<answer>1+2</answer>", "3"],
        completion_ids=None,
        columns={"target": ["3", "4"], "nums": [[1, 2], [1, 2]]},
        tasks=["countdown", "countdown"],
    )
    assert scores.values.tolist() == [[1.0, 1.0], [0.0, 0.0]]


def test_empty_batch_calls_nothing():
    calls = []

    def reward(prompts, completions, **kwargs):
        calls.append(1)
        return []

    scores = RewardSuite.from_user([reward, code_reward]).score(**batch([]))
    assert scores.values.shape == (0, 2)
    assert calls == []


def test_multi_channel_tuples_dicts_arrays_and_none():
    def judge(prompts, completions, **kwargs):
        return [
            (1.0, 0.5, None),
            {"action": 0.0, "politeness": 0.25, "compliance": True},
            None,
            np.array([2.0, 3.0, 4.0]),
            [np.float32(0.5), torch.tensor(1.5), 0],
        ]

    rf = RewardFunction(judge, channels=("compliance", "politeness", "action"))
    scores = RewardSuite.from_user([rf, code_reward]).score(**batch(["t"] * 5))
    nan = math.nan
    expected = torch.tensor(
        [
            [1.0, 0.5, nan, code_logic("c0")],
            [1.0, 0.25, 0.0, code_logic("c1x")],
            [nan, nan, nan, code_logic("c2xx")],
            [2.0, 3.0, 4.0, code_logic("c3")],
            [0.5, 1.5, 0.0, code_logic("c4x")],
        ], dtype=torch.float64,
    )
    assert_same_matrix(scores.values, expected)
    assert scores.channel_names == [
        "judge/compliance",
        "judge/politeness",
        "judge/action",
        "code_reward",
    ]


def test_multi_channel_batched_array_output():
    def judge(prompts, completions, **kwargs):
        return torch.arange(6, dtype=torch.float64).reshape(3, 2)

    rf = RewardFunction(judge, channels=("a", "b"))
    scores = RewardSuite.from_user(rf).score(**batch(["t"] * 3))
    assert_same_matrix(scores.values, torch.arange(6, dtype=torch.float64).reshape(3, 2))


def test_per_completion_adapter_scores_seed_003_style_functions():
    def reward_fn(completion, prompt):
        return (float("refund" in completion), float(len(prompt)), 1.0)

    rf = per_completion(reward_fn, channels=("compliance", "politeness", "action"))
    scores = RewardSuite.from_user(rf).score(
        prompts=["ab", [{"role": "user", "content": "x"}], {"prompt": "p", "gold": "g"}],
        completions=["no refund", "ok", "refund"],
        completion_ids=None,
        columns={},
        tasks=["fintech"] * 3,
    )
    # len(prompt): a 2-char string, a 1-message chat list, a 2-key dict.
    expected = torch.tensor([[1.0, 2.0, 1.0], [0.0, 1.0, 1.0], [1.0, 2.0, 1.0]],
                            dtype=torch.float64)
    assert_same_matrix(scores.values, expected)


def test_accepted_value_types_and_containers():
    values = [True, False, 3, np.float32(0.5), np.int64(2), np.bool_(True), torch.tensor(0.25)]
    values += [np.array(1.5), None, -2.0]

    def typed(prompts, completions, **kwargs):
        return tuple(values)

    def as_array(prompts, completions, **kwargs):
        return np.arange(len(completions), dtype=np.float16)

    def as_tensor(prompts, completions, **kwargs):
        return torch.ones(len(completions), dtype=torch.bool)

    scores = RewardSuite.from_user([typed, as_array, as_tensor]).score(**batch(["t"] * 10))
    expected_typed = [1.0, 0.0, 3.0, 0.5, 2.0, 1.0, 0.25, 1.5, math.nan, -2.0]
    assert_same_matrix(scores.values[:, 0], torch.tensor(expected_typed, dtype=torch.float64))
    assert_same_matrix(scores.values[:, 1], torch.arange(10, dtype=torch.float64))
    assert_same_matrix(scores.values[:, 2], torch.ones(10, dtype=torch.float64))


def test_zero_advantage_keeps_unscorable_rows_all_nan():
    suite = RewardSuite.from_user([math_reward_func], on_unscorable="zero_advantage")
    scores = suite.score(**batch(["math", "code", "math", "math"]))
    assert scores.unscorable.tolist() == [False, True, False, False]
    assert np.isnan(scores.values[1]).all()
    result = compute_advantages(scores.values, 2, on_unscorable="zero_advantage")
    assert result.advantages[1].item() == 0.0
    assert result.unscorable.tolist() == [False, True, False, False]


def test_suite_gates_feed_compute_advantages():
    def fmt(prompts, completions, **kwargs):
        return [1.0, 0.0, 1.0, 1.0]

    def correct(prompts, completions, **kwargs):
        return [1.0, 1.0, 0.0, 1.0]

    suite = RewardSuite.from_user([conditioned(correct, on="fmt"), fmt])
    scores = suite.score(**batch(["t"] * 4))
    gated = compute_advantages(scores.values, 4, gates=suite.gates, aggregation="na")
    # zero_fill: row 1 fails the format gate, so its 'correct' reward 1 becomes 0 and the
    # gated channel equals the ungated rewards [1, 0, 0, 1].
    manual = scores.values.copy()
    manual[1, 0] = 0.0
    plain = compute_advantages(manual, 4, aggregation="na")
    torch.testing.assert_close(gated.advantages, plain.advantages, rtol=0.0, atol=1e-7)


# --- RewardScores helpers -----------------------------------------------------------------


def random_scores(seed: int):
    gen = torch.Generator().manual_seed(seed)
    n, r = (
        int(torch.randint(2, 30, (1,), generator=gen)),
        int(torch.randint(1, 5, (1,), generator=gen)),
    )
    values = torch.randn(n, r, generator=gen)
    values[torch.rand(n, r, generator=gen) < 0.4] = math.nan
    tasks = [["a", "b", "c"][int(i)] for i in torch.randint(0, 3, (n,), generator=gen)]
    names = [f"ch{k}" for k in range(r)]
    return RewardScores(values.numpy(), ~values.isnan().numpy(), names, tasks)


@pytest.mark.parametrize("seed", range(6))
def test_channel_means_and_metrics_match_a_loop_reference(seed):
    scores = random_scores(seed)
    n = scores.values.shape[0]
    metrics = scores.metrics()
    for k, name in enumerate(scores.channel_names):
        present = [scores.values[i, k].item() for i in range(n) if scores.applied[i, k]]
        mean = sum(present) / len(present) if present else math.nan
        std = float(np.std(present, ddof=1)) if len(present) > 1 else math.nan
        assert scores.channel_means()[name] == pytest.approx(mean, rel=1e-6, nan_ok=True)
        assert metrics[f"rewards/{name}/mean"] == pytest.approx(mean, rel=1e-6, nan_ok=True)
        assert metrics[f"rewards/{name}/std"] == pytest.approx(std, rel=1e-6, nan_ok=True)
        assert metrics[f"rewards/{name}/applied"] == len(present) / n
        for task, means in scores.per_task_means().items():
            rows = [i for i in range(n) if scores.tasks[i] == task and scores.applied[i, k]]
            vals = [scores.values[i, k].item() for i in rows]
            expected = sum(vals) / len(vals) if vals else math.nan
            assert means[name] == pytest.approx(expected, rel=1e-6, nan_ok=True)


def test_as_lists_and_unscorable():
    scores = random_scores(3)
    lists = scores.as_lists()
    for i, row in enumerate(lists):
        for k, value in enumerate(row):
            if scores.applied[i, k]:
                assert value == scores.values[i, k].item()
            else:
                assert value is None
        assert scores.unscorable[i].item() == all(v is None for v in row)


def test_built_in_verifiers_route_through_a_suite():
    done = "8 * 2 = 16, minus 1.</think>\n<answer>8 * 2 - 1</answer>"
    suite = RewardSuite.from_user(
        {"countdown": [countdown_reward], "*": [conditioned(format_reward, on="countdown_reward")]}
    )
    scores = suite.score(
        prompts=["q1", "q2", "q3"],
        completions=[done, done, "no tags"],
        completion_ids=None,
        columns={"target": [15, 16, None], "nums": [[8, 2, 1], [8, 2, 1], None]},
        tasks=["countdown", "countdown", "chat"],
    )
    # Row 0 is correct, row 1 has the wrong target, row 2 is not a Countdown row (not routed).
    nan = math.nan
    assert_same_matrix(scores.values, torch.tensor([[1.0, 1.0], [0.0, 1.0], [nan, 0.0]],
                                                   dtype=torch.float64))
    assert [(gate.channel, gate.on) for gate in suite.gates] == [(1, 0)]
