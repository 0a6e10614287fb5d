"""The think/answer format on seed 002's six samples and on hand-built edge cases."""

from __future__ import annotations

import time

import pytest

from mtgrpo.rewards.verifiers.format import ThinkAnswer, format_reward, parse_think_answer

# Seed 002's test samples, verbatim (data): the tutorial adds "<think>" to every prompt.
SEED_002_COMPLETIONS = [
    """Let's use the numbers 4, 8, 2, and 1 to get 15. 
We can try: 8 * 2 - 1 = 15... </think>
<answer> 8 * 2 - 1 </answer>""",  # noqa: W291  # the seed's trailing space is data
    """ ... </think>
<answer> 8 * 2 - 1 </answer>""",
    """Using 4, 8, 2, 1, make 15: 8 * 2 - 1 = 15""",
    """<answer> 8 + 4 + 2 + 1 </answer>
<think> This should equal 15 </think>""",
    """ ... </think>
<answer> 8 + 4 - 2 </answer>""",
    """ ... </think>
<answer> 10 * 2 - 5 </answer>""",
]


def test_seed_002_format_rewards() -> None:
    assert format_reward(None, SEED_002_COMPLETIONS, target=["15"] * 6) == [
        1.0, 1.0, 0.0, 0.0, 1.0, 1.0
    ]  # fmt: skip


def test_conversational_completions_score_the_same() -> None:
    chats = [[{"role": "assistant", "content": text}] for text in SEED_002_COMPLETIONS]
    assert format_reward(None, chats) == format_reward(None, SEED_002_COMPLETIONS)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>a</think>\n<answer>b</answer>", ThinkAnswer("a", "b")),
        ("a</think>\n<answer>b</answer>\n", ThinkAnswer("a", "b")),  # one trailing newline
        ("a</think>\n<answer>b</answer>\n\n", None),
        ("a</think>\n<answer>b</answer> ", None),  # nothing may follow the answer
        ("a</think><answer>b</answer>", None),  # the newline is required
        ("a</think>\n\n<answer>b</answer>", None),
        ("<think>a<think>b</think>\n<answer>c</answer>", None),  # nested think
        ("a</think>\n<answer>b</answer>c</answer>", ThinkAnswer("a", "b</answer>c")),
        ("</think>\n<answer></answer>", ThinkAnswer("", "")),
        ("a</think>\n<answer>b", None),
        ("", None),
    ],
)
def test_parse_think_answer(text: str, expected: ThinkAnswer | None) -> None:
    assert parse_think_answer(text) == expected


def test_format_is_linear_on_long_inputs() -> None:
    texts = ["<think>" * 100_000, "a" * 900_000 + "</think>\n<answer>" + "</answer>" * 10_000]
    started = time.perf_counter()
    rewards = format_reward(None, texts)
    assert time.perf_counter() - started < 0.1
    assert rewards == [0.0, 1.0]


def test_completions_must_be_a_list() -> None:
    with pytest.raises(TypeError, match="completions must be a list"):
        format_reward(None, "a single string")
