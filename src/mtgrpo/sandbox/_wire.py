"""Plain data on the wire between the program's process and the judge's process.

Imported inside the sandbox (from ``/sandbox/harness``) by both the program's harness
(``_harness.py``) and the judge (``_judge.py``); standard library only. One message is one
line of ASCII JSON. Values are tagged so that reading one never evaluates anything and
never builds an object of a type the reader did not choose:

==============================  =========================================================
``null`` / ``true`` / ``false``  None, True, False
``["i", hex]``                   int (any size: hexadecimal has no 4,300-digit limit)
``["f", repr]``                  float (``nan``, ``inf`` included)
``["c", re, im]``                complex
``["u", hex]``                   str (UTF-8, surrogates kept)
``["b", hex]``                   bytes
``["l"|"t"|"s"|"z", [items]]``   list, tuple, set, frozenset
``["d", [[key, value], ...]]``   dict
``["h", n]``                     an object of the program, by number (it stays there)
``["j", n]``                     a function of the tests, by number (it stays in the judge)
``["m", name]``                  a standard-library module, by name
``["q", module, qualname]``      a standard-library object, by module and qualified name
==============================  =========================================================

Bare JSON numbers and strings are refused; depth, node count and scalar sizes are capped.
The program's process sends only this; what the program makes of it is its own business,
because nothing the program sends is more than data: a forged message is no better than
returning that value honestly.
"""

from __future__ import annotations

import json
import marshal
import os
import sys

# a deep or huge message must not exhaust the reader's stack or memory
MAX_DEPTH, MAX_NODES, MAX_SCALAR_CHARS = 100, 1_000_000, 1 << 22
SEQUENCE_TAGS = {list: "l", tuple: "t", set: "s", frozenset: "z"}
SEQUENCE_TYPES = {"l": list, "t": tuple, "s": set, "z": frozenset}
STDLIB = frozenset(sys.stdlib_module_names)


class WireError(ValueError):
    """A message that is not well-formed plain data."""


def _refuse_number(text: str) -> None:
    raise WireError("numbers travel as tagged strings")


def loads(line: bytes) -> object:
    """The JSON tree of one message (not yet rebuilt into values)."""
    try:
        # every number is tagged, so a bare one can only be a forged or broken message
        return json.loads(line, parse_int=_refuse_number, parse_float=_refuse_number,
                          parse_constant=_refuse_number)  # fmt: skip
    # a deeply nested message overflows json's recursion: still just malformed
    except (ValueError, RecursionError) as error:
        raise WireError(f"malformed message: {type(error).__name__}") from None


def dumps(tree: object) -> bytes:
    # json escapes every newline inside a string: one message is exactly one line
    return json.dumps(tree, separators=(",", ":"), ensure_ascii=True).encode("ascii") + b"\n"


def rebuild(node: object, refs) -> object:
    """A value from its tagged tree; ``refs(tag, parts)`` builds handles and references
    (``h``, ``j``, ``m``, ``q``) and raises ``WireError`` for those the reader refuses."""
    return _rebuild(node, refs, 0, [MAX_NODES])


