"""Countdown: a safe exact checker for arithmetic expressions, and its reward function.

The game: combine the given numbers with ``+ - * /`` and parentheses to reach the target.
The expression is never handed to ``eval``: it is screened character by character, parsed
with :func:`ast.parse` only once it is known to be small and shallow, and evaluated by a
walk over an allow-list of node types with :class:`fractions.Fraction` arithmetic, so
``8 / 3 * 3`` is exactly 8 and no float rounding can make a wrong answer right.

What an expression may contain (anything else is "not parsed"):

* ASCII digits, ``+ - * /``, parentheses, spaces, tabs and newlines; integer literals of at
  most :data:`MAX_LITERAL_DIGITS` digits (Python's rules: no leading zeros).
* Binary operators only. Unary minus (and plus) is refused: the game combines the given
  numbers with binary operations, and ``-(a - b)`` is just ``b - a``. (reasoning-gym's
  scorer accepts it because it evaluates any sympy expression; this is a deliberate,
  stricter departure.)
* No ``**``, ``//``, ``%``, names, calls, attributes, decimals or ``=``: ``9**9**9**9`` is
  refused before any arithmetic.
* Unicode digits (Arabic-Indic, fullwidth, ...) are refused: Python's parser does not
  accept them as literals, and counting them would let text that a reader sees as different
  numbers match the given ones.

Bounded work: expressions longer than :data:`MAX_EXPRESSION_CHARS` or nested deeper than
:data:`MAX_PAREN_DEPTH` parentheses are refused before parsing (``ast.parse`` recurses and a
parenthesis bomb would otherwise cost a ``RecursionError`` or ``MemoryError``); the evaluator
is iterative. With at most 1,000 characters of literals of at most 18 digits, exact
arithmetic stays below a few thousand digits.
"""

from __future__ import annotations

import ast
import math
import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from mtgrpo.rewards.guard import score_each
from mtgrpo.rewards.verifiers._batch import column, completion_texts
from mtgrpo.rewards.verifiers.answer import extract_tag
from mtgrpo.rewards.verifiers.format import parse_think_answer

__all__ = [
    "FLOAT_TARGET_TOLERANCE",
    "MAX_EXPRESSION_CHARS",
    "MAX_LITERAL_DIGITS",
    "MAX_PAREN_DEPTH",
    "CountdownCheck",
    "countdown_check",
    "countdown_reward",
]

MAX_EXPRESSION_CHARS = 1_000
MAX_PAREN_DEPTH = 32
MAX_LITERAL_DIGITS = 18  # with the length cap: exact arithmetic below a few thousand digits
# the atol of reasoning-gym's np.isclose (its rtol is not applied)
FLOAT_TARGET_TOLERANCE = Fraction(1, 10**6)

# an allow-list, screened before ast.parse ever sees the text
_ALLOWED_CHARS = frozenset("0123456789+-*/() \t\n\r")
# no Pow, FloorDiv or Mod: 9**9**9**9 is refused before any arithmetic
_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


@dataclass(frozen=True)
class CountdownCheck:
    """The verdict on one expression.

    Attributes:
        parsed: the expression is well formed under the rules above.
        numbers_ok: its integer literals are allowed by the given numbers (each exactly once
            with ``use_all_numbers``, else a sub-multiset).
        value: its exact value, ``None`` when not parsed or on division by zero.
        correct: parsed, numbers ok, and the value equals the target.
        reason: ``"ok"`` or why not, in words.
    """

    parsed: bool
    numbers_ok: bool
    value: Fraction | None
    correct: bool
    reason: str


def countdown_check(
    expression: str,
    numbers: Sequence[int],
    target: int | float,
    *,
    use_all_numbers: bool = True,
) -> CountdownCheck:
    """Check a Countdown answer exactly and safely; never raises on ``expression``.

    ``use_all_numbers=True``: every given number is used exactly once (reasoning-gym's
    scoring and the MT-GRPO benchmark's rule). ``False``: the literals form a sub-multiset of
    the given numbers (each number at most as often as given; seed 002's rule). An integer
    target must be hit exactly; a float target within :data:`FLOAT_TARGET_TOLERANCE`
    (absolute). Invalid ``numbers`` or ``target`` (dataset input) raise ``ValueError``.

    >>> countdown_check("8 * 2 - 1", [4, 8, 2, 1], 15, use_all_numbers=False).correct
    True
    >>> countdown_check("8 * 2 - 1", [4, 8, 2, 1], 15).reason
    'numbers not allowed: used [1, 2, 8], given [1, 2, 4, 8] (each exactly once)'
    >>> countdown_check("9**9**9**9", [9, 9, 9, 9], 1).reason
    'disallowed syntax: Pow'
    """
    given = _given_numbers(numbers)
    goal, tolerance = _target(target)
    parsed = _parse(expression)
    if isinstance(parsed, str):
        return CountdownCheck(False, False, None, False, parsed)
    tree, literals = parsed
    numbers_ok, numbers_reason = _numbers_allowed(literals, given, use_all_numbers)
    value = _evaluate(tree)
    if value is None:
        return CountdownCheck(True, numbers_ok, None, False, "division by zero")
    if not numbers_ok:
        return CountdownCheck(True, False, value, False, numbers_reason)
    # Fractions: 8 / 3 * 3 is exactly 8, and no rounding can make a wrong answer right
    correct = abs(value - goal) <= tolerance
    return CountdownCheck(True, True, value, correct, "ok" if correct else "wrong value")


