"""TRL's ``rollout_func``: generation written by the user, in place of the backend's.

``rollout_func(prompts, trainer) -> dict`` receives the batch's prompts (each of the ``B``
prompts ``G`` times, rows grouped by prompt, as chat messages or text) and returns, per row,
``prompt_ids``, ``completion_ids`` and ``logprobs`` (required; ``logprobs`` may be None), and
optionally ``env_mask`` (1 = a token the model sampled, 0 = one an environment wrote: TRL's
``tool_mask``). Every other key is a per-row field passed to the reward functions by name.
A completion counts as finished when its last token is an EOS or pad token (TRL's rule).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mtgrpo.rollout.agent.loop import AgentOutput
from mtgrpo.rollout.agent.runner import AgentBatch
from mtgrpo.rollout.base import GenerationOutput, SamplingParams
from mtgrpo.tasks import PromptSet

__all__ = ["REQUIRED_KEYS", "CustomRollouts", "RolloutFuncResult", "check_rollout_output"]

REQUIRED_KEYS = ("prompt_ids", "completion_ids", "logprobs")


@dataclass
class RolloutFuncResult:
    """``rollout_func``'s output, checked: ``[N]`` lists each, ``extra_fields`` by name."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float]] | None
    env_mask: list[list[int]] | None = None
    extra_fields: dict[str, list[Any]] = field(default_factory=dict)


def check_rollout_output(output: Any) -> RolloutFuncResult:
    """``rollout_func``'s dict as a :class:`RolloutFuncResult`; an error names what is wrong."""
    if not isinstance(output, Mapping):
        raise TypeError(f"rollout_func must return a dict, got {type(output).__name__}")
    missing = sorted(set(REQUIRED_KEYS) - set(output))
    if missing:  # TRL's message, word for word
        raise ValueError(f"rollout_func must return keys {missing} in its output dict.")
    # env_mask is TRL's tool_mask under another name: a mask, not a column for the rewards
    extra = {k: list(v) for k, v in output.items()
             if k not in REQUIRED_KEYS and k != "env_mask"}
    prompt_ids, completion_ids = list(output["prompt_ids"]), list(output["completion_ids"])
    logprobs, env_mask = output["logprobs"], output.get("env_mask")
    rows = len(completion_ids)
    sized = {"prompt_ids": prompt_ids, "logprobs": logprobs, "env_mask": env_mask, **extra}
    wrong = {k: len(v) for k, v in sized.items() if v is not None and len(v) != rows}
    if wrong:
        raise ValueError(f"rollout_func returned {rows} completion_ids but {wrong} rows of "
                         "other keys; every key needs one value per row")
    for name, per_token in (("logprobs", logprobs), ("env_mask", env_mask)):
        if per_token is not None and [len(r) for r in per_token] != [len(c) for c in
                                                                     completion_ids]:
            raise ValueError(f"rollout_func's {name} must hold one value per completion "
                             "token, row by row")
    return RolloutFuncResult(
        [list(p) for p in prompt_ids], [list(c) for c in completion_ids],
        None if logprobs is None else [list(r) for r in logprobs],
        None if env_mask is None else [list(r) for r in env_mask], extra)


class CustomRollouts:
    """The worker's rollouts through ``generate(prompts [N]) -> (prompt_ids, completion_ids,
    tool_mask, completions, logprobs, extra_fields, ...)`` (TRL's ``GRPOTrainer._generate``,
    which calls ``rollout_func``); ``stop_ids``: the EOS and pad ids that end a completion."""

    environments = None  # the reward functions get no environments

    def __init__(self, generate: Callable[[list[Any]], Sequence[Any]],
                 stop_ids: Sequence[int]) -> None:
        self.generate = generate
        self.stop_ids = set(stop_ids)
        self.last_environments = None

    def run(self, prompts: PromptSet, ids: Sequence[int], params: SamplingParams,
            group_size: int) -> AgentBatch:
        """Rollouts of prompts ``ids`` (``group_size`` each); ``params`` are rollout_func's
        to choose (it reads the trainer's settings)."""
        messages = [prompts.prompt(i) for i in ids for _ in range(group_size)]
        # TRL's _generate also returns images and tool images, which a text model has none of
        prompt_ids, completion_ids, tool_mask, completions, logprobs, extra = \
            tuple(self.generate(messages))[:6]
        if len(completion_ids) != len(messages):
            raise ValueError(f"rollout_func returned {len(completion_ids)} completions for "
                             f"{len(messages)} prompts (each prompt {group_size} times); "
                             "return one per prompt it was given")
        finished = [bool(c) and c[-1] in self.stop_ids for c in completion_ids]  # TRL's rule
        mask = tool_mask or [[1] * len(c) for c in completion_ids]  # no env_mask: all the model's
        generation = GenerationOutput(prompt_ids, completion_ids, finished, logprobs)
        # calls made inside rollout_func are unseen: TRL counts tools/* only for tools=
        none = [0] * len(completion_ids)
        output = AgentOutput(generation, list(completions), mask, none, none)
        return AgentBatch(output, messages, None, columns=dict(extra))
