"""The judge: a second sandboxed process that runs the tests and decides every verdict.

``python -I -S -B -X utf8`` inside a sandbox of its own (its own PID, mount, network, IPC
and UTS namespaces, uid 65534, no capabilities: ``_launch.py`` builds it exactly as it
builds the program's), importing this module from ``/sandbox/harness`` and calling
:func:`main`. The program's process cannot see it, signal it, trace it or read its memory:
the two share no namespace and no file, only two pipes (descriptors 5 and 6 here) carrying
plain data (:mod:`_wire`).

The tests run here, with this process's own builtins and standard library. A name of the
program that a test uses is looked up in the program's process: plain data arrives as a
copy, anything else (a function, a class, an instance) as a :class:`Remote` handle whose
calls, attribute reads and iteration are carried out there and answered with data. Every
comparison, ``isinstance``, arithmetic and truth test runs here on that data: an object of
the program never takes part in a verdict, so a lying ``__eq__``, ``__gt__``,
``__class__``, metaclass, patched module or import hook in the program has nothing to
act on.

A test unit passes when it runs to the end here, without the program's process having run
out of time, exited or stopped answering during it; its number is then written to
descriptor 4 (``P<unit>``) for the launcher. ``L`` means the program's process was lost
(the remaining units fail).
"""

from __future__ import annotations

import builtins
import os
import select
import sys
import time
from typing import NoReturn

try:  # inside the sandbox, the harness directory is on sys.path
    import _wire
except ImportError:  # imported by the library for its constants
    from mtgrpo.sandbox import _wire

JOB_FD, RESULT_FD, REPLY_FD, REQUEST_FD = 3, 4, 5, 6
GRACE_SECONDS = 0.5  # past a call's budget, how long the program's timer may take to answer
BUILTIN_NAMES = frozenset(dir(builtins))
CASE = "__mtgrpo_case__"


class UnitTimeout(BaseException):
    """The unit's time is spent (in the tests or in the program)."""


class ProgramLost(BaseException):
    """The program's process exited, stopped answering or sent something that is not data."""


class ProgramStopped(BaseException):
    """The program raised ``SystemExit``/``KeyboardInterrupt`` (or the like) in a call."""


class ProgramError(Exception):
    """The program raised an exception that is not a built-in one (its class's name kept)."""


def main() -> None:
    job = _wire.read_job(JOB_FD)
    # dont_inherit: this module's __future__ imports do not apply to the tests (compile()'s docs)
    units = [(kind, compile(source, f"<test {index}>", "exec", dont_inherit=True), names)
             for index, (kind, source, names) in enumerate(job["units"])]  # fmt: skip
    binds = [frozenset(names) for names in job["binds"]]
    global LINK
    LINK = _Link(job["value_bytes"])
    clock = _Clock(job["test_seconds"])
    sys.path.extend(job["extra_paths"])
    # import solution / from solution import f: the program's names as handles
    sys.modules["solution"] = _Solution("solution")
    describe = _describer()
    if not LINK.wait_ready(time.monotonic() + job["ready_seconds"]):
        os.write(RESULT_FD, b"L\n")
        os._exit(0)
    namespace = {"__name__": "__tests__", "__builtins__": builtins, CASE: _run_case}
    bound: set[str] = set()
    test_number = 0
    for index, (kind, code, names) in enumerate(units):
        wanted = [name for name in names if name not in bound]
        # a failure seen on the link during the unit fails it even if the test caught it
        LINK.tainted = None
        try:
            failure = clock.run(lambda: _run_unit(kind, code, wanted, namespace))  # noqa: B023
        except UnitTimeout as late:  # the alarm fired as the unit ended: it still counts
            failure = late
        failure = failure or LINK.tainted
        where = "setup" if kind == "setup" else f"test {test_number}"
        if failure is not None:
            describe(where, failure)
        elif kind == "test":
            os.write(RESULT_FD, b"P%d\n" % index)
        if kind == "setup":
            bound |= binds[index]
        else:
            test_number += 1
        # the program's process is gone: the remaining units cannot pass
        if LINK.lost:
            os.write(RESULT_FD, b"L\n")
            break
    os._exit(0)


def _run_unit(kind: str, code, names: list[str], namespace: dict) -> None:
    # only names no setup unit bound: a helper of the tests is never the program's
    namespace.update(LINK.resolve(names))
    # A test runs in a copy, so one test's assignments do not reach the next; setup code
    # (imports, helpers) runs in the namespace itself.
    exec(code, namespace if kind == "setup" else dict(namespace))


