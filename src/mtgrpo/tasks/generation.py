"""Parallel item generation in worker processes, with a time limit per item.

reasoning-gym generators are pure Python and CPU bound (a 5×5 zebra puzzle takes about
0.3 s, a 6×6 one more than a second), and at least one of them can loop forever
(``arc_1d`` at large sizes). :class:`GenerationPool` therefore runs each item in a worker
*process*, supervised by a thread of the calling process that waits at most
``item_timeout_s`` for the answer; a worker that overruns is killed and replaced, and the
item's future fails with :class:`ItemTimeoutError`. A generator that raises fails the future
with :class:`ItemFailedError` (the worker survives).

Jobs carry a priority: on-demand requests (priority 0) overtake queued background work
(priority 1), so a caller waiting for one item waits for that item plus at most the
remainder of the items already running.

Workers are fresh interpreters (``python -m mtgrpo.tasks._worker``, started lazily,
about a second each) talking length-prefixed pickles over their standard input and
output, rather than ``multiprocessing`` children: they never re-import the caller's
``__main__``, so a training script needs no ``if __name__ == "__main__"`` guard, and
forking a process that holds threads or a CUDA context is avoided. Generators and their
arguments are pickled by reference, so a generator must be a module-level function of an
importable module (the worker receives the caller's ``sys.path``).

``workers=0`` generates in the calling thread: no processes, and no time limit.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import pickle
import queue
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, BinaryIO

__all__ = [
    "DEFAULT_ITEM_TIMEOUT_S",
    "GenerationPool",
    "ItemFailedError",
    "ItemTimeoutError",
    "PoolClosedError",
    "default_workers",
    "read_message",
    "write_message",
]

DEFAULT_ITEM_TIMEOUT_S = 120.0  # generous: every built-in level takes well under 2 s per item
_STARTUP_TIMEOUT_S = 120.0  # an interpreter and numpy; never charged to an item
_ON_DEMAND = 0  # PriorityQueue serves the lowest number first: background jobs are 1


class ItemTimeoutError(RuntimeError):
    """An item took longer than the pool's ``item_timeout_s``; its worker was killed."""


class ItemFailedError(RuntimeError):
    """The generator raised; the message carries the remote exception type and text."""


class PoolClosedError(RuntimeError):
    """The pool was closed before the job ran."""


_HEADER_BYTES = 8  # big-endian payload length ahead of each pickle


def write_message(stream: Any, payload: bytes) -> None:
    """Write one length-prefixed message and flush."""
    stream.write(len(payload).to_bytes(_HEADER_BYTES, "big") + payload)
    stream.flush()


def _read_exactly(stream: BinaryIO, count: int) -> bytes | None:
    chunks = []
    while count > 0:
        chunk = stream.read(count)
        # An empty read is a closed pipe (the worker died or was killed): end of stream.
        if not chunk:
            return None
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def read_message(stream: Any) -> bytes | None:
    """Read one length-prefixed message; ``None`` at end of stream."""
    header = _read_exactly(stream, _HEADER_BYTES)
    if header is None:
        return None
    return _read_exactly(stream, int.from_bytes(header, "big"))


def default_workers() -> int:
    """One worker per CPU core, leaving one core to the caller (at least one worker)."""
    return max(1, (os.cpu_count() or 2) - 1)  # cpu_count() is None where it cannot be determined


@dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: Future = field(default_factory=Future)
    claimed: bool = False  # set by the supervisor that takes it; a promoted job is queued twice


