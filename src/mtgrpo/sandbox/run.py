"""Run untrusted Python (model completions) against tests in a kernel-enforced sandbox.

Two entry points:

* :func:`run_python` (tests): the program runs in one sandbox; the tests run in a second
  one, the *judge*, which the program cannot reach; the judge asks the program's process
  for the program's names, calls and attribute reads, and gets plain data back. Every
  verdict is decided in the judge, on that data (:mod:`~mtgrpo.sandbox.plan` says which
  test forms are accepted: all the usual ones).
* :func:`run_python_io` (``io`` mode): one process per input/output case; the program reads
  the case input on stdin and passes when it exits normally and its stdout matches the
  expected output (trailing whitespace of each line and trailing blank lines ignored). The
  comparison happens here, in the parent, so nothing the program does can fake a pass.

Isolation is the kernel's (``_launch.py`` builds it, ``docs/sandbox.md`` has the threat
model): new mount, PID, network, IPC and UTS namespaces per process (inside a user
namespace when the trainer is not root); a read-only root holding only the interpreter, its
standard library (no site-packages of any interpreter, no FFI module) and the caller's
``extra_paths`` (``_view.py``); no ``/proc``; a private writable work directory that cannot
hold executable code and vanishes with the namespace; uid 65534 with no capability at all
and ``no_new_privs``; resource limits (address space, CPU, file size, open files, no new
processes); per-call timers and a wall-clock deadline after which every process is killed.
Every sandbox process dies when the thread of the trainer that started it dies
(``PR_SET_PDEATHSIG`` on the launcher, then the reaper, then the PID namespace), whatever
signals the program blocks. Nothing is written to the host's disk. Where the kernel
refuses any of this, :class:`SandboxUnavailableError` is raised and the program is not run.
"""

from __future__ import annotations

import contextlib
import functools
import marshal
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtgrpo.sandbox._view import (
    HARNESS_DIR,
    LAUNCHER,
    WORK_DIR,
    InterpreterView,
    interpreter_view,
)
from mtgrpo.sandbox.plan import TestPlan, prepare_tests

__all__ = [
    "SANDBOX_STATUSES",
    "IOCase",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "TestPlan",
    "ensure_sandbox",
    "prepare_tests",
    "run_python",
    "run_python_io",
]

# The launcher and the harnesses run as imported modules, so their bytecode (compiled once
# by the interpreter probe) is reused; argv[1] is the launcher's path.
_LAUNCH_CODE = (
    "import sys; sys.path.insert(0, sys.argv[1].rpartition('/')[0]); "
    "import _launch; _launch.main()"
)
_HARNESS_CODE = {
    module: f"import sys; sys.path.insert(0, {HARNESS_DIR!r}); import {module}; "
    f"del sys.path[0]; {module}.main()"
    for module in ("_harness", "_judge")
}
STARTUP_SECONDS = 2.0  # wall-clock allowance for starting the sandbox, per process
SETTLE_SECONDS = 0.5  # once the judge is done: how long the program's process may take to end
SANDBOX_STATUSES = (
    "ok", "syntax_error", "error", "timeout", "output_limit", "killed", "sandbox_error"
)  # fmt: skip
_READ_CHUNK = 65536  # one pipe buffer's worth per read or write (pipe(7): 16 pages by default)
_AUDIT_HOOK = True  # the harness's in-process layer; tests turn it off to probe the kernel's
_LAUNCH_AS: int | None = None  # tests: start the launcher as this uid (and gid), not root
# Where each sandbox mounts its empty root, in its own mount namespace: the host never sees
# anything there, so no run leaves a directory behind (one shared, empty mount point).
_MOUNT_POINT = Path(__file__).with_name("_root")
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
            numpy); none by default. A package there may read and write the program's
            memory, which gains it nothing: verdicts are decided in the judge, so every
            test form is accepted with extra paths (docs/sandbox.md, "Allowing packages").
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
    code: str,
    tests: str | Sequence[str] = (),
    limits: SandboxLimits | None = None,
    *,
    entry_point: str | None = None,
) -> SandboxResult:
    """Run ``code``, then ``tests`` (see :func:`prepare_tests`) in the judge.

    The program's top level runs in a namespace named ``__solution__`` (so its
    ``if __name__ == "__main__":`` block does not run); its stdin is empty. The tests run in
    another sandboxed process that reaches the program's names through plain data only
    (``docs/sandbox.md``). ``entry_point`` completes HumanEval-style test files (see
    :func:`prepare_tests`). Raises :class:`SandboxUnavailableError` where the kernel cannot
    build the sandbox.

    >>> result = run_python("def add(a, b):\\n    return a + b", ["assert add(1, 2) == 3"])
    >>> result.status, result.passed
    ('ok', (True,))
    """
    limits = limits or SandboxLimits()
    plan = prepare_tests(tests, entry_point=entry_point)
    # a non-string completion is scored like one that does not compile
    if not isinstance(code, str):
        return SandboxResult("syntax_error", (False,) * plan.test_count)
    started = time.monotonic()
    requests, replies = os.pipe(), os.pipe()  # judge -> program, program -> judge
    # two sandboxes sharing only these pipes: test_a_program_that_owns_its_whole_process_still_fails
    program = _job("serve", limits, {"code": code}, peers=(requests[0], replies[1]))
    judge = _job("judge", limits, {
        "units": [(kind, source, list(names)) for (kind, source), names
                  in zip(plan.units, plan.names, strict=True)],
        "binds": [list(names) for names in plan.binds],
        "ready_seconds": float(limits.test_timeout_seconds) + STARTUP_SECONDS,
    }, peers=(replies[0], requests[1]))  # fmt: skip
    raw, verdicts = _spawn([program, judge], limits, started + limits.timeout_seconds,
                           judge=1)  # fmt: skip
    passed_units = {int(unit) for unit in verdicts.lines("pass")}
    if verdicts.lines("lost") and not raw.timed_out and raw.returncode is None:
        raw.timed_out = True  # the judge gave up on it: it stopped answering in time
    result = _result(
        raw,
        _status(raw, tests_mode=True),
        tuple(unit in passed_units for unit in plan.test_units()),
        started,
    )
    if verdicts.stderr:  # the judge's account of each failed test, after the program's output
        judged = verdicts.stderr.decode("utf-8", "replace")
        result = _replace_stderr(result, result.stderr + judged)
    return result


