"""The program's process: ``python -I -S -B -X utf8`` inside the sandbox, importing this
module from ``/sandbox/harness`` (with its compiled bytecode) and calling :func:`main`.

Started by ``_launch.py`` (which built the namespaces, the file-system view, the limits and
dropped every privilege before exec); the library imports it only for its constants. It
reads its job from descriptor 3, runs the untrusted program, and writes status records to
descriptor 4 for the launcher. The threat model is in ``docs/sandbox.md``.

Order of work (everything before step 3 runs before any untrusted code):

1. Read the job (``marshal``: length-prefixed dict) from descriptor 3 and close it.
2. Compile the program (a syntax error is reported before anything runs); harden: replace
   dangerous functions of loaded modules with refusals, guard ``_imp.create_builtin``, and
   install the audit hook. The kernel enforces the boundary (``_launch.py``); the hook is a
   second, finer layer that gives clear errors (blocked imports, file access outside the
   allowed paths, process functions).
3. Run. In ``serve`` mode (tests): the program's top level in a namespace named
   ``__solution__``, then serve the judge (``_judge.py``, a separate sandboxed process
   running the tests) over descriptors 5 (requests) and 6 (replies): look up names of the
   program, call its functions, read attributes, iterate. Only plain data leaves this
   process (:mod:`_wire`); no test, expected value or verdict is ever here. In ``io``
   mode: the program as ``__main__`` with the case input on stdin.

Nothing in this process is a secret: the program may read and write all of it, and the
worst it can do with the reply pipe is to send data, which is what its functions return
anyway.
"""

from __future__ import annotations

import builtins
import os
import sys

try:  # inside the sandbox, the harness directory is on sys.path
    import _wire
except ImportError:  # imported by the library for its constants
    from mtgrpo.sandbox import _wire

# a frame reaches the harness's locals (the generator behind create_builtin)
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
# FFI, sockets, processes, the C test modules and host accounts: also hidden by _view
BLOCKED_MODULES = frozenset(
    {
        "ctypes", "_ctypes", "_ctypes_test", "socket", "_socket", "ssl", "_ssl", "subprocess",
        "_posixsubprocess", "multiprocessing", "_multiprocessing", "_posixshmem", "pty",
        "resource", "_xxsubinterpreters", "_xxinterpchannels", "_testcapi", "_testinternalcapi",
        "_testbuffer", "_testmultiphase", "_testclinic", "_testimportmultiple", "_xxtestfuzz",
        "pwd", "grp", "spwd", "nis", "_crypt", "crypt", "syslog", "readline", "_sqlite3",
        "sqlite3", "dbm", "_dbm", "_gdbm", "_tkinter", "tkinter", "_curses", "curses",
        "_curses_panel", "ossaudiodev", "asyncio", "_asyncio", "webbrowser",
    }
)  # fmt: skip
# new processes, signals to others, file metadata, other hooks, object walks (gc):
# test_no_new_processes, test_killing_the_parent_is_refused and
# test_the_harness_secrets_are_out_of_reach
DENIED_EVENTS = frozenset(
    {
        "os.fork", "os.forkpty", "os.system", "os.kill", "os.killpg", "os.exec", "os.spawn",
        "os.posix_spawn", "os.startfile", "os.chdir", "os.chmod", "os.chown", "os.chflags",
        "os.lchflags", "os.lchmod", "os.link", "os.symlink", "os.setxattr", "os.removexattr",
        "os.getxattr", "os.listxattr", "subprocess.Popen", "pty.spawn", "webbrowser.open",
        "sys.addaudithook", "sys.setprofile", "sys.settrace", "gc.get_objects",
        "gc.get_referrers", "gc.get_referents", "code.__new__", "resource.setrlimit",
        "resource.prlimit", "sys.monitoring.register_callback",
    }
)  # fmt: skip
DENIED_PREFIXES = ("socket.", "ctypes.", "sqlite3.", "syslog.", "_winapi.", "winreg.")
FRAME_EVENTS = frozenset({"sys._getframe", "sys._current_frames", "sys._current_exceptions"})
PATH_EVENTS = frozenset(
    {"os.mkdir", "os.rmdir", "os.remove", "os.rename", "os.truncate", "os.utime"}
)
# the four devices _view binds into the sandbox
READ_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"})
# calls CPython raises no audit event for: the hook alone would never see them
REPLACED_POSIX = ("mknod", "mkfifo", "chroot", "pidfd_open", "setns", "unshare")
# the SIGALRM handler that times each call stays the harness's (_Clock); no signals to others
REPLACED_SIGNAL = ("signal", "set_wakeup_fd", "pidfd_send_signal", "siginterrupt")
# built-in modules _imp.create_builtin could load behind the import event
GUARDED_BUILTINS = frozenset({"_imp", "_signal", "posix", "pwd", "_ctypes", "_testcapi",
                              "_testinternalcapi", "_socket", "_posixsubprocess"})
