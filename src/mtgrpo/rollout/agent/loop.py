"""The multi-turn tool loop: generate, run the tools the model called, generate again.

For ``N = B*G`` rollouts (rows grouped by prompt, the project's order), each with its chat
prompt and its tools::

    turn 1   generate every rollout's first turn (one batched call; a prompt shared by the G
             rollouts of a group is sent once with num_samples=G)
    repeat   parse the turn (text and tool calls); run every rollout's calls (rollouts
             concurrently, each with a time limit); append the replies, rendered by the chat
             template, to the rollout's tokens; generate the next turn of every rollout that
             called a tool (one batched call)
    until    no rollout called a tool, or ``max_iterations`` rounds of tool calls were run

A rollout's completion is everything after its prompt: the model's turns and the tool replies
between them. ``tool_mask`` marks each completion token 1 when the model sampled it and 0 when a
tool reply (or the chat template's text around it) put it there: such tokens are attended to
but carry no loss and no log-probability (TRL's ``tool_mask``). The budget is TRL's: a
completion holds at most ``max_completion_length`` tokens, model and tool tokens together, and
the whole sequence stays within ``max_context`` tokens. A tool reply that would leave no room
for one more model token is rolled back (the messages and tokens of that reply are dropped) and
the rollout ends on the model's last turn; a turn is cut to the rollout's remaining budget.

A turn whose calls are all malformed (no JSON object, no name) ends the rollout by default, as
in TRL, and its calls count as failed; ``malformed="reply"`` answers them with the error
instead, so the model can correct itself. A turn cut by the budget (no stop token) ends the
rollout without running its calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mtgrpo.algo.registry import MALFORMED_TOOL_CALLS
from mtgrpo.rollout.agent.execution import EventLoop, ToolResult, run_tool_calls, tools_by_name
from mtgrpo.rollout.agent.parsing import ParsedTurn, ToolCallParser, parse_hermes_tool_calls
from mtgrpo.rollout.base import GenerationBackend, GenerationOutput, SamplingParams

__all__ = ["AgentOutput", "ToolLoop", "tool_reply_ids"]


@dataclass
class AgentOutput:
    """``N`` rollouts. ``generation``: prompt and completion ids, finished flags, the engine's
    log-probs (0.0 at tool tokens) as any generation; ``completions``: each completion as
    messages (assistant turns and tool replies); ``tool_mask``: ``[N]`` lists aligned with the
    completion ids (1 = sampled by the model); ``tool_calls`` / ``tool_failures``: ``[N]``
    counts of the calls run and of those that failed."""

    generation: GenerationOutput
    completions: list[list[dict[str, Any]]]
    tool_mask: list[list[int]]
    tool_calls: list[int]
    tool_failures: list[int]

    @property
    def model_token_counts(self) -> list[int]:
        """``[N]`` completion tokens the model sampled (what length metrics count)."""
        return [sum(mask) for mask in self.tool_mask]


@dataclass
class _Rollout:
    prompt_ids: list[int]
    tools: dict[str, Callable[..., Any]]
    completion_ids: list[int] = field(default_factory=list)
    tool_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False
    turn: ParsedTurn | None = None
    calls: int = 0
    failures: int = 0

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


def tool_reply_ids(tokenizer: Any, tool_messages: Sequence[Mapping[str, Any]],
                   chat_template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """The tokens the chat template puts after a model turn that ended with its end-of-turn
    token: the tool replies and the next assistant header (TRL's ``_get_tool_suffix_ids``).

    Rendered as the difference of two conversations, one ending with an assistant turn that
    calls a tool and one that adds the replies, so any template that renders tool calls and
    tool messages works; the first must end with the tokenizer's EOS text (the end of the turn
    the model sampled), and be a prefix of the second."""
    kwargs = dict(chat_template_kwargs or {})
    # TRL's _get_tool_suffix_ids: a dummy tool call under the real tool name (some templates
    # derive the tool reply's header from it), then the reply is what the template adds after it
    call = {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}
    dummy = [{"role": "user", "content": "dummy"},
             {"role": "assistant", "content": "", "tool_calls": [call]}]
    prefix = tokenizer.apply_chat_template(dummy, tokenize=False, **kwargs)
    full = tokenizer.apply_chat_template(dummy + list(tool_messages), tokenize=False,
                                         add_generation_prompt=True, **kwargs)
    eos = tokenizer.eos_token
    # as TRL: the prefix ends at its last EOS, not after the "\n" Qwen3's template adds
    if eos and eos in prefix:
        prefix = prefix[: prefix.rindex(eos) + len(eos)]
    if not full.startswith(prefix):
        raise ValueError(
            "the chat template does not extend a conversation when tool replies are added "
            "(the rendering up to the assistant's end-of-turn token is not a prefix of the "
            "rendering with the replies); tool calling needs a prefix-preserving template"
        )
    return list(tokenizer(full[len(prefix):], add_special_tokens=False)["input_ids"])


class ToolLoop:
    """Multi-turn generation with tools over a :class:`GenerationBackend` (module docstring).

    ``max_completion_length``: completion budget in tokens (model and tool tokens);
    ``max_iterations``: rounds of tool calls (None: until no rollout calls a tool);
    ``max_context``: the model's context in tokens (None: unbounded); ``timeout``: seconds
    each call may take; ``parser``: reads a turn's calls (default: Hermes ``<tool_call>``);
    ``malformed``: ``"end"`` (TRL) or ``"reply"``.
    """

    def __init__(
        self,
        backend: GenerationBackend,
        tokenizer: Any,
        *,
        max_completion_length: int,
        max_iterations: int | None = None,
        max_context: int | None = None,
        timeout: float = 60.0,
        parser: ToolCallParser = parse_hermes_tool_calls,
        malformed: str = "end",
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if malformed not in MALFORMED_TOOL_CALLS:
            raise ValueError(f"malformed must be one of {MALFORMED_TOOL_CALLS}, got {malformed!r}")
        if max_iterations is not None and max_iterations < 0:
            raise ValueError(f"max_iterations must be >= 0 or None, got {max_iterations!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.backend = backend
        self.tokenizer = tokenizer
        self.max_completion_length = max_completion_length
        self.max_iterations = max_iterations
        self.max_context = max_context
        self.timeout = float(timeout)
        self.parser = parser
        self.malformed = malformed
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.event_loop = EventLoop()
        self._token_chars: int | None = None

    def _longest_token(self) -> int:
        """An upper bound on the characters one token stands for: its vocabulary spelling
        (byte-level and SentencePiece spellings are never shorter than the text they decode
        to) plus one for a space a decoder may put between tokens. A text of ``n`` characters
        thus needs at least ``n / bound`` tokens."""
        if self._token_chars is None:
            vocabulary = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
            self._token_chars = max(len(t) for t in vocabulary if isinstance(t, str)) + 1
        return self._token_chars

    # ------------------------------------------------------------------ rendering
    def render(self, messages: Sequence[Mapping[str, Any]],
               tools: Sequence[Callable[..., Any]]) -> list[int]:
        """A chat prompt with its tools' schemas, as the token ids the model reads."""
        text = self.tokenizer.apply_chat_template(
            list(messages), tools=list(tools) or None, tokenize=False,
            add_generation_prompt=True, **self.chat_template_kwargs)
        # the template wrote the special tokens (BOS) already; adding them again doubles them
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # ------------------------------------------------------------------ the loop
    def run(self, prompts: Sequence[Sequence[Mapping[str, Any]]],
            tools: Sequence[Sequence[Callable[..., Any]]], params: SamplingParams,
            group_size: int) -> AgentOutput:
        """``prompts``, ``tools``: ``[N]``, rows grouped by prompt (``group_size`` each)."""
        if len(prompts) != len(tools) or len(prompts) % group_size:
            raise ValueError(f"{len(prompts)} prompts and {len(tools)} tool lists for groups "
                             f"of {group_size}: give one of each per rollout")
        rollouts = [_Rollout(self.render(p, t), tools_by_name(t))
                    for p, t in zip(prompts, tools, strict=True)]
        version = self._first_turn(rollouts, params, group_size)
        active = [r for r in rollouts if self._wants_tools(r)]
        iteration = 0
        while active and (self.max_iterations is None or iteration < self.max_iterations):
            active = self._answer(active)
            if active:
                self._next_turn(active, params)
            active = [r for r in active if self._wants_tools(r)]
            iteration += 1
        return self._output(rollouts, version)

    def _first_turn(self, rollouts: list[_Rollout], params: SamplingParams,
                    group_size: int) -> int | None:
        groups = [rollouts[i: i + group_size] for i in range(0, len(rollouts), group_size)]
        # one prompt per group, num_samples=G: the static backend prefills it once for the group
        if all(r.prompt_ids == g[0].prompt_ids for g in groups for r in g):
            out = self.backend.generate([g[0].prompt_ids for g in groups],
                                        self._budgeted(params, self.max_completion_length),
                                        group_size)
        else:  # the environments made each rollout's prompt its own
            out = self.backend.generate([r.prompt_ids for r in rollouts],
                                        self._budgeted(params, self.max_completion_length), 1)
        for i, rollout in enumerate(rollouts):
            self._take_turn(rollout, out, i)
        return out.weights_version

    def _room(self, rollout: _Rollout) -> int:
        """Tokens ``rollout`` may still add: the completion budget's, within the context."""
        room = self.max_completion_length - len(rollout.completion_ids)
        if self.max_context is not None:
            room = min(room, self.max_context - rollout.length)
        return room

    def _next_turn(self, rollouts: list[_Rollout], params: SamplingParams) -> None:
        room = [self._room(r) for r in rollouts]
        # one batched call has one max_new_tokens: the largest room; each turn is cut to its own
        out = self.backend.generate([r.prompt_ids + r.completion_ids for r in rollouts],
                                    self._budgeted(params, max(room)), 1)
        for i, rollout in enumerate(rollouts):
            self._take_turn(rollout, out, i, limit=room[i])

    @staticmethod
    def _budgeted(params: SamplingParams, tokens: int) -> SamplingParams:
        # at least 1: SamplingParams refuses max_new_tokens < 1
        return replace(params, max_new_tokens=max(1, min(params.max_new_tokens, tokens)))

    def _take_turn(self, rollout: _Rollout, out: GenerationOutput, row: int,
                   limit: int | None = None) -> None:
        ids = list(out.completion_ids[row])
        finished = out.finished[row]
        # a turn cut to its room never reached its stop token, so its calls are not run
        if limit is not None and len(ids) > limit:
            ids, finished = ids[:limit], False
        rollout.completion_ids += ids
        rollout.tool_mask += [1] * len(ids)
        # all or none: a turn without log-probs would leave the rest misaligned with the ids
        if out.logprobs is None or rollout.logprobs is None:
            rollout.logprobs = None
        else:
            rollout.logprobs += list(out.logprobs[row][: len(ids)])
        rollout.finished = finished
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        rollout.turn = self.parser(text)
        rollout.messages.append(rollout.turn.message())

    def _wants_tools(self, rollout: _Rollout) -> bool:
        """The last turn called a tool and can be answered."""
        turn = rollout.turn
        if turn is None or not turn.calls or not rollout.finished:
            return False
        # TRL's rule, kept: a model that has not learnt the format would otherwise spend its
        # whole budget on error replies, and the rollout's reward should say it failed
        if self.malformed == "end" and all(call.malformed for call in turn.calls):
            rollout.calls += len(turn.calls)
            rollout.failures += len(turn.calls)
            return False
        return True

    def _answer(self, rollouts: list[_Rollout]) -> list[_Rollout]:
        """Run the calls of ``rollouts``' last turns; append the replies that fit the budget.
        Returns the rollouts that continue."""
        results = run_tool_calls([r.turn.calls for r in rollouts],  # type: ignore[union-attr]
                                 [r.tools for r in rollouts], timeout=self.timeout,
                                 loop=self.event_loop)
        continuing = []
        for rollout, replies in zip(rollouts, results, strict=True):
            rollout.calls += len(replies)
            rollout.failures += sum(reply.failed for reply in replies)
            if self._append_replies(rollout, replies):
                continuing.append(rollout)
        return continuing

    def _append_replies(self, rollout: _Rollout, replies: list[ToolResult]) -> bool:
        messages = [reply.message() for reply in replies]
        room = self._room(rollout)
        # a cheap bound first, so a flood of tool output is never rendered nor tokenized
        text = sum(len(m["content"]) for m in messages if isinstance(m["content"], str))
        if text >= room * self._longest_token():
            return False  # rolled back untokenized: its text alone needs more than the room
        ids = tool_reply_ids(self.tokenizer, messages, self.chat_template_kwargs)
        if len(ids) >= room:  # rolled back: the rollout ends on the model's last turn
            return False
        rollout.completion_ids += ids
        # TRL's tool_mask: a tool's reply is attended to but carries no loss
        rollout.tool_mask += [0] * len(ids)
        if rollout.logprobs is not None:
            # the engine sampled none of these tokens: no log-probability to correct with
            rollout.logprobs += [0.0] * len(ids)
        rollout.messages += messages
        return True

    def _output(self, rollouts: list[_Rollout], version: int | None) -> AgentOutput:
        has_logprobs = all(r.logprobs is not None for r in rollouts)
        generation = GenerationOutput(
            prompt_ids=[r.prompt_ids for r in rollouts],
            completion_ids=[r.completion_ids for r in rollouts],
            finished=[r.finished for r in rollouts],
            logprobs=[list(r.logprobs or []) for r in rollouts] if has_logprobs else None,
            weights_version=version,
        )
        return AgentOutput(generation, [r.messages for r in rollouts],
                           [r.tool_mask for r in rollouts], [r.calls for r in rollouts],
                           [r.failures for r in rollouts])
