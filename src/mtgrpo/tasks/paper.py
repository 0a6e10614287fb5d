"""The MT-GRPO papers' released test sets: loading, task mapping, and a training guard.

The files (``test_countdown.parquet``, ``test_zebra.parquet``, ``test_arc.parquet``; verl's
layout, 200 rows per level) are read with no code of theirs and converted to the row
schema of :mod:`mtgrpo.tasks.suite`, so that our verifiers score them:

- ``data_source`` ``"<family>-<level>-test"`` becomes the task id: ``countdown-medium-test``
  → ``countdown:medium``, ``zebra-…`` → ``zebra_puzzles:…``, ``arc-…`` → ``arc_1d:…``,
  levels ``easy``, ``medium``, ``hard``, ``very_hard`` (12 tasks);
- ``prompt`` (chat messages holding the papers' plain template; answers in ``\\boxed{}``)
  is kept verbatim, and the metadata says ``answer_format: "boxed"``;
- ``reward_model.ground_truth`` gives the gold answer: the ``target`` string for zebra and
  ARC; for countdown the ``numbers`` and ``target`` go to the metadata (what the verifier
  reads), and since the files hold no solution, ``answer`` is one found by
  :func:`solve_countdown` (exhaustive search; every row of the released set is solvable).

These rows are evaluation data. They carry ``split: "test"`` and metadata
``origin: "mtgrpo-paper-test"``; :func:`is_paper_test_source` recognises them (and their
``data_source`` names), and :func:`ensure_trainable` refuses them as training data.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mtgrpo.tasks.families import FAMILIES, LEVELS
from mtgrpo.tasks.solver import solve_countdown

__all__ = [
    "PAPER_TASK_IDS",
    "PAPER_TEST_ORIGIN",
    "ensure_trainable",
    "is_paper_test_source",
    "load_paper_test_sets",
    "paper_task_id",
]

PAPER_TEST_ORIGIN = "mtgrpo-paper-test"
_PAPER_FAMILIES = {"countdown": "countdown", "zebra": "zebra_puzzles", "arc": "arc_1d"}
_DATA_SOURCE = re.compile(r"^(countdown|zebra|arc)-(easy|medium|hard|very_hard)-test$")
PAPER_TASK_IDS = tuple(
    f"{family}:{level}" for family in _PAPER_FAMILIES.values() for level in LEVELS
)


def paper_task_id(data_source: str) -> str:
    """Our task id of a data_source, e.g. ``countdown-medium-test`` -> ``countdown:medium``."""
    match = _DATA_SOURCE.match(data_source) if isinstance(data_source, str) else None
    if match is None:
        raise ValueError(
            f"unknown paper data_source {data_source!r}; expected '<family>-<level>-test' with "
            f"family in {sorted(_PAPER_FAMILIES)} and level in {list(LEVELS)}"
        )
    return f"{_PAPER_FAMILIES[match.group(1)]}:{match.group(2)}"


def is_paper_test_source(source: str | Mapping[str, Any]) -> bool:
    """Whether ``source`` is the papers' test data.

    ``source`` is a ``data_source`` name (``"countdown-medium-test"``) or a row: a row of
    :func:`load_paper_test_sets` (metadata ``origin``), or a raw row of the released files
    (its ``data_source``).
    """
    if isinstance(source, str):
        return _DATA_SOURCE.match(source) is not None
    if not isinstance(source, Mapping):
        raise TypeError(
            f"expected a data_source string or a row mapping, got {type(source).__name__}"
        )
    data_source = source.get("data_source")
    if isinstance(data_source, str) and _DATA_SOURCE.match(data_source):
        return True
    metadata = source.get("metadata")
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except json.JSONDecodeError:
            return False
    return isinstance(metadata, Mapping) and metadata.get("origin") == PAPER_TEST_ORIGIN


def ensure_trainable(rows: Iterable[Mapping[str, Any]]) -> None:
    """Raise ``ValueError`` if any row is test data (``split == "test"`` or the papers' sets)."""
    for number, row in enumerate(rows):
        if row.get("split") == "test" or is_paper_test_source(row):
            raise ValueError(
                f"row {number} (id {row.get('id')!r}, task {row.get('task')!r}) is test data "
                "(split 'test' or the papers' released test sets); evaluation rows must not be "
                "used for training: pass them as evaluation data instead"
            )


# ------------------------------------------------------------------------------ loading


def _files(path: str | os.PathLike[str]) -> list[Path]:
    root = Path(path).expanduser()
    if root.is_file():
        return [root]
    if root.is_dir():
        files = sorted(root.glob("*.parquet"))
        if files:
            return files
    raise ValueError(
        f"no parquet files at {str(root)!r}; pass the directory of the released test sets "
        "(test_countdown.parquet, test_zebra.parquet, test_arc.parquet) or one of the files"
    )


def _wanted_tasks(tasks: Sequence[str] | None) -> set[str]:
    if tasks is None:
        return set(PAPER_TASK_IDS)
    if isinstance(tasks, str):
        tasks = [tasks]
    wanted = set()
    for task in tasks:
        family, _, level = str(task).partition(":")
        task_id = f"{FAMILIES.canonical(family)}:{level}" if family in FAMILIES else str(task)
        if task_id not in PAPER_TASK_IDS:
            raise ValueError(
                f"{task!r} is not a task of the papers' test sets; "
                f"valid: {', '.join(PAPER_TASK_IDS)}"
            )
        wanted.add(task_id)
    return wanted


def _convert(raw: Mapping[str, Any]) -> dict[str, Any]:
    data_source = str(raw["data_source"])
    task_id = paper_task_id(data_source)
    family, _, level = task_id.partition(":")
    truth = raw["reward_model"]["ground_truth"]
    extra = raw.get("extra_info") or {}
    metadata: dict[str, Any] = {
        "family": family,
        "level": level,
        "answer_format": "boxed",
        "origin": PAPER_TEST_ORIGIN,
        "data_source": data_source,
        "index": extra.get("index"),
        "difficulty": extra.get("difficulty"),
    }
    if family == "countdown":
        numbers = truth["numbers"]
        numbers = [int(n) for n in (numbers.split(",") if isinstance(numbers, str) else numbers)]
        metadata.update(numbers=numbers, target=int(truth["target"]))
        answer = solve_countdown(numbers, metadata["target"]) or ""
    else:
        answer = str(truth["target"])
    prompt = [{"role": str(m["role"]), "content": str(m["content"])} for m in raw["prompt"]]
    return {
        "id": f"paper-test/{data_source}/{extra.get('index')}",
        "task": task_id,
        "prompt": prompt,
        "answer": answer,
        "metadata": json.dumps(metadata, sort_keys=True),
        "split": "test",
    }


def load_paper_test_sets(
    path: str | os.PathLike[str],
    tasks: Sequence[str] | None = None,
    per_task: int | None = None,
) -> list[dict[str, Any]]:
    """Rows of the papers' test sets (row schema of :mod:`mtgrpo.tasks.suite`).

    ``path`` is the directory of the released parquet files or one file; ``tasks`` keeps
    only these task ids (aliases such as ``zebra:hard`` are accepted); ``per_task`` keeps
    the first ``per_task`` rows of each task, in file order.
    """
    import pyarrow.parquet as pq

    wanted = _wanted_tasks(tasks)
    if per_task is not None and (not isinstance(per_task, int) or per_task < 1):
        raise ValueError(f"per_task must be a positive integer or None, got {per_task!r}")
    rows: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    for file in _files(path):
        table = pq.read_table(file)
        if "data_source" not in table.column_names:
            raise ValueError(
                f"{file} has no 'data_source' column (columns: {table.column_names}); it is not "
                "one of the papers' released test sets"
            )
        for raw in table.to_pylist():
            task_id = paper_task_id(str(raw["data_source"]))
            if task_id not in wanted or counts.get(task_id, 0) >= (per_task or float("inf")):
                continue
            counts[task_id] = counts.get(task_id, 0) + 1
            rows.append(_convert(raw))
    missing = sorted(wanted - set(counts))
    if tasks is not None and missing:
        raise ValueError(f"tasks {missing} not found under {str(path)!r}; found: {sorted(counts)}")
    return rows
