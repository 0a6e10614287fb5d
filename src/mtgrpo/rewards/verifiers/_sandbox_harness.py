"""The sandboxed process: ``python -I -S -B -X utf8`` inside the sandbox, importing this
module from ``/sandbox/harness`` (with its compiled bytecode) and calling :func:`main`.

Started by ``_sandbox_launch.py`` (which built the namespaces, the file-system view, the
limits and dropped every privilege before exec); the library imports it only for its
constants. It reads its job from descriptor 3, runs the untrusted program, and writes
records to descriptor 4 for the launcher. The threat model is in ``docs/sandbox.md``.

Order of work (everything before step 3 runs before any untrusted code):

1. Read the job (``marshal``: length-prefixed dict) from descriptor 3 and close it.
2. Compile the program and the tests (a syntax error is reported before anything runs);
   harden: bind every function the harness will call to a local, replace dangerous
   functions of loaded modules with refusals, guard ``_imp.create_builtin``, and install the
   audit hook. The kernel already enforces the boundary (``_sandbox_launch.py``); the hook
   is a second, finer layer (it refuses frame walking that would reach the tokens, imports
   of blocked modules, and file access outside the allowed paths with a clear message).
3. Run: in ``tests`` mode the program, then each test unit in a copy of its namespace under
   a per-unit timer. A value check (``assert <expr> == <literal>`` and friends, rewritten by
   the parent) reports the value of ``<expr>`` as ``V<index> <json>``: the expected value
   is not in this process, the launcher compares. A unit that runs to the end reports its
   random token (``T<token>``). In ``io`` mode the program runs as ``__main__`` with the case
   input on stdin.

The tokens exist only as locals of :func:`_run_tests`; the audit hook refuses the ways
Python code reaches another function's frame (``sys._getframe``, ``tb_frame``/``gi_frame``/
``cr_frame``/``ag_frame``, ``sys.settrace``/``setprofile``, ``sys._current_frames``, the
``gc`` object walkers, Python-level signal handlers, which receive the interrupted frame).
"""

from __future__ import annotations

import builtins
import marshal
import os
import sys

FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
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
READ_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"})
REPLACED_POSIX = ("mknod", "mkfifo", "chroot", "pidfd_open", "setns", "unshare")
REPLACED_SIGNAL = ("signal", "set_wakeup_fd", "pidfd_send_signal", "siginterrupt")
GUARDED_BUILTINS = frozenset({"_imp", "_signal", "posix", "pwd", "_ctypes", "_testcapi",
                              "_testinternalcapi", "_socket", "_posixsubprocess"})
STRICT_EQ = "__mtgrpo_strict_eq__"
VALUE_CHECK = "__mtgrpo_check__"
JOB_FD, RESULT_FD = 3, 4


def main() -> None:
    import _signal

    install_handler = _signal.signal  # before hardening replaces it; used once, pre-program
    job = _read_job()
    try:
        program = compile(job["code"], "<solution>", "exec", dont_inherit=True, optimize=0)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as error:
        os.write(RESULT_FD, f"S {type(error).__name__}\n".encode())
        os._exit(0)
    tests = [
        (kind, compile(source, f"<test {index}>", "exec", dont_inherit=True, optimize=0))
        for index, (kind, source) in enumerate(job["units"])
    ]
    import types  # noqa: F401  # reads a traceback's tb_frame at import: load it before the hook

    sys.path.extend(job["extra_paths"])
    if job["audit_hook"]:
        _harden(job)
    if job["mode"] == "tests":
        strict_eq, canonical = _make_strict_eq()
        check = _make_value_check(canonical, job["value_bytes"])
        _run_tests(program, tests, job, (strict_eq, check), install_handler)
    _run_io(program)


def _read_job() -> dict:
    header = _read_exactly(8)
    job = marshal.loads(_read_exactly(int.from_bytes(header, "little")))
    os.close(JOB_FD)
    return job


