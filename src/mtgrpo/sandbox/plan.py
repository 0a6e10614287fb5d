"""Tests as the sandbox runs them: units, and the names each unit asks of the program.

Every test runs in the judge (``_judge.py``), a sandboxed process of its own that the
program cannot reach; the program's process only answers for its own names and objects,
with plain data. So a test may be written in any form, and none is weaker than another:

* a **list** holds one test per item (an item may have several statements; it passes when
  it runs to the end);
* a **string** is a test file. Its top-level statements are, in order: *tests* (an
  ``assert``; a loop or other compound statement containing an ``assert``; a call of a
  function the file defines, as HumanEval's ``check(candidate)``) and *setup* (imports,
  helpers, constants, run in the judge's namespace for the tests that follow). After them,
  as pytest would collect them, each top-level ``def test_*()`` taking no arguments and each
  ``test*`` method of a top-level ``class Test*`` (a plain class or a ``unittest.TestCase``)
  is one more test.

A test file that holds no test is a ``ValueError``: a correct program would score 0.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CASE", "TestPlan", "prepare_tests"]

CASE = "__mtgrpo_case__"  # the judge's runner of a test class's method
_BUILTINS = frozenset(dir(builtins))


@dataclass(frozen=True)
class TestPlan:
    """Tests split into units for the judge.

    Attributes:
        units: ``(kind, source)`` in order, kind ``"test"`` or ``"setup"``.
        names: per unit, the names it reads that the program may define (every name it
            loads, less the builtins' and dunder names): the judge asks the program's
            process for those not bound by earlier setup.
        binds: per unit, the names its top level binds (setup units only matter).
    """

    units: tuple[tuple[str, str], ...]
    names: tuple[tuple[str, ...], ...]
    binds: tuple[tuple[str, ...], ...]

    @property
    def test_count(self) -> int:
        return sum(kind == "test" for kind, _ in self.units)

    def test_units(self) -> list[int]:
        """Unit index of each test, in test order."""
        return [index for index, (kind, _) in enumerate(self.units) if kind == "test"]


def prepare_tests(tests: str | Sequence[str], *, entry_point: str | None = None) -> TestPlan:
    """Split tests into setup and test units (see the module docstring).

    ``entry_point`` (HumanEval's column: the name of the function under test) completes a
    test file that defines ``check(candidate)`` but never calls it, with ``check(<entry
    point>)``. Tests come from the dataset: one that is not valid Python, a file with no
    test, or an entry point that is not an identifier is a ``ValueError`` naming it.

    >>> plan = prepare_tests(["assert add(1, 2) == 3", "assert abs(add(0, 0)) < 1"])
    >>> plan.units[1], plan.names[1]
    (('test', 'assert abs(add(0, 0)) < 1'), ('add',))
    """
    if isinstance(tests, str):
        units = _file_units(tests, _parse_tests(tests, "tests").body, entry_point)
        if not any(kind == "test" for kind, _, _ in units):
            raise ValueError(
                f"the test file holds no test: {tests!r:.120}. Write top-level asserts, call "
                "the check function it defines (check(candidate) with the function's name), "
                "give the entry_point column, or define test_* functions"
            )
    elif isinstance(tests, Sequence) and all(isinstance(test, str) for test in tests):
        units = [("test", test, _parse_tests(test, f"tests[{i}]").body)
                 for i, test in enumerate(tests)]  # fmt: skip
    else:
        raise TypeError(
            "tests must be a string of Python statements or a list of strings (one test "
            f"each), got {type(tests).__name__}: {tests!r:.80}"
        )
    sources = tuple((kind, source) for kind, source, _ in units)
    names = tuple(_read_names(nodes) for _, _, nodes in units)
    binds = tuple(_bound_names(nodes) for _, _, nodes in units)
    return TestPlan(sources, names, binds)


def _parse_tests(source: str, where: str) -> ast.Module:
    try:
        return ast.parse(source)
    # MemoryError: the parser's stack overflows on deep nesting ("-" * 100000 + "1");
    # ValueError: a NUL byte, as compile() documents it for Python 3.11
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise ValueError(f"{where} is not valid Python ({error}): {source!r:.120}") from None


def _file_units(source: str, body: list[ast.stmt], entry_point: str | None) -> list[tuple]:
    """``(kind, source, [node])`` per top-level statement, then the collected tests. Each
    unit keeps its own text (``ast.unparse`` would rewrite it, and cannot print an int of
    more than 4,300 digits)."""
    defined = {node.name for node in body
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}  # fmt: skip
    lines = source.splitlines(keepends=True)
    units: list[tuple] = []
    collected: list[str] = []
    for node in body:
        kind = "test" if _is_test(node, defined) else "setup"
        units.append((kind, _segment(lines, node), [node]))
        collected += _collected_tests(node)
    # HumanEval's test files define check(candidate) and leave the call to the runner
    called = any(isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                 and getattr(node.value.func, "id", None) == "check" for node in body)  # fmt: skip
    if entry_point is not None and "check" in defined and not called:
        if not entry_point.isidentifier():
            raise ValueError(f"entry_point {entry_point!r} is not a Python name")
        collected.insert(0, f"check({entry_point})")
    return units + [("test", text, ast.parse(text).body) for text in collected]


def _segment(lines: list[str], node: ast.stmt) -> str:
    """The text of a top-level statement (with its decorators), from its lines."""
    decorators = getattr(node, "decorator_list", [])
    # a decorated definition's lineno is its "def" line: the text starts at the first decorator
    first = min([node.lineno, *(d.lineno for d in decorators)]) - 1
    # a decorator's col_offset is that of its expression, after the "@"; a statement after a
    # ";" (x = 1; assert f(x)) starts mid-line
    start = 0 if decorators else node.col_offset
    last, end = node.end_lineno - 1, node.end_col_offset
    # ast offsets count UTF-8 bytes, not characters
    if first == last:
        return lines[first].encode()[start:end].decode()
    head = lines[first].encode()[start:].decode()
    tail = lines[last].encode()[:end].decode()
    return head + "".join(lines[first + 1 : last]) + tail


def _is_test(node: ast.stmt, defined: set[str]) -> bool:
    if isinstance(node, ast.Assert):
        return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        function = node.value.func
        return isinstance(function, ast.Name) and function.id in defined
    # a loop of asserts is one test; a loop that asserts nothing is setup
    if isinstance(node, ast.For | ast.AsyncFor | ast.While | ast.If | ast.With | ast.Try):
        return any(isinstance(inner, ast.Assert) for inner in _top_level_walk(node))
    return False


def _collected_tests(node: ast.stmt) -> list[str]:
    """pytest-style tests a top-level definition stands for, as statements to run."""
    if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
        arguments = node.args
        # a test with parameters needs pytest fixtures, which the judge does not provide
        if not (arguments.args or arguments.posonlyargs or arguments.kwonlyargs):
            return [f"{node.name}()"]
    if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
        return [f"{CASE}({node.name}, {item.name!r})"
                for item in node.body
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test")]  # fmt: skip
    return []


def _top_level_walk(node: ast.AST):
    """Nodes under ``node``, not descending into function or class bodies."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef |
                              ast.Lambda):  # fmt: skip
                stack.append(child)


def _read_names(nodes: list[ast.stmt]) -> tuple[str, ...]:
    found: dict[str, None] = {}
    for node in nodes:
        for inner in ast.walk(node):
            if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Load):
                name = inner.id
                # a test's builtins are the judge's own, never the program's
                if name not in _BUILTINS and not name.startswith("__"):
                    found[name] = None
    return tuple(found)


def _bound_names(nodes: list[ast.stmt]) -> tuple[str, ...]:
    found: dict[str, None] = {}
    for node in nodes:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = None
            continue
        for inner in _top_level_walk(node):
            if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store | ast.Del):
                found[inner.id] = None
            elif isinstance(inner, ast.alias):
                found[(inner.asname or inner.name).partition(".")[0]] = None
            elif isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found[inner.name] = None
    return tuple(found)
