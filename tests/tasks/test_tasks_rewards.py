"""Task rewards: 1.0 correct / 0.1 wrong but in the tag / 0 otherwise, per family (TRL contract)."""

from __future__ import annotations

import json

import pytest

from mtgrpo.tasks.families import resolve_task
from mtgrpo.tasks.rewards import RewardScheme, TaskReward, reward_routing, task_reward
from mtgrpo.tasks.suite import TaskSuite


def _meta(family: str, **fields: object) -> str:
    return json.dumps({"family": family, **fields})


def test_countdown_reward_on_hand_built_completions() -> None:
    # numbers [8, 2, 1], target 15: 8 * 2 - 1 = 15 uses each number once.
    completions = [
        "<think>8*2=16, 16-1=15</think>\n<answer> 8 * 2 - 1 </answer>",  # correct -> 1.0
        "<answer>8 + 2 + 1</answer>",  # = 11, wrong value, in the tag -> 0.1
        "<answer>8 * 2 - 1 + 0</answer>",  # uses 0, not given -> 0.1
        "<answer>(8 - 1) * 2 + 1</answer>",  # = 15 but uses 1 twice -> 0.1
        "8 * 2 - 1",  # no tag -> 0
        "<answer>  </answer>",  # empty answer is not an answer -> 0
    ]
    n = len(completions)
    rewards = task_reward("countdown")(
        ["p"] * n,
        completions,
        answer=["8 * 2 - 1"] * n,
        metadata=[_meta("countdown", numbers=[8, 2, 1], target=15)] * n,
        task=["countdown:easy"] * n,
    )
    assert rewards == [1.0, 0.1, 0.1, 0.1, 0.0, 0.0]


def test_columns_may_arrive_as_numpy_arrays() -> None:
    import numpy as np

    completions = ["<answer> 8 * 2 - 1 </answer>", "<answer>8 + 2 + 1</answer>"]
    rewards = task_reward("countdown")(
        ["p", "p"], completions, answer=np.array(["8 * 2 - 1"] * 2),
        metadata=np.array([_meta("countdown", numbers=[8, 2, 1], target=15)] * 2),
        task=np.array(["countdown:easy"] * 2))
    assert rewards == [1.0, 0.1]


def test_zebra_reward_is_normalised_exact_match() -> None:
    completions = [
        "<answer> ALICE </answer>",
        "<answer>alice\n</answer>",
        "<answer>Bob</answer>",
        "Alice",
    ]
    n = len(completions)
    rewards = task_reward("zebra")(
        None, completions, answer=["alice"] * n, metadata=[_meta("zebra_puzzles")] * n, task=None
    )
    assert rewards == [1.0, 1.0, 0.1, 0.0]


def test_arc_reward_compares_integer_sequences() -> None:
    completions = [
        "<answer>0 0 1 1</answer>",
        "<answer>0, 0, 1, 1</answer>",
        "<answer>[0 0\n1 1]</answer>",
        "<answer>0 0 1 2</answer>",  # wrong cell -> 0.1
        "<answer>0 0 1</answer>",  # wrong length -> 0.1
        "<answer>output: 0 0 1 1</answer>",  # prose inside the tag is not a grid -> 0.1
        "0 0 1 1",  # no tag -> 0
    ]
    n = len(completions)
    rewards = task_reward("arc_1d")(
        None, completions, answer=["0 0 1 1"] * n, metadata=[_meta("arc_1d")] * n
    )
    assert rewards == [1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.0]


def test_rows_of_other_families_get_none() -> None:
    reward = task_reward("zebra_puzzles")
    rewards = reward(
        None,
        ["<answer>alice</answer>"] * 4,
        answer=["alice"] * 4,
        # family from metadata, from the task prefix (alias too), or from neither
        metadata=[_meta("countdown"), None, None, "{}"],
        task=["x", "countdown:easy", "zebra:easy", None],
    )
    assert rewards == [None, None, 1.0, 1.0]


def test_answer_format_comes_from_row_metadata() -> None:
    reward = task_reward("zebra_puzzles")  # default <answer> tags
    rewards = reward(
        None,
        ["\\boxed{Alice}", "\\boxed{Alice}", "<answer>Alice</answer>"],
        answer=["alice"] * 3,
        metadata=[
            _meta("zebra_puzzles", answer_format="boxed"),
            _meta("zebra_puzzles"),
            _meta("zebra_puzzles", answer_format="boxed"),
        ],
    )
    assert rewards == [1.0, 0.0, 0.0]


def test_conversational_completions() -> None:
    completion = [{"role": "assistant", "content": "<answer>bob</answer>"}]
    assert task_reward("zebra")(None, [completion], answer=["bob"]) == [1.0]


