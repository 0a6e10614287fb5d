"""Length reward: r(l) = max(0, 1 - |l - T| / w), by hand and against a loop reference."""

from __future__ import annotations

import random

import pytest

from mtgrpo.rewards.verifiers.length import LENGTH_UNITS, length_reward


def test_triangular_peak_by_hand() -> None:
    # T = 100, w = 20: l = 100 -> 1; 90 and 110 -> 1 - 10/20 = 0.5; 85 -> 0.25;
    # 120 and 80 -> 0; 200 -> max(0, 1 - 5) = 0.
    reward = length_reward(target_length=100, tolerance=20)
    texts = ["x" * n for n in (100, 90, 110, 85, 120, 80, 200, 0)]
    assert reward(None, texts) == pytest.approx([1.0, 0.5, 0.5, 0.25, 0.0, 0.0, 0.0, 0.0], abs=0)


def test_tokens_unit_counts_completion_ids() -> None:
    reward = length_reward(4, 2, unit="tokens")
    # lengths 4, 5, 6 -> 1, 0.5, 0 (the text is ignored)
    assert reward(None, ["a", "b", "c"], completion_ids=[[1] * 4, [1] * 5, [1] * 6]) == [
        1.0, 0.5, 0.0
    ]  # fmt: skip
    with pytest.raises(ValueError, match="needs completion_ids for the 3 completions, got none"):
        reward(None, ["a", "b", "c"])


def test_matches_a_loop_reference_on_random_lengths() -> None:
    rng = random.Random(0)
    for _ in range(20):
        target, tolerance = rng.uniform(1, 500), rng.uniform(0.5, 200)
        lengths = [rng.randint(0, 800) for _ in range(rng.randint(1, 16))]
        expected = []
        for length in lengths:
            distance = length - target if length > target else target - length
            expected.append(1.0 - distance / tolerance if distance < tolerance else 0.0)
        got = length_reward(target, tolerance)(None, ["x" * n for n in lengths])
        assert got == pytest.approx(expected, rel=0, abs=1e-12)
        assert all(0.0 <= value <= 1.0 for value in got)


def test_conversational_completions_count_their_text() -> None:
    chat = [[{"role": "assistant", "content": "x" * 10}]]
    assert length_reward(10, 1)(None, chat) == [1.0]


def test_invalid_settings() -> None:
    with pytest.raises(ValueError, match="tolerance must be a positive finite number, got 0"):
        length_reward(10, 0)
    with pytest.raises(ValueError, match="target_length must be a positive finite number"):
        length_reward(float("inf"), 1)
    with pytest.raises(TypeError, match="target_length must be a number, got '10'"):
        length_reward("10", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown length unit 'words'; valid names: chars"):
        length_reward(10, 1, unit="words")
    assert LENGTH_UNITS.canonical("characters") == "chars"
