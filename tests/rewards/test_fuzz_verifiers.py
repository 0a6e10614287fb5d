"""Property-based fuzzing of every verifier on hostile text.

Properties, for every reward function and extractor: it never raises on model output, every
value is in the documented range (or ``None`` only where documented), and each call
finishes within its time bound. Inputs mix random unicode (control characters, surrogates
excluded by hypothesis, RTL marks, non-ASCII digits) with adversarial structure: deep
nesting, unbalanced and repeated tags, huge numbers, and strings of about 1 MB.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtgrpo.rewards.verifiers import (
    ANSWER_STYLES,
    AUDITED_FAMILIES,
    code_reward,
    countdown_check,
    countdown_reward,
    extract_answer,
    extract_code,
    format_reward,
    length_reward,
    math_reward,
    reasoning_gym_reward,
)
from mtgrpo.sandbox import SandboxLimits

FAST = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SLOW = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

PIECES = [
    "<think>", "</think>", "<answer>", "</answer>", "\n", "<code>", "</code>", "```python\n",
    "```", "\\boxed{", "{", "}", "(", ")", "[", "]", "**", "9", "-", "+", "*", "/", "=", ".",
    ",", "1e308", "9" * 400, "\x00", "\x1b[2J", "\u202e", "٣", "３", "\ufeff", " ", "\\frac{",
    "lambda", "__import__('os')", "9**9**9**9", "\\sum_{i=1}^{10^{9}}", "!",
]  # fmt: skip


@st.composite
def hostile_text(draw: st.DrawFn) -> str:
    """Random unicode, adversarial pieces, or a block repeated up to about 1 MB."""
    kind = draw(st.sampled_from(["unicode", "pieces", "nested", "huge"]))
    if kind == "unicode":
        return draw(st.text(max_size=300))
    pieces = st.lists(st.sampled_from(PIECES) | st.text(max_size=5), max_size=60)
    if kind == "pieces":
        return "".join(draw(pieces))
    if kind == "nested":
        depth = draw(st.integers(1, 20_000))
        opening, closing = draw(st.sampled_from([("(", ")"), ("{", "}"), ("[", "]")]))
        middle = "".join(draw(pieces))
        return opening * depth + middle + closing * draw(st.integers(0, depth))
    block = "".join(draw(pieces)) or "x"
    return block * max(1, 1_000_000 // len(block))


completions = st.lists(
    hostile_text()
    | st.builds(lambda text: [{"role": "assistant", "content": text}], hostile_text())
    | st.sampled_from([None, 3, {"content": None}, [{"role": "assistant"}]]),
    min_size=1,
    max_size=3,
)


def timed(fn: Callable[[], Any], bound: float) -> Any:
    started = time.perf_counter()
    value = fn()
    elapsed = time.perf_counter() - started
    assert elapsed < bound, f"{elapsed:.3f} s > {bound} s"
    return value


def in_range(values: list[float | None], low: float, high: float, allow_none: bool) -> bool:
    for value in values:
        if value is None:
            if not allow_none:
                return False
        elif not (isinstance(value, float) and math.isfinite(value) and low <= value <= high):
            return False
    return True


@FAST
@given(text=hostile_text(), style=st.sampled_from(ANSWER_STYLES.names()))
def test_extractors(text: str, style: str) -> None:
    answer = timed(lambda: extract_answer(text, style=style), 0.5)
    assert answer is None or isinstance(answer, str)
    code = timed(lambda: extract_code(text), 1.0)
    assert code is None or isinstance(code, str)


@FAST
@given(batch=completions)
def test_format_reward(batch: list[Any]) -> None:
    rewards = timed(lambda: format_reward(None, batch), 0.5)
    assert len(rewards) == len(batch)
    assert set(rewards) <= {0.0, 1.0}


@FAST
@given(
    batch=completions,
    numbers=st.lists(st.integers(1, 100), min_size=1, max_size=6),
    target=st.integers(1, 1000) | st.floats(0.5, 1000.0, allow_nan=False),
    use_all=st.booleans(),
    require_format=st.booleans(),
)
def test_countdown_reward(
    batch: list[Any], numbers: list[int], target: float, use_all: bool, require_format: bool
) -> None:
    rows = len(batch)
    rewards = timed(
        lambda: countdown_reward(
            None,
            batch,
            target=[target] * rows,
            nums=[numbers] * rows,
            use_all_numbers=use_all,
            require_format=require_format,
        ),
        0.1 * rows,
    )
    assert in_range(rewards, 0.0, 1.0, allow_none=False)
    assert set(rewards) <= {0.0, 1.0}


@FAST
@given(expression=hostile_text(), numbers=st.lists(st.integers(0, 100), max_size=6))
def test_countdown_check(expression: str, numbers: list[int]) -> None:
    check = timed(lambda: countdown_check(expression, numbers, 24), 0.1)
    assert check.correct <= (check.parsed and check.numbers_ok)
    assert (check.value is None) or check.parsed


@SLOW
@given(batch=completions, gold=st.sampled_from(["5", "\\frac{1}{2}", "x^2+1", "#### 7", "yes"]))
def test_math_reward(batch: list[Any], gold: str) -> None:
    limit = 0.3
    rewards = timed(
        lambda: math_reward(None, batch, answer=[gold] * len(batch), timeout_seconds=limit),
        (limit + 0.4) * len(batch),
    )
    assert set(rewards) <= {0.0, 1.0}


@FAST
@given(
    batch=completions,
    target=st.floats(1, 10_000),
    tolerance=st.floats(0.5, 10_000),
    unit=st.sampled_from(["chars", "tokens"]),
)
def test_length_reward(batch: list[Any], target: float, tolerance: float, unit: str) -> None:
    ids = [[0] * (i * 37) for i in range(len(batch))]
    rewards = timed(lambda: length_reward(target, tolerance, unit)(None, batch, ids), 0.1)
    assert in_range(rewards, 0.0, 1.0, allow_none=False)


@FAST
@given(batch=completions)
def test_code_reward_syntax_only(batch: list[Any]) -> None:
    rewards = timed(lambda: code_reward(None, batch), 0.5 * len(batch))
    assert set(rewards) <= {0.0, 0.3, 1.0}


SANDBOX = SandboxLimits(timeout_seconds=2.0, test_timeout_seconds=0.3, memory_bytes=256 << 20)


HOSTILE_PROGRAMS = [
    "while True:\n    pass",
    "import os\nos.fork()",
    "print('ALL TESTS PASSED')",
    "import os\nfor fd in range(64):\n    try:\n        os.write(fd, b'T' * 33)\n"
    "    except OSError:\n        pass",
    "x = bytearray(10**10)",
    "import sys\nsys.stdout.write('x' * 10**7)",
    "import os\nos._exit(0)",
    "class A:\n    def __eq__(self, o):\n        return True\nsolve = lambda: A()",
    "open('/tmp/fuzzed', 'w')",
    "import socket",
]


@st.composite
def hostile_program(draw: st.DrawFn) -> str:
    """Valid Python that misbehaves, around random text kept in a string literal."""
    lines = draw(st.lists(st.sampled_from(HOSTILE_PROGRAMS), min_size=1, max_size=3))
    return f"data = {draw(st.text(max_size=200))!r}\n" + "\n".join(lines)


@SLOW
@given(body=hostile_text() | hostile_program())
def test_code_reward_in_the_sandbox(body: str) -> None:
    completion = f"<code>\n{body}\ndef solve():\n    return 1\n</code>"
    rewards = timed(
        lambda: code_reward(
            None, [completion], tests=[["assert solve() == 1", "assert False"]], limits=SANDBOX
        ),
        SANDBOX.timeout_seconds + 1.5,
    )
    # The second test can never pass; the first passes only for an honest solve().
    assert rewards[0] in {0.0, 0.5}


@SLOW
@given(batch=completions, family=st.sampled_from(AUDITED_FAMILIES.names()))
def test_reasoning_gym_rewards(batch: list[Any], family: str) -> None:
    entry = {
        "answer": "Alice",
        "metadata": {"numbers": [1, 2, 3], "target": 6, "sorted_words": ["a", "b"]},
    }
    reward = reasoning_gym_reward(family)
    rewards = timed(lambda: reward(None, batch, entry=[entry] * len(batch)), 0.3 * len(batch))
    assert in_range(rewards, 0.0, 1.0, allow_none=False)