JOB_FD, RESULT_FD, REQUEST_FD, REPLY_FD = 3, 4, 5, 6




def main() -> None:
    import _signal

    install_handler = _signal.signal  # before hardening replaces it; used once, pre-program
    job = _wire.read_job(JOB_FD)
    try:
        # optimize=0 keeps the program's own asserts; dont_inherit: this module's __future__
        # imports do not apply to the program (compile()'s docs)
        program = compile(job["code"], "<solution>", "exec", dont_inherit=True, optimize=0)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as error:
        os.write(RESULT_FD, f"S {type(error).__name__}\n".encode())
        os._exit(0)
    import _collections_abc  # noqa: F401  # the encoder reads Mapping/Set; load before the hook
    import types  # noqa: F401  # reads a traceback's tb_frame at import: load it before the hook

    sys.path.extend(job["extra_paths"])
    clock = _Clock(install_handler)
    if job["audit_hook"]:
        _harden(job)
    if job["mode"] == "serve":
        _serve(program, job, clock)
    _run_io(program)


def _refuse(name: str):
    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(f"sandbox: {name} is not allowed")

    refused.__name__ = name
    return refused


def _harden(job: dict) -> None:
    import _imp
    import _signal
    import posix

    replacements = ((posix, REPLACED_POSIX), (os, REPLACED_POSIX), (_signal, REPLACED_SIGNAL))
    for module, names in replacements:
        for name in names:
            if hasattr(module, name):
                setattr(module, name, _refuse(f"{module.__name__}.{name}"))
    # called directly, it loads a built-in module without the import event the hook refuses
    _imp.create_builtin = _guarded_create_builtin(_imp.create_builtin)
    roots = tuple(job["read_paths"])
    sys.addaudithook(_make_audit_hook(job["workdir"], roots, job["max_files"]))


def _guarded_create_builtin(original):
    """``_imp.create_builtin`` that refuses :data:`GUARDED_BUILTINS`.

    The original function lives only in the frame of a suspended generator: a closure cell
    or attribute would hand it to any program that inspects the replacement, while a
    generator's frame is reachable only through ``gi_frame`` (refused by the audit hook).
    """

    class Spec:
        def __init__(self, name: str) -> None:
            self.name = name

    str_, guarded, import_error, base_exception = str, GUARDED_BUILTINS, ImportError, BaseException

    def serve():
        outcome = None
        while True:
            spec = yield outcome
            try:
                # test_the_harness_secrets_are_out_of_reach (lying-module-name)
                name = str_.__str__(spec.name)  # an exact str: no lying __eq__ or __hash__
                if name in guarded:
                    outcome = (False, import_error(f"sandbox: module {name!r} is not available"))
                else:
                    outcome = (True, original(Spec(name)))
            except base_exception as error:  # handed back to the caller unchanged
                outcome = (False, error)

    server = serve()
    next(server)
    send = server.send

    def create_builtin(spec):
        ok, value = send(spec)
        if ok:
            return value
        raise value

    return create_builtin