def _rebuild(node: object, refs, depth: int, budget: list[int]) -> object:
    budget[0] -= 1
    if depth > MAX_DEPTH or budget[0] < 0:
        raise WireError("value too deep or too large")
    if node is None or node is True or node is False:
        return node
    if not (type(node) is list and node and type(node[0]) is str):
        raise WireError("malformed value")
    tag, rest = node[0], node[1:]
    if tag in SEQUENCE_TYPES and len(rest) == 1 and type(rest[0]) is list:
        return SEQUENCE_TYPES[tag](_rebuild(item, refs, depth + 1, budget) for item in rest[0])
    if tag == "d" and len(rest) == 1 and type(rest[0]) is list:
        result = {}
        for pair in rest[0]:
            if not (type(pair) is list and len(pair) == 2):
                raise WireError("malformed dict")
            key = _rebuild(pair[0], refs, depth + 1, budget)
            result[key] = _rebuild(pair[1], refs, depth + 1, budget)
        return result
    if not all(type(part) is str and len(part) <= MAX_SCALAR_CHARS for part in rest):
        raise WireError("malformed scalar")
    try:
        if tag == "i" and len(rest) == 1:
            return int(rest[0], 16)
        # a float's repr is short; the cap keeps float() from parsing megabytes
        if tag == "f" and len(rest) == 1 and len(rest[0]) <= 64:
            return float(rest[0])
        if tag == "c" and len(rest) == 2 and max(map(len, rest)) <= 64:
            return complex(float(rest[0]), float(rest[1]))
        if tag == "b" and len(rest) == 1:
            return bytes.fromhex(rest[0])
        if tag == "u" and len(rest) == 1:
            # surrogates round-trip: str values arrive exactly as the program made them
            return bytes.fromhex(rest[0]).decode("utf-8", "surrogatepass")
    except (ValueError, OverflowError, UnicodeDecodeError):
        raise WireError(f"malformed {tag!r} value") from None
    if tag in ("h", "j", "m", "q"):
        return refs(tag, rest)
    raise WireError(f"unknown value tag {tag!r}")


def scalar(value: object) -> object | None:
    """The tagged tree of an exact scalar type, else ``None``."""
    kind = type(value)
    if value is None or kind is bool:
        return value
    # exact types only: the caller converts subclasses through the base type
    if kind is int:
        # hex: the 4,300-digit limit applies only to decimal conversion
        return ["i", format(value, "x")]
    if kind is float:
        return ["f", repr(value)]
    if kind is complex:
        return ["c", repr(value.real), repr(value.imag)]
    if kind is str:
        return ["u", value.encode("utf-8", "surrogatepass").hex()]
    if kind is bytes:
        return ["b", value.hex()]
    return None


SCALAR_TYPES = (type(None), bool, int, float, complex, str, bytes)


def stdlib_name(value: object) -> tuple[str, str] | None:
    """``(module, qualname)`` when ``value`` is found under that name in a standard-library
    module as imported in this process (the same object), else ``None``."""
    module_name = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if type(module_name) is not str or type(qualname) is not str:
        return None
    # "<locals>" or "<lambda>" cannot be looked up by name
    if module_name.partition(".")[0] not in STDLIB or "<" in qualname:
        return None
    if module_name not in sys.modules:  # only what is loaded already: no import here
        return None
    try:
        found = resolve_stdlib(module_name, qualname)
    except WireError:
        return None
    # a program's object claiming a stdlib name by __module__ is not that object
    return (module_name, qualname) if found is value else None


def resolve_stdlib(module_name: str, qualname: str) -> object:
    """The standard-library object ``module_name.qualname``; ``WireError`` if there is none."""
    module = import_stdlib(module_name)
    target: object = module
    for part in qualname.split("."):
        # no dunder walk (__globals__, __subclasses__) from a standard-library name
        if part.startswith("__") or not part.isidentifier():
            raise WireError(f"{module_name}.{qualname} is not a public name")
        try:
            target = getattr(target, part)
        except AttributeError:
            raise WireError(f"{module_name} has no {qualname}") from None
    return target


def import_stdlib(name: str) -> object:
    if type(name) is not str or name.partition(".")[0] not in STDLIB:
        raise WireError(f"{name!r} is not a standard-library module")
    module = sys.modules.get(name)
    if module is None:
        try:
            module = __import__(name, fromlist=["_"])
        except BaseException as error:  # ImportError, or a module refused in this sandbox
            raise WireError(f"module {name!r} cannot be imported here: {error}") from None
    return module


def read_job(fd: int) -> dict:
    """The harness's job from the launcher: an 8-byte length, then ``marshal`` data (written
    by our own launcher, before anything untrusted runs); ``fd`` is closed afterwards."""

    def exactly(size: int) -> bytes:
        chunks = []
        while size:
            chunk = os.read(fd, min(size, 1 << 20))
            if not chunk:
                raise SystemExit("sandbox: the job was cut short")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    job = marshal.loads(exactly(int.from_bytes(exactly(8), "little")))
    os.close(fd)
    return job
