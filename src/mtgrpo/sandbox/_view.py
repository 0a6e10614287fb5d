"""What a sandboxed program can see: the mount plan of its file-system view.

The sandbox's root directory is an empty, read-only tmpfs (``_launch.py`` builds it
in a private mount namespace and ``pivot_root``s into it). It holds only:

* the interpreter's executable (at its real path) and its dynamic loader (at the path its
  ELF header names);
* the shared libraries that the interpreter and the allowed standard-library extension
  modules load, in ``/sandbox/lib`` (the child's ``LD_LIBRARY_PATH``), found once per
  interpreter by a probe that imports those modules and reads ``/proc/self/maps``;
* the standard-library directories of ``python -I -S``, read-only, with every entry that is
  not a standard-library module hidden (``site-packages``, ``dist-packages``, and anything
  else installed next to the standard library), and every extension module in
  ``lib-dynload`` that is not allowed hidden: ``ctypes``, the test modules, sockets,
  subprocesses (:data:`~._harness.BLOCKED_MODULES`);
* the harness, the judge and their wire format (``/sandbox/harness/``: source and
  compiled bytecode) and ``/dev/null``,
  ``/dev/zero``, ``/dev/urandom``, ``/dev/random``;
* the caller's ``extra_paths``, read-only, with (only then) the C and C++ runtime libraries
  that manylinux wheels may link against (``libstdc++``, ``libgcc_s``, ...: the
  :data:`RUNTIME_LIBRARIES` found next to the interpreter's ``libc``), and
  ``/sandbox/work``, the private working directory: a tmpfs of bounded size and file count
  (writable, no exec, so a program cannot load a library it wrote), gone with the sandbox.

There is no ``/proc``, ``/sys``, ``/tmp``, ``/var``, ``/etc`` or ``/home``, and no file of
any other interpreter. Hiding is a whitelist applied to the directory listing, so whatever
is installed next to the standard library (a ``_cffi_backend``, a whole site-packages) is
not reachable by any path.
"""

from __future__ import annotations

import functools
import json
import os
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mtgrpo.sandbox._harness import BLOCKED_MODULES

__all__ = [
    "HARNESS",
    "HARNESS_DIR",
    "LAUNCHER",
    "LIBRARY_DIR",
    "WORK_DIR",
    "InterpreterView",
    "interpreter_view",
]

HARNESS = Path(__file__).with_name("_harness.py")
JUDGE = Path(__file__).with_name("_judge.py")
WIRE = Path(__file__).with_name("_wire.py")
HARNESS_FILES = (HARNESS, JUDGE, WIRE)  # bound into HARNESS_DIR, each with its bytecode
LAUNCHER = Path(__file__).with_name("_launch.py")
HARNESS_DIR = "/sandbox/harness"  # inside the sandbox: the harness and its cached bytecode
LIBRARY_DIR = "/sandbox/lib"
OWN_ROOT = "/sandbox"  # the harness, the libraries and the work directory live here
WORK_DIR = "/sandbox/work"
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
PROBE_SECONDS = 60.0
# The manylinux policy's system libraries (PEP 599/600) other than libc, libm and the
# graphics ones: what compiled packages in extra_paths may link against.
RUNTIME_LIBRARIES = ("libstdc++.so.6", "libgcc_s.so.1", "libdl.so.2", "librt.so.1",
                     "libpthread.so.0", "libutil.so.1", "libresolv.so.2")  # fmt: skip
PT_INTERP = 3  # ELF program header type of the dynamic loader's path (elf(5))

Mount = tuple
"""``("bind", source, target, writable, executable)``, ``("only", directory, names,
prefixes)`` (hide the entries of a bound directory whose name is not listed), ``("link",
points_to, path)`` or ``("tmpfs", target, bytes, inodes)`` (the writable work directory);
targets are paths inside the sandbox."""

# Runs in the interpreter being described (``-I -S``, trusted code only): imports every
# allowed extension module of lib-dynload and reports what the process has mapped (the last
# field of each /proc/self/maps line is the file a mapping comes from, proc(5)).
_PROBE = r"""
import importlib, json, os, sys
blocked = set(json.loads(sys.argv[1]))
paths = [path for path in sys.path if path and os.path.exists(path)]
dynload = [p for p in paths if os.path.isdir(p) and os.path.basename(p) == "lib-dynload"]
names = sorted({entry.partition(".")[0] for d in dynload for entry in os.listdir(d)})
allowed = [n for n in names if n in sys.stdlib_module_names and n not in blocked]
for name in allowed:
    try:
        importlib.import_module(name)
    except Exception:
        pass
with open("/proc/self/maps") as maps:
    mapped = sorted({line.split(None, 5)[5].strip() for line in maps
                     if len(line.split(None, 5)) == 6 and line.split(None, 5)[5][0] == "/"})
import importlib.util, py_compile
bytecode = {}
for source in sys.argv[2:]:  # compiled once here, so no sandboxed run compiles them again
    py_compile.compile(source, doraise=False)
    cached = importlib.util.cache_from_source(source)
    bytecode[source] = cached if os.path.exists(cached) else None
print(json.dumps({"executable": os.path.realpath(sys.executable), "paths": paths,
                  "stdlib": sorted(sys.stdlib_module_names), "allowed": allowed,
                  "mapped": mapped, "bytecode": bytecode}))
"""


