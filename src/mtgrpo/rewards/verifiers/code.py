"""Code reward: extract the program from a completion and run it against the sample's tests.

Where the code is read (:func:`extract_code`): the last complete ``<code>...</code>`` block
(seed 002's format); failing that, the last complete fenced block whose info string is
empty or ``python``/``py``/``python3``. Programs longer than :data:`MAX_CODE_CHARS` count as
no code.

Tests come from the dataset, per sample:

* column ``tests``: a test file (a string: top-level asserts, loops of asserts, HumanEval's
  ``check(candidate)``, pytest-style ``test_*`` functions and ``Test*`` classes; other
  statements are setup) or a list of strings (one test each); run by
  :func:`~mtgrpo.sandbox.run_python`, which decides every verdict in a process the program
  cannot reach. Column ``entry_point`` (HumanEval's) completes a file that defines
  ``check(candidate)`` without calling it;
* column ``test_cases`` (alias ``input_output``): stdin/stdout cases, as a list of
  ``{"input": ..., "output": ...}``, APPS' ``{"inputs": [...], "outputs": [...]}``, or a
  JSON string of either; run by :func:`~mtgrpo.sandbox.run_python_io`.

Reward: the fraction of tests passed, in [0, 1] (``all_or_nothing=True``: 1.0 only when
all pass). A sample without tests is scored on syntax alone, with seed 002's numbers: 1.0
when the code compiles, 0.3 when it does not, 0.0 when there is no code. Seed 002 also gave
0 to any code mentioning ``import``, ``os`` or ``open``; that was its only guard against
running hostile code. Here nothing is executed outside the sandbox and syntax-only
samples are only compiled, so that keyword filter is dropped.

Samples run in parallel: a thread pool of ``max_workers`` threads, each waiting on one
sandbox subprocess. An exception while scoring one sample's text scores it 0 and is counted
(``rewards/code_reward/errors``); a sandbox the kernel cannot build
(:class:`~mtgrpo.sandbox.SandboxUnavailableError`) stops scoring with the
fix, checked once before the first sample runs.
"""

from __future__ import annotations

import ast
import json
import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mtgrpo.rewards.guard import note_scoring_error
from mtgrpo.rewards.verifiers._batch import completion_texts, optional_column
from mtgrpo.rewards.verifiers.answer import MAX_TEXT_CHARS
from mtgrpo.sandbox import (
    IOCase,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailableError,
    ensure_sandbox,
    prepare_tests,
    run_python,
    run_python_io,
)

__all__ = [
    "MAX_CODE_CHARS",
    "SYNTAX_ERROR_REWARD",
    "code_reward",
    "extract_code",
    "syntax_reward",
]

MAX_CODE_CHARS = 50_000
MAX_FENCES = 10_000  # bounds the scan of a text made of nothing but fences
SYNTAX_ERROR_REWARD = 0.3  # seed 002's score for code that does not compile
_PYTHON_INFO = frozenset({"", "python", "py", "python3", "py3"})
# A fence line: optional indentation, three backticks, an info string without backticks.
# No two adjacent parts can match the same character, so a line is matched in linear time.
_FENCE = re.compile(r"^[ \t]*```([^\n`]*)$", re.MULTILINE)


def extract_code(text: Any) -> str | None:
    """The program in a completion (see the module docstring), dedented, or ``None``.

    >>> extract_code("Here:\\n```python\\nprint(1)\\n```\\n")
    'print(1)'
    >>> extract_code("<code>\\n    x = 1\\n</code>")
    'x = 1'
    """
    if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
        return None
    code = _code_tag(text)
    if code is None:
        code = _last_fenced_block(text)
    if code is None or len(code) > MAX_CODE_CHARS:
        return None
    # code indented inside a list item or a tag must still compile
    code = textwrap.dedent(code).strip("\n")
    return code if code.strip() else None


def _code_tag(text: str) -> str | None:
    """Content of the last ``<code>...</code>``, unstripped (indentation matters in Python)."""
    end = text.rfind("</code>")
    start = text.rfind("<code>", 0, end) if end >= 0 else -1
    return None if start < 0 else text[start + len("<code>") : end]


def _last_fenced_block(text: str) -> str | None:
    """Content of the last complete Python (or untagged) fenced block, paired in order."""
    opening: re.Match[str] | None = None
    last: str | None = None
    for count, fence in enumerate(_FENCE.finditer(text)):
        if count >= MAX_FENCES:
            break
        info = fence.group(1).strip().lower()
        if opening is None:
            opening = fence
        elif not info:  # only a bare fence closes a block (CommonMark's rule)
            if opening.group(1).strip().lower() in _PYTHON_INFO:
                # + 1 skips the newline that ends the opening fence's line
                last = text[opening.end() + 1 : fence.start()]
            opening = None
    return last


