"""A time limit on each call of a reward function.

A reward function is code of the user's (or a library's) that the policy's text can steer
into a hang: a regular expression, a parser, a remote judge that never answers. Each call
therefore gets a wall-clock limit (``reward_timeout``, per function where set); a call past
it scores as that function's failure on the rows it was given (not applicable there,
counted in ``rewards/<name>/timeouts``), and training goes on.

How the limit is enforced, by where the call runs:

* **the main thread** (the usual case; reward functions keep running where TRL runs them,
  so ``signal``-based code inside them, such as math-verify's own timeouts, still works): a
  watchdog thread sends ``SIGUSR2`` to the main thread at the deadline, and again every
  :data:`REPEAT_SECONDS` until the call has stopped, and the handler raises
  :class:`RewardTimeout` there. That interrupts Python code, ``time.sleep`` and blocking
  I/O; a computation inside one C call (a pathological regular expression) is interrupted
  when it returns to Python. If ``SIGUSR2`` already has a handler of the program's, the
  thread form below is used instead;
* **another thread**: the call runs in a helper thread that is abandoned at the deadline
  (a Python thread cannot be killed: it goes on in the background, and a warning says so);
* **``async def`` functions**: ``asyncio.wait_for`` cancels the awaitable at the deadline.

:class:`RewardTimeout` derives from ``BaseException``, so a function's ``except Exception``
clause does not swallow it; one that swallows it is interrupted again every
:data:`REPEAT_SECONDS` and its late result is discarded. What no in-process limit can stop
is a function that catches ``BaseException`` around each interrupt in an endless loop:
such code belongs in a process of its own (as the code sandbox and ``math_reward``'s
checks are).
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = [
    "DEFAULT_REWARD_TIMEOUT", "TIMED_OUT", "RewardTimeout", "call_with_deadline", "check_timeout",
    "with_deadline",
]  # fmt: skip

DEFAULT_REWARD_TIMEOUT = 60.0
"""Seconds per call: ample for rule rewards (milliseconds to a few seconds per batch),
short enough that a hung function costs one minute, not the run."""
# how soon a call that swallowed one RewardTimeout gets the next
REPEAT_SECONDS = 0.1
_SIGNAL = signal.SIGUSR2  # not SIGALRM: math-verify's and math_reward's own timers use that one
logger = logging.getLogger(__name__)


class RewardTimeout(BaseException):
    """A reward function's call ran past its time limit."""


def check_timeout(value: Any, where: str) -> float | None:
    """``value`` as a time limit in seconds: a positive number, or ``None`` for no limit."""
    if value is None:
        return None
    # bool is an int: True must not read as one second
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(
            f"{where} must be a positive number of seconds (or None for no limit), got "
            f"{value!r}"
        )
    return None if math.isinf(value) else float(value)  # inf is a way of saying no limit


def call_with_deadline(fn: Callable[[], Any], seconds: float | None) -> tuple[bool, Any]:
    """``(True, fn())`` when the call ends within ``seconds`` (``None``: no limit), else
    ``(False, None)``. Exceptions of ``fn`` propagate."""
    if seconds is None:
        return True, fn()
    # Python runs signal handlers in the main thread only; a program's own SIGUSR2 handler
    # is never replaced
    if threading.current_thread() is threading.main_thread() and _signal_is_free():
        return _in_main_thread(fn, seconds)
    return _in_helper_thread(fn, seconds)


def _signal_is_free() -> bool:
    # our own handler, left from an earlier call, counts as free
    return signal.getsignal(_SIGNAL) in (signal.SIG_DFL, signal.SIG_IGN, _on_signal)


# read by the handler: a signal arriving after the call ended must do nothing
_ARMED: list[bool] = [False]


def _on_signal(signum: int, frame: Any) -> None:
    """Raises in the main thread while a call is armed, every time (a call that swallows
    one is stopped by the next); does nothing otherwise. It stays installed after the first
    call: a signal the watchdog sent just as the call ended may arrive late, and the default
    action of ``SIGUSR2`` would end the process."""
    if _ARMED[0]:
        raise RewardTimeout


def _in_main_thread(fn: Callable[[], Any], seconds: float) -> tuple[bool, Any]:
    finished = threading.Event()

    def watchdog(target: int) -> None:
        if finished.wait(seconds):
            return
        # again and again: a call that swallows one RewardTimeout is hit by the next
        while not finished.is_set():
            # to the main thread: its blocking system call returns EINTR, so sleep and I/O end
            signal.pthread_kill(target, _SIGNAL)
            finished.wait(REPEAT_SECONDS)

    signal.signal(_SIGNAL, _on_signal)  # left installed afterwards: see _on_signal
    thread = threading.Thread(target=watchdog, args=(threading.get_ident(),),
                              name="mtgrpo-reward-deadline", daemon=True)  # fmt: skip
    started = time.monotonic()
    value, ended = None, False
    try:
        try:
            _ARMED[0] = True
            thread.start()
            value = fn()
            ended = True
        finally:
            _ARMED[0] = False
            finished.set()
    except RewardTimeout:
        _ARMED[0] = False  # (the watchdog sends at most one signal per REPEAT_SECONDS)
    if thread.ident is not None:
        thread.join()  # from here on a late signal finds the handler disarmed
    if not ended or time.monotonic() - started > seconds:  # late: it swallowed one and ran on
        return False, None
    return True, value


def _in_helper_thread(fn: Callable[[], Any], seconds: float) -> tuple[bool, Any]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as error:  # handed to the caller
            outcome.append((False, error))

    # daemon: an abandoned call must not keep the process alive at exit
    thread = threading.Thread(target=run, name="mtgrpo-reward-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        logger.warning(
            "a reward function ran past its %.3g s limit off the main thread; its call is "
            "abandoned but keeps running in the background (a thread cannot be stopped)",
            seconds,
        )
        return False, None
    ok, value = outcome[0]
    if not ok:
        raise value  # in the caller's thread, as a main-thread call would raise it
    return True, value


TIMED_OUT = RewardTimeout("the awaitable ran past its time limit")
"""What :func:`with_deadline` returns for an awaitable cancelled at its deadline."""


async def with_deadline(awaitable: Awaitable[Any], seconds: float | None) -> Any:
    """Await ``awaitable``; :data:`TIMED_OUT` when it runs past ``seconds``."""
    if seconds is None:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:  # asyncio's TimeoutError is the builtin one since Python 3.11
        return TIMED_OUT
