"""Environments as tasks in a run file: episodes, their splits, the section's bad inputs, and
the warm start's demonstrations rendered as the tool loop renders a rollout."""

from __future__ import annotations

import random
from typing import Any

import pytest

from mtgrpo.config import run_config_from_dict
from mtgrpo.models import build_tiny_tokenizer
from mtgrpo.rollout.agent import ToolLoop
from mtgrpo.rollout.agent.demonstrations import FINAL_TURN, demonstration_example
from mtgrpo.rollout.agent.environments import environment_methods, with_observation
from mtgrpo.rollout.agent.parsing import parse_hermes_tool_calls
from mtgrpo.tasks.environments import GuessTheNumberEnv
from mtgrpo.tasks.episodes import (
    EnvironmentsConfig,
    calculator_episode,
    guess_episode,
)

BOTH = {"calculator": {"kind": "calculator", "digits": [3, 2]},
        "guess": {"kind": "guess_the_number", "width": 20, "max_guesses": 6},
        "ranged": {"kind": "guess", "width": 20, "max_guesses": 6, "show_range": True}}


def _content(row: dict[str, Any]) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in row.items() if k not in ("id", "prompt")))


def test_calculator_episode_is_a_product_the_row_answers() -> None:
    rng = random.Random(3)
    for _ in range(200):
        row = calculator_episode(rng, digits=[3, 2])
        a, b = (int(x) for x in row["expression"].split(" * "))
        assert 100 <= a <= 999
        assert 10 <= b <= 99
        assert row["answer"] == str(a * b)
        assert row["prompt"] == [{"role": "user", "content": f"What is {a} * {b}?"}]


def test_guess_episode_places_a_range_of_width_inside_the_bounds() -> None:
    rng = random.Random(4)
    for _ in range(500):
        row = guess_episode(rng, low=1, high=100, width=20, max_guesses=6)
        assert row["low"] >= 1
        assert row["high"] <= 100
        assert row["high"] - row["low"] == 19
        assert row["low"] <= row["secret"] <= row["high"]


