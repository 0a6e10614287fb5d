"""A time limit on every call of a reward function (issue 38): a call past it does not apply
to its completions (NaN), is counted in ``rewards/<name>/timeouts``, and costs no more than
the limit, whatever the function does to resist."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from mtgrpo.rewards import RewardError, RewardFunction, RewardSuite
from mtgrpo.rewards.deadline import call_with_deadline

LIMIT = 0.3
SLACK = 1.0  # scheduling on a loaded 2-core machine


def sleeps(prompts, completions, **kwargs):
    time.sleep(3600)


def spins_and_swallows(prompts, completions, **kwargs):
    try:
        while True:
            pass
    except BaseException:  # the first interrupt is swallowed; the next one stops it
        while True:
            pass


async def awaits_forever(prompts, completions, **kwargs):
    await asyncio.sleep(3600)


def half(prompts, completions, **kwargs):
    return [0.5] * len(completions)


def _score(suite: RewardSuite, rows: int = 4):
    started = time.monotonic()
    scores = suite.score(["p"] * rows, ["c"] * rows, None, {}, ["t"] * rows)
    return scores, time.monotonic() - started


@pytest.mark.parametrize("hung", [sleeps, spins_and_swallows, awaits_forever],
                         ids=["sleep", "swallows-the-interrupt", "async"])  # fmt: skip
def test_a_hung_function_costs_its_limit_and_is_counted(hung, caplog) -> None:
    suite = RewardSuite.from_user([hung, half], timeout=LIMIT)
    scores, seconds = _score(suite)
    assert seconds < LIMIT + SLACK
    values = scores.values
    assert np.isnan(values[:, 0]).all()  # the hung channel does not apply
    assert (values[:, 1] == 0.5).all()  # the others are scored as usual
    assert scores.metrics()[f"rewards/{hung.__name__}/timeouts"] == 4
    assert suite.pop_timeouts() == {f"rewards/{hung.__name__}/timeouts": 4,
                                    "rewards/half/timeouts": 0}  # fmt: skip
    assert suite.pop_timeouts()[f"rewards/{hung.__name__}/timeouts"] == 0  # counted once
    assert f"'{hung.__name__}' ran past its 0.3 s time limit" in caplog.text


def test_a_function_s_own_limit_wins_and_none_means_no_limit() -> None:
    def slowish(prompts, completions, **kwargs):
        time.sleep(0.5)
        return [1.0] * len(completions)

    patient = RewardSuite.from_user([RewardFunction(slowish, timeout=5.0)], timeout=0.1)
    assert _score(patient)[0].values.tolist() == [[1.0]] * 4
    unlimited = RewardSuite.from_user([slowish], timeout=None)
    assert _score(unlimited)[0].values.tolist() == [[1.0]] * 4
    strict = RewardSuite.from_user([RewardFunction(slowish, timeout=0.1)], timeout=None,
                                   on_unscorable="zero_advantage")  # fmt: skip
    assert np.isnan(_score(strict)[0].values).all()


def test_the_only_reward_timing_out_is_unscorable_as_the_user_chose() -> None:
    suite = RewardSuite.from_user([sleeps], timeout=LIMIT)
    with pytest.raises(RewardError, match="no reward applies to row 0"):
        _score(suite)


def test_off_the_main_thread_the_call_is_abandoned_at_the_limit() -> None:
    outcome: list = []
    worker = threading.Thread(target=lambda: outcome.append(
        call_with_deadline(lambda: time.sleep(3600), LIMIT)))  # fmt: skip
    started = time.monotonic()
    worker.start()
    worker.join()
    assert outcome == [(False, None)]
    assert time.monotonic() - started < LIMIT + SLACK


def test_fast_calls_and_their_errors_are_unchanged() -> None:
    assert call_with_deadline(lambda: 7, LIMIT) == (True, 7)
    with pytest.raises(ZeroDivisionError):
        call_with_deadline(lambda: 1 / 0, LIMIT)
    for _ in range(200):  # a deadline that falls as the call ends never escapes
        assert call_with_deadline(lambda: sum(range(2000)), 0.0005)[1] in (None, 1999000)


@pytest.mark.parametrize("value", [0, -1, "10", True])
def test_invalid_limits_are_refused_with_the_fix(value) -> None:
    with pytest.raises(ValueError, match="must be a positive number of seconds"):
        RewardSuite.from_user([half], timeout=value)
    with pytest.raises(ValueError, match="must be a positive number of seconds"):
        RewardFunction(half, timeout=value)
