"""Batch construction for multi-task GRPO: which prompts to generate, and which groups to train on.

Notation: a batch holds ``B`` groups (one per prompt), each with ``G`` completions scored by
``R`` reward channels; every prompt belongs to one of ``K`` tasks and ``z [K]`` are the task
weights on the simplex. A group is *zero-gradient* when the advantage estimator finds no
contrast among its completions (ALGORITHMS.md §2; the one rule is in :mod:`mtgrpo.algo.metrics`);
*informative* otherwise. The sampler never sees a model: it draws prompt ids and calls a
:data:`GenerateAndScore` callable that returns one :class:`ScoredGroup` per prompt id, carrying
the estimator's verdict (``zero_gradient``); the filters read it.

Samplers (ALGORITHMS.md §5; names in :data:`SAMPLERS`):

``iid``
    Tasks of the ``B`` prompts drawn i.i.d. from ``z`` (multinomial counts), one generation
    call, every group returned (nothing is filtered; the report still counts the groups the
    filter would have dropped).
``dynamic`` (DAPO's dynamic sampling, Yu et al. 2025)
    Rounds of ``⌈M_os·B⌉`` prompts with tasks i.i.d. from ``z``; zero-gradient groups are
    dropped; rounds repeat until ``B`` informative groups exist or ``N_rs`` extra rounds ran.
    ``B`` of them are returned (a random subset if more), or all of them if fewer.
``ratio_preserving`` (RP-sampler, MT-GRPO Algorithm 2, Ramesh et al., arXiv 2602.05547)
    Target counts ``n ~ Multinomial(B, z)`` of informative groups per task. Acceptance-aware
    sampling (AAS) keeps ``ρ_k``, an EMA (decay ``acceptance_ema``) of task ``k``'s filtered
    fraction, and inflates ``m_k = min(1 / max(1 − ρ_k, 0.01), M_acc)``. The first round draws
    ``⌈M_os·B⌉`` prompts from ``ẑ ∝ z ⊙ m``; while ``Σ_k max(n_k − c_k, 0) > 0`` (``c_k`` the
    informative groups of task ``k`` so far) and fewer than ``N_rs`` extra rounds ran, another
    ``⌈M_os·B⌉`` prompts are drawn with weights ``∝ max(n − c, 0) ⊙ m``. The batch keeps the
    first ``n_k`` informative groups of each task (generation order) and tops up with random
    leftover informative groups of any task to exactly ``B``.

Decisions where the paper is silent:

1. Fewer than ``B`` informative groups after the last round: every informative group is
   returned, so the batch is smaller than ``B`` (possibly empty). The trainer must accept a
   short batch; the report says so (``batch_counts`` sums to less than ``B``).
2. The returned groups are shuffled with the sampler's RNG, so any contiguous slice of the batch
   (a mini-batch of a multi-update step) mixes tasks instead of holding one task.
3. ``ρ`` is tracked (and reported) by every sampler; only ``ratio_preserving`` with
   ``acceptance_aware=True`` uses it. It starts at 0, so ``m = 1`` until it warms up.
4. Informative groups generated but not kept are discarded (no carry-over buffer): every
   trained group is on-policy.
5. A task with fewer prompts than a step asks for wraps into its next epoch, so the same prompt
   can appear more than once in one batch (its groups are independent generations).
6. ``N_rs`` counts the rounds after the first, so one build makes at most ``1 + N_rs``
   generation calls.
7. ``ratio_preserving`` defaults to AAS on (the paper's 9-task setting); its 3-task setting
   used ``acceptance_aware=False``. Targets default to the paper's multinomial draw;
   ``target_rounding="largest_remainder"`` gives the same composition every step.

Every random choice comes from the sampler's own ``np.random.Generator``; the prompt order of
task ``k`` in epoch ``e`` is regenerated from ``(seed, k, e)``. Both are in :meth:`state_dict`,
so a restored sampler builds exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import inspect
import math
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mtgrpo.algo.registry import Registry

__all__ = [
    "SAMPLERS",
    "TARGET_ROUNDINGS",
    "ZERO_GRADIENT_FILTERS",
    "DynamicSampler",
    "GenerateAndScore",
    "IIDSampler",
    "PromptPool",
    "RatioPreservingSampler",
    "SampledBatch",
    "Sampler",
    "SamplingReport",
    "ScoredGroup",
    "check_sampler_params",
    "largest_remainder_counts",
    "make_sampler",
]

# Floor of the acceptance rate in the AAS inflation 1 / max(1 - ρ, 0.01) (MT-GRPO Algorithm 2).
_MIN_ACCEPTANCE = 0.01
_SIMPLEX_ATOL = 1e-6  # a strategy's z sums to 1 up to rounding; build() renormalises after


def _as_index(name: str, value: Any) -> int:
    # bool is an int subclass; True is no prompt id or task index.
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an integer; got {value!r} ({type(value).__name__})")
    return int(value)


@dataclass(eq=False)
class ScoredGroup:
    """The ``G`` scored completions of one prompt.

    Attributes:
        prompt_id: index of the prompt in the training set.
        task: task index ``0..K-1``.
        rewards: ``[G, R]`` raw reward channels, ``NaN`` = not applicable.
        correct: ``[G]`` bool, the completion counts as correct (the trainer decides; by default
            a reward ``>= 1``). The ``strict`` filter reads it.
        zero_gradient: the advantage estimator found no contrast among the completions (the
            one rule of :mod:`mtgrpo.algo.metrics`: ``compute_advantages(...).zero_gradient``);
            every filter but ``none`` drops such a group.
        advantages: ``[G]`` the estimator's advantages, when the caller computed them with the
            verdict (the trainer does, so they are computed once).
        payload: opaque data the trainer attaches (completions, token ids, ...).
    """

    prompt_id: int
    task: int
    rewards: np.ndarray  # [G, R]
    correct: np.ndarray  # [G]
    zero_gradient: bool
    advantages: np.ndarray | None = None  # [G]
    payload: Any = None

    def __post_init__(self) -> None:
        self.prompt_id = _as_index("ScoredGroup.prompt_id", self.prompt_id)
        self.task = _as_index("ScoredGroup.task", self.task)
        self.rewards = np.asarray(self.rewards, dtype=np.float64)
        if self.rewards.ndim != 2 or self.rewards.shape[0] < 1 or self.rewards.shape[1] < 1:
            raise ValueError(
                f"ScoredGroup.rewards must have shape [G, R] with G, R >= 1; got shape "
                f"{self.rewards.shape} for prompt {self.prompt_id}; pass one row per completion "
                "and one column per reward channel (rewards[:, None] for a single channel)"
            )
        self.correct = np.asarray(self.correct)
        if self.correct.dtype != np.bool_:
            raise TypeError(
                f"ScoredGroup.correct must be a boolean array [G]; got dtype {self.correct.dtype} "
                f"for prompt {self.prompt_id}; pass e.g. rewards[:, 0] >= 1"
            )
        if self.correct.shape != (self.rewards.shape[0],):
            raise ValueError(
                f"ScoredGroup.correct must have shape [G] = ({self.rewards.shape[0]},) to match "
                f"rewards; got {self.correct.shape} for prompt {self.prompt_id}"
            )
        if not isinstance(self.zero_gradient, bool | np.bool_):
            raise TypeError(
                f"ScoredGroup.zero_gradient must be True or False; got {self.zero_gradient!r} for "
                f"prompt {self.prompt_id}; pass the estimator's verdict "
                "(compute_advantages(...).zero_gradient)"
            )
        self.zero_gradient = bool(self.zero_gradient)
        if self.advantages is not None and np.shape(self.advantages) != (self.group_size,):
            raise ValueError(
                f"ScoredGroup.advantages must have shape [G] = ({self.group_size},); got "
                f"{np.shape(self.advantages)} for prompt {self.prompt_id}"
            )

    @property
    def group_size(self) -> int:
        return self.rewards.shape[0]


GenerateAndScore = Callable[[Sequence[int]], Sequence[ScoredGroup]]
"""Given prompt ids, generate ``G`` completions for each and score them; one group per id, in
the same order."""

# ---------------------------------------------------------------------------------------------
# Zero-gradient filters
# ---------------------------------------------------------------------------------------------

ZeroGradientFilter = Callable[[ScoredGroup], bool]
"""Returns True when the group is zero-gradient and must be dropped."""

ZERO_GRADIENT_FILTERS: Registry[ZeroGradientFilter] = Registry("zero-gradient filter")


@ZERO_GRADIENT_FILTERS.register("lenient")
def lenient_filter(group: ScoredGroup) -> bool:
    """Drop the group only when it has zero gradient (MT-GRPO Exp-2): the estimator found no
    contrast (``group.zero_gradient``; :mod:`mtgrpo.algo.metrics` gives the rule)."""
    return group.zero_gradient


@ZERO_GRADIENT_FILTERS.register("strict")
def strict_filter(group: ScoredGroup) -> bool:
    """``lenient``, and also drop when no completion or every completion is correct.

    ALGORITHMS.md §5: "all rewards 0, all 1, or none correct" (MT-GRPO Exp-1, DAPO's filter on
    accuracy). A group where every completion is correct but, say, a length reward varies still
    has a gradient; the strict filter drops it on purpose, as the paper does.
    """
    return lenient_filter(group) or not group.correct.any() or bool(group.correct.all())


@ZERO_GRADIENT_FILTERS.register("none")
def keep_all_filter(group: ScoredGroup) -> bool:
    """Keep every group."""
    return False


# ---------------------------------------------------------------------------------------------
# Target counts: integers n [K] with Σ n = B from weights z [K]
# ---------------------------------------------------------------------------------------------

TargetRounding = Callable[[np.ndarray, int, np.random.Generator], np.ndarray]
TARGET_ROUNDINGS: Registry[TargetRounding] = Registry("target rounding")


@TARGET_ROUNDINGS.register("multinomial")
def multinomial_counts(weights: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
    """``n ~ Multinomial(total, z)`` (MT-GRPO Algorithm 2): unbiased, E[n] = total · z."""
    return rng.multinomial(total, weights).astype(np.int64)


@TARGET_ROUNDINGS.register("largest_remainder")
def largest_remainder_counts(
    weights: np.ndarray, total: int, rng: np.random.Generator | None = None
) -> np.ndarray:
    """Deterministic rounding of ``total · z`` (Hamilton's method); ``rng`` is unused.

    ``n_k = ⌊total z_k⌋``, then the ``total − Σ n`` leftover units go to the largest fractional
    parts, ties to the lower task index. Every ``|n_k − total z_k| < 1`` and a task with zero
    weight gets nothing.
    """
    exact = total * np.asarray(weights, dtype=np.float64)  # [K]
    counts = np.floor(exact).astype(np.int64)
    leftover = total - int(counts.sum())
    fractions = np.where(exact > 0, exact - counts, -1.0)  # -1: a zero-weight task gets no unit
    order = np.argsort(-fractions, kind="stable")  # stable: ties go to the lower task index
    assert leftover <= int((exact > 0).sum()), "more leftover units than weighted tasks"
    counts[order[:leftover]] += 1
    return counts


# ---------------------------------------------------------------------------------------------
# Prompt pool
# ---------------------------------------------------------------------------------------------


def _validate_prompt_tasks(prompt_tasks: Any, num_tasks: int) -> np.ndarray:
    num_tasks = _as_index("num_tasks", num_tasks)
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1; got {num_tasks}")
    tasks = np.asarray(prompt_tasks)
    if tasks.ndim != 1 or tasks.size == 0:
        raise ValueError(
            f"prompt_tasks must be a non-empty 1-D array [num_prompts] of task indices; got "
            f"shape {tasks.shape}"
        )
    if not np.issubdtype(tasks.dtype, np.integer):
        raise TypeError(
            f"prompt_tasks must hold integer task indices; got dtype {tasks.dtype}; map task "
            "names to indices 0..K-1 first"
        )
    bad = tasks[(tasks < 0) | (tasks >= num_tasks)]
    if bad.size:
        raise ValueError(
            f"prompt_tasks must lie in 0..{num_tasks - 1} (num_tasks={num_tasks}); got "
            f"{bad[:5].tolist()}; fix num_tasks or the task column"
        )
    return tasks.astype(np.int64)


class PromptPool:
    """Per-task prompt ids read in a seeded shuffled order that is reshuffled every epoch.

    The order of task ``k`` in epoch ``e`` is a permutation regenerated from ``(seed, k, e)``, so
    the state is just ``(epoch, position)`` per task. :meth:`draw` asking for more prompts than
    remain wraps into the next epoch: a task with fewer prompts than a step needs repeats
    prompts, each epoch still visiting every prompt once. ``shuffle=False`` reads every task's
    prompts in dataset order instead (TRL's ``shuffle_dataset=False``).
    """

    def __init__(self, prompt_tasks: Any, num_tasks: int, seed: int = 0,
                 shuffle: bool = True) -> None:
        self._tasks = _validate_prompt_tasks(prompt_tasks, num_tasks)  # [num_prompts]
        seed = _as_index("seed", seed)
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer; got {seed}")
        self.num_tasks = int(num_tasks)
        self._seed = seed
        self._shuffle = bool(shuffle)
        # Task k's prompt ids in dataset order: the per-epoch permutations index into these.
        self._ids = [np.flatnonzero(self._tasks == k) for k in range(self.num_tasks)]
        self._epochs = [0] * self.num_tasks
        self._positions = [0] * self.num_tasks
        self._orders: list[np.ndarray | None] = [None] * self.num_tasks

    @property
    def prompt_tasks(self) -> np.ndarray:  # [num_prompts]
        return self._tasks

    @property
    def sizes(self) -> np.ndarray:  # [K]
        return np.array([ids.size for ids in self._ids], dtype=np.int64)

    def epoch(self, task: int) -> int:
        return self._epochs[task]

    def _order(self, task: int) -> np.ndarray:
        order = self._orders[task]
        if order is None and not self._shuffle:
            order = self._orders[task] = self._ids[task]
        if order is None:
            # Derived from (seed, k, e), not stored: the state is (epoch, position) per task and
            # a resumed run reads the same order.
            rng = np.random.default_rng([self._seed, task, self._epochs[task]])
            order = self._ids[task][rng.permutation(self._ids[task].size)]
            self._orders[task] = order
        return order

    def draw(self, task: int, n: int) -> np.ndarray:
        """The next ``n`` prompt ids of ``task`` (``[n]``), wrapping into later epochs."""
        size = self._ids[task].size
        if n > 0 and size == 0:
            raise ValueError(
                f"task {task} has no prompts but {n} were requested; give it prompts or weight 0"
            )
        parts = []
        while n > 0:  # more than a task holds wraps through several epochs (decision 5)
            position = self._positions[task]
            take = min(n, size - position)
            parts.append(self._order(task)[position : position + take])
            position += take
            n -= take
            if position == size:
                self._epochs[task] += 1
                self._orders[task] = None  # a fresh permutation for the next epoch
                position = 0
            self._positions[task] = position
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def _fingerprint(self) -> int:
        # Sizes alone would miss a remapped task column, whose saved positions point elsewhere.
        return zlib.crc32(self._tasks.tobytes())

    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self._seed,
            "epochs": list(self._epochs),
            "positions": list(self._positions),
            "task_sizes": self.sizes.tolist(),
            "prompt_tasks_crc32": self._fingerprint(),
            "shuffle": self._shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["task_sizes"] != self.sizes.tolist() or state["prompt_tasks_crc32"] != (
            self._fingerprint()
        ):
            raise ValueError(
                f"the prompt set differs from the one this state was saved with (prompts per "
                f"task {state['task_sizes']} vs {self.sizes.tolist()}); resume with the same "
                "dataset and task mapping"
            )
        # a state saved before the flag was recorded has none: nothing to compare
        if "shuffle" in state and bool(state["shuffle"]) != self._shuffle:
            saved = "shuffled" if state["shuffle"] else "dataset-order"
            now = "shuffled" if self._shuffle else "dataset-order"
            raise ValueError(
                f"this prompt-pool state was saved with shuffle={bool(state['shuffle'])} "
                f"({saved} prompts) and this run has shuffle={self._shuffle} ({now}), which "
                "would read the prompts in another order; resume with the checkpoint's "
                "shuffle_dataset and train_sampling_strategy (shuffled: shuffle_dataset: true "
                "and train_sampling_strategy: random)"
            )
        self._seed = int(state["seed"])
        self._epochs = [int(e) for e in state["epochs"]]
        self._positions = [int(p) for p in state["positions"]]
        self._orders = [None] * self.num_tasks  # rebuilt from (seed, k, e) on the next draw


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


@dataclass
class SamplingReport:
    """What one :meth:`Sampler.build` did.

    Attributes:
        target_weights: ``[K]`` the weights ``z`` the batch was built for.
        target_counts: ``[K]`` informative groups wanted per task: ``n`` for
            ``ratio_preserving``, the drawn multinomial counts for ``iid``, the largest-remainder
            rounding of ``B·z`` (for comparison only) for ``dynamic``.
        generated_groups: ``[K]`` groups generated over all rounds.
        informative_groups: ``[K]`` of those, the ones the filter keeps.
        batch_counts: ``[K]`` realised composition of the returned batch.
        filter_rate: ``[K]`` dropped / generated per task, NaN where nothing was generated.
        acceptance: ``[K]`` ``ρ`` after this build's update: the EMA of each task's filtered
            fraction that drives acceptance-aware sampling.
        inflation: ``[K]`` the AAS inflation ``m`` used for this build (all 1 without AAS).
        rounds: generation calls.
        prompts_generated: prompts sent to generation over all rounds.
        prompts_per_informative_group: ``prompts_generated / Σ informative_groups`` (NaN if 0).
    """

    target_weights: np.ndarray  # [K]
    target_counts: np.ndarray  # [K]
    generated_groups: np.ndarray  # [K]
    informative_groups: np.ndarray  # [K]
    batch_counts: np.ndarray  # [K]
    filter_rate: np.ndarray  # [K]
    acceptance: np.ndarray  # [K]
    inflation: np.ndarray  # [K]
    rounds: int
    prompts_generated: int
    prompts_per_informative_group: float

    @property
    def batch_size(self) -> int:
        return int(self.batch_counts.sum())

    def to_dict(self, task_names: Sequence[str] | None = None) -> dict[str, float]:
        """Flat metrics, e.g. ``sampling/batch_share/<task>``; NaN where undefined."""
        num_tasks = self.target_weights.shape[0]
        names = [f"task_{k}" for k in range(num_tasks)] if task_names is None else task_names
        if len(names) != num_tasks or len(set(names)) != num_tasks:
            raise ValueError(
                f"task_names must hold {num_tasks} distinct names, one per task; got {names!r}"
            )
        size = self.batch_size
        # An empty batch (decision 1) has no composition: NaN, not 0 for every task.
        share = self.batch_counts / size if size else np.full(num_tasks, np.nan)
        metrics: dict[str, float] = {
            "sampling/rounds": float(self.rounds),
            "sampling/prompts_generated": float(self.prompts_generated),
            "sampling/prompts_per_informative_group": float(self.prompts_per_informative_group),
            "sampling/batch_size": float(size),
            "sampling/informative_groups": float(self.informative_groups.sum()),
        }
        per_task = {
            "target_weight": self.target_weights,
            "target_count": self.target_counts,
            "generated_groups": self.generated_groups,
            "informative_groups": self.informative_groups,
            "batch_count": self.batch_counts,
            "batch_share": share,
            "filter_rate": self.filter_rate,
            "filter_rate_ema": self.acceptance,  # ρ is the filtered fraction, not the accepted
            "generation_inflation": self.inflation,
        }
        for metric, values in per_task.items():
            for name, value in zip(names, values, strict=True):
                metrics[f"sampling/{metric}/{name}"] = float(value)
        return metrics


@dataclass(frozen=True)
class SampledBatch:
    """Result of :meth:`Sampler.build`.

    Attributes:
        groups: the batch, ``[<= B]`` groups in a shuffled order.
        report: what the build did (:class:`SamplingReport`).
        generated: every group generated during the build, in generation order (the batch's
            and the filtered ones): per-task statistics such as ``J_k`` are measured on them.
    """

    groups: list[ScoredGroup]  # [<= B]
    report: SamplingReport
    generated: list[ScoredGroup]  # [groups generated]


# ---------------------------------------------------------------------------------------------
# Samplers
# ---------------------------------------------------------------------------------------------


def _positive_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise TypeError(f"{name} must be a number; got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0; got {value!r}")
    return float(value)


def _ema_decay(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise TypeError(f"acceptance_ema must be a number; got {value!r}")
    if not 0 <= value < 1:
        raise ValueError(
            f"acceptance_ema (the EMA decay of the filtered fraction) must lie in [0, 1); "
            f"got {value!r}"
        )
    return float(value)


def _rounds(value: Any) -> int:
    rounds = _as_index("max_resample_rounds", value)
    if rounds < 0:
        raise ValueError(f"max_resample_rounds must be an integer >= 0; got {rounds}")
    return rounds


def _prompts_per_round(oversample_factor: float, size: int) -> int:
    """``⌈M_os·B⌉``, rounded first so that float noise (0.1·30 = 3.0000000000000004) adds none."""
    # At least one prompt: a round that generates nothing could never fill a deficit.
    return max(1, math.ceil(round(oversample_factor * size, 9)))


def _normalised(weights: np.ndarray) -> np.ndarray:
    return weights / weights.sum()


class _Rollouts:
    """The groups generated during one build, in generation order, with their filter verdicts."""

    def __init__(self, num_tasks: int) -> None:
        self.num_tasks = num_tasks
        self.groups: list[ScoredGroup] = []
        self.informative: list[bool] = []
        self.rounds = 0
        self.prompts = 0

    def tasks(self) -> np.ndarray:  # [num generated]
        return np.array([g.task for g in self.groups], dtype=np.int64)

    def generated_counts(self) -> np.ndarray:  # [K]
        return np.bincount(self.tasks(), minlength=self.num_tasks)

    def informative_counts(self) -> np.ndarray:  # [K]
        tasks = self.tasks()[np.array(self.informative, dtype=bool)]
        return np.bincount(tasks, minlength=self.num_tasks)

    def informative_indices(self) -> np.ndarray:  # [num informative]
        return np.flatnonzero(np.array(self.informative, dtype=bool))


class Sampler(ABC):
    """Shared machinery: prompt pool, RNG, zero-gradient filter, ``ρ`` and the build loop.

    Subclasses implement :meth:`_collect`, which runs generation rounds and picks the groups of
    the batch. Build one with :func:`make_sampler`.

    Args:
        prompt_tasks: ``[num_prompts]`` task index of every prompt of the training set.
        num_tasks: ``K``.
        seed: seeds the prompt order and the sampler's RNG.
        zero_gradient_filter: a name in :data:`ZERO_GRADIENT_FILTERS` (default ``strict``).
        acceptance_ema: the decay ``d`` of ``ρ_k ← d ρ_k + (1 − d) f_k`` (paper 0.9), where
            ``f_k`` is the fraction of this build's task-``k`` groups the filter dropped.
        shuffle: read each task's prompts in a shuffled order (False: dataset order).
    """

    name: ClassVar[str]

    def __init__(
        self,
        prompt_tasks: Any,
        num_tasks: int,
        *,
        seed: int = 0,
        zero_gradient_filter: str = "strict",  # MT-GRPO Exp-1's filter
        acceptance_ema: float = 0.9,  # the paper's ρ decay (ALGORITHMS.md §5)
        shuffle: bool = True,
    ) -> None:
        self.pool = PromptPool(prompt_tasks, num_tasks, seed, shuffle=shuffle)
        self.num_tasks = self.pool.num_tasks
        self.filter_name = ZERO_GRADIENT_FILTERS.canonical(zero_gradient_filter)
        self._is_zero_gradient = ZERO_GRADIENT_FILTERS.get(self.filter_name)
        self.acceptance_ema = _ema_decay(acceptance_ema)
        # Every random choice comes from this one generator, saved in state_dict: a restored
        # sampler builds exactly the batches an uninterrupted one would.
        self.rng = np.random.default_rng(seed)
        self._filter_rate_ema = np.zeros(self.num_tasks)  # [K] ρ; 0: m = 1 until it warms up

    @property
    def filter_rate_ema(self) -> np.ndarray:  # [K]
        """``ρ``: per task, the EMA of the fraction of generated groups the filter dropped."""
        return self._filter_rate_ema.copy()

    def build(self, weights: Any, num_groups: int, generate: GenerateAndScore) -> SampledBatch:
        """Build a batch of up to ``num_groups`` informative groups for task weights ``z``.

        Args:
            weights: ``[K]`` task weights on the simplex (non-negative, summing to 1).
            num_groups: ``B``, groups (prompts) wanted in the batch.
            generate: the :data:`GenerateAndScore` callable.
        """
        z = self._validate_weights(weights)
        size = _as_index("num_groups", num_groups)
        if size < 1:
            raise ValueError(f"num_groups must be >= 1; got {size}")
        if not callable(generate):
            raise TypeError(f"generate must be callable; got {type(generate).__name__}")
        inflation = self._inflation()  # from ρ before this build: AAS plans on past acceptance
        rollouts = _Rollouts(self.num_tasks)
        chosen, target = self._collect(z, size, generate, rollouts)
        self._update_filter_rate_ema(rollouts)
        # Decision 2: shuffled, so a contiguous mini-batch mixes tasks instead of holding one.
        groups = [rollouts.groups[i] for i in self.rng.permutation(np.asarray(chosen))]
        return SampledBatch(groups, self._report(z, target, inflation, rollouts, groups),
                            list(rollouts.groups))

    @abstractmethod
    def _collect(
        self, z: np.ndarray, size: int, generate: GenerateAndScore, rollouts: _Rollouts
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run generation rounds into ``rollouts``; return (chosen indices, target counts)."""

    def _inflation(self) -> np.ndarray:  # [K]
        return np.ones(self.num_tasks)

    def _validate_weights(self, weights: Any) -> np.ndarray:
        z = np.asarray(weights, dtype=np.float64)
        if z.shape != (self.num_tasks,):
            raise ValueError(
                f"weights must have shape [K] = ({self.num_tasks},), one per task; got {z.shape}"
            )
        if not np.isfinite(z).all() or (z < 0).any() or abs(z.sum() - 1) > _SIMPLEX_ATOL:
            raise ValueError(
                f"weights must lie on the simplex (finite, >= 0, summing to 1 within "
                f"{_SIMPLEX_ATOL}); got {z.tolist()}; normalise them with w / w.sum()"
            )
        # Refused before generating: such a task's target could never be met.
        empty = np.flatnonzero((z > 0) & (self.pool.sizes == 0))
        if empty.size:
            raise ValueError(
                f"task(s) {empty.tolist()} have positive weight but no prompts; give them "
                "prompts or weight 0"
            )
        # numpy's multinomial refuses p > 1 and gives the last task any shortfall: renormalise the
        # residue the tolerance lets through.
        return _normalised(z)

    def _generate_round(
        self, task_counts: np.ndarray, generate: GenerateAndScore, rollouts: _Rollouts
    ) -> None:
        """Draw ``task_counts [K]`` prompts from the pool, generate, score and filter them."""
        prompt_ids = np.concatenate(
            [self.pool.draw(k, int(n)) for k, n in enumerate(task_counts)]
        ).tolist()
        groups = self._checked(prompt_ids, generate(prompt_ids))
        rollouts.groups.extend(groups)
        rollouts.informative.extend(not self._is_zero_gradient(g) for g in groups)
        rollouts.rounds += 1
        rollouts.prompts += len(prompt_ids)

    def _checked(self, prompt_ids: list[int], returned: Any) -> list[ScoredGroup]:
        groups = list(returned)
        if len(groups) != len(prompt_ids):
            raise ValueError(
                f"generate returned {len(groups)} groups for {len(prompt_ids)} prompt ids; it "
                "must return exactly one ScoredGroup per prompt id, in the same order"
            )
        tasks = self.pool.prompt_tasks
        for position, (prompt_id, group) in enumerate(zip(prompt_ids, groups, strict=True)):
            if not isinstance(group, ScoredGroup):
                raise TypeError(
                    f"generate must return ScoredGroup objects; got {type(group).__name__} at "
                    f"position {position}"
                )
            if group.prompt_id != prompt_id or group.task != tasks[prompt_id]:
                raise ValueError(
                    f"generate returned a group for prompt {group.prompt_id} (task "
                    f"{group.task}) at position {position}, where prompt {prompt_id} (task "
                    f"{tasks[prompt_id]}) was requested; return the groups in the order of "
                    "the prompt ids with the task of each prompt"
                )
        return groups

    def _update_filter_rate_ema(self, rollouts: _Rollouts) -> None:
        """``ρ_k ← d ρ_k + (1 − d) f_k`` for every task generated in this build."""
        generated = rollouts.generated_counts()
        seen = generated > 0  # a task not generated this build keeps its ρ: no new evidence
        dropped = generated - rollouts.informative_counts()
        fraction = dropped[seen] / generated[seen]  # f_k, the filtered fraction of this build
        decay = self.acceptance_ema
        self._filter_rate_ema[seen] = decay * self._filter_rate_ema[seen] + (1 - decay) * fraction

    def _report(
        self,
        z: np.ndarray,
        target: np.ndarray,
        inflation: np.ndarray,
        rollouts: _Rollouts,
        groups: list[ScoredGroup],
    ) -> SamplingReport:
        generated = rollouts.generated_counts()
        informative = rollouts.informative_counts()
        with np.errstate(invalid="ignore", divide="ignore"):  # 0/0 of an ungenerated task: NaN
            filter_rate = np.where(generated > 0, (generated - informative) / generated, np.nan)
        total_informative = int(informative.sum())
        batch_tasks = np.array([g.task for g in groups], dtype=np.int64)
        return SamplingReport(
            target_weights=z,
            target_counts=np.asarray(target, dtype=np.int64),
            generated_groups=generated,
            informative_groups=informative,
            batch_counts=np.bincount(batch_tasks, minlength=self.num_tasks),
            filter_rate=filter_rate,
            acceptance=self.filter_rate_ema,
            inflation=inflation,
            rounds=rollouts.rounds,
            prompts_generated=rollouts.prompts,
            prompts_per_informative_group=(
                rollouts.prompts / total_informative if total_informative else math.nan
            ),
        )

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: prompt pool position, RNG, ``ρ``."""
        rng_state = self.rng.bit_generator.state
        return {
            "sampler": self.name,
            "num_tasks": self.num_tasks,
            "pool": self.pool.state_dict(),
            # PCG64's 128-bit integers are kept as strings so that any JSON reader keeps them.
            "rng": {
                "bit_generator": rng_state["bit_generator"],
                "state": str(rng_state["state"]["state"]),
                "inc": str(rng_state["state"]["inc"]),
                "has_uint32": int(rng_state["has_uint32"]),
                "uinteger": int(rng_state["uinteger"]),
            },
            "filter_rate_ema": self._filter_rate_ema.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; nothing changes if the state is refused."""
        if state.get("sampler") != self.name or state.get("num_tasks") != self.num_tasks:
            raise ValueError(
                f"this state belongs to sampler {state.get('sampler')!r} with "
                f"{state.get('num_tasks')} tasks; this sampler is {self.name!r} with "
                f"{self.num_tasks} tasks; resume with the same sampler and task set"
            )
        missing = sorted({"pool", "rng", "filter_rate_ema"} - set(state))
        if missing:
            raise ValueError(f"sampler state is missing {missing}; pass a full state_dict()")
        rho = np.asarray(state["filter_rate_ema"], dtype=np.float64)
        if rho.shape != (self.num_tasks,) or not ((rho >= 0) & (rho <= 1)).all():
            raise ValueError(f"filter_rate_ema must be [K] values in [0, 1]; got {rho.tolist()}")
        saved = state["rng"]
        rng = np.random.default_rng()  # a new generator: self.rng changes only once all is checked
        rng.bit_generator.state = {
            "bit_generator": saved["bit_generator"],
            "state": {"state": int(saved["state"]), "inc": int(saved["inc"])},
            "has_uint32": int(saved["has_uint32"]),
            "uinteger": int(saved["uinteger"]),
        }
        self.pool.load_state_dict(state["pool"])  # validates before it changes anything
        self.rng = rng
        self._filter_rate_ema = rho.copy()


SAMPLERS: Registry[type[Sampler]] = Registry("sampler")


@SAMPLERS.register("iid")
class IIDSampler(Sampler):
    """Tasks i.i.d. from ``z``, one generation round, every group returned (plain mixing)."""

    name = "iid"

    def _collect(
        self, z: np.ndarray, size: int, generate: GenerateAndScore, rollouts: _Rollouts
    ) -> tuple[np.ndarray, np.ndarray]:
        counts = self.rng.multinomial(size, z)  # [K]; each prompt's task from z (ALGORITHMS §5)
        self._generate_round(counts, generate, rollouts)
        return np.arange(len(rollouts.groups)), counts


@SAMPLERS.register("dynamic", aliases=("dapo",))
class DynamicSampler(Sampler):
    """DAPO dynamic sampling: oversample with tasks i.i.d. from ``z``, drop zero-gradient groups.

    Args (besides :class:`Sampler`'s):
        oversample_factor: ``M_os``, a round generates ``⌈M_os·B⌉`` prompts.
        max_resample_rounds: ``N_rs``, extra rounds allowed after the first.
    """

    name = "dynamic"

    def __init__(
        self,
        prompt_tasks: Any,
        num_tasks: int,
        *,
        oversample_factor: float = 3.0,  # M_os = 3, N_rs = 10: the MT-GRPO paper's 3-task values
        max_resample_rounds: int = 10,
        **common: Any,
    ) -> None:
        super().__init__(prompt_tasks, num_tasks, **common)
        self.oversample_factor = _positive_float("oversample_factor", oversample_factor)
        self.max_resample_rounds = _rounds(max_resample_rounds)

    def _collect(
        self, z: np.ndarray, size: int, generate: GenerateAndScore, rollouts: _Rollouts
    ) -> tuple[np.ndarray, np.ndarray]:
        per_round = _prompts_per_round(self.oversample_factor, size)
        # Every round draws from z as is: a task the filter drops more often ends up with less
        # than its share of the batch, the drift the RP-sampler corrects.
        self._generate_round(self.rng.multinomial(per_round, z), generate, rollouts)
        extra = 0  # N_rs counts the rounds after the first (decision 6)
        while rollouts.informative_counts().sum() < size and extra < self.max_resample_rounds:
            self._generate_round(self.rng.multinomial(per_round, z), generate, rollouts)
            extra += 1
        informative = rollouts.informative_indices()
        if informative.size > size:
            informative = self.rng.choice(informative, size=size, replace=False)
        return informative, largest_remainder_counts(z, size)  # a target for the report only


@SAMPLERS.register("ratio_preserving", aliases=("rp", "rp_sampler"))
class RatioPreservingSampler(Sampler):
    """MT-GRPO's RP-sampler with acceptance-aware sampling (Algorithm 2 of arXiv 2602.05547).

    Args (besides :class:`Sampler`'s):
        oversample_factor: ``M_os`` (paper 3), a round generates ``⌈M_os·B⌉`` prompts.
        max_resample_rounds: ``N_rs`` (paper 10 for 3 tasks, 2 for 9), extra rounds allowed.
        acceptance_aware: use AAS inflation ``m`` (paper: off in Exp-1, on in Exp-2; default on).
        max_acceptance_inflation: ``M_acc`` (paper 5), the cap on ``m_k``; must be >= 1.
        target_rounding: ``"multinomial"`` (the paper) or ``"largest_remainder"``.
    """

    name = "ratio_preserving"

    def __init__(
        self,
        prompt_tasks: Any,
        num_tasks: int,
        *,
        oversample_factor: float = 3.0,
        max_resample_rounds: int = 10,  # Exp-1's N_rs (Exp-2, with AAS on, used 2)
        acceptance_aware: bool = True,  # Exp-2's AAS on (decision 7)
        max_acceptance_inflation: float = 5.0,  # M_acc = 5, the paper's value
        target_rounding: str = "multinomial",
        **common: Any,
    ) -> None:
        super().__init__(prompt_tasks, num_tasks, **common)
        self.oversample_factor = _positive_float("oversample_factor", oversample_factor)
        self.max_resample_rounds = _rounds(max_resample_rounds)
        if not isinstance(acceptance_aware, bool):
            raise TypeError(f"acceptance_aware must be True or False; got {acceptance_aware!r}")
        self.acceptance_aware = acceptance_aware
        cap = _positive_float("max_acceptance_inflation", max_acceptance_inflation)
        if cap < 1:
            raise ValueError(
                f"max_acceptance_inflation (M_acc) must be >= 1 since m_k >= 1; got {cap}"
            )
        self.max_acceptance_inflation = cap
        self.target_rounding = TARGET_ROUNDINGS.canonical(target_rounding)

    def _inflation(self) -> np.ndarray:  # [K]
        """``m_k = min(1 / max(1 − ρ_k, 0.01), M_acc)`` with AAS, else 1."""
        if not self.acceptance_aware:
            return np.ones(self.num_tasks)
        # Algorithm 2's floor 0.01: a task whose groups are all filtered gets the cap, not 1/0.
        acceptance = np.maximum(1 - self._filter_rate_ema, _MIN_ACCEPTANCE)
        return np.minimum(1 / acceptance, self.max_acceptance_inflation)

    def _collect(
        self, z: np.ndarray, size: int, generate: GenerateAndScore, rollouts: _Rollouts
    ) -> tuple[np.ndarray, np.ndarray]:
        # Algorithm 2: n is drawn from z before generating, so the batch follows the weights
        # rather than whichever tasks the filter happens to spare.
        target = TARGET_ROUNDINGS.get(self.target_rounding)(z, size, self.rng)  # [K]
        m = self._inflation()  # [K]
        per_round = _prompts_per_round(self.oversample_factor, size)
        # AAS: ẑ ∝ z ⊙ m generates more of the tasks whose groups the filter tends to drop.
        self._generate_round(
            self.rng.multinomial(per_round, _normalised(z * m)), generate, rollouts
        )
        extra = 0
        while (deficit := np.maximum(target - rollouts.informative_counts(), 0)).sum() > 0 and (
            extra < self.max_resample_rounds
        ):
            # Algorithm 2: later rounds go only to the tasks still short, ∝ deficit ⊙ m.
            weights = _normalised(deficit * m)
            self._generate_round(self.rng.multinomial(per_round, weights), generate, rollouts)
            extra += 1
        return self._select(target, size, rollouts), target

    def _select(self, target: np.ndarray, size: int, rollouts: _Rollouts) -> np.ndarray:
        """First ``n_k`` informative groups of each task, topped up at random to ``size``."""
        informative = rollouts.informative_indices()  # generation order
        tasks = rollouts.tasks()[informative]
        # ALGORITHMS.md §5: at most n_k groups per task, the first generated.
        kept = [informative[tasks == k][: target[k]] for k in range(self.num_tasks)]
        chosen = np.concatenate(kept)
        leftovers = np.setdiff1d(informative, chosen)  # sorted: generation order
        # A task still short after N_rs rounds gives its places to others (any task), so the
        # batch stays at B whenever B informative groups exist.
        top_up = min(size - chosen.size, leftovers.size)
        # ALGORITHMS.md §5: the top-up is random leftovers, not the next in generation order.
        extra = self.rng.choice(leftovers, size=top_up, replace=False)
        return np.concatenate([chosen, extra]).astype(np.int64)


def _options(cls: type[Sampler]) -> list[str]:
    """Keyword options of a sampler class and its bases, minus what make_sampler sets itself."""
    names: set[str] = set()
    for klass in cls.__mro__[: cls.__mro__.index(Sampler) + 1]:
        for param in inspect.signature(klass.__init__).parameters.values():
            if param.kind is inspect.Parameter.KEYWORD_ONLY:
                names.add(param.name)
    return sorted(names - {"seed", "zero_gradient_filter", "shuffle"})


def check_sampler_params(name: str, params: Mapping[str, Any]) -> None:
    """Validate ``batch_construction_params`` for the sampler ``name`` without a dataset (the
    configuration calls this, before any model loads; :func:`make_sampler` too): an unknown
    option is an error listing the valid ones, a bad value the error its sampler raises."""
    cls = SAMPLERS.get(name)
    valid = _options(cls)
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ValueError(
            f"sampler {cls.name!r} has no option(s) {unknown}; valid options: {', '.join(valid)}"
        )
    # One prompt is enough to run the constructor's own checks before any dataset is loaded.
    cls(np.zeros(1, dtype=np.int64), 1, **params)


def make_sampler(
    name: str,
    prompt_tasks: Any,
    num_tasks: int,
    *,
    seed: int = 0,
    zero_gradient_filter: str = "strict",
    shuffle: bool = True,
    **params: Any,
) -> Sampler:
    """Build the sampler registered as ``name`` (see :data:`SAMPLERS`).

    Args:
        name: ``iid``, ``dynamic`` (``dapo``) or ``ratio_preserving`` (``rp``).
        prompt_tasks: ``[num_prompts]`` task index of every prompt of the training set.
        num_tasks: ``K``.
        seed: seeds the prompt order and the sampler's RNG.
        zero_gradient_filter: a name in :data:`ZERO_GRADIENT_FILTERS`.
        shuffle: shuffled prompt order per epoch (False: dataset order).
        params: the sampler's options (``oversample_factor``, ``max_resample_rounds``,
            ``acceptance_ema``, ...); an unknown option is an error listing the valid ones.
    """
    check_sampler_params(name, params)
    return SAMPLERS.get(name)(
        prompt_tasks, num_tasks, seed=seed, zero_gradient_filter=zero_gradient_filter,
        shuffle=shuffle, **params,
    )
