"""Reward functions by name: what a config file's ``rewards:`` section refers to.

:func:`resolve_reward` turns one entry into something :class:`~mtgrpo.rewards.RewardSuite`
accepts:

* a callable or a :class:`~mtgrpo.rewards.RewardFunction`: used as is;
* a registered name (``format_reward``, ``countdown_reward``, ``math_reward``,
  ``code_reward``; :data:`REWARD_FUNCTIONS` lists them);
* an import path ``"package.module:function"`` (your own function);
* a mapping ``{"name": ..., **options}`` for a reward *factory* that takes options
  (``{"name": "length_reward", "target_length": 200}``);
* a reward model: a local checkpoint directory, a hub id ``"org/name"`` (TRL's form), a
  loaded sequence-classification model, or ``{"reward_model": "org/name"}`` (scored with
  ``logits[:, 0]``).

A mapping's options go to the named function: a factory (``length_reward``) is called with
them, any other function is bound to them (``functools.partial``, the function keeps its
name), so ``{"name": "countdown_reward", "use_all_numbers": false}`` works for every built-in.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Mapping
from typing import Any

from mtgrpo.algo.registry import Registry, import_object

__all__ = ["REWARD_FUNCTIONS", "check_reward_entry", "resolve_reward", "resolve_rewards"]

# name -> "module:attribute" (imported on first use, so listing names stays cheap)
REWARD_FUNCTIONS: Registry[str] = Registry("reward function")
for _name, _target in {
    "format_reward": "mtgrpo.rewards.verifiers.format:format_reward",
    "countdown_reward": "mtgrpo.rewards.verifiers.countdown:countdown_reward",
    "math_reward": "mtgrpo.rewards.verifiers.math:math_reward",
    "code_reward": "mtgrpo.rewards.verifiers.code:code_reward",
    "length_reward": "mtgrpo.rewards.verifiers.length:length_reward",
    "reasoning_gym_reward": "mtgrpo.rewards.verifiers.reasoning_gym:reasoning_gym_reward",
    "answer_format_reward": "mtgrpo.tasks.gsm8k:answer_format_reward",
    "comms_reward": "mtgrpo.examples.customer_comms:comms_reward",
}.items():
    REWARD_FUNCTIONS.add(_name, _target)


# 'org/name': TRL 1.16 loads a reward_funcs string as a hub reward model
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _is_factory(fn: Any) -> bool:
    """A reward *factory* (``length_reward(target_length, tolerance)``) rather than a reward
    function: it does not take TRL's ``completions`` argument."""
    from mtgrpo.rewards.core import RewardFunction

    if isinstance(fn, RewardFunction):
        return False
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # some builtins have no signature: read as a reward function
        return False
    return "completions" not in parameters  # TRL calls every reward function with completions=


def _with_options(fn: Any, name: str, options: dict[str, Any]) -> Any:
    """``fn`` configured by a run file's options: a factory is called with them, a reward
    function is bound to them (keeping its name); an option it does not have is an error
    naming the ones it has."""
    if not options:
        return fn
    parameters = inspect.signature(fn).parameters
    if _is_factory(fn):
        valid = list(parameters)
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ValueError(f"reward {name!r} has no option(s) {unknown}; its options: {valid}")
        try:
            return fn(**options)
        except TypeError as exc:
            raise ValueError(f"reward {name!r}: {exc}; its options: {valid}") from None
    # the built-ins' settings (use_all_numbers, limits, ...) are keyword-only with defaults;
    # anything else a reward function takes comes from the data
    settings = [p.name for p in parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
                and p.default is not inspect.Parameter.empty]
    unknown = sorted(set(options) - set(settings))
    if unknown:
        raise ValueError(
            f"reward {name!r} has no option(s) {unknown}; its options: {settings} (dataset "
            "columns reach a reward function from the data, not from the run file)"
        )
    # keyword-bound: TRL's get_callable_name unwraps a partial, so the column keeps fn's name
    bound = functools.partial(fn, **options)
    functools.update_wrapper(bound, fn)
    return bound