class _Worker:
    """One ``python -m mtgrpo.tasks._worker`` child and a thread reading its replies."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mtgrpo.tasks._worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,  # stderr inherited: a generator's prints reach ours
        )
        self.replies: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="mtgrpo-gen-reader", daemon=True)
        self._reader.start()
        # The child imports pickled generators by module name: give it our import path.
        self._send(list(sys.path))
        # Start-up (an interpreter, numpy) is not part of any item's time budget.
        try:
            ready = self.replies.get(timeout=_STARTUP_TIMEOUT_S)
        except queue.Empty:
            ready = None
        if ready is None or ready[0] != "ready":
            self.kill()
            raise RuntimeError(f"the generation worker did not start (reply: {ready!r})")

    def _send(self, message: Any) -> None:
        write_message(self.process.stdin, pickle.dumps(message))

    def _read(self) -> None:
        while True:
            try:
                payload = read_message(self.process.stdout)
            except (OSError, ValueError):  # ValueError: reading a pipe that kill() already closed
                payload = None
            if payload is None:
                self.replies.put(None)
                return
            try:
                self.replies.put(pickle.loads(payload))
            except Exception as error:
                self.replies.put(("error", f"cannot read the worker's reply: {error}"))

    def run(self, job: _Job, timeout_s: float) -> tuple[str, Any] | None:
        """The child's reply, ``None`` on time-out; ``EOFError`` if the child died.

        The time limit counts from the child's "started" signal, so importing the
        generator's module on a worker's first job is not part of any item's budget.
        """
        self._send((job.fn, job.args))
        reply = self._next_reply(_STARTUP_TIMEOUT_S)
        if reply is not None and reply[0] == "started":
            reply = self._next_reply(timeout_s)
        return reply

    def _next_reply(self, timeout_s: float) -> tuple[str, Any] | None:
        try:
            reply = self.replies.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if reply is None:
            raise EOFError(f"worker exited with status {self.process.wait()}")
        return reply

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                stream.close()


# Workers are separate programs: a pool left open must not leave them running after exit
# (an idle worker would notice the closed pipe, one inside a long item would not).
_OPEN_POOLS: weakref.WeakSet[GenerationPool] = weakref.WeakSet()


@atexit.register
def _close_open_pools() -> None:
    for pool in list(_OPEN_POOLS):
        pool.close()


class GenerationPool:
    """A priority queue of generation jobs served by supervised worker processes.

    ``submit(fn, *args, priority=1)`` returns a :class:`concurrent.futures.Future` whose
    result is ``fn(*args)`` computed in a worker, or whose exception is
    :class:`ItemTimeoutError`, :class:`ItemFailedError` or :class:`PoolClosedError`.
    ``promote(future)`` moves a queued job ahead of background work. Use as a context
    manager or call :meth:`close`, which kills the workers at once.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        item_timeout_s: float = DEFAULT_ITEM_TIMEOUT_S,
    ) -> None:
        workers = default_workers() if workers is None else workers
        if not isinstance(workers, int) or workers < 0:
            raise ValueError(
                "workers must be an integer >= 0 (0 = generate in the calling thread), "
                f"got {workers!r}"
            )
        if not item_timeout_s > 0:
            raise ValueError(f"item_timeout_s must be > 0 seconds, got {item_timeout_s!r}")
        self.workers = workers
        self.item_timeout_s = float(item_timeout_s)
        # (priority, sequence, job): the sequence keeps FIFO order within a priority and spares
        # the queue from comparing two _Jobs (not orderable).
        self._queue: queue.PriorityQueue[tuple[int, int, _Job | None]] = queue.PriorityQueue()
        self._sequence = itertools.count()
        self._lock = threading.Lock()
        self._jobs: dict[Future, tuple[int, _Job]] = {}
        self._threads: list[threading.Thread] = []
        self._live: set[_Worker] = set()
        self._closed = False
        self.timeouts = 0
        _OPEN_POOLS.add(self)

    # ------------------------------------------------------------------ public API

    def submit(self, fn: Callable[..., Any], *args: Any, priority: int = 1) -> Future:
        if self._closed:
            raise PoolClosedError("the generation pool is closed; create a new one")
        job = _Job(fn, args)
        if self.workers == 0:
            self._run_inline(job)
            return job.future
        self._start_threads()
        with self._lock:
            self._jobs[job.future] = (priority, job)
        job.future.add_done_callback(self._forget)
        self._queue.put((priority, next(self._sequence), job))
        return job.future

    def promote(self, future: Future) -> None:
        """Queue the job of ``future`` again at on-demand priority (no-op once it runs)."""
        with self._lock:
            entry = self._jobs.get(future)
        if entry is not None and entry[0] > _ON_DEMAND and not entry[1].claimed:
            # The old entry stays queued; whichever copy is taken second is skipped by _claim.
            self._queue.put((_ON_DEMAND, next(self._sequence), entry[1]))

    def close(self) -> None:
        """Stop serving: kill running workers, fail queued jobs with :class:`PoolClosedError`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live = list(self._live)
        for worker in live:
            worker.kill()
        for _ in self._threads:
            # -1 sorts ahead of every job: each supervisor stops at once.
            self._queue.put((-1, next(self._sequence), None))
        for thread in self._threads:
            # bounded: a supervisor stuck on a worker must not hang close()
            thread.join(timeout=10)
        self._drain()

    def __enter__(self) -> GenerationPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---------------------------------------------------------------- internals

    def _forget(self, future: Future) -> None:
        with self._lock:
            self._jobs.pop(future, None)

    def _claim(self, job: _Job) -> bool:
        with self._lock:
            if job.claimed or self._closed:
                return False
            job.claimed = True
            return True

    def _run_inline(self, job: _Job) -> None:
        try:
            job.future.set_result(job.fn(*job.args))
        except Exception as error:
            # As a worker's error, so the suite retries the item alike.
            job.future.set_exception(ItemFailedError(f"{type(error).__name__}: {error}"))

    def _start_threads(self) -> None:
        with self._lock:
            if self._threads:
                return
            for number in range(self.workers):
                thread = threading.Thread(
                    target=self._supervise,
                    name=f"mtgrpo-gen-{number}",
                    daemon=True,  # a supervisor never holds up the interpreter's exit
                )
                self._threads.append(thread)
        for thread in self._threads:
            thread.start()

    def _supervise(self) -> None:
        worker: _Worker | None = None
        while True:
            _, _, job = self._queue.get()  # until a job, or close()'s sentinel
            if job is None:
                break
            if not self._claim(job):
                continue
            if worker is None:
                try:
                    worker = self._spawn()
                except Exception as error:
                    job.future.set_exception(
                        ItemFailedError(f"cannot start a worker process: {error}")
                    )
                    continue
                if worker is None:  # the pool closed while this worker started
                    job.future.set_exception(PoolClosedError("the generation pool was closed"))
                    continue
            worker = self._serve(worker, job)
        if worker is not None:
            self._retire(worker)

    def _spawn(self) -> _Worker | None:
        worker = _Worker()
        with self._lock:
            if self._closed:
                worker.kill()
                return None
            self._live.add(worker)
        return worker

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._live.discard(worker)

    def _serve(self, worker: _Worker, job: _Job) -> _Worker | None:
        """Run one job; returns the worker to keep using, or ``None`` if it was retired."""
        try:
            reply = worker.run(job, self.item_timeout_s)
        except (EOFError, OSError) as error:
            self._retire(worker)
            # close() kills workers mid-item: report that as closure, not as an item to retry.
            closed = self._closed
            failure = (
                PoolClosedError("the generation pool was closed")
                if closed
                else ItemFailedError(
                    f"the generation worker died ({type(error).__name__}: {error})"
                )
            )
            job.future.set_exception(failure)
            return None
        except Exception as error:  # pickling the job failed; the worker is unharmed
            job.future.set_exception(
                TypeError(
                    f"cannot send the job to a worker process (generators must be "
                    f"module-level functions with picklable arguments): {error}"
                )
            )
            return worker
        if reply is None:
            # The generator may loop forever (arc_1d at large sizes): kill it rather than wait.
            self._retire(worker)
            with self._lock:
                self.timeouts += 1
            job.future.set_exception(
                ItemTimeoutError(
                    f"generation took longer than {self.item_timeout_s:g} s; worker killed"
                )
            )
            return None
        status, value = reply
        if status == "ok":
            job.future.set_result(value)
        else:
            job.future.set_exception(ItemFailedError(value))
        return worker

    def _drain(self) -> None:
        while True:
            try:
                _, _, job = self._queue.get_nowait()
            except queue.Empty:
                return
            with self._lock:
                if job is None or job.claimed:
                    continue
                job.claimed = True
            job.future.set_exception(PoolClosedError("the generation pool was closed"))
