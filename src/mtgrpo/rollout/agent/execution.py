"""Running the tool calls of a turn: every rollout at once, each rollout's calls in order.

A tool is a Python callable, sync or ``async``. Each call has a time limit. Whatever goes wrong
is a *failed call* whose message the model reads in the tool's reply, never an exception of the
trainer: an unknown tool, arguments that do not fit the signature, a tool that raises, a tool
that overruns its time limit. Calls of different rollouts run concurrently (sync tools on worker
threads, async tools on one event loop); the calls of one rollout run one after the other, in
the order the model wrote them, since they may act on the same environment.

A sync tool that overruns keeps its worker thread until it returns (Python cannot stop a
thread); its result is discarded and the model reads a time-out error.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mtgrpo.rollout.agent.parsing import ToolCall

__all__ = ["EventLoop", "ToolResult", "run_tool_calls", "tool_name", "tools_by_name"]


@dataclass(frozen=True)
class ToolResult:
    """The reply to one call: the tool message's ``name`` and ``content``, and whether it failed."""

    name: str
    content: Any
    failed: bool

    def message(self) -> dict[str, Any]:
        return {"role": "tool", "name": self.name, "content": self.content}


def tool_name(tool: Callable[..., Any]) -> str:
    return getattr(tool, "__name__", type(tool).__name__)


def tools_by_name(tools: Sequence[Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """``{name: tool}``; two tools of one name are an error (the model could not tell them
    apart)."""
    named: dict[str, Callable[..., Any]] = {}
    for tool in tools:
        if not callable(tool):
            raise TypeError(f"a tool must be a callable (a function or a method), got {tool!r}")
        name = tool_name(tool)
        if name in named and named[name] is not tool:
            raise ValueError(f"two tools are named {name!r}; a model calls tools by name, so "
                             "each needs its own")
        named[name] = tool
    return named


def _content(value: Any) -> Any:
    """A tool's return value as message content (TRL's rule: a list of content blocks is kept,
    anything else becomes its ``str``)."""
    return value if isinstance(value, list) else str(value)


def _is_async(tool: Callable[..., Any]) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(tool) or inspect.iscoroutinefunction(
        type(tool).__call__)


def _failure(name: str, reason: str) -> ToolResult:
    """A failed call's reply: short, since every token of it counts against the completion
    budget (the tools' schemas are in the prompt already)."""
    return ToolResult(name, f"Error: {reason}", failed=True)


async def _call(call: ToolCall, tools: Mapping[str, Callable[..., Any]], timeout: float,
                pool: ThreadPoolExecutor) -> ToolResult:
    name = call.name or "unknown"
    if call.malformed:
        return _failure(name, call.error or "malformed tool call")
    tool = tools.get(name)
    if tool is None:
        return _failure(name, f"unknown tool {name!r}")
    try:
        # checked before the call: a tool never starts with arguments its signature refuses
        inspect.signature(tool).bind(**call.arguments)
    except TypeError as exc:
        return _failure(name, str(exc))  # e.g. "missing a required argument: 'b'"
    except ValueError:  # a callable without an inspectable signature: let the call decide
        pass
    try:
        if _is_async(tool):
            value = await asyncio.wait_for(tool(**call.arguments), timeout)
        else:
            loop = asyncio.get_running_loop()
            value = await asyncio.wait_for(
                loop.run_in_executor(pool, lambda: tool(**call.arguments)), timeout)
    except TimeoutError:  # what asyncio.wait_for raises since Python 3.11
        return _failure(name, f"{name} timed out after {timeout:g} s")
    except Exception as exc:  # a tool's error is the model's feedback, not the trainer's
        return _failure(name, f"{type(exc).__name__}: {exc}")
    return ToolResult(name, _content(value), failed=False)


async def _rollout(calls: Sequence[ToolCall], tools: Mapping[str, Callable[..., Any]],
                   timeout: float, pool: ThreadPoolExecutor) -> list[ToolResult]:
    return [await _call(call, tools, timeout, pool) for call in calls]


class EventLoop:
    """One event loop on a daemon thread, kept for the life of the tool loop: async tools (and
    what they hold, e.g. an HTTP session) see the same loop on every turn, as in TRL."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                # a daemon: a tool still running never keeps the trainer's process alive
                threading.Thread(target=self._loop.run_forever, name="mtgrpo-tools",
                                 daemon=True).start()
        # the caller's thread waits here: one turn's calls finish before the next turn is generated
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()


_SHARED_LOOP = EventLoop()


def run_tool_calls(
    calls: Sequence[Sequence[ToolCall]],  # [n] the calls of each rollout
    tools: Sequence[Mapping[str, Callable[..., Any]]],  # [n] each rollout's tools by name
    *,
    timeout: float,
    max_workers: int = 16,
    loop: EventLoop | None = None,
) -> list[list[ToolResult]]:  # [n], one result per call
    """Run every rollout's calls (each rollout's in order, rollouts concurrently)."""
    if len(calls) != len(tools):
        raise ValueError(f"{len(calls)} rollouts of calls but {len(tools)} tool tables")
    if not calls:
        return []

    # one thread per rollout at most: a rollout's own calls run one after the other
    pool = ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(calls))),
                              thread_name_prefix="mtgrpo-tool")

    async def everything() -> list[list[ToolResult]]:
        return list(await asyncio.gather(*(
            _rollout(c, t, timeout, pool) for c, t in zip(calls, tools, strict=True))))

    try:
        return (loop or _SHARED_LOOP).run(everything())
    finally:  # without waiting: a sync tool past its time limit must not hold the rollout
        pool.shutdown(wait=False, cancel_futures=True)