def _run_case(owner: object, name: str) -> None:
    """Run test method ``name`` of class ``owner``: a ``unittest.TestCase`` through its
    ``debug()`` (setUp, the test, tearDown), any other class as pytest would (an instance,
    ``setup_method``, the method)."""
    import unittest

    if isinstance(owner, type) and issubclass(owner, unittest.TestCase):
        owner(name).debug()
        return
    instance = owner()
    method = getattr(instance, name)
    setup = getattr(instance, "setup_method", None)
    if setup is not None:
        setup(method)
    method()


def _describer():
    def describe(where: str, error: BaseException) -> None:
        try:
            text = f"{where}: {type(error).__name__}: {error}"
        except BaseException:
            text = f"{where}: {type(error).__name__}"
        os.write(2, text[:500].encode("utf-8", "replace") + b"\n")

    return describe


class _Clock:
    """A unit's time: ``SIGALRM`` for the tests' own code; while waiting on the program the
    link watches the same deadline itself (an alarm there only marks it as spent)."""

    def __init__(self, seconds: float) -> None:
        import signal

        self.seconds = seconds
        self.active = False
        self._signal = signal
        signal.signal(signal.SIGALRM, self._on_alarm)

    def _on_alarm(self, signum: int, frame: object) -> None:
        LINK.expired = True
        if self.active and not LINK.waiting:
            raise UnitTimeout

    def run(self, work) -> BaseException | None:
        """``work()`` within the unit's time: ``None`` when it ran to the end, else what
        stopped it."""
        LINK.expired = False
        LINK.deadline = time.monotonic() + self.seconds
        self.active = True
        error: BaseException | None = None
        try:
            self._signal.setitimer(self._signal.ITIMER_REAL, self.seconds)
            work()
        except BaseException as caught:
            error = caught
        self.active = False
        self._signal.setitimer(self._signal.ITIMER_REAL, 0)
        LINK.deadline = float("inf")
        return error


