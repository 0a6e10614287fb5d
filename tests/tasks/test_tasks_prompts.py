"""Prompt formats (plain / chat / paper, optional <think> prefix) and answer extraction."""

from __future__ import annotations

import pytest

from mtgrpo.tasks.prompts import (
    ANSWER_FORMATS,
    PAPER_SYSTEM_PREAMBLE,
    completion_text,
    extract_boxed,
    extract_tagged,
    format_prompt,
)

PLAIN_HEAD = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer.\nUser: "
)
PLAIN_TAIL = "\nAssistant: Let me solve this step by step."


def test_plain_template_is_the_papers_wording() -> None:
    assert format_prompt("Q?") == PLAIN_HEAD + "Q?" + PLAIN_TAIL
    assert PLAIN_HEAD.startswith(PAPER_SYSTEM_PREAMBLE)


def test_plain_think_prefix_ends_the_prompt_inside_the_think_block() -> None:
    assert format_prompt("Q?", think_prefix=True) == PLAIN_HEAD + "Q?" + PLAIN_TAIL + "\n<think>"


def test_chat_format_with_system_and_think_prefix() -> None:
    assert format_prompt("Q?", "chat") == [{"role": "user", "content": "Q?"}]
    messages = format_prompt("Q?", "chat", think_prefix=True, system_prompt="Be brief.")
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q?"},
        {"role": "assistant", "content": "<think>"},
    ]


def test_paper_format_wraps_the_plain_template_in_one_user_message() -> None:
    assert format_prompt("Q?", "paper") == [
        {"role": "user", "content": PLAIN_HEAD + "Q?" + PLAIN_TAIL}
    ]


def test_unknown_prompt_format_lists_valid_names() -> None:
    with pytest.raises(
        ValueError, match=r"unknown prompt format 'jsonl'; valid names: chat, paper, plain"
    ):
        format_prompt("Q?", "jsonl")


def test_plain_format_refuses_a_system_prompt() -> None:
    with pytest.raises(ValueError, match="use prompt_format='chat'"):
        format_prompt("Q?", "plain", system_prompt="x")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer> 3 + 4 </answer>", "3 + 4"),
        ("<think>try <answer>1</answer></think>\n<answer>2</answer>", "2"),  # the last one counts
        ("<answer>\nmulti\nline\n</answer>", "multi\nline"),
        ("<answer>unclosed", None),
        ("no tags", None),
        ("<answer></answer>", ""),
    ],
)
def test_extract_tagged(text: str, expected: str | None) -> None:
    assert extract_tagged(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{ 2 }", "2"),
        ("\\boxed {Alice}", "Alice"),
        ("\\boxed{1} then \\boxed{2", "1"),  # an unclosed last box does not count
        ("boxed{3}", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_answer_formats_render_and_read_back() -> None:
    for name in ("answer_tag", "boxed"):
        answer_format = ANSWER_FORMATS.get(name)
        assert answer_format.extract("x " + answer_format.example("7 8 9")) == "7 8 9"
    assert ANSWER_FORMATS.get("box").name == "boxed"
    assert ANSWER_FORMATS.get("answer_tag").where == "in <answer> </answer> tags"


def test_completion_text_of_strings_and_messages() -> None:
    assert completion_text("abc") == "abc"
    assert completion_text([{"role": "assistant", "content": "abc"}]) == "abc"
    with pytest.raises(TypeError, match="a completion must be a string or a list of chat messages"):
        completion_text(3)
