"""The GRPO progress: step, ETA, the training batch's worst task and average, and the last
evaluation's (a live bar in a terminal, plain periodic lines in a log: :mod:`mtgrpo._progress`).

The two accuracies are labelled because they measure different things: ``train batch`` is the
share of correct completions among the ones just sampled for training (a few prompts per task,
at the training temperature), ``eval`` the held-out set's at the last evaluation; a task can be
the worst of a batch while the evaluation ranks it best.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any

from mtgrpo._progress import Phase, accuracy_status, progress

__all__ = ["TrainingProgress"]


class TrainingProgress:
    """The GRPO phase's progress (shows nothing when ``enabled`` is False, e.g. on non-main
    processes; evaluations run inside it are then quiet too)."""

    def __init__(self, total: int, completed: int = 0, *, enabled: bool = True) -> None:
        self.total, self.completed, self.enabled = total, completed, enabled
        self._stack = ExitStack()
        self._phase: Phase | None = None

    def __enter__(self) -> TrainingProgress:
        self._phase = self._stack.enter_context(
            progress("train", self.total, completed=self.completed, enabled=self.enabled))
        return self

    def advance(self, step: int, metrics: Mapping[str, Any]) -> None:
        if self._phase is None:
            return
        parts = [accuracy_status("train batch", metrics.get("accuracy/worst"),
                                 metrics.get("accuracy/worst_task"),
                                 metrics.get("accuracy/average"))]
        if self._phase.last_child_summary:  # set by the evaluation run inside this phase
            parts.append(self._phase.last_child_summary)
        parts.append(f"{metrics.get('time/step', math.nan):.1f}s/step")
        self._phase.update(step, status="  ".join(parts))

    def __exit__(self, *exc: object) -> None:
        self._phase = None
        self._stack.__exit__(*exc)
