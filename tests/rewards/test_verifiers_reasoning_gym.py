"""reasoning-gym adapter: the allow-list, countdown routed to the safe checker (upstream
evaluates Python), the entry forms, and the guards around upstream scorers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import reasoning_gym

import mtgrpo.rewards.verifiers.reasoning_gym as rg_module
from mtgrpo.rewards.guard import collect_scoring_errors
from mtgrpo.rewards.verifiers.reasoning_gym import (
    AUDITED_FAMILIES,
    MAX_SCORED_ANSWER_CHARS,
    reasoning_gym_reward,
)

COUNTDOWN_ENTRY = {
    "question": "Use 4, 8, 2, 1 to make 15",
    "answer": "8/2*4-1",
    "metadata": {"numbers": [4, 8, 2, 1], "target": 15},
}


def test_the_allow_list() -> None:
    assert AUDITED_FAMILIES.names() == [
        "arc_1d", "basic_arithmetic", "chain_sum", "countdown", "leg_counting",
        "spell_backward", "word_sorting", "zebra_puzzles",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="'puzzle24' is not on the allow-list of audited"):
        reasoning_gym_reward("puzzle24")


@pytest.mark.parametrize("name", [n for n in AUDITED_FAMILIES.names() if n != "countdown"])
def test_every_audited_family_scores_its_own_oracle(name: str) -> None:
    dataset = reasoning_gym.create_dataset(name, size=3, seed=11)
    reward = reasoning_gym_reward(name)
    assert reward.__name__ == f"reasoning_gym_{name}"
    for entry in dataset:
        right = f"<answer>{entry['answer']}</answer>"
        assert reward(None, [right, "<answer>#</answer>", "none"], entry=[entry] * 3) == [
            1.0, 0.0, 0.0
        ]  # fmt: skip


def test_countdown_uses_the_safe_checker_with_reasoning_gyms_levels() -> None:
    reward = reasoning_gym_reward("countdown")
    answers = [
        "(8 - 4) * 2 * 2 - 1",  # = 15 but 2 twice -> 0.05
        "8 / 2 * 4 - 1",  # every number once, = 15 -> 1.0
        "8 * 2 - 1 + 4 - 4",  # 4 used twice -> 0.05
        "8 * 2 + 1 + 4",  # right numbers, 21 -> 0.05
        "8 / (2 - 2) + 1 + 4",  # division by zero -> 0.01
        "-1 + 8 * 2 + 4 - 4",  # unary minus refused -> 0.01
        "",  # empty -> 0.01
    ]
    completions = [f"<answer>{answer}</answer>" for answer in answers]
    rewards = reward(None, completions, entry=[COUNTDOWN_ENTRY] * len(answers))
    assert rewards == [0.05, 1.0, 0.05, 0.05, 0.01, 0.01, 0.01]
    assert reward(None, ["no answer"], entry=[COUNTDOWN_ENTRY]) == [0.01]


def test_upstream_countdown_scorer_evaluates_python_and_ours_does_not(tmp_path: Path) -> None:
    # The audit finding, reproduced: sympy's parse_expr runs the answer as Python.
    marker = tmp_path / "created-by-an-answer"
    payload = f"open({str(marker)!r}, 'w').write('x') and 15"
    upstream = reasoning_gym.get_score_answer_fn("countdown")
    upstream(payload, COUNTDOWN_ENTRY)
    assert marker.exists()
    marker.unlink()
    ours = reasoning_gym_reward("countdown")
    assert ours(None, [f"<answer>{payload}</answer>"], entry=[COUNTDOWN_ENTRY]) == [0.01]
    assert not marker.exists()


def test_entry_forms() -> None:
    reward = reasoning_gym_reward("countdown")
    right = ["<answer>8 / 2 * 4 - 1</answer>"]
    metadata = COUNTDOWN_ENTRY["metadata"]
    assert reward(None, right, entry=[json.dumps(COUNTDOWN_ENTRY)]) == [1.0]
    assert reward(None, right, answer=["x"], metadata=[metadata]) == [1.0]
    assert reward(None, right, answer=["x"], metadata=[json.dumps(metadata)]) == [1.0]
    assert reward(None, right, metadata=[COUNTDOWN_ENTRY]) == [1.0]  # a full entry
    assert reward(None, right * 2, entry=[COUNTDOWN_ENTRY, None]) == [1.0, None]
    zebra = reasoning_gym_reward("zebra_puzzles")
    assert zebra(None, ["<answer>Carol</answer>"] * 2, answer=["carol", None]) == [1.0, None]


def test_entry_errors() -> None:
    reward = reasoning_gym_reward("countdown")
    with pytest.raises(TypeError, match="needs the reasoning-gym entry"):
        reward(None, ["x"], question=["q"])
    with pytest.raises(ValueError, match="column 'entry' holds text that is not JSON"):
        reward(None, ["x"], entry=["{oops"])
    with pytest.raises(ValueError, match="must hold a dict or a JSON object, got list"):
        reward(None, ["x"], metadata=[[1, 2]])
    with pytest.raises(ValueError, match="the reasoning-gym entry does not fit its scorer"):
        reward(None, ["<answer>1</answer>"], answer=["1"], metadata=[{"target": 1}])


def test_long_answers_count_as_missing() -> None:
    zebra = reasoning_gym_reward("zebra_puzzles")
    long_answer = "a" * (MAX_SCORED_ANSWER_CHARS + 1)
    assert zebra(None, [f"<answer>{long_answer}</answer>"], answer=[long_answer]) == [0.0]


def test_upstream_guards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reasoning_gym, "get_score_answer_fn", lambda name: lambda a, e: 1.0)
    with pytest.raises(ValueError, match=r"not the audited ZebraDataset\.score_answer"):
        reasoning_gym_reward("zebra_puzzles")
    monkeypatch.undo()
    monkeypatch.setattr(rg_module.package_metadata, "version", lambda name: "9.9.9")
    with pytest.warns(UserWarning, match=r"reasoning-gym 9\.9\.9 is installed"):
        reasoning_gym_reward("arc_1d")


def test_scorer_values_are_clamped_and_scorer_crashes_score_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entry = {"answer": "a", "metadata": {}}
    assert rg_module._checked_score(lambda a, e: 3.5, "a", entry) == 1.0
    assert rg_module._checked_score(lambda a, e: -1.0, "a", entry) == 0.0
    assert rg_module._checked_score(lambda a, e: float("nan"), "a", entry) == 0.0

    def crashes_on_b(answer: str | None, entry: dict) -> float:
        if answer == "b":
            raise ZeroDivisionError("a scorer bug")
        return 1.0

    monkeypatch.setattr(rg_module, "_upstream_scorer", lambda family: crashes_on_b)
    reward = reasoning_gym_reward("zebra_puzzles")
    with collect_scoring_errors() as failed:
        scores = reward(None, ["<answer>a</answer>", "<answer>b</answer>"], answer=["a", "a"])
    assert scores == [1.0, 0.0]  # the model's text broke the scorer: 0, counted
    assert failed == [1]


def test_an_entry_its_scorer_cannot_score_is_a_dataset_error() -> None:
    def needs_metadata(answer: str | None, entry: dict) -> float:
        return float(entry["metadata"]["target"] == answer)

    with pytest.raises(rg_module.EntryError, match="does not fit its scorer"):
        rg_module._checked_score(needs_metadata, "b", {"answer": "a", "metadata": {}})
