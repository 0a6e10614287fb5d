"""Tasks: reasoning-gym task suites, prompt formats, task rewards, and data loading.

>>> from mtgrpo.tasks import TaskSuite
>>> suite = TaskSuite.from_name("mtgrpo3", train_size=10_000, seed=0)  # doctest: +SKIP
>>> suite.train.start()            # background generation, cached on disk  # doctest: +SKIP
>>> row = suite.train.get(0)       # blocks only for this item               # doctest: +SKIP
>>> suite.reward_routing           # {"countdown:medium": [countdown_reward], ...}  # doctest: +SKIP

Modules: :mod:`~mtgrpo.tasks.families` (families, levels, task ids),
:mod:`~mtgrpo.tasks.suite` (suites, splits, row schema), :mod:`~mtgrpo.tasks.generation`
(worker processes with a time limit), :mod:`~mtgrpo.tasks.cache` (on-disk cache),
:mod:`~mtgrpo.tasks.prompts` (prompt and answer formats), :mod:`~mtgrpo.tasks.rewards`
(task rewards), :mod:`~mtgrpo.tasks.data` (loading user datasets),
:mod:`~mtgrpo.tasks.environments` (built-in tool environments, each a task; imported by name,
not here, as it needs torch),
:mod:`~mtgrpo.tasks.paper` (the papers' released test sets), :mod:`~mtgrpo.tasks.config`
(:class:`TasksConfig`, a run file's ``tasks:`` section), :mod:`~mtgrpo.tasks.prompt_set`
(:class:`PromptSet`: rows, task labels and token ids as the sampler and the rollouts address
them).
"""

from __future__ import annotations

from mtgrpo.tasks.cache import CACHE_ENV, cache_root
from mtgrpo.tasks.config import TasksConfig
from mtgrpo.tasks.data import load_rows
from mtgrpo.tasks.families import (
    FAMILIES,
    LEVELS,
    TaskFamily,
    TaskSpec,
    get_family,
    resolve_task,
)
from mtgrpo.tasks.generation import GenerationPool, ItemFailedError, ItemTimeoutError
from mtgrpo.tasks.paper import (
    PAPER_TASK_IDS,
    ensure_trainable,
    is_paper_test_source,
    load_paper_test_sets,
    nearest_paper_level,
    paper_task_id,
    paper_task_of,
)
from mtgrpo.tasks.prompt_set import PromptSet, is_conversational, is_lazy_split
from mtgrpo.tasks.prompts import ANSWER_FORMATS, PROMPT_FORMATS, AnswerFormat, format_prompt
from mtgrpo.tasks.rewards import RewardScheme, TaskReward, reward_routing, task_reward
from mtgrpo.tasks.solver import solve_countdown
from mtgrpo.tasks.suite import (
    SUITES,
    GenerationError,
    GenerationRate,
    RenderOptions,
    SuiteSplit,
    TaskData,
    TaskSuite,
    make_suite,
    measure_generation,
    problem_keys,
    split_seed,
)

__all__ = [
    "ANSWER_FORMATS",
    "CACHE_ENV",
    "FAMILIES",
    "LEVELS",
    "PAPER_TASK_IDS",
    "PROMPT_FORMATS",
    "SUITES",
    "AnswerFormat",
    "GenerationError",
    "GenerationPool",
    "GenerationRate",
    "ItemFailedError",
    "ItemTimeoutError",
    "PromptSet",
    "RenderOptions",
    "RewardScheme",
    "SuiteSplit",
    "TaskData",
    "TaskFamily",
    "TaskReward",
    "TaskSpec",
    "TaskSuite",
    "TasksConfig",
    "cache_root",
    "ensure_trainable",
    "format_prompt",
    "get_family",
    "is_conversational",
    "is_lazy_split",
    "is_paper_test_source",
    "load_paper_test_sets",
    "load_rows",
    "make_suite",
    "measure_generation",
    "nearest_paper_level",
    "paper_task_id",
    "paper_task_of",
    "problem_keys",
    "resolve_task",
    "reward_routing",
    "solve_countdown",
    "split_seed",
    "task_reward",
]
