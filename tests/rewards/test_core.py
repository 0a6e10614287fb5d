"""The reward-function contract: names, channels, weights, adapters, gates, suite construction."""

from __future__ import annotations

import functools
import pickle

import numpy as np
import pytest
import torch

from mtgrpo.algo.advantages import Gate
from mtgrpo.rewards import (
    RewardFunction,
    RewardSuite,
    as_reward_function,
    callable_name,
    conditioned,
    per_completion,
    reward_channels,
)
from mtgrpo.rewards.core import is_async_callable, unique_names


def length_reward(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


def other_length_reward(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


class Judge:
    def __call__(self, prompts, completions, **kwargs):
        return [1.0 for _ in completions]


class AsyncJudge:
    async def __call__(self, prompts, completions, **kwargs):
        return [1.0 for _ in completions]


async def async_reward(prompts, completions, **kwargs):
    return [0.0 for _ in completions]


# --- names ---------------------------------------------------------------------------------


def test_callable_name_follows_trl_rule():
    assert callable_name(length_reward) == "length_reward"
    assert callable_name(lambda prompts, completions: []) == "<lambda>"
    assert callable_name(Judge()) == "Judge"
    assert callable_name(functools.partial(functools.partial(length_reward))) == "length_reward"


def test_is_async_callable_sees_functions_partials_and_instances():
    assert is_async_callable(async_reward)
    assert is_async_callable(functools.partial(async_reward))
    assert is_async_callable(AsyncJudge())
    assert not is_async_callable(length_reward)
    assert not is_async_callable(Judge())


def test_unique_names_suffixes_in_order_and_skips_names_taken_by_others():
    assert unique_names(["f", "g", "f", "f"]) == ["f", "g", "f_2", "f_3"]
    # 'f_2' is a user's own name, so the second 'f' must not steal it.
    assert unique_names(["f", "f", "f_2"]) == ["f", "f_3", "f_2"]
    assert unique_names(["<lambda>", "<lambda>"]) == ["<lambda>", "<lambda>_2"]


def test_suite_makes_duplicate_names_unique_deterministically():
    fns = [lambda prompts, completions, **kw: [0.0] * len(completions) for _ in range(3)]
    suite = RewardSuite.from_user([*fns, Judge(), Judge()])
    assert suite.channel_names == ["<lambda>", "<lambda>_2", "<lambda>_3", "Judge", "Judge_2"]
    assert [rf.fn for rf in suite.functions[:3]] == fns


# --- RewardFunction -----------------------------------------------------------------------


def test_reward_function_defaults_and_columns():
    rf = RewardFunction(length_reward)
    assert rf.name == "length_reward"
    assert rf.__name__ == "length_reward"  # what TRL's get_callable_name reads
    assert rf.num_channels == 1
    assert rf.column_names == ["length_reward"]
    assert rf(prompts=["p"], completions=["abc"]) == [3.0]  # still a TRL reward function
    multi = RewardFunction(Judge(), name="judge", channels=["a", "b"], weights=[1.0, 0.5])
    assert multi.channels == ("a", "b")
    assert multi.weights == (1.0, 0.5)
    assert multi.column_names == ["judge/a", "judge/b"]


def test_reward_function_rejects_bad_declarations():
    with pytest.raises(TypeError, match=r"write channels=\('ab',\)"):
        RewardFunction(length_reward, channels="ab")
    with pytest.raises(ValueError, match=r"declares channel\(s\) \['a'\] more than once"):
        RewardFunction(length_reward, channels=("a", "b", "a"))
    with pytest.raises(ValueError, match="must be non-empty strings"):
        RewardFunction(length_reward, channels=("a", ""))
    with pytest.raises(ValueError, match=r"has 2 channel\(s\) but 1 weight\(s\)"):
        RewardFunction(length_reward, channels=("a", "b"), weights=1.0)
    with pytest.raises(ValueError, match="must be finite"):
        RewardFunction(length_reward, weights=float("nan"))
    with pytest.raises(TypeError, match="must be callable"):
        RewardFunction(3)
    with pytest.raises(TypeError, match="already a RewardFunction"):
        RewardFunction(RewardFunction(length_reward))


def test_as_reward_function_refuses_model_ids_and_modules():
    with pytest.raises(TypeError, match="is a string"):
        as_reward_function("org/reward-model")
    with pytest.raises(TypeError, match=r"torch.nn.Module; wrap it"):
        as_reward_function(torch.nn.Linear(2, 1))
    rf = RewardFunction(length_reward)
    assert as_reward_function(rf) is rf


def test_reward_channels_decorator_declares_channels():
    @reward_channels("compliance", "politeness", "action", weights=(1.0, 1.0, 0.5))
    def fintech(prompts, completions, **kwargs):
        return [(1.0, 0.0, 1.0) for _ in completions]

    assert isinstance(fintech, RewardFunction)
    assert fintech.name == "fintech"
    assert fintech.column_names == ["fintech/compliance", "fintech/politeness", "fintech/action"]
    assert fintech(prompts=["p"], completions=["c"]) == [(1.0, 0.0, 1.0)]
    tupled = reward_channels(("a", "b"), name="pair")(length_reward)
    assert tupled.column_names == ["pair/a", "pair/b"]


# --- per_completion -------------------------------------------------------------------------


def test_per_completion_passes_prompts_as_given():
    seen = []

    def reward_fn(completion, prompt):
        seen.append(prompt)
        return (float(len(completion)), 1.0 if "please" in completion else 0.0)

    rf = per_completion(reward_fn, channels=("length", "polite"))
    prompts = [
        "plain string",
        [{"role": "user", "content": "chat"}],
        {"prompt": "with metadata", "gold": "42"},
    ]
    out = rf(prompts=prompts, completions=["ab", "please", "c"], completion_ids=None, task=[1] * 3)
    assert out == [(2.0, 0.0), (6.0, 1.0), (1.0, 0.0)]
    assert seen == prompts
    assert rf.name == "reward_fn"
    assert rf.column_names == ["reward_fn/length", "reward_fn/polite"]


def test_per_completion_single_channel_and_row_columns():
    def exact(completion, prompt, answer):
        return float(completion.strip() == answer)

    rf = per_completion(exact, name="exact_match", row_columns=("answer",))
    out = rf(prompts=["q1", "q2"], completions=[" 4", "5"], answer=["4", "6"], trainer_state=1)
    assert out == [1.0, 0.0]
    assert rf.column_names == ["exact_match"]
    with pytest.raises(KeyError, match=r"row_columns \['answer'\] are not dataset columns"):
        rf(prompts=["q"], completions=["4"], task=["t"])


def exact_match(completion, prompt, answer):
    return float(completion == answer)


def test_per_completion_result_pickles():
    rf = per_completion(exact_match, row_columns=("answer",))
    clone = pickle.loads(pickle.dumps(rf))
    assert clone.name == "exact_match"
    assert clone(prompts=["q", "q"], completions=["1", "2"], answer=["1", "1"]) == [1.0, 0.0]


def test_per_completion_refuses_batched_functions():
    with pytest.raises(TypeError, match="per-sample fn"):
        per_completion(RewardFunction(length_reward))


# --- weights --------------------------------------------------------------------------------


def test_reward_weights_default_to_one_and_declared_weights():
    judge = RewardFunction(Judge(), name="judge", channels=("a", "b"), weights=(2.0, 0.5))
    suite = RewardSuite.from_user([length_reward, judge])
    assert suite.channel_names == ["length_reward", "judge/a", "judge/b"]
    np.testing.assert_array_equal(suite.reward_weights, [1.0, 2.0, 0.5])
    suite = RewardSuite.from_user([length_reward, judge], reward_weights=[3.0, 2.0, 0.5])
    np.testing.assert_array_equal(suite.reward_weights, [3.0, 2.0, 0.5])
    suite = RewardSuite.from_user([length_reward], reward_weights=torch.tensor([0.25]))
    np.testing.assert_array_equal(suite.reward_weights, [0.25])


def test_reward_weights_length_mismatch_states_both_numbers():
    judge = RewardFunction(Judge(), name="judge", channels=("a", "b"))
    with pytest.raises(
        ValueError, match=r"reward_weights has 2 entries but the suite has 3 reward"
    ):
        RewardSuite.from_user([length_reward, judge], reward_weights=[1.0, 1.0])
    with pytest.raises(ValueError, match="must be finite"):
        RewardSuite.from_user([length_reward], reward_weights=[float("inf")])
    with pytest.raises(ValueError, match=r"disagree with the weights declared .* \['judge/b'\]"):
        RewardSuite.from_user(
            [RewardFunction(Judge(), name="judge", channels=("a", "b"), weights=(1.0, 0.5))],
            reward_weights=[1.0, 1.0],
        )


# --- suite construction -----------------------------------------------------------------------


def test_routing_table_merges_a_function_listed_under_several_tasks():
    suite = RewardSuite.from_user(
        {"math": [length_reward], "code": [length_reward, Judge()], "*": other_length_reward}
    )
    assert suite.routed
    assert suite.channel_names == ["length_reward", "Judge", "other_length_reward"]
    assert suite.tasks_of("length_reward") == frozenset({"math", "code"})
    assert suite.tasks_of(1) == frozenset({"code"})
    assert suite.tasks_of("other_length_reward") is None  # '*' = every task
    wildcard_too = RewardSuite.from_user({"math": length_reward, "*": [length_reward]})
    assert wildcard_too.tasks_of("length_reward") is None


def test_tasks_of_multi_channel_and_unknown_channel():
    judge = RewardFunction(Judge(), name="judge", channels=("a", "b"))
    suite = RewardSuite.from_user({"chat": [judge], "math": [length_reward]})
    assert [suite.tasks_of(c) for c in range(3)] == [frozenset({"chat"})] * 2 + [
        frozenset({"math"})
    ]
    assert RewardSuite.from_user([judge]).tasks_of("judge/b") is None
    with pytest.raises(ValueError, match=r"unknown reward channel 'judge'; channels: \['judge/a'"):
        suite.tasks_of("judge")
    with pytest.raises(ValueError, match=r"channel index 3 is out of range \[0, 3\)"):
        suite.tasks_of(3)


def test_validate_tasks_maps_tasks_to_channels():
    suite = RewardSuite.from_user({"math": [length_reward], "code": [Judge()], "*": [async_reward]})
    assert suite.validate_tasks(["math", "code", "poetry"]) == {
        "math": ["length_reward", "async_reward"],
        "code": ["Judge", "async_reward"],
        "poetry": ["async_reward"],
    }
    plain = RewardSuite.from_user([length_reward, Judge()])
    assert plain.validate_tasks(["anything"]) == {"anything": ["length_reward", "Judge"]}


def test_suite_construction_errors():
    with pytest.raises(ValueError, match="needs at least one reward function"):
        RewardSuite.from_user([])
    with pytest.raises(ValueError, match="'length_reward' is listed twice"):
        RewardSuite.from_user([length_reward, length_reward])
    with pytest.raises(TypeError, match="keys must be task names"):
        RewardSuite.from_user({1: [length_reward]})
    with pytest.raises(TypeError, match="entry for task 'math' must be a reward function or a"):
        RewardSuite.from_user({"math": 3})
    with pytest.raises(TypeError, match="takes RewardFunction objects, got function"):
        RewardSuite([length_reward])
    with pytest.raises(ValueError, match=r"unknown on_unscorable policy 'ignore'; valid names"):
        RewardSuite.from_user(length_reward, on_unscorable="ignore")
    clash = RewardFunction(length_reward, name="judge/a")
    with pytest.raises(ValueError, match=r"channel name\(s\) \['judge/a'\] occur twice"):
        RewardSuite.from_user([clash, RewardFunction(Judge(), name="judge", channels=("a",))])


# --- gates ------------------------------------------------------------------------------------


def test_conditioned_resolves_to_channel_indices():
    fmt = RewardFunction(length_reward, name="format")
    correct = conditioned(other_length_reward, on="format", mode="subgroup", threshold=0.5)
    assert correct is not other_length_reward
    suite = RewardSuite.from_user([correct, fmt])
    assert suite.gates == [Gate(channel=0, on=1, mode="subgroup", threshold=0.5)]
    assert suite.channel_names == ["other_length_reward", "format"]


def test_conditioned_multi_channel_gates_on_its_own_first_channel():
    judge = RewardFunction(Judge(), name="fintech", channels=("compliance", "polite", "action"))
    gated = conditioned(judge, on="compliance")
    suite = RewardSuite.from_user([length_reward, gated])
    # Columns: 0 length_reward, 1 fintech/compliance, 2 fintech/polite, 3 fintech/action.
    assert suite.gates == [Gate(2, 1, "zero_fill", 1.0), Gate(3, 1, "zero_fill", 1.0)]
    only_action = conditioned(judge, on="length_reward", channels=["action"], threshold=2.0)
    suite = RewardSuite.from_user([length_reward, only_action])
    assert suite.gates == [Gate(3, 0, "zero_fill", 2.0)]


def test_conditioned_errors_list_the_channels():
    judge = RewardFunction(Judge(), name="fintech", channels=("compliance", "polite"))
    with pytest.raises(ValueError, match=r"gate mode 'soft' is not valid; use one of zero_fill"):
        conditioned(length_reward, on="x", mode="soft")
    with pytest.raises(ValueError, match=r"has no channel\(s\) \['tone'\]; its channels are"):
        conditioned(judge, on="compliance", channels=("tone",))
    with pytest.raises(ValueError, match="channel 'polite' of 'fintech' cannot gate itself"):
        conditioned(judge, on="polite", channels=("polite",))
    with pytest.raises(ValueError, match="has a single channel; omit channels"):
        conditioned(length_reward, on="x", channels=("a",))
    gated = conditioned(length_reward, on="formatt")
    with pytest.raises(
        ValueError,
        match=r"refers to unknown channel 'formatt'; the channels are \['length_reward', 'fmt'\]",
    ):
        RewardSuite.from_user([gated, RewardFunction(other_length_reward, name="fmt")])
    with pytest.raises(ValueError, match="'length_reward' cannot gate itself"):
        RewardSuite.from_user([conditioned(length_reward, on="length_reward")])