def _replace_stderr(result: SandboxResult, stderr: str) -> SandboxResult:
    from dataclasses import replace

    return replace(result, stderr=stderr)


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
        job = _job("io", limits, {"code": code})
        (raw,) = _spawn([job], limits, case_deadline + STARTUP_SECONDS, stdin=case.input.encode())
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
    # SIGXCPU at the soft RLIMIT_CPU, SIGKILL at the hard one (soft + 1)
    if raw.timed_out or returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "timeout"
    if not raw.started or returncode is None:
        return "sandbox_error"
    if raw.lines("syntax"):
        return "syntax_error"
    if returncode < 0:
        return "killed"
    if tests_mode:
        return "ok" if raw.lines("program") else "error"  # the program's top level ran to its end
    return "ok" if returncode == 0 else "error"


def ensure_sandbox(limits: SandboxLimits | None = None) -> None:
    """Check once per process that the sandbox can be built here, raising
    :class:`SandboxUnavailableError` (with the fix) where it cannot; and that the
    ``extra_paths`` of ``limits`` can be added to it (``ValueError`` naming them)."""
    _sandbox_check()
    if limits is not None and limits.extra_paths:
        _view().plan(limits.extra_paths, 1, 1)


# one trivial run per process: the kernel's answer does not change
@functools.lru_cache(maxsize=1)
def _sandbox_check() -> None:
    # the first run of a process also pays for the interpreter probe (_view) inside its wall
    # clock: run_python starts the clock before _job probes
    result = run_python("x = 1", ["assert x == 1"], SandboxLimits(timeout_seconds=30.0))
    if result.passed != (True,):
        raise SandboxUnavailableError(
            f"the code sandbox started but a trivial program failed in it (status "
            f"{result.status!r}, stderr {result.stderr[-300:]!r}); the program was not trusted"
        )




