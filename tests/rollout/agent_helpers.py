"""A scripted chat backend and a tool-capable tiny tokenizer for the tool-loop tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mtgrpo.models.tiny import build_tiny_tokenizer
from mtgrpo.rollout import GenerationOutput, SamplingParams
from mtgrpo.rollout.agent.templates import HERMES_CHATML_TEMPLATE

Script = Callable[[str, int], str]
"""``script(prompt_text, sample_index) -> completion text`` (the EOS token is added)."""


def tool_tokenizer() -> Any:
    tokenizer = build_tiny_tokenizer(model_max_length=4096)
    tokenizer.chat_template = HERMES_CHATML_TEMPLATE
    return tokenizer


def call_text(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def turn(prompt_text: str) -> int:
    """Which model turn a prompt asks for: 0 before any tool reply, then one more per reply."""
    return prompt_text.count("<tool_response>")


class ScriptedChat:
    """Completions written by ``script``; each ends with EOS (``finished``) unless it is cut
    at ``max_new_tokens``. ``calls`` records ``(rows, num_samples)`` per ``generate``; the
    engine's log-prob of every token is ``logprob``."""

    def __init__(self, tokenizer: Any, script: Script, logprob: float | None = None) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.logprob = logprob
        self.calls: list[tuple[int, int]] = []

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                 num_samples: int = 1) -> GenerationOutput:
        self.calls.append((len(prompt_ids), num_samples))
        prompts, completions, finished = [], [], []
        for ids in prompt_ids:
            text = self.tokenizer.decode(list(ids))
            for j in range(num_samples):
                out = self.tokenizer(self.script(text, j), add_special_tokens=False)["input_ids"]
                out = [*list(out), self.tokenizer.eos_token_id]
                finished.append(len(out) <= params.max_new_tokens)
                completions.append(out[: params.max_new_tokens])
                prompts.append(list(ids))
        logprobs = None
        if self.logprob is not None:
            logprobs = [[self.logprob] * len(c) for c in completions]
        return GenerationOutput(prompts, completions, finished, logprobs, weights_version=0)

    def update_weights(self, model_or_state: Any, version: int) -> None:
        pass


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b