def _make_path_checks(workdir: str, read_roots: tuple[str, ...], max_files: int):
    """(check_open, check_paths, check_listing): the audit hook's file-system rules.

    Writes are allowed only strictly inside ``workdir``; reads inside ``workdir``, the
    interpreter's library directories (``read_roots``) and a few devices; at most
    ``max_files`` opens for writing and directory creations in total. Paths are normalised
    by string operations on exact ``str`` objects: ``os.path`` is Python code the program
    could replace, and a path object could answer differently when the call re-reads it.
    Every name used is bound here, before the program runs (see :func:`_make_audit_hook`).
    """
    # bound now: test_the_harness_secrets_are_out_of_reach (patched-builtins)
    str_, bytes_, int_, isinstance_, any_, repr_ = str, bytes, int, isinstance, any, repr
    permission_error = PermissionError
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    inside_work = workdir + "/"
    read_prefixes = (*(root.rstrip("/") + "/" for root in read_roots), inside_work)
    # the roots too: the import system lists them
    read_exact = frozenset(root.rstrip("/") for root in read_roots) | READ_DEVICES | {workdir}
    writes = [0]  # counts every write open and mkdir: the max_files limit
    absolute = _make_normaliser(inside_work)

    def is_absolute(path: str | bytes) -> bool:
        if isinstance_(path, str_):
            return str_.startswith(path, "/")
        return bytes_.startswith(path, b"/")

    def shown(path: object) -> str:
        return repr_(path) if isinstance_(path, (str_, bytes_)) else "a path object"

    def readable(path: str | None) -> bool:
        return path is not None and (path in read_exact or path.startswith(read_prefixes))

    def writable(path: str | None) -> bool:
        if path is None or not path.startswith(inside_work):
            return False
        writes[0] += 1
        return writes[0] <= max_files

    def check_open(path: object, mode: object, flags: object) -> None:
        # open(fd) wraps a descriptor that is already open: there is no path to check
        if isinstance_(path, int_):
            return
        target = absolute(path)
        # ``os.open`` (mode None) may carry a dir_fd the event does not show: the path must
        # be absolute. Checked on the exact text, not through the path's own methods.
        if mode is None and not (isinstance_(path, (str_, bytes_)) and is_absolute(path)):
            raise permission_error("sandbox: os.open needs an absolute path")
        # both forms: open() gives a mode string, os.open only flags
        wants_write = (isinstance_(mode, str_) and any_(c in mode for c in "wax+")) or (
            isinstance_(flags, int_) and flags & write_flags
        )
        if not (writable(target) if wants_write else readable(target)):
            raise permission_error(f"sandbox: no access to {shown(path)}")

    def check_paths(event: str, args: tuple) -> None:
        if event == "os.rename":
            # os.rename's event carries src, dst, src_dir_fd, dst_dir_fd
            paths, dir_fds = args[:2], args[2:]
        elif event in ("os.truncate", "os.utime") and isinstance_(args[0], int_):
            return
        else:
            paths, dir_fds = args[:1], args[-1:] if event != "os.truncate" else ()
        # a dir_fd would resolve the path relative to a directory this check never sees
        if any_(fd is not None and fd != -1 for fd in dir_fds):
            raise permission_error(f"sandbox: {event} with dir_fd is not allowed")
        for path in paths:
            target = absolute(path)
            if event == "os.mkdir":
                ok = writable(target)
            else:
                ok = target is not None and target.startswith(inside_work)
            if not ok:
                raise permission_error(f"sandbox: {event} outside the working directory")

    def check_listing(path: object) -> None:
        if not (path is None or isinstance_(path, int_) or readable(absolute(path))):
            raise permission_error(f"sandbox: cannot list {shown(path)}")

    return check_open, check_paths, check_listing


def _make_normaliser(inside_work: str):
    """``absolute(path)``: the normalised absolute path of a ``str``/``bytes`` path (relative
    ones from the working directory, ``..`` resolved lexically; the program cannot create
    symlinks), or ``None`` for anything else: a path object could answer differently when
    the call re-reads it."""
    str_, bytes_, isinstance_ = str, bytes, isinstance

    def absolute(path: object) -> str | None:
        if isinstance_(path, str_):
            text = str_.__str__(path)
        elif isinstance_(path, bytes_):
            text = bytes_.decode(path, "utf-8", "surrogateescape")
        else:
            return None
        # no real path holds a NUL: refused rather than guessed at
        if "\x00" in text:
            return None
        parts: list[str] = []
        # the cwd is the work directory (_launch chdirs there; os.chdir is denied)
        for part in (text if text.startswith("/") else inside_work + text).split("/"):
            if part == "..":
                if parts:
                    parts.pop()
            elif part and part != ".":
                parts.append(part)
        return "/" + "/".join(parts)

    return absolute


