"""The built-in environments: each tool's answers, bad input answered as text (never raised),
state across turns, rewards, and the python tool's sandbox."""

from __future__ import annotations

import os
from typing import Any

import pytest

from mtgrpo.tasks.environments import (
    MAX_CALCULATOR_CHARS,
    MAX_CALCULATOR_DEPTH,
    MAX_PYTHON_OUTPUT_CHARS,
    CalculatorEnv,
    GuessTheNumberEnv,
    PythonEnv,
    calculate,
)


@pytest.mark.parametrize(("expression", "value"), [
    ("1 + 2 * 3", "7"), ("(1 + 2) * 3", "9"), ("(1.5 + 2) * 4 / 3", "4.666666666667"),
    ("-7 / 2", "-3.5"), ("0.1 + 0.2", "0.3"), (".5 + 1.", "1.5"), ("--3", "3"),
    ("10 / 4 * 2", "5"), ("1 - 2 - 3", "-4"), ("  42  ", "42"), ("1/3", "0.333333333333"),
])
def test_calculate_evaluates_exactly(expression: str, value: str) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(("expression", "message"), [
    ("1 / 0", "division by zero"), ("1 / (2 - 2)", "division by zero"),
    ("9" * 30, "number too large"), ("99999999 * 99999999", "number too large"),
    ("(" * 50 + "1" + ")" * 50, f"nested deeper than {MAX_CALCULATOR_DEPTH}"),
    ("-" * 50 + "1", f"nested deeper than {MAX_CALCULATOR_DEPTH}"),
    ("1+" * 200 + "1", f"longer than {MAX_CALCULATOR_CHARS} characters"),
    ("abc", "unexpected character 'a'"), ("2 ** 3", "unexpected '*'"), ("1e5", "'e'"),
    ("__import__('os')", "unexpected character '_'"), ("", "empty expression"),
    ("1 +", "ends early"), ("(1", "unbalanced"), ("1)", "unexpected ')'"), ("1.2.3", "'.3'"),
])
def test_calculate_answers_bad_input_as_text(expression: str, message: str) -> None:
    answer = calculate(expression)
    assert answer.startswith("error: ")
    assert message in answer


@pytest.mark.parametrize("bad", [None, 12, ["1+1"], {"a": 1}])
def test_calculate_refuses_non_text(bad: Any) -> None:
    assert calculate(bad).startswith("error: the expression must be text")


def test_calculator_env_scores_the_submitted_arithmetic_answer() -> None:
    env = CalculatorEnv()
    assert "submit with the final number" in env.reset(prompt="What is 12 * 3.5?", answer="42")
    assert env.get_reward() == 0.0  # nothing submitted
    assert env.calculate("12 * 3.5") == "42"
    assert env.submit("42.0") == "submitted"
    assert env.get_reward() == 1.0
    env.submit("41")
    assert env.get_reward() == 0.0  # the last submission counts
    for hostile in ("1e999999999", "nan", "inf", "forty-two", ""):
        env.submit(hostile)
        assert env.get_reward() == 0.0
    env.reset(answer="1,234")
    env.submit("1234")
    assert env.get_reward() == 1.0
    assert env.calls == 0  # reset clears the state


def test_calculator_env_checks_a_countdown_expression() -> None:
    env = CalculatorEnv()
    assert "every given number exactly once" in env.reset(numbers=[4, 8, 2, 1], target=15)
    env.submit("8 * 2 - 1")
    assert env.get_reward() == 0.0  # 4 unused
    env.submit("4 * 2 + 8 - 1")
    assert env.get_reward() == 1.0
    env.submit("9**9**9**9")
    assert env.get_reward() == 0.0
    env.reset(nums=[3, 5], target=8)  # seed 002's column name
    env.submit("3 + 5")
    assert env.get_reward() == 1.0
    env.reset(nums="not numbers", target=8)
    env.submit("3 + 5")
    assert env.get_reward() == 0.0  # a bad row scores 0, never raises


def test_guess_the_number_keeps_state_across_turns() -> None:
    env = GuessTheNumberEnv()
    assert "from 1 to 100" in env.reset(prompt="Play.", secret=37, max_guesses=5)
    assert env.guess(50) == "lower (4 guesses left)"
    assert env.guess(25) == "higher (3 guesses left)"
    assert env.get_reward() == 0.0
    assert env.guess(37) == "correct"
    assert env.get_reward() == 1.0
    assert env.guess(37).startswith("correct: already found")
    assert env.guesses == 3


