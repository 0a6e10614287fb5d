"""Task families on reasoning-gym, their difficulty levels, and task specifications.

A *task family* is a record (:class:`TaskFamily`): a reasoning-gym dataset, named
difficulty levels (reasoning-gym configs), a picklable item generator, a question
builder (the family's prompt wording for an answer format) and an answer checker.
A *task* (:class:`TaskSpec`) is one family at one config, named by a task id such as
``countdown:medium``.

Built-in families and levels (the MT-GRPO and SEC papers' suites):

====================  ========  =========  ========  =============
family                easy      medium     hard      very_hard (OOD)
====================  ========  =========  ========  =============
``countdown``         3 numbers 4 numbers  5 numbers 6 numbers
``zebra_puzzles``     3×3       4×4        5×5       6×6
``arc_1d``            length 10 length 20  length 30 length 40
====================  ========  =========  ========  =============

What the level configs are inferred from (the papers' released test sets,
``mtgrpo-paper-test/*.parquet``, 200 rows per level):

- countdown: every row has exactly 3 / 4 / 5 / 6 numbers, all numbers lie in 1..100 and
  targets in 1..1000 (minimum 1, maximum 1000 over the 800 rows; reasoning-gym's default
  target range is 100..999, so the papers widened it). Targets are skewed low (median
  90–130, 5th percentile about 9), which is the distribution of reasoning-gym's
  expression-based generator under ``min_target=1, max_target=1000`` (checked by
  sampling 300 items per level: medians 85–120, 5th percentiles 7–10), not that of
  uniformly drawn targets. Hence ``min_numbers = max_numbers = n, min_value=1,
  max_value=100, min_target=1, max_target=1000``.
- zebra_puzzles: "There are n houses" and n attribute lines in every row of level n, so
  ``num_people = num_characteristics = n`` for n = 3, 4, 5, 6.
- arc_1d: every output grid has exactly 10 / 20 / 30 / 40 cells and every question has
  three worked examples, so ``min_size = max_size = n, num_train=3``.

Question wording follows the released prompts: countdown uses the papers' own sentence
("Using the numbers [8, 73, 96], create an equation that equals 841. …"); zebra and ARC
use reasoning-gym's question with the answer instruction the papers inserted. With the
``boxed`` answer format the questions equal the released ones, except that the zebra
instruction reads "put it in" where the released text has the typo "put in in".

Other reasoning-gym datasets are usable by name with their own config (e.g.
``{"family": "basic_arithmetic", "config": {"min_terms": 2}}``): the question is
reasoning-gym's, followed by the answer instruction; correctness is a normalised exact
match against reasoning-gym's oracle answer. reasoning-gym's own ``score_answer`` is
deliberately never called on model output: several scorers (countdown, puzzle24,
polynomial_multiplication, number_sorting, n_queens, …) pass the text to ``eval`` or
sympy's ``parse_expr``, which evaluates Python.

``arc_1d`` is bounded to sizes ≤ 40: in reasoning-gym 0.1.25 one of its sub-tasks loops
forever when more than 9 colour blocks are needed (seen at sizes 50 and 100).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any

from mtgrpo.algo.registry import Registry
from mtgrpo.tasks.prompts import AnswerFormat

__all__ = [
    "ARC_1D_MAX_SIZE",
    "FAMILIES",
    "LEVELS",
    "MAX_CELL_DIGITS",
    "MAX_GRID_CELLS",
    "AnswerChecker",
    "ItemGenerator",
    "QuestionBuilder",
    "TaskFamily",
    "TaskSpec",
    "get_family",
    "normalize_answer",
    "parse_int_sequence",
    "reasoning_gym_dataset_names",
    "resolve_task",
]

# very_hard: the papers' out-of-distribution level.
LEVELS = ("easy", "medium", "hard", "very_hard")
ARC_1D_MAX_SIZE = 40  # reasoning-gym 0.1.25's arc_1d can loop forever above (seen at 50, 100)

# A generated item is a JSON-safe dict {"question": str, "answer": str, "metadata": dict}.
ItemGenerator = Callable[[str, Mapping[str, Any], int, int, int], dict[str, Any]]
"""``generate(dataset, config, seed, size, index) -> item``; a module-level (picklable)
function, run in generation worker processes. ``size`` is the span of source indices the
split may use (some reasoning-gym datasets draw per-size tables at construction)."""
QuestionBuilder = Callable[[Mapping[str, Any], AnswerFormat], str]
"""``question(item, answer_format) -> str``: the question text, with the answer instruction."""
AnswerChecker = Callable[[str, str, Mapping[str, Any]], bool]
"""``check(extracted_answer, gold_answer, metadata) -> bool``: must not raise on any text."""


@dataclass(frozen=True, eq=False)
class TaskFamily:
    """A family of tasks: one reasoning-gym dataset and how to prompt and check it.

    ``metadata_fields`` are the metadata keys ``check`` reads (a row without them is a
    data error, reported by the reward function). ``content_key(metadata) -> str``
    identifies a *problem* independently of wording and answer format. Families that
    have one are de-duplicated across splits: a training item whose key occurs in the
    evaluation split (or in rows the suite is told to exclude) is replaced (see
    :mod:`mtgrpo.tasks.suite`). Families whose problems are practically unique (zebra
    puzzles: 2,000 sampled 3×3 questions, ARC-1D: 20,000 sampled questions at sizes 10
    and 20, no repeat) leave it ``None``, so their training data never waits for
    evaluation data.
    """

    name: str
    dataset: str
    generate: ItemGenerator
    question: QuestionBuilder
    check: AnswerChecker
    levels: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    validate: Callable[[Mapping[str, Any]], None] | None = None
    content_key: Callable[[Mapping[str, Any]], str] | None = None
    metadata_fields: tuple[str, ...] = ()
    description: str = ""


@dataclass(frozen=True, eq=False)
class TaskSpec:
    """One task: a family at one reasoning-gym config, named by ``task_id``.

    ``config`` holds the reasoning-gym config fields without ``seed`` and ``size``
    (those belong to a split), normalised through JSON so that it equals what the
    cache key and the generation workers see.
    """

    task_id: str
    family: TaskFamily
    level: str | None
    config: Mapping[str, Any]

    @property
    def config_json(self) -> str:
        # Compact and key-sorted: one config, one string, one cache key.
        return json.dumps(self.config, sort_keys=True, separators=(",", ":"))

    @property
    def config_hash(self) -> str:
        return hashlib.sha256(self.config_json.encode()).hexdigest()[:12]


# ---------------------------------------------------------------- reasoning-gym access


def reasoning_gym_dataset_names() -> list[str]:
    """Names of the datasets registered in the installed reasoning-gym."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _config_class(dataset: str) -> type:
    from reasoning_gym.factory import DATASETS

    return DATASETS[dataset][1]


