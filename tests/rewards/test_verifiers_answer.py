"""Answer extraction: each style on hand-built texts, conversational completions, and
linear time on adversarial inputs (no catastrophic backtracking on 1-10 MB strings)."""

from __future__ import annotations

import time

import pytest

from mtgrpo.rewards.verifiers.answer import (
    ANSWER_STYLES,
    MAX_BOXED_CANDIDATES,
    MAX_TEXT_CHARS,
    completion_text,
    extract_answer,
    extract_boxed,
    extract_last_number,
    extract_tag,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>4</answer>", "4"),
        ("<answer> 1 </answer> and later <answer>\n2\n</answer>", "2"),  # last pair wins
        ("<answer>1</answer><answer>2", "1"),  # an unclosed tag does not hide a complete one
        ("</answer><answer>", None),
        ("<answer>a<answer>b</answer>", "b"),  # the opening nearest the last closing
        ("no tags", None),
        ("<answer></answer>", ""),
    ],
)
def test_tag_takes_the_last_complete_pair(text: str, expected: str | None) -> None:
    assert extract_tag(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{42}", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed {7}", "7"),
        (r"first \boxed{1} then \boxed{2}", "2"),
        (r"\boxed{1} then \boxed{2", "1"),  # the trailing group never closes
        (r"\boxed{\boxed{3}}", "3"),  # the last occurrence is the inner one
        (r"\boxed{a{b}c}", "a{b}c"),
        (r"\boxed 5", None),
        (r"\boxed{", None),
        ("no box", None),
    ],
)
def test_boxed_balances_braces(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_boxed_tries_only_the_last_candidates() -> None:
    # One complete box followed by MAX_BOXED_CANDIDATES unbalanced ones: out of reach.
    text = r"\boxed{1}" + r" \boxed{" * MAX_BOXED_CANDIDATES
    assert extract_boxed(text) is None
    # One fewer unbalanced box: the complete one is the 16th candidate from the end.
    assert extract_boxed(r"\boxed{1}" + r" \boxed{" * (MAX_BOXED_CANDIDATES - 1)) == "1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 42.", "42"),
        ("x = -5", "-5"),
        ("3-5", "5"),  # a minus after a digit is subtraction, not a sign
        ("costs 1,234,567 dollars", "1234567"),
        ("pi is 3.14159 roughly", "3.14159"),
        ("first 1 then 2 then 30", "30"),
        ("no digits here", None),
        ("Arabic-Indic ٣ and fullwidth ３ are not ASCII digits", None),
        ("ratio 3/4", "4"),
    ],
)
def test_last_number(text: str, expected: str | None) -> None:
    assert extract_last_number(text) == expected


def _integer_start(text: str, end: int) -> int:
    """Start of the integer part ending at ``end``: digit groups ``d{1,3}(,ddd)+`` if they
    fit (dropping trailing groups until they do, as regex backtracking does), else the run
    of digits."""
    groups, position = 0, end
    while (
        position >= 3 and text[position - 2 : position + 1].isdigit() and text[position - 3] == ","
    ):
        groups, position = groups + 1, position - 4
    run = 0
    while position - run >= 0 and text[position - run] in DIGITS:
        run += 1
    if groups >= 1 and 1 <= run <= 3:
        return position - run + 1
    if groups >= 2:
        return end - 4 * (groups - 1) - 2
    start = end
    while start > 0 and text[start - 1] in DIGITS:
        start -= 1
    return start


def _last_number_reference(text: str) -> str | None:
    """Plain loop over the grammar ``-?(d{1,3}(,ddd)+|d+)(.d+)?`` ending at the last digit."""
    ends = [index for index, char in enumerate(text) if char in DIGITS]
    if not ends:
        return None
    end = ends[-1]
    run_start = end
    while run_start > 0 and text[run_start - 1] in DIGITS:
        run_start -= 1
    if run_start >= 2 and text[run_start - 1] == "." and text[run_start - 2] in DIGITS:
        start = _integer_start(text, run_start - 2)
    else:
        start = _integer_start(text, end)
    number = text[start : end + 1].replace(",", "")
    sign = start >= 1 and text[start - 1] == "-"
    if sign and start >= 2:
        before = text[start - 2]
        sign = not (before in DIGITS or (before.isascii() and before.isalpha()) or before in "_)].")
    return ("-" if sign else "") + number


DIGITS = frozenset("0123456789")


@pytest.mark.parametrize("seed", range(5))
def test_last_number_matches_a_loop_reference_on_random_text(seed: int) -> None:
    import random

    rng = random.Random(seed)
    alphabet = "0123456789" * 2 + " ,.-x=)\n"
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert extract_last_number(text) == _last_number_reference(text), repr(text)


def test_extract_answer_tries_styles_in_order() -> None:
    text = r"<answer>7</answer> but \boxed{8}, and finally 9"
    assert extract_answer(text) == "7"
    assert extract_answer(text, style="boxed") == "8"
    assert extract_answer(text, style="last_number") == "9"
    assert extract_answer("only 3 here", style=("tag", "boxed", "last_number")) == "3"
    assert extract_answer("nothing", style=("tag", "boxed")) is None


def test_unknown_style_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown answer style 'xml'; valid names: boxed"):
        extract_answer("x", style="xml")
    assert ANSWER_STYLES.names() == ["boxed", "last_number", "tag"]


def test_completion_text_reads_conversational_completions() -> None:
    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "a"}]) == "a"
    parts = [{"type": "text", "text": "x"}, {"type": "image"}, {"type": "text", "text": "y"}]
    assert completion_text([{"role": "assistant", "content": parts}]) == "xy"
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}]
    assert completion_text(messages) == "r"
    for odd in (None, 3, b"bytes", [None, 4], {"content": None}):
        assert completion_text(odd) == ""


@pytest.mark.parametrize(
    "text",
    [
        "1" * 10_000_000,  # one 10 MB number
        "<answer>" * 1_000_000,  # many openings, no closing
        "\\boxed{" * 100_000 + "}" * 50_000,
        "{" * 5_000_000,
        "1," * 400_000 + "x",
        "9." * 450_000,
        "-" * 900_000 + "1",
    ],
    ids=["digits", "tags", "boxes", "braces", "commas", "dots", "minuses"],
)
def test_extraction_is_fast_on_adversarial_inputs(text: str) -> None:
    for style in ANSWER_STYLES.names():
        started = time.perf_counter()
        extract_answer(text, style=style)
        assert time.perf_counter() - started < 0.25, style


def test_texts_over_the_cap_have_no_answer() -> None:
    text = "<answer>1</answer>" + " " * MAX_TEXT_CHARS
    assert extract_tag(text) is None
    assert extract_boxed(r"\boxed{1}" + " " * MAX_TEXT_CHARS) is None
    assert extract_last_number("1" + " " * MAX_TEXT_CHARS) is None
