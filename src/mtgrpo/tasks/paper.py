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

**Re-asked in a run's formats.** A model trained with other formats (say ``chat`` prompts
and ``<answer>`` tags) is measured on the released *problems* asked the way it was taught:
with ``prompt_format`` and/or ``answer_format``, each row's problem is asked in its family's
own wording for that answer format (:mod:`mtgrpo.tasks.families`), wrapped in that prompt
format, and graded in that answer format. The problem comes from the row: countdown's
``numbers`` and ``target`` from ``reward_model.ground_truth``; for zebra and ARC, the
reasoning-gym question in ``extra_info["question"]`` with the papers' ``\\boxed{}``
instruction put back to reasoning-gym's words. Items, order, ids and gold answers are the
released ones, so scores stay comparable. With ``prompt_format="paper"`` and
``answer_format="boxed"`` the re-asked prompts equal the released ones (countdown and ARC,
every row), except that zebra's instruction reads "put it in" where the release has the typo
"put in in".

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

from mtgrpo.tasks.families import _ARC_TAIL, _ZEBRA_TAIL, FAMILIES, LEVELS, TaskSpec, resolve_task
from mtgrpo.tasks.prompts import Prompt
from mtgrpo.tasks.solver import solve_countdown
from mtgrpo.tasks.suite import RenderOptions

__all__ = [
    "PAPER_TASK_IDS",
    "PAPER_TEST_ORIGIN",
    "ensure_trainable",
    "is_paper_test_source",
    "load_paper_test_sets",
    "nearest_paper_level",
    "paper_task_id",
    "paper_task_of",
]

PAPER_TEST_ORIGIN = "mtgrpo-paper-test"
_PAPER_FAMILIES = {"countdown": "countdown", "zebra": "zebra_puzzles", "arc": "arc_1d"}
_DATA_SOURCE = re.compile(r"^(countdown|zebra|arc)-(easy|medium|hard|very_hard)-test$")
PAPER_TASK_IDS = tuple(
    f"{family}:{level}" for family in _PAPER_FAMILIES.values() for level in LEVELS
)
# The answer instruction the papers wrote into reasoning-gym's zebra and ARC questions (the
# released text, typo included; in every row of test_zebra / test_arc), and reasoning-gym's
# own words it replaced: what the family question builders extend.
_RELEASED_INSTRUCTIONS = {
    "zebra_puzzles": (
        "as your final answer and put in in \\boxed{}, for example: \\boxed{Alice}.",
        _ZEBRA_TAIL,
    ),
    "arc_1d": (
        "Your final answer must be placed in \\boxed{} and should be just the test output grid "
        "itself.",
        _ARC_TAIL,
    ),
}


def paper_task_id(data_source: str) -> str:
    """Our task id of a data_source, e.g. ``countdown-medium-test`` -> ``countdown:medium``."""
    match = _DATA_SOURCE.match(data_source) if isinstance(data_source, str) else None
    if match is None:
        raise ValueError(
            f"unknown paper data_source {data_source!r}; expected '<family>-<level>-test' with "
            f"family in {sorted(_PAPER_FAMILIES)} and level in {list(LEVELS)}"
        )
    return f"{_PAPER_FAMILIES[match.group(1)]}:{match.group(2)}"


def paper_task_of(task: str | Mapping[str, Any] | TaskSpec) -> str | None:
    """The papers' task id that ``task`` *is*, else ``None``.

    A task is a papers' level when it is one of the papers' families at one of the four
    levels with that level's config (``countdown:easy``, ``{family: zebra, level: hard}``).
    A task of these families at a config of its own (``{family: countdown, name:
    countdown:3x20, config: {...}}``) is not, whatever its name says.
    """
    spec = resolve_task(task)
    if spec.level is None or f"{spec.family.name}:{spec.level}" not in PAPER_TASK_IDS:
        return None
    level = resolve_task(f"{spec.family.name}:{spec.level}")
    return level.task_id if spec.config == level.config else None


def nearest_paper_level(task: str | Mapping[str, Any] | TaskSpec) -> str | None:
    """The papers' level of ``task``'s family whose config shares the most settings with
    ``task``'s (ties: the easier level); ``None`` for a family without test sets.

    A suggestion for a task at a config of its own: ``countdown`` with 3 numbers up to 20
    shares ``min_numbers``, ``max_numbers``, ``min_value`` and ``min_target`` with
    ``countdown:easy``, and only the last two with ``countdown:medium``.
    """
    spec = resolve_task(task)
    levels = [task_id for task_id in PAPER_TASK_IDS if task_id.startswith(f"{spec.family.name}:")]
    if not levels:
        return None

    def shared(task_id: str) -> int:
        config = resolve_task(task_id).config
        return sum(1 for key, value in spec.config.items() if config.get(key) == value)

    # Max keeps the first of equals: PAPER_TASK_IDS runs easy to very_hard.
    return max(levels, key=shared)


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
        except json.JSONDecodeError:  # metadata that is not JSON cannot carry the papers' origin
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
        # Sorted: the row order is the same on every machine.
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
        # An alias resolves: zebra:hard -> zebra_puzzles:hard.
        task_id = f"{FAMILIES.canonical(family)}:{level}" if family in FAMILIES else str(task)
        if task_id not in PAPER_TASK_IDS:
            raise ValueError(
                f"{task!r} is not a task of the papers' test sets; name one of their "
                f"levels (family:level): {', '.join(PAPER_TASK_IDS)}"
            )
        wanted.add(task_id)
    return wanted


