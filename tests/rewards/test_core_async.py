"""Async reward functions: awaited concurrently, also from inside a running event loop."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings

import numpy as np
import pytest

from mtgrpo.rewards import RewardError, RewardSuite, per_completion

SLEEP_S = 0.2


async def slow_one(prompts, completions, **kwargs):
    await asyncio.sleep(SLEEP_S)
    return [1.0] * len(completions)


async def slow_two(prompts, completions, **kwargs):
    await asyncio.sleep(SLEEP_S)
    return [2.0] * len(completions)


def sync_reward(prompts, completions, **kwargs):
    return [3.0] * len(completions)


def score(suite: RewardSuite, n: int = 4, **extra):
    return suite.score(
        prompts=["p"] * n,
        completions=[f"c{i}" for i in range(n)],
        completion_ids=None,
        columns={},
        tasks=["t"] * n,
        extra=extra or None,
    )


def test_async_functions_run_concurrently():
    suite = RewardSuite.from_user([slow_one, sync_reward, slow_two])
    score(suite)  # start the private loop outside the timed call
    start = time.perf_counter()
    scores = score(suite)
    elapsed = time.perf_counter() - start
    # Sequential awaiting would take 2 * 0.2 s; concurrent takes one sleep plus overhead.
    assert elapsed < 0.35, elapsed
    assert np.array_equal(scores.values, [[1.0, 3.0, 2.0]] * 4)


def test_async_functions_work_inside_a_running_event_loop():
    suite = RewardSuite.from_user([slow_one, slow_two, sync_reward])

    async def notebook_cell():
        # As in Jupyter: a loop is running in this thread and the user calls score() directly.
        outer = asyncio.get_running_loop()
        start = time.perf_counter()
        scores = score(suite)
        return outer, scores, time.perf_counter() - start

    outer, scores, elapsed = asyncio.run(notebook_cell())
    assert np.array_equal(scores.values, [[1.0, 2.0, 3.0]] * 4)
    assert elapsed < 0.35 + 0.2  # concurrent, plus the loop start on a first call
    assert outer.is_closed()


def test_async_functions_reuse_one_private_loop_across_calls():
    loops = []

    async def record(prompts, completions, **kwargs):
        loops.append((asyncio.get_running_loop(), threading.current_thread()))
        return [0.0] * len(completions)

    suite = RewardSuite.from_user(record)
    score(suite)
    score(suite)
    assert len(loops) == 2
    assert loops[0][0] is loops[1][0]  # clients bound to the loop keep working
    assert loops[0][1] is not threading.current_thread()


def test_async_per_completion_gathers_over_the_batch():
    async def judge(completion, prompt):
        await asyncio.sleep(0.1)
        return (float(len(completion)), 1.0)

    suite = RewardSuite.from_user(per_completion(judge, channels=("length", "ok")))
    score(suite, n=1)
    start = time.perf_counter()
    scores = score(suite, n=6)
    assert time.perf_counter() - start < 0.3  # 6 sequential sleeps would take 0.6 s
    assert scores.values[:, 0].tolist() == [2.0] * 6
    assert scores.channel_names == ["judge/length", "judge/ok"]


def test_awaitable_returned_by_a_sync_callable_is_awaited():
    def wrapper(prompts, completions, **kwargs):
        return slow_one(prompts, completions)

    scores = score(RewardSuite.from_user(wrapper), n=2)
    assert scores.values.tolist() == [[1.0], [1.0]]


def test_extra_kwargs_reach_async_functions():
    state = object()
    seen = []

    async def reward(prompts, completions, trainer_state, **kwargs):
        seen.append(trainer_state)
        return [0.0] * len(completions)

    score(RewardSuite.from_user(reward), trainer_state=state)
    assert seen == [state]


def test_async_wrong_count_and_raising_async_function():
    async def short(prompts, completions, **kwargs):
        return [1.0]

    with pytest.raises(RewardError, match=r"'short' returned 1 rewards for 4 completions"):
        score(RewardSuite.from_user([sync_reward, short]))

    async def flaky(prompts, completions, **kwargs):
        await asyncio.sleep(0)
        if "c2" in completions:
            raise ConnectionError("judge unreachable")
        return [0.0] * len(completions)

    with pytest.raises(
        RewardError,
        match=r"'flaky' raised ConnectionError: judge unreachable .* first failing sample: "
        r"row 2 \(task 't'\)",
    ) as info:
        score(RewardSuite.from_user([slow_one, flaky]))
    assert isinstance(info.value.__cause__, ConnectionError)


def test_sync_failure_closes_pending_coroutines():
    def broken(prompts, completions, **kwargs):
        raise RuntimeError("broken")

    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        with pytest.raises(RewardError, match="'broken' raised RuntimeError"):
            score(RewardSuite.from_user([slow_one, broken]), n=1)
        gc.collect()  # an unclosed coroutine warns "was never awaited" when collected
    assert not [r for r in records if "never awaited" in str(r.message)]
