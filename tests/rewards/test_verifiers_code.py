"""Code reward: extraction, seed 002's syntax-only scores, test fractions in the sandbox,
I/O cases in their three forms, validation before any run, and the bounded thread pool."""

from __future__ import annotations

import functools
import json
import time

import pytest

import mtgrpo.rewards.verifiers.code as code_module
import mtgrpo.sandbox.run as sandbox_module
from mtgrpo.rewards.guard import collect_scoring_errors
from mtgrpo.rewards.verifiers.code import (
    MAX_CODE_CHARS,
    SYNTAX_ERROR_REWARD,
    code_reward,
    extract_code,
    syntax_reward,
)
from mtgrpo.sandbox import SandboxLimits, SandboxUnavailableError

LIMITS = SandboxLimits(timeout_seconds=5.0, test_timeout_seconds=1.0, memory_bytes=256 << 20)
ADD = "<code>\ndef add(a, b):\n    return a + b\n</code>"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<code>x = 1</code>", "x = 1"),
        ("<code>a = 1</code> then <code>b = 2</code>", "b = 2"),  # the last block
        ("<code>\n    if True:\n        y = 2\n</code>", "if True:\n    y = 2"),  # dedented
        ("```python\nprint(1)\n```", "print(1)"),
        ("```py\na = 1\n```\ntext\n```Python3\nb = 2\n```", "b = 2"),
        ("```\nbare = 1\n```", "bare = 1"),
        ("```python\nx = 1\n```\n```bash\nls\n```", "x = 1"),  # not a Python block
        ("```python\nx = 1\n```\n```python\nunclosed = 2\n", "x = 1"),
        ("```python\na = '```'\n```", "a = '```'"),  # a fence is a line of its own
        ("<code>tag = 1</code>\n```python\nfence = 1\n```", "tag = 1"),  # the tag wins
        ("<code>   </code>", None),
        ("no code here", None),
        ("<code>" + "x" * (MAX_CODE_CHARS + 1) + "</code>", None),
    ],
)
def test_extract_code(text: str, expected: str | None) -> None:
    assert extract_code(text) == expected


def test_fence_scanning_is_fast_on_adversarial_text() -> None:
    texts = ["```\n" * 250_000, "```" + " " * 1_000_000 + "`", "<code>" * 150_000]
    for text in texts:
        started = time.perf_counter()
        extract_code(text)
        assert time.perf_counter() - started < 0.3


def test_syntax_only_scores_are_seed_002s() -> None:
    completions = ["<code>def f():\n    return 1\n</code>", "<code>def f(:\n</code>", "prose"]
    assert code_reward(None, completions) == [1.0, SYNTAX_ERROR_REWARD, 0.0]
    # Seed 002 zeroed any code mentioning "import": nothing runs here, so it compiles fine.
    assert code_reward(None, ["<code>import os\nos.getcwd()</code>"]) == [1.0]


@pytest.mark.parametrize(
    "source",
    ["-" * 45_000 + "1", "(" * 40_000 + ")" * 9_000, "1" + "+1" * 24_000, "a" + ".b" * 24_000],
    ids=["unary", "parens", "additions", "attributes"],
)
def test_parser_bombs_are_syntax_errors_and_fast(source: str) -> None:
    started = time.perf_counter()
    assert syntax_reward(source) == SYNTAX_ERROR_REWARD
    assert time.perf_counter() - started < 0.3


def test_fraction_of_tests_passed() -> None:
    tests = [
        ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(1, 1) == 3"],
        "assert add(2, 2) == 4\nassert add(-1, 1) == 0\n",
        None,
        [],
    ]
    rewards = code_reward(None, [ADD] * 4, tests=tests, limits=LIMITS)
    assert rewards == [pytest.approx(2 / 3, abs=1e-12), 1.0, 1.0, 1.0]  # last two: syntax
    strict = code_reward(None, [ADD] * 2, tests=tests[:2], limits=LIMITS, all_or_nothing=True)
    assert strict == [0.0, 1.0]


def test_no_code_or_broken_code_with_tests_scores_zero() -> None:
    tests = [["assert add(1, 2) == 3"]] * 2
    assert code_reward(None, ["no code", "<code>def add(:</code>"], tests=tests) == [0.0, 0.0]


