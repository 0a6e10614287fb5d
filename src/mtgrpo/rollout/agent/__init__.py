"""Multi-turn tool use: TRL's ``tools=``, ``environment_factory=`` and ``rollout_func=``.

:mod:`~mtgrpo.rollout.agent.parsing` reads a model turn's tool calls (Hermes
``<tool_call>`` blocks by default); :mod:`~mtgrpo.rollout.agent.execution` runs them, each with
a time limit, failures reported to the model; :mod:`~mtgrpo.rollout.agent.loop` is the batched
generate / call / generate loop and its ``tool_mask``;
:mod:`~mtgrpo.rollout.agent.environments` holds TRL's environments (tools with state, ``reset``,
``get_reward``); :mod:`~mtgrpo.rollout.agent.runner` turns a batch of prompts into rollouts;
:mod:`~mtgrpo.rollout.agent.custom` runs TRL's ``rollout_func`` in their place.
"""

from __future__ import annotations

from mtgrpo.rollout.agent.custom import CustomRollouts, RolloutFuncResult, check_rollout_output
from mtgrpo.rollout.agent.environments import Environments, environment_methods
from mtgrpo.rollout.agent.execution import ToolResult, run_tool_calls
from mtgrpo.rollout.agent.loop import AgentOutput, ToolLoop, tool_reply_ids
from mtgrpo.rollout.agent.parsing import (
    ParsedTurn,
    ToolCall,
    ToolCallParser,
    parse_hermes_tool_calls,
)
from mtgrpo.rollout.agent.runner import AgentBatch, AgentRollouts

__all__ = [
    "AgentBatch",
    "AgentOutput",
    "AgentRollouts",
    "CustomRollouts",
    "Environments",
    "ParsedTurn",
    "RolloutFuncResult",
    "ToolCall",
    "ToolCallParser",
    "ToolLoop",
    "ToolResult",
    "check_rollout_output",
    "environment_methods",
    "parse_hermes_tool_calls",
    "run_tool_calls",
    "tool_reply_ids",
]
