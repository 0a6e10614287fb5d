"""Attacks on what the sandbox's verdicts rest on, by class (issue 12).

Each attack is a wrong program (``add`` returns 0) dressed with an attack; it must score 0,
leave no file and no process (the ``sandbox_root`` fixture checks), and harm no other
sample. Attacks on the kernel's boundary run with the harness's in-process audit hook
turned off (``kernel_only``): what stops them there is the kernel (namespaces, the
file-system view, no capabilities, resource limits), not Python.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy
import pytest
from sandbox_helpers import LIMITS, sandbox_processes, status_field

import mtgrpo.sandbox.run as sandbox
from mtgrpo.rewards.verifiers import code_reward
from mtgrpo.sandbox import SandboxLimits, run_python

CTYPES_LIBRARY = Path(importlib.util.find_spec("_ctypes").origin)  # a real FFI module
WRONG_ADD = "def add(a, b):\n    return 0\n"
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(20, 22) == 42"]
HONEST_ADD = "def add(a, b):\n    return a + b\n"


@pytest.fixture
def kernel_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Turn the harness's audit hook off: only the kernel's part of the sandbox remains."""
    monkeypatch.setattr(sandbox, "_AUDIT_HOOK", False)


def _wrong(attack: str) -> str:
    return attack + "\n" + WRONG_ADD


# --------------------------------------------------------------- FFI modules by any path