@pytest.mark.parametrize(("entry", "message"), [
    ({"kind": "calculator", "digits": [3]}, "two operand sizes"),
    ({"kind": "calculator", "operator": "/"}, "operator"),
    ({"kind": "guess_the_number", "width": 200}, "width"),
    ({"kind": "guess_the_number", "widht": 20}, "unknown option"),
    ({"kind": "guess_the_number", "show_range": "yes"}, "show_range"),
    ({"kind": "sudoku"}, "sudoku"),
    ({"kind": "calculator", "factory": "mtgrpo.tasks.environments:CalculatorEnv"}, "either kind"),
    ({}, "either kind"),
    ({"factory": "mtgrpo.tasks.environments:CalculatorEnv"}, "needs episodes"),
    ({"factory": "mtgrpo.tasks.environments:NoSuchEnv", "episodes": "x.y:z"}, "NoSuchEnv"),
    ({"kind": "calculator", "episodes": "mtgrpo.tasks.episodes:guess_episode"}, "brings its own"),
    ("calculator", "must be a mapping"),
])
def test_bad_environment_entries_are_refused_before_anything_loads(entry: Any,
                                                                   message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EnvironmentsConfig({"env": entry})


def test_bad_section_options_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown option"):
        EnvironmentsConfig.from_dict({"environments": BOTH, "train_sizes": 3})
    with pytest.raises(ValueError, match="train_size"):
        EnvironmentsConfig(BOTH, train_size=0)
    with pytest.raises(ValueError, match="map each environment"):
        EnvironmentsConfig({})
    with pytest.raises(ValueError, match="without '/'"):
        EnvironmentsConfig({"a/b": {"kind": "calculator"}})


def test_splits_are_disjoint_sized_and_reproducible() -> None:
    config = EnvironmentsConfig(BOTH, train_size=40, eval_size=20, seed=7)
    evals, train, warm = config.eval_rows(), config.train_rows(), config.warm_start_rows(30)
    for rows, size in ((evals, 20), (train, 40), (warm, 30)):
        for name in BOTH:
            mine = [row for row in rows if row["environment"] == name]
            assert len(mine) == size
            assert len({_content(row) for row in mine}) == size  # no repeat inside a split
    for name in BOTH:
        keys = [{_content(r) for r in rows if r["environment"] == name}
                for rows in (evals, train, warm)]
        assert not keys[0] & keys[1]
        assert not keys[0] & keys[2]
        assert not keys[1] & keys[2]
    assert config.train_rows() == train  # the same seed gives the same episodes
    assert EnvironmentsConfig(BOTH, train_size=40, eval_size=20, seed=8).train_rows() != train
    assert train[0]["id"] == "calculator/train/0"
    assert train[40]["id"] == "guess/train/0"


def test_a_split_larger_than_its_problem_space_names_the_fix() -> None:
    config = EnvironmentsConfig({"g": {"kind": "guess", "low": 1, "high": 20, "width": 20}},
                                train_size=15, eval_size=10)
    with pytest.raises(ValueError, match=r"only 10 distinct train episodes.*widen"):
        config.train_rows()


def test_a_users_environment_by_import_path() -> None:
    config = EnvironmentsConfig({"g": {"factory": "mtgrpo.tasks.environments:GuessTheNumberEnv",
                                       "episodes": "mtgrpo.tasks.episodes:guess_episode",
                                       "width": 8}}, train_size=3, eval_size=2)
    assert config.factories() == {"g": GuessTheNumberEnv}
    assert all(row["high"] - row["low"] == 7 for row in config.train_rows())
    tokenizer = build_tiny_tokenizer(chat_template="tools")
    with pytest.raises(ValueError, match="has no demonstration"):
        demonstration_example(config.specs["g"], config.train_rows()[0], tokenizer)


def test_run_file_section_round_trips_and_excludes_tasks() -> None:
    raw = {"environments": {"environments": BOTH, "train_size": 5, "eval_size": 3}}
    run = run_config_from_dict(raw)
    assert run.environments is not None
    assert set(run.environments.factories()) == set(BOTH)
    again = run_config_from_dict(run.to_dict())
    assert again.environments is not None
    assert again.environments.to_dict() == run.environments.to_dict()
    with pytest.raises(ValueError, match="environments section and a tasks section"):
        run_config_from_dict({**raw, "tasks": {"tasks": ["basic_arithmetic"]}})
    with pytest.raises(ValueError, match=r"environments section and data\.train"):
        run_config_from_dict({**raw, "data": {"train": "rows.jsonl"}})


class _Backend:
    """Enough of a generation backend for ToolLoop.render (which only tokenizes)."""

    eos_token_ids = ()


@pytest.mark.parametrize("name", ["calculator", "guess", "ranged"])
def test_demonstrations_solve_the_episode_and_render_as_the_tool_loop_does(name: str) -> None:
    config = EnvironmentsConfig(BOTH, train_size=30, eval_size=5)
    spec = config.specs[name]
    tokenizer = build_tiny_tokenizer(chat_template="tools")
    loop = ToolLoop(_Backend(), tokenizer, max_completion_length=512)
    for row in [r for r in config.warm_start_rows(30) if r["environment"] == name]:
        example = demonstration_example(spec, row, tokenizer)
        environment = spec.factory()
        messages = with_observation(row["prompt"], environment.reset(**row))
        prompt_ids = loop.render(messages, environment_methods(environment))
        assert tokenizer(example["prompt"], add_special_tokens=False)["input_ids"] == prompt_ids
        # replay the model's turns through the parser against a fresh environment
        turns = example["completion"].split("<|im_start|>assistant\n")
        assert turns[-1] == f"{FINAL_TURN}<|im_end|>"
        for turn in turns[:-1]:
            parsed = parse_hermes_tool_calls(turn.split("<|im_end|>")[0])
            assert len(parsed.calls) == 1
            assert not parsed.calls[0].malformed
            call = parsed.calls[0]
            reply = str(getattr(environment, call.name)(**call.arguments))
            assert f"<tool_response>\n{reply}\n</tool_response>" in turn
        assert environment.get_reward() == 1.0


def test_a_demonstration_that_fails_is_refused() -> None:
    config = EnvironmentsConfig({"g": {"kind": "guess", "width": 20, "max_guesses": 2}},
                                train_size=40, eval_size=5)
    tokenizer = build_tiny_tokenizer(chat_template="tools")
    # two guesses find 3 secrets of 20 by binary search: the first of the others is refused
    row = next(r for r in config.train_rows()
               if r["secret"] not in _binary_search_firsts(r["low"], r["high"]))
    with pytest.raises(ValueError, match="must solve the episode"):
        demonstration_example(config.specs["g"], row, tokenizer)


def _binary_search_firsts(low: int, high: int) -> set[int]:
    middle = (low + high) // 2
    return {middle, (low + middle - 1) // 2, (middle + 1 + high) // 2}
