"""Run untrusted Python (model completions) against tests in a kernel-enforced sandbox.

Two entry points:

* :func:`run_python` (``tests`` mode): the program, then assert-style tests, in one process.
  A test passes when it runs to the end within its time budget and every value check in
  it holds (see below).
* :func:`run_python_io` (``io`` mode): one process per input/output case; the program reads
  the case input on stdin and passes when it exits normally and its stdout matches the
  expected output (trailing whitespace of each line and trailing blank lines ignored). The
  comparison happens here, in the parent, so nothing the program does can fake a pass.

Isolation is the kernel's (``_sandbox_launch.py`` builds it, ``docs/sandbox.md`` has the
threat model): new mount, PID, network, IPC and UTS namespaces (inside a user namespace when
the trainer is not root); a read-only root holding only the interpreter, its standard
library (no site-packages of any interpreter, no FFI module) and the caller's
``extra_paths`` (``_sandbox_view.py``); no ``/proc``; a private writable work directory that
cannot hold executable code, removed afterwards; uid 65534 with no capability at all and
``no_new_privs``; resource limits (address space, CPU, file size, open files, no new
processes); a per-test timer and a wall-clock deadline after which the whole process group
is killed. Where the kernel refuses any of this, :class:`SandboxUnavailableError` is raised
and the program is not run. Inside, an audit hook adds a finer layer (clear errors, no
frame walking); it is not what the boundary rests on.

Verdicts. ``assert <expr> == <literal>`` and its relatives are *value checks*: the program
evaluates ``<expr>`` and reports its value as plain data; the launcher (outside the
sandbox, the only holder of the expected value) compares. Other tests report a random
per-test token on a pipe when they run to the end; stdout is never parsed. Printing ``ALL
TESTS PASSED``, writing fake records to every descriptor, exiting early or reading the
process's own memory earns nothing on a value check. See
:mod:`~mtgrpo.rewards.verifiers._sandbox_tests`.
"""

from __future__ import annotations

import contextlib
import functools
import marshal
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtgrpo.rewards.verifiers._sandbox_tests import TestPlan, ValueCheck, prepare_tests
from mtgrpo.rewards.verifiers._sandbox_view import (
    HARNESS_DIR,
    LAUNCHER,
    WORK_DIR,
    InterpreterView,
    interpreter_view,
)

__all__ = [
    "SANDBOX_STATUSES",
    "IOCase",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "TestPlan",
    "ValueCheck",
    "ensure_sandbox",
    "prepare_tests",
    "run_python",
    "run_python_io",
]

# The launcher and the harness run as imported modules, so their bytecode (compiled once by
# the interpreter probe) is reused; argv[1] is the launcher's path.
_LAUNCH_CODE = (
    "import sys; sys.path.insert(0, sys.argv[1].rpartition('/')[0]); "
    "import _sandbox_launch; _sandbox_launch.main()"
)
_HARNESS_CODE = (
    f"import sys; sys.path.insert(0, {HARNESS_DIR!r}); import _sandbox_harness; "
    "del sys.path[0]; _sandbox_harness.main()"
)
STARTUP_SECONDS = 2.0  # wall-clock allowance for starting the sandbox, per process
SANDBOX_STATUSES = (
    "ok", "syntax_error", "error", "timeout", "output_limit", "killed", "sandbox_error"
)  # fmt: skip
_READ_CHUNK = 65536
_AUDIT_HOOK = True  # the harness's in-process layer; tests turn it off to probe the kernel's
_LAUNCH_AS: int | None = None  # tests: start the launcher as this uid (and gid), not root
_UNAVAILABLE_FIX = (
    "mtgrpo runs model-written programs only inside Linux namespaces (mount, PID, network, "
    "IPC) with no capabilities, and refuses to run them otherwise. Run the trainer as root, "
    "or allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0; "
    "kernel.unprivileged_userns_clone=1 where that setting exists; on Ubuntu 23.10 and "
    "later kernel.apparmor_restrict_unprivileged_userns=0). In a container, the default "
    "seccomp profile of Docker refuses these calls: run it with --security-opt "
    "seccomp=unconfined --cap-add SYS_ADMIN (or --privileged). The program was not run"
)


