"""Reward functions for multi-task GRPO: the contract, routing to tasks, and scoring.

Writing a reward function
-------------------------
A reward function has TRL's ``GRPOTrainer`` signature, so functions written for TRL work
unchanged::

    def math_reward(prompts, completions, completion_ids=None, *, task, answer, **kwargs):
        return [check(c, a) if t == "math" else None
                for c, a, t in zip(completions, answer, task, strict=True)]

It is called with keyword arguments: ``prompts``, ``completions``, ``completion_ids`` and every
other dataset column (``task``, ``answer``, ...), one value per completion, plus whatever the
trainer passes through (``trainer_state``); accept ``**kwargs`` for the ones you do not use. It
returns one value per completion: a number (bools, numpy scalars and 0-d tensors are accepted)
or ``None``. ``async def`` functions are awaited concurrently.

Several scores from one function (a judge that rates compliance, politeness and action at
once) are *channels*, declared up front so the number of channels ``R`` is fixed before
training: ``RewardFunction(fn, channels=("compliance", "politeness", "action"))`` or
``@reward_channels(...)``; per completion the function returns a tuple in that order, a dict
keyed by channel, or ``None``. Each channel is a column ``"<function>/<channel>"`` of the score
matrix with its own reward weight. :func:`per_completion` adapts a per-sample
``fn(completion, prompt)`` (the ``multireward-grpo`` shape) to this contract.

Routing
-------
``RewardSuite.from_user`` takes one function, a list, or a routing table
``{"math": [math_reward], "code": [code_reward, style], "*": [format_reward]}``. With a table,
a function is called only on the rows of its tasks (``"*"``: every task); with a list, every
function sees every row and returns ``None`` where it does not apply. Both give the same
``[N, R]`` matrix; the table saves the calls.

What ``None`` means
-------------------
``None`` means "this reward does not apply to this completion". It is never silently turned
into a reward of 0: the score matrix keeps it as ``NaN``, and how it enters the advantage is a
choice of :func:`mtgrpo.algo.advantages.compute_advantages`, option ``none_handling``:

* ``"neutral"`` (default): a ``None`` neither rewards nor penalises. Under sum-then-normalise
  the missing entry is replaced by that channel's mean over the group's completions it applies
  to; under normalise-then-sum its normalised value is 0.
* ``"zero"``: a ``None`` counts as a reward of 0 (TRL's sum-then-normalise behaviour).

A completion that *no* channel scores (every function returned ``None`` or is not routed to its
task) would train on nothing. By default that is an error naming the row, its task and the
functions (``on_unscorable="raise"``); ``on_unscorable="zero_advantage"`` keeps TRL's behaviour
(the completion gets advantage 0 and is left out of the statistics).

Built-in verifiers
------------------
Rule-based reward functions that are safe on hostile model output live in
:mod:`mtgrpo.rewards.verifiers` (format, Countdown, math, code sandbox, length, reasoning-gym
scorers); the reward functions and their main checks are re-exported here, and
:data:`VERIFIERS` names them for configuration files.

Errors
------
Every broken contract is a :class:`RewardError` (a ``ValueError``) raised at the first scoring
call, before any training step: a wrong number of values, a value that is not a number or
``None``, NaN or infinity, an unscorable completion, a task label no function is routed to, or
a function that raises (re-raised with the first sample it fails on and the original
traceback chained). The built-in verifiers are the exception to the last rule: an error
while scoring one completion's text scores it 0 and is counted as ``rewards/<name>/errors``
(:mod:`mtgrpo.rewards.guard`), so model output cannot stop training.
"""

from __future__ import annotations

from mtgrpo.rewards.adapters import conditioned, per_completion, reward_channels
from mtgrpo.rewards.core import (
    GateSpec,
    RewardCallable,
    RewardError,
    RewardFunction,
    as_reward_function,
    callable_name,
)
from mtgrpo.rewards.suite import UNSCORABLE_POLICIES, RewardScores, RewardSuite
from mtgrpo.rewards.verifiers import (
    VERIFIERS,
    code_reward,
    completion_text,
    countdown_check,
    countdown_reward,
    extract_answer,
    format_reward,
    length_reward,
    math_reward,
    reasoning_gym_reward,
)

__all__ = [
    "UNSCORABLE_POLICIES",
    "VERIFIERS",
    "GateSpec",
    "RewardCallable",
    "RewardError",
    "RewardFunction",
    "RewardScores",
    "RewardSuite",
    "as_reward_function",
    "callable_name",
    "code_reward",
    "completion_text",
    "conditioned",
    "countdown_check",
    "countdown_reward",
    "extract_answer",
    "format_reward",
    "length_reward",
    "math_reward",
    "per_completion",
    "reasoning_gym_reward",
    "reward_channels",
]
