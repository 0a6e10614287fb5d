"""Built-in environments for ``GRPOTrainer(environment_factory=...)``: each one is a task.

An environment (TRL's contract, :mod:`mtgrpo.rollout.agent.environments`) is a class with
``reset(**row)``, public methods the model calls as tools, and ``get_reward()`` scoring the
rollout from the environment's state (a reward channel named after the class)::

    GRPOTrainer(model, environment_factory={"calculator": CalculatorEnv,
                                            "guess": GuessTheNumberEnv}, train_dataset=rows)

* :class:`CalculatorEnv`: ``calculate(expression)`` evaluates ``+ - * /`` and parentheses on
  integers and decimals exactly (a small recursive-descent parser over :class:`Fraction`, never
  ``eval``), ``submit(answer)`` records the final answer. Rows: ``answer`` (an arithmetic
  problem: the submitted number must equal it) or ``numbers`` / ``nums`` and ``target`` (a
  Countdown problem: the submitted expression is checked by
  :func:`~mtgrpo.rewards.countdown_check`, every number exactly once).
* :class:`GuessTheNumberEnv`: a game with state over turns; ``guess(number)`` answers
  ``higher`` / ``lower`` / ``correct`` within a budget of guesses.
* :class:`PythonEnv`: ``python(code)`` runs code in :mod:`mtgrpo.sandbox` (kernel-enforced
  limits, no network, no host files) and returns its output, truncated.

Tools are hostile territory: every tool answers bad input with a message the model reads and
never raises (the tool loop would turn an exception into a message too, but a message written
here says what to fix).
"""

from __future__ import annotations

import random
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from mtgrpo.rewards import countdown_check
from mtgrpo.sandbox import SandboxLimits, SandboxUnavailableError, run_python

__all__ = [
    "MAX_CALCULATOR_CHARS",
    "MAX_CALCULATOR_DEPTH",
    "MAX_CALCULATOR_MAGNITUDE",
    "MAX_PYTHON_OUTPUT_CHARS",
    "CalculatorEnv",
    "GuessTheNumberEnv",
    "PythonEnv",
    "calculate",
]

MAX_CALCULATOR_CHARS = 200  # tool input is model text: bounded parsing work
MAX_CALCULATOR_DEPTH = 16  # bounds the recursion far below Python's recursion limit
MAX_CALCULATOR_MAGNITUDE = Fraction(10) ** 15  # |every literal and intermediate value| <= this
MAX_PYTHON_OUTPUT_CHARS = 2_000

# Unsigned literals: a sign is a unary operator of the parser.
_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d*)?|\.\d+)|([-+*/()]))")


class _CalculatorError(ValueError):
    """Why an expression has no value, in words the model reads."""


def calculate(expression: str) -> str:
    """Evaluate ``expression`` (``+ - * /``, unary minus, parentheses, integers and decimals)
    exactly; the value or ``"error: ..."`` as text, never an exception.

    >>> calculate("(1.5 + 2) * 4 / 3")
    '4.666666666667'
    >>> calculate("1 / 0")
    'error: division by zero'
    """
    if not isinstance(expression, str):
        return f"error: the expression must be text, got {type(expression).__name__}"
    if len(expression) > MAX_CALCULATOR_CHARS:
        return f"error: expression longer than {MAX_CALCULATOR_CHARS} characters"
    try:
        value = _Parser(_tokens(expression)).expression_value()
    except _CalculatorError as error:
        return f"error: {error}"
    return _render(value)


def _tokens(expression: str) -> list[str]:
    tokens, position = [], 0
    # Each match eats leading spaces; trailing ones would be an empty token.
    stripped = expression.rstrip()
    while position < len(stripped):
        match = _TOKEN.match(stripped, position)
        if match is None:
            bad = stripped[position:].lstrip()[:1]
            raise _CalculatorError(f"unexpected character {bad!r}: use numbers, + - * / and "
                                   "parentheses")
        tokens.append(match.group(1) or match.group(2))
        position = match.end()
    if not tokens:
        raise _CalculatorError("empty expression")
    return tokens


