"""The append-only ``metrics.jsonl`` log."""

from __future__ import annotations

import json
import math
import mmap
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["MetricsWriter", "read_metrics"]


def _jsonable(value: Any) -> Any:
    """Plain JSON values; NaN and ±inf become null (JSON has no NaN)."""
    # Torch and numpy scalars become Python numbers.
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    # json.dumps would otherwise write the bare tokens NaN / Infinity (allow_nan=True by
    # default), which strict JSON readers refuse
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


class MetricsWriter:
    """Appends one JSON object per record to ``path`` and flushes after every line."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Append: a resumed run continues one log (rewind trims it first)
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(_jsonable(record), ensure_ascii=False, sort_keys=False)
        self._file.write(line + "\n")
        self._file.flush()  # a crash loses at most the line being written

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())  # on disk before close returns, not only in the OS cache
            self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def rewind(path: str | Path, step: int) -> Path | None:
        """Keep records with ``step <= step`` in ``path``; move the rest to a side file.

        Used on resume: the interrupted run may have logged steps after its last checkpoint,
        which the resumed run logs again. Those lines are kept (never deleted) in
        ``<log>.after-step-<step>.<time>.jsonl`` beside the log. Returns that file, if any.

        A log is written in step order, so the lines to move are its tail: it is found by
        reading from the end (a completions log of many GB costs only its tail), copied to the
        side file and flushed to disk, and the log is then truncated, one system call: a crash
        in between leaves the lines in both files, never in neither.
        """
        path = Path(path)
        if not path.exists():
            return None
        cut, size = _kept_end(path, step), path.stat().st_size
        if cut >= size:
            return None
        # A timestamp: a later resume at the same step keeps this side file.
        side = path.with_name(f"{path.stem}.after-step-{step}.{int(time.time())}.jsonl")
        with path.open("rb") as source, side.open("wb") as target:
            source.seek(cut)
            tail = source.read()
            target.write(tail if tail.endswith(b"\n") else tail + b"\n")  # a cut last line
            target.flush()
            os.fsync(target.fileno())
        os.truncate(path, cut)
        return side


def _kept_end(path: Path, step: int) -> int:
    """The byte offset after the last line to keep: the last line, scanning from the end, that
    holds a record with ``step <= step`` (a line that is not JSON, cut by a crash, moves)."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) \
            as view:
        end = cut = size  # the current line is view[start:end]; lines from `cut` on move
        while True:
            start = view.rfind(b"\n", 0, end) + 1  # 0: the first line
            line = view[start:end]
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError:  # a cut line (JSONDecodeError), or bytes that are not UTF-8
                    record = None
                if isinstance(record, dict) and record.get("step", 0) <= step:
                    return cut
            cut = start
            if start == 0:
                return 0
            end = start - 1  # before the newline that ends the previous line


def read_metrics(path: str | Path, split: str | None = None) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl`` (or a run directory), optionally of one split."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics log at {str(path)!r}; is this a run directory?")
    return [r for r in _records(path) if split is None or r.get("split") == split]


def _records(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue  # a final line cut by a crash
