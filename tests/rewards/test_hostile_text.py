"""Model text that tries to crash or stall scoring (issue 12, classes: unclosed tags at
1 MB, huge numbers, a verifier that raises).

Every built-in and task-suite reward is called on each hostile completion and must return
one value in its range without raising; an exception inside a built-in verifier must
score 0 and be counted (``rewards/<name>/errors``) while a user's function still fails
loudly. A quadratic extractor turns these 1 MB texts into minutes of work, so the
``timeout`` marks fail such a regression without a timed assertion. The texts and the
table of rewards are ``benchmarks/bench_hostile_text.py``'s, which measures their cost.
"""

from __future__ import annotations

from typing import Any

import pytest

import mtgrpo.rewards.verifiers.format as format_module
from mtgrpo.rewards import RewardError, RewardSuite
from mtgrpo.rewards.guard import collect_scoring_errors
from mtgrpo.rewards.verifiers import MAX_TEXT_CHARS, countdown_reward, format_reward, length_reward
from mtgrpo.tasks.families import parse_int_sequence
from mtgrpo.tasks.prompts import extract_boxed, extract_tagged
from mtgrpo.tasks.rewards import task_reward
from script_loader import load_script

bench = load_script("benchmarks/bench_hostile_text.py")
HOSTILE, HUGE = bench.HOSTILE, bench.HUGE
REWARDS = bench.rewards()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(REWARDS))
def test_every_builtin_reward_scores_hostile_text(name: str) -> None:
    function, row = REWARDS[name]  # every reward here has its values in [0, 1]
    texts = list(HOSTILE.values())
    columns = {key: [value] * len(texts) for key, value in row.items()}
    with collect_scoring_errors() as failed:
        scores = function(None, texts, **columns)
    assert len(scores) == len(texts)
    for score in scores:
        values = score if isinstance(score, tuple) else (score,)
        assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in values), (name, scores)
    assert failed == []  # none of these texts makes a verifier raise


@pytest.mark.timeout(60)
def test_extractors_are_linear_on_unclosed_tags() -> None:
    assert extract_tagged(HOSTILE["unclosed answer tag"]) is None
    assert extract_tagged(HOSTILE["answer tag storm"]) is None
    assert extract_boxed(HOSTILE["unclosed boxed"]) is None
    assert extract_boxed(HOSTILE["boxed storm"]) is None
    assert extract_tagged("x" * (MAX_TEXT_CHARS + 1) + "<answer>1</answer>") is None  # capped
    assert extract_tagged(HOSTILE["huge number answer"]) == HUGE


def test_huge_numbers_do_not_crash_the_task_rewards() -> None:
    assert parse_int_sequence(f"0 {HUGE} 1") is None  # a cell past the digit cap
    assert parse_int_sequence("0 " + "1 " * 20_000) is None  # a grid past the cell cap
    assert parse_int_sequence("[0, 12, 3]") == [0, 12, 3]
    arc = task_reward("arc_1d")
    scores = arc(None, [f"<answer>{HUGE}</answer>", "<answer>0 1 2</answer>"],
                 answer=["0 1 2"] * 2, metadata=[{}, {}])  # fmt: skip
    assert scores == [0.1, 1.0]  # an answer in the tag, wrong: "formatted"


def test_a_verifier_that_raises_scores_zero_and_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(text: str) -> None:
        if "boom" in text:
            raise RecursionError("a parser bug met a pathological text")

    monkeypatch.setattr(format_module, "parse_think_answer", broken)
    suite = RewardSuite.from_user([format_reward, length_reward(target_length=4, tolerance=4)])
    scores = suite.score([""] * 3, ["boom", "fine", "boom"], None, {}, ["t"] * 3)
    assert scores.values[:, 0].tolist() == [0.0, 0.0, 0.0]
    assert scores.errors[:, 0].tolist() == [True, False, True]
    assert not scores.errors[:, 1].any()
    metrics = scores.metrics()
    assert metrics["rewards/format_reward/errors"] == 2
    assert metrics["rewards/length_reward/errors"] == 0


def test_a_users_own_function_still_fails_loudly() -> None:
    def mine(prompts: list, completions: list, **kwargs: Any) -> list[float]:
        return [float(int(c)) for c in completions]  # int() of model text: a bug

    suite = RewardSuite.from_user([mine])
    with pytest.raises(RewardError, match=r"reward function 'mine' raised ValueError.*row 1"):
        suite.score([""] * 2, ["1", HUGE], None, {}, ["t"] * 2)


def test_configuration_errors_are_not_swallowed() -> None:
    with pytest.raises(ValueError, match="target"):
        countdown_reward(None, ["<answer>1</answer>"], target=["many"], nums=[[1]])
    with pytest.raises(ValueError, match="lacks"):
        task_reward("countdown")(None, ["<answer>1</answer>"], answer=["1"], metadata=[{}])
    with pytest.raises(ValueError, match="answer format"):
        task_reward("zebra_puzzles")(None, ["x"], answer=["a"],
                                     metadata=[{"answer_format": "latex"}])  # fmt: skip