def _given_numbers(numbers: Sequence[int]) -> Counter[int]:
    if isinstance(numbers, (str, bytes)) or not isinstance(numbers, Sequence):
        raise ValueError(
            f"countdown numbers must be a list of integers, got {type(numbers).__name__}: "
            f"{numbers!r:.80}"
        )
    try:
        return Counter(_as_int(number) for number in numbers)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"countdown numbers must be integers, got {list(numbers)!r:.80}; convert the "
            "dataset column to integers"
        ) from error


def _as_int(number: Any) -> int:
    # 8.0 is the integer 8; operator.index below refuses 8.5
    if isinstance(number, float) and number.is_integer():
        return int(number)
    if isinstance(number, str):
        return int(number.strip())
    return operator.index(number)


def _target(target: int | float) -> tuple[Fraction, Fraction]:
    """(exact target, tolerance): 0 for an integer target, 1e-6 for a float one."""
    if isinstance(target, float):
        if not math.isfinite(target):
            raise ValueError(f"countdown target must be finite, got {target!r}")
        return Fraction(target), FLOAT_TARGET_TOLERANCE
    # bool is an int: True is no target
    if isinstance(target, bool) or not hasattr(target, "__index__"):
        raise ValueError(
            f"countdown target must be an int or a float, got {type(target).__name__}: "
            f"{target!r:.80}"
        )
    return Fraction(operator.index(target)), Fraction(0)


