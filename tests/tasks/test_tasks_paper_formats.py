"""The papers' released problems re-asked in a run's own prompt and answer formats.

Expected prompts are spelled out from the released texts (tests/paper_release.py), not built
with the library's templates; grading uses a reward function whose *default* answer format
is the other one, so a score of 1.0 shows that the row's metadata chose the container.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mtgrpo.tasks.paper import (
    PAPER_TASK_IDS,
    load_paper_test_sets,
    nearest_paper_level,
    paper_task_of,
)
from mtgrpo.tasks.rewards import task_reward
from mtgrpo.tasks.suite import TaskSuite
from paper_release import (
    ARC_ANSWER,
    ARC_QUESTION,
    CLOSING,
    PAPER_DIR,
    PREAMBLE,
    TAG_COUNTDOWN,
    ZEBRA_QUESTION,
    countdown_question,
    needs_paper_data,
    write_release,
)

TAG_ZEBRA = ZEBRA_QUESTION.replace(
    "put in in \\boxed{}, for example: \\boxed{Alice}.",
    "put it in <answer> </answer> tags, for example: <answer> Alice </answer>.",
)
TAG_ARC = ARC_QUESTION.replace("placed in \\boxed{}", "placed in <answer> </answer> tags")


@pytest.fixture
def release(tmp_path: Path) -> Path:
    return write_release(tmp_path / "release")


def _by_task(rows: list[dict]) -> dict[str, dict]:
    return {row["task"]: row for row in reversed(rows)}  # the first row of each task


def _score(row: dict, completion: str) -> float | None:
    metadata = json.loads(row["metadata"])
    other = "boxed" if metadata["answer_format"] == "answer_tag" else "answer_tag"
    reward = task_reward(metadata["family"], answer_format=other)
    return reward(
        [row["prompt"]],
        [completion],
        answer=[row["answer"]],
        metadata=[row["metadata"]],
        task=[row["task"]],
    )[0]


def _content(row: dict) -> str:
    (message,) = row["prompt"]
    assert message["role"] == "user"
    return message["content"]


def test_the_paper_layout_with_boxed_answers_re_asks_the_released_prompts(release: Path) -> None:
    released = load_paper_test_sets(release)
    reasked = load_paper_test_sets(release, prompt_format="paper", answer_format="boxed")
    assert [r["id"] for r in reasked] == [r["id"] for r in released]
    assert [r["answer"] for r in reasked] == [r["answer"] for r in released]
    assert [json.loads(r["metadata"]) for r in reasked] == [
        json.loads(r["metadata"]) for r in released
    ]
    for old, new in zip(released, reasked, strict=True):
        if old["task"] == "zebra_puzzles:easy":  # the family's wording mends the release's typo
            assert _content(new) == _content(old).replace("put in in", "put it in") != _content(old)
        else:
            assert new["prompt"] == old["prompt"]
    countdown = _by_task(reasked)["countdown:easy"]
    assert _content(countdown) == PREAMBLE + countdown_question([8, 73, 96], 841) + CLOSING


@needs_paper_data
def test_every_released_prompt_is_re_asked_identically_in_the_paper_layout() -> None:
    released = load_paper_test_sets(PAPER_DIR)
    reasked = load_paper_test_sets(PAPER_DIR, prompt_format="paper", answer_format="boxed")
    assert len(reasked) == len(released) == 2400
    for old, new in zip(released, reasked, strict=True):
        assert (new["id"], new["answer"]) == (old["id"], old["answer"])
        expected = _content(old)
        if old["task"].startswith("zebra_puzzles:"):
            expected = expected.replace("put in in", "put it in")
        assert _content(new) == expected, old["id"]


def test_chat_prompts_with_answer_tags_grade_in_tags_only(release: Path) -> None:
    rows = load_paper_test_sets(release, prompt_format="chat", answer_format="answer_tag")
    first = _by_task(rows)
    assert first["countdown:easy"]["prompt"] == [{"role": "user", "content": TAG_COUNTDOWN}]
    assert first["zebra_puzzles:easy"]["prompt"] == [{"role": "user", "content": TAG_ZEBRA}]
    assert first["arc_1d:easy"]["prompt"] == [{"role": "user", "content": TAG_ARC}]
    for row in rows:
        metadata = json.loads(row["metadata"])
        assert metadata["answer_format"] == "answer_tag"
        assert metadata["origin"] == "mtgrpo-paper-test"
        assert row["split"] == "test"
    countdown, second = (r for r in rows if r["task"] == "countdown:easy")
    assert _score(countdown, "8 * 96 = 768. <answer> 8 * 96 + 73 </answer>") == 1.0
    assert _score(countdown, "8 * 96 = 768. \\boxed{8 * 96 + 73}") == 0.0  # not its container
    assert _score(countdown, "<answer> 8 * 96 - 73 </answer>") == 0.1  # 695: wrong, in tags
    assert _score(second, "<answer> 3 * 5 + 7 </answer>") == 1.0
    assert _score(second, "\\boxed{3 * 5 + 7}") == 0.0
    zebra, arc = first["zebra_puzzles:easy"], first["arc_1d:easy"]
    assert _score(zebra, "<answer> Alice </answer>") == 1.0
    assert _score(zebra, "\\boxed{Alice}") == 0.0
    assert _score(arc, f"<answer> {ARC_ANSWER} </answer>") == 1.0
    assert _score(arc, f"\\boxed{{{ARC_ANSWER}}}") == 0.0


def test_one_format_given_keeps_the_released_choice_of_the_other(release: Path) -> None:
    tags = load_paper_test_sets(release, tasks=["countdown:easy"], per_task=1,
                                answer_format="answer_tag")  # fmt: skip
    assert tags[0]["prompt"] == [{"role": "user", "content": PREAMBLE + TAG_COUNTDOWN + CLOSING}]
    chat = load_paper_test_sets(release, tasks=["countdown:easy"], per_task=1,
                                prompt_format="chat")  # fmt: skip
    assert chat[0]["prompt"] == [
        {"role": "user", "content": countdown_question([8, 73, 96], 841)}
    ]
    assert json.loads(chat[0]["metadata"])["answer_format"] == "boxed"
    plain = load_paper_test_sets(release, tasks=["countdown:easy"], per_task=1,
                                 prompt_format="plain", answer_format="tags")  # fmt: skip
    assert plain[0]["prompt"] == PREAMBLE + TAG_COUNTDOWN + CLOSING


def test_system_prompt_and_think_prefix_as_in_a_task_suite(release: Path) -> None:
    (row,) = load_paper_test_sets(
        release, tasks=["countdown:easy"], per_task=1, prompt_format="chat",
        answer_format="answer_tag", think_prefix=True, system_prompt="Be brief.",
    )  # fmt: skip
    assert row["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": TAG_COUNTDOWN},
        {"role": "assistant", "content": "<think>"},
    ]


def _answer_instruction(text: str) -> str:
    """The sentence that says where the answer goes (zebra: from "Provide only")."""
    match = re.search(r"(Provide only.*|Your final answer must be placed[^\n]*)", text, re.S)
    assert match, text
    return match.group(1)


def test_re_asked_problems_carry_the_instructions_the_trainer_teaches(release: Path) -> None:
    reasked = _by_task(load_paper_test_sets(release, prompt_format="chat",
                                            answer_format="answer_tag"))  # fmt: skip
    tasks = ["countdown:easy", "zebra_puzzles:easy", "arc_1d:easy"]
    with TaskSuite(tasks, train_size=1, eval_size=1, prompt_format="chat",
                   answer_format="answer_tag", workers=0, use_cache=False) as suite:  # fmt: skip
        trained = {task: suite.eval.task(task).get(0) for task in tasks}
    for task in ("zebra_puzzles:easy", "arc_1d:easy"):
        assert _answer_instruction(_content(reasked[task])) == _answer_instruction(
            _content(trained[task])
        )
    numbers = re.compile(r"\[[\d, ]+\]|equals \d+")
    assert numbers.sub("#", _content(reasked["countdown:easy"])) == numbers.sub(
        "#", _content(trained["countdown:easy"])
    )


@needs_paper_data
def test_zebra_and_arc_round_trip_on_the_released_rows() -> None:
    """Re-asked in tags, every zebra / ARC question is the released one with only its answer
    instruction changed, and the gold answer scores 1 in tags and 0 in a box."""
    tasks = [t for t in PAPER_TASK_IDS if not t.startswith("countdown:")]
    released = load_paper_test_sets(PAPER_DIR, tasks=tasks)
    reasked = load_paper_test_sets(PAPER_DIR, tasks=tasks, prompt_format="chat",
                                   answer_format="answer_tag")  # fmt: skip
    assert len(reasked) == 1600
    swaps = {
        "zebra_puzzles": ("put it in <answer> </answer> tags, for example: <answer> Alice "
                          "</answer>.", "put in in \\boxed{}, for example: \\boxed{Alice}."),
        "arc_1d": ("placed in <answer> </answer> tags", "placed in \\boxed{}"),
    }  # fmt: skip
    for old, new in zip(released, reasked, strict=True):
        ours, theirs = swaps[new["task"].partition(":")[0]]
        question = _content(new)
        assert question.count(ours) == 1, new["id"]
        assert PREAMBLE + question.replace(ours, theirs) + CLOSING == _content(old), new["id"]
        assert _score(new, f"Thinking...\n<answer> {new['answer']} </answer>") == 1.0, new["id"]
        assert _score(new, f"Thinking...\n\\boxed{{{new['answer']}}}") == 0.0, new["id"]


def test_bad_options_and_rows_that_cannot_be_re_asked(release: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="think_prefix and system_prompt apply to re-asked"):
        load_paper_test_sets(release, think_prefix=True)
    with pytest.raises(ValueError, match="system_prompt needs a message format"):
        load_paper_test_sets(release, prompt_format="plain", system_prompt="Be brief.")
    with pytest.raises(ValueError, match="unknown answer format 'xml'; valid names: answer_tag"):
        load_paper_test_sets(release, answer_format="xml")
    odd = {
        "data_source": "zebra-easy-test",
        "prompt": [{"content": "who?", "role": "user"}],
        "reward_model": {"ground_truth": {"target": "alice"}},
        "extra_info": {"index": 7, "question": "who?"},
    }
    pq.write_table(pa.Table.from_pylist([odd]), tmp_path / "odd.parquet")
    assert load_paper_test_sets(tmp_path / "odd.parquet")[0]["prompt"][0]["content"] == "who?"
    with pytest.raises(ValueError, match=r"zebra-easy-test row 7: .*does not hold the papers' "
                       r"answer instruction .*without prompt_format and answer_format"):
        load_paper_test_sets(tmp_path / "odd.parquet", answer_format="answer_tag")


def test_which_tasks_are_the_papers_levels() -> None:
    own_countdown = {"family": "countdown", "name": "countdown:3x20",
                     "config": {"min_numbers": 3, "max_numbers": 3, "min_value": 1,
                                "max_value": 20, "min_target": 1, "max_target": 400}}  # fmt: skip
    assert paper_task_of("countdown:easy") == "countdown:easy"
    assert paper_task_of("zebra:hard") == "zebra_puzzles:hard"
    assert paper_task_of({"family": "arc", "level": "medium"}) == "arc_1d:medium"
    assert paper_task_of(own_countdown) is None  # named like a level, configured otherwise
    assert paper_task_of({"family": "countdown", "level": "easy", "name": "cd",
                          "config": {"max_value": 20}}) is None  # fmt: skip
    assert paper_task_of("basic_arithmetic") is None
    # 3 numbers: shares min/max_numbers, min_value and min_target with easy (4 settings), only
    # min_value and min_target with the other levels (2)
    assert nearest_paper_level(own_countdown) == "countdown:easy"
    assert nearest_paper_level({"family": "zebra", "name": "z", "config": {
        "num_people": 4, "num_characteristics": 2}}) == "zebra_puzzles:medium"  # fmt: skip
    assert nearest_paper_level("basic_arithmetic") is None
