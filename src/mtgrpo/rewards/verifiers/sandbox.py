"""Run untrusted Python (model completions) against tests in a locked-down child process.

Two entry points:

* :func:`run_python` (``tests`` mode): the program, then assert-style tests, in one process.
  A test passes when it runs to the end without raising within its time budget.
* :func:`run_python_io` (``io`` mode): one process per input/output case; the program reads
  the case input on stdin and passes when it exits normally and its stdout matches the
  expected output (trailing whitespace of each line and trailing blank lines ignored). The
  comparison happens here, in the parent, so nothing the program does can fake a pass.

The child (``_sandbox_harness.py``, run with ``python -I -S -B -X utf8``: isolated mode, no
site-packages, no bytecode writes) gets:

* **time**: a per-test timer (``SIGALRM``), ``RLIMIT_CPU``, and a wall-clock deadline after
  which the parent kills the child's whole process group;
* **memory**: ``RLIMIT_AS``; **files**: ``RLIMIT_FSIZE`` (oversized writes fail with
  ``EFBIG``), at most ``max_files`` opens for writing, ``RLIMIT_NOFILE``; an empty temporary
  working directory, removed afterwards;
* **processes**: ``RLIMIT_NPROC = 0`` plus an audit hook refusing fork/exec/spawn/``system``/
  ``subprocess``/``kill`` (the rlimit alone is not enforced for root);
* **network**: a new network namespace when the kernel allows (``N1`` in the report), and
  the audit hook's ban on ``socket``/``ssl``/``ctypes`` and friends in any case;
* **file system**: writes only inside the working directory, reads only there and in the
  interpreter's own library (the audit hook), and, when the parent is root, the child drops
  to ``nobody`` so the kernel enforces write permissions too;
* **environment**: an explicit five-variable environment (no inherited secrets);
* **output**: at most ``output_bytes`` of stdout+stderr are read; past that, the child is
  killed (status ``"output_limit"``).

Result channel. A passing test is reported by writing that test's random 128-bit token to a
pipe. Tokens are generated per run, sent on stdin (read by the harness before the program
starts) and kept only in local variables of the harness's frames, which the audit hook
keeps out of reach; stdout is never parsed. Printing ``ALL TESTS PASSED``, writing fake
JSON to every file descriptor, or exiting early earns nothing. Assert tests of the form
``assert a == b`` are rewritten to a strict equality, so a returned object whose ``__eq__``
always answers ``True`` does not pass either. What this does not protect against is in
``docs/sandbox.md``.
"""

from __future__ import annotations

import ast
import contextlib
import marshal
import math
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "SANDBOX_STATUSES",
    "IOCase",
    "SandboxLimits",
    "SandboxResult",
    "prepare_tests",
    "run_python",
    "run_python_io",
]

