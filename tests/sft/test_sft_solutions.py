"""``solutions_from_rows``: gold answers written in the format the task's prompt asks for."""

from __future__ import annotations

import json

import pytest

from mtgrpo.rewards.verifiers.format import format_reward
from mtgrpo.sft import REASONINGS, SOLUTION_TEMPLATES, solutions_from_rows
from mtgrpo.tasks import RenderOptions, resolve_task, task_reward
from mtgrpo.tasks.prompts import format_prompt

COUNTDOWN_ITEM = {"position": 0, "source_index": 0, "question": "",
                  "answer": "(6 + 4) * 3", "metadata": {"numbers": [3, 4, 6], "target": 30}}
ZEBRA_ITEM = {"position": 0, "source_index": 0, "answer": "alice",
              "question": "There are 3 houses ... What is Name of the person who lives in House "
                          "1?? Provide only the name of the person as your final answer.",
              "metadata": {"num_people": 3, "num_characteristics": 3}}
ARC_ITEM = {"position": 0, "source_index": 0, "answer": "0 1 1 0",
            "question": "Find the rule.\nYour final answer should be just the test output grid "
                        "itself.\n\nInput:\n1 1 0 0",
            "metadata": {"arc_task": "move_right", "size": 4}}


def _row(task: str, item: dict, **render: object) -> dict:
    """A suite row built the way TaskSuite builds it (RenderOptions.row), without generation."""
    return RenderOptions(**render).row(resolve_task(task), "train", 0, item)


def _score(row: dict) -> float | None:
    family = json.loads(row["metadata"])["family"]
    return task_reward(family)(None, [row["completion"]], answer=[row["answer"]],
                               metadata=[row["metadata"]], task=[row["task"]])[0]


@pytest.mark.parametrize(
    ("task", "item"),
    [("countdown:easy", COUNTDOWN_ITEM), ("zebra_puzzles:easy", ZEBRA_ITEM),
     ("arc_1d:easy", ARC_ITEM)],
)
@pytest.mark.parametrize("answer_format", ["answer_tag", "boxed"])
def test_every_solution_scores_correct_with_the_task_reward(task, item, answer_format):
    (solved,) = solutions_from_rows([_row(task, item, answer_format=answer_format)])
    assert _score(solved) == 1.0


def test_default_template_follows_the_r1_format_exactly():
    (solved,) = solutions_from_rows([_row("countdown:easy", COUNTDOWN_ITEM)])
    # restate: the numbers and the target, in one line, no derivation
    assert solved["completion"] == (
        "<think>\nI need to reach 30 from the numbers [3, 4, 6], using each number exactly once "
        "with + - * /.\n</think>\n<answer> (6 + 4) * 3 </answer>"
    )
    assert format_reward(None, [solved["completion"]]) == [1.0]
    # the input's columns are kept
    assert {"id", "task", "prompt", "answer", "metadata", "split"} < set(solved)


def test_boxed_answer_and_no_reasoning():
    row = _row("zebra_puzzles:easy", ZEBRA_ITEM, answer_format="boxed")
    (solved,) = solutions_from_rows([row], reasoning="none")
    assert solved["completion"] == "<think>\n\n</think>\n\\boxed{alice}"


@pytest.mark.parametrize("prompt_format", ["plain", "chat"])
def test_think_prefix_prompt_gets_the_completion_without_its_opening_tag(prompt_format):
    row = _row("arc_1d:easy", ARC_ITEM, prompt_format=prompt_format, think_prefix=True)
    (solved,) = solutions_from_rows([row], "think_answer", reasoning="none")
    assert solved["completion"] == "\n\n</think>\n<answer> 0 1 1 0 </answer>"
    # with the prompt's "<think>" in front it is the R1 format
    assert format_reward(None, ["<think>" + solved["completion"]]) == [1.0]


def test_custom_format_string_and_answer_only():
    row = {"prompt": "p", "answer": " 12 ", "task": "user"}
    (custom,) = solutions_from_rows([row], "{reasoning}The answer is {answer}. ({gold})",
                                    reasoning="none")
    assert custom["completion"] == "The answer is <answer> 12 </answer>. (12)"
    (only,) = solutions_from_rows([row], "answer_only", answer_format="boxed")
    assert only["completion"] == "\\boxed{12}"


def test_registries_list_their_names():
    assert SOLUTION_TEMPLATES.names() == ["answer_only", "think_answer"]
    assert REASONINGS.names() == ["none", "restate"]
    with pytest.raises(ValueError, match="unknown solution reasoning 'long'; valid names"):
        solutions_from_rows([{"prompt": "p", "answer": "1"}], reasoning="long")


@pytest.mark.parametrize(
    ("rows", "template", "match"),
    [
        ([{"prompt": "p", "answer": "1", "split": "test"}], "think_answer", "test data"),
        ([{"prompt": "p", "answer": "1",
           "metadata": json.dumps({"origin": "mtgrpo-paper-test"})}], "think_answer",
         "evaluation rows must not be used for training"),
        ([{"prompt": "p"}], "think_answer", "no 'answer' column"),
        ([{"prompt": "p", "answer": "  "}], "think_answer", "empty gold answer"),
        ([{"answer": "1"}], "think_answer", "no 'prompt' column"),
        ([], "think_answer", "no rows were given"),
        ([{"prompt": "p", "answer": "1"}], "<think>{thought}</think>{answer}",
         r"unknown field\(s\) \['thought'\]"),
        ([{"prompt": "p", "answer": "1"}], "just {gold}", "has no {answer} field"),
        ([{"prompt": "p", "answer": "1", "metadata": "{not json"}], "think_answer",
         "metadata is not a JSON object"),
    ],
)
def test_bad_input_names_the_fix(rows, template, match):
    with pytest.raises(ValueError, match=match):
        solutions_from_rows(rows, template)


def test_a_template_may_repeat_the_answer():
    (solved,) = solutions_from_rows([{"prompt": "p", "answer": "1"}], "{answer} or {answer}")
    assert solved["completion"] == "<answer> 1 </answer> or <answer> 1 </answer>"


def test_a_template_that_hides_the_answer_is_refused():
    row = {"prompt": "p", "answer": "7"}
    with pytest.raises(ValueError, match="does not read back the gold answer '7'"):
        solutions_from_rows([row], "{answer} <answer> draft </answer>")


def test_prompt_text_is_untouched():
    prompt = format_prompt("What is 1+1?", "chat", system_prompt="Be exact.")
    (solved,) = solutions_from_rows([{"prompt": prompt, "answer": "2"}])
    assert solved["prompt"] == prompt