class _Parser:
    """expression := term (('+'|'-') term)*; term := factor (('*'|'/') factor)*;
    factor := ('+'|'-') factor | number | '(' expression ')'. Depth counts parentheses and
    signs, so recursion stays within :data:`MAX_CALCULATOR_DEPTH` levels."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.index, self.depth = tokens, 0, 0

    def expression_value(self) -> Fraction:
        value = self._expression()
        if self.index < len(self.tokens):
            raise _CalculatorError(f"unexpected {self.tokens[self.index]!r}")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def _expression(self) -> Fraction:
        value = self._term()
        while self._peek() in ("+", "-"):
            operator = self.tokens[self.index]
            self.index += 1
            right = self._term()
            value = _bounded(value + right if operator == "+" else value - right)
        return value

    def _term(self) -> Fraction:
        value = self._factor()
        while self._peek() in ("*", "/"):
            operator = self.tokens[self.index]
            self.index += 1
            right = self._factor()
            if operator == "/" and right == 0:
                raise _CalculatorError("division by zero")
            value = _bounded(value * right if operator == "*" else value / right)
        return value

    def _factor(self) -> Fraction:
        token = self._peek()
        if token is None:
            raise _CalculatorError("the expression ends early")
        if token in ("+", "-", "("):
            self.depth += 1
            if self.depth > MAX_CALCULATOR_DEPTH:
                raise _CalculatorError(f"nested deeper than {MAX_CALCULATOR_DEPTH} levels")
            self.index += 1
            if token == "(":
                value = self._expression()
                if self._peek() != ")":
                    raise _CalculatorError("unbalanced parentheses")
                self.index += 1
            else:
                value = self._factor()
                value = -value if token == "-" else value
            self.depth -= 1
            return value
        if token in ("*", "/", ")"):
            raise _CalculatorError(f"unexpected {token!r}")
        self.index += 1
        # Exact: Decimal("0.1") is 1/10, which float("0.1") is not.
        return _bounded(Fraction(Decimal(token)))


def _bounded(value: Fraction) -> Fraction:
    # Exact Fractions would grow without bound over repeated products: every step is checked.
    if abs(value) > MAX_CALCULATOR_MAGNITUDE:
        raise _CalculatorError("number too large (the limit is 1e15 in magnitude)")
    return value


def _render(value: Fraction) -> str:
    """An integer as is; otherwise at most 12 decimals, trailing zeros dropped."""
    if value.denominator == 1:
        return str(value.numerator)
    # Decimal's default 28 digits hold 16 integer digits (the 1e15 bound) and the 12 decimals
    text = f"{Decimal(value.numerator) / Decimal(value.denominator):.12f}".rstrip("0")
    return text.rstrip(".") or "0"


def _number(text: Any) -> Fraction | None:
    """A number the model or the dataset wrote (``"1,234.5"``, ``42``), or None."""
    if isinstance(text, bool):  # True is an int, not a number the model wrote
        return None
    try:
        number = text if isinstance(text, int) else \
            Decimal(text if isinstance(text, float) else str(text).strip().replace(",", ""))
        if isinstance(number, Decimal) and (not number.is_finite() or abs(number.adjusted()) > 30):
            return None  # NaN, infinity, or an exponent that would build a huge integer
        return Fraction(number)
    except (InvalidOperation, ValueError, OverflowError, TypeError):
        return None


class CalculatorEnv:
    """A calculator and a box for the final answer (module docstring).

    Reward (``get_reward``): 1.0 when the submitted answer is right, else 0.0 (nothing
    submitted: 0.0). An arithmetic row's answer must equal ``answer`` within 1e-6; a Countdown
    row's answer is an expression using every number exactly once whose value is ``target``.
    """

    def reset(self, **row: Any) -> str:
        """Take the row's problem; the instructions are appended to the prompt."""
        self.expected = row.get("answer")
        # "nums": the column name countdown_reward accepts too.
        self.numbers = row.get("numbers", row.get("nums"))
        self.target = row.get("target")
        self.submitted: str | None = None
        self.calls = 0
        what = ("an expression using every given number exactly once"
                if self.numbers is not None else "the final number")
        return f"\n\nUse the calculate tool for arithmetic, then call submit with {what}."

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: Numbers (integers or decimals) with + - * / and parentheses,
                e.g. "(3 + 4.5) * 2".

        Returns:
            The value, or a message starting with "error:".
        """
        self.calls += 1
        return calculate(expression)

    def submit(self, answer: str) -> str:
        """Submit the final answer; the last submission counts.

        Args:
            answer: The final answer (a number, or for a Countdown problem the expression).

        Returns:
            A confirmation.
        """
        self.submitted = str(answer)
        return "submitted"

    def get_reward(self) -> float:
        if self.submitted is None:
            return 0.0
        if self.numbers is not None and self.target is not None:
            try:
                return float(countdown_check(self.submitted, self.numbers, self.target).correct)
            except ValueError:  # the row's numbers or target are not a Countdown problem
                return 0.0
        expected, given = _number(self.expected), _number(self.submitted)
        if expected is None:
            return float(self.submitted.strip() == str(self.expected).strip())
        # A value copied from calculate()'s 12 decimals still matches.
        return float(given is not None and abs(given - expected) <= Fraction(1, 10**6))


class GuessTheNumberEnv:
    """Find a secret integer by guessing; each guess is answered higher, lower or correct.

    ``reset(**row)``: the range is ``low``..``high`` (default 1..100) and the budget
    ``max_guesses`` (default 7, enough for binary search over 1..100); the secret is the row's
    ``secret``, or drawn in the range by a generator seeded with the row's ``seed`` and prompt
    (the same row always gives the same secret).

    With the row's ``show_range`` true, each answer also states the range the secret is still
    in (``higher: from 51 to 60 (5 guesses left)``), so the model need not track it over the
    turns: the game for a model too small to remember, with the same search to learn.

    Reward (``get_reward``): 1.0 when the secret was guessed within the budget, else 0.0. With
    the class attribute ``reward_fewer_guesses = True`` (a subclass) a win scores
    ``1 - 0.5 * (guesses - 1) / (max_guesses - 1)``: 1.0 at the first guess, 0.5 at the last.
    """

    reward_fewer_guesses = False

    def reset(self, **row: Any) -> str:
        """Draw the secret; the rules are appended to the prompt."""
        self.low, self.high = int(row.get("low", 1)), int(row.get("high", 100))
        if self.low > self.high:
            raise ValueError(f"GuessTheNumberEnv: low={self.low} > high={self.high}; give a "
                             "row with low <= high")
        self.max_guesses = max(1, int(row.get("max_guesses", 7)))
        if row.get("secret") is not None:
            self.secret = int(row["secret"])
        else:
            seed = f"{row.get('seed', '')}|{row.get('prompt', '')}"
            # A str seed is hashed with SHA-512: the same secret whatever PYTHONHASHSEED.
            self.secret = random.Random(seed).randint(self.low, self.high)
        self.guesses = 0
        self.found = False
        self.show_range = bool(row.get("show_range", False))
        self.range = [self.low, self.high]  # where the secret can still be, from the answers
        return (f"\n\nI am thinking of an integer from {self.low} to {self.high}. Call guess "
                f"with a number; you have {self.max_guesses} guesses.")

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: Your guess, an integer.

        Returns:
            "higher" (the secret is larger), "lower" (smaller) or "correct", with the
            guesses left.
        """
        if self.found:
            return "correct: already found; stop guessing"
        if self.guesses >= self.max_guesses:
            return "no guesses left"
        value = _number(number)
        if value is None or value.denominator != 1:  # 2.0 counts as 2; 2.5 is refused
            return f"error: {number!r} is not an integer; guess an integer"
        self.guesses += 1
        left = self.max_guesses - self.guesses
        if value == self.secret:
            self.found = True
            return "correct"
        answer = "higher" if self.secret > value else "lower"
        if not self.show_range:
            return f"{answer} ({left} guesses left)"
        if answer == "higher":
            self.range[0] = max(self.range[0], int(value) + 1)
        else:
            self.range[1] = min(self.range[1], int(value) - 1)
        return f"{answer}: from {self.range[0]} to {self.range[1]} ({left} guesses left)"

    def get_reward(self) -> float:
        if not self.found:
            return 0.0
        # One guess allowed: no scale to reward, and no 0 / 0.
        if not self.reward_fewer_guesses or self.max_guesses == 1:
            return 1.0
        return 1.0 - 0.5 * (self.guesses - 1) / (self.max_guesses - 1)


