"""Task-weighting strategies: a distribution ``z`` over ``K`` tasks, updated once per step.

Every strategy keeps ``z`` on the simplex (finite, non-negative, summing to 1) and has one small
interface (ALGORITHMS.md §4; names are registered in :data:`WEIGHTINGS`)::

    strategy = make_weighting("mt_grpo", num_tasks=K, lam=0.25)
    strategy.weights                  # np.ndarray [K], a copy
    strategy.update(TaskStats(...))   # -> np.ndarray [K], the new weights
    strategy.state_dict() / strategy.load_state_dict(state)

Strategies. The logit strategies keep ``ξ [K]`` with ``z = softmax(ξ)`` and ``ξ_0 = 0``; their
gradient is that of the robust objective ``Σ_k z_k s_k`` with respect to ``ξ``,
``g_k = z_k (s_k − Σ_j z_j s_j)``, and the update *descends* it, so a task whose signal ``s_k``
lies below the ``z``-weighted mean gains weight.

``uniform``
    ``z = 1/K`` always.
``fixed``
    The user's weights, normalised.
``worst_case``
    ``s_k = J_k``; ``ξ ← ξ − β g``. Without damping ``z`` collapses onto the current worst task
    (one-hot in the limit): a baseline for the minimax objective with ``ε = 0``, not a recipe.
``regularized``
    ``s_k = J_k``; ``ξ ← ξ − β (g + η ξ)``. The damping ``η ξ`` pulls ``ξ`` back towards 0
    (uniform weights) and stops the collapse. Paper values ``η ∈ {1e-2, 5e-4, 1e-5}``.
``mt_grpo`` (MT-GRPO's improvement-aware weight update, IWU; Ramesh et al., arXiv 2602.05547)
    ``s_k = I_k + λ J_k``. ``I_k`` is the change of task ``k``'s GRPO objective across the
    policy update (measured by the trainer), optionally clipped to ``[−c, c]``. Large ``λ``
    behaves like ``worst_case`` (robustness); ``λ = 0`` follows improvement only (balanced
    progress). Default optimizer ``"sgd"`` is the paper's text, ``ξ ← ξ − β (g + η ξ)``;
    ``"adam"`` is the released code (Adam on ``ξ`` with ``lr = 0.025``, betas ``(0.9, 0.999)``,
    ``eps = 1e-8`` and L2 weight decay ``η`` added to the gradient as ``torch.optim.Adam`` does).
    ``reward_ema`` > 0 feeds ``J`` as an exponential moving average of the batch value, as the
    released code does with decay 0.5; the default 0 is the paper's raw batch value.
``sec`` (Self-Evolving Curriculum; Chen et al., arXiv 2505.14970)
    One bandit arm per task, reward ``r_k`` = mean ``|A|`` over task ``k``'s rollouts this step;
    ``Q ← (1 − α) Q + α r``; ``z = softmax(Q / τ)``.

A floor on every weight. ``worst_case``, ``regularized``, ``mt_grpo`` and ``sec`` take
``min_weight`` ``ε ∈ [0, 1/K]`` (default 0, none): the weights they hand out are
``z = (1 − Kε) p + ε`` with ``p`` the strategy's own softmax, so every task keeps at least
``ε`` of the batch however far the others pull ahead (Exp3's exploration mixing, Auer et al.
2002). The strategy itself moves as without the floor: its logits, its gradient
``g_k = p_k (s_k − Σ_j p_j s_j)`` and its diagnostics use ``p``; ``ε = 1/K`` is uniform.

Absent tasks. A task is *present* in a step when ``count_k > 0``; for a present task ``NaN``
means "not measured" and ``±inf`` is an error. The values of an absent task are ignored
whatever they are (``NaN``, ``inf``, stale numbers). The reward- and improvement-driven
strategies (``worst_case``, ``regularized``, ``mt_grpo``) then use:

- a task present with a measured ``J_k``: the new ``J_k`` (or its EMA) and its measured ``I_k``;
- a task observed before but not this step: its last ``J_k`` and ``I_k = 0`` (no measured
  change);
- a task never observed: ``s_k`` = the ``z``-weighted mean of the observed tasks' signals, which
  makes its own gradient exactly 0 until it is seen (its weight still moves through the softmax
  normalisation, as every weight does).

SEC gives absent arms the reward ``r = 0``, its paper's rule. When no task at all is observed in
a step (nothing to learn from), no strategy changes its weights or optimizer state.

Numerical safety. ``softmax`` subtracts the maximum before ``exp``; logits are kept within
``±1e150`` and non-finite gradient entries (``inf · 0`` from an underflowed weight) are zeroed,
so weights stay finite and on the simplex for any finite step size, ``K = 1`` included.

Held-out signal (ours; neither paper does it). ``task_weighting_signal: validation`` feeds the
strategies :class:`TaskStats` read from periodic evaluations of a validation split
(:class:`ValidationSignal`) instead of the training batch's: ``J_k`` is the task's held-out
accuracy, ``I_k`` its change per step between successive evaluations, SEC's ``|A|`` the mean
over its held-out completions. See :class:`ValidationSignal` for the formula and where it
departs from the paper.

Deliberate choices where the sources are silent: the first observation of a task initialises
its EMA (a zero-initialised EMA would make a new task look failing and pull weight to it); the
default ``"sgd"`` step size is 0.5, which moves a logit by 0.005–0.05 per step for the typical
gradient sizes 0.01–0.1, the same order as the released code's Adam step of 0.025.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

import numpy as np

from mtgrpo.algo.metrics import task_accuracy
from mtgrpo.algo.registry import Registry

__all__ = [
    "DEFAULT_ADAM_STEP_SIZE",
    "DEFAULT_SGD_STEP_SIZE",
    "IMPROVEMENT_REDUCTIONS",
    "TASK_WEIGHTING_SIGNALS",
    "WEIGHTINGS",
    "FixedWeighting",
    "ImprovementReduction",
    "MTGRPOWeighting",
    "RegularizedWeighting",
    "SECWeighting",
    "TaskStats",
    "TaskWeightingSignal",
    "UniformWeighting",
    "ValidationSignal",
    "WeightingParam",
    "WeightingStrategy",
    "WorstCaseWeighting",
    "check_weighting_params",
    "floored",
    "gradient_parts",
    "improvement_by_task",
    "improvement_share",
    "improvement_sizes",
    "make_weighting",
    "reads_task_stats",
    "simplex_gradient",
    "softmax",
]

# Ours (the paper gives no value): moves a logit 0.005–0.05 per step at gradients 0.01–0.1,
# the order of the released code's Adam step.
DEFAULT_SGD_STEP_SIZE = 0.5
DEFAULT_ADAM_STEP_SIZE = 0.025  # the released MT-GRPO code's Adam lr on ξ
ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, which the released code runs with
ADAM_EPS = 1e-8
# Far beyond where softmax saturates (a logit gap of ~745 already gives weight 0 in float64),
# yet small enough that Adam's squared gradient (≤ (2e150)²) never overflows.
_LIMIT = 1e150
_MAX_LISTED = 6


# ---------------------------------------------------------------------------------------------
# Inputs


def _as_vector(field: str, values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == np.float64:
        array = values
    else:
        try:
            array = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"TaskStats.{field} must be a sequence of numbers, one per task; got "
                f"{type(values).__name__} ({error})"
            ) from None
    if array.ndim != 1:
        raise ValueError(
            f"TaskStats.{field} must be one-dimensional with one entry per task (shape [K]); "
            f"got shape {array.shape}"
        )
    return array


def _as_counts(values: Any) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype.kind == "f":
        if not (np.isfinite(array).all() and (array == np.round(array)).all()):
            raise ValueError(
                f"TaskStats.count must hold whole numbers of rollouts per task; got "
                f"{array.tolist()}"
            )
        array = array.astype(np.int64)
    elif array.dtype.kind not in "iu":
        raise TypeError(
            f"TaskStats.count must be integers (rollouts per task); got dtype {array.dtype}"
        )
    if array.ndim != 1:
        raise ValueError(f"TaskStats.count must have shape [K]; got shape {array.shape}")
    if (array < 0).any():
        raise ValueError(f"TaskStats.count must be >= 0 (0 = task absent); got {array.tolist()}")
    return array


@dataclass(frozen=True)
class TaskStats:
    """What one training step measured per task; the input of :meth:`WeightingStrategy.update`.

    Fields (``K`` tasks, in the strategy's task order; coerced to numpy vectors on creation):

    - ``accuracy [K]``: ``J_k``, the fraction of task ``k``'s rollouts counted correct this
      step (:func:`mtgrpo.algo.metrics.task_accuracy`), measured before zero-gradient filtering.
      ``NaN`` = absent / not measured. (The papers call ``J_k`` the task's reward; with their
      0/1 correctness reward the two are the same number.)
    - ``count [K]``: rollouts of task ``k`` this step; 0 marks the task absent.
    - ``improvement [K] | None``: ``I_k``, the change of task ``k``'s GRPO objective across the
      policy update (needed by ``mt_grpo``). ``NaN`` = absent / not measured.
    - ``mean_abs_advantage [K] | None``: mean ``|A|`` over task ``k``'s rollouts (needed by
      ``sec``). ``NaN`` = absent.
    """

    accuracy: np.ndarray  # [K]
    count: np.ndarray  # [K] int
    improvement: np.ndarray | None = None  # [K]
    mean_abs_advantage: np.ndarray | None = None  # [K]

    def __post_init__(self) -> None:
        # Frozen dataclass: the coercion goes through object.__setattr__.
        object.__setattr__(self, "accuracy", _as_vector("accuracy", self.accuracy))
        object.__setattr__(self, "count", _as_counts(self.count))
        for field in ("improvement", "mean_abs_advantage"):
            value = getattr(self, field)
            if value is not None:
                object.__setattr__(self, field, _as_vector(field, value))
        sizes = {f: len(v) for f, v in self._fields().items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(
                f"TaskStats fields must all have one entry per task; got sizes {sizes}"
            )

    @classmethod
    def from_rollouts(
        cls,
        task_ids: np.ndarray,
        correct: np.ndarray,
        num_tasks: int,
        *,
        abs_advantages: np.ndarray | None = None,
        improvement: np.ndarray | None = None,
    ) -> TaskStats:
        """Per-task statistics of one step's rollouts.

        ``task_ids [N]`` (task index of each rollout), ``correct [N]`` (bool),
        ``abs_advantages [N]`` (optional, for SEC), ``improvement [K]`` (optional, for
        MT-GRPO, see :func:`improvement_by_task`). ``J_k`` is the mean of ``correct`` over task
        ``k``'s rollouts, ``NaN`` (absent) where the task has none.
        """
        task_ids = np.asarray(task_ids, dtype=np.int64)  # [N]
        count = np.bincount(task_ids, minlength=num_tasks)  # [K]
        present = count > 0
        mean_abs = None
        if abs_advantages is not None:
            # SEC's arm reward: mean |A|, its proxy for how much a task can still teach.
            total = np.bincount(task_ids, weights=np.asarray(abs_advantages, dtype=np.float64),
                                minlength=num_tasks)
            # maximum(count, 1) only keeps 0/0 out: an absent task's entry is NaN.
            mean_abs = np.where(present, total / np.maximum(count, 1), np.nan)
        return cls(accuracy=task_accuracy(task_ids, correct, num_tasks), count=count,
                   improvement=improvement, mean_abs_advantage=mean_abs)

    def _fields(self) -> dict[str, np.ndarray]:
        fields = {"accuracy": self.accuracy, "count": self.count}
        if self.improvement is not None:
            fields["improvement"] = self.improvement
        if self.mean_abs_advantage is not None:
            fields["mean_abs_advantage"] = self.mean_abs_advantage
        return fields


ImprovementReduction = Literal["mean", "sum"]
IMPROVEMENT_REDUCTIONS: tuple[str, ...] = get_args(ImprovementReduction)


def improvement_by_task(
    task_ids: np.ndarray, before: np.ndarray, after: np.ndarray, num_tasks: int,
    reduction: str = "mean",
) -> np.ndarray:
    """MT-GRPO's improvement ``I_k``: the change of task k's GRPO objective across the update,
    on the same samples.

    ``task_ids [n]``, ``before [n]`` and ``after [n]`` the per-sequence GRPO objective of the
    trained samples before and after the policy update. ``reduction="mean"`` (the paper's text:
    ``J_k`` is an expectation over the task's samples) averages the change over task k's
    samples, so ``I_k`` does not grow with the number of samples a task has in the batch;
    ``"sum"`` is the released code (minus the change of the *summed* per-sequence loss), which
    relies on clipping ``I_k`` to ±0.1 / ±0.2. Returns ``[K]``, ``NaN`` for tasks without
    trained samples.
    """
    if reduction not in IMPROVEMENT_REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} must be 'mean' (paper) or 'sum' (code)")
    task_ids = np.asarray(task_ids, dtype=np.int64)
    # On the same samples before and after the step, so only the update moves I_k.
    change = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)
    total = np.bincount(task_ids, weights=change, minlength=num_tasks)  # [K]
    count = np.bincount(task_ids, minlength=num_tasks)
    # "sum" keeps the released code's total, which grows with the task's share of the batch.
    if reduction == "mean":
        total = total / np.maximum(count, 1)  # count 0 is masked to NaN below
    return np.where(count > 0, total, np.nan)


# ---------------------------------------------------------------------------------------------
# Pure helpers


def softmax(logits: np.ndarray) -> np.ndarray:
    """``z_k = exp(x_k − max x) / Σ_j exp(x_j − max x)``: finite and on the simplex.

    Subtracting the maximum keeps every exponent ``<= 0`` (no overflow) and the largest term
    equal to 1 (no division by 0). ``+inf`` entries share the mass equally; all ``−inf`` gives
    uniform weights. ``NaN`` is an error of the caller.
    """
    logits = np.asarray(logits, dtype=np.float64)  # [K]
    top = logits.max()
    if not math.isfinite(top):
        return _softmax_nonfinite(logits)
    weights = np.exp(logits - top)
    weights /= weights.sum()
    return weights


def _softmax_nonfinite(logits: np.ndarray) -> np.ndarray:
    if np.isnan(logits).any():
        raise ValueError(f"softmax got NaN logits: {logits.tolist()}")
    winners = logits == np.inf  # the limit of softmax as these logits grow together
    if not winners.any():  # every logit is -inf: no preference at all
        winners = np.ones_like(winners)
    return winners / winners.sum()


def simplex_gradient(weights: np.ndarray, signal: np.ndarray) -> np.ndarray:
    """Gradient of ``Σ_k z_k s_k`` with respect to the logits ``ξ`` of ``z = softmax(ξ)``.

    ``g_k = z_k (s_k − Σ_j z_j s_j)`` (MT-GRPO, Subroutine 1). Entries are finite for finite
    inputs of moderate size; ``inf · 0`` from an underflowed weight becomes 0, an overflowed
    difference is capped, so the caller's step stays finite.
    """
    with np.errstate(over="ignore", invalid="ignore"):  # handled just below
        gradient = weights * (signal - weights @ signal)  # [K]
    if not np.isfinite(gradient).all():
        # inf · 0 (NaN) comes from a task whose weight underflowed: it has nothing to move.
        gradient = np.clip(np.nan_to_num(gradient, nan=0.0), -_LIMIT, _LIMIT)
    return gradient


def _bounded(logits: np.ndarray) -> np.ndarray:
    if np.abs(logits).max() <= _LIMIT:
        return logits
    assert not np.isnan(logits).any(), "logit update produced NaN"
    # Bounded logits keep η ξ, hence Adam's squared gradient, finite (see _LIMIT).
    return np.clip(logits, -_LIMIT, _LIMIT)


def floored(weights: np.ndarray, min_weight: float) -> np.ndarray:
    """``(1 − Kε) p + ε`` for ``p = weights [K]`` on the simplex and ``ε = min_weight`` in
    ``[0, 1/K]``: every entry at least ``ε``, the sum still 1, the order of the entries kept
    (``ε = 0`` returns ``p`` itself, ``ε = 1/K`` the uniform weights)."""
    if min_weight == 0.0:
        return weights
    return (1.0 - len(weights) * min_weight) * weights + min_weight  # Exp3's exploration mix


def gradient_parts(improvement: np.ndarray, reward: np.ndarray,
                   weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two parts of MT-GRPO's logit gradient ``g_k = z_k (s_k − Σ_j z_j s_j)``, ``s = I +
    λJ``, each ``[K]``, for ``t = I`` and ``t = reward = λJ``: ``z_k (t_k − m_t)`` with ``m_t``
    the ``z``-weighted mean of ``t`` over the tasks with a ``J`` (``reward`` finite), and 0 for
    the others, as the update forms ``g`` (an unmeasured ``I`` counts as 0, no change). They sum
    to the ``g`` of that update. With ``optimizer: sgd`` (the default) the update steps against
    ``g`` (``ξ ← ξ − β (g + η ξ)``), so a negative entry raises that task's logit; with
    ``adam`` the step follows a running average of ``g``, scaled per task. The two parts may
    partly cancel.

    A part whose L1 norm is within rounding of the term's magnitude (equal values, which centre
    to a residue of the weighted mean) is 0. Both are 0 when no observed task has weight.
    """
    improvement = np.asarray(improvement, dtype=np.float64)  # [K]
    reward = np.asarray(reward, dtype=np.float64)  # [K]
    weights = np.asarray(weights, dtype=np.float64)  # [K]
    seen = np.isfinite(reward)
    if not (weights[seen] > 0.0).any():
        return np.zeros_like(reward), np.zeros_like(reward)
    parts = []
    for term in (improvement, reward):
        term = np.where(seen & np.isfinite(term), term, 0.0)
        part = _observed_gradient(weights, term, seen)  # [K]
        # 8 ulps of the term: equal values centre to a rounding residue, which is no signal.
        floor = 8 * np.finfo(np.float64).eps * float(np.abs(term).max())
        parts.append(part if np.abs(part).sum() > floor else np.zeros_like(part))
    return parts[0], parts[1]


def improvement_sizes(improvement: np.ndarray, reward: np.ndarray,
                      weights: np.ndarray) -> tuple[float, float]:
    """The sizes of the two parts of MT-GRPO's logit gradient (:func:`gradient_parts`): their
    L1 norms ``Σ_k z_k |t_k − m_t|`` for ``t = I [K]`` and ``t = reward = λJ [K]``, over the
    tasks with a ``J``. Measured on ``g``, before the optimizer (Adam rescales it; damping adds
    ``η ξ``). ``(0, 0)`` when no observed task has weight."""
    part_i, part_j = gradient_parts(improvement, reward, weights)
    return float(np.abs(part_i).sum()), float(np.abs(part_j).sum())


def improvement_share(improvement: np.ndarray, reward: np.ndarray, weights: np.ndarray) -> float:
    """The improvement ``I [K]``'s share of MT-GRPO's logit gradient beside ``reward = λJ
    [K]``: ``size(I) / (size(I) + size(λJ))`` of :func:`improvement_sizes`. NaN when neither
    part is there, or when no task with a ``J`` had its ``I`` measured (an update that was
    skipped), so such a step does not read as "no improvement"."""
    seen = np.isfinite(np.asarray(reward, dtype=np.float64))
    if not (seen & np.isfinite(np.asarray(improvement, dtype=np.float64))).any():
        return math.nan
    size_i, size_j = improvement_sizes(improvement, reward, weights)
    return size_i / (size_i + size_j) if size_i + size_j > 0.0 else math.nan


def _fill_unseen(signal: np.ndarray, seen: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Give never-observed tasks the ``z``-weighted mean signal of the observed ones.

    With ``s_u = m = Σ_seen z s / Σ_seen z`` the baseline ``Σ_j z_j s_j`` equals ``m`` as
    well, so ``g_u = z_u (m − m) = 0``: an unseen task is neither favoured nor penalised, and
    the observed tasks are centred on their own weighted mean. (:func:`_observed_gradient`
    also sets ``g_u`` to exactly 0, removing the rounding residue.)
    """
    if seen.all():
        return signal
    seen_weights = np.where(seen, weights, 0.0)  # [K]
    total = seen_weights.sum()
    if total == 0.0:  # every observed weight underflowed: fall back to the plain mean
        seen_weights, total = seen.astype(np.float64), float(seen.sum())
    mean = seen_weights @ np.where(seen, signal, 0.0) / total
    return np.where(seen, signal, mean)


def _observed_gradient(weights: np.ndarray, signal: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """The logit gradient :func:`simplex_gradient` over the observed tasks: the unseen ones
    filled by :func:`_fill_unseen`, and their entries set to exactly 0, not a rounding
    residue that Adam would amplify. ``[K]``."""
    gradient = simplex_gradient(weights, _fill_unseen(signal, seen, weights))  # [K]
    return gradient if seen.all() else np.where(seen, gradient, 0.0)


# ---------------------------------------------------------------------------------------------
# Parameters


@dataclass(frozen=True)
class WeightingParam:
    """One user-facing parameter of a strategy: its rule, for validation and error messages.

    ``kind="float"``: a finite number in ``[low, high]`` (``low_open``/``high_open`` make an end
    exclusive; ``optional`` also allows ``None``). ``kind="choice"``: one of ``choices``.
    ``kind="weights"``: validated by the strategy itself (it needs ``K`` and the task names).
    """

    name: str
    description: str
    kind: Literal["float", "choice", "weights"] = "float"
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    optional: bool = False
    choices: tuple[str, ...] = ()

    def rule(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.kind == "weights":
            return "K non-negative numbers, not all 0 (or a {task name: weight} mapping)"
        left = "(" if self.low_open or self.low == -math.inf else "["
        right = ")" if self.high_open or self.high == math.inf else "]"
        rule = f"a finite number in {left}{self.low:g}, {self.high:g}{right}"
        return rule + " or None" if self.optional else rule

    def check(self, strategy: str, value: Any) -> Any:
        if self.kind == "weights" or (self.optional and value is None):
            return value
        if self.kind == "choice":
            if isinstance(value, str) and value.lower() in self.choices:
                return value.lower()
        # bool is an int subclass: a YAML `true` must not pass as 1.0.
        elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, bool
        ):
            number = float(value)
            low_ok = number > self.low if self.low_open else number >= self.low
            high_ok = number < self.high if self.high_open else number <= self.high
            if math.isfinite(number) and low_ok and high_ok:
                return number
        raise ValueError(
            f"{strategy} parameter {self.name!r} must be {self.rule()}; got {value!r}. "
            f"Fix: pass a valid value ({self.description})"
        )


def _describe_params(cls: type[WeightingStrategy]) -> str:
    defaults = _defaults(cls)
    parts = []
    for param in cls.PARAMS:
        default = defaults.get(param.name, inspect.Parameter.empty)
        shown = "required" if default is inspect.Parameter.empty else f"default {default!r}"
        parts.append(f"{param.name} ({param.rule()}; {shown})")
    return "; ".join(parts) if parts else "none"


def _defaults(cls: type[WeightingStrategy]) -> dict[str, Any]:
    signature = inspect.signature(cls.__init__)
    return {name: p.default for name, p in signature.parameters.items() if p.kind == p.KEYWORD_ONLY}


# ---------------------------------------------------------------------------------------------
# Strategy base


def _check_num_tasks(num_tasks: Any) -> int:
    if isinstance(num_tasks, bool) or not isinstance(num_tasks, (int, np.integer)):
        raise TypeError(f"num_tasks must be an int >= 1; got {num_tasks!r}")
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1 (one weight per task); got {num_tasks}")
    return int(num_tasks)


def _check_task_names(task_names: Sequence[str] | None, num_tasks: int) -> tuple[str, ...] | None:
    if task_names is None:
        return None
    if isinstance(task_names, str) or not all(isinstance(n, str) for n in task_names):
        raise TypeError(f"task_names must be a sequence of strings; got {task_names!r}")
    names = tuple(task_names)
    if len(names) != num_tasks:
        raise ValueError(
            f"task_names has {len(names)} names for num_tasks={num_tasks}; give one name per task"
        )
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"task_names must be unique; repeated: {', '.join(duplicates)}")
    return names


class WeightingStrategy(ABC):
    """Base of every strategy: validation, the weights vector, steps and ``state_dict``.

    Subclasses set ``name`` (the registry name), ``PARAMS`` (their parameters' rules),
    ``REQUIRES`` (the optional :class:`TaskStats` fields they read) and implement ``_update``
    (and ``_state``/``_load_state`` when they carry state). ``weights`` is a copy; ``steps``
    counts the updates that changed the state (a step where no task was observed does not).
    """

    name: ClassVar[str]
    PARAMS: ClassVar[tuple[WeightingParam, ...]] = ()
    REQUIRES: ClassVar[tuple[str, ...]] = ()
    READS_STATS: ClassVar[bool] = True  # False: the weights ignore what update() is given

    def __init__(
        self, num_tasks: int, *, task_names: Sequence[str] | None, params: Mapping[str, Any]
    ) -> None:
        self.num_tasks = _check_num_tasks(num_tasks)
        self.task_names = _check_task_names(task_names, self.num_tasks)
        rules = {p.name: p for p in self.PARAMS}
        self.params: dict[str, Any] = {k: rules[k].check(self.name, v) for k, v in params.items()}
        if "min_weight" in self.params:
            _check_min_weight(self.name, self.params["min_weight"], self.num_tasks)
        self._weights = np.full(self.num_tasks, 1.0 / self.num_tasks)  # [K]; ξ_0 = 0 (paper)
        self.steps = 0

    def _floored(self, weights: np.ndarray) -> np.ndarray:
        """``weights [K]`` with the strategy's ``min_weight`` floor (:func:`floored`; none
        when the strategy has no such parameter)."""
        return floored(weights, self.params.get("min_weight", 0.0))

    @property
    def weights(self) -> np.ndarray:
        """Current task weights ``z [K]`` (a copy: finite, non-negative, sum 1)."""
        return self._weights.copy()

    def update(self, stats: TaskStats) -> np.ndarray:
        """Validate ``stats``, update the strategy and return the new weights ``[K]`` (a copy)."""
        present = self._check_stats(stats)  # [K] bool
        # Overflow on absurd inputs is absorbed by the bounds on logits and gradients.
        with np.errstate(over="ignore", invalid="ignore"):
            self._update(stats, present)
        return self._weights.copy()

    @abstractmethod
    def _update(self, stats: TaskStats, present: np.ndarray) -> None: ...

    def diagnostics(self) -> dict[str, float]:
        """Scalars about the last update that the trainer logs beside the weights (as
        ``weighting/<name>``); none unless a strategy has something to say (``mt_grpo``)."""
        return {}

    def _state(self) -> dict[str, Any]:
        return {}

    def _load_state(self, state: Mapping[str, Any]) -> None:
        return None

    def _task(self, k: int) -> str:
        return repr(self.task_names[k]) if self.task_names else f"#{k}"

    def _tasks(self, mask: np.ndarray) -> str:
        indices = np.flatnonzero(mask)
        shown = ", ".join(self._task(int(k)) for k in indices[:_MAX_LISTED])
        return shown + (
            f" and {len(indices) - _MAX_LISTED} more" if len(indices) > _MAX_LISTED else ""
        )

    def _check_stats(self, stats: TaskStats) -> np.ndarray:
        """Shapes, required fields and value rules; returns the present mask ``count > 0``."""
        if not isinstance(stats, TaskStats):
            raise TypeError(f"update() takes a TaskStats; got {type(stats).__name__}")
        for field in self.REQUIRES:
            if getattr(stats, field) is None:
                raise ValueError(self._missing_field_message(field))
        if len(stats.count) != self.num_tasks:
            names = f" ({', '.join(self.task_names)})" if self.task_names else ""
            raise ValueError(
                f"TaskStats has {len(stats.count)} entries per field but this {self.name} "
                f"strategy weights {self.num_tasks} tasks{names}; pass one value per task, in "
                f"the strategy's task order"
            )
        present = stats.count > 0  # [K]
        # Only present tasks: an absent task's values are ignored whatever they hold.
        for field, values in stats._fields().items():
            if field != "count" and (bad := np.isinf(values) & present).any():
                raise ValueError(
                    f"TaskStats.{field} is infinite for present task(s) {self._tasks(bad)}; "
                    f"pass a finite value, or NaN when it was not measured"
                )
        advantage = stats.mean_abs_advantage
        if advantage is not None and (bad := (advantage < 0) & present).any():
            raise ValueError(
                f"TaskStats.mean_abs_advantage must be >= 0 (a mean of |A|); negative for "
                f"task(s) {self._tasks(bad)}"
            )
        return present

    def _missing_field_message(self, field: str) -> str:
        return f"the {self.name} strategy needs TaskStats.{field}; it is None"

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (lists, floats, ints, strings; ``None`` stands for NaN)."""
        return {
            "strategy": self.name,
            "num_tasks": self.num_tasks,
            "task_names": list(self.task_names) if self.task_names else None,
            # Deep: fixed's weights are a list that the saved state must not share.
            "params": copy.deepcopy(self.params),
            "steps": self.steps,
            **self._state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output; the strategy then continues exactly as before.

        The strategy must have been built with the same name, task count, task names (when both
        sides have them) and parameters: a silent mismatch would make a resumed run differ.
        """
        self._check_header(state)
        self._load_state(state)
        self.steps = int(state["steps"])

    def _check_header(self, state: Mapping[str, Any]) -> None:
        missing = {"strategy", "num_tasks", "params", "steps"} - set(state)
        if missing:
            raise ValueError(f"not a weighting state_dict: missing keys {sorted(missing)}")
        mine = (self.name, self.num_tasks)
        theirs = (state["strategy"], state["num_tasks"])
        if mine != theirs:
            raise ValueError(
                f"state_dict is for strategy {theirs[0]!r} over {theirs[1]} tasks, but this is "
                f"{mine[0]!r} over {mine[1]} tasks; build the strategy the state came from"
            )
        saved_names = state.get("task_names")
        if saved_names and self.task_names and tuple(saved_names) != self.task_names:
            raise ValueError(
                f"state_dict task order {saved_names} differs from this strategy's "
                f"{list(self.task_names)}; weights would be applied to the wrong tasks"
            )
        # A parameter added since the state was saved reads as its default (the behaviour the
        # saved run had), so older checkpoints resume.
        defaults = _defaults(type(self))
        for key in sorted(set(state["params"]) | set(self.params)):
            saved, current = state["params"].get(key, defaults.get(key)), self.params.get(key)
            if saved != current:
                raise ValueError(
                    f"state_dict was saved with {self.name} parameter {key}={saved!r}, but this "
                    f"strategy has {key}={current!r}; build it with state['params'] to resume"
                )


def _to_json(values: np.ndarray) -> list[float | None]:
    # JSON has no NaN; None stands for it (state_dict's contract).
    return [float(v) if math.isfinite(v) else None for v in values.tolist()]


def _from_json(state: Mapping[str, Any], key: str, size: int) -> np.ndarray:
    values = state.get(key)
    if not isinstance(values, list) or len(values) != size:
        raise ValueError(f"state_dict[{key!r}] must be a list of {size} numbers; got {values!r}")
    return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# Registry and factory

WEIGHTINGS: Registry[type[WeightingStrategy]] = Registry("weighting strategy")


def check_weighting_params(name: str, params: Mapping[str, Any]) -> None:
    """Validate ``task_weighting_params`` for the strategy ``name`` without building it (the
    configuration calls this, before any model loads; :func:`make_weighting` too).

    Unknown names list the registered ones; unknown or missing parameters list the valid ones
    with their allowed ranges and defaults; invalid values say the rule they break (the task
    weights of ``fixed`` are checked against the tasks when the strategy is built).
    """
    cls = WEIGHTINGS.get(name)
    rules = {p.name: p for p in cls.PARAMS}
    for key in params:
        if key not in rules:
            close = difflib.get_close_matches(key, sorted(rules), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"unknown parameter {key!r} for weighting strategy {cls.name!r}{hint}; "
                f"valid parameters: {_describe_params(cls)}"
            )
    for key, default in _defaults(cls).items():
        if key in rules and default is inspect.Parameter.empty and key not in params:
            raise ValueError(
                f"weighting strategy {cls.name!r} needs parameter {key!r}; "
                f"parameters: {_describe_params(cls)}"
            )
    for key, value in params.items():
        rules[key].check(cls.name, value)


def make_weighting(
    name: str, num_tasks: int, *, task_names: Sequence[str] | None = None, **params: Any
) -> WeightingStrategy:
    """Build the strategy registered as ``name`` for ``num_tasks`` tasks (``params`` checked by
    :func:`check_weighting_params`)."""
    check_weighting_params(name, params)
    return WEIGHTINGS.get(name)(num_tasks, task_names=task_names, **params)


def reads_task_stats(name: str) -> bool:
    """Whether the strategy registered as ``name`` moves its weights with what it measures
    (``False`` for ``uniform`` and ``fixed``, whose weights never change)."""
    return WEIGHTINGS.get(name).READS_STATS


# ---------------------------------------------------------------------------------------------
# Fixed strategies


@WEIGHTINGS.register("uniform")
class UniformWeighting(WeightingStrategy):
    """``z_k = 1/K`` at every step (plain multi-task GRPO's implicit weighting)."""

    name = "uniform"
    READS_STATS = False

    def __init__(self, num_tasks: int, *, task_names: Sequence[str] | None = None) -> None:
        super().__init__(num_tasks, task_names=task_names, params={})

    def _update(self, stats: TaskStats, present: np.ndarray) -> None:
        return None


@WEIGHTINGS.register("fixed", aliases=("static",))
class FixedWeighting(WeightingStrategy):
    """The user's weights ``w``, normalised: ``z_k = w_k / Σ_j w_j``, never updated.

    ``weights`` is a sequence of ``K`` non-negative finite numbers, not all 0, or a mapping
    ``{task name: weight}`` covering every task (needs ``task_names``).
    """

    name = "fixed"
    READS_STATS = False
    PARAMS = (WeightingParam("weights", "the weight of each task", kind="weights"),)

    def __init__(
        self,
        num_tasks: int,
        *,
        weights: Sequence[float] | Mapping[str, float] | np.ndarray,
        task_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__(num_tasks, task_names=task_names, params={})
        vector = self._weight_vector(weights)  # [K]
        self._weights = vector / vector.sum()
        # Kept normalised, as a list: a mapping or a rescaled vector that means the same
        # weights passes the parameter check on resume.
        self.params = {"weights": _to_json(self._weights)}

    def _weight_vector(self, weights: Any) -> np.ndarray:
        if isinstance(weights, Mapping):
            if self.task_names is None:
                raise ValueError(
                    "fixed weights given as a {task: weight} mapping need task_names; pass "
                    "task_names or a list of weights in task order"
                )
            unknown = sorted(set(weights) - set(self.task_names))
            missing = [n for n in self.task_names if n not in weights]
            if unknown or missing:
                raise ValueError(
                    f"fixed weights must name every task exactly: unknown {unknown}, missing "
                    f"{missing}; tasks are {list(self.task_names)}"
                )
            weights = [weights[n] for n in self.task_names]
        try:
            vector = np.asarray(weights, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"fixed weights must be numbers; got {weights!r}") from None
        if vector.shape != (self.num_tasks,):
            raise ValueError(
                f"fixed weights need one number per task ({self.num_tasks}); got shape "
                f"{vector.shape}: {vector.tolist()}"
            )
        if not np.isfinite(vector).all() or (vector < 0).any():
            bad = ~np.isfinite(vector) | (vector < 0)
            raise ValueError(
                f"fixed weights must be finite and >= 0; got {vector.tolist()} (bad for task(s) "
                f"{self._tasks(bad)})"
            )
        if vector.sum() <= 0:
            raise ValueError(
                f"fixed weights are all 0; give at least one task a positive weight: "
                f"{vector.tolist()}"
            )
        return vector

    def _update(self, stats: TaskStats, present: np.ndarray) -> None:
        return None


# ---------------------------------------------------------------------------------------------
# Logit strategies driven by J (and I)


class _RewardMemory:
    """``J [K]`` per task: the last observation, or its EMA; ``NaN`` until first observed.

    ``J ← decay · J_prev + (1 − decay) · J_batch`` for tasks observed this step; the first
    observation is taken as is (see the module docstring).
    """

    def __init__(self, num_tasks: int, decay: float) -> None:
        self.decay = decay
        self.value = np.full(num_tasks, np.nan)  # [K]; NaN: never seen, no J to centre on

    def observe(self, reward: np.ndarray, present: np.ndarray) -> np.ndarray:
        """Fold this step's rewards in; returns the mask of tasks observed this step ``[K]``."""
        observed = present & ~np.isnan(reward)  # [K]; NaN: not measured, the last J stands
        if observed.any():
            batch = np.where(observed, reward, 0.0)  # absent entries may be inf: keep them out
            # ALGORITHMS.md §4: the released code's EMA of J (decay 0.5 there).
            smoothed = self.decay * self.value + (1.0 - self.decay) * batch
            # First observation taken as is: an EMA started at 0 would make a new task look
            # failing and pull weight to it.
            fresh = np.where(np.isnan(self.value), batch, smoothed)
            self.value = np.where(observed, fresh, self.value)
        return observed


class _LogitOptimizer:
    """Descends ``g + η ξ`` on the logits: plain SGD or ``torch.optim.Adam``'s exact update.

    SGD: ``ξ ← ξ − β (g + η ξ)``. Adam (``torch.optim.Adam`` with ``weight_decay=η``, not
    AdamW): ``d = g + η ξ``; ``m ← m + (1 − β1)(d − m)``; ``v ← β2 v + (1 − β2) d²``;
    ``ξ ← ξ − (β / (1 − β1^t)) · m / (√v / √(1 − β2^t) + ε)``, in torch's operation order.
    """

    def __init__(self, num_tasks: int, kind: str, step_size: float, damping: float) -> None:
        self.kind, self.step_size, self.damping = kind, step_size, damping
        self.t = 0
        self.exp_avg = np.zeros(num_tasks)  # [K]
        self.exp_avg_sq = np.zeros(num_tasks)  # [K]

    def step(self, logits: np.ndarray, gradient: np.ndarray) -> np.ndarray:
        # η ξ joins the gradient (L2, as torch.optim.Adam's weight_decay; not AdamW's decay).
        direction = gradient + self.damping * logits if self.damping else gradient  # [K]
        if self.kind == "sgd":
            # ALGORITHMS.md §4's plain step, the paper's text
            return _bounded(logits - self.step_size * direction)
        beta1, beta2 = ADAM_BETAS
        self.t += 1
        # torch's operation order (lerp form, bias corrections split), so the logits agree
        # with torch.optim.Adam to 1e-14 (tests/algo/test_weighting.py).
        # torch's exp_avg.lerp_(grad, 1 - beta1)
        self.exp_avg += (1.0 - beta1) * (direction - self.exp_avg)
        # torch's exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        self.exp_avg_sq *= beta2
        self.exp_avg_sq += (1.0 - beta2) * direction * direction
        step = self.step_size / (1.0 - beta1**self.t)  # torch's step_size = lr / bias_correction1
        # torch's denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        denom = np.sqrt(self.exp_avg_sq) / (1.0 - beta2**self.t) ** 0.5 + ADAM_EPS
        return _bounded(logits - step * (self.exp_avg / denom))

    def state(self) -> dict[str, Any]:
        if self.kind == "sgd":
            return {"kind": "sgd"}
        return {
            "kind": "adam",
            "t": self.t,
            "exp_avg": _to_json(self.exp_avg),
            "exp_avg_sq": _to_json(self.exp_avg_sq),
        }

    def load(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or state.get("kind") != self.kind:
            raise ValueError(f"state_dict['optimizer'] is not a {self.kind} state: {state!r}")
        if self.kind == "adam":
            size = len(self.exp_avg)
            exp_avg = _from_json(state, "exp_avg", size)
            exp_avg_sq = _from_json(state, "exp_avg_sq", size)
            # Assigned together once both vectors parsed: a refused state changes nothing.
            self.t, self.exp_avg, self.exp_avg_sq = int(state["t"]), exp_avg, exp_avg_sq


_STEP_SIZE = WeightingParam(
    "step_size", "β, the step on the logits", low=0.0, low_open=True, optional=True
)
_DAMPING = WeightingParam("damping", "η, pulls the logits towards 0 (uniform)", low=0.0, high=1.0)
_REWARD_EMA = WeightingParam(
    "reward_ema", "EMA decay of J; 0 = raw batch value", low=0.0, high=1.0, high_open=True
)
_MIN_WEIGHT = WeightingParam(
    "min_weight", "ε, every task's least weight: z = (1 − Kε) softmax + ε; at most 1/K",
    low=0.0, high=1.0,
)


def _check_min_weight(strategy: str, floor: float, k: int) -> None:
    """A ``min_weight`` ε checked against the task count ``k``: ``k ε <= 1``."""
    # Slack of 8 ulps: K · (1/K) in floating point may land just above 1.
    if k * floor > 1.0 + 8 * np.finfo(np.float64).eps:
        raise ValueError(
            f"{strategy} parameter 'min_weight' is {floor:g}, but {k} tasks cannot each "
            f"keep {floor:g} of the weight (the floors alone sum to {k * floor:g} > 1). Fix: "
            f"min_weight <= 1/K = {1.0 / k:.6g} (1/K gives uniform weights; 0, the default, no "
            f"floor)"
        )


class _SignalWeighting(WeightingStrategy):
    """Shared engine of ``worst_case``, ``regularized`` and ``mt_grpo``: ``s → g → ξ → z``.

    Subclasses give ``_signal(stats, present) -> s [K]`` (``NaN`` for never-observed tasks)
    after the reward memory has been updated. ``_softmax`` is ``p = softmax(ξ)``, what the
    gradient uses; ``_weights`` is ``p`` with the ``min_weight`` floor (:func:`floored`).
    """

    def _setup(self, optimizer: str, step_size: float | None, damping: float, ema: float) -> None:
        # One default per optimizer: SGD moves ξ by β·g, Adam by about β whatever g's size.
        if step_size is None:
            step_size = DEFAULT_ADAM_STEP_SIZE if optimizer == "adam" else DEFAULT_SGD_STEP_SIZE
        self.params["step_size"] = step_size
        self._memory = _RewardMemory(self.num_tasks, ema)
        self._optimizer = _LogitOptimizer(self.num_tasks, optimizer, step_size, damping)
        self._logits = np.zeros(self.num_tasks)  # [K] ξ
        self._softmax = self._weights.copy()  # [K] p = softmax(ξ), uniform at ξ = 0

    def _set_logits(self, logits: np.ndarray) -> None:
        self._logits = logits
        self._softmax = softmax(logits)
        self._weights = self._floored(self._softmax)

    @abstractmethod
    def _signal(self, stats: TaskStats, present: np.ndarray) -> np.ndarray: ...

    def _update(self, stats: TaskStats, present: np.ndarray) -> None:
        if not self._memory.observe(stats.accuracy, present).any():
            return  # nothing measured: neither the logits nor the optimizer state move
        seen = ~np.isnan(self._memory.value)  # [K]
        # p, not the floored z: the min_weight floor must not change how the strategy moves.
        gradient = _observed_gradient(self._softmax, self._signal(stats, present), seen)  # [K]
        self._set_logits(self._optimizer.step(self._logits, gradient))
        self.steps += 1

    @property
    def logits(self) -> np.ndarray:
        """The logits ``ξ [K]`` (a copy); ``weights = floored(softmax(logits), min_weight)``."""
        return self._logits.copy()

    @property
    def task_rewards(self) -> np.ndarray:
        """The ``J [K]`` the strategy currently holds (a copy; ``NaN`` = never observed)."""
        return self._memory.value.copy()

    def _state(self) -> dict[str, Any]:
        return {
            "logits": _to_json(self._logits),
            "reward": _to_json(self._memory.value),
            "optimizer": self._optimizer.state(),
        }

    def _load_state(self, state: Mapping[str, Any]) -> None:
        logits = _from_json(state, "logits", self.num_tasks)
        if not np.isfinite(logits).all():
            raise ValueError(f"state_dict['logits'] must be finite; got {state['logits']}")
        reward = _from_json(state, "reward", self.num_tasks)
        self._optimizer.load(state.get("optimizer"))  # last check; it assigns only on success
        self._memory.value = reward
        self._set_logits(logits)


@WEIGHTINGS.register("worst_case", aliases=("minimax",))
class WorstCaseWeighting(_SignalWeighting):
    """Reward-only minimax weights: ``g_k = z_k (J_k − Σ_j z_j J_j)``, ``ξ ← ξ − β g``.

    With no damping the weights collapse onto the current worst task (one-hot in the limit):
    a baseline for the robust objective with ``ε = 0``; use ``regularized`` or ``mt_grpo`` to
    train.
    """

    name = "worst_case"
    PARAMS = (_STEP_SIZE, _REWARD_EMA, _MIN_WEIGHT)

    def __init__(
        self,
        num_tasks: int,
        *,
        step_size: float = DEFAULT_SGD_STEP_SIZE,
        reward_ema: float = 0.0,
        min_weight: float = 0.0,
        task_names: Sequence[str] | None = None,
    ) -> None:
        params = {"step_size": step_size, "reward_ema": reward_ema, "min_weight": min_weight}
        super().__init__(num_tasks, task_names=task_names, params=params)
        # No damping: the ε = 0 baseline whose collapse the module docstring describes.
        self._setup("sgd", self.params["step_size"], 0.0, self.params["reward_ema"])

    def _signal(self, stats: TaskStats, present: np.ndarray) -> np.ndarray:
        return self._memory.value


@WEIGHTINGS.register("regularized", aliases=("regularised",))
class RegularizedWeighting(_SignalWeighting):
    """Reward-only weights with damping: ``ξ ← ξ − β (g + η ξ)``, ``g_k = z_k (J_k − z·J)``.

    The damping term keeps ``ξ`` near 0 so the weights stop short of collapsing; paper values
    ``η ∈ {1e-2, 5e-4, 1e-5}`` (default 1e-2, the one that visibly differs from
    ``worst_case``).
    """

    name = "regularized"
    PARAMS = (_STEP_SIZE, _DAMPING, _REWARD_EMA, _MIN_WEIGHT)

    def __init__(
        self,
        num_tasks: int,
        *,
        step_size: float = DEFAULT_SGD_STEP_SIZE,
        damping: float = 1e-2,  # the paper's largest η, the one visibly unlike worst_case
        reward_ema: float = 0.0,
        min_weight: float = 0.0,
        task_names: Sequence[str] | None = None,
    ) -> None:
        params = {"step_size": step_size, "damping": damping, "reward_ema": reward_ema,
                  "min_weight": min_weight}
        super().__init__(num_tasks, task_names=task_names, params=params)
        p = self.params
        self._setup("sgd", p["step_size"], p["damping"], p["reward_ema"])

    def _signal(self, stats: TaskStats, present: np.ndarray) -> np.ndarray:
        return self._memory.value


@WEIGHTINGS.register("mt_grpo", aliases=("mtgrpo", "iwu"))
class MTGRPOWeighting(_SignalWeighting):
    """MT-GRPO's improvement-aware weight update (IWU; arXiv 2602.05547, Subroutine 1).

    ``s_k = clip(I_k, −c, c) + λ J_k``; ``g_k = z_k (s_k − Σ_j z_j s_j)``; then
    ``optimizer="sgd"`` (default, the paper's text): ``ξ ← ξ − β (g + η ξ)`` with
    ``β = 0.5`` unless given; ``optimizer="adam"`` (the released code): Adam on ``ξ`` with
    ``lr = β = 0.025`` unless given and weight decay ``η``. ``improvement_clip=None`` (paper
    text) does not clip; the code uses 0.1 or 0.2. ``reward_ema=0`` (paper text) uses the
    batch ``J``; the code uses 0.5. Paper values: ``λ ∈ {0.2, 0.25}`` (3 tasks),
    ``{0.1, 0.3, 0.9, 1.2}`` (9 tasks); ``η ∈ {1e-5, 1e-4}``.
    """

    name = "mt_grpo"
    PARAMS = (
        WeightingParam("lam", "λ, weight of J against the improvement I", low=0.0),
        _STEP_SIZE,
        WeightingParam(
            "optimizer", "'sgd' = paper text, 'adam' = code", "choice", choices=("sgd", "adam")
        ),
        _DAMPING,
        WeightingParam(
            "improvement_clip", "c, clip I to [-c, c]", low=0.0, low_open=True, optional=True
        ),
        _REWARD_EMA,
        _MIN_WEIGHT,
    )
    REQUIRES = ("improvement",)

    def __init__(
        self,
        num_tasks: int,
        *,
        lam: float = 0.25,  # Exp-1's λ of the reported 58.8 / 66.9 % (ALGORITHMS.md §8)
        step_size: float | None = None,
        optimizer: Literal["sgd", "adam"] = "sgd",
        damping: float = 1e-5,  # Exp-1's η
        improvement_clip: float | None = None,  # paper text; the released code: 0.1 or 0.2
        reward_ema: float = 0.0,  # paper text; the released code: 0.5
        min_weight: float = 0.0,
        task_names: Sequence[str] | None = None,
    ) -> None:
        params = {
            "lam": lam,
            "step_size": step_size,
            "optimizer": optimizer,
            "damping": damping,
            "improvement_clip": improvement_clip,
            "reward_ema": reward_ema,
            "min_weight": min_weight,
        }
        super().__init__(num_tasks, task_names=task_names, params=params)
        p = self.params
        self._setup(p["optimizer"], p["step_size"], p["damping"], p["reward_ema"])
        # the last update's (I [K], λJ [K], z [K]) for diagnostics(); not part of the state
        self._terms: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def _update(self, stats: TaskStats, present: np.ndarray) -> None:
        self._terms = None  # an update that observes no task reports nothing, not the last
        super()._update(stats, present)

    def diagnostics(self) -> dict[str, float]:
        """``weighting/improvement_share``: how much of the last update's logit gradient came
        from the improvement ``I_k`` rather than from ``λ J_k``.

        :func:`improvement_share` of the update's ``I``, ``λ J`` and the weights it started
        from (NaN when neither part is there or no ``I`` was measured). Near 0
        the weights follow the rewards alone, like ``regularized``: ``I_k`` measured with
        ``improvement_reduction: mean`` after one small LoRA step can be ~60× smaller than
        ``λ J_k`` at a ``λ`` like the paper's (whose released code sums ``I_k`` over a task's
        samples and clips it: ``improvement_reduction: sum`` with ``improvement_clip``); lower
        ``λ`` or use that scale to let the improvement matter. No value before the first
        update, nor after one that observed no task.
        """
        if self._terms is None:
            return {}
        return {"weighting/improvement_share": improvement_share(*self._terms)}

    @property
    def last_terms(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The last update's ``(I [K], λJ [K], z [K])``: the improvement as used (clipped;
        NaN where not measured, which the update treats as 0), ``λ`` times the reward memory
        (NaN: never observed) and the weights the update started from, ``softmax(ξ)`` before the
        ``min_weight`` floor, as its gradient uses them (copies); ``None``
        before the first update and after one that observed no task."""
        if self._terms is None:
            return None
        improvement, reward, weights = self._terms
        return improvement.copy(), reward.copy(), weights.copy()

    def _missing_field_message(self, field: str) -> str:
        return (
            "the mt_grpo strategy needs TaskStats.improvement (I_k, the change of task k's GRPO "
            "objective across the policy update); pass NaN where it was not measured, or use "
            "'regularized' for a reward-only update"
        )

    def _signal(self, stats: TaskStats, present: np.ndarray) -> np.ndarray:
        improvement = stats.improvement
        assert improvement is not None  # REQUIRES checked it
        measured = present & ~np.isnan(improvement)  # [K]
        improvement = np.where(measured, improvement, 0.0)  # absent or not measured: no change
        clip = self.params["improvement_clip"]
        if clip is not None:
            improvement = np.clip(improvement, -clip, clip)  # the released code: c = 0.1 or 0.2
        # IWU's s_k = I_k + λ J_k: λ trades worst-task robustness against balanced improvement.
        reward = self.params["lam"] * self._memory.value  # [K] λJ, NaN where never observed
        as_measured = np.where(measured, improvement, math.nan)  # [K] for diagnostics()
        self._terms = (as_measured, reward, self._softmax.copy())
        return improvement + reward  # NaN where never observed: _fill_unseen gives it g = 0


# ---------------------------------------------------------------------------------------------
# Self-Evolving Curriculum


@WEIGHTINGS.register("sec", aliases=("self_evolving_curriculum",))
class SECWeighting(WeightingStrategy):
    """Self-Evolving Curriculum (Chen et al., arXiv 2505.14970) with one arm per task.

    ``r_k`` = mean ``|A|`` over task ``k``'s rollouts this step (0 for an arm absent from the
    batch, the paper's rule); ``Q ← (1 − α) Q + α r`` with ``Q_0 = 0``; ``z = softmax(Q / τ)``
    (with ``min_weight`` ε: ``(1 − Kε) softmax(Q / τ) + ε``).
    Defaults ``α = 0.5``, ``τ = 0.2`` (the paper's multi-task puzzle setting). A step where no
    arm is present changes nothing.
    """

    name = "sec"
    PARAMS = (
        WeightingParam("alpha", "α, the Q learning rate", low=0.0, high=1.0, low_open=True),
        WeightingParam("temperature", "τ of the Boltzmann weights", low=0.0, low_open=True),
        _MIN_WEIGHT,
    )
    REQUIRES = ("mean_abs_advantage",)

    def __init__(
        self,
        num_tasks: int,
        *,
        alpha: float = 0.5,  # α and τ of SEC's multi-task puzzle setting
        temperature: float = 0.2,
        min_weight: float = 0.0,
        task_names: Sequence[str] | None = None,
    ) -> None:
        params = {"alpha": alpha, "temperature": temperature, "min_weight": min_weight}
        super().__init__(num_tasks, task_names=task_names, params=params)
        self._q = np.zeros(self.num_tasks)  # [K]; Q_0 = 0: uniform until the first update

    @property
    def q_values(self) -> np.ndarray:
        """The arms' values ``Q [K]`` (a copy)."""
        return self._q.copy()

    def _missing_field_message(self, field: str) -> str:
        return (
            "the sec strategy needs TaskStats.mean_abs_advantage (mean |A| over each task's "
            "rollouts this step); pass NaN for tasks absent from the batch"
        )

    def _update(self, stats: TaskStats, present: np.ndarray) -> None:
        advantage = stats.mean_abs_advantage
        assert advantage is not None  # REQUIRES checked it
        observed = present & ~np.isnan(advantage)  # [K]
        if not observed.any():
            # Ours: r = 0 for every arm would shrink Q towards 0 and flatten z with no evidence.
            return
        reward = np.where(observed, advantage, 0.0)  # [K]; SEC's rule: an absent arm gets r = 0
        alpha = self.params["alpha"]
        self._set_q((1.0 - alpha) * self._q + alpha * reward)  # SEC: Q ← (1 − α) Q + α r
        self.steps += 1

    def _set_q(self, q: np.ndarray) -> None:
        self._q = q
        self._weights = self._floored(softmax(q / self.params["temperature"]))  # z = softmax(Q / τ)

    def _state(self) -> dict[str, Any]:
        return {"q": _to_json(self._q)}

    def _load_state(self, state: Mapping[str, Any]) -> None:
        q = _from_json(state, "q", self.num_tasks)
        if not np.isfinite(q).all():
            raise ValueError(f"state_dict['q'] must be finite; got {state['q']}")
        self._set_q(q)


# ---------------------------------------------------------------------------------------------
# The held-out signal (task_weighting_signal: validation)

TaskWeightingSignal = Literal["train", "validation"]
TASK_WEIGHTING_SIGNALS: tuple[str, ...] = get_args(TaskWeightingSignal)


class ValidationSignal:
    """What the strategies read when the weights follow a held-out validation split.

    The training batch's ``J_k`` flatters a task whose training problems are partly memorised
    (a warm start) or easier than its held-out ones, so the weights turn away from the task
    that really lags. With ``task_weighting_signal: validation`` the trainer evaluates the
    validation split every ``validation_steps`` steps (step 0 included) and hands each result
    to :meth:`observe`; :meth:`task_stats` gives every step's :class:`TaskStats`:

    - ``J_k = a_k(t)``, task ``k``'s accuracy over its ``n_k(t)`` validation completions at
      the latest evaluation step ``t``; ``count_k = n_k(t)`` (0: the task had none, absent);
    - ``I_k = (a_k(t) − a_k(t')) / (t − t')`` with ``t'`` the evaluation before: the held-out
      accuracy gained per training step, ``NaN`` (not measured, treated as no change) at the
      first evaluation or where either evaluation scored none of the task's completions;
    - ``|A|_k`` (SEC's arm reward) = mean ``|A|`` over task ``k``'s validation completions.

    Departures from the paper (ours; neither MT-GRPO nor SEC reads held-out data):

    1. ``J_k`` is held-out accuracy, not the batch's (nor its EMA; ``reward_ema`` still
       applies on top).
    2. ``I_k`` is not the change of task ``k``'s GRPO objective across one update on the same
       samples, but the change of its held-out accuracy between successive evaluations,
       divided by the steps between them.
    3. Between evaluations the strategy still updates at every step, from the last
       evaluation's ``J_k`` and ``I_k``. Why not hold the weights until the next evaluation:
       then the logits would move once per ``validation_steps`` steps and ``step_size``,
       ``λ`` and ``damping`` would need rescaling by it; updating every step keeps them on
       the per-step scale of the paper's values. A held ``J_k`` is what the paper's slowly
       moving ``J_k`` already is, and dividing ``I_k`` by the steps between evaluations makes
       its repeated use add up to the change measured once.

    :meth:`state_dict` carries the last two evaluations, so a resumed run reads what the
    uninterrupted one did.
    """

    def __init__(self, num_tasks: int) -> None:
        self.num_tasks = _check_num_tasks(num_tasks)
        self._last: tuple[int, TaskStats] | None = None  # (step, measured)
        self._before: tuple[int, TaskStats] | None = None

    @property
    def last_step(self) -> int | None:
        """The step of the latest evaluation (``None`` before the first)."""
        return None if self._last is None else self._last[0]

    def observe(self, step: int, measured: TaskStats) -> None:
        """Take the evaluation of the validation split after ``step`` training steps:
        ``measured.accuracy [K]``, ``count [K]`` (completions scored per task) and, for SEC,
        ``mean_abs_advantage [K]`` (:meth:`TaskStats.from_rollouts` of its rollouts)."""
        if len(measured.count) != self.num_tasks:
            raise ValueError(
                f"the validation result has {len(measured.count)} tasks but the weights cover "
                f"{self.num_tasks}; evaluate the validation split in the strategy's task order"
            )
        # I_k divides by the steps between evaluations: they must increase.
        if self._last is not None and step <= self._last[0]:
            raise ValueError(
                f"validation results must come in step order: step {step} after step "
                f"{self._last[0]}"
            )
        self._before, self._last = self._last, (int(step), measured)

    def task_stats(self) -> TaskStats | None:
        """The :class:`TaskStats` every update reads until the next evaluation (``None``
        before the first)."""
        if self._last is None:
            return None
        step, last = self._last
        improvement = np.full(self.num_tasks, math.nan)  # [K]
        if self._before is not None:
            before_step, before = self._before
            both = (last.count > 0) & (before.count > 0)  # [K]
            with np.errstate(invalid="ignore"):  # NaN of absent tasks, masked by `both` below
                # Per training step, so its reuse at every step until the next evaluation adds
                # up to the change measured once (departure 3).
                change = (last.accuracy - before.accuracy) / (step - before_step)
            improvement = np.where(both, change, math.nan)
        return TaskStats(accuracy=last.accuracy, count=last.count, improvement=improvement,
                         mean_abs_advantage=last.mean_abs_advantage)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable: the last two evaluations (``None`` stands for NaN)."""
        return {"num_tasks": self.num_tasks,
                "evaluations": [_evaluation_state(e) for e in (self._before, self._last)
                                if e is not None]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        if state.get("num_tasks") != self.num_tasks or not isinstance(
                state.get("evaluations"), list) or len(state["evaluations"]) > 2:
            raise ValueError(
                f"not a validation-signal state over {self.num_tasks} tasks: {state!r}")
        loaded = [_evaluation_from_state(e, self.num_tasks) for e in state["evaluations"]]
        loaded = [None] * (2 - len(loaded)) + loaded  # the missing evaluations are the oldest
        self._before, self._last = loaded[0], loaded[1]


def _evaluation_state(evaluation: tuple[int, TaskStats]) -> dict[str, Any]:
    step, stats = evaluation
    advantage = stats.mean_abs_advantage
    return {"step": step, "accuracy": _to_json(stats.accuracy),
            "count": stats.count.tolist(),
            "mean_abs_advantage": None if advantage is None else _to_json(advantage)}


def _evaluation_from_state(state: Mapping[str, Any], size: int) -> tuple[int, TaskStats]:
    advantage = state.get("mean_abs_advantage")
    stats = TaskStats(
        accuracy=_from_json(state, "accuracy", size), count=list(state["count"]),
        mean_abs_advantage=None if advantage is None else _from_json(
            state, "mean_abs_advantage", size))
    return int(state["step"]), stats