HARNESS = Path(__file__).with_name("_sandbox_harness.py")
STRICT_EQ = "__mtgrpo_strict_eq__"  # the harness binds this name in every test's globals
STARTUP_SECONDS = 2.0  # wall-clock allowance for interpreter start-up, per process
SANDBOX_STATUSES = (
    "ok", "syntax_error", "error", "timeout", "output_limit", "killed", "sandbox_error"
)  # fmt: skip
_READ_CHUNK = 65536


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run.

    Attributes:
        timeout_seconds: wall clock for the whole run (all tests, or all I/O cases); the
            process group is killed when it is spent.
        test_timeout_seconds: budget of the program's top level and of each test (``tests``
            mode, a timer inside the child), or of each I/O case (plus start-up).
        cpu_seconds: ``RLIMIT_CPU`` of each process.
        memory_bytes: ``RLIMIT_AS`` of each process (address space, not resident memory).
        output_bytes: most bytes of stdout+stderr read from a process; more kills it.
        file_bytes: ``RLIMIT_FSIZE``: the largest file the program may write.
        max_files: how many files the program may open for writing (and directories it may
            create), in total.
        max_open_files: ``RLIMIT_NOFILE``.
        network_namespace: try to enter an empty network namespace (the audit hook bans
            sockets regardless).
        extra_paths: directories added to the child's import path and readable by it (for
            example a site-packages directory, to allow numpy); none by default.
    """

    timeout_seconds: float = 10.0
    test_timeout_seconds: float = 2.0
    cpu_seconds: int = 10
    memory_bytes: int = 1 << 30
    output_bytes: int = 1 << 20
    file_bytes: int = 1 << 20
    max_files: int = 64
    max_open_files: int = 64
    network_namespace: bool = True
    extra_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("timeout_seconds", "test_timeout_seconds"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {value!r}")
        for name in ("cpu_seconds", "memory_bytes", "output_bytes", "file_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SandboxLimits.{name} must be a positive int, got {value!r}")
        for name in ("max_files", "max_open_files"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"SandboxLimits.{name} must be an int >= 0, got {value!r}")
        if self.max_open_files < 16:
            raise ValueError(
                f"SandboxLimits.max_open_files must be at least 16 (the interpreter needs "
                f"some), got {self.max_open_files}"
            )
        paths = tuple(str(Path(path).resolve()) for path in self.extra_paths)
        object.__setattr__(self, "extra_paths", paths)


@dataclass(frozen=True)
class IOCase:
    """One input/output case: the program gets ``input`` on stdin and must print ``output``."""

    input: str
    output: str


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run produced.

    Attributes:
        status: one of :data:`SANDBOX_STATUSES`: ``"ok"`` (the program ran and the process
            ended by itself), ``"syntax_error"`` (the program does not compile),
            ``"error"`` (its top level raised or, in ``io`` mode, it exited non-zero),
            ``"timeout"`` (wall clock or CPU time spent), ``"output_limit"``, ``"killed"``
            (ended by another signal), ``"sandbox_error"`` (the harness itself failed). In
            ``io`` mode: the first case's status that is not ``"ok"``.
        passed: per test (or case), whether it passed.  # [T]
        stdout: the program's stdout (at most ``output_bytes``, decoded leniently); in
            ``io`` mode, of the first failing case, else of the last.
        stderr: the same for stderr.
        returncode: the (last examined) process's exit status; negative for a signal.
        wall_seconds: wall-clock time of the whole run, start-up included.
        network_isolated: the child entered an empty network namespace.
        privileges_dropped: the child switched from root to ``nobody``.
    """

    status: str
    passed: tuple[bool, ...]
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    wall_seconds: float = 0.0
    network_isolated: bool = False
    privileges_dropped: bool = False

    @property
    def tests_total(self) -> int:
        return len(self.passed)

    @property
    def tests_passed(self) -> int:
        return sum(self.passed)

    @property
    def pass_fraction(self) -> float:
        """Fraction of tests passed, in [0, 1]; 0.0 when there are no tests."""
        return self.tests_passed / self.tests_total if self.passed else 0.0


@dataclass
class _Process:
    """Raw outcome of one child process (parent-side bookkeeping)."""

    stdout: bytes = b""
    stderr: bytes = b""
    report: bytes = b""
    returncode: int | None = None
    timed_out: bool = False
    output_exceeded: bool = False