def _from_mapping(spec: Mapping[str, Any], **model_options: Any) -> Any:
    check_reward_entry(spec)
    options = dict(spec)
    if "reward_model" in options:
        from mtgrpo.rewards.models import RewardModel

        # the entry's own options win over the trainer's tokenizer and trust_remote_code
        return RewardModel(options.pop("reward_model"), **{**model_options, **options})
    name = options.pop("name")
    return _with_options(resolve_reward(name), str(name), options)


def _names_a_reward_model(spec: str) -> bool:
    from mtgrpo.rewards.models import is_reward_model_path

    return is_reward_model_path(spec) or bool(_HUB_ID.match(spec))


def check_reward_entry(spec: Any) -> None:
    """Whether a run file's reward entry can be resolved, without importing it: a registered
    name, an import path, a reward model's directory or hub id, ``{name: ..., options}`` or
    ``{reward_model: ...}`` (or, from Python, a callable). Raises ``ValueError`` naming the
    forms otherwise."""
    if isinstance(spec, Mapping):
        if "reward_model" in spec:
            return
        if "name" not in spec:
            raise ValueError(
                f"reward entry {dict(spec)!r} needs a 'name' (a registered reward or an import "
                "path) or 'reward_model'"
            )
        check_reward_entry(spec["name"])
        return
    if not isinstance(spec, str):
        if callable(spec):
            return
        raise TypeError(f"cannot use a {type(spec).__name__} as a reward function")
    if spec in REWARD_FUNCTIONS or ":" in spec or _names_a_reward_model(spec):
        return
    raise ValueError(
        f"reward {spec!r} is not a registered reward ({', '.join(REWARD_FUNCTIONS.names())}), "
        "an import path 'package.module:function', a local reward-model directory or a hub "
        "reward model 'org/name'"
    )


def resolve_reward(spec: Any, *, tokenizer: Any = None, trust_remote_code: bool = False) -> Any:
    """One reward entry of a config or of ``reward_funcs`` -> a reward callable.

    ``tokenizer`` and ``trust_remote_code`` are used when the entry is a reward model (TRL's
    ``reward_processing_classes`` and ``trust_remote_code``).
    """
    from mtgrpo.rewards.models import RewardModel

    model_options = {"tokenizer": tokenizer, "trust_remote_code": trust_remote_code}
    if isinstance(spec, Mapping):
        return _from_mapping(spec, **model_options)
    if isinstance(spec, str):
        check_reward_entry(spec)
        if spec in REWARD_FUNCTIONS:
            return import_object(REWARD_FUNCTIONS.get(spec))
        if ":" in spec:
            return import_object(spec)
        return RewardModel(spec, **model_options)
    if _is_sequence_classifier(spec):
        return RewardModel(spec, **model_options)
    # a new wrapper for reward_processing_classes: the user's object is left as it is
    if isinstance(spec, RewardModel) and tokenizer is not None:
        return RewardModel(spec.model, tokenizer, batch_size=spec.batch_size,
                           max_length=spec.max_length, name=spec.__name__)
    if callable(spec):
        return spec
    raise TypeError(f"cannot use a {type(spec).__name__} as a reward function")


def resolve_rewards(spec: Any, *, trust_remote_code: bool = False) -> Any:
    """:func:`resolve_reward` on every entry of ``spec``: one entry, a list of them, or a
    routing table ``{task: entries}``; the shape is kept."""
    if isinstance(spec, Mapping):
        return {task: resolve_rewards(fns, trust_remote_code=trust_remote_code)
                for task, fns in spec.items()}
    if isinstance(spec, list | tuple):
        return [resolve_reward(f, trust_remote_code=trust_remote_code) for f in spec]
    return resolve_reward(spec, trust_remote_code=trust_remote_code)


def _is_sequence_classifier(obj: Any) -> bool:
    name = type(obj).__name__
    return name.endswith("ForSequenceClassification") and hasattr(obj, "config")