def _metadata(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A row's metadata: family, level, origin, and what the family's verifier reads."""
    data_source = str(raw["data_source"])
    family, _, level = paper_task_id(data_source).partition(":")
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
        truth = raw["reward_model"]["ground_truth"]
        numbers = truth["numbers"]
        numbers = [int(n) for n in (numbers.split(",") if isinstance(numbers, str) else numbers)]
        metadata.update(numbers=numbers, target=int(truth["target"]))
    return metadata


def _reasoning_gym_question(family: str, raw: Mapping[str, Any]) -> str:
    """reasoning-gym's question of a zebra or ARC row: the papers' instruction undone."""
    question = str((raw.get("extra_info") or {}).get("question") or "")
    released, original = _RELEASED_INSTRUCTIONS[family]
    if question.count(released) != 1:
        raise ValueError(
            f"{raw['data_source']} row {(raw.get('extra_info') or {}).get('index')!r}: "
            f"extra_info['question'] does not hold the papers' answer instruction {released!r} "
            "exactly once, so its problem cannot be re-asked in another format; load these rows "
            "without prompt_format and answer_format to use the released prompts as they are"
        )
    return question.replace(released, original)


def _reasked_prompt(
    raw: Mapping[str, Any], metadata: Mapping[str, Any], render: RenderOptions
) -> Prompt:
    """The row's problem asked in its family's wording for ``render``'s formats."""
    family = metadata["family"]
    item: dict[str, Any] = {"metadata": metadata}
    if family in _RELEASED_INSTRUCTIONS:
        item["question"] = _reasoning_gym_question(family, raw)
    return render.prompt(FAMILIES.get(family), item)


def _convert(raw: Mapping[str, Any], render: RenderOptions | None) -> dict[str, Any]:
    metadata = _metadata(raw)
    if metadata["family"] == "countdown":
        # The files hold no solution; every released row is solvable (module docstring)
        answer = solve_countdown(metadata["numbers"], metadata["target"]) or ""
    else:
        answer = str(raw["reward_model"]["ground_truth"]["target"])
    if render is None:
        prompt = [{"role": str(m["role"]), "content": str(m["content"])} for m in raw["prompt"]]
    else:
        prompt = _reasked_prompt(raw, metadata, render)
        # Graded in the format it is re-asked in, not the release's \boxed{}.
        metadata["answer_format"] = render.answer_format
    return {
        "id": f"paper-test/{metadata['data_source']}/{metadata['index']}",
        "task": f"{metadata['family']}:{metadata['level']}",
        "prompt": prompt,
        "answer": answer,
        "metadata": json.dumps(metadata, sort_keys=True),
        "split": "test",
    }


def _render_options(
    prompt_format: str | None,
    answer_format: str | None,
    think_prefix: bool,
    system_prompt: str | None,
) -> RenderOptions | None:
    """How to re-ask the released problems; ``None``: keep the released prompts."""
    if prompt_format is None and answer_format is None:
        if think_prefix or system_prompt is not None:
            raise ValueError(
                "think_prefix and system_prompt apply to re-asked problems; the released "
                "prompts are kept as they are unless prompt_format or answer_format is given "
                "(e.g. prompt_format='paper', answer_format='boxed' for the released layout)"
            )
        return None
    # An unset half takes the release's own: the paper template, \boxed{}.
    return RenderOptions(prompt_format or "paper", answer_format or "boxed", think_prefix,
                         system_prompt)  # fmt: skip


def load_paper_test_sets(
    path: str | os.PathLike[str],
    tasks: Sequence[str] | None = None,
    per_task: int | None = None,
    *,
    prompt_format: str | None = None,
    answer_format: str | None = None,
    think_prefix: bool = False,
    system_prompt: str | None = None,
) -> list[dict[str, Any]]:
    """Rows of the papers' test sets (row schema of :mod:`mtgrpo.tasks.suite`).

    ``path`` is the directory of the released parquet files or one file; ``tasks`` keeps
    only these task ids (aliases such as ``zebra:hard`` are accepted); ``per_task`` keeps
    the first ``per_task`` rows of each task, in file order.

    Prompts: the released ones, verbatim and graded in ``\\boxed{}``, when neither
    ``prompt_format`` nor ``answer_format`` is given. Otherwise each problem is re-asked
    (see the module docstring) in ``prompt_format`` (default ``"paper"``, the released
    layout) with ``answer_format`` (default ``"boxed"``), ``think_prefix`` and
    ``system_prompt`` as in :class:`~mtgrpo.tasks.TaskSuite`, and graded in that answer
    format.
    """
    import pyarrow.parquet as pq

    wanted = _wanted_tasks(tasks)
    render = _render_options(prompt_format, answer_format, think_prefix, system_prompt)
    if per_task is not None and (not isinstance(per_task, int) or per_task < 1):
        raise ValueError(f"per_task must be a positive integer or None, got {per_task!r}")
    rows: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    present: set[str] = set()  # every level the files hold, for the error below
    for file in _files(path):
        table = pq.read_table(file)
        if "data_source" not in table.column_names:
            raise ValueError(
                f"{file} has no 'data_source' column (columns: {table.column_names}); it is not "
                "one of the papers' released test sets"
            )
        for raw in table.to_pylist():
            task_id = paper_task_id(str(raw["data_source"]))
            present.add(task_id)
            if task_id not in wanted or counts.get(task_id, 0) >= (per_task or float("inf")):
                continue
            counts[task_id] = counts.get(task_id, 0) + 1
            rows.append(_convert(raw, render))
    missing = sorted(wanted - set(counts))
    if tasks is not None and missing:
        raise ValueError(f"tasks {missing} not found under {str(path)!r}; the files there hold "
                         f"{sorted(present) or 'no level'}: name one of those, or pass the "
                         "directory that holds the others")
    return rows
