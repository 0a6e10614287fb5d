"""Task rewards: the papers' correct / well-formatted / otherwise scheme, per family.

Reward of one completion (MT-GRPO and SEC papers; values configurable through
:class:`RewardScheme`):

- ``correct`` (1.0) when the answer in the expected container is correct,
- ``formatted`` (0.1) when an answer is present in the container but wrong,
- ``unformatted`` (0.0) when there is no non-empty answer in the container.

Accuracy is ``reward >= 1`` (ALGORITHMS.md §4 and §6), so a scheme must keep ``correct``
at or above 1 and the other two below 1.

Correctness per family (see :mod:`mtgrpo.tasks.families`): countdown through the safe
verifier ``mtgrpo.rewards.verifiers.countdown.countdown_check`` (every number used
exactly once, value equal to the target; no ``eval``); zebra puzzles and generic
reasoning-gym datasets by normalised exact match (strip, collapse whitespace runs,
case-fold); ARC-1D by comparing the output grid as a sequence of integers (whitespace,
newlines, commas and one pair of enclosing brackets are tolerated).

Scoring never stops training on model text: answers are read by linear-time, size-capped
extractors, and an exception while scoring one completion scores it ``unformatted`` (0.0)
and is counted as ``rewards/<name>/errors`` (:mod:`mtgrpo.rewards.guard`); metadata a
checker needs and lacks is a dataset error, raised before any scoring.

Each :class:`TaskReward` follows TRL's contract,
``f(prompts, completions, completion_ids=None, **columns) -> list[float | None]``, reads
the ``answer`` and ``metadata`` columns, and returns ``None`` for rows of other families
so that it is also correct when called unrouted. The answer container of a row is its
metadata's ``answer_format`` (rows of the papers' test sets say ``boxed``), else the
function's default.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mtgrpo.tasks.families import FAMILIES, TaskFamily, get_family
from mtgrpo.tasks.prompts import ANSWER_FORMATS, completion_text

if TYPE_CHECKING:
    from mtgrpo.tasks.families import TaskSpec

__all__ = ["RewardScheme", "TaskReward", "reward_routing", "task_reward"]


@dataclass(frozen=True)
class RewardScheme:
    """Reward values: correct answer, wrong but well-formatted answer, anything else."""

    correct: float = 1.0
    formatted: float = 0.1  # the papers' reward for a wrong answer in the right container
    unformatted: float = 0.0

    def __post_init__(self) -> None:
        values = {
            "correct": self.correct,
            "formatted": self.formatted,
            "unformatted": self.unformatted,
        }
        for name, value in values.items():
            if not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"reward scheme value {name}={value!r} must be a finite number")
        if not (self.correct >= 1.0 > max(self.formatted, self.unformatted)):
            raise ValueError(
                "accuracy is measured as reward >= 1, so the scheme needs correct >= 1 and "
                f"formatted, unformatted < 1; got {values}"
            )


def _parse_metadata(value: Any, row: int, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        try:
            # An empty metadata cell (a CSV column) is no metadata.
            parsed = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{name}: row {row} has a metadata string that is not JSON ({error})"
            ) from error
        if isinstance(parsed, dict):
            return parsed
    raise ValueError(
        f"{name}: row {row} metadata must be a JSON object string or a dict, "
        f"got {type(value).__name__}"
    )


def _family_of_task(task: Any) -> str | None:
    if not isinstance(task, str):
        return None
    prefix = task.partition(":")[0]
    # Through aliases: "zebra:hard" belongs to zebra_puzzles.
    return FAMILIES.canonical(prefix) if prefix in FAMILIES else prefix


class TaskReward:
    """The reward function of one task family (TRL contract; see the module docstring).

    A row is this family's when its metadata's ``family`` names it; without that field,
    when the prefix of its ``task`` id (before ``:``, aliases allowed) names it; a row
    with neither is assumed to be this family's (the function was routed to it).
    """

    def __init__(
        self,
        family: str | TaskFamily,
        *,
        scheme: RewardScheme | None = None,
        answer_format: str = "answer_tag",
    ) -> None:
        self.family = get_family(family) if isinstance(family, str) else family
        self.scheme = scheme or RewardScheme()
        self.answer_format = ANSWER_FORMATS.canonical(answer_format)
        # the reward's column and metrics take __name__ (TRL's get_callable_name)
        self.__name__ = f"{self.family.name}_reward"

    def __repr__(self) -> str:
        return (
            f"TaskReward({self.family.name!r}, scheme={self.scheme}, "
            f"answer_format={self.answer_format!r})"
        )

    def applies(self, task: Any, metadata: Mapping[str, Any]) -> bool:
        family = metadata.get("family")
        if family is None:
            family = _family_of_task(task)
        return family is None or family == self.family.name

    def score(self, completion: Any, answer: str, metadata: Mapping[str, Any]) -> float:
        """The reward of one completion against its gold ``answer`` and ``metadata``."""
        # The row's own container first: rows of the papers' test sets say boxed.
        answer_format = ANSWER_FORMATS.get(metadata.get("answer_format", self.answer_format))
        extracted = answer_format.extract(completion_text(completion))
        if not extracted:  # an empty container counts as no answer: unformatted
            return float(self.scheme.unformatted)
        correct = self.family.check(extracted, str(answer), metadata)
        return float(self.scheme.correct if correct else self.scheme.formatted)

    def __call__(
        self,
        prompts: Sequence[Any] | None,
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        n = len(completions)
        for column in ("answer", "metadata", "task"):
            values = columns.get(column)
            if values is not None and len(values) != n:
                raise ValueError(
                    f"{self.__name__}: column {column!r} has {len(values)} values for {n} "
                    "completions; pass one value per completion"
                )
        if "answer" not in columns:
            raise ValueError(
                f"{self.__name__} needs the dataset's 'answer' column (gold answers); "
                f"got columns {sorted(columns)}"
            )
        metadatas = columns.get("metadata") or [None] * n
        tasks = columns.get("task") or [None] * n
        rows = []  # (completion, answer, metadata) of this family's rows; None for others
        for row, (completion, answer, raw, task) in enumerate(
            zip(completions, columns["answer"], metadatas, tasks, strict=True)
        ):
            metadata = _parse_metadata(raw, row, self.__name__)
            applies = self.applies(task, metadata)
            if applies:  # dataset errors, raised before any scoring
                self._check_metadata(metadata, row)
                # An unknown answer_format is a dataset error, raised here.
                ANSWER_FORMATS.canonical(metadata.get("answer_format", self.answer_format))
            rows.append((completion, answer, metadata) if applies else None)
        from mtgrpo.rewards.guard import score_each  # not at import: generation workers
        # import this package and need none of the reward code

        # Model output is hostile input: an exception scores that row unformatted (0.0).
        return score_each(self.__name__, rows, self._score_row,
                          fallback=float(self.scheme.unformatted))  # fmt: skip

    def _score_row(self, row: tuple[Any, Any, Mapping[str, Any]] | None) -> float | None:
        return None if row is None else self.score(*row)

    def _check_metadata(self, metadata: Mapping[str, Any], row: int) -> None:
        missing = [name for name in self.family.metadata_fields if name not in metadata]
        if missing:
            raise ValueError(
                f"{self.__name__}: row {row} metadata lacks {missing}, which the "
                f"{self.family.name} checker needs; metadata keys present: {sorted(metadata)}"
            )


def task_reward(
    family: str, *, scheme: RewardScheme | None = None, answer_format: str = "answer_tag"
) -> TaskReward:
    """The reward function of a family (built-in or reasoning-gym dataset name)."""
    return TaskReward(family, scheme=scheme, answer_format=answer_format)


def reward_routing(
    tasks: Sequence[TaskSpec],
    *,
    scheme: RewardScheme | None = None,
    answer_format: str = "answer_tag",
) -> dict[str, list[TaskReward]]:
    """``{task_id: [reward_fn]}``: each task routed to its family's function (one per family)."""
    by_family: dict[str, TaskReward] = {}
    routing: dict[str, list[TaskReward]] = {}
    for spec in tasks:
        name = spec.family.name
        # one object per family: the reward suite makes one channel of one function object
        if name not in by_family:
            by_family[name] = TaskReward(spec.family, scheme=scheme, answer_format=answer_format)
        routing[spec.task_id] = [by_family[name]]
    return routing