class _Link:
    """Requests to the program's process and its replies; serves its calls of test
    functions while waiting."""

    def __init__(self, limit: int) -> None:
        # the largest reply the program's harness sends, plus room for its framing
        self.limit = limit + (1 << 16)
        self.buffer = b""
        self.requests = 0
        self.deadline = float("inf")
        self.waiting = False
        self.expired = False
        self.lost = False
        self.tainted: BaseException | None = None
        self.functions: dict[str, object] = {}
        self.numbers: dict[int, str] = {}
        self.poller = select.poll()
        self.poller.register(REPLY_FD, select.POLLIN | select.POLLHUP | select.POLLERR)

    # ------------------------------------------------------------ messages

    def _send(self, tree: object) -> None:
        data = memoryview(_wire.dumps(tree))
        try:
            # write(2) may return early (a signal after part of the data): write the rest
            while data:
                data = data[os.write(REQUEST_FD, data):]
        # EPIPE from a closed reader arrives as an error: Python ignores SIGPIPE (signal docs)
        except OSError:
            self._lose("the program's process closed its end")

    def _next_message(self, deadline: float) -> object:
        """The next message from the program, waiting until ``deadline`` (plus grace)."""
        while b"\n" not in self.buffer:
            # grace: the program's own timer fires first and replies "t"
            remaining = deadline + GRACE_SECONDS - time.monotonic()
            if remaining <= 0:
                self._lose("the program's process stopped answering")
            self.waiting = True
            try:
                events = self.poller.poll(remaining * 1000)
            finally:
                self.waiting = False
            if not events:
                continue
            chunk = os.read(REPLY_FD, 1 << 16)
            if not chunk:
                self._lose("the program's process exited")
            self.buffer += chunk
            if len(self.buffer) > self.limit:
                # a flood never grows this process past the limit
                self._lose("the program's process sent more than output_bytes at once")
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            return _wire.loads(line)
        except _wire.WireError as error:
            self._lose(f"the program's process sent a malformed message ({error})")

    def _lose(self, why: str) -> NoReturn:
        self.lost = True
        self.tainted = self.tainted or ProgramLost(why)
        raise ProgramLost(why)

    def wait_ready(self, deadline: float) -> bool:
        try:
            message = self._next_message(deadline)
        except ProgramLost:
            return False
        return message == ["ready"]

    def _exchange(self, request: list) -> list:
        """Send ``request`` (its id is filled in) and wait for its reply."""
        if self.lost:
            raise ProgramLost("the program's process is gone")
        self.requests += 1
        rid = f"j{self.requests}"
        request[1] = rid
        # the program's harness arms its call timer with what is left of this unit
        request.append(repr(max(self.deadline - time.monotonic(), 0.001)))
        self._send(request)
        while True:
            message = self._next_message(self.deadline)
            if not (type(message) is list and len(message) >= 2):
                continue
            if message[0] == "c" and len(message) == 5:
                self._serve_callback(message)
            elif message[1] == rid:
                if self.expired:  # the unit's time ran out while the program answered
                    self.tainted = self.tainted or UnitTimeout()
                    raise UnitTimeout
                return message
            # anything else is a late reply to an abandoned request: dropped

    # ---------------------------------------------------------- requests

    def resolve(self, names: list[str], *, explicit: bool = False) -> dict[str, object]:
        """The program's globals of these names (builtins' names only when ``explicit``:
        a test's ``len`` is always this process's own)."""
        if not explicit:
            # test_patched_builtins_do_not_change_the_strict_equality
            names = [n for n in names if n not in BUILTIN_NAMES and not n.startswith("__")]
        if not names:
            return {}
        reply = self._exchange(["r", "", names])
        values = self._result(reply)
        found = {}
        for pair in values if type(values) is list else ():
            if type(pair) is list and len(pair) == 2 and type(pair[0]) is str:
                try:
                    found[pair[0]] = self.decode(pair[1])
                except _wire.WireError:
                    continue  # a module or object this process cannot import: not visible
        return found

    def operate(self, op: str, target: Remote, args: tuple = (), kwargs: dict | None = None):
        kwargs = kwargs or {}
        encoded = [self.encode(a) for a in args]
        pairs = [[str(k), self.encode(v)] for k, v in kwargs.items()]
        reply = self._exchange(["o", "", op, ["h", target._Remote__number], encoded, pairs])
        value = self._result(reply)
        mutated = reply[3] if len(reply) > 3 and type(reply[3]) is list else []
        for pair in mutated:
            if type(pair) is list and len(pair) == 2 and type(pair[0]) is str:
                key = pair[0]
                original = (args[int(key)] if key.isdigit() and int(key) < len(args)
                            else kwargs.get(key))  # fmt: skip
                _update(original, self.decode(pair[1]))
        return self.decode(value)

    def _result(self, reply: list) -> object:
        kind = reply[0]
        if kind in ("v", "n") and len(reply) >= 3:
            return reply[2]
        if kind == "t":
            self.tainted = self.tainted or UnitTimeout()
            raise UnitTimeout
        if kind == "e" and len(reply) == 4:
            raise self._exception(reply[2], reply[3])
        return self._lose("the program's process sent an unknown reply")

    def _exception(self, names: object, text: object) -> BaseException:
        """The built-in exception the program's exception derives from (by its classes'
        names), raised here for the test to catch; the program's own class stays there."""
        names = [n for n in names if type(n) is str] if type(names) is list else []
        text = text if type(text) is str else ""
        for name in names:
            kind = getattr(builtins, name, None)
            if isinstance(kind, type) and issubclass(kind, BaseException):
                # the program ended its own run inside a call: the unit fails even if caught
                if not issubclass(kind, Exception):  # SystemExit, KeyboardInterrupt, ...
                    self.tainted = self.tainted or ProgramStopped(name)
                    return ProgramStopped(f"the program raised {name}")
                # a class of the program's own: its name is kept, its class stays there
                if kind is Exception and names and names[0] != "Exception":
                    return ProgramError(f"{names[0]}: {text}")
                return kind(text)
        return ProgramError(text)

    def _serve_callback(self, message: list) -> None:
        _, cid, number, args, pairs = message
        function = self.functions.get(number) if type(number) is str else None
        try:
            if function is None:
                raise TypeError("sandbox: no such function of the tests")
            values = [self.decode(a) for a in args] if type(args) is list else []
            named = {p[0]: self.decode(p[1]) for p in pairs
                     if type(p) is list and len(p) == 2 and type(p[0]) is str}  # fmt: skip
            reply = ["v", cid, self.encode(function(*values, **named))]
        except (UnitTimeout, ProgramLost, ProgramStopped):
            raise
        except Exception as error:
            reply = ["e", cid, [kind.__name__ for kind in type(error).__mro__], str(error)]
        self._send(reply)

    # -------------------------------------------------------------- data

    def decode(self, tree: object) -> object:
        return _wire.rebuild(tree, self._reference)

    def _reference(self, tag: str, parts: list) -> object:
        if tag == "h" and len(parts) == 1:
            return Remote(parts[0])
        if tag == "j" and len(parts) == 1 and parts[0] in self.functions:
            return self.functions[parts[0]]
        if tag == "m" and len(parts) == 1:
            return _wire.import_stdlib(parts[0])
        if tag == "q" and len(parts) == 2:
            return _wire.resolve_stdlib(parts[0], parts[1])
        raise _wire.WireError(f"unknown reference {tag!r}")

    def encode(self, value: object, depth: int = 0) -> object:
        if depth > _wire.MAX_DEPTH:
            raise ValueError("sandbox: the argument is too deeply nested")
        kind = type(value)
        for base in _wire.SCALAR_TYPES:
            if isinstance(value, base):
                # a subclass of the tests crosses as its base type's value, never its class
                return _wire.scalar(base(value) if kind is not base and base is not type(None)
                                    else value)  # fmt: skip
        for base, tag in _wire.SEQUENCE_TAGS.items():
            if isinstance(value, base):
                return [tag, [self.encode(item, depth + 1) for item in value]]
        if isinstance(value, dict):
            return ["d", [[self.encode(k, depth + 1), self.encode(v, depth + 1)]
                          for k, v in value.items()]]  # fmt: skip
        if kind is Remote:
            return ["h", value._Remote__number]
        if kind is type(sys) and getattr(value, "__name__", "") in _wire.STDLIB:
            return ["m", value.__name__]
        name = _wire.stdlib_name(value)
        if name is not None:
            return ["q", *name]
        # a function of the tests stays here; the program calls it back by number
        if callable(value):
            number = self.numbers.get(id(value))
            if number is None or self.functions.get(number) is not value:
                number = str(len(self.functions))
                self.functions[number] = value
                self.numbers[id(value)] = number
            return ["j", number]
        raise TypeError(
            f"sandbox: a {kind.__name__} cannot be passed to the program: only plain data "
            "(numbers, strings, bytes, lists, tuples, sets, dicts), functions, "
            "standard-library objects and the program's own objects cross to it"
        )