def _to_dataset_config(dataset: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """reasoning-gym config kwargs; the composite dataset wants ``DatasetSpec`` objects."""
    kwargs = dict(config)
    if dataset == "composite" and "datasets" in kwargs:
        from reasoning_gym.composite import DatasetSpec

        kwargs["datasets"] = [
            spec if isinstance(spec, DatasetSpec) else DatasetSpec(**spec)
            for spec in kwargs["datasets"]
        ]
    return kwargs


@lru_cache(maxsize=64)
# Config as a JSON string: hashable, as lru_cache needs.
def _dataset(dataset: str, config_json: str, seed: int, size: int) -> Any:
    from reasoning_gym import create_dataset

    config = _to_dataset_config(dataset, json.loads(config_json))
    return create_dataset(dataset, seed=seed, size=size, **config)


def reasoning_gym_item(
    dataset: str, config: Mapping[str, Any], seed: int, size: int, index: int
) -> dict[str, Any]:
    """reasoning-gym's item ``index`` (seeded by ``seed + index``), as a raw dict.

    Dataset objects are cached per (dataset, config, seed, size) within a process.
    """
    # The form of TaskSpec.config_json: one cached dataset per config.
    config_json = json.dumps(dict(config), sort_keys=True, separators=(",", ":"))
    return _dataset(dataset, config_json, seed, size)[index]


def _json_safe(value: Any) -> Any:
    # Tuples become lists, other non-JSON values their str(): items are stored as JSON.
    return json.loads(json.dumps(value, default=str))


def generic_item(
    dataset: str, config: Mapping[str, Any], seed: int, size: int, index: int
) -> dict[str, Any]:
    """Any reasoning-gym dataset: its question, its oracle answer, its metadata (JSON-safe)."""
    item = reasoning_gym_item(dataset, config, seed, size, index)
    question = str(item["question"])
    return {
        "question": question,
        "answer": str(item["answer"]),
        "metadata": {
            # The content key: one question up to spacing and case is one problem.
            "question_key": hashlib.sha256(normalize_answer(question).encode()).hexdigest(),
            "source_metadata": _json_safe(item.get("metadata", {})),
        },
    }


def _question_key(metadata: Mapping[str, Any]) -> str:
    return str(metadata["question_key"])


def normalize_answer(text: str) -> str:
    """Normalisation for exact matching: strip, collapse whitespace runs, case-fold."""
    return " ".join(text.split()).casefold()


def _exact_match(extracted: str, gold: str, metadata: Mapping[str, Any]) -> bool:
    return normalize_answer(extracted) == normalize_answer(gold)


def _generic_question(item: Mapping[str, Any], answer_format: AnswerFormat) -> str:
    question = str(item["question"]).rstrip()
    return f"{question}\n\nPut your final answer {answer_format.where}."


# ------------------------------------------------------------------------- countdown


def countdown_item(
    dataset: str, config: Mapping[str, Any], seed: int, size: int, index: int
) -> dict[str, Any]:
    """Countdown: numbers, target and a solution expression (the gold answer).

    The solution is reasoning-gym's, unless the verifier refuses it (sympy prints some
    with a leading unary minus, e.g. ``-3 + (53 - 29)/3``); then it is one found by
    :func:`mtgrpo.tasks.solver.solve_countdown`, so that every gold answer scores 1.0.
    """
    from mtgrpo.rewards.verifiers.countdown import countdown_check
    from mtgrpo.tasks.solver import solve_countdown

    item = reasoning_gym_item(dataset, config, seed, size, index)
    numbers = [int(n) for n in item["metadata"]["numbers"]]
    target = int(item["metadata"]["target"])
    answer = str(item["answer"])
    if not countdown_check(answer, numbers, target).correct:
        answer = solve_countdown(numbers, target) or answer
    return {
        "question": item["question"],
        "answer": answer,
        "metadata": {"numbers": numbers, "target": target},
    }


def countdown_question(item: Mapping[str, Any], answer_format: AnswerFormat) -> str:
    """The papers' countdown sentence (numbers shown as a Python list)."""
    numbers = list(item["metadata"]["numbers"])
    target = item["metadata"]["target"]
    return (
        f"Using the numbers {numbers}, create an equation that equals {target}. "
        "You can only use basic arithmetic operations (+, -, *, /) and each number should "
        f"be used exactly once. Return the final answer {answer_format.where}, "
        f"for example {answer_format.example('(1 + 2) / 3')}."
    )


def countdown_correct(extracted: str, gold: str, metadata: Mapping[str, Any]) -> bool:
    """Correct iff the expression uses each given number exactly once and equals the target.

    Checked by the safe verifier :func:`mtgrpo.rewards.verifiers.countdown.countdown_check`
    (no ``eval``); the gold expression is not needed, any valid solution counts.
    """
    from mtgrpo.rewards.verifiers.countdown import countdown_check

    numbers = [int(n) for n in metadata["numbers"]]
    return bool(
        # The papers' rule: each given number exactly once.
        countdown_check(extracted, numbers, metadata["target"], use_all_numbers=True).correct
    )


def countdown_key(metadata: Mapping[str, Any]) -> str:
    """The same numbers (in any order) and target are the same problem."""
    return f"{sorted(int(n) for n in metadata['numbers'])}->{metadata['target']}"


def _countdown_validate(config: Mapping[str, Any]) -> None:
    if "numbers" in config or "target" in config:
        raise ValueError(
            "countdown configs use reasoning-gym's field names: min_numbers/max_numbers and "
            f"min_target/max_target; got {sorted(config)}"
        )


# ---------------------------------------------------------------------- zebra puzzles

# The end of reasoning-gym's zebra question, where the answer instruction goes.
_ZEBRA_TAIL = "as your final answer."


def zebra_item(
    dataset: str, config: Mapping[str, Any], seed: int, size: int, index: int
) -> dict[str, Any]:
    item = reasoning_gym_item(dataset, config, seed, size, index)
    difficulty = item["metadata"]["difficulty"]
    return {
        "question": item["question"],
        "answer": str(item["answer"]),
        "metadata": {
            "num_people": int(difficulty["num_people"]),
            "num_characteristics": int(difficulty["num_characteristics"]),
        },
    }


def zebra_question(item: Mapping[str, Any], answer_format: AnswerFormat) -> str:
    """reasoning-gym's puzzle; its closing instruction extended with where the answer goes.

    reasoning-gym 0.1.25 writes "House 1?? Provide only …"; like the released prompts we
    keep one question mark.
    """
    question = str(item["question"]).replace("?? Provide only", "? Provide only")
    example = answer_format.example("Alice")
    instruction = f"as your final answer and put it {answer_format.where}, for example: {example}."
    if question.endswith(_ZEBRA_TAIL):
        return question[: -len(_ZEBRA_TAIL)] + instruction
    # A question without the expected tail (another reasoning-gym version) still says where.
    return f"{question}\nGive the name {answer_format.where}, for example: {example}."


# ---------------------------------------------------------------------------- ARC 1D

# Reasoning-gym's closing sentence, replaced by the papers' instruction.
_ARC_TAIL = "Your final answer should be just the test output grid itself."
_INT_TOKEN = re.compile(r"-?\d+")
MAX_GRID_CELLS = 10_000  # grids are at most 40 cells (ARC_1D_MAX_SIZE)
MAX_CELL_DIGITS = 100  # cells are colours 0-9
_SEPARATORS = re.compile(r"[\s,]+")  # commas and any whitespace, newlines included


def parse_int_sequence(text: str) -> list[int] | None:
    """A grid written as integers separated by whitespace and/or commas, else ``None``.

    One pair of enclosing square brackets is allowed (``[0, 1, 1]``); any other character
    (words, a second grid marker, digits run together ambiguously) makes it unparseable, and
    so does a grid of more than :data:`MAX_GRID_CELLS` cells or a cell of more than
    :data:`MAX_CELL_DIGITS` digits (model text: bounded work, and never Python's limit on
    converting a 4,301-digit string to an int).
    """
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    # split() leaves "" where the text starts or ends with a separator
    tokens = [token for token in _SEPARATORS.split(body) if token]
    if not tokens or len(tokens) > MAX_GRID_CELLS:
        return None
    # MAX_CELL_DIGITS + 1: room for a minus sign.
    if not all(len(token) <= MAX_CELL_DIGITS + 1 and _INT_TOKEN.fullmatch(token)
               for token in tokens):  # fmt: skip
        return None
    return [int(token) for token in tokens]


def arc_item(
    dataset: str, config: Mapping[str, Any], seed: int, size: int, index: int
) -> dict[str, Any]:
    item = reasoning_gym_item(dataset, config, seed, size, index)
    meta = item["metadata"]
    return {
        "question": item["question"],
        "answer": str(item["answer"]),
        "metadata": {"arc_task": str(meta["task_name"]), "size": int(meta["size"])},
    }


def arc_question(item: Mapping[str, Any], answer_format: AnswerFormat) -> str:
    question = str(item["question"])
    instruction = (
        f"Your final answer must be placed {answer_format.where} and should be just the "
        "test output grid itself."
    )
    if _ARC_TAIL in question:
        return question.replace(_ARC_TAIL, instruction)
    return f"{question}\n\n{instruction}"


def arc_correct(extracted: str, gold: str, metadata: Mapping[str, Any]) -> bool:
    """Correct iff the answer, read as a sequence of integers, equals the gold output grid.

    Tolerant of spacing, newlines, commas and one pair of enclosing brackets; see
    :func:`parse_int_sequence`.
    """
    predicted = parse_int_sequence(extracted)
    # An unparseable answer never matches, even an unparseable gold (None == None)
    return predicted is not None and predicted == parse_int_sequence(gold)


def _arc_validate(config: Mapping[str, Any]) -> None:
    for key in ("min_size", "max_size"):
        value = config.get(key)
        if isinstance(value, int) and value > ARC_1D_MAX_SIZE:
            raise ValueError(
                f"arc_1d {key}={value} exceeds {ARC_1D_MAX_SIZE}: reasoning-gym 0.1.25's arc_1d "
                "generator can loop forever when a grid needs more than 9 colour blocks "
                f"(seen at sizes 50 and 100); use sizes of at most {ARC_1D_MAX_SIZE}"
            )


def _composite_validate(config: Mapping[str, Any]) -> None:
    """A composite mixing ``arc_1d`` is bounded like ``arc_1d`` itself."""
    for member in config.get("datasets") or ():
        if isinstance(member, Mapping) and member.get("name") == "arc_1d":
            _arc_validate(member.get("config") or {})


# -------------------------------------------------------------------------- registry


def _levels(make: Callable[[int], dict[str, Any]], values: tuple[int, ...]) -> dict[str, Any]:
    return {level: make(value) for level, value in zip(LEVELS, values, strict=True)}


FAMILIES: Registry[TaskFamily] = Registry("task family")
FAMILIES.add(
    "countdown",
    TaskFamily(
        name="countdown",
        dataset="countdown",
        generate=countdown_item,
        question=countdown_question,
        check=countdown_correct,
        levels=_levels(
            lambda n: {
                "min_numbers": n,
                "max_numbers": n,
                # The papers' test sets: numbers in 1..100, targets in 1..1000 (module docstring);
                # reasoning-gym's default target range is 100..999.
                "min_value": 1,
                "max_value": 100,
                "min_target": 1,
                "max_target": 1000,
            },
            (3, 4, 5, 6),
        ),
        validate=_countdown_validate,
        content_key=countdown_key,
        metadata_fields=("numbers", "target"),
        description="reach a target with + - * / using each given number once",
    ),
)
FAMILIES.add(
    "zebra_puzzles",
    TaskFamily(
        name="zebra_puzzles",
        dataset="zebra_puzzles",
        generate=zebra_item,
        question=zebra_question,
        check=_exact_match,
        # N houses and n attributes at level n, as in the papers' test sets.
        levels=_levels(lambda n: {"num_people": n, "num_characteristics": n}, (3, 4, 5, 6)),
        description="logic grid puzzle; answer the name of the person in house 1",
    ),
    aliases=("zebra",),
)
FAMILIES.add(
    "arc_1d",
    TaskFamily(
        name="arc_1d",
        dataset="arc_1d",
        generate=arc_item,
        question=arc_question,
        check=arc_correct,
        # Every test-set grid has exactly n cells, and every question three worked examples.
        levels=_levels(lambda n: {"min_size": n, "max_size": n, "num_train": 3}, (10, 20, 30, 40)),
        validate=_arc_validate,
        description="infer a 1-D grid transformation from three examples",
    ),
    aliases=("arc",),
)


def get_family(name: str) -> TaskFamily:
    """A built-in family (or alias), or a generic family for any reasoning-gym dataset."""
    if name in FAMILIES:
        return FAMILIES.get(name)
    valid = reasoning_gym_dataset_names()
    if name not in valid:
        raise ValueError(
            f"unknown task family {name!r}: not a built-in family ({', '.join(FAMILIES.names())}) "
            f"nor a reasoning-gym dataset; valid reasoning-gym datasets: {', '.join(valid)}"
        )
    return TaskFamily(
        name=name,
        dataset=name,
        generate=generic_item,
        question=_generic_question,
        check=_exact_match,
        validate=_composite_validate if name == "composite" else None,
        content_key=_question_key,  # generic datasets are de-duplicated by their question text
        description=f"reasoning-gym dataset {name!r}, checked by normalised exact match",
    )


# ----------------------------------------------------------------- task resolution


def _validate_config(family: TaskFamily, config: Mapping[str, Any]) -> dict[str, Any]:
    """Check a config against the reasoning-gym config class before any generation."""
    config_cls = _config_class(family.dataset)
    allowed = {f.name for f in fields(config_cls)} - {"seed", "size"}
    reserved = sorted({"seed", "size"} & set(config))
    if reserved:
        raise ValueError(
            f"task config for {family.name!r} sets {reserved}; seed and size belong to a split "
            "(pass seed= and train_size= / eval_size= to the suite) and must be left out"
        )
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise ValueError(
            f"unknown config field(s) {unknown} for reasoning-gym dataset {family.dataset!r}; "
            f"valid fields: {', '.join(sorted(allowed))}"
        )
    # Through JSON: equal to what the cache key and the workers see.
    normalized = json.loads(json.dumps(dict(config), sort_keys=True))
    if family.validate is not None:
        family.validate(normalized)
    try:
        # A throwaway instance, only to run reasoning-gym's own checks.
        # seed and size belong to a split: placeholders, only to build the config
        instance = config_cls(**_to_dataset_config(family.dataset, normalized), seed=0, size=1)
        if hasattr(instance, "validate"):
            instance.validate()
    # Reasoning-gym's validate() asserts (CountdownConfig and others)
    except (AssertionError, TypeError, ValueError) as error:
        raise ValueError(
            f"invalid config {normalized} for reasoning-gym dataset {family.dataset!r}: {error}"
        ) from error
    return normalized


def _level_config(family: TaskFamily, level: str) -> Mapping[str, Any]:
    if level not in family.levels:
        valid = ", ".join(f"{family.name}:{name}" for name in family.levels) or "(none)"
        raise ValueError(
            f"task family {family.name!r} has no level {level!r}; valid levels: {valid}"
        )
    return family.levels[level]


def _resolve_mapping(task: Mapping[str, Any]) -> TaskSpec:
    known = {"family", "dataset", "level", "config", "name", "task_id"}
    unknown = sorted(set(task) - known)
    family_name = task.get("family", task.get("dataset"))
    if unknown or not isinstance(family_name, str):
        raise ValueError(
            f"a task mapping needs 'family' (a family or reasoning-gym dataset name) and may "
            f"have 'level', 'config' and 'name'; got keys {sorted(task)}"
        )
    family = get_family(family_name)
    level = task.get("level")
    overrides = dict(task.get("config") or {})
    name = task.get("name", task.get("task_id"))
    if level is not None and overrides and name is None:
        raise ValueError(
            f"task {family.name}:{level} with config overrides {overrides} needs a 'name' "
            "(a task id of your choice) so that it is not confused with the standard level"
        )
    base = dict(_level_config(family, level)) if level is not None else {}
    if level is None and not overrides and family.levels:
        raise ValueError(_needs_level_message(family))
    config = _validate_config(family, {**base, **overrides})
    task_id = name or (f"{family.name}:{level}" if level is not None else family.name)
    return TaskSpec(task_id=str(task_id), family=family, level=level, config=config)


def _needs_level_message(family: TaskFamily) -> str:
    valid = ", ".join(f"{family.name}:{name}" for name in family.levels)
    return f"task {family.name!r} needs a level; valid task ids: {valid}"


def resolve_task(task: str | Mapping[str, Any] | TaskSpec) -> TaskSpec:
    """A :class:`TaskSpec` from a task id (``"countdown:medium"``, ``"basic_arithmetic"``),
    a mapping (``{"family": ..., "level": ..., "config": {...}, "name": ...}``) or a spec.

    Everything is validated here, before any generation: family and dataset names, levels,
    config fields (against reasoning-gym's config class and its own ``validate``), and
    family-specific bounds (``arc_1d`` sizes ≤ 40).
    """
    if isinstance(task, TaskSpec):
        return task
    if isinstance(task, Mapping):
        return _resolve_mapping(task)
    if not isinstance(task, str) or not task.strip():
        raise TypeError(
            f"a task is a task id string, a mapping or a TaskSpec; got {type(task).__name__}"
        )
    # "family:level"; a generic dataset may have no level.
    family_name, _, level = task.strip().partition(":")
    family = get_family(family_name)
    if not level:
        if family.levels:
            raise ValueError(_needs_level_message(family))
        return TaskSpec(family.name, family, None, _validate_config(family, {}))
    config = _validate_config(family, _level_config(family, level))
    return TaskSpec(f"{family.name}:{level}", family, level, config)
