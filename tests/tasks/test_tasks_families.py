"""Task families: level configs give the papers' sizes; task resolution validates early."""

from __future__ import annotations

import re

import pytest

from mtgrpo.tasks.families import (
    ARC_1D_MAX_SIZE,
    FAMILIES,
    arc_item,
    countdown_item,
    generic_item,
    get_family,
    normalize_answer,
    parse_int_sequence,
    reasoning_gym_item,
    resolve_task,
    zebra_item,
)
from mtgrpo.tasks.prompts import ANSWER_FORMATS
from mtgrpo.tasks.solver import solve_countdown

SPAN = 1_000  # any span above the indices used; reasoning-gym's items do not depend on it


@pytest.mark.parametrize(
    ("level", "count"), [("easy", 3), ("medium", 4), ("hard", 5), ("very_hard", 6)]
)
def test_countdown_levels_give_number_counts_and_ranges(level: str, count: int) -> None:
    spec = resolve_task(f"countdown:{level}")
    for index in range(3):
        item = countdown_item("countdown", spec.config, 11, SPAN, index)
        numbers, target = item["metadata"]["numbers"], item["metadata"]["target"]
        assert len(numbers) == count
        assert all(1 <= n <= 100 for n in numbers)
        assert 1 <= target <= 1000


@pytest.mark.parametrize(
    ("level", "size"), [("easy", 10), ("medium", 20), ("hard", 30), ("very_hard", 40)]
)
def test_arc_levels_give_grid_lengths(level: str, size: int) -> None:
    spec = resolve_task(f"arc_1d:{level}")
    for index in range(3):
        item = arc_item("arc_1d", spec.config, 5, SPAN, index)
        assert item["metadata"]["size"] == size
        assert len(item["answer"].split()) == size
        assert item["question"].count("Example ") == 3  # num_train=3, as in the released sets


@pytest.mark.parametrize(("level", "size"), [("easy", 3), ("medium", 4)])
def test_zebra_levels_give_house_and_attribute_counts(level: str, size: int) -> None:
    spec = resolve_task(f"zebra_puzzles:{level}")
    item = zebra_item("zebra_puzzles", spec.config, 3, SPAN, 0)
    question = item["question"]
    assert f"There are {size} houses" in question
    assert len(re.findall(r"\n - ", question)) == size  # one line per characteristic
    assert item["metadata"] == {"num_people": size, "num_characteristics": size}


def test_zebra_hard_levels_configure_five_and_six() -> None:
    # Generating 5x5 / 6x6 puzzles costs 0.3 s / 1.4 s each: the configs are checked instead.
    assert resolve_task("zebra:hard").config == {"num_characteristics": 5, "num_people": 5}
    assert resolve_task("zebra:very_hard").config == {"num_characteristics": 6, "num_people": 6}


def test_countdown_gold_answers_are_solutions_even_when_sympy_prints_unary_minus() -> None:
    from mtgrpo.rewards.verifiers.countdown import countdown_check

    config = resolve_task("countdown:medium").config
    # reasoning-gym's own answer for item 213 of seed 0 is "-3 + (53 - 29)/3", which the
    # verifier refuses (no unary minus); the item must carry a solver-found expression.
    assert reasoning_gym_item("countdown", config, 0, SPAN, 213)["answer"].startswith("-3 +")
    item = countdown_item("countdown", config, 0, SPAN, 213)
    assert not item["answer"].lstrip().startswith("-")
    numbers, target = item["metadata"]["numbers"], item["metadata"]["target"]
    assert countdown_check(item["answer"], numbers, target).correct


def test_resolve_task_ids_and_aliases() -> None:
    spec = resolve_task("zebra:medium")
    assert spec.task_id == "zebra_puzzles:medium"
    assert spec.family is FAMILIES.get("zebra_puzzles")
    assert resolve_task("arc:easy").config == {"max_size": 10, "min_size": 10, "num_train": 3}
    assert resolve_task(spec) is spec


def test_generic_dataset_with_its_own_config() -> None:
    spec = resolve_task({"family": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2}})
    assert spec.task_id == "basic_arithmetic"
    item = generic_item("basic_arithmetic", spec.config, 0, SPAN, 0)
    # two terms -> exactly one binary operator between two numbers
    expression = item["metadata"]["source_metadata"]["expression"]
    assert len(re.findall(r"\d+", expression)) == 2
    question = spec.family.question(item, ANSWER_FORMATS.get("answer_tag"))
    assert question.endswith("Put your final answer in <answer> </answer> tags.")


def test_composite_dataset_accepts_plain_dict_specs() -> None:
    config = {
        "datasets": [
            {"name": "basic_arithmetic", "weight": 1.0, "config": {"min_terms": 2, "max_terms": 2}},
            {"name": "chain_sum", "weight": 1.0, "config": {}},
        ]
    }
    spec = resolve_task({"family": "composite", "config": config, "name": "mix"})
    item = generic_item("composite", spec.config, 0, SPAN, 0)
    assert item["metadata"]["source_metadata"]["source_dataset"] in {
        "basic_arithmetic",
        "chain_sum",
    }


