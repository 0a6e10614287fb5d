"""Tool calls in a model's turn: the Hermes ``<tool_call>{json}</tool_call>`` format.

The format is the one Qwen2.5/Qwen3, Hermes, SmolLM3 and most open tool-calling chat templates
emit (and that TRL's tests use)::

    <tool_call>
    {"name": "multiply", "arguments": {"a": 3, "b": 4}}
    </tool_call>

A turn is parsed into its text (the blocks removed) and its calls, in order. A block that does
not hold a JSON object with a string ``name`` and an object ``arguments`` is a *malformed* call:
it is kept with the reason, so the loop can count it as a failed call, never an exception.
Another format plugs in as a :data:`ToolCallParser`.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ParsedTurn", "ToolCall", "ToolCallParser", "parse_hermes_tool_calls"]


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for. ``error`` is None for a well-formed call; for a malformed
    one it says why, and ``name`` / ``arguments`` hold what could be read."""

    name: str | None
    arguments: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def malformed(self) -> bool:
        return self.error is not None

    def message(self) -> dict[str, Any]:
        """The call as a chat message's ``tool_calls`` entry (the transformers layout)."""
        return {"type": "function",
                "function": {"name": self.name or "", "arguments": dict(self.arguments)}}


@dataclass(frozen=True)
class ParsedTurn:
    """A model turn: its text without the call blocks, and the calls in order."""

    content: str
    calls: tuple[ToolCall, ...] = ()

    def message(self) -> dict[str, Any]:
        """The turn as an assistant message (with ``tool_calls`` when it made well-formed ones)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        # a malformed call lacks the name or arguments a template renders
        calls = [call.message() for call in self.calls if not call.malformed]
        if calls:
            message["tool_calls"] = calls
        return message


ToolCallParser = Callable[[str], ParsedTurn]
"""``parser(turn_text) -> ParsedTurn``: the text of one model turn (special tokens removed) to
its content and tool calls."""

# `|\Z`: a turn cut at its stop token may leave its last block unclosed; it still counts
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def _read_call(body: str) -> ToolCall:
    try:  # the model wrote this text: parsed as JSON data only, never evaluated
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall(None, error=f"the tool call is not valid JSON ({exc.msg})")
    if not isinstance(value, dict):
        return ToolCall(None, error="a tool call must be a JSON object with a name and arguments")
    name, arguments = value.get("name"), value.get("arguments", {})
    if isinstance(arguments, str):  # some templates emit the arguments as a JSON string
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    if not isinstance(name, str) or not name:
        return ToolCall(None, arguments if isinstance(arguments, dict) else {},
                        error="the tool call has no name")
    if not isinstance(arguments, dict):
        return ToolCall(name, error=f"the arguments of {name!r} must be a JSON object")
    return ToolCall(name, arguments)


def parse_hermes_tool_calls(text: str) -> ParsedTurn:
    """Split ``text`` into content and ``<tool_call>`` blocks (an unclosed last block counts,
    as a turn cut at its stop token may leave one)."""
    calls = tuple(_read_call(match.group(1).strip()) for match in _BLOCK.finditer(text))
    # a turn without calls keeps its text exactly as sampled
    content = _BLOCK.sub("", text).strip() if calls else text
    return ParsedTurn(content, calls)
