"""An exact Countdown solver, for gold answers the verifier accepts.

Used where a Countdown problem comes without a usable solution: the papers' test sets
(numbers and target only), and reasoning-gym items whose solution is printed by sympy with
a leading unary minus (``-3 + (53 - 29)/3``; 0.3–5 % of items from 4 numbers up), which
the safe verifier refuses by design.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

__all__ = ["solve_countdown"]


def _fold_steps(value: int, expr: str, n: int) -> list[tuple[int, str]]:
    """Values reachable by combining an intermediate result with one more number."""
    # Left to right, + and - need no parentheses; * and / bind tighter, so the fold is wrapped.
    steps = [
        (value + n, f"{expr} + {n}"),
        (value - n, f"{expr} - {n}"),
        (value * n, f"({expr}) * {n}"),
        (n - value, f"{n} - ({expr})"),
    ]
    # exact division only: the fold stays in integers
    if n != 0 and value % n == 0:
        steps.append((value // n, f"({expr}) / {n}"))
    if value != 0 and n % value == 0:
        steps.append((n // value, f"{n} / ({expr})"))
    return steps


def _fold_search(
    value: int,
    expr: str,
    rest: tuple[int, ...],
    target: int,
    failed: set[tuple[int, tuple[int, ...]]],
) -> str | None:
    if not rest:
        return expr if value == target else None
    # rest stays sorted (ints is), so one state has one key
    if (value, rest) in failed:
        return None
    for k, n in enumerate(rest):
        # an equal number already tried here leads to the same states
        if n in rest[:k]:
            continue
        for step_value, step_expr in _fold_steps(value, expr, n):
            found = _fold_search(step_value, step_expr, rest[:k] + rest[k + 1 :], target, failed)
            if found is not None:
                return found
    failed.add((value, rest))
    return None


def _combine(a: Fraction, ea: str, b: Fraction, eb: str) -> list[tuple[Fraction, str]]:
    results = [
        (a + b, f"({ea} + {eb})"),
        (a * b, f"({ea} * {eb})"),
        (a - b, f"({ea} - {eb})"),
        (b - a, f"({eb} - {ea})"),
    ]
    if b != 0:
        results.append((a / b, f"({ea} / {eb})"))
    if a != 0:
        results.append((b / a, f"({eb} / {ea})"))
    return results


def _tree_search(
    values: list[tuple[Fraction, str]], target: Fraction, failed: set[tuple]
) -> str | None:
    if len(values) == 1:
        return values[0][1] if values[0][0] == target else None
    # failure depends on the values alone, not on how they were written
    key = tuple(sorted(value for value, _ in values))
    if key in failed:
        return None
    for i in range(len(values)):
        for j in range(i + 1, len(values)):
            rest = [values[k] for k in range(len(values)) if k not in (i, j)]
            for combined in _combine(*values[i], *values[j]):
                found = _tree_search([*rest, combined], target, failed)
                if found is not None:
                    return found
    failed.add(key)
    return None


def solve_countdown(numbers: Sequence[int], target: int | float) -> str | None:
    """An expression that uses every number exactly once and equals ``target``, or ``None``.

    Two exhaustive searches, memoising states known to fail. First, left folds
    ``((n1 ∘ n2) ∘ n3) ∘ …`` over integers with exact division: reasoning-gym builds its
    countdown targets this way, so this finds a solution for every released test row in
    about a second for all 800 (6 numbers: ~5 ms each). Then, if that fails, every
    expression tree in exact rational arithmetic (complete, but ~0.3 s per 6-number item).
    """
    if not numbers:
        raise ValueError("countdown needs at least one number")
    ints = tuple(sorted(int(n) for n in numbers))
    # the fold search works in integers: a fractional target needs the tree search
    if float(target).is_integer():
        failed: set[tuple[int, tuple[int, ...]]] = set()
        for k, first in enumerate(ints):
            if first in ints[:k]:
                continue
            found = _fold_search(first, str(first), ints[:k] + ints[k + 1 :], int(target), failed)
            if found is not None:
                return found
    values = [(Fraction(n), str(n)) for n in ints]
    found = _tree_search(values, Fraction(target), set())
    # every combination is parenthesised: the outermost pair adds nothing
    if found is not None and len(ints) > 1:
        return found[1:-1]
    return found
