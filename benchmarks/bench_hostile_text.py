"""What hostile model text costs each built-in and task-suite reward, and what a sandbox run costs.

    python benchmarks/bench_hostile_text.py                 # every reward x every text
    python benchmarks/bench_hostile_text.py --sandbox-runs 50

Texts (:data:`HOSTILE`): 1,000,000-character completions built to stall extractors (unclosed
``<answer>``, ``\\boxed{``, code fences and tags, storms of openings) and answers holding
numbers past Python's 4,300-digit ``int(str)`` limit. Each reward (:func:`rewards`) scores
each text alone, as one call, after a warm-up call on the same text (imports, the sandbox
check); the table gives, per reward, the slowest text and its time (median of ``--repeat``
calls), and the median over all texts. The sandbox part times ``run_python("x = 1", ["assert
x == 1"])`` end to end, against ``python -I -S -c pass`` (interpreter start alone).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from mtgrpo.rewards.verifiers.answer import MAX_TEXT_CHARS

HUGE = "9" * 5_000  # past Python's 4,300-digit limit on int(str)


def _fill(prefix: str, unit: str) -> str:
    """``prefix`` then ``unit`` repeated up to exactly ``MAX_TEXT_CHARS`` characters."""
    body = (unit * (MAX_TEXT_CHARS // len(unit) + 1))[: MAX_TEXT_CHARS - len(prefix)]
    return prefix + body


HOSTILE = {
    "unclosed answer tag": _fill("<think>x</think>\n<answer>", "1 "),
    "unclosed boxed": _fill("so \\boxed{", "{1"),
    "boxed storm": _fill("", "\\boxed{"),
    "answer tag storm": _fill("", "<answer>"),
    "unclosed code fence": _fill("```python\n", "x = (1,\n"),
    "unclosed code tag": _fill("<code>\n", "def f(): return [\n"),
    "unclosed think": _fill("<think>", "</answer><answer>"),
    "huge number answer": f"<think>x</think>\n<answer>{HUGE}</answer>",
    "huge boxed number": f"\\boxed{{{HUGE}}} <answer>{HUGE}</answer>",
    "huge grid": f"<answer>{' '.join([HUGE] * 150)}</answer>",
    "many numbers": _fill("<answer>", HUGE + " "),
}

Reward = tuple[Callable[..., list[Any]], dict[str, Any]]


def rewards() -> dict[str, Reward]:
    """``name: (function, the columns of one row)`` of every built-in and task-suite reward."""
    import reasoning_gym

    from mtgrpo.examples.customer_comms import comms_reward
    from mtgrpo.rewards.verifiers import (
        AUDITED_FAMILIES,
        code_reward,
        countdown_reward,
        format_reward,
        length_reward,
        math_reward,
        reasoning_gym_reward,
    )
    from mtgrpo.tasks.gsm8k import answer_format_reward
    from mtgrpo.tasks.rewards import task_reward

    table: dict[str, Reward] = {
        "format_reward": (format_reward, {}),
        "countdown_reward": (countdown_reward, {"target": 15, "nums": [8, 2, 1]}),
        "math_reward": (math_reward, {"answer": "15"}),
        "code_reward (syntax)": (code_reward, {}),
        "code_reward (tests)": (code_reward, {"tests": ["assert add(1, 2) == 3"]}),
        "length_reward": (length_reward(target_length=100, tolerance=50), {}),
        "answer_format_reward": (answer_format_reward, {"answer_format": "boxed"}),
        "comms_reward": (comms_reward, {"scenario": "refund"}),
        "countdown task": (task_reward("countdown"), {
            "answer": "8 * 2 - 1", "metadata": {"numbers": [8, 2, 1], "target": 15}}),
        "zebra task": (task_reward("zebra_puzzles"), {"answer": "Alice", "metadata": {}}),
        "arc_1d task": (task_reward("arc_1d"), {"answer": "0 1 2", "metadata": {}}),
        "arc_1d task, boxed": (task_reward("arc_1d", answer_format="boxed"),
                               {"answer": "0 1 2", "metadata": {}}),
    }  # fmt: skip
    for family in AUDITED_FAMILIES.names():
        entry = dict(reasoning_gym.create_dataset(family, seed=0, size=1)[0])
        table[f"reasoning_gym {family}"] = (reasoning_gym_reward(family), {"entry": entry})
    return table


def score_seconds(reward: Reward, text: str, repeat: int) -> float:
    """Median seconds of one call on ``text`` alone, after a warm-up call."""
    function, row = reward
    columns = {key: [value] for key, value in row.items()}
    function(None, [text], **columns)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function(None, [text], **columns)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sandbox_seconds(runs: int) -> tuple[list[float], list[float]]:
    """Seconds of ``run_python("x = 1", ["assert x == 1"])`` and of a bare interpreter start."""
    from mtgrpo.sandbox import run_python

    run_python("x = 1", ["assert x == 1"])  # the interpreter probe, the page cache
    sandboxed, bare = [], []
    for _ in range(runs):
        start = time.perf_counter()
        assert run_python("x = 1", ["assert x == 1"]).passed == (True,)
        sandboxed.append(time.perf_counter() - start)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
        bare.append(time.perf_counter() - start)
    return sandboxed, bare


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="calls per reward and text")
    parser.add_argument("--sandbox-runs", type=int, default=30, help="0: skip the sandbox part")
    parser.add_argument("--only", default="", help="comma-separated reward names")
    args = parser.parse_args(argv)
    table = rewards()
    names = [n for n in table if not args.only or n in args.only.split(",")]
    print("| reward | slowest hostile text | its time | median over the texts |")
    print("| --- | --- | --- | --- |")
    for name in names:
        seconds = {text: score_seconds(table[name], HOSTILE[text], args.repeat)
                   for text in HOSTILE}  # fmt: skip
        worst = max(seconds, key=seconds.__getitem__)
        print(f"| {name} | {worst} | {_ms(seconds[worst])} | "
              f"{_ms(statistics.median(seconds.values()))} |")  # fmt: skip
    if args.sandbox_runs:
        sandboxed, bare = sandbox_seconds(args.sandbox_runs)
        print("\n| what | median | p90 |\n| --- | --- | --- |")
        for label, times in (("`python -I -S -c pass`", bare),
                             ('`run_python("x = 1", ["assert x == 1"])`', sandboxed)):  # fmt: skip
            p90 = statistics.quantiles(times, n=10)[-1] if len(times) > 1 else times[0]
            print(f"| {label} | {_ms(statistics.median(times))} | {_ms(p90)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