def prepare_tests(tests: str | Sequence[str]) -> list[tuple[str, str]]:
    """Split tests into ``("test" | "setup", source)`` units, asserts made strict.

    A string is a test file: each top-level ``assert`` is one test, every other top-level
    statement (imports, helpers, assignments) is setup run in the program's namespace. A
    list holds one test per item (an item may have several statements; it passes when all
    run). ``assert a == b`` becomes ``assert __mtgrpo_strict_eq__(a, b)``. Tests come from
    the dataset: one that is not valid Python is a ``ValueError`` naming it.

    >>> prepare_tests("from math import sqrt\\nassert sqrt(4) == 2")
    [('setup', 'from math import sqrt'), ('test', 'assert __mtgrpo_strict_eq__(sqrt(4), 2)')]
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
    return [(kind, ast.unparse([_strict_assert(node) for node in nodes])) for kind, nodes in units]


def _parse_tests(source: str, where: str) -> ast.Module:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise ValueError(f"{where} is not valid Python ({error}): {source!r:.120}") from None


def _strict_assert(node: ast.stmt) -> ast.stmt:
    test = node.test if isinstance(node, ast.Assert) else None
    if not (isinstance(test, ast.Compare) and [type(op) for op in test.ops] == [ast.Eq]):
        return node
    call = ast.Call(ast.Name(STRICT_EQ, ast.Load()), [test.left, test.comparators[0]], [])
    return ast.copy_location(ast.Assert(ast.copy_location(call, test), node.msg), node)


def run_python(
    code: str, tests: str | Sequence[str] = (), limits: SandboxLimits | None = None
) -> SandboxResult:
    """Run ``code`` then ``tests`` (see :func:`prepare_tests`) in the sandbox.

    The program's top level runs in a namespace named ``__solution__`` (so its
    ``if __name__ == "__main__":`` block does not run); its stdin is empty.

    >>> result = run_python("def add(a, b):\\n    return a + b", ["assert add(1, 2) == 3"])
    >>> result.status, result.passed
    ('ok', (True,))
    """
    limits = limits or SandboxLimits()
    units = prepare_tests(tests)
    count = sum(kind == "test" for kind, _ in units)
    tokens = [secrets.token_hex(16).encode() for _ in range(count)]
    code_token = secrets.token_hex(16).encode()
    if not isinstance(code, str):
        return SandboxResult("syntax_error", (False,) * count)
    job = {"mode": "tests", "code": code, "tests": units, "tokens": tokens}
    job["code_token"] = code_token
    started = time.monotonic()
    raw = _spawn(job, b"", limits, started + limits.timeout_seconds)
    status, network, dropped = _status(raw, code_token)
    return SandboxResult(
        status=status,
        passed=tuple(b"T" + token + b"\n" in raw.report for token in tokens),
        stdout=raw.stdout.decode("utf-8", "replace"),
        stderr=raw.stderr.decode("utf-8", "replace"),
        returncode=raw.returncode,
        wall_seconds=time.monotonic() - started,
        network_isolated=network,
        privileges_dropped=dropped,
    )


def run_python_io(
    code: str,
    cases: Sequence[IOCase | Mapping[str, Any]],
    limits: SandboxLimits | None = None,
) -> SandboxResult:
    """Run ``code`` once per case with the case input on stdin; compare stdout here.

    Cases are :class:`IOCase` or mappings with ``input`` and ``output`` (strings). Each case
    is a fresh process with ``test_timeout_seconds`` (plus start-up) of wall clock; cases
    left when ``timeout_seconds`` is spent fail without running.

    >>> run_python_io("print(int(input()) * 2)", [IOCase("21\\n", "42\\n")]).passed
    (True,)
    """
    limits = limits or SandboxLimits()
    checked = [_io_case(case, index) for index, case in enumerate(cases)]
    started = time.monotonic()
    deadline = started + limits.timeout_seconds
    passed: list[bool] = []
    first_failure: tuple[str, _Process] | None = None
    raw, status, network, dropped = _Process(), "ok", False, False
    for case in checked:
        case_deadline = min(deadline, time.monotonic() + limits.test_timeout_seconds)
        if time.monotonic() >= deadline or not isinstance(code, str):
            passed.append(False)
            continue
        job = {"mode": "io", "code": code, "tests": [], "tokens": [], "code_token": b""}
        raw = _spawn(job, case.input.encode(), limits, case_deadline + STARTUP_SECONDS)
        status, network, dropped = _status(raw, None)
        ok = status == "ok" and _same_output(raw.stdout, case.output)
        passed.append(ok)
        if not ok and first_failure is None:
            first_failure = (status, raw)
    if first_failure is not None:
        status, raw = first_failure
    if not isinstance(code, str):
        status = "syntax_error"
    return SandboxResult(
        status=status,
        passed=tuple(passed),
        stdout=raw.stdout.decode("utf-8", "replace"),
        stderr=raw.stderr.decode("utf-8", "replace"),
        returncode=raw.returncode,
        wall_seconds=time.monotonic() - started,
        network_isolated=network,
        privileges_dropped=dropped,
    )


def _io_case(case: IOCase | Mapping[str, Any], index: int) -> IOCase:
    if isinstance(case, IOCase):
        return case
    if isinstance(case, Mapping) and all(isinstance(case.get(k), str) for k in ("input", "output")):
        return IOCase(case["input"], case["output"])
    raise TypeError(
        f"I/O case {index} must be an IOCase or a mapping with string 'input' and 'output', "
        f"got {case!r:.120}"
    )


def _same_output(stdout: bytes, expected: str) -> bool:
    """Equal up to trailing whitespace on each line and trailing blank lines."""

    def normal(text: str) -> list[str]:
        lines = [line.rstrip() for line in text.splitlines()]
        while lines and not lines[-1]:
            lines.pop()
        return lines

    return normal(stdout.decode("utf-8", "replace")) == normal(expected)


def _status(raw: _Process, code_token: bytes | None) -> tuple[str, bool, bool]:
    """(status, network isolated, privileges dropped) from the report and the exit."""
    first, _, rest = raw.report.partition(b"\n")
    network, dropped = b"N1" in first, b"P1" in first
    if raw.output_exceeded:
        return "output_limit", network, dropped
    if raw.timed_out or raw.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "timeout", network, dropped
    if not first.startswith(b"N"):
        return "sandbox_error", network, dropped
    if rest.startswith(b"S "):
        return "syntax_error", network, dropped
    if raw.returncode is not None and raw.returncode < 0:
        return "killed", network, dropped
    if code_token is not None:
        return ("ok" if b"C" + code_token + b"\n" in rest else "error"), network, dropped
    return ("ok" if raw.returncode == 0 else "error"), network, dropped


def _spawn(
    job: dict[str, Any], stdin_tail: bytes, limits: SandboxLimits, deadline: float
) -> _Process:
    """Start the harness on ``job``, feed it, collect its output until exit or ``deadline``."""
    workdir = tempfile.mkdtemp(prefix="mtgrpo-sandbox-")
    report_read, report_write = os.pipe()
    raw = _Process()
    try:
        job |= _job_limits(limits, workdir, report_write)
        payload = marshal.dumps(job)
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-X", "utf8", str(HARNESS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(report_write,),
            cwd=workdir,
            env=_child_environment(workdir),
            start_new_session=True,
        )
        os.close(report_write)
        report_write = -1
        try:
            _collect(process, len(payload).to_bytes(8, "little") + payload + stdin_tail,
                     report_read, limits, deadline, raw)  # fmt: skip
        finally:
            _kill_group(process)
            raw.returncode = process.wait()
    except OSError as error:
        raw.stderr += f"sandbox could not start: {error}".encode()
    finally:
        for fd in (report_read, report_write):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)
    return raw


def _job_limits(limits: SandboxLimits, workdir: str, report_fd: int) -> dict[str, Any]:
    return {
        "result_fd": report_fd,
        "workdir": os.path.realpath(workdir),
        "read_paths": list(limits.extra_paths),
        "memory_bytes": limits.memory_bytes,
        "cpu_seconds": limits.cpu_seconds,
        "file_bytes": limits.file_bytes,
        "max_files": limits.max_files,
        "max_open_files": limits.max_open_files,
        "network_namespace": limits.network_namespace,
        "test_seconds": float(limits.test_timeout_seconds),
    }


def _child_environment(workdir: str) -> dict[str, str]:
    """The child's whole environment: nothing inherited, so no secret can leak through it."""
    return {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
    }


