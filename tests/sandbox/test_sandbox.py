"""The code sandbox against hostile programs.

Each hostile program must earn nothing it did not earn honestly (0, or the share of tests
it really passes) and leave nothing behind: its working directory is removed (the runs
use a private temporary root, checked empty afterwards), no sandbox process survives
(checked in /proc), and the files it tries to create outside its directory do not exist.
The attacks on the kernel's part of the sandbox (with the in-process audit hook off) are in
``test_sandbox_attacks.py``.
Limits are small so every case takes at most about a second.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from pathlib import Path

import pytest
from sandbox_helpers import LIMITS, SECRET

from mtgrpo.sandbox import (
    IOCase,
    SandboxLimits,
    prepare_tests,
    run_python,
    run_python_io,
)


def test_an_honest_program_passes_its_tests(sandbox_root: Path) -> None:
    code = "def add(a, b):\n    return a + b\n"
    result = run_python(code, ["assert add(1, 2) == 3", "assert add(2, 2) == 5"], LIMITS)
    assert result.status == "ok"
    assert result.passed == (True, False)
    assert result.pass_fraction == 0.5
    assert result.privileges_dropped
    assert result.network_isolated


def test_a_test_file_string_has_setup_and_tests(sandbox_root: Path) -> None:
    tests = "import math\nTOL = 1e-9\nassert abs(root(4) - 2) < TOL\nassert root(9) == 3.0\n"
    result = run_python("import math\ndef root(x):\n    return math.sqrt(x)", tests, LIMITS)
    assert result.passed == (True, True)
    assert prepare_tests(tests).units[0] == ("setup", "import math")


def test_stdlib_imports_work(sandbox_root: Path) -> None:
    code = (
        "from typing import List\nfrom collections import Counter, namedtuple\n"
        "import re, heapq, functools, itertools, dataclasses, enum, json, unittest\n"
        "P = namedtuple('P', 'x y')\n"
        "@dataclasses.dataclass\nclass D:\n    x: int\n"
        "def f(xs: List[int]) -> int:\n    return sum(xs)\n"
    )
    tests = [
        "assert f([1, 2]) == 3",
        "assert P(1, 2) == (1, 2)",  # a tuple subclass compares as plain data
        "assert D(1) == D(1)",  # neither side is plain data: ordinary ==
        "assert Counter('aab') == {'a': 2, 'b': 1}",
        "assert json.loads('[1]') == [1]",
    ]
    result = run_python(code, tests, LIMITS)
    assert result.passed == (True,) * 5, result.stderr


def test_the_working_directory_is_usable_and_then_removed(sandbox_root: Path) -> None:
    code = (
        "open('notes.txt', 'w').write('hi')\nimport os\nos.mkdir('sub')\n"
        "def notes():\n    return open('notes.txt').read()\n"
        "def listing():\n    return sorted(os.listdir('.'))\n"
    )
    tests = ["assert notes() == 'hi'", "assert listing() == ['notes.txt', 'sub']",
             # the tests run in the judge's own sandbox: the program's files are not there
             "import os\nassert not os.path.exists('notes.txt')"]  # fmt: skip
    assert run_python(code, tests, LIMITS).passed == (True, True, True)


# ----------------------------------------------------------------------------- time


def test_infinite_loop_at_top_level(sandbox_root: Path) -> None:
    started = time.perf_counter()
    result = run_python("while True:\n    pass", ["assert True"], LIMITS)
    assert result.status == "error"
    assert result.passed == (False,)
    assert "TestTimeout" in result.stderr
    assert time.perf_counter() - started < LIMITS.test_timeout_seconds + 1.5


def test_infinite_loop_in_one_test_costs_that_test_only(sandbox_root: Path) -> None:
    code = "def spin():\n    while True:\n        pass\n"
    result = run_python(code, ["assert spin() == 1", "assert 1 + 1 == 2"], LIMITS)
    assert result.passed == (False, True)


def test_a_loop_that_swallows_the_timer_is_killed_at_the_deadline(sandbox_root: Path) -> None:
    code = (
        "def spin():\n    while True:\n        try:\n            while True:\n"
        "                pass\n        except BaseException:\n            pass\n"
    )
    limits = SandboxLimits(timeout_seconds=1.0, test_timeout_seconds=0.2, cpu_seconds=5)
    started = time.perf_counter()
    result = run_python(code, ["assert spin()", "assert True"], limits)
    assert result.status == "timeout"
    assert result.passed == (False, False)
    assert time.perf_counter() - started < 2.5


def test_cpu_limit_kills_a_busy_program(sandbox_root: Path) -> None:
    code = (
        "while True:\n    try:\n        while True:\n            pass\n"
        "    except BaseException:\n        pass\n"
    )
    limits = SandboxLimits(timeout_seconds=8.0, test_timeout_seconds=0.2, cpu_seconds=1)
    result = run_python(code, ["assert True"], limits)
    assert result.status == "timeout"
    assert result.returncode == -signal.SIGXCPU  # the CPU limit, not the wall clock


# ------------------------------------------------------------------------ processes


@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.fork()",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "import os\nos.system('touch /tmp/never')",
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'true'])",
        "import os\nos.posix_spawn('/bin/true', ['true'], {})",
        "import subprocess\nsubprocess.run(['true'])",
        "import pty\npty.spawn('/bin/sh')",
        "import _posixsubprocess",
        "import multiprocessing\nmultiprocessing.Process(target=print).start()",
        "import threading\nthreading.Thread(target=print).start()",
    ],
    ids=[
        "fork",
        "fork-bomb",
        "system",
        "exec",
        "posix_spawn",
        "subprocess",
        "pty",
        "posixsubprocess",
        "multiprocessing",
        "thread",
    ],
)
def test_no_new_processes(sandbox_root: Path, code: str) -> None:
    result = run_python(code, ["assert True"], LIMITS)
    assert result.passed == (False,)
    assert result.status == "error"
    # refused by the audit hook, by RLIMIT_NPROC (threads), or looping on refusals
    assert re.search(r"sandbox: |can't start new thread|TestTimeout", result.stderr)


def test_killing_the_parent_is_refused(sandbox_root: Path) -> None:
    result = run_python("import os\nos.kill(os.getppid(), 9)", ["assert True"], LIMITS)
    assert result.passed == (False,)
    assert "os.kill is not allowed" in result.stderr


# --------------------------------------------------------------------------- memory


@pytest.mark.parametrize(
    "code",
    ["x = bytearray(10**10)", "x = [0] * 10**9", "x = ' ' * 2**31"],
)
def test_memory_bombs(sandbox_root: Path, code: str) -> None:
    result = run_python(code, ["assert True"], LIMITS)
    assert result.passed == (False,)
    assert "MemoryError" in result.stderr


def test_growing_memory_stops_at_the_limit(sandbox_root: Path) -> None:
    # Each chunk is written (zero-filled), so this really takes memory, up to the 64 MiB
    # address-space limit, then fails. A generous per-test budget keeps a loaded machine
    # from turning it into a timeout.
    limits = SandboxLimits(memory_bytes=64 << 20, test_timeout_seconds=3.0, timeout_seconds=5.0)
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 20))"
    result = run_python(code, ["assert True"], limits)
    assert result.passed == (False,)
    assert "program: MemoryError" in result.stderr


# ---------------------------------------------------------------------- file system


@pytest.mark.parametrize(
    "template",
    [
        "open({outside!r}, 'w').write('x')",
        "import os\nfd = os.open({outside!r}, os.O_WRONLY | os.O_CREAT)",
        "open('inside', 'w').close()\nimport os\nos.rename('inside', {outside!r})",
        "import os\nos.symlink({outside!r}, 'link')\nopen('link', 'w').write('x')",
        "import shutil\nopen('inside', 'w').close()\nshutil.copy('inside', {outside!r})",
        "import os\nos.mkdir({outside!r})",
        "open('../' + {name!r}, 'w').write('x')",
        "import os\nos.chdir('/tmp')\nopen({name!r}, 'w').write('x')",
    ],
    ids=["open", "os.open", "rename", "symlink", "shutil", "mkdir", "dotdot", "chdir"],
)
def test_no_writes_outside_the_working_directory(sandbox_root: Path, template: str) -> None:
    name = f"mtgrpo-hostile-{uuid.uuid4().hex}"
    outside = f"/tmp/{name}"
    result = run_python(template.format(outside=outside, name=name), ["assert True"], LIMITS)
    assert result.passed == (False,)
    assert "sandbox: " in result.stderr
    assert not os.path.lexists(outside)
    assert not (sandbox_root / name).exists()
    assert not (Path.cwd() / name).exists()


def test_file_size_and_count_limits(sandbox_root: Path) -> None:
    big = "open('big', 'wb').write(b'x' * (4 << 20))"
    result = run_python(big, ["assert True"], LIMITS)
    assert "File too large" in result.stderr
    many = "for i in range(100):\n    open(f'f{i}', 'w').close()"
    result = run_python(many, ["assert True"], LIMITS)
    assert result.passed == (False,)
    assert "no access to 'f8'" in result.stderr  # max_files = 8: the ninth is refused


@pytest.mark.parametrize(
    "code",
    [
        "print(open('/etc/passwd').read())",
        "import os\nprint(os.read(os.open('/etc/passwd', os.O_RDONLY), 4096))",
        "print(open('/etc/hostname').read())",
        "print(open('/proc/self/environ', 'rb').read())",
        "import os\nprint(open(f'/proc/{os.getppid()}/environ', 'rb').read())",
        "print(open('/proc/self/mem', 'rb').read(10))",
        "import os\nprint(os.listdir('/'))",
        "import pwd\nprint(pwd.getpwall())",
        "import _imp\nclass S:\n    name = 'pwd'\nprint(_imp.create_builtin(S()).getpwall())",
        # a directory fd the program may open, then a path relative to it the hook cannot see
        "import os\nlib = os.open(os.path.dirname(os.__file__), os.O_RDONLY)\n"
        "print(os.read(os.open('../../../../etc/passwd', os.O_RDONLY, dir_fd=lib), 99))",
        "import os\nclass Lying(str):\n    def __getitem__(self, index):\n        return '/'\n"
        "    def startswith(self, *args):\n        return True\n"
        "lib = os.open(os.path.dirname(os.__file__), os.O_RDONLY)\n"
        "os.open(Lying('../../../../etc/passwd'), os.O_RDONLY, dir_fd=lib)",
    ],
    ids=[
        "passwd",
        "os.open",
        "hostname",
        "self-environ",
        "parent-environ",
        "mem",
        "listdir",
        "pwd",
        "create_builtin",
        "dir_fd",
        "lying-path",
    ],
)
def test_no_reads_outside_the_allowed_paths(sandbox_root: Path, code: str) -> None:
    result = run_python(code, ["assert True"], LIMITS)
    assert result.passed == (False,)
    assert "sandbox: " in result.stderr
    assert "root:" not in result.stdout
    assert SECRET not in result.stdout


def test_the_environment_is_not_inherited(sandbox_root: Path) -> None:
    assert os.environ["MTGRPO_FAKE_SECRET"] == SECRET
    code = "import os\nprint(dict(os.environ))\n"
    result = run_python(code, ["assert 'MTGRPO_FAKE_SECRET' not in os.environ"], LIMITS)
    assert result.passed == (True,)
    assert SECRET not in result.stdout
    assert "HOME" in result.stdout


# -------------------------------------------------------------------------- network


@pytest.mark.parametrize(
    "code",
    [
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)",
        "import _socket\n_socket.socket()",
        "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=1)",
        "import ssl",
        "import ctypes\nctypes.CDLL(None).socket(2, 1, 0)",
    ],
    ids=["socket", "_socket", "urllib", "ssl", "ctypes"],
)
def test_no_network(sandbox_root: Path, code: str) -> None:
    result = run_python(code, ["assert True"], LIMITS)
    assert result.passed == (False,)
    assert "sandbox: module" in result.stderr
    assert result.network_isolated


# -------------------------------------------------------------------------- output


def test_printing_a_gigabyte_is_cut_off(sandbox_root: Path) -> None:
    started = time.perf_counter()
    code = "import sys\nfor _ in range(2**14):\n    sys.stdout.write('x' * 65536)"
    result = run_python(code, ["assert True"], LIMITS)
    assert result.status == "output_limit"
    assert result.passed == (False,)
    assert len(result.stdout) <= LIMITS.output_bytes + 65536
    assert time.perf_counter() - started < 2.0


# ------------------------------------------------------------------ result channel


@pytest.mark.parametrize(
    "code",
    [
        'print(\'ALL TESTS PASSED\')\nprint(\'{"passed": [true, true], "status": "ok"}\')',
        "import os\nfor fd in range(3, 256):\n    try:\n"
        "        os.write(fd, b'C' + b'0' * 32 + b'\\nT' + b'1' * 32 + b'\\nN1 P1\\n')\n"
        "    except OSError:\n        pass",
        "import os\nos._exit(0)",
        "import sys\nsys.exit(0)",
        "__mtgrpo_strict_eq__ = lambda a, b: True",
        "import __main__\n__main__.STRICT_EQ = 'eq'\neq = lambda a, b: True",
        "import builtins\nbuiltins.AssertionError = None\nbuiltins.BaseException = int",
    ],
    ids=["print", "fake-records", "os._exit", "sys.exit", "own-eq", "patch-harness", "builtins"],
)
def test_the_result_channel_cannot_be_forged(sandbox_root: Path, code: str) -> None:
    program = code + "\ndef solve():\n    return 1\n"
    result = run_python(program, ["assert solve() == 2"] * 2, LIMITS)
    assert result.passed == (False, False)


def test_patched_builtins_do_not_change_the_strict_equality(sandbox_root: Path) -> None:
    code = (
        "import builtins\nclass Never:\n    def __eq__(self, other):\n        return False\n"
        "builtins.bool = lambda value: True\nbuiltins.BaseException = int\n"
        "builtins.isinstance = lambda value, kind: False\n"
        "def solve():\n    return Never()\n"
    )
    assert run_python(code, ["assert solve() == Never()"], LIMITS).passed == (False,)


def test_an_always_equal_object_does_not_pass(sandbox_root: Path) -> None:
    code = (
        "class Liar:\n    def __eq__(self, other):\n        return True\n"
        "    def __bool__(self):\n        return True\n"
        "class LyingInt(int):\n    def __eq__(self, other):\n        return True\n"
        "def solve(x):\n    return Liar() if x else LyingInt(7)\n"
    )
    tests = ["assert solve(1) == 2", "assert 2 == solve(1)", "assert solve(0) == 3",
             "assert solve(0) == 7", "assert [solve(0)] == [7]"]  # fmt: skip
    # The int subclass is compared by its int value: the last two really are 7.
    assert run_python(code, tests, LIMITS).passed == (False, False, False, True, True)


@pytest.mark.parametrize(
    "code",
    [
        "import sys\nf = sys._getframe(1)",
        "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    f = e.__traceback__.tb_frame",
        "def g():\n    yield\nx = g()\nf = x.gi_frame",
        "import gc\nobjects = gc.get_objects()",
        "import gc\nobjects = gc.get_referrers(1)",
        "import sys\nsys.settrace(lambda *a: None)",
        "import signal\nsignal.signal(signal.SIGALRM, lambda s, f: None)",
        "import _signal\n_signal.signal(14, lambda s, f: None)",
        "import _imp\nclass S:\n    name = '_signal'\n_imp.create_builtin(S())",
        "import ctypes",
        "(lambda: 0).__code__.replace(co_consts=(1,))",
        "import _imp\nclass Name(str):\n    __hash__ = lambda self: 0\n"
        "    __eq__ = lambda self, other: False\n"
        "class S:\n    name = Name('_signal')\n_imp.create_builtin(S())",
        "import __main__\nfor name in ('DENIED_EVENTS', 'FRAME_EVENTS', 'BLOCKED_MODULES'):\n"
        "    setattr(__main__, name, frozenset())\nimport sys\nsys._getframe(1)",
        "import builtins\nbuiltins.any = lambda items: False\nbuiltins.isinstance = None\n"
        "import os\nos.fork()",
    ],
    ids=[
        "getframe",
        "tb_frame",
        "gi_frame",
        "gc",
        "referrers",
        "settrace",
        "signal",
        "_signal",
        "create_builtin",
        "ctypes",
        "code.replace",
        "lying-module-name",
        "patched-constants",
        "patched-builtins",
    ],
)
def test_the_harness_secrets_are_out_of_reach(sandbox_root: Path, code: str) -> None:
    result = run_python(code, ["assert True"], LIMITS)
    assert result.status == "error"
    assert result.passed == (False,)
    assert "sandbox: " in result.stderr


# ----------------------------------------------------------------------------- I/O


def test_io_cases(sandbox_root: Path) -> None:
    code = "a, b = map(int, input().split())\nprint(a + b)\n"
    cases = [IOCase("1 2\n", "3\n"), IOCase("2 2", "4   \n\n"), {"input": "1 1", "output": "3"}]
    result = run_python_io(code, cases, LIMITS)
    assert result.passed == (True, True, False)
    assert result.status == "ok"


def test_io_large_input_and_a_program_that_ignores_it(sandbox_root: Path) -> None:
    numbers = "\n".join(str(i) for i in range(200_000)) + "\n"  # about 1.3 MB of stdin
    expected = f"{sum(range(200_000))}\n"
    reads = "import sys\nprint(sum(int(x) for x in sys.stdin))"
    assert run_python_io(reads, [IOCase(numbers, expected)], LIMITS).passed == (True,)
    ignores = f"print({sum(range(200_000))})"
    assert run_python_io(ignores, [IOCase(numbers, expected)], LIMITS).passed == (True,)


def test_io_crash_and_forged_output(sandbox_root: Path) -> None:
    crash = "print(3)\nraise SystemExit(1)"
    result = run_python_io(crash, [IOCase("", "3")], LIMITS)
    assert (result.status, result.passed) == ("error", (False,))
    forge = "print('ALL TESTS PASSED')"
    assert run_python_io(forge, [IOCase("", "3")], LIMITS).passed == (False,)


def test_io_total_time_stops_remaining_cases(sandbox_root: Path) -> None:
    limits = SandboxLimits(timeout_seconds=0.8, test_timeout_seconds=0.3)
    started = time.perf_counter()
    result = run_python_io("while True:\n    pass", [IOCase("", "")] * 10, limits)
    assert result.passed == (False,) * 10
    assert result.status == "timeout"
    assert time.perf_counter() - started < 0.8 + 2.5  # the last case may start before 0.8 s


def test_syntax_errors_and_invalid_tests(sandbox_root: Path) -> None:
    result = run_python("def f(:\n", ["assert True"], LIMITS)
    assert (result.status, result.passed) == ("syntax_error", (False,))
    assert run_python("x = (" * 300 + ")" * 300, ["assert True"], LIMITS).status == "syntax_error"
    with pytest.raises(ValueError, match=r"tests\[1\] is not valid Python"):
        run_python("x = 1", ["assert x", "assert ("], LIMITS)
    with pytest.raises(TypeError, match="tests must be a string of Python statements"):
        run_python("x = 1", [1, 2], LIMITS)  # type: ignore[list-item]


def test_extra_paths_make_a_directory_importable(sandbox_root: Path, tmp_path: Path) -> None:
    library = tmp_path / "library"
    library.mkdir()
    (library / "helper_mod.py").write_text("VALUE = 41\n")
    code = "import helper_mod\ndef answer():\n    return helper_mod.VALUE + 1"
    without = run_python(code, ["assert answer() == 42"], LIMITS)
    assert without.passed == (False,)
    limits = SandboxLimits(test_timeout_seconds=1.0, extra_paths=(str(library),))
    assert run_python(code, ["assert answer() == 42"], limits).passed == (True,)


def test_invalid_limits() -> None:
    with pytest.raises(ValueError, match="timeout_seconds must be a positive number, got 0"):
        SandboxLimits(timeout_seconds=0)
    with pytest.raises(ValueError, match="memory_bytes must be a positive int"):
        SandboxLimits(memory_bytes=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_open_files must be at least 16"):
        SandboxLimits(max_open_files=4)


# ---------------------------------------------------------------------- value checks


def test_values_cross_to_the_judge_as_plain_data(sandbox_root: Path) -> None:
    code = (
        "import os\n"
        "class Mine(int):\n    def __eq__(self, other):\n        return True\n"
        "def value(kind):\n"
        "    return {'big': 2 ** 20000 + 1, 'float': 0.1 + 0.2, 'nan': float('nan'),\n"
        "            'text': 'é\\ud800\\n\"', 'nested': {'a': [1, (2.5, 3j)], 'b': {b'x'}},\n"
        "            'frozen': frozenset({1, 2}), 'none': None, 'sub': Mine(7),\n"
        "            'env': os.environ, 'keys': {'k': 1}.keys(), 'obj': object()}[kind]\n"
    )
    tests = [
        f"assert value('big') == {hex(2**20000 + 1)}",  # past int(str)'s 4,300 digits
        "assert value('float') == 0.30000000000000004",
        "assert value('float') != 0.3",
        "assert value('nan') != 0.0",
        "assert value('text') == 'é\\ud800\\n\"'",
        "assert value('nested') == {'a': [1, (2.5, 3j)], 'b': {b'x'}}",
        "assert value('nested') == {'a': [1, [2.5, 3j]], 'b': {b'x'}}",  # a list is no tuple
        "assert value('frozen') == {2, 1}",
        "assert value('none') is None",
        "assert not value('none') is not None",
        "assert value('sub') == 7",  # an int subclass is read as its int value
        "assert value('sub') == 8",  # ... so its lying __eq__ does not count
        "assert 'PATH' in value('env')",  # a Mapping reads as a dict
        "assert value('keys') == {'k'}",  # a Set reads as a set
        "assert 'x' in value('text')",
        "assert value('obj') == 1",  # not plain data: never equal to a literal
        "assert value('obj') is not None",
    ]
    expected = (True, True, True, True, True, True, False, True, True, True, True, False,
                True, True, False, False, True)  # fmt: skip
    assert prepare_tests(tests).test_count == len(tests)
    assert run_python(code, tests, LIMITS).passed == expected


def test_a_judge_that_cannot_start_gives_a_failed_result(sandbox_root: Path,
                                                          monkeypatch) -> None:
    # the program's launcher starts, the judge's fails (a full process table: EAGAIN): every
    # test fails with the reason, instead of an IndexError for the missing judge
    from mtgrpo.sandbox import run as sandbox_run

    started = []
    real_start = sandbox_run._start

    def start_then_fail(job, *args):
        if started:
            raise OSError(11, "Resource temporarily unavailable")
        started.append(job)
        return real_start(job, *args)

    monkeypatch.setattr(sandbox_run, "_start", start_then_fail)
    result = run_python("def add(a, b):\n    return a + b", ["assert add(1, 2) == 3"], LIMITS)
    assert result.passed == (False,)
    assert "sandbox could not start" in result.stderr