@dataclass(frozen=True)
class InterpreterView:
    """The parts of the view that depend only on the interpreter (computed once).

    Attributes:
        interpreter: real path of the executable the harness runs with.
        stdlib_paths: the directories (and zip) on ``sys.path`` of ``python -I -S``: what
            the audit hook lets the program read, besides the work directory and
            ``extra_paths``.
        mounts: the plan entries for the interpreter, its libraries and standard library.
        runtime_mounts: the plan entries of :data:`RUNTIME_LIBRARIES`, added when there
            are extra paths.
    """

    interpreter: str
    stdlib_paths: tuple[str, ...]
    mounts: tuple[Mount, ...]
    runtime_mounts: tuple[Mount, ...]

    def plan(self, extra_paths: tuple[str, ...], work_bytes: int, work_files: int) -> list[Mount]:
        """The whole mount plan of one run: this view, ``extra_paths``, and the work
        directory: a tmpfs of ``work_bytes`` and ``work_files`` inodes (the kernel's quota
        of what the program may write; it vanishes with the sandbox)."""
        clashes = [path for path in extra_paths if _inside(path, OWN_ROOT)]
        if clashes:
            raise ValueError(f"extra_paths {clashes} lie under {OWN_ROOT}, where the sandbox "
                             "keeps its own files; move them or bind them elsewhere")
        # a parent of the standard library would bypass the whitelist of _listed_entries
        covering = [path for path in extra_paths
                    if any(_inside(stdlib, path) for stdlib in self.stdlib_paths)]  # fmt: skip
        if covering:
            raise ValueError(
                f"extra_paths {covering} contain the interpreter's standard library, so they "
                "would show what the sandbox hides next to it (site-packages and the blocked "
                "extension modules); name the directory that holds the package itself (its "
                "site-packages directory, for example)"
            )
        # read-only, executable: compiled packages (numpy) load from there
        extra = [("bind", path, path, False, True) for path in extra_paths]
        runtime = self.runtime_mounts if extra_paths else ()
        work = ("tmpfs", WORK_DIR, work_bytes, work_files)
        return [*self.mounts, *runtime, *extra, work]