def _update(original: object, value: object) -> None:
    """Write a mutated argument's new contents into the test's own object."""
    # contents only, never the program's type: the test's object stays its own
    if type(original) is list and type(value) is list:
        original[:] = value
    elif (type(original) is dict and type(value) is dict) or (
        type(original) is set and type(value) in (set, frozenset)
    ):
        original.clear()
        original.update(value)


class Remote:
    """An object of the program, held there; this process sees only what it answers.

    Calls, attribute reads, iteration, ``len``, indexing, ``str`` and ``repr`` are carried
    out in the program's process and answered with plain data (or another handle). Nothing
    that decides a verdict is asked of it: it equals no plain value (two of its objects
    compare as the program says), ordering and arithmetic are not defined, and its truth
    value is refused, so a test must compare what the program returns as data.
    """

    # Name-mangled (_Remote__number) and slotted. Python calls __getattr__ only for names
    # normal lookup misses, so the number and the methods here are never asked of the program.
    __slots__ = ("__number",)

    def __init__(self, number: str) -> None:
        self.__number = number

    def __call__(self, *args: object, **kwargs: object) -> object:
        return LINK.operate("call", self, args, kwargs)

    def __getattr__(self, name: str) -> object:
        # dunder lookups (__class__, __eq__) never ask the program: test_objects_that_lie_score_zero
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return LINK.operate("attr", self, (name,))

    def __iter__(self):
        return LINK.operate("iter", self)

    def __next__(self) -> object:
        return LINK.operate("next", self)

    def __len__(self) -> int:
        length = LINK.operate("len", self)
        # a lying __len__ returning a subclass or anything else: refused
        if type(length) is not int:
            raise TypeError("sandbox: the program's __len__ returned no int")
        return length

    def __getitem__(self, key: object) -> object:
        return LINK.operate("item", self, (key,))

    def __contains__(self, item: object) -> bool:
        # Membership decided here, over the items the program's object yields.
        return any(element is item or element == item for element in iter(self))

    def __str__(self) -> str:
        text = LINK.operate("str", self)
        # an exact str, so no str subclass of the program enters a comparison
        if type(text) is not str:
            raise TypeError("sandbox: the program's __str__ returned no str")
        return text

    def __repr__(self) -> str:
        text = LINK.operate("repr", self)
        return text if type(text) is str else "<object of the program>"

    # a lying __bool__ would pass "assert add(1, 2)": test_objects_that_lie_score_zero
    def __bool__(self) -> bool:
        raise TypeError(
            "sandbox: the truth value of an object of the program is not taken from it; "
            "compare what it returns with a plain value"
        )

    def __eq__(self, other: object) -> bool:
        # Two objects of the program compare as the program says (a test comparing two of
        # them tests the program's own equality); an object of the program never equals
        # plain data or an object of the tests.
        if type(other) is not Remote:
            return False
        return other.__number == self.__number or LINK.operate("eq", self, (other,)) is True

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        # never the program's __hash__: a dict or set of handles stays consistent
        return hash(("remote", self.__number))


class _Solution(type(sys)):
    """``import solution`` / ``from solution import f``: the program's globals by name."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        found = LINK.resolve([name], explicit=True)
        if name not in found:
            raise AttributeError(f"the program defines no {name!r}")
        return found[name]


LINK: _Link


if __name__ == "__main__":
    main()