def syntax_reward(code: str | None) -> float:
    """Seed 002's syntax-only score: 1.0 compiles, 0.3 does not, 0.0 no code.

    Compiled (never run) in this process: the source is capped at :data:`MAX_CODE_CHARS`
    and Python's parser turns nesting bombs into ``SyntaxError``/``MemoryError``/
    ``RecursionError``, all of which count as "does not compile".
    """
    if code is None:
        return 0.0
    try:
        # parsed only, nothing of the completion runs here; dont_inherit keeps this module's
        # __future__ flags out
        compile(code, "<completion>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return SYNTAX_ERROR_REWARD
    return 1.0


def code_reward(
    prompts: Sequence[Any] | None,
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]] | None = None,
    *,
    all_or_nothing: bool = False,
    limits: SandboxLimits | None = None,
    max_workers: int | None = None,
    **columns: Any,
) -> list[float | None]:
    """Fraction of the sample's tests the extracted program passes, in [0, 1].

    See the module docstring for where code and tests are read and for the syntax-only
    scores of samples without tests. ``limits`` are the sandbox limits per sample
    (:class:`~mtgrpo.sandbox.SandboxLimits`); ``max_workers`` bounds the
    samples run at once (default ``min(8, cpu count)``). Test columns that are not valid
    (a test that is not Python, a malformed case) raise ``ValueError`` before anything runs.

    >>> add = "<code>\\ndef add(a, b):\\n    return a + b\\n</code>"
    >>> code_reward(None, [add, add], tests=[["assert add(1, 2) == 3"], None])
    [1.0, 1.0]
    """
    texts = completion_texts("code_reward", completions)
    tests = optional_column("code_reward", columns, ("tests",), len(texts))
    cases = optional_column("code_reward", columns, ("test_cases", "input_output"), len(texts))
    entry_points = optional_column("code_reward", columns, ("entry_point",), len(texts))
    limits = limits or SandboxLimits()
    jobs = [
        _job(row, tests[row] if tests else None, cases[row] if cases else None,
             entry_points[row] if entry_points else None)
        for row in range(len(texts))
    ]  # fmt: skip
    if any(mode != "syntax" for mode, _ in jobs):
        ensure_sandbox(limits)  # a clear error now, not a zero for every sample
    # threads suffice: each only waits on its sandbox subprocess
    workers = max_workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [
            pool.submit(_score, text, job, limits, all_or_nothing)
            for text, job in zip(texts, jobs, strict=True)
        ]
        # results read in this thread: guard counts errors per calling thread
        return [_outcome(row, future) for row, future in enumerate(futures)]


def _outcome(row: int, future: Future[float]) -> float:
    """A sample's score; an exception scoring its text is counted and scores 0 (see
    :mod:`mtgrpo.rewards.guard`), a sandbox the kernel refuses stops scoring."""
    try:
        return future.result()
    # a setup problem: scoring every sample 0 would hide it
    except SandboxUnavailableError:
        raise
    except Exception as error:
        note_scoring_error("code_reward", row, error)
        return 0.0


def _job(row: int, tests: Any, cases: Any, entry_point: Any) -> tuple[str, Any]:
    """("tests", (tests, entry point)) | ("io", cases) | ("syntax", None) for one row,
    validated."""
    # an empty test file or list is no tests: the row is scored on syntax alone
    if tests is not None and not (isinstance(tests, (str, Sequence)) and len(tests) == 0):
        if entry_point is not None and not isinstance(entry_point, str):
            raise ValueError(f"code_reward: row {row}: entry_point must be a string, got "
                             f"{entry_point!r:.80}")  # fmt: skip
        try:  # validate now; run_python prepares them again per sample
            prepare_tests(tests, entry_point=entry_point)
        except (TypeError, ValueError) as error:
            raise ValueError(f"code_reward: row {row}: {error}") from None
        return "tests", (tests, entry_point)
    if cases is not None:
        return "io", _io_cases(row, cases)
    return "syntax", None


def _io_cases(row: int, cases: Any) -> list[IOCase]:
    if isinstance(cases, str):  # APPS stores input_output as a JSON string
        try:
            cases = json.loads(cases)
        except json.JSONDecodeError as error:
            raise ValueError(f"code_reward: row {row}: test_cases is not JSON ({error})") from None
    # APPS' layout: parallel lists
    if isinstance(cases, Mapping) and {"inputs", "outputs"} <= set(cases):
        inputs, outputs = cases["inputs"], cases["outputs"]
        if len(inputs) != len(outputs):
            raise ValueError(
                f"code_reward: row {row}: test_cases has {len(inputs)} inputs and "
                f"{len(outputs)} outputs; they must pair up"
            )
        cases = [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]
    if not isinstance(cases, Sequence):
        raise ValueError(
            f"code_reward: row {row}: test_cases must be a list of {{'input', 'output'}} or "
            f"{{'inputs': [...], 'outputs': [...]}}, got {type(cases).__name__}"
        )
    checked = []
    for index, case in enumerate(cases):
        if isinstance(case, IOCase):
            checked.append(case)
        elif isinstance(case, Mapping) and all(
            isinstance(case.get(key), str) for key in ("input", "output")
        ):
            checked.append(IOCase(case["input"], case["output"]))
        else:
            raise ValueError(
                f"code_reward: row {row}: case {index} needs string 'input' and 'output', "
                f"got {case!r:.100}"
            )
    return checked


def _score(text: str, job: tuple[str, Any], limits: SandboxLimits, all_or_nothing: bool) -> float:
    mode, payload = job
    code = extract_code(text)
    if mode == "syntax":
        return syntax_reward(code)
    # no program to run is a wrong answer (0.0), never "not applicable"
    if code is None:
        return 0.0
    result: SandboxResult
    if mode == "tests":
        tests, entry_point = payload
        result = run_python(code, tests, limits, entry_point=entry_point)
    else:
        result = run_python_io(code, payload, limits)
    if all_or_nothing:
        # all([]) is True: a run with no verdicts must not count as passing
        return 1.0 if result.passed and all(result.passed) else 0.0
    return result.pass_fraction
