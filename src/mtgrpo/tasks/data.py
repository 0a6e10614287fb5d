"""Loading user datasets into one representation: a list of row dicts.

:func:`load_rows` accepts a local file (JSONL, JSON, parquet, CSV), a Hugging Face
``datasets.Dataset`` / ``DatasetDict``, a list of dicts, a mapping of split name to a
list of dicts, or any iterable of row mappings (e.g. a :class:`~mtgrpo.tasks.suite.SuiteSplit`),
and returns ``list[dict]``: plain, picklable, indexable, and what the samplers address by
prompt id. (``datasets.Dataset.from_list(rows)`` converts back when a library wants one.)

Every returned row has a ``task`` key: the value of ``task_column``, renamed to ``task``
when the column has another name. Other columns are kept as they are; a TRL-style
dataset also needs ``prompt``, and the rows of our suites follow the schema of
:mod:`mtgrpo.tasks.suite` (``id``, ``task``, ``prompt``, ``answer``, ``metadata``,
``split``). A user task is such a dataset plus a reward function or a routing table
``{task: [reward_fn]}`` for :mod:`mtgrpo.rewards`.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["FILE_SUFFIXES", "load_rows", "write_jsonl_splits"]

FILE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".pq", ".csv")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    # Bytes, so that a bad encoding is reported with its line number.
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{path}:{number} is not UTF-8 (byte {error.start} of the line); JSONL is "
                    "UTF-8 text: re-encode the file (e.g. iconv -f latin1 -t utf-8)"
                ) from None
            if not line.strip():  # blank lines (a trailing newline) are not rows
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{path}:{number} is not valid JSON ({error}); JSONL wants one object per line"
                ) from error
    return rows


def _read_file(path: Path) -> Any:
    try:
        return _read_by_suffix(path)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text (byte {error.start}): re-encode the file "
                         "as UTF-8") from None  # fmt: skip


def _read_by_suffix(path: Path) -> Any:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return _read_jsonl(path)
    if suffix == ".json":
        with path.open(encoding="utf-8") as handle:
            return json.load(handle)
    if suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if suffix == ".csv":
        # As the csv module requires: a quoted field may hold a newline.
        with path.open(encoding="utf-8", newline="") as handle:
            return list(csv.DictReader(handle))  # every CSV value is a string
    raise ValueError(
        f"cannot load {str(path)!r}: unsupported file type {suffix!r}; "
        f"supported: {', '.join(FILE_SUFFIXES)}"
    )


def _select_split(splits: Mapping[str, Any], split: str | None, what: str) -> Any:
    names = list(splits)
    if split is None:
        if len(names) == 1:
            return splits[names[0]]
        raise ValueError(f"{what} has splits {names}; pass split= to choose one")
    if split not in splits:
        raise ValueError(f"{what} has no split {split!r}; available splits: {names}")
    return splits[split]


def _from_mapping(data: Mapping[str, Any], split: str | None) -> tuple[Any, bool]:
    """A dict of splits (values: lists of rows) or of columns (values: equal-length lists)."""
    values = list(data.values())
    if values and all(
        isinstance(v, list) and all(isinstance(r, Mapping) for r in v) for v in values
    ):
        return _select_split(data, split, "the data"), True
    lengths = {len(v) for v in values if isinstance(v, list)}
    if values and len(lengths) == 1 and all(isinstance(v, list) for v in values):
        columns = list(data)
        return [dict(zip(columns, row, strict=True)) for row in zip(*values, strict=True)], False
    raise ValueError(
        "a mapping of data must map split names to lists of rows, or column names to "
        f"equal-length lists; got keys {list(data)[:10]}"
    )


def _materialize(source: Any, split: str | None) -> tuple[list[Any], bool]:
    """Raw rows, and whether ``split`` was already used to choose a split."""
    if isinstance(source, str | os.PathLike):
        path = Path(source).expanduser()
        if not path.is_file():
            raise ValueError(
                f"no such file: {str(path)!r} (supported types: {', '.join(FILE_SUFFIXES)})"
            )
        source = _read_file(path)
    module = type(source).__module__ or ""
    if module.startswith("datasets"):  # duck-typed: datasets is never imported here
        # A DatasetDict's column_names is a dict by split.
        if hasattr(source, "column_names") and isinstance(source.column_names, dict):
            source = _select_split(source, split, "the DatasetDict")
            return list(source.to_list() if hasattr(source, "to_list") else source), True
        return list(source.to_list() if hasattr(source, "to_list") else source), False
    if isinstance(source, Mapping):
        rows, used = _from_mapping(source, split)
        return list(rows), used
    # Bytes iterate as ints, not rows.
    if isinstance(source, Iterable) and not isinstance(source, str | bytes):
        return list(source), False
    raise TypeError(
        "load_rows takes a file path (JSONL/JSON/parquet/CSV), a datasets.Dataset or "
        f"DatasetDict, a list of dicts, or a mapping of splits; got {type(source).__name__}"
    )


def load_rows(
    source: Any,
    split: str | None = None,
    task_column: str = "task",
    default_task: str | None = None,
) -> list[dict[str, Any]]:
    """Rows of ``source`` as a list of dicts, each with a ``task`` key.

    ``split`` chooses a split of a ``DatasetDict`` or of a mapping of splits; for any
    other source it keeps the rows whose ``split`` column equals it. ``task_column`` names
    the column holding the task id (renamed to ``task``). With ``default_task``, rows of a
    source where *no* row has the task column all get that task (a single-task dataset, as
    TRL's); a column present on some rows only is still an error. Raises ``ValueError`` when
    the task column is missing (naming the columns present), a task id is not a non-empty
    string, or there are no rows.
    """
    raw, split_used = _materialize(source, split)
    rows: list[dict[str, Any]] = []
    for number, row in enumerate(raw):
        if not isinstance(row, Mapping):
            raise TypeError(
                f"row {number} is a {type(row).__name__}; every row must be a mapping of columns"
            )
        rows.append(dict(row))
    if split is not None and not split_used:
        if rows and not all("split" in row for row in rows):
            raise ValueError(
                f"split={split!r} selects rows by their 'split' column, which these rows lack; "
                "drop split= or add the column"
            )
        rows = [row for row in rows if row["split"] == split]
    if not rows:
        raise ValueError(f"no rows loaded from {type(source).__name__} (split={split!r})")
    if default_task is not None and not any(task_column in row for row in rows):
        return [{**row, "task": default_task} for row in rows]
    return [_with_task(row, number, task_column) for number, row in enumerate(rows)]


def _with_task(row: dict[str, Any], number: int, task_column: str) -> dict[str, Any]:
    if task_column not in row:
        hint = ""
        if "data_source" in row:
            hint = (
                "; rows with 'data_source' look like the papers' released test sets: load them "
                "with mtgrpo.tasks.load_paper_test_sets"
            )
        raise ValueError(
            f"row {number} has no task column {task_column!r}; columns present: {sorted(row)}. "
            f"Add a '{task_column}' column naming each row's task, or pass task_column= with "
            f"the column that does{hint}"
        )
    task = row.pop(task_column) if task_column != "task" else row["task"]
    if not isinstance(task, str) or not task.strip():
        raise ValueError(f"row {number} has task {task!r}; a task id must be a non-empty string")
    row["task"] = task
    return row


def write_jsonl_splits(
    out_dir: str | os.PathLike[str], splits: Mapping[str, Iterable[Mapping[str, Any]]]
) -> dict[str, Path]:
    """Write each split's rows to ``out_dir/<split>.jsonl`` (UTF-8, one JSON object a line);
    return the paths by split. ``out_dir`` is created if needed."""
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, rows in splits.items():
        path = out / f"{split}.jsonl"
        with path.open("w", encoding="utf-8") as handle:
            # UTF-8 as is (ensure_ascii=False), readable in an editor.
            handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        written[split] = path
    return written
