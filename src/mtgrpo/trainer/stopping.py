"""A clean stop on SIGTERM and SIGINT: finish the step in flight, write a checkpoint, say
where it is and how to resume, and exit with ``128 + signal`` (what a shell reports for a
process the signal ended).

A cluster's preemption, ``kill`` and Ctrl-C all send one of these. The first one asks the
training loop to stop after the current step (whose checkpoint then resumes exactly: the
resumed run equals an uninterrupted one); a second one abandons the step at once
(``KeyboardInterrupt``), keeping the last checkpoint already written. Under several
processes every process stops after the same step: the request is shared at each step's
end. The handlers are installed only while ``train()`` runs in the main thread, and the
previous ones are put back afterwards.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

__all__ = ["StopRequests", "TrainingInterrupted"]

logger = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingInterrupted(SystemExit):
    """Training stopped on a signal after writing a checkpoint; the exit status is
    ``128 + signal``. ``checkpoint`` is the directory to resume from."""

    def __init__(self, signum: int, checkpoint: str | None, message: str) -> None:
        super().__init__(128 + signum)
        self.signum, self.checkpoint, self.message = signum, checkpoint, message

    def __str__(self) -> str:
        return self.message


class StopRequests:
    """``with StopRequests() as stop:`` ... ``stop.requested`` is the first signal's number
    (or ``None``)."""

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequests:
        # Python installs signal handlers from the main thread only (ValueError elsewhere)
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            # None: the old handler was not set from Python and cannot be put back as such
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            raise KeyboardInterrupt(f"{name} again: the step in flight is abandoned")
        self.requested = signum
        logger.warning("%s received: training stops after the step in flight and writes a "
                       "checkpoint; send it again to stop at once", name)  # fmt: skip
