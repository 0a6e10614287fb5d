"""The ``<think>...</think>\\n<answer>...</answer>`` format and its reward.

The rule is the DeepSeek-R1-Zero format as written in seed 002's GRPO tutorial: a think block,
a newline, an answer block, nothing after it (one trailing newline is tolerated, as ``$`` in
that tutorial's regular expression tolerates it). The opening ``<think>`` may belong to the
prompt (the tutorial appends it to every prompt), so a completion that does not start with
``<think>`` is read as starting inside the think block. The think block may not contain
another ``<think>`` or ``</think>``. Checked with ``str.find``: linear in the text, no
regular-expression backtracking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mtgrpo.rewards.guard import score_each
from mtgrpo.rewards.verifiers._batch import completion_texts
from mtgrpo.rewards.verifiers.answer import MAX_TEXT_CHARS

__all__ = ["ThinkAnswer", "format_reward", "parse_think_answer"]

_THINK, _END_THINK = "<think>", "</think>"
_SEPARATOR = "\n<answer>"  # one newline between the blocks, as in the tutorial's regex
_END_ANSWER = "</answer>"


@dataclass(frozen=True)
class ThinkAnswer:
    """A completion that follows the format, split into its parts.

    Attributes:
        think: the reasoning between ``<think>`` and ``</think>``.
        answer: the text between ``<answer>`` and the final ``</answer>``, stripped.
    """

    think: str
    answer: str


def parse_think_answer(text: str) -> ThinkAnswer | None:
    """Split ``text`` by the format, or ``None`` when it does not follow it.

    >>> parse_think_answer(" ... </think>\\n<answer> 8 * 2 - 1 </answer>")
    ThinkAnswer(think=' ... ', answer='8 * 2 - 1')
    >>> parse_think_answer("<answer>1</answer>") is None
    True
    """
    # the extraction cap: bounded work on hostile output
    if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
        return None
    # the tutorial appends <think> to the prompt, so a completion may start inside the block
    body = text[len(_THINK) :] if text.startswith(_THINK) else text
    end_think = body.find(_END_THINK)
    # the first </think> ends the block: a second <think> before it breaks the format
    if end_think < 0 or _THINK in body[:end_think]:
        return None
    rest = body[end_think + len(_END_THINK) :]
    if not rest.startswith(_SEPARATOR):
        return None
    rest = rest[len(_SEPARATOR) :]
    if rest.endswith("\n"):  # one trailing newline, as `$` in the tutorial's regex allows
        rest = rest[:-1]
    if not rest.endswith(_END_ANSWER):
        return None
    return ThinkAnswer(think=body[:end_think], answer=rest[: -len(_END_ANSWER)].strip())


def format_reward(
    prompts: Sequence[Any] | None,
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]] | None = None,
    **columns: Any,
) -> list[float | None]:
    """1.0 when a completion follows ``<think>...</think>\\n<answer>...</answer>``, else 0.0.

    Range: {0.0, 1.0}; never ``None``. Completions may be strings or conversational message
    lists. See the module docstring for the exact rule.

    >>> format_reward(None, ["I add.</think>\\n<answer>4</answer>", "<answer>4</answer>"])
    [1.0, 0.0]
    """
    texts = completion_texts("format_reward", completions)
    return score_each(
        "format_reward", texts, lambda text: 0.0 if parse_think_answer(text) is None else 1.0
    )