class SandboxUnavailableError(RuntimeError):
    """The kernel refused to build the sandbox, so no untrusted code was run."""


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
        output_bytes: most bytes of stdout+stderr read from a process; more kills it. Also
            the most bytes of reported values read.
        file_bytes: ``RLIMIT_FSIZE``: the largest file the program may write.
        max_files: how many files the program may open for writing (and directories it may
            create), in total.
        max_open_files: ``RLIMIT_NOFILE``.
        extra_paths: existing directories added, read-only, to the sandbox's file system
            and the child's import path (for example a site-packages directory, to allow
            numpy); none by default. A package there may read the process's memory, so
            with any extra path only value checks and I/O cases are accepted as tests.
    """

    timeout_seconds: float = 10.0
    test_timeout_seconds: float = 2.0
    cpu_seconds: int = 10
    memory_bytes: int = 1 << 30
    output_bytes: int = 1 << 20
    file_bytes: int = 1 << 20
    max_files: int = 64
    max_open_files: int = 64
    extra_paths: tuple[str, ...] = field(default=())

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
        if isinstance(self.extra_paths, (str, bytes)):
            raise TypeError(
                f"SandboxLimits.extra_paths must be a sequence of directories, got the string "
                f"{self.extra_paths!r}; write extra_paths=({self.extra_paths!r},)"
            )
        paths = tuple(str(Path(path).resolve()) for path in self.extra_paths)
        missing = [path for path in paths if not Path(path).is_dir()]
        if missing:
            raise ValueError(f"SandboxLimits.extra_paths: {missing} are not directories")
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
            (ended by another signal), ``"sandbox_error"`` (the sandbox itself failed). In
            ``io`` mode: the first case's status that is not ``"ok"``.
        passed: per test (or case), whether it passed.  # [T]
        stdout: the program's stdout (at most ``output_bytes``, decoded leniently); in
            ``io`` mode, of the first failing case, else of the last.
        stderr: the same for stderr.
        returncode: the (last examined) program process's exit status; negative for a
            signal; ``None`` when it was killed at the deadline.
        wall_seconds: wall-clock time of the whole run, start-up included.
        network_isolated: the program ran in an empty network namespace.
        privileges_dropped: the program ran as uid 65534 with no capabilities.
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
    """Raw outcome of one sandboxed run (parent-side bookkeeping)."""

    stdout: bytes = b""
    stderr: bytes = b""
    report: bytes = b""
    timed_out: bool = False
    output_exceeded: bool = False

    def lines(self, kind: str) -> list[str]:
        """The launcher's report lines ``<kind> <rest>``: their ``<rest>``."""
        prefix = kind + " "
        return [line[len(prefix):] for line in self.report.decode("utf-8", "replace").split("\n")
                if line.startswith(prefix) or line == kind]  # fmt: skip

    @property
    def started(self) -> bool:
        return bool(self.lines("sandbox"))

    @property
    def returncode(self) -> int | None:
        codes = self.lines("exit")
        return int(codes[-1]) if codes else None


def run_python(
    code: str, tests: str | Sequence[str] = (), limits: SandboxLimits | None = None
) -> SandboxResult:
    """Run ``code`` then ``tests`` (see :func:`prepare_tests`) in the sandbox.

    The program's top level runs in a namespace named ``__solution__`` (so its
    ``if __name__ == "__main__":`` block does not run); its stdin is empty. Raises
    :class:`SandboxUnavailableError` where the kernel cannot build the sandbox.

    >>> result = run_python("def add(a, b):\\n    return a + b", ["assert add(1, 2) == 3"])
    >>> result.status, result.passed
    ('ok', (True,))
    """
    limits = limits or SandboxLimits()
    plan = prepare_tests(tests, values_only=bool(limits.extra_paths))
    if not isinstance(code, str):
        return SandboxResult("syntax_error", (False,) * plan.test_count)
    started = time.monotonic()
    job = _job("tests", code, plan, limits)
    raw = _spawn(job, b"", limits, started + limits.timeout_seconds)
    passed_units = {int(unit) for unit in raw.lines("pass")}
    return _result(
        raw,
        _status(raw, tests_mode=True),
        tuple(unit in passed_units for unit in plan.test_units()),
        started,
    )