def _screen(expression: str) -> str:
    """Why the raw text is refused before parsing ("" when it may be parsed)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"expression longer than {MAX_EXPRESSION_CHARS} characters"
    depth = 0
    run = 0  # current run of digits: caps literal size before int() ever sees it
    for char in expression:
        if char not in _ALLOWED_CHARS:
            kind = "non-ASCII digit" if char.isdigit() else "disallowed character"
            return f"{kind} {char!r}"
        run = run + 1 if "0" <= char <= "9" else 0
        if run > MAX_LITERAL_DIGITS:
            return f"integer literal longer than {MAX_LITERAL_DIGITS} digits"
        if char == "(":
            depth += 1
            # checked here, before ast.parse, whose parser recurses once per level
            if depth > MAX_PAREN_DEPTH:
                return f"parentheses nested deeper than {MAX_PAREN_DEPTH}"
        elif char == ")":
            depth -= 1
    return ""


def _parse(expression: Any) -> tuple[ast.expr, list[int]] | str:
    """(tree, integer literals) when the expression is well formed, else the reason why not."""
    if not isinstance(expression, str):
        return "expression is not text"
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"expression longer than {MAX_EXPRESSION_CHARS} characters"
    # length checked first: the cap bounds strip()'s work too
    expression = expression.strip()
    if not expression:
        return "empty expression"
    reason = _screen(expression)
    if reason:
        return reason
    try:
        tree = ast.parse(expression, mode="eval").body
    # defence in depth: the screen already bounds size and nesting
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "syntax error"
    literals: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _OPERATORS:
                return f"disallowed syntax: {type(node.op).__name__}"
        # exactly int: a float or bool constant is refused, never counted as a number
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            literals.append(node.value)
        # ast.walk also yields the operator nodes (Add, ...) themselves
        elif not isinstance(node, ast.operator):
            return f"disallowed syntax: {type(node).__name__}"
    return tree, literals


def _numbers_allowed(
    literals: list[int], given: Counter[int], use_all_numbers: bool
) -> tuple[bool, str]:
    used = Counter(literals)
    # Counter subtraction keeps positive counts only: empty means a sub-multiset
    ok = used == given if use_all_numbers else not (used - given)
    if ok:
        return True, "ok"
    rule = "each exactly once" if use_all_numbers else "each at most as often as given"
    return False, (
        f"numbers not allowed: used {sorted(used.elements())}, given "
        f"{sorted(given.elements())} ({rule})"
    )


def _evaluate(tree: ast.expr) -> Fraction | None:
    """Exact value of a screened tree (BinOp/Constant only); ``None`` on division by zero.

    Iterative post-order walk, so a long operator chain cannot exhaust the Python stack.
    """
    values: dict[int, Fraction] = {}
    stack: list[tuple[ast.expr, bool]] = [(tree, False)]
    while stack:
        node, children_done = stack.pop()
        if isinstance(node, ast.Constant):
            values[id(node)] = Fraction(node.value)
        elif not children_done:
            assert isinstance(node, ast.BinOp)
            # the parent is revisited after both children
            stack.extend([(node, True), (node.right, False), (node.left, False)])
        else:
            assert isinstance(node, ast.BinOp)
            # pop: each operand is read once, so only pending values stay in memory
            left, right = values.pop(id(node.left)), values.pop(id(node.right))
            symbol = _OPERATORS[type(node.op)]
            # a wrong answer, not a verifier error: raising would be counted by score_each
            if symbol == "/" and right == 0:
                return None
            values[id(node)] = _apply(symbol, left, right)
    return values[id(tree)]


def _apply(symbol: str, left: Fraction, right: Fraction) -> Fraction:
    if symbol == "+":
        return left + right
    if symbol == "-":
        return left - right
    if symbol == "*":
        return left * right
    return left / right


def countdown_reward(
    prompts: Sequence[Any] | None,
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]] | None = None,
    *,
    use_all_numbers: bool = True,
    require_format: bool = True,
    **columns: Any,
) -> list[float | None]:
    """1.0 for a correct Countdown expression, 0.0 otherwise; ``None`` where no target is set.

    Columns: ``target`` and the numbers as ``nums`` (seed 002's name) or ``numbers``
    (reasoning-gym's). A row whose target or numbers is ``None`` is not a Countdown row and
    gets ``None``. Range: {0.0, 1.0} or ``None``.

    Where the expression is read:

    * ``require_format=True`` (default, seed 002's rule): the completion must follow
      :func:`~mtgrpo.rewards.verifiers.format.format_reward`'s
      ``<think>...</think>\\n<answer>...</answer>`` format, and the answer block is the
      expression; a completion out of format scores 0.
    * ``require_format=False``: the last ``<answer>...</answer>`` if there is one, else the
      whole completion.

    ``use_all_numbers=True`` (default) is the game's and reasoning-gym's rule (every number
    exactly once); seed 002 allows a subset: pass ``use_all_numbers=False`` (for a fixed
    choice, ``functools.partial(countdown_reward, use_all_numbers=False)``; the reward keeps
    its name). Targets may be ints, floats or numeric strings (``"15"``).

    >>> done = "8 * 2 = 16, minus 1.</think>\\n<answer>8 * 2 - 1</answer>"
    >>> countdown_reward(None, [done, done], target=["15", 15], nums=[[8, 2, 1], [8, 2, 4, 1]])
    [1.0, 0.0]
    """
    texts = completion_texts("countdown_reward", completions)
    targets = column("countdown_reward", columns, ("target",), len(texts))
    numbers = column("countdown_reward", columns, ("nums", "numbers"), len(texts))
    goals = [None if target is None else _column_target(target) for target in targets]
    for goal, given in zip(goals, numbers, strict=True):  # dataset input: checked up front,
        if goal is not None and given is not None:  # so a malformed row is an error, not
            _target(goal)  # a failure to score some completion
            _given_numbers(given)

    def score(row: tuple[str, Any, Any]) -> float | None:
        text, goal, given = row
        # not a Countdown row: not applicable, never 0 (DESIGN.md)
        if goal is None or given is None:
            return None
        expression = _expression(text, require_format)
        if expression is None:
            return 0.0
        check = countdown_check(expression, given, goal, use_all_numbers=use_all_numbers)
        return 1.0 if check.correct else 0.0

    return score_each("countdown_reward", zip(texts, goals, numbers, strict=True), score)


def _expression(text: str, require_format: bool) -> str | None:
    if require_format:
        parsed = parse_think_answer(text)
        return None if parsed is None else parsed.answer
    tagged = extract_tag(text)
    return tagged if tagged is not None else text  # a bare expression is an answer too


def _column_target(target: Any) -> int | float:
    """A target cell as a number: ints and floats pass, numeric strings are converted."""
    if isinstance(target, str):
        text = target.strip()
        try:
            return int(text)  # int first: '15' stays an exact integer target
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            raise ValueError(
                f"countdown_reward: target {target!r:.80} is not a number; the target column "
                "must hold numbers or numeric strings"
            ) from None
    # 15.0 is an integer target too, hit exactly
    if isinstance(target, float) and target.is_integer():
        return int(target)
    if isinstance(target, int) and not isinstance(target, bool):
        return target
    if hasattr(target, "__index__"):  # numpy and other integer types
        return operator.index(target)
    if hasattr(target, "__float__"):  # numpy floats
        return float(target)
    raise ValueError(
        f"countdown_reward: target {target!r:.80} is not a number; the target column must hold "
        "numbers or numeric strings"
    )
