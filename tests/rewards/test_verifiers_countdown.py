"""Countdown: seed 002's samples, exact Fraction arithmetic against a recursive reference
on random expressions, the number rules, the refusals, and hostile inputs under 100 ms."""

from __future__ import annotations

import random
import time
from fractions import Fraction

import pytest

from mtgrpo.rewards.verifiers.countdown import (
    MAX_EXPRESSION_CHARS,
    MAX_LITERAL_DIGITS,
    MAX_PAREN_DEPTH,
    CountdownCheck,
    countdown_check,
    countdown_reward,
)

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


def test_seed_002_rewards_with_its_subset_rule() -> None:
    # Seed 002: format required, numbers a subset of [4, 8, 2, 1], value 15.
    # 1: "8 * 2 - 1" = 15 (subset)        2: same        3, 4: out of format
    # 5: "8 + 4 - 2" = 10 (wrong value)   6: "10 * 2 - 5" uses 10 and 5 (not given)
    rewards = countdown_reward(
        None, SEED_002_COMPLETIONS, target=["15"] * 6, nums=[[4, 8, 2, 1]] * 6,
        use_all_numbers=False,
    )  # fmt: skip
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_default_rule_uses_every_number_exactly_once() -> None:
    # "8 * 2 - 1" leaves 4 unused: wrong under the game's (and reasoning-gym's) rule.
    assert countdown_reward(None, SEED_002_COMPLETIONS[:1], target=[15], nums=[[4, 8, 2, 1]]) == [
        0.0
    ]
    done = "x</think>\n<answer>(8 - 4) * 2 * 2 - 1</answer>"
    assert countdown_reward(None, [done], target=[15], numbers=[[4, 8, 2, 2, 1]]) == [1.0]


def _reference_value(node: tuple) -> Fraction | None:
    """Recursive evaluation of an expression tree (the plain reference)."""
    if node[0] == "num":
        return Fraction(node[1])
    _, op, left, right = node
    a, b = _reference_value(left), _reference_value(right)
    if a is None or b is None or (op == "/" and b == 0):
        return None
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]


def _random_tree(rng: random.Random, numbers: list[int]) -> tuple:
    if len(numbers) == 1:
        return ("num", numbers[0])
    cut = rng.randint(1, len(numbers) - 1)
    op = rng.choice("+-*/")
    return ("op", op, _random_tree(rng, numbers[:cut]), _random_tree(rng, numbers[cut:]))


def _render(node: tuple) -> str:
    if node[0] == "num":
        return str(node[1])
    _, op, left, right = node
    return f"({_render(left)} {op} {_render(right)})"


@pytest.mark.parametrize("seed", range(4))
def test_value_matches_a_recursive_reference_on_random_trees(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        numbers = [rng.randint(0, 99) for _ in range(rng.randint(1, 7))]
        tree = _random_tree(rng, numbers)
        expected = _reference_value(tree)
        target = int(expected) if expected is not None and expected.denominator == 1 else 1
        check = countdown_check(_render(tree), numbers, target)
        assert check.parsed
        assert check.numbers_ok
        assert check.value == expected
        assert check.correct == (expected is not None and expected == target)
        assert check.reason in {"ok", "wrong value", "division by zero"}


def test_arithmetic_is_exact() -> None:
    # 8 / 3 * 3 is 8 exactly with Fractions (as a float it is 7.999999999999999 or 8.0
    # depending on order); 1/3 + 1/3 + 1/3 is exactly 1.
    assert countdown_check("8 / 3 * 3", [8, 3, 3], 8).correct
    assert countdown_check("1 / 3 + 1 / 3 + 1 / 3", [1, 3, 1, 3, 1, 3], 1).value == 1
    # Float targets are compared within 1e-6: 1 / 3 vs 0.333333 differs by 3.3e-7.
    assert countdown_check("1 / 3", [1, 3], 0.333333).correct
    assert not countdown_check("1 / 3", [1, 3], 0.3333).correct
    assert not countdown_check("1 / 3", [1, 3], 0).correct


@pytest.mark.parametrize(
    ("expression", "numbers", "use_all", "ok"),
    [
        ("1 + 1", [1, 1], True, True),
        ("1 + 1", [1], True, False),  # 1 used twice, given once
        ("1 + 1", [1], False, False),  # a sub-multiset may not repeat a number either
        ("1", [1, 2], False, True),
        ("1", [1, 2], True, False),
        ("2 * 1", [1, 2], True, True),  # order does not matter
    ],
)
def test_number_rules(expression: str, numbers: list[int], use_all: bool, ok: bool) -> None:
    assert countdown_check(expression, numbers, 2, use_all_numbers=use_all).numbers_ok is ok


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("-1 + 3", "disallowed syntax: UnaryOp"),
        ("+1 + 1", "disallowed syntax: UnaryOp"),
        ("2 ** 3", "disallowed syntax: Pow"),
        ("7 // 2", "disallowed syntax: FloorDiv"),
        ("(1)(2)", "disallowed syntax: Call"),
        ("1, 2", "disallowed character ','"),
        ("7 % 2", "disallowed character '%'"),
        ("abs(1)", "disallowed character 'a'"),
        ("1.5 + 1", "disallowed character '.'"),
        ("1 = 1", "disallowed character '='"),
        ("٣ + ٤", "non-ASCII digit '٣'"),
        ("３ + ４", "non-ASCII digit '３'"),
        ("1 +", "syntax error"),
        ("08 + 1", "syntax error"),  # Python refuses leading zeros
        ("", "empty expression"),
        ("   ", "empty expression"),
    ],
)
def test_refusals_say_why(expression: str, reason: str) -> None:
    check = countdown_check(expression, [1, 2, 3, 4, 7, 8], 1)
    assert check == CountdownCheck(False, False, None, False, reason)