def run_python_io(
    code: str,
    cases: Sequence[IOCase | Mapping[str, Any]],
    limits: SandboxLimits | None = None,
) -> SandboxResult:
    """Run ``code`` once per case with the case input on stdin; compare stdout here.

    Cases are :class:`IOCase` or mappings with ``input`` and ``output`` (strings). Each case
    is a fresh process with ``test_timeout_seconds`` (plus start-up) of wall clock; cases
    left when ``timeout_seconds`` is spent fail without running. Raises
    :class:`SandboxUnavailableError` where the kernel cannot build the sandbox.

    >>> run_python_io("print(int(input()) * 2)", [IOCase("21\\n", "42\\n")]).passed
    (True,)
    """
    limits = limits or SandboxLimits()
    checked = [_io_case(case, index) for index, case in enumerate(cases)]
    started = time.monotonic()
    deadline = started + limits.timeout_seconds
    passed: list[bool] = []
    first_failure: tuple[str, _Process] | None = None
    raw, status = _Process(), "ok"
    for case in checked:
        case_deadline = min(deadline, time.monotonic() + limits.test_timeout_seconds)
        if time.monotonic() >= deadline or not isinstance(code, str):
            passed.append(False)
            continue
        job = _job("io", code, None, limits)
        raw = _spawn(job, case.input.encode(), limits, case_deadline + STARTUP_SECONDS)
        status = _status(raw, tests_mode=False)
        ok = status == "ok" and _same_output(raw.stdout, case.output)
        passed.append(ok)
        if not ok and first_failure is None:
            first_failure = (status, raw)
    if first_failure is not None:
        status, raw = first_failure
    if not isinstance(code, str):
        status = "syntax_error"
    return _result(raw, status, tuple(passed), started)