def _make_audit_hook(workdir: str, read_roots: tuple[str, ...], max_files: int):
    """The audit hook: refuses the events listed above and confines file access.

    Everything it uses after the program starts is bound in this closure: the module's
    constants and the builtins are reachable by the program (``import __main__``,
    ``import builtins``) and could be rebound, the closure cannot.
    """
    check_open, check_paths, check_listing = _make_path_checks(workdir, read_roots, max_files)
    # bound now: test_the_harness_secrets_are_out_of_reach (patched-constants)
    str_, isinstance_ = str, isinstance
    permission_error, value_error, attribute_error, import_error = (
        PermissionError, ValueError, AttributeError, ImportError
    )  # fmt: skip
    blocked, frame_attributes, frame_events = BLOCKED_MODULES, FRAME_ATTRIBUTES, FRAME_EVENTS
    path_events, denied, denied_prefixes = PATH_EVENTS, DENIED_EVENTS, DENIED_PREFIXES

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            check_open(*args[:3])
        elif event == "import":
            name = args[0]
            # a submodule counts as its package: import ctypes.util is import ctypes
            if isinstance_(name, str_) and (name in blocked or name.partition(".")[0] in blocked):
                raise import_error(f"sandbox: module {name!r} is not available")
        elif event == "object.__getattr__":
            # tb_frame, gi_frame, f_back: the getframe/tb_frame/gi_frame attacks
            if args[1] in frame_attributes:
                raise attribute_error("sandbox: frame objects are not available")
        elif event in ("os.listdir", "os.scandir"):
            check_listing(args[0])
        elif event in path_events:
            check_paths(event, args)
        elif event in frame_events:
            # ValueError is what ``sys._getframe`` raises for a too-deep frame, so library
            # code that asks for its caller's module name (namedtuple, enum, typing) copes.
            raise value_error("sandbox: the call stack is not available")
        elif event in denied or event.startswith(denied_prefixes):
            raise permission_error(f"sandbox: {event} is not allowed")

    return hook




# ------------------------------------------------------------------------------ serve


class CallTimeout(BaseException):
    """The time the judge gave a call (or the program's top level) is spent."""


class _Clock:
    """One ``SIGALRM`` timer for the program's top level and for each call the judge makes.

    The handler is installed now, before the program runs (hardening then refuses
    ``signal.signal`` to the program). A program can still block or swallow the alarm: the
    judge then stops waiting for it, and the trainer's wall clock ends the process.
    """

    def __init__(self, install_handler) -> None:
        import _signal

        self.armed = False
        # bound: the program could rebind _signal's
        self._setitimer, self._timer = _signal.setitimer, _signal.ITIMER_REAL
        install_handler(_signal.SIGALRM, self._on_alarm)

    # Python runs handlers in the main thread between bytecode instructions (signal module
    # docs): a long computation inside one C call is not interrupted (RLIMIT_CPU ends it)
    def _on_alarm(self, signum: int, frame: object) -> None:
        if self.armed:
            self.armed = False
            raise CallTimeout

    def arm(self, seconds: float) -> None:
        self.armed = True
        # 0 would disarm the timer instead of firing it at once (signal.setitimer's docs)
        self._setitimer(self._timer, max(seconds, 0.001))

    def disarm(self) -> None:
        self.armed = False
        self._setitimer(self._timer, 0)


def _serve(program, job: dict, clock: _Clock) -> None:
    """Run the program's top level, then answer the judge until it closes the pipe."""
    describe = _make_describer()
    # not __main__: the program's if __name__ == "__main__" block does not run
    namespace = {"__name__": "__solution__", "__builtins__": builtins}
    link = _Link(job["value_bytes"])
    clock.arm(job["test_seconds"])
    try:
        exec(program, namespace)
        clock.disarm()
    except BaseException as error:
        clock.disarm()
        describe("program", "TestTimeout" if isinstance(error, CallTimeout) else error)
        link.send(["failed"])
        _flush_and_exit()
    # describes the run only; the judge's launcher gives the verdicts
    os.write(RESULT_FD, b"C" + job["code_token"] + b"\n")
    link.send(["ready"])
    _Server(namespace, link, clock).loop()
    _flush_and_exit()


