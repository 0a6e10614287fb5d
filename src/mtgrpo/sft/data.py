"""SFT data: (prompt, completion) pairs from rows, their token ids, and padded batches.

Rows come in TRL's two shapes:

* prompt-completion: a ``prompt`` column (text, or chat messages) and a ``completion`` column
  (text, or TRL's conversational form ``[{"role": "assistant", "content": ...}]``);
* conversational language modelling: a ``messages`` column whose last message is the
  assistant's turn; that turn's content is the completion, the messages before it the prompt.

Tokenisation. The prompt is rendered and tokenised by the GRPO trainer's own
:class:`~mtgrpo.tasks.prompt_set.PromptSet` (chat messages through the tokenizer's chat template
with the generation prompt; a final assistant message continued), so the context of every
example is, token for token, the prompt a GRPO rollout starts from. The completion is
tokenised on its own (no special tokens) and the tokenizer's EOS id is appended unless it is
already the last id: the sequence GRPO would generate, stop included.

Departure from TRL 1.16 (``SFTTrainer`` tokenisation of prompt-completion data): TRL renders
conversational ``prompt + completion`` through the chat template as one conversation, and
tokenises ``prompt + completion`` text jointly, so the trained tail is the template's own turn
end and the boundary tokens may merge. Here the two parts are tokenised separately, matching
how rollouts are produced (completion ids follow the prompt ids) and scored (the reward reads
the completion text).

Batches use the GRPO layout of :mod:`mtgrpo.policy.micro_batches`: contexts left-padded,
targets right-padded, so :func:`mtgrpo.policy.sequence_logprobs` scores the targets with the
positions a rollout had. With ``completion_only_loss`` the context is the prompt and the target
the completion (+EOS); without it the context is the first token only and every later token
is a target.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mtgrpo.tasks.paper import ensure_trainable

if TYPE_CHECKING:
    from torch import Tensor

logger = logging.getLogger(__name__)

__all__ = [
    "PromptCompletion",
    "SFTBatch",
    "SFTExample",
    "SFTExamples",
    "collate_examples",
    "encode_examples",
    "example_lengths",
    "prompt_completion_pairs",
]


@dataclass(frozen=True)
class PromptCompletion:
    """One training pair: ``prompt`` (text or chat messages), ``completion`` text, its task."""

    prompt: Any
    completion: str
    task: str


@dataclass(frozen=True)
class SFTExample:
    """Token ids of one example; ``row`` is its index in the rows given."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]  # completion text + EOS (cut when truncated)
    row: int

    def split(self, completion_only_loss: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(context, target)``: the tokens the model reads before the first scored one, and
        the scored tokens (the completion, or everything after the first token)."""
        if completion_only_loss:
            return self.prompt_ids, self.completion_ids
        ids = self.prompt_ids + self.completion_ids
        return ids[:1], ids[1:]  # the first token has nothing before it to be predicted from


@dataclass(frozen=True)
class SFTExamples:
    """Encoded examples and what the length limit did to them."""

    examples: list[SFTExample]
    truncated: int  # examples cut to max_length
    dropped: int  # examples left out (no completion token within max_length, or "drop")


def _completion_text(value: Any, number: int, column: str) -> str:
    if isinstance(value, list) and value and all(isinstance(m, Mapping) for m in value):
        roles = [m.get("role") for m in value]
        if any(role != "assistant" for role in roles):
            raise ValueError(
                f"row {number}: a conversational {column!r} must hold assistant messages only, "
                f"got roles {roles}"
            )
        value = "".join(str(m.get("content", "")) for m in value)
    if not isinstance(value, str):
        raise TypeError(
            f"row {number}: {column!r} must be a string (or assistant messages), got "
            f"{type(value).__name__}"
        )
    if not value.strip():
        raise ValueError(
            f"row {number} has an empty {column!r}; SFT teaches the completion text, so give a "
            "non-empty one or drop the row"
        )
    return value


def _from_messages(messages: Any, number: int, column: str) -> tuple[Any, str]:
    if not (isinstance(messages, list) and all(isinstance(m, Mapping) and "role" in m
                                               for m in messages)):
        raise ValueError(
            f"row {number}: {column!r} must be a list of chat messages "
            "({'role': ..., 'content': ...})"
        )
    if len(messages) < 2 or messages[-1]["role"] != "assistant":
        roles = [m["role"] for m in messages]
        raise ValueError(
            f"row {number}: {column!r} (roles {roles}) must end with the assistant turn to learn "
            "and have at least one message before it"
        )
    return list(messages[:-1]), _completion_text(messages[-1].get("content"), number, column)


def prompt_completion_pairs(
    rows: Iterable[Mapping[str, Any]],
    *,
    prompt_column: str = "prompt",
    completion_column: str = "completion",
    messages_column: str = "messages",
) -> list[PromptCompletion]:
    """The (prompt, completion) pair of every row, in order (see the module docstring).

    A row with both ``prompt_column`` and ``completion_column`` is a prompt-completion row;
    otherwise ``messages_column`` must hold the conversation. ``task`` is the row's ``task``
    (``"sft"`` when absent). Raises ``ValueError`` for no rows, a row with neither shape, and
    test rows (``split == "test"`` or the papers' released test sets).
    """
    rows = [dict(row) for row in rows]
    if not rows:
        raise ValueError(
            "no training rows were given; pass rows with prompt/completion columns, or task "
            "rows through solutions_from_rows"
        )
    ensure_trainable(rows)  # test rows never train (mtgrpo.tasks.paper.ensure_trainable)
    pairs = []
    for number, row in enumerate(rows):
        if prompt_column in row and completion_column in row:
            prompt = row[prompt_column]
            completion = _completion_text(row[completion_column], number, completion_column)
        elif messages_column in row:
            prompt, completion = _from_messages(row[messages_column], number, messages_column)
        else:
            raise ValueError(
                f"row {number} has columns {sorted(row)}, but SFT needs {prompt_column!r} and "
                f"{completion_column!r} (or {messages_column!r} ending with the assistant turn); "
                "rename the columns, pass prompt_column=/completion_column=, or turn task rows "
                "with gold answers into completions with solutions_from_rows"
            )
        pairs.append(PromptCompletion(prompt, completion, str(row.get("task", "sft"))))
    return pairs


def _eos_id(tokenizer: Any) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError(
            "the tokenizer has no EOS token, so the model cannot learn to stop; set "
            "tokenizer.eos_token to the token that ends a turn (e.g. '<|im_end|>')"
        )
    return int(eos)


def encode_examples(
    pairs: Sequence[PromptCompletion],
    tokenizer: Any,
    *,
    max_length: int | None = None,
    on_long_example: str = "truncate",
    max_prompt_length: int | None = None,
) -> SFTExamples:
    """Token ids of every pair (prompt through ``PromptSet``, completion + EOS).

    ``max_prompt_length``: prompts longer than this keep their last tokens, exactly as the GRPO
    trainer's ``PromptSet`` cuts them (with a warning).

    Examples longer than ``max_length`` tokens: ``"truncate"`` keeps their first
    ``max_length`` tokens (TRL's ``keep_start``; the EOS is then cut off), ``"drop"`` leaves
    them out, ``"error"`` raises. A truncated example whose prompt alone fills
    ``max_length`` has no completion token left and is dropped. A warning counts both.
    """
    from mtgrpo.tasks.prompt_set import PromptSet

    eos = _eos_id(tokenizer)
    prompts = PromptSet([{"prompt": p.prompt, "task": p.task} for p in pairs], tokenizer,
                        max_prompt_length=max_prompt_length)
    prompts.tokenize_all()  # one batched tokenizer call rather than one per row
    # The completion follows the prompt: no BOS in between.
    completions = tokenizer([p.completion for p in pairs], add_special_tokens=False)["input_ids"]
    examples, truncated, dropped = [], 0, 0
    for row, ids in enumerate(completions):
        prompt_ids = list(prompts.tokens(row))
        completion_ids = list(ids) if ids and ids[-1] == eos else [*ids, eos]
        total = len(prompt_ids) + len(completion_ids)
        if max_length is not None and total > max_length:
            if on_long_example == "error":
                raise ValueError(
                    f"row {row} has {total} tokens (prompt {len(prompt_ids)} + completion "
                    f"{len(completion_ids)}), more than max_length={max_length}; raise "
                    "max_length, or set on_long_example to 'truncate' or 'drop'"
                )
            keep = max_length - len(prompt_ids)
            # The prompt alone fills max_length: no completion token to learn.
            if on_long_example == "drop" or keep < 1:
                dropped += 1
                continue
            # TRL's keep_start: the first max_length tokens, the EOS cut off.
            completion_ids = completion_ids[:keep]
            truncated += 1
        examples.append(SFTExample(tuple(prompt_ids), tuple(completion_ids), row))
    if truncated or dropped:
        logger.warning(
            "max_length=%s: %d example(s) truncated, %d dropped (of %d)",
            max_length, truncated, dropped, len(pairs),
        )
    if not examples:
        raise ValueError(
            f"every example was dropped by max_length={max_length} (the prompts alone reach it); "
            "raise max_length"
        )
    return SFTExamples(examples, truncated, dropped)


@dataclass(frozen=True)
class SFTBatch:
    """Padded examples in the GRPO layout: ``input_ids = cat([context, target], 1)``.

    Contexts are left-padded to ``P`` columns, targets right-padded to ``L``; the loss is taken
    on ``input_ids[:, -L:]`` where ``target_mask`` is set.
    """

    input_ids: Tensor  # [N, P + L]
    attention_mask: Tensor  # [N, P + L]
    target_mask: Tensor  # [N, L] bool

    @property
    def target_length(self) -> int:
        return self.target_mask.shape[1]

    @property
    def num_target_tokens(self) -> int:
        return int(self.target_mask.sum())

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())


def example_lengths(examples: Sequence[SFTExample], completion_only_loss: bool) -> list[list[int]]:
    """``[N, 2]``: context and target tokens per example (what ``plan_micro_batches`` packs)."""
    lengths = []
    for example in examples:
        context, target = example.split(completion_only_loss)
        lengths.append([len(context), len(target)])
    return lengths


def collate_examples(
    examples: Sequence[SFTExample],
    *,
    pad_token_id: int,
    completion_only_loss: bool = True,
    device: Any = None,
) -> SFTBatch:
    """Pad ``examples`` into one :class:`SFTBatch` (see the module docstring for the layout)."""
    import torch

    if not examples:
        raise ValueError("a batch needs at least one example")
    parts = [example.split(completion_only_loss) for example in examples]
    width_p = max(len(context) for context, _ in parts)
    width_l = max(len(target) for _, target in parts)
    rows = len(parts)
    input_ids = torch.full((rows, width_p + width_l), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, width_p + width_l), dtype=torch.long)
    for n, (context, target) in enumerate(parts):
        # Left-padded: every target starts at column P, as in a rollout.
        start = width_p - len(context)
        input_ids[n, start:width_p] = torch.tensor(context, dtype=torch.long)
        input_ids[n, width_p:width_p + len(target)] = torch.tensor(target, dtype=torch.long)
        attention_mask[n, start:width_p + len(target)] = 1
    target_mask = attention_mask[:, width_p:].bool()  # [N, L]
    return SFTBatch(input_ids.to(device), attention_mask.to(device), target_mask.to(device))
