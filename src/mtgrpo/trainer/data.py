"""Training prompts: the rows, their tasks, and their token ids (rendered once, cached)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["PromptSet", "is_conversational"]


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
    warning) or raise (``"error"``).
    """

    def __init__(
        self,
        rows: Sequence[Mapping[str, Any]],
        tokenizer: Any,
        *,
        prompt_column: str = "prompt",
        max_prompt_length: int | None = None,
        on_long_prompt: str = "truncate",
        task_names: Sequence[str] | None = None,
    ) -> None:
        if not rows:
            raise ValueError("the dataset has no rows; give at least one prompt per task")
        missing = [i for i, row in enumerate(rows) if prompt_column not in row]
        if missing:
            raise ValueError(
                f"row {missing[0]} has no prompt column {prompt_column!r} (columns: "
                f"{sorted(rows[missing[0]])}); rename the column or set data.prompt_column"
            )
        self.rows = [dict(row) for row in rows]
        self.tokenizer = tokenizer
        self.prompt_column = prompt_column
        self.max_prompt_length = max_prompt_length
        self.on_long_prompt = on_long_prompt
        found = sorted({str(row["task"]) for row in self.rows})
        self.task_names = list(task_names) if task_names is not None else found
        unknown = sorted(set(found) - set(self.task_names))
        if unknown:
            raise ValueError(
                f"rows have task(s) {unknown} that are not among the training tasks "
                f"{self.task_names}"
            )
        self.task_index = {name: k for k, name in enumerate(self.task_names)}
        self.prompt_tasks = np.array(
            [self.task_index[str(row["task"])] for row in self.rows], dtype=np.int64
        )  # [num_prompts]
        self._tokens: dict[int, list[int]] = {}
        self._warned_truncation = False

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def num_tasks(self) -> int:
        return len(self.task_names)

    def prompt(self, index: int) -> Any:
        return self.rows[index][self.prompt_column]

    def task(self, index: int) -> str:
        return str(self.rows[index]["task"])

    def render(self, index: int) -> str:
        """The prompt as the text the model sees."""
        prompt = self.prompt(index)
        if is_conversational(prompt):
            return self.tokenizer.apply_chat_template(
                list(prompt), add_generation_prompt=True, tokenize=False
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
            ids = self.tokenizer(self.render(index), add_special_tokens=False)["input_ids"]
            cached = self._tokens[index] = self._fit(index, list(ids))
        return cached

    def tokenize_all(self) -> None:
        """Render and tokenize every prompt now, so a bad prompt fails before training."""
        missing = [i for i in range(len(self.rows)) if i not in self._tokens]
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
        return ids[-limit:]

    def columns(self, indices: Sequence[int], repeat: int) -> dict[str, list[Any]]:
        """Every column but the prompt, one value per completion (each row ``repeat`` times)."""
        keys = list(dict.fromkeys(k for i in indices for k in self.rows[i]))
        keys = [k for k in keys if k != self.prompt_column]
        return {
            key: [self.rows[i].get(key) for i in indices for _ in range(repeat)] for key in keys
        }
