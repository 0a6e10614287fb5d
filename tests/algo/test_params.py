"""The typed parameters of the task weightings and batch constructions (``mtgrpo.algo.params``):
one class per built-in strategy, the same names and defaults as its constructor, checked by the
strategy's own rules, and accepted by the configuration in place of the run file's mapping."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from mtgrpo.algo.params import (
    SAMPLER_PARAMS,
    WEIGHTING_PARAMS,
    FixedParams,
    MTGRPOParams,
    RatioPreservingParams,
    SECParams,
    sampler_params,
    weighting_params,
)
from mtgrpo.algo.sampling import SAMPLERS, Sampler
from mtgrpo.algo.weighting import WEIGHTINGS
from mtgrpo.config import MultiTaskConfig, TrainConfig


def _keyword_defaults(cls: type, stop: type | None = None) -> dict[str, object]:
    """The keyword-only options of ``cls.__init__`` (and its bases up to ``stop``) with their
    defaults (``inspect.Parameter.empty`` when required)."""
    found: dict[str, object] = {}
    for klass in cls.__mro__[: cls.__mro__.index(stop) + 1] if stop else (cls,):
        for p in inspect.signature(klass.__init__).parameters.values():
            if p.kind is p.KEYWORD_ONLY and p.name not in found:
                found[p.name] = p.default
    return found


def _field_defaults(cls: type) -> dict[str, object]:
    return {f.name: f.default if f.default is not dataclasses.MISSING else inspect.Parameter.empty
            for f in dataclasses.fields(cls)}


def test_every_built_in_strategy_has_its_typed_parameters():
    assert sorted(WEIGHTING_PARAMS) == sorted(WEIGHTINGS.names())
    assert sorted(SAMPLER_PARAMS) == sorted(SAMPLERS.names())


@pytest.mark.parametrize("name", sorted(WEIGHTING_PARAMS))
def test_weighting_parameters_match_the_constructor(name):
    expected = _keyword_defaults(WEIGHTINGS.get(name))
    expected.pop("task_names")  # the trainer passes the tasks' names itself
    assert _field_defaults(WEIGHTING_PARAMS[name]) == expected


@pytest.mark.parametrize("name", sorted(SAMPLER_PARAMS))
def test_sampler_parameters_match_the_constructor(name):
    expected = _keyword_defaults(SAMPLERS.get(name), stop=Sampler)
    for set_by_the_trainer in ("seed", "zero_gradient_filter", "shuffle"):
        expected.pop(set_by_the_trainer)
    assert _field_defaults(SAMPLER_PARAMS[name]) == expected


def test_typed_parameters_are_checked_by_the_strategy_rules():
    assert weighting_params("MTGRPO", {"lam": 0.5}) == MTGRPOParams(lam=0.5)  # an alias
    assert weighting_params("mt_grpo", MTGRPOParams(lam=0.5)).lam == 0.5
    assert sampler_params("rp") == RatioPreservingParams()
    with pytest.raises(ValueError, match=r"mt_grpo parameter 'lam' must be a finite number in "
                                         r"\[0, inf\); got -1"):
        weighting_params("mt_grpo", MTGRPOParams(lam=-1))
    with pytest.raises(TypeError, match=r"task weighting 'mt_grpo' takes MTGRPOParams, got "
                                        r"SECParams"):
        weighting_params("mt_grpo", SECParams())
    with pytest.raises(ValueError, match="needs parameter 'weights'"):
        weighting_params("fixed", {})
    assert weighting_params("fixed", FixedParams(weights=[1, 3])).weights == [1, 3]


def test_the_configuration_takes_the_typed_form_and_keeps_the_run_files():
    config = TrainConfig(multitask=MultiTaskConfig(
        task_weighting="mt_grpo", task_weighting_params=MTGRPOParams(lam=0.5, optimizer="adam"),
        batch_construction="ratio_preserving",
        batch_construction_params=RatioPreservingParams(oversample_factor=2.0)))
    stored = config.multitask.task_weighting_params
    assert isinstance(stored, dict)
    assert (stored["lam"], stored["optimizer"]) == (0.5, "adam")
    assert config.multitask.weighting_params() == MTGRPOParams(lam=0.5, optimizer="adam")
    assert config.multitask.sampler_params().oversample_factor == 2.0
    # a run file's mapping and the typed form build the same configuration
    flat = TrainConfig.from_flat({"task_weighting": "mt_grpo", "task_weighting_params": stored,
                                  "batch_construction": "ratio_preserving",
                                  "batch_construction_params":
                                      config.multitask.batch_construction_params})
    assert flat == config
    with pytest.raises(TypeError, match="takes MTGRPOParams, got SECParams"):
        TrainConfig(multitask=MultiTaskConfig(task_weighting="mt_grpo",
                                              task_weighting_params=SECParams()))


def test_the_configuration_reference_lists_every_typed_parameters_class():
    from mtgrpo.config import reference_markdown

    reference = reference_markdown()
    for classes in (WEIGHTING_PARAMS, SAMPLER_PARAMS):
        for name, kind in classes.items():
            assert f"| `{name}` | `{kind.__name__}` |" in reference
    assert "`weights` (required)" in reference
    assert "`lam` (0.25)" in reference
