"""Prompt sets: rows with their task labels and token ids (rendered once, cached), as the sampler,
the rollouts, evaluation and the SFT data address them."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["PromptSet", "is_conversational", "is_lazy_split"]


def is_lazy_split(rows: Any) -> bool:
    """A task suite's split (``len``, ``get(i)``, ``prompt_tasks``, ``task_ids``)."""
    # Duck-typed: a SuiteSplit, and this module never imports the suite.
    return all(hasattr(rows, name) for name in ("get", "prompt_tasks", "task_ids", "__len__"))


def is_conversational(prompt: Any) -> bool:
    """A prompt given as chat messages (``[{"role": ..., "content": ...}, ...]``)."""
    return (
        isinstance(prompt, Sequence) and not isinstance(prompt, str) and len(prompt) > 0
        and all(isinstance(m, Mapping) and "role" in m for m in prompt)
    )


class PromptSet:
    """Rows (one prompt each) with a task label, as the sampler and the rollouts address them.

    ``rows`` are dicts with a ``task`` key and the prompt column (a string, used as is, or chat
    messages, rendered with the tokenizer's chat template and a generation prompt, as TRL
    does). Token ids are computed on first use and cached. Prompts longer than
    ``max_prompt_length`` tokens keep their last tokens (``on_long_prompt="truncate"``, with a
    warning) or raise (``"error"``). ``chat_template_kwargs`` are extra variables of the chat
    template (TRL's option, e.g. ``{"enable_thinking": False}``).
    """

    def __init__(
        self,
        rows: Any,
        tokenizer: Any,
        *,
        prompt_column: str = "prompt",
        max_prompt_length: int | None = None,
        on_long_prompt: str = "truncate",
        task_names: Sequence[str] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.lazy = is_lazy_split(rows)
        if not len(rows):
            raise ValueError("the dataset has no rows; give at least one prompt per task")
        self.tokenizer = tokenizer
        self.prompt_column = prompt_column
        self.max_prompt_length = max_prompt_length
        self.on_long_prompt = on_long_prompt
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if self.lazy:  # a task suite's split: rows are generated on demand
            self._rows = rows
            labels = [rows.task_ids[t] for t in rows.prompt_tasks]
        else:
            self._rows = [dict(row) for row in rows]
            for i, row in enumerate(self._rows):
                self._check_row(i, row)
            labels = [str(row["task"]) for row in self._rows]
        found = sorted(set(labels))
        self.task_names = list(task_names) if task_names is not None else found
        unknown = sorted(set(found) - set(self.task_names))
        if unknown:
            raise ValueError(
                f"rows have task(s) {unknown} that are not among the training tasks "
                f"{self.task_names}"
            )
        self.task_index = {name: k for k, name in enumerate(self.task_names)}
        self.prompt_tasks = np.array([self.task_index[t] for t in labels],
                                     dtype=np.int64)  # [num_prompts]
        self._labels = labels
        self._tokens: dict[int, list[int]] = {}
        self._warned_truncation = False

    def _check_row(self, index: int, row: Mapping[str, Any]) -> None:
        if self.prompt_column not in row:
            raise ValueError(
                f"row {index} has no prompt column {self.prompt_column!r} (columns: "
                f"{sorted(row)}); rename the column or set data.prompt_column"
            )

    def row(self, index: int) -> dict[str, Any]:
        if not self.lazy:
            return self._rows[index]
        row = self._rows.get(index)
        self._check_row(index, row)
        return row

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def num_tasks(self) -> int:
        return len(self.task_names)

    def prompt(self, index: int) -> Any:
        return self.row(index)[self.prompt_column]

    def task(self, index: int) -> str:
        return self._labels[index]

    def render(self, index: int) -> str:
        """The prompt as the text the model sees."""
        prompt = self.prompt(index)
        if is_conversational(prompt):
            # A final assistant message is a prefix to continue (e.g. "<think>"), not a turn
            # to answer: render it open, without a new generation prompt.
            # TRL 1.16's apply_chat_template (data_utils.py) chooses by the last role the same way
            open_turn = prompt[-1].get("role") == "assistant"
            return self.tokenizer.apply_chat_template(
                list(prompt), tokenize=False, add_generation_prompt=not open_turn,
                continue_final_message=open_turn, **self.chat_template_kwargs,
            )
        if not isinstance(prompt, str):
            raise TypeError(
                f"row {index}: a prompt must be a string or a list of chat messages, got "
                f"{type(prompt).__name__}"
            )
        return prompt

    def tokens(self, index: int) -> list[int]:
        cached = self._tokens.get(index)
        if cached is None:
            # no special tokens added: a chat template has already written its own
            ids = self.tokenizer(self.render(index), add_special_tokens=False)["input_ids"]
            cached = self._tokens[index] = self._fit(index, list(ids))
        return cached

    def tokenize_all(self) -> None:
        """Render and tokenize every prompt now, so a bad prompt fails before training.

        A lazy split is left alone: its rows are generated (and checked) on first use."""
        if self.lazy:
            return
        missing = [i for i in range(len(self._rows)) if i not in self._tokens]
        if not missing:
            return
        texts = [self.render(i) for i in missing]
        encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        for index, ids in zip(missing, encoded, strict=True):
            self._tokens[index] = self._fit(index, list(ids))

    def _fit(self, index: int, ids: list[int]) -> list[int]:
        limit = self.max_prompt_length
        if not ids:
            raise ValueError(f"row {index} (task {self.task(index)!r}) has an empty prompt")
        if limit is None or len(ids) <= limit:
            return ids
        if self.on_long_prompt == "error":
            raise ValueError(
                f"row {index} (task {self.task(index)!r}) has a {len(ids)}-token prompt, longer "
                f"than max_prompt_length={limit}; raise max_prompt_length, shorten the prompt, "
                "or set on_long_prompt='truncate'"
            )
        if not self._warned_truncation:
            logger.warning(
                "prompts longer than max_prompt_length=%d tokens are truncated to their last "
                "%d tokens (first: row %d, %d tokens)", limit, limit, index, len(ids),
            )
            self._warned_truncation = True
        return ids[-limit:]  # left truncation, as TRL's processing class (truncation_side="left")

    def columns(self, indices: Sequence[int], repeat: int) -> dict[str, list[Any]]:
        """Every column but the prompt, one value per completion (each row ``repeat`` times)."""
        rows = [self.row(i) for i in indices]
        # The union of the rows' columns, in first-seen order.
        keys = [k for k in dict.fromkeys(k for row in rows for k in row) if k != self.prompt_column]
        # One value per completion: a row's value repeated over its group.
        return {key: [row.get(key) for row in rows for _ in range(repeat)] for key in keys}
