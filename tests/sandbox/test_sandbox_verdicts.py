"""Verdicts are decided in the judge, a process the program cannot reach (issue 38).

Each class of forgery gets a wrong program (it does not do what the tests ask) dressed with
the attack: it must score 0 while the honest program scores 1, with every test form a
dataset uses (value checks, tolerances, ordering, ``isinstance``/``type`` checks, loops of
asserts, HumanEval's ``check(candidate)``, pytest and unittest styles). The ``sandbox_root``
fixture checks that no process and no file is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from sandbox_helpers import LIMITS, sandbox_processes

from mtgrpo.sandbox import SandboxLimits, prepare_tests, run_python

HONEST = "def add(a, b):\n    return a + b\n"


def _scores(attack: str, tests, honest_code: str = HONEST,
            **options) -> tuple[tuple[bool, ...], tuple[bool, ...]]:  # fmt: skip
    honest = run_python(honest_code, tests, LIMITS, **options)
    wrong = run_python(attack, tests, LIMITS, **options)
    return honest.passed, wrong.passed


# ------------------------------------------------------------------ objects that lie

LIARS = {
    "ordering": (
        "class Liar:\n"
        "    __gt__ = __lt__ = __ge__ = __le__ = lambda self, other: True\n"
        "    __sub__ = __rsub__ = lambda self, other: Liar()\n"
        "    __abs__ = lambda self: Liar()\n"
        "def add(a, b):\n    return Liar()\n",
        ["assert add(1, 2) > 2", "assert add(1, 2) < 4",
         "assert abs(add(0.1, 0.2) - 0.3) < 1e-9"],
    ),
    "class-property": (
        "class Liar:\n    @property\n    def __class__(self):\n        return int\n"
        "def add(a, b):\n    return Liar()\n",
        ["assert isinstance(add(1, 2), int)"],
    ),
    "metaclass-eq": (
        "class Meta(type):\n    def __eq__(cls, other):\n        return True\n"
        "    __hash__ = type.__hash__\n"
        "class Liar(metaclass=Meta):\n    pass\n"
        "def add(a, b):\n    return Liar()\n",
        ["assert type(add(1, 2)) == int", "assert type(add(1, 2)) is int"],
    ),
    "patched-isclose": (
        "import math\nmath.isclose = lambda *args, **kwargs: True\n"
        "def add(a, b):\n    return 0.0\n",
        "import math\nassert math.isclose(add(0.1, 0.2), 0.3)\n",
    ),
    "program-imported-isclose": (  # the test relies on the program's import of math
        "import math\nmath.isclose = lambda *args, **kwargs: True\n"
        "def add(a, b):\n    return 0.0\n",
        ["assert math.isclose(add(0.1, 0.2), 0.3)"],
        "import math\n" + HONEST,
    ),
    "import-hook": (
        "import sys, types\nfake = types.ModuleType('fractions')\n"
        "fake.Fraction = lambda *args: 1\n"
        "class Finder:\n    def find_spec(self, name, path=None, target=None):\n"
        "        return None\n"
        "sys.meta_path.insert(0, Finder())\nsys.modules['fractions'] = fake\n"
        "def add(a, b):\n    return 1\n",
        "from fractions import Fraction\nassert Fraction(add(1, 2)) == Fraction(3)\n"
        "assert add(1, 2) == Fraction(3)\n",
    ),
    "shadowed-builtins": (
        "isinstance = lambda *args: True\nsorted = lambda *args, **kwargs: [1, 2, 3]\n"
        "abs = lambda value: 0\nlen = lambda value: 3\n"
        "def add(a, b):\n    return [a, b]\n",
        ["assert isinstance(add(1, 2), int)", "assert sorted([add(3, 1), 0]) == [0, 4]",
         "assert abs(add(-5, 2)) == 3", "assert len([add(1, 2)]) == 1 and add(1, 2) == 3"],
    ),
    "containment": (
        "class Liar:\n    __contains__ = lambda self, item: True\n"
        "    __iter__ = lambda self: iter(())\n"
        "def add(a, b):\n    return Liar()\n",
        ["assert 3 in add(1, 2)"],
        "def add(a, b):\n    return [a, b, a + b]\n",
    ),
    "truthiness": (
        "class Liar:\n    __bool__ = lambda self: True\n    __eq__ = lambda s, o: True\n"
        "def add(a, b):\n    return Liar()\n",
        ["assert add(1, 2) == 3", "assert add(1, 2)", "assert not add(2, 2) == 5 and add(2, 2)"],
    ),
    "int-subclass": (
        "class Liar(int):\n    __eq__ = lambda s, o: True\n    __gt__ = lambda s, o: True\n"
        "    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Liar(0)\n",
        ["assert add(1, 2) == 3", "assert add(1, 2) > 2", "assert [add(1, 2)] == [3]"],
    ),
}


@pytest.mark.parametrize("name", sorted(LIARS))
def test_objects_that_lie_score_zero(sandbox_root: Path, name: str) -> None:
    attack, tests, *honest_code = LIARS[name]
    honest, wrong = _scores(attack, tests, *honest_code)
    assert all(honest), (name, honest)
    assert not any(wrong), (name, wrong)


def test_an_import_hook_cannot_fake_what_the_tests_import_even_with_the_hook_off(
    sandbox_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mtgrpo.sandbox.run as run

    monkeypatch.setattr(run, "_AUDIT_HOOK", False)
    for name in ("patched-isclose", "import-hook", "metaclass-eq"):
        attack, tests = LIARS[name][:2]
        assert not any(run_python(attack, tests, LIMITS).passed), name


# ------------------------------------------------------------------- every test form


def test_loops_of_asserts_and_helpers(sandbox_root: Path) -> None:
    tests = (
        "def expected(a, b):\n    return a + b\n"
        "for a in range(4):\n    for b in range(3):\n        assert add(a, b) == expected(a, b)\n"
        "assert all(add(i, 1) == i + 1 for i in range(3))\n"
    )
    assert prepare_tests(tests).test_count == 2
    honest, wrong = _scores("def add(a, b):\n    return a + b if a < 3 else 0\n", tests)
    assert honest == (True, True)
    assert wrong == (False, True)  # the second loop never reaches a = 3


HUMANEVAL = '''
METADATA = {"author": "jt", "dataset": "test"}


def check(candidate):
    assert candidate(2, 3) == 5
    assert abs(candidate(0.1, 0.2) - 0.3) < 1e-6
    assert candidate(-1, 1) == 0
'''


def test_humaneval_check_candidate(sandbox_root: Path) -> None:
    called = HUMANEVAL + "\ncheck(add)\n"
    assert run_python(HONEST, called, LIMITS).passed == (True,)
    assert run_python("def add(a, b):\n    return 5\n", called, LIMITS).passed == (False,)
    # The dataset's own form: check is defined, not called; the entry point completes it.
    assert run_python(HONEST, HUMANEVAL, LIMITS, entry_point="add").passed == (True,)
    with pytest.raises(ValueError, match=r"holds no test.*entry_point"):
        run_python(HONEST, HUMANEVAL, LIMITS)


def test_pytest_and_unittest_styles(sandbox_root: Path) -> None:
    tests = textwrap.dedent(
        """
        import unittest
        from solution import add as plus

        def test_small():
            assert plus(1, 2) == 3

        def test_negative():
            assert add(-2, -3) == -5

        def helper_not_a_test(x):
            assert False

        class TestAdd:
            def setup_method(self, method):
                self.base = 10

            def test_base(self):
                assert add(self.base, 1) == 11

        class TestCaseStyle(unittest.TestCase):
            def setUp(self):
                self.pairs = [(1, 1, 2), (5, 7, 12)]

            def test_pairs(self):
                for a, b, total in self.pairs:
                    self.assertEqual(add(a, b), total)
        """
    )
    assert prepare_tests(tests).test_count == 4
    honest, wrong = _scores("def add(a, b):\n    return a + b if a > 0 else 0\n", tests)
    assert honest == (True,) * 4
    assert wrong == (True, False, True, True)


def test_exceptions_mutation_callbacks_generators_and_classes(sandbox_root: Path) -> None:
    code = textwrap.dedent(
        """
        class Negative(ValueError):
            pass

        def root(x):
            if x < 0:
                raise Negative("no real root")
            return x ** 0.5

        def sort_in_place(items):
            items.sort()

        def apply(function, value):
            return function(function(value))

        def count(n):
            yield from range(n)

        class Stack:
            def __init__(self):
                self.items = []
            def push(self, item):
                self.items.append(item)
            def pop(self):
                return self.items.pop()
            def __len__(self):
                return len(self.items)
        """
    )
    tests = [
        "try:\n    root(-1)\nexcept ValueError as error:\n    assert 'no real' in str(error)\n"
        "else:\n    raise AssertionError('no error')",
        "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]",
        "assert apply(lambda x: x * 3, 2) == 18",
        "assert list(count(3)) == [0, 1, 2] and sum(count(4)) == 6",
        "s = Stack()\ns.push(1)\ns.push(2)\nassert len(s) == 2 and s.pop() == 2\n"
        "assert s.items == [1]",
        "assert root(9) == 3.0",
    ]
    assert run_python(code, tests, LIMITS).passed == (True,) * 6


def test_an_exit_or_a_swallowed_timeout_inside_a_call_fails_its_test(sandbox_root: Path) -> None:
    code = (
        "import sys\n"
        "def quits(x):\n    sys.exit(0)\n"
        "def spins(x):\n    while True:\n        try:\n            while True:\n"
        "                pass\n        except BaseException:\n            pass\n"
        "def fine(x):\n    return x\n"
    )
    tests = [
        "try:\n    quits(1)\nexcept BaseException:\n    pass",  # the test cannot excuse it
        "assert fine(1) == 1",
        "try:\n    spins(1)\nexcept BaseException:\n    pass",
        "assert fine(2) == 2",  # the program no longer answers: everything after fails
    ]
    limits = SandboxLimits(timeout_seconds=4.0, test_timeout_seconds=0.3, cpu_seconds=3)
    started = time.monotonic()
    result = run_python(code, tests, limits)
    assert result.passed == (False, True, False, False)
    assert result.status == "timeout"
    assert time.monotonic() - started < 3.0  # the judge gave up well before the wall clock


def test_a_test_passing_a_non_plain_object_says_what_crosses(sandbox_root: Path) -> None:
    result = run_python(HONEST, ["class Box:\n    pass\nassert add(Box(), 1) == 1"], LIMITS)
    assert result.passed == (False,)
    assert "cannot be passed to the program: only plain data" in result.stderr


# ------------------------------------------------------------------------ orphans

_TRAINER = """
import signal, sys
sys.path.insert(0, {tests!r})
from mtgrpo.rewards.verifiers import code_reward
from mtgrpo.sandbox import SandboxLimits
blocker = (
    "<code>\\nimport signal\\nsignal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGALRM}})\\n"
    "def add(a, b):\\n    while True:\\n        pass\\n</code>"
)
print("scoring", flush=True)
code_reward(None, [blocker] * 2, tests=[["assert add(1, 2) == 3"]] * 2,
            limits=SandboxLimits(timeout_seconds=60, test_timeout_seconds=30, cpu_seconds=60))
"""


@pytest.mark.parametrize("kill", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_nothing_outlives_a_killed_trainer(sandbox_root: Path, kill: signal.Signals) -> None:
    before = set(os.listdir(tempfile.gettempdir()))
    script = _TRAINER.format(tests=str(Path(__file__).parent))
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                               start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(sandbox_processes()) < 8:
            time.sleep(0.05)  # two samples: launcher, reaper, harness and judge of each
        assert len(sandbox_processes()) >= 8, "the sandboxes did not start"
        time.sleep(0.3)  # the programs are spinning with SIGALRM blocked
        trainer.send_signal(kill)
        trainer.wait(timeout=10)
        gone_by = time.monotonic() + 2.0
        while sandbox_processes() and time.monotonic() < gone_by:
            time.sleep(0.02)
        assert sandbox_processes() == {}
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    assert set(os.listdir(tempfile.gettempdir())) == before  # no directory left behind