def test_division_by_zero_is_parsed_but_has_no_value() -> None:
    check = countdown_check("8 / (2 - 2)", [8, 2, 2], 4)
    assert (check.parsed, check.numbers_ok, check.value, check.correct) == (True, True, None, False)
    assert check.reason == "division by zero"


def test_wrong_numbers_still_report_the_value() -> None:
    check = countdown_check("10 * 2 - 5", [4, 8, 2, 1], 15)
    assert (check.parsed, check.numbers_ok, check.value, check.correct) == (True, False, 15, False)
    assert check.reason.startswith("numbers not allowed: used [2, 5, 10]")


HOSTILE = {
    "power tower": "9**9**9**9",
    "paren bomb": "(" * 10_000 + "1" + ")" * 10_000,
    "deep but short": "(" * (MAX_PAREN_DEPTH + 1) + "1" + ")" * (MAX_PAREN_DEPTH + 1),
    "10 MB": "1+" * 5_000_000 + "1",
    "huge literal": "9" * 5_000,
    "long literal": "1" * (MAX_LITERAL_DIGITS + 1),
    "unary chain": "-" * (MAX_EXPRESSION_CHARS - 1) + "1",
    "operator chain": "+".join(["9"] * (MAX_EXPRESSION_CHARS // 2)),
    "division chain": "/".join(["7"] * (MAX_EXPRESSION_CHARS // 2)),
    "big products": "*".join(["9" * MAX_LITERAL_DIGITS] * 52),
    "arabic digits": "٣" * 1000,
    "fullwidth digits": "３ * ４",
    "division by zero": "1 / (1 - 1)",
    "control chars": "1\x00+\x1b2",
    "not text": None,
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_expressions_finish_well_under_100ms(name: str) -> None:
    expression = HOSTILE[name]
    started = time.perf_counter()
    check = countdown_check(expression, [9, 9, 9, 9], 24)  # type: ignore[arg-type]
    completion = f"x</think>\n<answer>{expression}</answer>"
    rewards = countdown_reward(None, [completion], target=[24], nums=[[9, 9, 9, 9]])
    elapsed = time.perf_counter() - started
    assert elapsed < 0.1, f"{name}: {elapsed * 1000:.1f} ms"
    assert not check.correct
    assert rewards == [0.0]


def test_rows_without_a_target_do_not_apply() -> None:
    done = "x</think>\n<answer>1 + 2</answer>"
    rewards = countdown_reward(None, [done, done], target=[3, None], numbers=[[1, 2], [1, 2]])
    assert rewards == [1.0, None]


def test_targets_may_be_strings_and_floats() -> None:
    done = "x</think>\n<answer>1 + 2</answer>"
    assert countdown_reward(None, [done] * 3, target=["3", 3.0, " 3 "], nums=[[1, 2]] * 3) == [
        1.0, 1.0, 1.0
    ]  # fmt: skip


def test_without_the_format_requirement() -> None:
    texts = ["1 + 2", "blah <answer>1 + 2</answer>", "<answer>1 + 2"]
    rewards = countdown_reward(None, texts, target=[3] * 3, nums=[[1, 2]] * 3, require_format=False)
    assert rewards == [1.0, 1.0, 0.0]
    assert countdown_reward(None, texts, target=[3] * 3, nums=[[1, 2]] * 3) == [0.0] * 3


def test_configuration_errors() -> None:
    with pytest.raises(TypeError, match="needs the dataset column 'nums' or 'numbers'"):
        countdown_reward(None, ["x"], target=[3])
    with pytest.raises(ValueError, match="column 'target' has 2 values for 1 completions"):
        countdown_reward(None, ["x"], target=[3, 4], nums=[[1]])
    with pytest.raises(ValueError, match="target 'fifteen' is not a number"):
        countdown_reward(None, ["x"], target=["fifteen"], nums=[[1]])
    with pytest.raises(ValueError, match="countdown numbers must be integers"):
        countdown_check("1", ["a"], 1)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="countdown target must be finite"):
        countdown_check("1", [1], float("nan"))
    with pytest.raises(ValueError, match="countdown target must be an int or a float"):
        countdown_check("1", [1], "1")  # type: ignore[arg-type]