def _collect(
    process: subprocess.Popen[bytes],
    stdin_data: bytes,
    report_fd: int,
    limits: SandboxLimits,
    deadline: float,
    raw: _Process,
) -> None:
    """Feed stdin and read stdout, stderr and the report pipe until EOF on all or a limit."""
    assert process.stdin is not None
    assert process.stdout is not None
    assert process.stderr is not None
    stdin_fd = process.stdin.fileno()
    os.set_blocking(stdin_fd, False)
    readers = {process.stdout.fileno(): "stdout", process.stderr.fileno(): "stderr"}
    readers[report_fd] = "report"
    poller = select.poll()
    for fd in readers:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    offset = 0
    if stdin_data:
        poller.register(stdin_fd, select.POLLOUT | select.POLLERR)
    report_cap = limits.output_bytes + 64 * 1024
    while readers:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raw.timed_out = True
            return
        for fd, _ in poller.poll(remaining * 1000):
            if fd == stdin_fd:
                offset = _feed(process, poller, stdin_data, offset)
                continue
            chunk = _read(fd)
            if not chunk:
                poller.unregister(fd)
                del readers[fd]
                continue
            name = readers[fd]
            if name == "report":
                # Drained past the cap rather than closed: closing here and again in
                # ``_spawn`` could close another thread's descriptor that reused the number.
                if len(raw.report) <= report_cap:
                    raw.report += chunk
                continue
            setattr(raw, name, getattr(raw, name) + chunk)
            if len(raw.stdout) + len(raw.stderr) > limits.output_bytes:
                raw.output_exceeded = True
                return


def _feed(process: subprocess.Popen[bytes], poller: select.poll, data: bytes, offset: int) -> int:
    """Write the next piece of stdin; close it (and stop polling it) when done or refused."""
    assert process.stdin is not None
    stdin_fd = process.stdin.fileno()
    try:
        offset += os.write(stdin_fd, data[offset : offset + _READ_CHUNK])
    except BlockingIOError:
        return offset
    except OSError:  # the child closed its end (exited, or ignores stdin): nothing to feed
        offset = len(data)
    if offset >= len(data):
        poller.unregister(stdin_fd)
        with contextlib.suppress(OSError):
            process.stdin.close()
    return offset


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, _READ_CHUNK)
    except OSError:
        return b""


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group (the child leads it: ``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
