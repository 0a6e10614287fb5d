"""Math reward: math-verify verdicts, answer styles, gold forms, the per-sample time limit
in the main thread and off it (helper process), and restoration of the caller's timer."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

import mtgrpo.rewards.verifiers.math as math_module
from mtgrpo.rewards.verifiers.math import math_reward


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        (r"so \boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
        ("<answer>1/2</answer>", "0.5", 1.0),
        (r"\boxed{x^2 + 2x + 1}", "(x+1)^2", 1.0),
        (r"\boxed{\sqrt{2}}", r"\sqrt{2}", 1.0),
        ("the total is 1,000 apples", "1000", 1.0),
        (r"\boxed{3}", "4", 0.0),
        ("no final answer at all", "4", 0.0),
        (r"\boxed{}", "4", 0.0),
    ],
)
def test_verdicts(completion: str, gold: str, expected: float) -> None:
    assert math_reward(None, [completion], answer=[gold]) == [expected]


def test_styles_are_tried_in_the_given_order() -> None:
    text = r"<answer>7</answer> \boxed{8} 9"
    golds = {"answer": ["7"]}
    assert math_reward(None, [text], **golds) == [0.0]  # default: boxed first -> 8
    assert math_reward(None, [text], styles=("tag", "boxed"), **golds) == [1.0]
    assert math_reward(None, [text], styles="last_number", answer=["9"]) == [1.0]
    assert math_reward(None, ["just 9"], styles=("boxed", "tag"), answer=["9"]) == [0.0]


def test_gold_forms() -> None:
    gsm8k = "She has 3 + 4 = 7 apples.\n#### 7"
    math_solution = r"We find $x = 5$, so the answer is $\boxed{5}$."
    completions = [r"\boxed{7}", r"\boxed{5}", r"\boxed{12}", "x"]
    rewards = math_reward(None, completions, solution=[gsm8k, math_solution, 12, None])
    assert rewards == [1.0, 1.0, 1.0, None]  # None: no gold, the reward does not apply


HOSTILE = [
    r"\boxed{9^{9^{9^{9}}}}",
    r"\boxed{2^{2^{30}}}",
    r"\boxed{100000!}",
    r"\boxed{\sum_{i=1}^{10^{9}} i}",
    "<answer>9**9**9**9</answer>",
    r"\boxed{" + "{" * 5000,
    r"\boxed{" + "(" * 900 + ")" * 900 + "}",
    "1" * 2000,
    "x" * 2_000_000,
]


@pytest.mark.parametrize("completion", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_answers_are_bounded_by_the_time_limit(completion: str) -> None:
    started = time.perf_counter()
    rewards = math_reward(None, [completion], answer=["5"], timeout_seconds=0.5)
    elapsed = time.perf_counter() - started
    assert rewards == [0.0]
    # without the limit these run for minutes or forever; the slack absorbs a loaded machine
    assert elapsed < 0.5 + 2.5, f"{elapsed:.2f} s"


def test_previous_alarm_handler_and_timer_are_restored() -> None:
    fired: list[int] = []

    def handler(signum: int, frame: object) -> None:
        fired.append(signum)

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    try:
        started = time.monotonic()
        math_reward(None, [r"\boxed{9^{9^{9^{9}}}}"], answer=["5"], timeout_seconds=0.3)
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        elapsed = time.monotonic() - started
        assert signal.getsignal(signal.SIGALRM) is handler
        assert left == pytest.approx(5.0 - elapsed, abs=0.1)
        assert fired == []
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_timer_due_during_the_check_fires_right_after() -> None:
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    try:
        math_reward(None, [r"\boxed{9^{9^{9^{9}}}}"], answer=["5"], timeout_seconds=0.3)
        time.sleep(0.05)
        assert fired == [signal.SIGALRM]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_swallowed_deadline_is_raised_again() -> None:
    # A check that swallows the first interruption (as a bare except in library code, or
    # an exception raised inside a garbage-collector callback, would) still ends: the timer
    # repeats every DEADLINE_REPEAT_SECONDS until the check is over.
    def stubborn() -> None:
        try:
            while True:
                pass
        except BaseException:
            pass
        while True:
            pass

    started = time.monotonic()
    with pytest.raises(math_module._Deadline):
        math_module._with_deadline(stubborn, 0.2)
    assert time.monotonic() - started < 0.2 + 3 * math_module.DEADLINE_REPEAT_SECONDS
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_first_verdict_of_a_fresh_process_is_not_a_timeout() -> None:
    # math-verify's first parse takes about a second (imports, grammar set-up); it happens
    # before the first sample's limit starts, so even a short limit gives the right verdict.
    script = math_module._light_imports_source() + (
        "from mtgrpo.rewards.verifiers.math import math_reward\n"
        "print(math_reward(None, [r'\\boxed{\\frac{1}{2}}'], answer=['0.5'], timeout_seconds=0.2))"
    )
    output = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert output.stdout.strip() == "[1.0]"


def test_off_the_main_thread_the_helper_process_checks() -> None:
    outcome: dict[str, object] = {}

    def score() -> None:
        started = time.perf_counter()
        outcome["rewards"] = math_reward(
            None,
            [r"\boxed{\frac12}", r"\boxed{9^{9^{9^{9}}}}", r"\boxed{0.5}", r"\boxed{2}"],
            answer=["0.5"] * 4,
            timeout_seconds=0.5,
        )
        outcome["seconds"] = time.perf_counter() - started

    worker = threading.Thread(target=score)
    worker.start()
    worker.join()
    assert outcome["rewards"] == [1.0, 0.0, 1.0, 0.0]
    # start-up (imports math-verify, about a second) + one timed-out check + three quick
    assert outcome["seconds"] < math_module.WORKER_STARTUP_SECONDS


def test_process_isolation_and_restart_after_a_late_reply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert math_reward(None, [r"\boxed{3}"], answer=["3"], isolation="process") == [1.0]
    # Make the parent give up before the helper's own timer fires: the helper is killed.
    monkeypatch.setattr(math_module, "WORKER_GRACE_SECONDS", -0.9)
    started = time.perf_counter()
    rewards = math_reward(
        None, [r"\boxed{9^{9^{9^{9}}}}"], answer=["3"], timeout_seconds=1.0, isolation="process"
    )
    assert rewards == [0.0]
    assert time.perf_counter() - started < 0.5
    assert math_module._POOL._process is None
    monkeypatch.setattr(math_module, "WORKER_GRACE_SECONDS", 2.0)
    assert math_reward(None, [r"\boxed{3}"], answer=["3"], isolation="process") == [1.0]


def test_a_batch_of_hostile_answers_costs_about_its_slowest_check() -> None:
    # Sixteen answers that each take the whole limit, and an honest one: checked side by
    # side in forked children, so the batch takes about one limit, not sixteen.
    hostile = [r"\boxed{9^{9^{9^{9}}}}"] * 16
    math_reward(None, [r"\boxed{3}"], answer=["3"], isolation="process")  # start the helper
    started = time.perf_counter()
    rewards = math_reward(None, [*hostile, r"\boxed{\frac12}"], answer=["3"] * 16 + ["0.5"],
                          timeout_seconds=1.0)  # fmt: skip
    assert rewards == [0.0] * 16 + [1.0]
    sequential = 16 * 1.0
    assert time.perf_counter() - started < sequential / 2


def test_the_helper_dies_with_its_owner() -> None:
    script = math_module._light_imports_source() + (
        "from mtgrpo.rewards.verifiers import math as m\n"
        "print(m.math_reward(None, ['3'], answer=['3'], isolation='process'), flush=True)\n"
        "print(m._POOL._process.pid, flush=True)\n"
        "import os\nos.kill(os.getpid(), 9)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    helper = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(helper):
        time.sleep(0.02)
    assert not _alive(helper)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return "State:\tZ" not in status.read()
    except FileNotFoundError:
        return False


def test_configuration_errors() -> None:
    with pytest.raises(TypeError, match="needs the dataset column 'answer' or 'solution'"):
        math_reward(None, ["x"], gold=["1"])
    with pytest.raises(ValueError, match="unknown answer style 'xml'"):
        math_reward(None, ["x"], answer=["1"], styles=("boxed", "xml"))
    with pytest.raises(ValueError, match="unknown math isolation 'thread'; valid names: auto"):
        math_reward(None, ["x"], answer=["1"], isolation="thread")
    with pytest.raises(ValueError, match="timeout_seconds must be a number in"):
        math_reward(None, ["x"], answer=["1"], timeout_seconds=0)