def test_custom_scheme_values() -> None:
    reward = task_reward("zebra", scheme=RewardScheme(correct=2.0, formatted=0.5, unformatted=-1.0))
    rewards = reward(None, ["<answer>a</answer>", "<answer>b</answer>", "a"], answer=["a"] * 3)
    assert rewards == [2.0, 0.5, -1.0]


@pytest.mark.parametrize(
    "values",
    [{"correct": 0.9}, {"formatted": 1.0}, {"unformatted": 1.5}, {"correct": float("nan")}],
)
def test_scheme_must_keep_accuracy_threshold_meaningful(values: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="reward"):
        RewardScheme(**values)


def test_column_length_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"column 'answer' has 1 values for 2 completions"):
        task_reward("zebra")(None, ["a", "b"], answer=["a"])


def test_missing_answer_column_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"needs the dataset's 'answer' column"):
        task_reward("zebra")(None, ["a"], metadata=["{}"])


def test_countdown_rows_need_numbers_and_target() -> None:
    with pytest.raises(
        ValueError, match=r"lacks \['numbers'\].*keys present: \['family', 'target'\]"
    ):
        task_reward("countdown")(
            None, ["<answer>1</answer>"], answer=["1"], metadata=[_meta("countdown", target=1)]
        )


def test_bad_metadata_json_is_an_error() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        task_reward("zebra")(None, ["a"], answer=["a"], metadata=["{oops"])


def test_reward_routing_shares_one_function_per_family() -> None:
    specs = [resolve_task(t) for t in ("countdown:easy", "countdown:hard", "arc_1d:easy")]
    routing = reward_routing(specs)
    assert list(routing) == ["countdown:easy", "countdown:hard", "arc_1d:easy"]
    assert routing["countdown:easy"][0] is routing["countdown:hard"][0]
    assert isinstance(routing["arc_1d:easy"][0], TaskReward)
    assert routing["arc_1d:easy"][0].__name__ == "arc_1d_reward"


@pytest.mark.parametrize(
    ("answer_format", "prompt_format"), [("answer_tag", "plain"), ("boxed", "chat")]
)
def test_gold_answers_of_generated_items_score_one(answer_format: str, prompt_format: str) -> None:
    tasks = [
        "countdown:easy",
        "countdown:medium",
        "countdown:hard",
        "countdown:very_hard",
        "zebra_puzzles:easy",
        "arc_1d:easy",
        "arc_1d:medium",
        "arc_1d:hard",
        "arc_1d:very_hard",
    ]
    with TaskSuite(
        tasks,
        train_size=3,
        eval_size=1,
        workers=0,
        use_cache=False,
        answer_format=answer_format,
        prompt_format=prompt_format,
    ) as suite:
        rows = suite.train.rows()
        routing = suite.reward_routing
    open_, close = (
        ("<answer> ", " </answer>") if answer_format == "answer_tag" else ("\\boxed{", "}")
    )
    for row in rows:
        reward = routing[row["task"]][0]
        oracle = f"<think>solved</think>\n{open_}{row['answer']}{close}"
        columns = {"answer": [row["answer"]], "metadata": [row["metadata"]], "task": [row["task"]]}
        assert reward([row["prompt"]], [oracle], **columns) == [1.0], row["id"]
        assert reward([row["prompt"]], [row["answer"]], **columns) == [0.0], row["id"]


def test_routing_table_plugs_into_the_reward_suite() -> None:
    from mtgrpo.rewards import RewardSuite

    tasks = ["countdown:easy", "countdown:medium", "zebra:easy", "arc:easy"]
    with TaskSuite(tasks, train_size=2, eval_size=1, workers=0, use_cache=False) as suite:
        rows = suite.train.rows()
        rewards = RewardSuite.from_user(suite.reward_routing)
    assert rewards.channel_names == ["countdown_reward", "zebra_puzzles_reward", "arc_1d_reward"]
    completions = [f"<answer>{row['answer']}</answer>" for row in rows]
    columns = {key: [row[key] for row in rows] for key in ("answer", "metadata")}
    scores = rewards.score(
        [row["prompt"] for row in rows], completions, None, columns, [row["task"] for row in rows]
    )
    # rows: 4 countdown (2 tasks x 2), 2 zebra, 2 arc; each row scored by its family only
    expected_channel = [0, 0, 0, 0, 1, 1, 2, 2]
    values = scores.values.tolist()
    for row_values, channel in zip(values, expected_channel, strict=True):
        assert row_values[channel] == 1.0
        assert sum(v == v for v in row_values) == 1  # the other channels are NaN