def _result(raw: _Process, status: str, passed: tuple[bool, ...], started: float) -> SandboxResult:
    return SandboxResult(
        status=status,
        passed=passed,
        stdout=raw.stdout.decode("utf-8", "replace"),
        stderr=raw.stderr.decode("utf-8", "replace"),
        returncode=raw.returncode,
        wall_seconds=time.monotonic() - started,
        network_isolated=raw.started,
        privileges_dropped=raw.started,
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


def _status(raw: _Process, *, tests_mode: bool) -> str:
    """The run's status from the launcher's report and the output bookkeeping."""
    returncode = raw.returncode
    if raw.output_exceeded:
        return "output_limit"
    if raw.timed_out or returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "timeout"
    if not raw.started or returncode is None:
        return "sandbox_error"
    if raw.lines("syntax"):
        return "syntax_error"
    if returncode < 0:
        return "killed"
    if tests_mode:
        return "ok" if raw.lines("program") else "error"
    return "ok" if returncode == 0 else "error"


def ensure_sandbox(limits: SandboxLimits | None = None) -> None:
    """Check once per process that the sandbox can be built here, raising
    :class:`SandboxUnavailableError` (with the fix) where it cannot; and that the
    ``extra_paths`` of ``limits`` can be added to it (``ValueError`` naming them)."""
    _sandbox_check()
    if limits is not None and limits.extra_paths:
        _view().plan(limits.extra_paths, 1, 1)


@functools.lru_cache(maxsize=1)
def _sandbox_check() -> None:
    result = run_python("x = 1", ["assert x == 1"], SandboxLimits(timeout_seconds=30.0))
    if result.passed != (True,):
        raise SandboxUnavailableError(
            f"the code sandbox started but a trivial program failed in it (status "
            f"{result.status!r}, stderr {result.stderr[-300:]!r}); the program was not trusted"
        )


def _job(mode: str, code: str, plan: TestPlan | None, limits: SandboxLimits) -> dict[str, Any]:
    """The launcher's job, without the per-run paths (added by :func:`_spawn`)."""
    view = _view()
    units = list(plan.units) if plan is not None else []
    checks = [(c.unit, c.op, c.expected, c.literal_left, c.negate)
              for c in (plan.checks if plan is not None else ())]  # fmt: skip
    return {
        "mode": mode,
        "user_namespace": os.geteuid() != 0 or _LAUNCH_AS is not None,
        "interpreter": view.interpreter,
        "harness": _HARNESS_CODE,
        "environment": _child_environment(),
        "limits": {
            "memory_bytes": limits.memory_bytes,
            "cpu_seconds": limits.cpu_seconds,
            "file_bytes": limits.file_bytes,
            "max_open_files": limits.max_open_files,
        },
        "checks": checks,
        "result_bytes": limits.output_bytes + 64 * 1024,
        "harness_job": {
            "mode": mode,
            "code": code,
            "units": units,
            "test_seconds": float(limits.test_timeout_seconds),
            "max_files": limits.max_files,
            "read_paths": [*view.stdlib_paths, *limits.extra_paths],
            "extra_paths": list(limits.extra_paths),
            "workdir": WORK_DIR,
            "value_bytes": limits.output_bytes,
            "audit_hook": _AUDIT_HOOK,
        },
    }


def _interpreter() -> str:
    """The interpreter of the launcher and the sandboxed process (``-I -S``: its standard
    library only, whatever environment ``sys.executable`` belongs to)."""
    return os.environ.get("MTGRPO_SANDBOX_PYTHON") or sys.executable


def _view() -> InterpreterView:
    try:
        return interpreter_view(_interpreter())
    except (OSError, ValueError) as error:
        raise SandboxUnavailableError(f"{error}. {_UNAVAILABLE_FIX}") from None


def _child_environment() -> dict[str, str]:
    """The program's whole environment: nothing inherited, so no secret can leak through it.
    One thread for numeric libraries: the sandbox allows no new threads."""
    return {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": WORK_DIR,
        "TMPDIR": WORK_DIR,
        "LD_LIBRARY_PATH": "/sandbox/lib",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _spawn(
    job: dict[str, Any], stdin_tail: bytes, limits: SandboxLimits, deadline: float
) -> _Process:
    """Start the launcher on ``job``, feed it, collect its output until exit or ``deadline``.

    Raises :class:`SandboxUnavailableError` when the launcher reports that the kernel
    refused to build the sandbox.
    """
    workdir = tempfile.mkdtemp(prefix="mtgrpo-sandbox-")
    report_read, report_write = os.pipe()
    raw = _Process()
    try:
        root = os.path.join(workdir, "root")  # a mount point, seen empty from here
        os.mkdir(root)
        if _LAUNCH_AS is not None:
            for path in (workdir, root):
                os.chown(path, _LAUNCH_AS, _LAUNCH_AS)
        page = 4096
        work_bytes = limits.max_files * -(-limits.file_bytes // page) * page + (1 << 20)
        mounts = _view().plan(tuple(limits.extra_paths), work_bytes, limits.max_files + 16)
        job = {**job, "report_fd": report_write, "root": root, "mounts": mounts}
        payload = marshal.dumps(job)
        process = subprocess.Popen(
            [_interpreter(), "-I", "-S", "-B", "-c", _LAUNCH_CODE, str(LAUNCHER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(report_write,),
            cwd=workdir,
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
            start_new_session=True,
            **({} if _LAUNCH_AS is None else
               {"user": _LAUNCH_AS, "group": _LAUNCH_AS, "extra_groups": []}),
        )  # fmt: skip
        os.close(report_write)
        report_write = -1
        try:
            _collect(process, len(payload).to_bytes(8, "little") + payload + stdin_tail,
                     report_read, limits, deadline, raw)  # fmt: skip
        finally:
            _kill_group(process)
            process.wait()
    except OSError as error:
        raw.stderr += f"sandbox could not start: {error}".encode()
    finally:
        for fd in (report_read, report_write):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)
    refused = raw.lines("refused")
    if refused:
        raise SandboxUnavailableError(
            f"the code sandbox cannot be built here: {refused[0]}. {_UNAVAILABLE_FIX}"
        )
    return raw


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
