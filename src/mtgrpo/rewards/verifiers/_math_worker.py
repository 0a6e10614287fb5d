"""Helper process of :mod:`mtgrpo.rewards.verifiers.math`: checks in parallel, each in a
forked child with its own time limit.

The process imports math-verify once (about a second), prints ``ready``, then reads JSON
lines ``{"id", "gold", "answer", "timeout"}`` on stdin. Each request is checked in a child
forked from this warm process (a few milliseconds, memory shared copy-on-write), at most
``MAX_CHILDREN`` at once; a child runs the check in its own main thread under the same signal
timer as in-process checks and exits with status 10 (equal) or 11 (not equal, or it could
not complete). A child still alive ``GRACE_SECONDS`` past its limit (stuck in C code) is
killed. Each reply is a line ``<id> 1`` or ``<id> 0``. So a batch of hostile answers costs
about its slowest check, not their sum.

It dies with the trainer's thread that started it (``PR_SET_PDEATHSIG``) and its children
die with it, whatever they are doing. End of stdin ends it (and kills its children).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import sys
import time
from collections import deque

from mtgrpo.rewards.verifiers.math import (
    CHECK_MEMORY_BYTES,
    WORKER_MEMORY_BYTES,
    _Deadline,
    _verify,
    _warm_up,
    _with_deadline,
)

GRACE_SECONDS = 1.0
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>; the stdlib has no prctl, hence ctypes
# neither 0 nor Python's 1 for an uncaught error: a crash never reads as equal
EQUAL, NOT_EQUAL = 10, 11


def _die_with_parent(parent: int) -> None:
    # CDLL(None): the C library already loaded in this process
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # the parent died before prctl took effect: no signal will come
    if os.getppid() != parent:
        os._exit(1)


def serve(parent: int, max_children: int) -> None:
    _die_with_parent(parent)
    # a hostile answer must not let sympy take the machine's memory
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    _warm_up()  # import math-verify and build its parsers before announcing readiness
    _reply(b"ready")
    server = os.getpid()
    waiting: deque[dict] = deque()
    running: dict[int, tuple[str, float]] = {}  # pid -> (request id, kill time)
    buffer, open_input = b"", True
    while open_input or waiting or running:
        while waiting and len(running) < max_children:
            request = waiting.popleft()
            # fork: the child starts with math-verify already imported, in a few ms
            pid = os.fork()
            if pid == 0:
                _child(request, server)  # never returns: it ends in os._exit
            running[pid] = (str(request["id"]), time.monotonic() + request["timeout"]
                            + GRACE_SECONDS)  # fmt: skip
        if open_input:
            # poll while children run (they must be reaped), else block on stdin
            ready, _, _ = select.select([0], [], [], 0.01 if running else None)
            if ready:
                # os.read, not sys.stdin: no buffer hiding lines that select() cannot see
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    open_input = False
                    for pid in running:  # the trainer has gone: nothing more to answer
                        os.kill(pid, signal.SIGKILL)
                buffer += chunk
                # the last piece is an unfinished line: kept for the next read
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    waiting.append(_request(line))
        else:
            waiting.clear()  # nobody is left to read the answers
            time.sleep(0.01)
        _reap(running, open_input)


def _request(line: bytes) -> dict:
    try:
        request = json.loads(line)
        return {"id": str(request["id"]), "gold": str(request["gold"]),
                "answer": str(request["answer"]), "timeout": float(request["timeout"])}  # fmt: skip
    except (ValueError, KeyError, TypeError):
        # a malformed line must not crash the server that answers the whole batch
        return {"id": "?", "gold": "", "answer": "", "timeout": 0.0}


def _child(request: dict, server: int) -> None:
    try:
        _die_with_parent(server)
        resource.setrlimit(resource.RLIMIT_AS, (CHECK_MEMORY_BYTES, CHECK_MEMORY_BYTES))
        ok = _with_deadline(lambda: _verify(request["gold"], request["answer"]),
                            request["timeout"])  # fmt: skip
    except (_Deadline, Exception):  # a check that cannot complete is a wrong answer
        ok = False
    except BaseException:  # whatever happened, the child must reach os._exit
        ok = False
    # _exit: no atexit handlers or buffers inherited from the server run twice
    os._exit(EQUAL if ok else NOT_EQUAL)


def _reap(running: dict[int, tuple[str, float]], answer: bool) -> None:
    now = time.monotonic()
    for pid, (_, kill_at) in list(running.items()):
        if now > kill_at:  # stuck in C code, where the signal timer cannot reach it
            os.kill(pid, signal.SIGKILL)
    while running:
        try:
            # WNOHANG: reaping never blocks the loop that reads stdin
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        entry = running.pop(pid, None)
        if entry is not None and answer:  # after end of stdin no one reads replies
            code = os.waitstatus_to_exitcode(status)
            # a killed child's code is negative (-9): never EQUAL
            _reply(f"{entry[0]} {1 if code == EQUAL else 0}".encode())


def _reply(line: bytes) -> None:
    os.write(1, line + b"\n")


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
