"""Prompt formats and answer formats for task suites.

A task item is rendered in two steps: its family writes the *question* (which already
says where the final answer goes, see :class:`AnswerFormat`), then a *prompt format*
wraps the question for the model.

Prompt formats (registry :data:`PROMPT_FORMATS`):

- ``plain`` (a string): the template of the MT-GRPO / SEC papers, read from the
  ``prompt`` column of the papers' released test sets (verbatim)::

      A conversation between User and Assistant. The user asks a question, and the
      Assistant solves it. The assistant first thinks about the reasoning process in the
      mind and then provides the user with the answer.
      User: {question}
      Assistant: Let me solve this step by step.

- ``chat`` (a list of messages for a chat template): an optional system message, then
  one user message holding the question.
- ``paper`` (a list of messages): the released test sets' own layout (verl's), one user
  message whose content is the whole ``plain`` text. This is what the papers' models saw
  after their chat template was applied.

``think_prefix=True`` follows the R1-style recipe of the GRPO tutorial seed: the prompt
ends with ``<think>`` so that the completion starts inside the reasoning block. For
``plain`` the string ends with ``"\\n<think>"``; for the message formats a final,
unfinished assistant message ``{"role": "assistant", "content": "<think>"}`` is appended,
which the rollout must render with ``continue_final_message=True`` (transformers'
``apply_chat_template``) rather than ``add_generation_prompt=True``.

Answer formats (registry :data:`ANSWER_FORMATS`): ``answer_tag`` (default,
``<answer> … </answer>``, the TinyZero / R1 convention) and ``boxed`` (``\\boxed{…}``, the
convention of the released test sets). The *last* occurrence in a completion is the
answer, as in TinyZero's and verl's extractors, so a model may draft answers while
reasoning and the final one counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mtgrpo.algo.registry import Registry

__all__ = [
    "ANSWER_FORMATS",
    "PAPER_SYSTEM_PREAMBLE",
    "PROMPT_FORMATS",
    "THINK_PREFIX",
    "AnswerFormat",
    "Messages",
    "Prompt",
    "completion_text",
    "extract_boxed",
    "extract_tagged",
    "format_prompt",
]

Messages = list[dict[str, str]]
Prompt = str | Messages

PAPER_SYSTEM_PREAMBLE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer."
)
_PLAIN_TEMPLATE = (
    PAPER_SYSTEM_PREAMBLE + "\nUser: {question}\nAssistant: Let me solve this step by step."
)
THINK_PREFIX = "<think>"

def extract_tagged(text: str) -> str | None:
    """Content of the last ``<answer>…</answer>`` pair, stripped; ``None`` if there is none.

    Linear-time and size-capped: :func:`mtgrpo.rewards.verifiers.answer.extract_tag` (a
    text over 1,000,000 characters has no answer).
    """
    from mtgrpo.rewards.verifiers.answer import extract_tag  # not at import: generation
    # workers import this module and need none of the reward code

    return extract_tag(text)


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` with balanced braces, stripped; ``None`` if none.

    Braces are matched by depth so that ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``;
    an unclosed box does not count as an answer. Linear-time and size-capped:
    :func:`mtgrpo.rewards.verifiers.answer.extract_boxed`.
    """
    from mtgrpo.rewards.verifiers.answer import extract_boxed as extract

    return extract(text)


@dataclass(frozen=True)
class AnswerFormat:
    """Where a completion puts its final answer, and how to read it back.

    ``where`` completes instructions such as "Return the final answer {where}";
    ``example(x)`` shows ``x`` in the expected container; ``extract(completion)`` returns
    the answer text or ``None`` when the container is absent.
    """

    name: str
    where: str
    open: str
    close: str
    extract: Callable[[str], str | None]

    def example(self, answer: str) -> str:
        return f"{self.open}{answer}{self.close}"


ANSWER_FORMATS: Registry[AnswerFormat] = Registry("answer format")
ANSWER_FORMATS.add(
    "answer_tag",
    AnswerFormat(
        # spaced inside the tags as TinyZero's example is: "<answer> (1 + 2) / 3 </answer>"
        "answer_tag", "in <answer> </answer> tags", "<answer> ", " </answer>", extract_tagged
    ),
    aliases=("answer", "tag", "tags"),
)
ANSWER_FORMATS.add(
    "boxed",
    AnswerFormat("boxed", "in \\boxed{}", "\\boxed{", "}", extract_boxed),
    aliases=("box",),
)


def _plain(question: str, think_prefix: bool, system_prompt: str | None) -> Prompt:
    if system_prompt is not None:
        raise ValueError(
            "prompt format 'plain' has no system message (its preamble is fixed); "
            "use prompt_format='chat' to pass system_prompt"
        )
    text = _PLAIN_TEMPLATE.format(question=question)
    # TinyZero's R1 template ends the same way: "Let me solve this step by step.\n<think>"
    return f"{text}\n{THINK_PREFIX}" if think_prefix else text


def _messages(content: str, think_prefix: bool, system_prompt: str | None) -> Messages:
    messages: Messages = []
    if system_prompt is not None:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": content})
    if think_prefix:
        # An unfinished assistant turn: rendered with continue_final_message=True.
        messages.append({"role": "assistant", "content": THINK_PREFIX})
    return messages


def _chat(question: str, think_prefix: bool, system_prompt: str | None) -> Prompt:
    return _messages(question, think_prefix, system_prompt)


def _paper(question: str, think_prefix: bool, system_prompt: str | None) -> Prompt:
    return _messages(_PLAIN_TEMPLATE.format(question=question), think_prefix, system_prompt)


PromptFormatter = Callable[[str, bool, str | None], Prompt]
PROMPT_FORMATS: Registry[PromptFormatter] = Registry("prompt format")
PROMPT_FORMATS.add("plain", _plain, aliases=("text", "r1"))
PROMPT_FORMATS.add("chat", _chat, aliases=("messages", "conversational"))
PROMPT_FORMATS.add("paper", _paper, aliases=("verl",))


def format_prompt(
    question: str,
    prompt_format: str = "plain",
    *,
    think_prefix: bool = False,
    system_prompt: str | None = None,
) -> Prompt:
    """Wrap a question in a prompt format (see the module docstring for each format)."""
    return PROMPT_FORMATS.get(prompt_format)(question, think_prefix, system_prompt)


def completion_text(completion: Any) -> str:
    """The text of one completion: a string, or TRL's conversational form.

    A conversational completion is a list of messages; its text is the content of the
    messages joined in order (usually a single assistant message).
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list | tuple) and all(isinstance(m, dict) for m in completion):
        return "".join(str(m.get("content", "")) for m in completion)
    raise TypeError(
        f"a completion must be a string or a list of chat messages, got {type(completion).__name__}"
    )