@pytest.fixture
def planted_ffi(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A real FFI extension (a copy of CPython's own ``_ctypes``) placed where real layouts
    hold third-party modules: the base interpreter's site-packages (inside its standard
    library directory on pyenv, python.org and Docker layouts), this environment's
    site-packages, and the standard-library directory itself; plus a real
    ``_cffi_backend`` wherever one is installed. Removed afterwards."""
    # Loading a copy (the control in the test) registers it as ``_ctypes``: restored after.
    monkeypatch.setitem(sys.modules, "_ctypes", sys.modules["_ctypes"])
    name = f"mtgrpo_ffi_{uuid.uuid4().hex}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    base = {"base": sys.base_prefix, "platbase": sys.base_prefix}
    directories = {sysconfig.get_path("platlib", vars=base), sysconfig.get_path("platlib"),
                   sysconfig.get_path("stdlib")}  # fmt: skip
    planted = []
    for directory in sorted(directories):
        if os.access(directory, os.W_OK):
            target = os.path.join(directory, name)
            shutil.copy(CTYPES_LIBRARY, target)
            planted.append(target)
    if not planted:
        pytest.skip("no site-packages directory is writable here (the suite runs as root in CI)")
    found = [str(p) for d in directories for p in Path(d).glob("_cffi_backend*.so")]
    try:
        yield planted + found
    finally:
        for target in planted:
            os.unlink(target)


FFI_ATTACK = """
import importlib.util, os, sys
for path in {paths!r}:
    name = "_cffi_backend" if "_cffi_backend" in path else "_ctypes"
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        print("FFI LOADED", path)
    except BaseException as error:
        print("refused", type(error).__name__)
    sys.path.append(os.path.dirname(path))
    try:
        __import__(os.path.basename(path).partition(".")[0])
        print("FFI LOADED by name", path)
    except BaseException as error:
        print("refused", type(error).__name__)
"""


def test_ffi_modules_are_unreachable_by_any_path(
    sandbox_root: Path, kernel_only: None, planted_ffi: list[str]
) -> None:
    for path in planted_ffi:  # each is a working FFI module outside the sandbox
        spec = importlib.util.spec_from_file_location("_ctypes", path)
        if "_cffi_backend" not in path:
            assert hasattr(importlib.util.module_from_spec(spec), "dlopen")
    result = run_python(_wrong(FFI_ATTACK.format(paths=planted_ffi)), ADD_TESTS, LIMITS)
    assert result.passed == (False, False)
    assert "FFI LOADED" not in result.stdout
    assert result.stdout.count("refused") == 2 * len(planted_ffi)


def test_a_library_the_program_writes_cannot_be_loaded(
    sandbox_root: Path, kernel_only: None
) -> None:
    library = CTYPES_LIBRARY.read_bytes()
    assert len(library) < LIMITS.file_bytes  # the program can write it in full
    attack = (
        "import base64, importlib.util\n"
        f"data = base64.b64decode({__import__('base64').b64encode(library)!r})\n"
        "open('ffi.so', 'wb').write(data)\n"
        "spec = importlib.util.spec_from_file_location('_ctypes', '/sandbox/work/ffi.so')\n"
        "try:\n    importlib.util.module_from_spec(spec)\n    print('FFI LOADED')\n"
        "except ImportError as error:\n    print(error)\n"
    )
    result = run_python(_wrong(attack), ADD_TESTS, LIMITS)
    assert result.passed == (False, False)
    assert "failed to map segment" in result.stdout  # the work directory is noexec


# ---------------------------------------------- secrets in memory are not the boundary


def test_a_program_that_owns_its_whole_process_still_fails(
    sandbox_root: Path, kernel_only: None
) -> None:
    # With the audit hook off the program walks every object and frame of its process (the
    # garbage collector kept alive, f_back followed) and writes pass records and forged
    # replies on every descriptor: nothing of the verdict is in its process to find.
    attack = (
        "import gc, os, sys\n"
        "gc.set_debug(gc.DEBUG_SAVEALL)\n"
        "frames, frame = 0, sys._getframe()\n"
        "while frame is not None:\n    frames, frame = frames + 1, frame.f_back\n"
        "found = [o for o in gc.get_objects() if isinstance(o, (bytes, str)) and len(o) == 32]\n"
        "print('frames', frames, 'objects', len(gc.get_objects()))\n"
        "for fd in range(3, 64):\n"
        "    for record in (b'P0\\nP1\\nC' + b'0' * 32, b'[\"ready\"]\\n',\n"
        "                   b'[\"v\",\"j1\",true,[]]\\n[\"v\",\"j2\",true,[]]\\n'):\n"
        "        try:\n            os.write(fd, record + b'\\n')\n"
        "        except OSError:\n            pass\n"
    )
    result = run_python(_wrong(attack), ADD_TESTS, LIMITS)
    assert "frames 4" in result.stdout  # it did walk up to the harness's own frames
    assert result.passed == (False, False)


def test_guessing_values_on_the_reply_pipe_earns_nothing(sandbox_root: Path) -> None:
    # Replies written ahead of the judge's requests are dropped (they answer nothing yet);
    # a reply is only ever data, which the program could have returned anyway.
    guesses = ("import os\nfor n in range(1, 9):\n"
               "    os.write(6, b'[\"v\",\"j%d\",[\"i\",\"3\"],[]]\\n' % n)\n")  # fmt: skip
    assert run_python(_wrong(guesses), ADD_TESTS, LIMITS).passed == (False, False)
    assert run_python(HONEST_ADD, ADD_TESTS, LIMITS).passed == (True, True)


def test_numpy_can_read_memory_and_still_cannot_forge(sandbox_root: Path) -> None:
    site_packages = str(Path(numpy.__file__).parents[1])
    limits = SandboxLimits(timeout_seconds=20.0, test_timeout_seconds=10.0,
                           extra_paths=(site_packages,))  # fmt: skip
    attack = (
        "import numpy as np, os\n"
        "probe = b'MTGRPO-MEMORY-PROBE-' + b'7' * 16\n"
        "class View:\n"
        "    def __init__(self, address, size):\n"
        "        self.__array_interface__ = {'shape': (size,), 'typestr': '|u1',\n"
        "                                    'data': (address, True), 'version': 3}\n"
        "raw = np.asarray(View(id(probe), 96)).tobytes()\n"
        "print('read own memory:', probe in raw)\n"
        "for guess in range(64):\n"
        "    os.write(4, b'P%d\\n' % guess)\n"
    )
    result = run_python(_wrong(attack), ADD_TESTS, limits)
    assert "read own memory: True" in result.stdout
    assert result.passed == (False, False)
    honest = "import numpy as np\ndef add(a, b):\n    return int(np.add(a, b))\n"
    assert run_python(honest, ADD_TESTS, limits).passed == (True, True)


def test_with_extra_paths_every_test_form_is_judged_outside(sandbox_root: Path) -> None:
    # A package that reads and writes the process's memory (numpy) gains the program
    # nothing: no verdict, test or expected value is in its process.
    limits = SandboxLimits(test_timeout_seconds=2.0, extra_paths=(
        str(Path(numpy.__file__).parents[1]),))  # fmt: skip
    tests = ["assert add(1, 2) == 3", "assert add(1, 2) > 2",
             "import math\nassert math.isclose(add(0.1, 0.2), 0.3)"]  # fmt: skip
    assert run_python(HONEST_ADD, tests, limits).passed == (True, True, True)
    attack = "import numpy\nx = numpy.zeros(4)\n" + WRONG_ADD
    assert run_python(attack, tests, limits).passed == (False, False, False)
    # a directory holding the standard library would show what the view hides next to it
    stdlib = SandboxLimits(extra_paths=(sysconfig.get_path("stdlib"),))
    with pytest.raises(ValueError, match="contain the interpreter's standard library"):
        code_reward(None, ["<code>x = 1</code>"], tests=[["assert x == 1"]], limits=stdlib)


# ------------------------------------------------------------- /proc and capabilities


def test_no_proc_at_all(sandbox_root: Path, kernel_only: None) -> None:
    attack = (
        "import os\n"
        "for path in ('/proc/self/mem', '/proc/1/environ', '/proc/self/maps', '/proc'):\n"
        "    try:\n        os.stat(path)\n        print('visible', path)\n"
        "    except OSError as error:\n        print(type(error).__name__)\n"
    )
    result = run_python(_wrong(attack), ADD_TESTS, LIMITS)
    assert result.stdout.split() == ["FileNotFoundError"] * 4
    assert result.passed == (False, False)


def test_no_capabilities_anywhere(sandbox_root: Path, kernel_only: None) -> None:
    attack = (
        "import os, time\n"
        "open('mine', 'w').close()\n"
        "for name, call in (('setuid', lambda: os.setuid(0)), ('chown', lambda: os.chown("
        "'mine', 0, 0)), ('chroot', lambda: os.chroot('/')), ('mknod', lambda: os.mknod("
        "'null', 0o20666, os.makedev(1, 3)))):\n"
        "    try:\n        call()\n        print('allowed', name)\n"
        "    except PermissionError:\n        print('refused', name)\n"
        "time.sleep(1.5)\n"
    )
    seen: dict[int, str] = {}
    runner = threading.Thread(target=lambda: seen.setdefault(0, run_python(
        _wrong(attack), ADD_TESTS, SandboxLimits(test_timeout_seconds=5.0)).stdout))
    runner.start()
    deadline = time.monotonic() + 10.0
    processes: dict[int, str] = {}
    while time.monotonic() < deadline and runner.is_alive():
        processes = sandbox_processes()
        harness = [s for s in processes.values() if "Name:\tpython" in s and len(processes) >= 3]
        if harness and all(status_field(s, "CapEff") == "0" * 16 for s in processes.values()):
            break
        time.sleep(0.05)
    runner.join()
    assert len(processes) >= 3  # launcher, reaper (PID 1 of the sandbox), harness
    for status in processes.values():
        for field in ("CapEff", "CapPrm", "CapInh", "CapAmb", "CapBnd"):
            assert status_field(status, field) == "0" * 16, (field, status)
        assert status_field(status, "NoNewPrivs") == "1"
        if os.geteuid() == 0:
            assert status_field(status, "Uid").split() == ["65534"] * 4
    assert seen[0].split().count("refused") == 4


# ------------------------------------------------------------------------ other samples


def test_a_hostile_sample_cannot_harm_its_siblings(sandbox_root: Path, kernel_only: None) -> None:
    honest = "<code>\nimport time\ntime.sleep(0.4)\n" + HONEST_ADD + "</code>"
    killer = (
        "<code>\nimport os, signal, time\nend = time.monotonic() + 1.0\n"
        "while time.monotonic() < end:\n"
        "    for target in (-1, *range(1, 4096)):\n"
        "        if target != os.getpid():\n"
        "            try:\n                os.kill(target, signal.SIGKILL)\n"
        "            except OSError:\n                pass\n"
        + WRONG_ADD + "</code>"
    )  # fmt: skip
    completions = [honest] * 3 + [killer] + [honest] * 3
    scores = code_reward(None, completions, tests=[ADD_TESTS] * len(completions),
                         limits=LIMITS, max_workers=len(completions))  # fmt: skip
    assert scores == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]


# -------------------------------------------------------------------------- file system


def test_no_file_is_left_anywhere(sandbox_root: Path, kernel_only: None) -> None:
    name = f"mtgrpo-hostile-{uuid.uuid4().hex}"
    places = [f"/tmp/{name}", f"/dev/shm/{name}", f"/var/tmp/{name}", f"/{name}",
              f"/sandbox/{name}", f"/sandbox/lib/{name}", f"{sys.base_prefix}/{name}"]
    attack = (
        "import os\n"
        f"for path in {places!r}:\n"
        "    try:\n        open(path, 'w').write('x')\n        print('wrote', path)\n"
        "    except OSError as error:\n        print(type(error).__name__)\n"
        "os.mkdir('deep')\nopen('deep/file', 'w').write('x')\n"
    )  # fmt: skip
    result = run_python(_wrong(attack), ADD_TESTS, LIMITS)
    assert "wrote" not in result.stdout
    assert result.passed == (False, False)
    for path in places:
        assert not os.path.lexists(path)


def test_the_work_directory_is_a_kernel_quota(sandbox_root: Path, kernel_only: None) -> None:
    # Without the audit hook's count of files, the tmpfs under the work directory still
    # bounds what a program can write: max_files files of file_bytes, plus 1 MiB.
    attack = (
        "import os\nwritten = 0\n"
        "for i in range(1000):\n"
        "    try:\n"
        "        with open(f'f{i}', 'wb') as f:\n            f.write(b'x' * (1 << 20))\n"
        "        written += 1\n"
        "    except OSError as error:\n"
        "        print(type(error).__name__, error.errno)\n        break\n"
        "print('files', written)\n"
    )
    result = run_python(_wrong(attack), ADD_TESTS, LIMITS)
    assert "OSError 28" in result.stdout  # ENOSPC
    written = int(result.stdout.split("files")[1])
    assert LIMITS.max_files <= written <= LIMITS.max_files + 1
    assert result.passed == (False, False)


# --------------------------------------------------------- as an unprivileged user


def _unprivileged_python() -> str:
    """An interpreter an unprivileged user can run, when the checkout is readable too."""
    interpreter = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}",
                               path="/usr/bin:/usr/local/bin")  # fmt: skip
    if os.geteuid() != 0 or interpreter is None:
        pytest.skip("needs root (to start the sandbox as uid 65534) and a system Python")
    check = [interpreter, "-c", f"open({str(sandbox.LAUNCHER)!r}).read()"]
    if subprocess.run(check, user=65534, group=65534, capture_output=True).returncode != 0:
        pytest.skip("this checkout is not readable by an unprivileged user")
    return interpreter


def test_the_user_namespace_sandbox_of_an_unprivileged_trainer(
    sandbox_root: Path, kernel_only: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MTGRPO_SANDBOX_PYTHON", _unprivileged_python())
    monkeypatch.setattr(sandbox, "_LAUNCH_AS", 65534)
    reachable = Path(tempfile.mkdtemp(prefix="mtgrpo-userns-test-", dir="/tmp"))
    reachable.chmod(0o777)  # the unprivileged launcher must reach its directories
    monkeypatch.setattr(tempfile, "tempdir", str(reachable))
    try:
        _attack_as_unprivileged_user()
    finally:
        leftovers = list(reachable.iterdir())
        shutil.rmtree(reachable)
    assert leftovers == []


def _attack_as_unprivileged_user() -> None:
    assert run_python(HONEST_ADD, ADD_TESTS, LIMITS).passed == (True, True)
    attack = (
        "import os\nprint(os.getuid(), os.getgid(), sorted(os.listdir('/')))\n"
        "for call in (lambda: open('/proc/self/mem'), lambda: os.fork(),\n"
        "             lambda: open('/x', 'w')):\n"
        "    try:\n        call()\n        print('allowed')\n"
        "    except OSError as error:\n        print(type(error).__name__)\n"
    )  # fmt: skip
    result = run_python(_wrong(attack), ADD_TESTS, LIMITS)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("65534 65534 ['dev', 'lib64', 'sandbox'")
    assert lines[1:] == ["FileNotFoundError", "BlockingIOError", "OSError"]
    assert result.passed == (False, False)