@functools.lru_cache(maxsize=8)
def interpreter_view(executable: str) -> InterpreterView:
    """Probe ``executable`` (once per process) and derive its part of the mount plan.

    Raises ``OSError`` when the probe fails (not Linux, no ``/proc``, a broken interpreter).
    """
    harness = [str(path.resolve()) for path in HARNESS_FILES]
    probe = subprocess.run(
        [executable, "-I", "-S", "-B", "-c", _PROBE, json.dumps(sorted(BLOCKED_MODULES)),
         *harness, str(LAUNCHER.resolve())],
        capture_output=True, text=True, timeout=PROBE_SECONDS, env={"LC_ALL": "C.UTF-8"},
        check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        raise OSError(f"probing the interpreter {executable} failed: {probe.stderr[-500:]}")
    facts = json.loads(probe.stdout)
    interpreter, paths = facts["executable"], tuple(facts["paths"])
    mounts: list[Mount] = [("bind", path, path, False, True) for path in _outermost(paths)]
    mounts += _listed_entries(paths, set(facts["stdlib"]), set(facts["allowed"]))
    mounts.append(("bind", interpreter, interpreter, False, True))
    loader = _elf_interpreter(interpreter)
    # execve(2) loads the interpreter named in PT_INTERP from that path inside the new root
    if loader is not None:
        mounts.append(("bind", os.path.realpath(loader), loader, False, True))
    clashes = [entry[2] for entry in mounts if entry[0] == "bind" and _inside(entry[2], OWN_ROOT)]
    if clashes:
        raise OSError(f"the interpreter's files {clashes} lie under {OWN_ROOT}, where the "
                      "sandbox keeps its own files; use an interpreter installed elsewhere")
    libraries = _libraries(facts["mapped"], paths, interpreter)
    mounts += _library_mounts(libraries)
    for source in harness:
        # the harness runs as Python source: its files need no exec
        mounts.append(("bind", source, f"{HARNESS_DIR}/{os.path.basename(source)}", False, False))
        cached = facts["bytecode"][source]
        if cached is not None:
            inside = f"{HARNESS_DIR}/__pycache__/{os.path.basename(cached)}"
            mounts.append(("bind", cached, inside, False, False))
    # writable like /dev/null must be; never executable (_bind keeps device nodes usable
    # only under /dev/)
    mounts += [("bind", device, device, True, False) for device in DEVICES]
    runtime = _libraries(_runtime_libraries(libraries), paths, interpreter)
    # already bound for the interpreter: no second bind on the same target
    runtime = {path: names for path, names in runtime.items() if path not in libraries}
    return InterpreterView(interpreter, paths, tuple(mounts), tuple(_library_mounts(runtime)))


def _library_mounts(libraries: dict[str, set[str]]) -> list[Mount]:
    """Each library bound once into the library directory, its other names as links."""
    mounts: list[Mount] = []
    for library, names in libraries.items():
        name = os.path.basename(library)
        mounts.append(("bind", library, f"{LIBRARY_DIR}/{name}", False, True))
        mounts += [("link", name, f"{LIBRARY_DIR}/{alias}") for alias in sorted(names - {name})]
    return mounts


def _runtime_libraries(libraries: dict[str, set[str]]) -> list[str]:
    """The :data:`RUNTIME_LIBRARIES` present in the directories of the interpreter's libc."""
    directories = {os.path.dirname(path) for path, names in libraries.items()
                   if "libc.so.6" in names}  # fmt: skip
    found = [os.path.join(directory, name) for directory in sorted(directories)
             for name in RUNTIME_LIBRARIES]  # fmt: skip
    return [path for path in found if os.path.exists(path)]


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _outermost(paths: tuple[str, ...]) -> list[str]:
    """Paths not inside another one of ``paths`` (lib-dynload usually lies in the stdlib)."""
    return [p for p in paths if not any(p != q and _inside(p, q) for q in paths)]


def _listed_entries(paths: tuple[str, ...], stdlib: set[str], allowed: set[str]) -> list[Mount]:
    """``("only", directory, names)`` for each standard-library directory: the launcher
    hides every entry whose name (up to its first dot) is not one of ``names``: the
    standard-library modules (and ``_sysconfigdata*``), or in lib-dynload the allowed
    extension modules. Listed when the sandbox is built, so nothing installed later slips
    through."""
    entries: list[Mount] = []
    directories = [path for path in paths if os.path.isdir(path)]
    for directory in directories:
        dynload = os.path.basename(directory) == "lib-dynload"
        # lib-dynload keeps only the allowed extension modules: no _ctypes, no _socket
        names = set(allowed) if dynload else stdlib | {"__pycache__"}
        # a path on sys.path that lies inside (lib-dynload) must stay visible
        names |= {os.path.basename(d) for d in directories if os.path.dirname(d) == directory}
        # sysconfig's per-platform module has a name no stdlib list holds
        prefixes = () if dynload else ("_sysconfigdata",)
        entries.append(("only", directory, tuple(sorted(names)), prefixes))
    return entries


def _libraries(mapped: list[str], paths: tuple[str, ...], interpreter: str) -> dict[str, set[str]]:
    """``{real path: names}`` of the shared libraries the probe had mapped, each with the
    names it is found by (its file name and the symbolic links to it in its directory,
    which include its soname)."""
    inside = tuple(path.rstrip("/") + "/" for path in paths)
    found: dict[str, set[str]] = {}
    for path in mapped:
        # extension modules are bound with the standard library; only their dependencies here
        if ".so" not in os.path.basename(path) or path == interpreter or path.startswith(inside):
            continue
        if not os.path.isfile(path):  # " (deleted)" and the like
            continue
        real = os.path.realpath(path)
        directory, name = os.path.split(real)
        stem = name.partition(".so")[0] + "."
        names = {name}
        for entry in os.listdir(directory):
            candidate = os.path.join(directory, entry)
            # the soname links the loader looks for (libfoo.so.1 -> libfoo.so.1.2.3)
            if entry.startswith(stem) and os.path.realpath(candidate) == real:
                names.add(entry)
        found.setdefault(real, set()).update(names)
    return found


def _elf_interpreter(executable: str) -> str | None:
    """The program interpreter (dynamic loader) named in an ELF executable's ``PT_INTERP``.

    ELF64 program headers hold ``p_offset`` at byte 8 and ``p_filesz`` at byte 32, ELF32
    ones at bytes 4 and 16 (the ELF specification); ``None`` for a static executable.
    """
    with open(executable, "rb") as file:
        header = file.read(64)
        if header[:4] != b"\x7fELF":
            return None
        # EI_CLASS 2: ELF64; EI_DATA 1: little-endian
        wide, order = header[4] == 2, "<" if header[5] == 1 else ">"
        word, (table_at, size_at, offset_at, length_at) = (
            # e_phoff, e_phentsize (then e_phnum) offsets
            ("Q", (0x20, 0x36, 8, 32)) if wide else ("I", (0x1C, 0x2A, 4, 16))
        )
        (table,) = struct.unpack_from(order + word, header, table_at)
        size, count = struct.unpack_from(order + "HH", header, size_at)
        file.seek(table)
        headers = file.read(size * count)
        for start in range(0, size * count, size):
            (kind,) = struct.unpack_from(order + "I", headers, start)
            if kind == PT_INTERP:
                (where,) = struct.unpack_from(order + word, headers, start + offset_at)
                (length,) = struct.unpack_from(order + word, headers, start + length_at)
                file.seek(where)
                return file.read(length).rstrip(b"\0").decode()
    return None
