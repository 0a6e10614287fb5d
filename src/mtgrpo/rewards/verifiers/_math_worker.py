"""Helper process of :mod:`mtgrpo.rewards.verifiers.math` for checks off the main thread.

Protocol (one request at a time): after start-up it prints ``ready``; then for each JSON
line ``{"gold", "answer", "timeout"}`` on stdin it prints ``1`` or ``0``. Each check runs in
this process's main thread under the same signal timer as in-process checks; the parent
kills the process if a reply is late (a computation stuck in C code).
"""

from __future__ import annotations

import json
import resource
import sys

from mtgrpo.rewards.verifiers.math import (
    WORKER_MEMORY_BYTES,
    _Deadline,
    _verify,
    _warm_up,
    _with_deadline,
)


def serve() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    _warm_up()  # import math-verify and build its parsers before announcing readiness
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            gold, answer = str(request["gold"]), str(request["answer"])
            ok = _with_deadline(lambda: _verify(gold, answer), float(request["timeout"]))  # noqa: B023
        except (_Deadline, Exception):  # a check that cannot complete is a wrong answer
            ok = False
        sys.stdout.write("1\n" if ok else "0\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