def test_guess_the_number_can_state_the_range_left() -> None:
    env = GuessTheNumberEnv()
    env.reset(secret=37, low=1, high=100, max_guesses=6, show_range=True)
    assert env.guess(50) == "lower: from 1 to 49 (5 guesses left)"
    assert env.guess(25) == "higher: from 26 to 49 (4 guesses left)"
    assert env.guess(60) == "lower: from 26 to 49 (3 guesses left)"  # no news: the same range
    assert env.guess(-5) == "higher: from 26 to 49 (2 guesses left)"
    assert env.guess(37) == "correct"
    env.reset(secret=37, max_guesses=6)  # a row without it: the plain answers
    assert env.guess(50) == "lower (5 guesses left)"


def test_guess_the_number_budget_and_bad_guesses() -> None:
    env = GuessTheNumberEnv()
    env.reset(secret=7, max_guesses=2, low=1, high=10)
    for bad in ("seven", 2.5, None, [7], float("nan"), True):
        assert env.guess(bad).startswith("error: ")  # type: ignore[arg-type]
    assert env.guesses == 0  # a bad guess costs nothing
    assert env.guess(10**100).startswith("lower")
    assert env.guess("3").startswith("higher")  # a number written as text counts
    assert env.guess(7) == "no guesses left"
    assert env.get_reward() == 0.0


def test_guess_the_number_secret_is_seeded_by_the_row() -> None:
    def secret(**row: Any) -> int:
        env = GuessTheNumberEnv()
        env.reset(**row)
        return env.secret

    rows = [{"prompt": f"Game {i}.", "seed": i} for i in range(20)]
    secrets = [secret(**row) for row in rows]
    assert secrets == [secret(**row) for row in rows]
    assert len(set(secrets)) > 5
    assert all(1 <= s <= 100 for s in secrets)
    assert secret(low=5, high=5) == 5
    with pytest.raises(ValueError, match="low=9 > high=1"):
        secret(low=9, high=1)


def test_guess_the_number_can_reward_fewer_guesses() -> None:
    class Efficient(GuessTheNumberEnv):
        reward_fewer_guesses = True

    env = Efficient()
    env.reset(secret=3, max_guesses=5)
    env.guess(3)
    assert env.get_reward() == 1.0
    env.reset(secret=3, max_guesses=5)
    for number in (1, 2, 4, 5, 3):
        env.guess(number)
    assert env.get_reward() == pytest.approx(0.5)


def test_tools_render_as_json_schemas() -> None:
    from transformers.utils import get_json_schema

    calculator = get_json_schema(CalculatorEnv().calculate)["function"]
    assert calculator["name"] == "calculate"
    assert calculator["parameters"]["properties"]["expression"]["type"] == "string"
    guess = get_json_schema(GuessTheNumberEnv().guess)["function"]
    assert guess["parameters"]["properties"]["number"]["type"] == "integer"
    assert get_json_schema(CalculatorEnv().submit)["function"]["parameters"]["required"] == [
        "answer"]
    assert get_json_schema(PythonEnv().python)["function"]["parameters"]["required"] == ["code"]


# ---------------------------------------------------------------------- the python tool

def _python(code: str) -> str:
    env = PythonEnv()
    env.reset(prompt="x")
    answer = env.python(code)
    if "sandbox is unavailable" in answer:
        pytest.skip("the kernel cannot build the sandbox here")
    return answer


def test_python_tool_runs_code_and_reports_errors() -> None:
    assert _python("print(6 * 7)") == "42\n"
    assert _python("pass") == "(no output)"
    assert "ZeroDivisionError" in _python("1 / 0")
    assert _python("def (").startswith("error: syntax error")
    assert PythonEnv().python(None).startswith("error: code must be text")  # type: ignore[arg-type]


@pytest.mark.parametrize(("code", "expected"), [
    ("print(open('/etc/passwd').read())", "no access to '/etc/passwd'"),
    ("import os\nwhile True:\n    os.fork()", "fork is not allowed"),
    ("while True:\n    pass", "error: time limit exceeded"),
    ("print('x' * 10**7)", "error: output limit exceeded"),
    ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)", "Error"),
])
def test_python_tool_contains_escape_attempts(code: str, expected: str) -> None:
    pid, cwd = os.getpid(), os.getcwd()
    answer = _python(code)
    assert expected in answer
    assert "root:" not in answer
    assert len(answer) <= MAX_PYTHON_OUTPUT_CHARS + 60
    assert (os.getpid(), os.getcwd()) == (pid, cwd)  # the trainer's process is untouched
    assert _python("print('alive')") == "alive\n"
