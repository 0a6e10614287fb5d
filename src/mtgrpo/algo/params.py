"""Typed parameters of every built-in task weighting and batch construction, selected by name.

A run file writes them as a mapping (``task_weighting_params: {lam: 0.5}``); Python code may
pass the typed form instead (``MultiTaskConfig(task_weighting="mt_grpo",
task_weighting_params=MTGRPOParams(lam=0.5))``), which an editor completes and checks. Either
way :func:`weighting_params` / :func:`sampler_params` return the typed form of the strategy
named, every value checked by the strategy's own rules (:func:`check_weighting_params`,
:func:`check_sampler_params`). A strategy a user registers takes a plain mapping.

The defaults are the constructors' (``tests/algo/test_params.py`` holds them equal): the
papers' values, as ``docs/ALGORITHMS.md`` gives them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mtgrpo.algo.sampling import SAMPLERS, check_sampler_params
from mtgrpo.algo.weighting import WEIGHTINGS, check_weighting_params

__all__ = [
    "SAMPLER_PARAMS",
    "WEIGHTING_PARAMS",
    "DynamicParams",
    "FixedParams",
    "IIDParams",
    "MTGRPOParams",
    "RatioPreservingParams",
    "RegularizedParams",
    "SECParams",
    "UniformParams",
    "WorstCaseParams",
    "as_mapping",
    "sampler_params",
    "weighting_params",
]


# ------------------------------------------------------------------------ task weightings
@dataclass(frozen=True)
class UniformParams:
    """``uniform``: no parameters (z_k = 1/K)."""


@dataclass(frozen=True)
class FixedParams:
    """``fixed``: the weight of each task, as K numbers or ``{task: weight}`` (normalised)."""

    weights: Sequence[float] | Mapping[str, float]


@dataclass(frozen=True)
class WorstCaseParams:
    """``worst_case``: mirror ascent towards the task with the lowest reward."""

    step_size: float = 0.5  # ours (DEFAULT_SGD_STEP_SIZE); the paper gives none
    reward_ema: float = 0.0  # paper text: the batch J; released code: 0.5
    min_weight: float = 0.0  # no floor


@dataclass(frozen=True)
class RegularizedParams:
    """``regularized``: worst-case with the logits pulled towards uniform by ``damping``."""

    step_size: float = 0.5  # ours (DEFAULT_SGD_STEP_SIZE); the paper gives none
    damping: float = 1e-2  # the paper's largest η (ALGORITHMS.md §4)
    reward_ema: float = 0.0  # paper text: the batch J; released code: 0.5
    min_weight: float = 0.0


@dataclass(frozen=True)
class MTGRPOParams:
    """``mt_grpo``: λ trades a task's reward J against its improvement I (MT-GRPO, eq. 6);
    ``step_size`` None is 0.5 with sgd (the paper's text) and 0.025 with adam (its code)."""

    lam: float = 0.25  # Exp-1's λ of the reported 58.8 / 66.9 % (ALGORITHMS.md §8)
    step_size: float | None = None
    optimizer: Literal["sgd", "adam"] = "sgd"  # sgd: the paper's text; adam: its released code
    damping: float = 1e-5  # Exp-1's η (ALGORITHMS.md §8)
    improvement_clip: float | None = None  # paper text; released code: 0.1 or 0.2
    reward_ema: float = 0.0  # paper text: the batch J; released code: 0.5
    min_weight: float = 0.0


@dataclass(frozen=True)
class SECParams:
    """``sec``: Self-Evolving Curriculum, Q learning rate α and Boltzmann temperature τ."""

    alpha: float = 0.5  # SEC's multi-task puzzle setting (ALGORITHMS.md §4)
    temperature: float = 0.2  # SEC's multi-task puzzle setting
    min_weight: float = 0.0


# ------------------------------------------------------------------------ batch constructions
@dataclass(frozen=True)
class IIDParams:
    """``iid``: tasks drawn i.i.d. from z in one round."""

    acceptance_ema: float = 0.9  # ρ's decay, ALGORITHMS.md §5


@dataclass(frozen=True)
class DynamicParams:
    """``dynamic`` (DAPO): oversample, drop zero-gradient groups, up to N_rs extra rounds."""

    oversample_factor: float = 3.0  # M_os = 3 (ALGORITHMS.md §5)
    max_resample_rounds: int = 10  # N_rs = 10, the paper's 3-task value
    acceptance_ema: float = 0.9  # ρ's decay, ALGORITHMS.md §5


@dataclass(frozen=True)
class RatioPreservingParams:
    """``ratio_preserving`` (MT-GRPO's RP sampler, Algorithm 2), acceptance-aware by default."""

    oversample_factor: float = 3.0  # M_os = 3 (ALGORITHMS.md §5)
    max_resample_rounds: int = 10  # N_rs = 10 for 3 tasks (the paper used 2 for 9)
    acceptance_aware: bool = True  # Exp-2's AAS on (Exp-1 ran without it)
    max_acceptance_inflation: float = 5.0  # M_acc = 5 (ALGORITHMS.md §5)
    # Algorithm 2's n ~ Multinomial(B, z); largest_remainder gives the same n every step
    target_rounding: Literal["multinomial", "largest_remainder"] = "multinomial"
    acceptance_ema: float = 0.9  # ρ's decay, ALGORITHMS.md §5


WEIGHTING_PARAMS: dict[str, type] = {
    "uniform": UniformParams, "fixed": FixedParams, "worst_case": WorstCaseParams,
    "regularized": RegularizedParams, "mt_grpo": MTGRPOParams, "sec": SECParams,
}
"""The typed parameters of each built-in task weighting, by its registry name."""

SAMPLER_PARAMS: dict[str, type] = {
    "iid": IIDParams, "dynamic": DynamicParams, "ratio_preserving": RatioPreservingParams,
}
"""The typed parameters of each built-in batch construction, by its registry name."""


def as_mapping(params: Any) -> dict[str, Any]:
    """A typed parameters object as the run file's mapping (a mapping as a plain dict)."""
    if dataclasses.is_dataclass(params) and not isinstance(params, type):
        return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    if not isinstance(params, Mapping):
        raise TypeError(f"parameters must be a mapping or a typed parameters object (e.g. "
                        f"MTGRPOParams), got {type(params).__name__}")
    return dict(params)


def _typed(kind: str, name: str, params: Any, classes: Mapping[str, type],
           check: Any) -> Any:
    expected = classes.get(name)
    if dataclasses.is_dataclass(params) and not isinstance(params, type) \
            and type(params) is not expected:
        raise TypeError(
            f"{kind} {name!r} takes {expected.__name__ if expected else 'a mapping'}, got "
            f"{type(params).__name__}: pass the parameters of {name!r}, or choose the {kind} "
            f"{type(params).__name__} belongs to")
    values = as_mapping(params)
    check(name, values)  # the strategy's own rules: ranges, required and unknown names
    return expected(**values) if expected is not None else values


def weighting_params(name: str, params: Any = None) -> Any:
    """The typed parameters of the task weighting ``name`` (a registry name or alias), checked;
    a plain dict for a strategy without a typed class (one a user registered)."""
    return _typed("task weighting", WEIGHTINGS.canonical(name), {} if params is None else params,
                  WEIGHTING_PARAMS, check_weighting_params)


def sampler_params(name: str, params: Any = None) -> Any:
    """The typed parameters of the batch construction ``name``, checked (as
    :func:`weighting_params`)."""
    return _typed("batch construction", SAMPLERS.canonical(name),
                  {} if params is None else params, SAMPLER_PARAMS, check_sampler_params)