def test_unknown_family_lists_valid_names() -> None:
    with pytest.raises(
        ValueError, match=r"unknown task family 'countdwn'.*countdown.*zebra_puzzles"
    ):
        resolve_task("countdwn:easy")


def test_unknown_level_lists_valid_levels() -> None:
    with pytest.raises(ValueError, match=r"no level 'extreme'.*countdown:easy, countdown:medium"):
        resolve_task("countdown:extreme")


def test_builtin_family_needs_a_level() -> None:
    with pytest.raises(ValueError, match=r"needs a level; valid task ids: arc_1d:easy"):
        resolve_task("arc_1d")


def test_unknown_config_field_lists_valid_fields() -> None:
    with pytest.raises(ValueError, match=r"unknown config field\(s\) \['min_term'\].*min_terms"):
        resolve_task({"family": "basic_arithmetic", "config": {"min_term": 2}})


def test_seed_and_size_are_refused_in_task_configs() -> None:
    with pytest.raises(ValueError, match=r"sets \['seed'\]; seed and size belong to a split"):
        resolve_task({"family": "basic_arithmetic", "config": {"seed": 3}})


def test_reasoning_gym_validation_errors_become_value_errors() -> None:
    with pytest.raises(ValueError, match=r"invalid config .*max_numbers must be >= min_numbers"):
        resolve_task({"family": "countdown", "config": {"min_numbers": 5, "max_numbers": 3}})


def test_level_plus_overrides_needs_a_name() -> None:
    with pytest.raises(ValueError, match=r"needs a 'name'"):
        resolve_task({"family": "countdown", "level": "easy", "config": {"max_target": 50}})
    spec = resolve_task(
        {"family": "countdown", "level": "easy", "config": {"max_target": 50}, "name": "cd-small"}
    )
    assert spec.task_id == "cd-small"
    assert spec.config["max_target"] == 50
    assert spec.config["min_numbers"] == 3


@pytest.mark.parametrize("field", ["min_size", "max_size"])
def test_arc_sizes_above_40_are_refused(field: str) -> None:
    config = {"min_size": 10, "max_size": 30, field: ARC_1D_MAX_SIZE + 10}
    with pytest.raises(ValueError, match=rf"arc_1d {field}=50 exceeds 40.*loop forever"):
        resolve_task({"family": "arc_1d", "config": config, "name": "big-arc"})
    assert resolve_task({"family": "arc_1d", "config": {"min_size": 40, "max_size": 40}})


def test_arc_sizes_are_bounded_inside_a_composite_too() -> None:
    member = {"name": "arc_1d", "weight": 1.0, "config": {"min_size": 45, "max_size": 50}}
    with pytest.raises(ValueError, match="arc_1d min_size=45 exceeds 40"):
        resolve_task({"family": "composite", "config": {"datasets": [member]}, "name": "mix"})


def test_get_family_of_reasoning_gym_dataset_is_exact_match() -> None:
    family = get_family("chain_sum")
    assert family.name == "chain_sum"
    assert family.check(" 12 ", "12", {})
    assert not family.check("13", "12", {})


def test_normalize_answer() -> None:
    assert normalize_answer("  Alice \n") == "alice"
    assert normalize_answer("Bob  \t Smith") == "bob smith"
    assert normalize_answer("Arnold") != normalize_answer("Arnol d")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0 0 1 2", [0, 0, 1, 2]),
        ("0, 0,1 ,2", [0, 0, 1, 2]),
        ("[0, 0, 1, 2]", [0, 0, 1, 2]),
        ("0\n0\n1 2", [0, 0, 1, 2]),
        ("12 3", [12, 3]),
        ("0 0 x 2", None),
        ("grid: 0 0", None),
        ("[[0, 0]]", None),
        ("", None),
    ],
)
def test_parse_int_sequence(text: str, expected: list[int] | None) -> None:
    assert parse_int_sequence(text) == expected


@pytest.mark.parametrize(
    ("numbers", "target"),
    [([8, 73, 96], 841), ([1, 5, 5, 5], 24), ([3, 3, 8, 8], 24), ([94, 1, 1, 93, 37, 22], 627)],
)
def test_solve_countdown_finds_valid_expressions(numbers: list[int], target: int) -> None:
    from mtgrpo.rewards.verifiers.countdown import countdown_check

    expression = solve_countdown(numbers, target)
    assert expression is not None
    assert countdown_check(expression, numbers, target).correct


def test_solve_countdown_reports_unsolvable() -> None:
    # 1, 1, 1 reach at most 3 with + - * /, so 100 is impossible.
    assert solve_countdown([1, 1, 1], 100) is None
    with pytest.raises(ValueError, match="at least one number"):
        solve_countdown([], 3)