def test_io_cases_in_every_accepted_form() -> None:
    program = "<code>\nprint(sum(map(int, input().split())))\n</code>"
    as_list = [{"input": "1 2\n", "output": "3\n"}, {"input": "2 2\n", "output": "5\n"}]
    as_apps = {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}
    rewards = code_reward(
        None,
        [program] * 3,
        test_cases=[as_list, as_apps, json.dumps(as_apps)],
        limits=LIMITS,
    )
    assert rewards == [0.5, 1.0, 1.0]


def test_invalid_tests_raise_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the sandbox ran before the columns were validated")

    monkeypatch.setattr(code_module, "run_python", must_not_run)
    monkeypatch.setattr(code_module, "run_python_io", must_not_run)
    with pytest.raises(ValueError, match=r"row 1: tests\[0\] is not valid Python"):
        code_reward(None, [ADD, ADD], tests=[["assert True"], ["assert ("]])
    with pytest.raises(ValueError, match="row 0: test_cases has 2 inputs and 1 outputs"):
        code_reward(None, [ADD], test_cases=[{"inputs": ["1", "2"], "outputs": ["1"]}])
    with pytest.raises(ValueError, match="row 0: case 0 needs string 'input' and 'output'"):
        code_reward(None, [ADD], test_cases=[[{"input": 1, "output": "1"}]])
    with pytest.raises(ValueError, match="row 0: test_cases is not JSON"):
        code_reward(None, [ADD], test_cases=["{not json"])
    with pytest.raises(ValueError, match="column 'tests' has 1 values for 2 completions"):
        code_reward(None, [ADD, ADD], tests=[None])


def test_samples_run_in_parallel_on_a_bounded_pool() -> None:
    sleeper = "<code>\nimport time\ntime.sleep(0.5)\ndef ok():\n    return True\n</code>"
    started = time.perf_counter()
    rewards = code_reward(None, [sleeper] * 6, tests=[["assert ok()"]] * 6, max_workers=3)
    elapsed = time.perf_counter() - started
    assert rewards == [1.0] * 6
    # Two rounds of three (1 s of sleep) plus start-ups; one at a time would take 3 s.
    assert 1.0 <= elapsed < 2.5


def test_a_failure_scoring_one_sample_is_counted_and_scores_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = code_module.run_python

    def flaky(code: str, tests: object, limits: SandboxLimits, **options: object):
        if "boom" in code:
            raise MemoryError("the parent ran out of memory reading this sample")
        return real(code, tests, limits, **options)

    monkeypatch.setattr(code_module, "run_python", flaky)
    boom = "<code>\nboom = 1\ndef add(a, b):\n    return a + b\n</code>"
    with collect_scoring_errors() as failed:
        scores = code_reward(None, [ADD, boom, ADD], tests=[["assert add(1, 2) == 3"]] * 3,
                             limits=LIMITS)  # fmt: skip
    assert scores == [1.0, 0.0, 1.0]
    assert failed == [1]


def test_no_sandbox_no_run_and_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # A launcher the kernel refused: it reports why and runs nothing.
    refusing = ("import marshal, os, sys\nsize = int.from_bytes(os.read(0, 8), 'little')\n"
                "job = marshal.loads(os.read(0, size))\n"
                "os.write(job['report_fd'], b'refused unshare: Operation not permitted\\n')\n")
    monkeypatch.setattr(sandbox_module, "_LAUNCH_CODE", refusing)
    monkeypatch.setattr(sandbox_module, "_sandbox_check", functools.lru_cache(maxsize=1)(
        sandbox_module._sandbox_check.__wrapped__))  # a fresh cache for this test
    with pytest.raises(SandboxUnavailableError,
                       match=r"unshare: Operation not permitted\. .*Run the trainer as root"):
        code_reward(None, [ADD], tests=[["assert add(1, 2) == 3"]], limits=LIMITS)
    with pytest.raises(SandboxUnavailableError, match="The program was not run"):
        sandbox_module.run_python("x = 1", ["assert x == 1"], LIMITS)
    assert code_reward(None, [ADD]) == [1.0]  # syntax-only scoring needs no sandbox