class PythonEnv:
    """A Python interpreter in :mod:`mtgrpo.sandbox`: each call is a fresh process (no state
    between calls) with the class's ``limits``; stdout, then stderr, truncated to
    :data:`MAX_PYTHON_OUTPUT_CHARS`. No ``get_reward``: pair it with reward functions (or
    subclass it to add one). Where the kernel cannot build the sandbox, every call answers so.
    """

    limits = SandboxLimits(timeout_seconds=10.0, test_timeout_seconds=5.0, cpu_seconds=5,
                           memory_bytes=512 * 2**20, output_bytes=64 * 2**10)

    def reset(self, **row: Any) -> None:
        """Nothing to set up: each call starts from scratch."""

    def python(self, code: str) -> str:
        """Run a Python program and read what it prints (a fresh interpreter each call;
        standard library only, no network, no files outside a scratch directory).

        Args:
            code: The program; print what you want to see.

        Returns:
            Its output, or the error or limit it hit.
        """
        if not isinstance(code, str):
            return f"error: code must be text, got {type(code).__name__}"
        try:
            result = run_python(code, limits=self.limits)
        except SandboxUnavailableError as error:
            return f"error: the sandbox is unavailable here ({error})"
        status = {"ok": "", "timeout": "error: time limit exceeded\n",
                  "output_limit": "error: output limit exceeded\n",
                  "syntax_error": "error: syntax error\n",
                  "killed": "error: killed (a resource limit)\n",
                  "sandbox_error": "error: the sandbox failed\n"}.get(result.status, "")
        # The sandbox harness prefixes the program's own error with "program: ".
        stderr = result.stderr.replace("program: ", "", 1)
        # The harness's per-test clock (test_timeout_seconds) ran out: a time-out too.
        if "TestTimeout" in stderr:
            status, stderr = "error: time limit exceeded\n", ""
        text = status + result.stdout + stderr
        if len(text) > MAX_PYTHON_OUTPUT_CHARS:
            text = (text[:MAX_PYTHON_OUTPUT_CHARS]
                    + f"\n... (output cut at {MAX_PYTHON_OUTPUT_CHARS} characters)")
        return text or "(no output)"
