"""Reward functions by name: what a config file's ``rewards:`` section refers to.

:func:`resolve_reward` turns one entry into something :class:`~mtgrpo.rewards.RewardSuite`
accepts:

* a callable or a :class:`~mtgrpo.rewards.RewardFunction`: used as is;
* a registered name (``format_reward``, ``countdown_reward``, ``math_reward``,
  ``code_reward``; :data:`REWARD_FUNCTIONS` lists them);
* an import path ``"package.module:function"`` (your own function);
* a mapping ``{"name": ..., **options}`` for a reward *factory* that takes options
  (``{"name": "length_reward", "target_length": 200}``);
* a reward model: a local checkpoint directory, a loaded sequence-classification model, or
  ``{"reward_model": "org/name"}`` for a hub name (scored with ``logits[:, 0]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtgrpo._registry import Registry, import_object

__all__ = ["REWARD_FUNCTIONS", "resolve_reward"]

# name -> "module:attribute" (imported on first use, so listing names stays cheap)
REWARD_FUNCTIONS: Registry[str] = Registry("reward function")
for _name, _target in {
    "format_reward": "mtgrpo.rewards.verifiers.format:format_reward",
    "countdown_reward": "mtgrpo.rewards.verifiers.countdown:countdown_reward",
    "math_reward": "mtgrpo.rewards.verifiers.math:math_reward",
    "code_reward": "mtgrpo.rewards.verifiers.code:code_reward",
    "length_reward": "mtgrpo.rewards.verifiers.length:length_reward",
    "answer_format_reward": "mtgrpo.tasks.gsm8k:answer_format_reward",
    "comms_reward": "mtgrpo.examples.customer_comms:comms_reward",
}.items():
    REWARD_FUNCTIONS.add(_name, _target)


def _from_mapping(spec: Mapping[str, Any]) -> Any:
    options = dict(spec)
    if "reward_model" in options:
        from mtgrpo.rewards.models import RewardModel

        return RewardModel(options.pop("reward_model"), **options)
    name = options.pop("name", None)
    if name is None:
        raise ValueError(
            f"reward entry {dict(spec)!r} needs a 'name' (a registered reward or an import "
            "path) or 'reward_model'"
        )
    factory = resolve_reward(name)
    return factory(**options) if options else factory


def resolve_reward(spec: Any) -> Any:
    """One reward entry of a config or of ``reward_funcs`` -> a reward callable."""
    from mtgrpo.rewards.models import RewardModel, is_reward_model_path

    if isinstance(spec, Mapping):
        return _from_mapping(spec)
    if isinstance(spec, str):
        if spec in REWARD_FUNCTIONS:
            return import_object(REWARD_FUNCTIONS.get(spec))
        if ":" in spec:
            return import_object(spec)
        if is_reward_model_path(spec):
            return RewardModel(spec)
        raise ValueError(
            f"reward {spec!r} is not a registered reward ({', '.join(REWARD_FUNCTIONS.names())}), "
            "an import path 'package.module:function', or a local reward-model directory; for a "
            "hub reward model write {reward_model: org/name}"
        )
    if _is_sequence_classifier(spec):
        return RewardModel(spec)
    if callable(spec):
        return spec
    raise TypeError(f"cannot use a {type(spec).__name__} as a reward function")


def _is_sequence_classifier(obj: Any) -> bool:
    name = type(obj).__name__
    return name.endswith("ForSequenceClassification") and hasattr(obj, "config")
