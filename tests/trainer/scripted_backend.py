"""A deterministic generation backend for distributed tests: each completion is a function of
its prompt's tokens and its sample index only, so 1 and 2 processes generate the same rows."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from mtgrpo.rollout import GenerationOutput, SamplingParams

LETTERS = [ord(c) for c in "abcdeiouxyz "]  # byte-level ids of the tiny tokenizer


class ScriptedBackend:
    def __init__(self, model: Any = None, tokenizer: Any = None) -> None:
        self.version = None

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                 num_samples: int = 1) -> GenerationOutput:
        prompts, completions = [], []
        for ids in prompt_ids:
            for j in range(num_samples):
                digest = hashlib.sha256(f"{list(ids)}|{j}".encode()).digest()
                length = 1 + digest[0] % params.max_new_tokens
                completions.append([LETTERS[b % len(LETTERS)] for b in digest[1:1 + length]])
                prompts.append(list(ids))
        return GenerationOutput(prompts, completions, [False] * len(completions))

    def update_weights(self, model_or_state: Any, version: int) -> None:
        self.version = version