def _read_exactly(size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = os.read(JOB_FD, min(remaining, 1 << 20))
        if not chunk:
            raise SystemExit("sandbox harness: job truncated")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


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
    str_, bytes_, int_, isinstance_, any_, repr_ = str, bytes, int, isinstance, any, repr
    permission_error = PermissionError
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    inside_work = workdir + "/"
    read_prefixes = (*(root.rstrip("/") + "/" for root in read_roots), inside_work)
    read_exact = frozenset(root.rstrip("/") for root in read_roots) | READ_DEVICES | {workdir}
    writes = [0]
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
        if isinstance_(path, int_):
            return
        target = absolute(path)
        # ``os.open`` (mode None) may carry a dir_fd the event does not show: the path must
        # be absolute. Checked on the exact text, not through the path's own methods.
        if mode is None and not (isinstance_(path, (str_, bytes_)) and is_absolute(path)):
            raise permission_error("sandbox: os.open needs an absolute path")
        wants_write = (isinstance_(mode, str_) and any_(c in mode for c in "wax+")) or (
            isinstance_(flags, int_) and flags & write_flags
        )
        if not (writable(target) if wants_write else readable(target)):
            raise permission_error(f"sandbox: no access to {shown(path)}")

    def check_paths(event: str, args: tuple) -> None:
        if event == "os.rename":
            paths, dir_fds = args[:2], args[2:]
        elif event in ("os.truncate", "os.utime") and isinstance_(args[0], int_):
            return
        else:
            paths, dir_fds = args[:1], args[-1:] if event != "os.truncate" else ()
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
        if "\x00" in text:
            return None
        parts: list[str] = []
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
            if isinstance_(name, str_) and (name in blocked or name.partition(".")[0] in blocked):
                raise import_error(f"sandbox: module {name!r} is not available")
        elif event == "object.__getattr__":
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


def _make_strict_eq():
    """``strict_eq(a, b)``: ``a == b`` that a program cannot fake with a lying ``__eq__``.

    Plain data (None, bool, int, float, complex, str, bytes, and lists, tuples, dicts, sets
    of plain data, subclasses included) is copied into exact built-in types through the base
    types' own methods, then compared with ``==``; other mappings and sets (``os.environ``,
    ``dict.keys()``) are copied through their own methods into dicts and frozensets, as
    Python's ``==`` would compare them. When exactly one side is plain, the other
    side (an object whose class decides what ``==`` means) is not equal; when neither is,
    ordinary ``==`` applies. Also returns ``canonical(value)``, that plain copy (anything else
    becomes an object of no plain type), which value checks report.
    """
    scalars = ((bool, bool), (int, int.__index__), (float, float.__float__))
    scalars += ((complex, complex.__complex__), (str, str.__str__), (bytes, bytes.__bytes__))
    containers = ((list, list.__iter__, list), (tuple, tuple.__iter__, tuple))
    containers += ((frozenset, frozenset.__iter__, frozenset), (set, set.__iter__, set))
    import _collections_abc

    dict_, dict_items, issubclass_, type_, bool_ = dict, dict.items, issubclass, type, bool
    isinstance_, frozenset_ = isinstance, frozenset
    mapping, abstract_set = _collections_abc.Mapping, _collections_abc.Set
    not_plain, budget_error, base_exception = object(), RecursionError, BaseException

    def plain(value: object, depth: int, budget: list[int]) -> object:
        budget[0] -= 1
        if depth > 100 or budget[0] < 0:
            raise budget_error
        if value is None:
            return None
        kind = type_(value)
        # ``issubclass`` on the type, not ``isinstance``: the latter reads ``__class__``,
        # which a program's object can answer with code of its own.
        for base, convert in scalars:
            if kind is base or issubclass_(kind, base):
                return convert(value)
        for base, iterate, build in containers:
            if issubclass_(kind, base):
                return build(plain(item, depth + 1, budget) for item in iterate(value))
        if issubclass_(kind, dict_):
            return {
                plain(key, depth + 1, budget): plain(item, depth + 1, budget)
                for key, item in dict_items(value)
            }
        # Python's own ``==`` compares any Mapping with a dict by items and any Set with a
        # set by elements (the ABCs' ``__eq__``), so these read as plain data too.
        if isinstance_(value, mapping):
            return {
                plain(key, depth + 1, budget): plain(item, depth + 1, budget)
                for key, item in value.items()
            }
        if isinstance_(value, abstract_set):
            return frozenset_(plain(item, depth + 1, budget) for item in value)
        return not_plain

    def canonical(value: object) -> object:
        try:
            return plain(value, 0, [1_000_000])
        except base_exception:  # cycles, size, or a hostile object: not plain data
            return not_plain

    def strict_eq(left: object, right: object) -> bool:
        left_plain, right_plain = canonical(left), canonical(right)
        if left_plain is not_plain and right_plain is not_plain:
            return bool_(left == right)
        if left_plain is not_plain or right_plain is not_plain:
            return False
        return left_plain == right_plain

    return strict_eq, canonical


def _make_value_check(canonical, limit: int):
    """``check(index, value)``: write ``V<index> <json>`` for the launcher to compare.

    The value is first copied to plain data (``canonical``), then written as JSON made of
    tags and hexadecimal text only, which the launcher reads back without evaluating
    anything: ``null``/``true``/``false``, ``["i", hex]`` int, ``["f", repr]`` float,
    ``["c", re, im]`` complex, ``["u", hex of UTF-8]`` str, ``["b", hex]`` bytes,
    ``["l"|"t"|"s"|"z", [items]]`` list, tuple, set, frozenset, ``["d", [[k, v], ...]]``
    dict, ``["?"]`` anything that is not plain data. An encoding over ``limit`` bytes is
    sent as ``["?"]``.
    """
    type_, join, write, len_ = type, "".join, os.write, len
    int_format, float_repr, hexify, utf8 = int.__format__, float.__repr__, bytes.hex, str.encode
    tags = {list: "l", tuple: "t", set: "s", frozenset: "z"}
    simple = {type(None): lambda v: "null", bool: lambda v: "true" if v else "false",
              int: lambda v: '["i","' + int_format(v, "x") + '"]',
              float: lambda v: '["f","' + float_repr(v) + '"]',
              complex: lambda v: '["c","' + float_repr(v.real) + '","' + float_repr(v.imag) + '"]',
              str: lambda v: '["u","' + hexify(utf8(v, "utf-8", "surrogatepass")) + '"]',
              bytes: lambda v: '["b","' + hexify(v) + '"]'}  # fmt: skip
    dict_items = dict.items

    def emit(value: object, parts: list) -> None:
        kind = type_(value)
        if kind in simple:
            parts.append(simple[kind](value))
        elif kind in tags:
            parts.append('["' + tags[kind] + '",[')
            for position, item in enumerate(value):
                parts.append("," if position else "")
                emit(item, parts)
            parts.append("]]")
        elif kind is dict:
            parts.append('["d",[')
            for position, (key, item) in enumerate(dict_items(value)):
                parts.append(",[" if position else "[")
                emit(key, parts)
                parts.append(",")
                emit(item, parts)
                parts.append("]")
            parts.append("]]")
        else:
            parts.append('["?"]')

    def check(index: int, value: object) -> None:
        parts: list = []
        emit(canonical(value), parts)
        text = join(parts)
        if len_(text) > limit:
            text = '["?"]'
        write(RESULT_FD, b"V%d " % index + text.encode("ascii") + b"\n")

    return check


def _run_tests(program, tests, job, helpers, install_handler) -> None:
    """Run the program, then each test; write a passing test's token to the result pipe.

    Every name used once the program has started is a local bound on the first lines (a
    module global or builtin could have been replaced by the program). Setup statements run
    in the program's namespace; each test runs in a copy of it with pristine builtins, the
    strict equality and the value check, so a program cannot rebind what a test sees.
    """
    run = _make_timed_runner(job["test_seconds"], install_handler)
    describe = _make_describer()
    write, exit_, copy, base_exception = os.write, os._exit, dict, BaseException
    result_fd, tokens, code_token = RESULT_FD, job["unit_tokens"], job["code_token"]
    (strict_eq, check), eq_name, check_name = helpers, STRICT_EQ, VALUE_CHECK
    flushes = (sys.stdout.flush, sys.stderr.flush)
    pristine_builtins = dict(builtins.__dict__)
    namespace = {"__name__": "__solution__", "__builtins__": builtins}
    failure = run(program, namespace)
    if failure is not None:
        describe("program", failure)
        tests = ()
    try:
        if failure is None:
            write(result_fd, b"C" + code_token + b"\n")
        test_index = 0
        for unit, (kind, code) in enumerate(tests):
            if kind != "test":
                failure = run(code, namespace)
                if failure is not None:
                    describe("setup", failure)
                continue
            scope = copy(namespace)
            scope["__builtins__"], scope[eq_name] = pristine_builtins, strict_eq
            scope[check_name] = check
            failure = run(code, scope)
            if failure is None:
                write(result_fd, b"T" + tokens[unit] + b"\n")
            else:
                describe(f"test {test_index}", failure)
            test_index += 1
    except base_exception:  # the program closed or replaced the result pipe
        exit_(0)
    for flush in flushes:
        try:  # noqa: SIM105  # contextlib is Python code the program could have patched
            flush()
        except base_exception:
            pass
    exit_(0)


def _make_timed_runner(budget: float, install_handler):
    """``run(code, scope)``: ``exec`` under a ``budget``-second timer; returns ``None`` when
    the code ran to the end, else the exception that stopped it (``TestTimeout`` when the
    timer fired). The SIGALRM handler is installed now, before the program runs."""
    import _signal

    exec_, base_exception = exec, BaseException
    setitimer, timer = _signal.setitimer, _signal.ITIMER_REAL
    armed = [False]

    class TestTimeout(BaseException):
        pass

    def on_alarm(signum: int, frame: object) -> None:
        if armed[0]:
            armed[0] = False
            raise TestTimeout

    def run(code, scope):
        try:
            armed[0] = True
            setitimer(timer, budget)
            exec_(code, scope)
            armed[0] = False
            setitimer(timer, 0)
            return None
        except base_exception as error:
            armed[0] = False
            setitimer(timer, 0)
            return error

    install_handler(_signal.SIGALRM, on_alarm)
    return run


def _make_describer():
    """``describe(where, error)``: a diagnostic line on stderr (free text, never a result)."""
    write, type_, base_exception = os.write, type, BaseException

    def describe(where: str, error: BaseException) -> None:
        try:
            text = f"{where}: {type_(error).__name__}: {error}"
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
    stdout, stderr, exit_ = sys.stdout, sys.stderr, os._exit
    status = 0
    try:
        exec(program, namespace)
    except SystemExit as error:
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
