"""The generation worker process: ``python -m mtgrpo.tasks._worker``.

Protocol (standard input and output, binary): every message is an 8-byte big-endian
length followed by that many bytes of pickle. The first message from the parent is its
``sys.path``, answered with ``("ready", pid)``; each further one is a job
``(fn, args)``, answered with ``("started", None)`` once it is unpickled (its modules
imported), then ``("ok", fn(*args))`` or ``("error", "<ExceptionType>: <message>")``
(a job that cannot be unpickled gets the error alone); end of input ends the worker. The worker's
own ``sys.stdout`` goes to standard error, so a generator that prints cannot corrupt the
protocol.

The package's ``__init__`` is imported on the way (numpy, no reasoning-gym): a worker
is ready in a fraction of a second, and imports reasoning-gym with its first item.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from typing import Any

from mtgrpo.tasks.generation import read_message, write_message


def _reply(job: bytes, replies: Any) -> tuple[str, Any]:
    try:
        fn, args = pickle.loads(job)
    except Exception as error:
        return ("error", f"cannot load the job: {type(error).__name__}: {error}")
    # Importing the generator's module is done: the item's time limit starts now.
    write_message(replies, pickle.dumps(("started", None)))
    try:
        return ("ok", fn(*args))
    except Exception as error:
        return ("error", f"{type(error).__name__}: {error}")


def _die_with_parent() -> None:
    """SIGKILL when the trainer's thread that started this process ends, even in the middle
    of a job (end of input only stops an idle worker)."""
    import ctypes

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent ended before the setting took effect
        os._exit(1)


def main() -> None:
    if sys.platform == "linux":
        _die_with_parent()
    # Ctrl-C is the parent's business: it closes its pool, which kills this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    # fd 1 itself to stderr: output written by C code cannot reach the protocol either
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    parent_path = read_message(requests)
    if parent_path is None:
        return
    # first: a module resolves to the same file as in the parent
    sys.path[:0] = [entry for entry in pickle.loads(parent_path) if entry not in sys.path]
    write_message(replies, pickle.dumps(("ready", os.getpid())))
    while (job := read_message(requests)) is not None:
        reply = _reply(job, replies)
        try:
            payload = pickle.dumps(reply)
        except Exception as error:
            payload = pickle.dumps(("error", f"cannot pickle the result: {error}"))
        write_message(replies, payload)


if __name__ == "__main__":
    main()
