"""Scoring model text without letting it stop training: per-completion guards, counted.

Model output is hostile input, and a verifier is code with bugs and limits of its own. A
built-in reward function therefore scores each completion through :func:`score_each`: an
exception raised while scoring one completion (a parser bug, a pathological text, a resource
limit) gives that completion the fallback score (0.0) and is counted against the function.
The reward suite collects the counts per call (:func:`collect_scoring_errors`) and the
trainer logs them as ``rewards/<name>/errors``, so a verifier that starts failing is visible
rather than silent.

Only the built-in verifiers and the task-suite rewards use this. A reward function you write
does not: when it raises, scoring stops with the function's name, the row and the task (a
bug in your own function should fail loudly), see :mod:`mtgrpo.rewards.evaluation`.
Configuration errors (a missing column, a malformed test) are raised before any per-sample
work and are not caught here either. Counting works for synchronous functions (the built-in
ones); the count is per call, so threads a function starts internally must report through
the calling thread (``code_reward`` does).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

__all__ = ["collect_scoring_errors", "note_scoring_error", "score_each"]

T = TypeVar("T")
S = TypeVar("S")
logger = logging.getLogger(__name__)
# a verifier failing on every sample must not flood the log; counts go on
_WARNINGS_PER_FUNCTION = 3
# per thread and per async task: concurrent calls cannot mix their rows
_FAILED_ROWS: ContextVar[list[int] | None] = ContextVar("mtgrpo_failed_rows", default=None)
_warned: dict[str, int] = {}  # process-wide, so the warning cap spans calls


def score_each(
    function: str,
    items: Iterable[T],
    score: Callable[[T], S],
    *,
    fallback: S | float = 0.0,
    passthrough: tuple[type[BaseException], ...] = (),
) -> list[S | float]:
    """``[score(item) for item in items]``, where an exception on one item gives ``fallback``
    and is counted (:func:`note_scoring_error`). Exceptions of the ``passthrough`` types
    (configuration errors found while scoring) propagate."""
    scores: list[S | float] = []
    for row, item in enumerate(items):
        try:
            scores.append(score(item))
        # configuration errors must stop the run, not score 0
        except passthrough:
            raise
        # model output is hostile input: one text must not stop training. Exception only, so
        # RewardTimeout and KeyboardInterrupt still end the call
        except Exception as error:
            note_scoring_error(function, row, error)
            scores.append(fallback)
    return scores


def note_scoring_error(function: str, row: int, error: BaseException) -> None:
    """Count that scoring row ``row`` of the current call failed with ``error``."""
    rows = _FAILED_ROWS.get()
    if rows is not None:  # None outside collect_scoring_errors: nobody is counting
        rows.append(row)
    seen = _warned.get(function, 0)
    if seen < _WARNINGS_PER_FUNCTION:
        _warned[function] = seen + 1
        logger.warning(
            "%s raised %s on a completion (row %d of the call); it scores 0 and is counted in "
            # [:300]: an error may quote a whole hostile completion
            "rewards/<name>/errors%s", function, f"{type(error).__name__}: {error}"[:300], row,
            " (further errors of this function are counted silently)"
            if seen + 1 == _WARNINGS_PER_FUNCTION else "",
        )  # fmt: skip


@contextlib.contextmanager
def collect_scoring_errors() -> Iterator[list[Any]]:
    """Within the block, rows whose scoring failed are appended to the yielded list
    (row numbers relative to the call, as the function saw them)."""
    rows: list[int] = []
    token = _FAILED_ROWS.set(rows)
    try:
        yield rows
    finally:
        _FAILED_ROWS.reset(token)
