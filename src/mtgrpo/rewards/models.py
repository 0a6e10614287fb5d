"""Neural reward models as reward functions.

A reward model is a sequence-classification model; its reward for a completion is
``logits[:, 0]`` on ``prompt + completion`` (TRL's convention). Chat prompts are rendered with
the reward model's own chat template, the completion appended as the assistant turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["RewardModel", "is_reward_model_path"]


def is_reward_model_path(spec: Any) -> bool:
    """A local directory holding a transformers checkpoint (``config.json``)."""
    return isinstance(spec, str | Path) and (Path(spec) / "config.json").is_file()


def _is_chat(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)


class RewardModel:
    """``RewardModel(model_or_path, tokenizer=None)`` scores completions with ``logits[:, 0]``.

    ``model_or_path``: a loaded ``PreTrainedModel`` for sequence classification, or a hub name
    / local path loaded with ``AutoModelForSequenceClassification``. ``tokenizer``: its
    tokenizer (default: loaded from the same place). Scoring runs under ``torch.no_grad`` in
    batches of ``batch_size``; inputs longer than ``max_length`` tokens keep their end.
    """

    def __init__(self, model_or_path: Any, tokenizer: Any = None, *, batch_size: int = 16,
                 max_length: int | None = None, name: str | None = None,
                 trust_remote_code: bool = False) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if isinstance(model_or_path, str | Path):
            # one score per completion, as TRL 1.16 loads reward models: a checkpoint without a
            # trained head gets one new column, not transformers' default of two
            model = AutoModelForSequenceClassification.from_pretrained(
                str(model_or_path), num_labels=1, trust_remote_code=trust_remote_code)
            source = str(model_or_path)
        else:
            model = model_or_path
            source = getattr(model, "name_or_path", "") or type(model).__name__
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        if tokenizer.pad_token is None:  # as TRL 1.16 does for a reward model's tokenizer
            tokenizer.pad_token = tokenizer.eos_token
        # The score is read at the last token that is not the pad token, so the model must
        # know the tokenizer's pad id (TRL sets it the same way).
        model.config.pad_token_id = tokenizer.pad_token_id
        self.model = model.eval().requires_grad_(False)  # scoring only: no dropout, no gradients
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        # TRL 1.16 names a reward model by the last part of its model id
        self.__name__ = name or Path(source.rstrip("/")).name or "reward_model"

    def _text(self, prompt: Any, completion: Any) -> str:
        if _is_chat(prompt):
            reply = completion if _is_chat(completion) else [
                {"role": "assistant", "content": str(completion)}
            ]
            return self.tokenizer.apply_chat_template(list(prompt) + list(reply), tokenize=False)
        # TRL's plain-text form: prompt + completion
        return str(prompt) + (completion[-1]["content"] if _is_chat(completion) else completion)

    @torch.no_grad()
    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 **kwargs: Any) -> list[float]:
        texts = [self._text(p, c) for p, c in zip(prompts, completions, strict=True)]
        device = next(self.model.parameters()).device
        scores: list[float] = []
        side = self.tokenizer.truncation_side
        # an over-long input keeps its end, the completion being scored
        self.tokenizer.truncation_side = "left"
        try:
            for start in range(0, len(texts), self.batch_size):
                # add_special_tokens=False as in TRL 1.16: a chat template has already written them
                enc = self.tokenizer(
                    texts[start : start + self.batch_size], padding=True, return_tensors="pt",
                    truncation=self.max_length is not None, max_length=self.max_length,
                    add_special_tokens=False,
                ).to(device)
                logits = self.model(**enc).logits  # [b, num_labels]
                # column 0: TRL 1.16 loads reward models with num_labels=1
                scores.extend(logits[:, 0].float().tolist())
        finally:
            # a tokenizer passed in may serve others: leave it as found
            self.tokenizer.truncation_side = side
        return scores
