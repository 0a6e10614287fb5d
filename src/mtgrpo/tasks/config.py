"""The ``tasks:`` section of a run file: which task suite to train and evaluate on.

::

    tasks:
      suite: mtgrpo3                 # or: tasks: [countdown:easy, zebra_puzzles:easy, ...]
      train_size: 2000               # items per task (generated lazily, cached on disk)
      eval_size: 100
      prompt_format: chat            # plain | chat | paper
      reward_scheme: {correct: 1.0, formatted: 0.1, unformatted: 0.0}

Every option is checked when the configuration is built (task ids against the families and
reasoning-gym's datasets, formats against their registries), before any model loads. The
defaults are :class:`~mtgrpo.tasks.TaskSuite`'s own.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

from mtgrpo._config_types import check_option_types, option
from mtgrpo.tasks.families import resolve_task
from mtgrpo.tasks.prompts import ANSWER_FORMATS, PROMPT_FORMATS
from mtgrpo.tasks.rewards import RewardScheme
from mtgrpo.tasks.suite import SUITES, TaskSuite, check_split_sizes

__all__ = ["TasksConfig"]

# TaskSuite's own defaults, read from its signature so that the two never drift apart.
_SUITE = {name: p.default for name, p in inspect.signature(TaskSuite).parameters.items()
          if p.default is not inspect.Parameter.empty}
# The options handed to TaskSuite unchanged.
_SUITE_OPTIONS = ("seed", "train_size", "eval_size", "validation_size", "prompt_format",
                  "answer_format", "think_prefix", "system_prompt", "workers", "cache_dir",
                  "item_timeout_s", "max_retries")


@dataclass
class TasksConfig:
    """A task suite: a named one (``suite``) or a list of task ids or specs (``tasks``)."""

    suite: str | None = option(
        "A named task suite (mtgrpo3, mtgrpo9, ...); give this or tasks.", default=None)
    tasks: list[Any] | None = option(
        "Task ids (countdown:easy, basic_arithmetic) or specs {family, level, config, name}; "
        "give this or suite.", default=None)
    train_size: int = option("Training items per task (generated lazily, cached on disk).",
                             default=_SUITE["train_size"])
    eval_size: int = option("Evaluation items per task.", default=_SUITE["eval_size"])
    validation_size: int = option(
        "Validation items per task, held out from training, the warm start and the evaluation "
        "split (to read held-out accuracy during training without the evaluation split; 0: "
        "none).", default=_SUITE["validation_size"])
    seed: int = option("Seed of the generated problems (train and eval splits differ).",
                       default=_SUITE["seed"])
    prompt_format: str = option("How a problem becomes a prompt: plain, chat or paper.",
                                default=_SUITE["prompt_format"])
    answer_format: str = option("Where the answer goes: answer_tag (<answer>) or boxed.",
                                default=_SUITE["answer_format"])
    think_prefix: bool = option("Open the reply with <think> (the papers' prompt).",
                                default=_SUITE["think_prefix"])
    system_prompt: str | None = option("System message of chat prompts (None: none).",
                                       default=_SUITE["system_prompt"])
    workers: int | None = option("Processes generating problems (None: one per CPU core but "
                                 "one; 0: in this process, without a time limit).",
                                 default=_SUITE["workers"])
    cache_dir: str | None = option("Where generated problems are cached (None: "
                                   "$MTGRPO_CACHE_DIR, else ~/.cache/mtgrpo/tasks).",
                                   default=_SUITE["cache_dir"])
    item_timeout_s: float = option("Seconds one problem may take to generate before it is "
                                   "replaced.", default=_SUITE["item_timeout_s"])
    max_retries: int = option("Replacements of a problem that failed, timed out or repeats an "
                              "excluded one before its position fails.",
                              default=_SUITE["max_retries"])
    reward_scheme: dict[str, float] | None = option(
        "Rewards of the task rewards: {correct, formatted, unformatted} (None: 1.0, 0.1, 0.0; "
        "correct must be >= 1 and the others < 1).", default=None)
    paper_test_sets: str | None = option(
        "A directory of the papers' released test sets: evaluate on them instead of the "
        "generated eval split.", default=None)
    paper_test_per_task: int | None = option(
        "With paper_test_sets: test items per task (None: all).", default=None)

    def __post_init__(self) -> None:
        check_option_types(self, "tasks")
        if (self.suite is None) == (self.tasks is None):
            raise ValueError("the tasks section needs exactly one of 'suite' (a name such as "
                             "mtgrpo3) or 'tasks' (a list of task ids)")
        if self.suite is not None:
            self.suite = SUITES.canonical(self.suite)
        elif not self.tasks:
            raise ValueError("tasks.tasks is empty; list at least one task id")
        else:
            for task in self.tasks:
                resolve_task(task)  # checked now, before any model loads (module docstring)
        PROMPT_FORMATS.canonical(self.prompt_format)
        ANSWER_FORMATS.canonical(self.answer_format)
        check_split_sizes({"train_size": self.train_size, "eval_size": self.eval_size,
                           "validation_size": self.validation_size}, self.max_retries)
        self.scheme()  # built only to validate the reward values
        if self.paper_test_per_task is not None and self.paper_test_per_task < 1:
            raise ValueError(f"tasks.paper_test_per_task={self.paper_test_per_task} must be >= 1 "
                             "(or null for every item)")

    @property
    def task_list(self) -> list[Any]:
        """The task ids or specs (the suite's, for a named suite)."""
        return list(SUITES.get(self.suite)) if self.suite is not None else list(self.tasks or [])

    def scheme(self) -> RewardScheme:
        return RewardScheme(**(self.reward_scheme or {}))

    def suite_options(self) -> dict[str, Any]:
        """:class:`~mtgrpo.tasks.TaskSuite`'s keyword arguments."""
        return {**{name: getattr(self, name) for name in _SUITE_OPTIONS},
                "reward_scheme": self.scheme()}

    def build_suite(self, **overrides: Any) -> TaskSuite:
        """The suite (``overrides``: other values for some options, e.g. ``train_size=1``)."""
        return TaskSuite(self.task_list, **{**self.suite_options(), **overrides})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