def _flush_and_exit() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105  # contextlib is Python code the program could have patched
            stream.flush()
        except BaseException:
            pass
    os._exit(0)


class _Link:
    """Newline-delimited messages with the judge: requests on 5, replies on 6."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = b""

    def send(self, tree: object) -> None:
        data = _wire.dumps(tree)
        view = memoryview(data)
        # write(2): a signal handler (the call timer) can cut a pipe write short after part
        # of the data; the rest is written by the next call
        while view:
            written = os.write(REPLY_FD, view)
            view = view[written:]

    def receive(self) -> object | None:
        """The next message, or ``None`` when the judge has gone."""
        while b"\n" not in self.buffer:
            chunk = os.read(REQUEST_FD, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            return _wire.loads(line)
        except _wire.WireError:
            return None


class _TestFunction:
    """A function of the tests, passed to the program: calling it asks the judge to run it."""

    __slots__ = ("number", "server")

    def __init__(self, number: str, server: _Server) -> None:
        self.number, self.server = number, server

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self.server.callback(self.number, args, kwargs)

    def __repr__(self) -> str:
        return f"<function of the tests #{self.number}>"


_SCALAR_BASES = ((bool, bool), (int, int.__index__), (float, float.__float__),
                 (complex, complex.__complex__), (str, str.__str__), (bytes, bytes.__bytes__))
_CONTAINER_BASES = ((list, list.__iter__, "l"), (tuple, tuple.__iter__, "t"),
                    (frozenset, frozenset.__iter__, "z"), (set, set.__iter__, "s"))  # fmt: skip


class _Server:
    """Answers the judge's requests on the program's objects.

    Requests: ``["r", id, [names], budget]`` (the program's globals of those names) and
    ``["o", id, op, target, [args], [[name, value], ...], budget]`` with ``op`` one of
    ``call``, ``attr``, ``iter``, ``next``, ``len``, ``item``, ``str``, ``repr``, ``eq``. Replies:
    ``["n", id, [[name, value], ...]]``, ``["v", id, value, mutated]``, ``["e", id, [names of
    the exception's classes], text]``, ``["t", id]`` (the budget ran out). While a call runs,
    the program may call a function of the tests: ``["c", id, function, [args], kwargs]``,
    answered by the judge with ``["v", id, value]`` or ``["e", id, names, text]``.
    """

    def __init__(self, namespace: dict, link: _Link, clock: _Clock) -> None:
        self.namespace, self.link, self.clock = namespace, link, clock
        self.objects: dict[str, object] = {}
        self.numbers: dict[int, str] = {}  # id(object) -> its number, so one object keeps one
        self.callbacks = 0

    def loop(self) -> None:
        while True:
            message = self.link.receive()
            if message is None:
                return
            self.handle(message)

    def handle(self, message: object) -> None:
        """Serve one request; anything else (a late reply to a callback) is dropped."""
        if not (type(message) is list and len(message) >= 2 and type(message[1]) is str):
            return
        kind, rid = message[0], message[1]
        if kind == "r" and len(message) == 4 and type(message[2]) is list:
            self.link.send(self._timed(rid, message[3], self._resolve, message[2]))
        elif kind == "o" and len(message) == 7:
            self.link.send(self._timed(rid, message[6], self._operate, *message[2:6]))

    def _timed(self, rid: str, budget: object, work, *args: object) -> list:
        try:
            # the judge sends its remaining time, as text (the wire carries no bare numbers)
            seconds = float(budget) if type(budget) is str else 1.0
        except ValueError:
            seconds = 1.0
        self.clock.arm(seconds)
        try:
            reply = work(rid, *args)
            self.clock.disarm()
        except CallTimeout:
            return ["t", rid]
        except BaseException as error:
            self.clock.disarm()
            reply = ["e", rid, *_describe_exception(error)]
        # a reply over output_bytes would exceed what the judge reads in one message
        if len(_wire.dumps(reply)) > self.link.limit:
            return ["e", rid, ["ValueError"], "the value is larger than the sandbox's "
                    "output_bytes limit"]  # fmt: skip
        return reply

    def _resolve(self, rid: str, names: list) -> list:
        found = []
        for name in names:
            # no dunder names: __builtins__ and the like are not the program's answers
            if type(name) is str and not name.startswith("__") and name in self.namespace:
                found.append([name, self.encode(self.namespace[name])])
        return ["n", rid, found]

    def _operate(self, rid: str, op: object, target: object, args: object, kwargs: object):
        target = self.decode(target)
        args = self.decode(["l", args]) if type(args) is list else []
        pairs = kwargs if type(kwargs) is list else []
        named = {pair[0]: self.decode(pair[1]) for pair in pairs
                 if type(pair) is list and len(pair) == 2 and type(pair[0]) is str}  # fmt: skip
        if op == "call":
            result = target(*args, **named)
        elif op == "attr" and args and type(args[0]) is str:
            result = getattr(target, args[0])
        elif op == "iter":
            result = iter(target)
        elif op == "next":
            result = next(target)
        elif op == "len":
            result = len(target)
        elif op == "item" and args:
            result = target[args[0]]
        elif op == "str":
            result = str(target)
        elif op == "repr":
            result = repr(target)
        elif op == "eq" and args:  # two objects of the program: its own equality
            # the program's equality decides only between its own objects (Remote.__eq__)
            result = bool(target == args[0]) is True
        else:
            raise TypeError(f"sandbox: unknown operation {op!r}")
        # The judge's mutable arguments come back as they are now: a test that passes a
        # list to a function that sorts it in place sees it sorted.
        mutated = [[str(i), self.encode(a)] for i, a in enumerate(args) if _mutable(a)]
        mutated += [[k, self.encode(a)] for k, a in named.items() if _mutable(a)]
        return ["v", rid, self.encode(result), mutated]

    def callback(self, number: str, args: tuple, kwargs: dict) -> object:
        """Call a function of the tests: ask the judge, serving its requests meanwhile."""
        self.callbacks += 1
        cid = f"p{self.callbacks}"
        pairs = [[str(k), self.encode(v)] for k, v in kwargs.items()]
        self.link.send(["c", cid, number, [self.encode(a) for a in args], pairs])
        while True:
            message = self.link.receive()
            if message is None:
                _flush_and_exit()
            # a request of the judge meanwhile is served below (nested calls)
            if type(message) is list and len(message) >= 3 and message[1] == cid:
                if message[0] == "v":
                    return self.decode(message[2])
                names = message[2] if type(message[2]) is list else []
                text = message[3] if len(message) > 3 and type(message[3]) is str else ""
                raise _exception_named(names, text)
            self.handle(message)

    # ---------------------------------------------------------------- data

    def encode(self, value: object) -> object:
        return self._encode(value, 0, [_wire.MAX_NODES])

    def _encode(self, value: object, depth: int, budget: list[int]) -> object:
        budget[0] -= 1
        if depth > _wire.MAX_DEPTH or budget[0] < 0:
            raise ValueError("sandbox: the value is too deep or too large to report")
        kind = type(value)
        # Subclasses of plain types are read through the base type's own methods: the
        # judge receives the value, never the class (nor its __eq__).
        for base, convert in _SCALAR_BASES:
            if issubclass(kind, base):
                return _wire.scalar(convert(value))
        if value is None:
            return None
        for base, iterate, tag in _CONTAINER_BASES:
            if issubclass(kind, base):
                return [tag, [self._encode(item, depth + 1, budget) for item in iterate(value)]]
        if issubclass(kind, dict):
            return ["d", [[self._encode(k, depth + 1, budget), self._encode(v, depth + 1, budget)]
                          for k, v in dict.items(value)]]  # fmt: skip
        if kind is _TestFunction:
            return ["j", value.number]
        import _collections_abc

        if isinstance(value, _collections_abc.Mapping):  # os.environ, MappingProxy: as dicts
            return ["d", [[self._encode(k, depth + 1, budget), self._encode(v, depth + 1, budget)]
                          for k, v in value.items()]]  # fmt: skip
        if isinstance(value, _collections_abc.Set):  # dict.keys() and the like: as sets
            return ["z", [self._encode(item, depth + 1, budget) for item in value]]
        # a standard-library module crosses by name; the judge imports its own copy
        if kind is type(sys) and getattr(value, "__name__", None) in _wire.STDLIB:
            return ["m", value.__name__]
        if callable(value):
            name = _wire.stdlib_name(value)
            if name is not None:
                return ["q", *name]
        # anything else stays here: the judge gets a handle (Remote), never the object
        return ["h", self._number(value)]

    def _number(self, value: object) -> str:
        number = self.numbers.get(id(value))
        # ids are reused after an object dies: trust one only if it still names this object
        if number is None or self.objects.get(number) is not value:
            number = str(len(self.objects))
            self.objects[number] = value
            self.numbers[id(value)] = number
        return number

    def decode(self, tree: object) -> object:
        return _wire.rebuild(tree, self._reference)

    def _reference(self, tag: str, parts: list) -> object:
        if tag == "h" and len(parts) == 1 and parts[0] in self.objects:
            return self.objects[parts[0]]
        if tag == "j" and len(parts) == 1:
            return _TestFunction(parts[0], self)
        if tag == "m" and len(parts) == 1:
            return _wire.import_stdlib(parts[0])
        if tag == "q" and len(parts) == 2:
            return _wire.resolve_stdlib(parts[0], parts[1])
        raise _wire.WireError(f"unknown reference {tag!r}")


def _mutable(value: object) -> bool:
    # exact types: the judge's _update writes back only these
    return type(value) in (list, dict, set)


def _describe_exception(error: BaseException) -> list:
    """``[names of the exception's classes, its text]``, read defensively (program code)."""
    try:
        names = [str.__str__(kind.__name__) for kind in type(error).__mro__]
    except BaseException:
        names = ["Exception"]
    try:
        text = str(error)[:2000]  # bounded: an exception's text is the program's to choose
        text = str.__str__(text)
    except BaseException:
        text = "an error that cannot be printed"
    return [names, text]


def _exception_named(names: list, text: str) -> BaseException:
    """The built-in exception class first named in ``names`` (a test function's error)."""
    for name in names:
        kind = getattr(builtins, name, None) if type(name) is str else None
        # never SystemExit or KeyboardInterrupt from the judge's word
        if isinstance(kind, type) and issubclass(kind, Exception):
            return kind(text)
    return RuntimeError(text)


def _make_describer():
    """``describe(where, error)``: a diagnostic line on stderr (free text, never a result)."""
    write, type_, base_exception = os.write, type, BaseException

    def describe(where: str, error: BaseException | str) -> None:
        try:
            name = error if isinstance(error, str) else type_(error).__name__
            text = f"{where}: {name}" if isinstance(error, str) else f"{where}: {name}: {error}"
        except base_exception:
            text = f"{where}: an error that cannot be printed"
        try:  # noqa: SIM105  # contextlib is Python code the program could have patched
            write(2, text[:500].encode("utf-8", "replace") + b"\n")
        except base_exception:
            pass

    return describe


def _run_io(program) -> None:
    """Run the program as ``__main__`` with the case input on stdin; exit 0 only if it ends."""
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    # bound before the program can rebind sys.stdout or os._exit
    stdout, stderr, exit_ = sys.stdout, sys.stderr, os._exit
    status = 0
    try:
        exec(program, namespace)
    except SystemExit as error:
        # sys.exit() with no code, or 0, is a normal end of an io program
        status = 0 if error.code in (None, 0) else 1
    except BaseException as error:
        status = 1
        try:  # noqa: SIM105  # contextlib is Python code the program could have patched
            stderr.write(f"{type(error).__name__}: {error}\n")
        except BaseException:
            pass
    for stream in (stdout, stderr):
        try:
            stream.flush()
        except BaseException:
            status = 1
    exit_(status)


if __name__ == "__main__":
    main()
