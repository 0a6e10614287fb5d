"""The live progress bar: step, ETA, worst-task and average accuracy."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["TrainingProgress"]


def _percent(value: Any) -> str:
    return "  -  " if not isinstance(value, float) or math.isnan(value) else f"{100 * value:5.1f}%"


class TrainingProgress:
    """A rich progress bar (no-op when ``enabled`` is False, e.g. on non-main processes)."""

    def __init__(self, total: int, completed: int = 0, *, enabled: bool = True) -> None:
        self.total, self.completed, self.enabled = total, completed, enabled
        self._progress: Any = None

    def __enter__(self) -> TrainingProgress:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                TextColumn("{task.fields[status]}"),
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(
                "train", total=self.total, completed=self.completed, status=""
            )
        return self

    def advance(self, step: int, metrics: Mapping[str, Any]) -> None:
        if self._progress is None:
            return
        worst = metrics.get("accuracy/worst")
        status = (
            f"worst {_percent(worst)} ({metrics.get('accuracy/worst_task', '-')})  "
            f"avg {_percent(metrics.get('accuracy/average'))}  "
            f"{metrics.get('time/step', math.nan):.1f}s/step"
        )
        self._progress.update(self._task, completed=step, status=status)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
