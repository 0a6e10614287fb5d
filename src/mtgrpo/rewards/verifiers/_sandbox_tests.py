"""Tests as the sandbox runs them: units, value checks the parent judges, strict equality.

A test written ``assert <expr> <op> <literal>`` (or ``<literal> <op> <expr>``), with ``<op>``
one of ``==``, ``!=``, ``in``, ``not in`` (``is``/``is not`` with ``None``, ``True`` or
``False``), possibly under ``not``, is a *value check*: the sandboxed program evaluates only
``<expr>`` and reports its value as plain data; the launcher, outside the sandbox, holds the
literal (evaluated here with :func:`ast.literal_eval`) and compares. The expected value never
enters the sandboxed process, so nothing the program reads or writes there (its own memory
included) tells it what to answer.

Every other ``assert`` keeps its verdict inside the sandbox: the unit reports a random token
when it runs to the end, and every ``a == b`` in it becomes ``__mtgrpo_strict_eq__(a, b)``
(plain data compared by value, so an object whose ``__eq__`` always answers ``True`` does
not pass). Such a test is only as strong as the sandbox's secrecy of the token: when
packages that can read memory are allowed (``extra_paths``), it is refused.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["STRICT_EQ", "VALUE_CHECK", "TestPlan", "ValueCheck", "prepare_tests"]

STRICT_EQ = "__mtgrpo_strict_eq__"  # the harness binds these names in every test's globals
VALUE_CHECK = "__mtgrpo_check__"
_OPERATORS = {ast.Eq: "==", ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in",
              ast.Is: "is", ast.IsNot: "is not"}  # fmt: skip
_SINGLETONS = (None, True, False)


@dataclass(frozen=True)
class ValueCheck:
    """One value check, judged outside the sandbox.

    Attributes:
        unit: index of the unit (in :attr:`TestPlan.units`) the check belongs to.
        op: ``"=="``, ``"!="``, ``"in"``, ``"not in"``, ``"is"`` or ``"is not"``.
        expected: the literal's value (plain data).
        literal_left: the literal was the left operand (``3 in f(x)``).
        negate: the comparison was under an odd number of ``not``.
    """

    unit: int
    op: str
    expected: Any
    literal_left: bool
    negate: bool


@dataclass(frozen=True)
class TestPlan:
    """Tests split into units for the sandbox.

    Attributes:
        units: ``(kind, source)`` in order, kind ``"test"`` or ``"setup"``; in a test's
            source, value checks read ``__mtgrpo_check__(<index>, <expr>)`` and other
            equalities ``__mtgrpo_strict_eq__(a, b)``.
        checks: the value checks, by index.
        token_tests: numbers of the tests whose verdict rests (also) on the sandbox's
            token: they have an ``assert`` that is not a value check, or no check at all.
    """

    units: tuple[tuple[str, str], ...]
    checks: tuple[ValueCheck, ...]
    token_tests: tuple[int, ...]

    @property
    def test_count(self) -> int:
        return sum(kind == "test" for kind, _ in self.units)

    def test_units(self) -> list[int]:
        """Unit index of each test, in test order."""
        return [index for index, (kind, _) in enumerate(self.units) if kind == "test"]


def prepare_tests(tests: str | Sequence[str], *, values_only: bool = False) -> TestPlan:
    """Split tests into setup and test units, with value checks and strict equalities.

    A string is a test file: each top-level ``assert`` is one test, every other top-level
    statement (imports, helpers, assignments) is setup run in the program's namespace. A
    list holds one test per item (an item may have several statements; it passes when all
    run and all its value checks hold). Tests come from the dataset: one that is not valid
    Python is a ``ValueError`` naming it. ``values_only=True`` (the sandbox allows packages
    that can read memory) refuses, with a ``ValueError`` naming it, any test whose verdict
    would rest on the sandboxed process's word.

    >>> plan = prepare_tests(["assert add(1, 2) == 3", "assert add(0, 0) > -1"])
    >>> plan.units[0][1], plan.checks[0].expected, plan.token_tests
    ('__mtgrpo_check__(0, add(1, 2))', 3, (1,))
    """
    if isinstance(tests, str):
        body = _parse_tests(tests, "tests").body
        units = [("test" if isinstance(node, ast.Assert) else "setup", [node]) for node in body]
    elif isinstance(tests, Sequence) and all(isinstance(test, str) for test in tests):
        units = [("test", _parse_tests(test, f"tests[{i}]").body) for i, test in enumerate(tests)]
    else:
        raise TypeError(
            "tests must be a string of Python statements or a list of strings (one test "
            f"each), got {type(tests).__name__}: {tests!r:.80}"
        )
    checks: list[ValueCheck] = []
    token_tests: list[int] = []
    prepared: list[tuple[str, str]] = []
    for index, (kind, nodes) in enumerate(units):
        before = len(checks)
        statements = [_split_assert(node, index, checks) if kind == "test" else node
                      for node in nodes]  # fmt: skip
        statements = [_StrictEquality().visit(node) for node in statements]
        asserts = any(isinstance(node, ast.Assert) for s in statements for node in ast.walk(s))
        if kind == "test" and (asserts or len(checks) == before):
            token_tests.append(sum(k == "test" for k, _ in prepared))
        elif kind == "setup" and asserts:
            token_tests.append(-1)
        prepared.append((kind, ast.unparse([ast.fix_missing_locations(s) for s in statements])))
    plan = TestPlan(tuple(prepared), tuple(checks), tuple(token_tests))
    if values_only and plan.token_tests:
        raise ValueError(_values_only_message(tests, plan))
    return plan


def _values_only_message(tests: str | Sequence[str], plan: TestPlan) -> str:
    first = plan.token_tests[0]
    where = "the setup code has an assert" if first < 0 else f"test {first} "
    if first >= 0:
        source = plan.units[plan.test_units()[first]][1]
        where += f"({source!r:.100}) is not a value check"
    return (
        f"{where}: with SandboxLimits.extra_paths the sandbox allows packages that can read "
        "the process's memory (numpy can), so only tests judged outside the sandbox are "
        "safe. Write each test as `assert <expression> == <literal>` (or !=, in, not in, "
        "is None), use input/output cases (test_cases), or leave extra_paths empty"
    )


def _parse_tests(source: str, where: str) -> ast.Module:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise ValueError(f"{where} is not valid Python ({error}): {source!r:.120}") from None


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _split_assert(node: ast.stmt, unit: int, checks: list[ValueCheck]) -> ast.stmt:
    """``assert [not] <expr> <op> <literal>`` -> ``__mtgrpo_check__(<index>, <expr>)``."""
    if not isinstance(node, ast.Assert):
        return node
    test, negate = node.test, False
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, negate = test.operand, not negate
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return node
    op = _OPERATORS.get(type(test.ops[0]))
    left, right = test.left, test.comparators[0]
    (left_literal, left_value), (right_literal, right_value) = _literal(left), _literal(right)
    if op is None or left_literal == right_literal:
        return node
    expected = left_value if left_literal else right_value
    if op in ("is", "is not") and not any(expected is value for value in _SINGLETONS):
        return node
    checks.append(ValueCheck(unit, op, expected, left_literal, negate))
    expression = right if left_literal else left
    call = ast.Call(ast.Name(VALUE_CHECK, ast.Load()),
                    [ast.Constant(len(checks) - 1), expression], [])  # fmt: skip
    return ast.copy_location(ast.Expr(ast.copy_location(call, node)), node)


class _StrictEquality(ast.NodeTransformer):
    """Every ``a == b`` (and ``a != b``) inside an assert becomes a strict (in)equality."""

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        node.test = _StrictCompare().visit(node.test)
        return node

    def visit_Expr(self, node: ast.Expr) -> ast.Expr:  # a value check's expression
        if isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == VALUE_CHECK:
            node.value.args[1] = _StrictCompare().visit(node.value.args[1])
        return node


class _StrictCompare(ast.NodeTransformer):
    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            return node
        call = ast.Call(ast.Name(STRICT_EQ, ast.Load()), [node.left, node.comparators[0]], [])
        strict: ast.expr = ast.copy_location(call, node)
        if isinstance(node.ops[0], ast.NotEq):
            strict = ast.copy_location(ast.UnaryOp(ast.Not(), strict), node)
        return strict