def _job(mode: str, limits: SandboxLimits, task: dict[str, Any],
         peers: tuple[int, int] | tuple[()] = ()) -> dict[str, Any]:  # fmt: skip
    """One launcher's job, without the per-run mount plan (added by :func:`_spawn`).
    ``mode``: ``serve`` (the program, answering the judge), ``judge`` or ``io``; ``peers``:
    the two descriptors that become 5 and 6 in the harness (the other harness's pipes)."""
    view = _view()
    return {
        "mode": mode,
        # unprivileged trainers: test_the_user_namespace_sandbox_of_an_unprivileged_trainer
        "user_namespace": os.geteuid() != 0 or _LAUNCH_AS is not None,
        # the launcher compares getppid() with it right after PR_SET_PDEATHSIG (_die_with_parent)
        "parent_pid": os.getpid(),
        "interpreter": view.interpreter,
        "harness": _HARNESS_CODE["_judge" if mode == "judge" else "_harness"],
        "environment": _child_environment(),  # test_the_environment_is_not_inherited
        "limits": {
            "memory_bytes": limits.memory_bytes,
            "cpu_seconds": limits.cpu_seconds,
            "file_bytes": limits.file_bytes,
            "max_open_files": limits.max_open_files,
        },
        "peer_fds": list(peers),
        "harness_job": {
            "mode": mode,
            "code": "",
            **task,
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
        "LD_LIBRARY_PATH": "/sandbox/lib",  # _view binds the interpreter's shared libraries there
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }




def _mount_point() -> str:
    """The directory each sandbox mounts its root on (in its own mount namespace)."""
    try:
        _MOUNT_POINT.mkdir(exist_ok=True)
        return str(_MOUNT_POINT)
    except OSError:  # a read-only installation: one per-user directory, made once
        fallback = Path(tempfile.gettempdir()) / f"mtgrpo-sandbox-root-{os.geteuid()}"
        fallback.mkdir(mode=0o755, exist_ok=True)
        return str(fallback)


@dataclass
class _Launch:
    """A started launcher: its process, the trainer's end of its report pipe, its stdin."""

    process: subprocess.Popen[bytes]
    report_fd: int
    stdin: bytes
    raw: _Process = field(default_factory=_Process)
    offset: int = 0
    open_fds: set[int] = field(default_factory=set)


def _spawn(
    jobs: list[dict[str, Any]],
    limits: SandboxLimits,
    deadline: float,
    *,
    stdin: bytes = b"",
    judge: int | None = None,
) -> tuple[_Process, ...]:
    """Start one launcher per job, collect their output until they exit or ``deadline``.

    The first job's process gets ``stdin`` after its job. When ``judge`` names a job, the
    run ends once that launcher is done (the others get :data:`SETTLE_SECONDS` to end, then
    they are killed and marked timed out). Every process group is killed and reaped before
    this returns; the descriptors in the jobs' ``peer_fds`` are closed here. Raises
    :class:`SandboxUnavailableError` when a launcher reports that the kernel refused to
    build the sandbox.
    """
    launches: list[_Launch] = []
    try:
        root = _mount_point()
        page = 4096
        # max_files files of file_bytes, each rounded up to whole pages, plus 1 MiB:
        # test_the_work_directory_is_a_kernel_quota
        work_bytes = limits.max_files * -(-limits.file_bytes // page) * page + (1 << 20)
        mounts = _view().plan(tuple(limits.extra_paths), work_bytes, limits.max_files + 16)
        for index, job in enumerate(jobs):
            launches.append(_start(job, root, mounts, stdin if index == 0 else b""))
    except OSError as error:
        # one result per job, whichever launch failed: the jobs not started have none to give
        while len(launches) < len(jobs):
            launches.append(_Launch(None, -1, b""))  # type: ignore[arg-type]
        launches[0].raw.stderr += f"sandbox could not start: {error}".encode()
    finally:
        for job in jobs:
            for fd in job["peer_fds"]:
                with contextlib.suppress(OSError):
                    os.close(fd)
    try:
        running = [launch for launch in launches if launch.process is not None]
        judged = launches[judge] if judge is not None else None
        _collect(running, limits, deadline,
                 judge=judged if judged is not None and judged.process is not None else None)
    finally:
        for launch in launches:
            if launch.process is not None:
                _kill_group(launch.process)
                launch.process.wait()
            if launch.report_fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(launch.report_fd)
    for launch in launches:
        refused = launch.raw.lines("refused")
        if refused:
            raise SandboxUnavailableError(
                f"the code sandbox cannot be built here: {refused[0]}. {_UNAVAILABLE_FIX}"
            )
    return tuple(launch.raw for launch in launches)


def _start(job: dict[str, Any], root: str, mounts: list, stdin_tail: bytes) -> _Launch:
    report_read, report_write = os.pipe()
    try:
        job = {**job, "report_fd": report_write, "root": root, "mounts": mounts}
        payload = marshal.dumps(job)
        process = subprocess.Popen(
            # Python's command line: -I ignores PYTHON* variables and the user site, -S skips
            # the site module (no site-packages), -B writes no .pyc files
            [_interpreter(), "-I", "-S", "-B", "-c", _LAUNCH_CODE, str(LAUNCHER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # Python's descriptors are non-inheritable (PEP 446) and pass_fds implies
            # close_fds: the launcher gets exactly these besides its three pipes
            pass_fds=(report_write, *job["peer_fds"]),
            cwd="/",  # no working directory of the trainer's is held open by the launcher
            # the trainer's environment (and any secret in it) stays behind
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
            # its own process group: _kill_group ends everything the launcher started
            # (setsid(2) in the child: a new session whose process group id is its pid)
            start_new_session=True,
            **({} if _LAUNCH_AS is None else
               {"user": _LAUNCH_AS, "group": _LAUNCH_AS, "extra_groups": []}),
        )  # fmt: skip
    except BaseException:
        os.close(report_read)
        raise
    finally:
        # only the launcher's side holds the write end now: EOF on report_read means every
        # process that inherited it is gone (pipe(7))
        os.close(report_write)
    stdin = len(payload).to_bytes(8, "little") + payload + stdin_tail
    return _Launch(process, report_read, stdin)


def _collect(launches: list[_Launch], limits: SandboxLimits, deadline: float, *,
             judge: _Launch | None) -> None:  # fmt: skip
    """Feed stdin and read stdout, stderr and the report pipes until EOF on all or a limit."""
    poller = select.poll()
    readers: dict[int, tuple[_Launch, str]] = {}
    writers: dict[int, _Launch] = {}
    for launch in launches:
        process = launch.process
        assert process.stdin is not None
        assert process.stdout is not None
        assert process.stderr is not None
        for fd, name in ((process.stdout.fileno(), "stdout"), (process.stderr.fileno(),
                         "stderr"), (launch.report_fd, "report")):  # fmt: skip
            readers[fd] = (launch, name)
            launch.open_fds.add(fd)
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        stdin_fd = process.stdin.fileno()
        # a full pipe makes the write fail with EAGAIN (BlockingIOError in _feed) rather than
        # stall this loop (pipe(7), O_NONBLOCK)
        os.set_blocking(stdin_fd, False)
        writers[stdin_fd] = launch
        poller.register(stdin_fd, select.POLLOUT | select.POLLERR)
    # reported values are bounded by output_bytes; the rest are short records
    # (RESULT_LINE_LIMIT in _launch)
    report_cap = limits.output_bytes + 64 * 1024
    settle_by: float | None = None
    while readers:
        now = time.monotonic()
        if judge is not None and settle_by is None and not judge.open_fds:
            settle_by = now + SETTLE_SECONDS  # verdicts are in: the rest may end by itself
        stop = deadline if settle_by is None else min(deadline, settle_by)
        # the wall clock: test_a_loop_that_swallows_the_timer_is_killed_at_the_deadline
        if now >= stop:
            for launch in launches:
                if launch.open_fds:
                    launch.raw.timed_out = True
            return
        for fd, _ in poller.poll((stop - now) * 1000):  # poll(2) takes milliseconds
            if fd in writers:
                launch = writers[fd]
                if _feed(launch, poller):
                    del writers[fd]
                continue
            launch, name = readers[fd]
            chunk = _read(fd)
            if not chunk:
                poller.unregister(fd)
                del readers[fd]
                launch.open_fds.discard(fd)
                continue
            raw = launch.raw
            if name == "report":
                # Drained past the cap rather than closed: closing here and again in
                # ``_spawn`` could close another thread's descriptor that reused the number.
                if len(raw.report) <= report_cap:
                    raw.report += chunk
                continue
            if launch is judge:  # the judge's own diagnostics: kept short, never a verdict
                if len(raw.stdout) + len(raw.stderr) <= limits.output_bytes:
                    setattr(raw, name, getattr(raw, name) + chunk)
                continue
            setattr(raw, name, getattr(raw, name) + chunk)
            # test_printing_a_gigabyte_is_cut_off: the group is killed in _spawn
            if len(raw.stdout) + len(raw.stderr) > limits.output_bytes:
                raw.output_exceeded = True
                return


def _feed(launch: _Launch, poller: select.poll) -> bool:
    """Write the next piece of stdin; close it (and stop polling it) when done or refused;
    whether it is done."""
    stdin = launch.process.stdin
    assert stdin is not None
    try:
        launch.offset += os.write(stdin.fileno(), launch.stdin[launch.offset :
                                                               launch.offset + _READ_CHUNK])
    except BlockingIOError:
        return False
    # the child closed its end (exited, or ignores stdin): nothing to feed. EPIPE arrives as
    # BrokenPipeError because Python ignores SIGPIPE (signal module docs)
    except OSError:
        launch.offset = len(launch.stdin)
    if launch.offset < len(launch.stdin):
        return False
    poller.unregister(stdin.fileno())
    with contextlib.suppress(OSError):
        stdin.close()
    return True


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, _READ_CHUNK)
    except OSError:
        return b""


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group (the child leads it: ``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        # the reaper and harness die through PR_SET_PDEATHSIG even if they left the group
        os.killpg(process.pid, signal.SIGKILL)
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
