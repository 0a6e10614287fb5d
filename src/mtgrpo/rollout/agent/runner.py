"""Rollouts of a run with tools: the prompts of a batch, their environments, the tool loop."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mtgrpo.rollout.agent.environments import Environments, with_observation
from mtgrpo.rollout.agent.loop import AgentOutput, ToolLoop
from mtgrpo.rollout.base import SamplingParams
from mtgrpo.tasks import PromptSet, is_conversational

__all__ = ["AgentBatch", "AgentRollouts"]

ENVIRONMENT_COLUMN = "environment"
EMPTY_PROMPT = ({"role": "user", "content": ""},)  # TRL's, for rows without a prompt


@dataclass
class AgentBatch:
    """``N`` rollouts: the loop's output, the prompts the model saw (with the environments'
    observations), each rollout's environment (None without environments) and the per-rollout
    fields the reward functions also receive (``environments``; ``rollout_func``'s extras)."""

    output: AgentOutput
    prompts: list[Any]
    environments: list[Any] | None
    columns: dict[str, list[Any]] = field(default_factory=dict)


class AgentRollouts:
    """Multi-turn rollouts with ``tools`` (every rollout) and ``environments`` (one instance
    per rollout, chosen by the row's ``environment`` column when there are several).

    ``hidden_columns``: row keys not passed to ``reset`` (e.g. a task label the trainer added).
    """

    def __init__(self, loop: ToolLoop, tools: Sequence[Callable[..., Any]] = (),
                 environments: Environments | None = None,
                 hidden_columns: Sequence[str] = ()) -> None:
        self.loop = loop
        self.tools = list(tools)
        self.environments = environments
        self.hidden_columns = set(hidden_columns)
        self.last_environments: list[Any] | None = None  # of the last batch (TRL's surface)

    def run(self, prompts: PromptSet, ids: Sequence[int], params: SamplingParams,
            group_size: int) -> AgentBatch:
        """Rollouts of prompts ``ids`` (``group_size`` each, grouped by prompt)."""
        rows = [prompts.row(i) for i in ids for _ in range(group_size)]
        messages = [self._messages(prompts, i) for i in ids for _ in range(group_size)]
        environments = self._environments(rows)
        if environments is None:
            tools = [self.tools] * len(rows)
        else:
            assert self.environments is not None
            tools = [self.environments.rollout_tools(e) for e in environments]
            # reset before every rollout, pooled instances too (TRL's "construct once, reset often")
            messages = [with_observation(m, e.reset(**self._reset_arguments(row)))
                        for m, e, row in zip(messages, environments, rows, strict=True)]
        output = self.loop.run(messages, tools, params, group_size)
        self.last_environments = environments
        columns = {} if environments is None else {"environments": environments}
        return AgentBatch(output, messages, environments, columns)

    def _messages(self, prompts: PromptSet, index: int) -> list[dict[str, Any]]:
        row = prompts.row(index)
        prompt = row.get(prompts.prompt_column)
        if prompt is None and self.environments is not None:
            return [dict(m) for m in EMPTY_PROMPT]  # the environment writes the prompt
        if not is_conversational(prompt):
            raise ValueError(
                f"row {index}: tool calling needs chat prompts (a list of messages), got "
                f"{type(prompt).__name__}; write the prompt as [{{'role': 'user', 'content': "
                "...}] so the chat template can render the tools and their replies")
        return [dict(m) for m in prompt]

    def _environments(self, rows: list[dict[str, Any]]) -> list[Any] | None:
        if self.environments is None:
            return None
        if self.environments.multiple:
            names = [row.get(ENVIRONMENT_COLUMN) for row in rows]
        else:
            names = [None] * len(rows)
        return self.environments.instances(names)

    def _reset_arguments(self, row: dict[str, Any]) -> dict[str, Any]:
        hidden = set(self.hidden_columns)
        if self.environments is not None and self.environments.multiple:
            # TRL's rule: with several environments the column routes rows; reset never sees it
            hidden.add(ENVIRONMENT_COLUMN)
        return {k: v for k, v in row.items() if k not in hidden}
