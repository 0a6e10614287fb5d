"""Progress of the long waits (warm start, GRPO steps, evaluation), in a terminal and in a log.

One decision, made here for every phase: in a terminal, a rich bar (count, elapsed, ETA and a
status such as the loss); off a terminal (output piped to a file, a CI log) rich would draw the
bar once, at the end, cut to the width, so plain lines are printed instead::

    [train] 40/200 steps  elapsed 0:01:02  eta 0:04:08  train batch: worst 12.5% ...

one after the first unit of work (so the log shows the pace early), then one every
``MTGRPO_PROGRESS_SECONDS`` seconds (default 30), and one when the phase ends (the only one of a
phase done in one unit, such as a short evaluation). Both go to the
output rich's own console writes to (stdout), where the log lines and the summary go.

Phases nest: one opened inside another (the trainer's periodic evaluation inside the GRPO bar)
adds a row to the enclosing bar, as rich allows one live display at a time; it is quiet when the
enclosing phase is disabled (non-main processes, ``disable_tqdm``); and the summary it ends with
is handed to the enclosing phase (:attr:`Phase.last_child_summary`), e.g. the last evaluation's
worst task next to the training batch's.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["DEFAULT_INTERVAL_S", "Phase", "accuracy_status", "format_seconds", "progress",
           "use_bar"]

DEFAULT_INTERVAL_S = 30.0
INTERVAL_ENV = "MTGRPO_PROGRESS_SECONDS"

_open: list[Phase] = []  # the phases now open, outermost first


def use_bar(console: Any = None) -> bool:
    """True when progress is drawn as a live bar: ``console`` (rich's global one by default)
    writes to a terminal. rich's own rules apply (``FORCE_COLOR``, ``TTY_COMPATIBLE``...)."""
    if console is None:
        from rich import get_console

        console = get_console()
    # rich's is_dumb_terminal: TERM=dumb or unknown, where a bar cannot be redrawn in place
    return bool(console.is_terminal) and not console.is_dumb_terminal


def format_seconds(seconds: float) -> str:
    """``0:01:02``; ``-`` when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "-"
    whole = round(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def accuracy_status(label: str, worst: Any, worst_task: Any, average: Any) -> str:
    """``"train batch: worst 12.5% (countdown:3x9) avg 40.0%"``: what a status says of an
    accuracy, with ``label`` naming what was measured (NaN / None shows as ``-``)."""

    def percent(value: Any) -> str:
        return "-" if not isinstance(value, float) or math.isnan(value) else f"{100 * value:.1f}%"

    return f"{label}: worst {percent(worst)} ({worst_task or '-'}) avg {percent(average)}"


def _interval() -> float:
    text = os.environ.get(INTERVAL_ENV)
    if not text:
        return DEFAULT_INTERVAL_S
    try:
        return max(0.0, float(text))
    except ValueError as error:
        raise ValueError(f"{INTERVAL_ENV}={text!r} is not a number of seconds") from error


class Phase:
    """One phase's progress: :meth:`update` it as work completes; see the module docstring.

    ``summary``, set before the phase ends, is its last plain line's status and becomes the
    enclosing phase's ``last_child_summary``.
    """

    def __init__(self, name: str, total: int, completed: int, unit: str, *, enabled: bool,
                 console: Any, clock: Callable[[], float], interval: float,
                 parent: Phase | None) -> None:
        self.name, self.total, self.completed, self.unit = name, total, completed, unit
        self.enabled, self.console, self.clock, self.interval = enabled, console, clock, interval
        self.parent, self.status, self.summary = parent, "", ""
        self.last_child_summary = ""  # what the last phase opened inside this one ended with
        self.bar: Any = None  # the rich Progress drawing this phase (None: plain lines or off)
        self._task: Any = None
        self._owns_bar = False
        self._start, self._start_completed = clock(), completed
        self._last_line: float | None = None

    # ----------------------------------------------------------------------- public
    def update(self, completed: int | None = None, *, advance: int = 0,
               status: str | None = None) -> None:
        """Set the count (or ``advance`` it) and the status text shown after the ETA."""
        self.completed = (self.completed if completed is None else completed) + advance
        if status is not None:
            self.status = status
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(self._task, completed=self.completed, status=self.status)
            return
        now = self.clock()
        due = self._last_line is None or now - self._last_line >= self.interval
        if due and self.completed < self.total:  # the end has a line of its own
            self._print_line(now)

    def line(self, now: float | None = None) -> str:
        """The plain line: ``[name] done/total unit  elapsed …  eta …  status``."""
        now = self.clock() if now is None else now
        elapsed = now - self._start
        done = self.completed - self._start_completed
        # the pace of this run only: units already done when the phase opened (a resumed run's
        # steps) took none of the elapsed time
        eta = elapsed / done * (self.total - self.completed) if done > 0 else math.nan
        text = (f"[{self.name}] {self.completed}/{self.total} {self.unit}  elapsed "
                f"{format_seconds(elapsed)}  eta {format_seconds(eta)}")
        return f"{text}  {self.status}".rstrip()

    # ----------------------------------------------------------------------- internals
    def _print_line(self, now: float) -> None:
        self._last_line = now
        # flushed: Python block-buffers stdout that is not a terminal (sys.stdout's docs), and a
        # log must show each line when it is printed
        print(self.line(now), file=self.console.file, flush=True)

    def _open_bar(self) -> None:
        enclosing = self.parent.bar if self.parent is not None else None
        if enclosing is None:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            enclosing = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                TextColumn("{task.fields[status]}"), console=self.console,
            )
            enclosing.start()
            self._owns_bar = True
        self.bar = enclosing
        self._task = enclosing.add_task(self.name, total=self.total, completed=self.completed,
                                        status=self.status)

    def _close(self) -> None:
        if self.parent is not None and self.summary:
            self.parent.last_child_summary = self.summary
        if not self.enabled:
            return
        if self.bar is None:
            if self.summary:
                self.status = self.summary
            self._print_line(self.clock())
        elif self._owns_bar:
            # the final count first: the last frame drawn before stop() stays on the screen
            self.bar.update(self._task, completed=self.completed, status=self.status)
            self.bar.stop()
        else:  # a row of the enclosing bar: it goes, the enclosing bar stays
            self.bar.remove_task(self._task)


@contextmanager
def progress(name: str, total: int, *, completed: int = 0, unit: str = "steps",
             enabled: bool = True, console: Any = None, clock: Callable[[], float] | None = None,
             interval: float | None = None, bar: bool | None = None) -> Iterator[Phase]:
    """Show the progress of one phase of ``total`` units while the block runs.

    ``enabled=False`` shows nothing (and nothing of the phases opened inside). ``console``
    (default: rich's global console), ``clock`` (default ``time.monotonic``), ``interval``
    (seconds between plain lines; default ``MTGRPO_PROGRESS_SECONDS`` or 30) and ``bar``
    (default :func:`use_bar`) are there to be chosen by tests.
    """
    if console is None:
        from rich import get_console

        console = get_console()
    parent = _open[-1] if _open else None
    # a phase inside a quiet one is quiet too: non-main processes print nothing at all
    shown = enabled and (parent is None or parent.enabled)
    phase = Phase(name, total, completed, unit, enabled=shown, console=console,
                  clock=clock or time.monotonic,
                  interval=_interval() if interval is None else interval, parent=parent)
    if shown and (use_bar(console) if bar is None else bar):
        phase._open_bar()
    _open.append(phase)
    try:
        yield phase
    finally:
        _open.remove(phase)
        phase._close()
