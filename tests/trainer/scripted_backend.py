"""A deterministic generation backend for distributed tests: each completion is a function of
its prompt's tokens and its sample index only, so 1 and 2 processes generate the same rows."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

import torch

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


# The engine of process r reports every finished row's log-probs OFFSETS[r] above the policy's;
# rows it cut at max_new_tokens are TRUNCATED_OFFSET above: under mask_truncated_completions the
# update leaves them out, so they must be left out of the mismatch too, where they would dwarf
# every other value. Powers of two: exact in float32, the same in every rank's sums.
OFFSETS = (0.25, -1.0)
TRUNCATED_OFFSET = 4.0


class OffsetLogprobBackend(ScriptedBackend):
    """The scripted completions with the engine's own log-probs: the policy's log-probs of the
    sampled tokens (one unpadded float32 forward per row, with the current weights: the backend
    holds the policy itself) plus a known offset per process, so that the trainer's
    ``generation/logprob_mismatch_*`` can be derived by hand. The first sample of every prompt is
    cut at ``max_new_tokens`` (``finished`` False), the others end earlier.

    ``calls``: per ``generate`` call, the tokens of its finished rows and their offset, then
    those of its truncated rows and theirs.
    ``with_logprobs=False``: an engine that returns none (a misconfigured server)."""

    cheap_logprobs = True

    def __init__(self, model: Any = None, tokenizer: Any = None,
                 with_logprobs: bool = True) -> None:
        super().__init__(model, tokenizer)
        self.model = model
        self.offset = OFFSETS[int(os.environ.get("RANK", "0"))]
        self.with_logprobs = with_logprobs
        self.calls: list[dict[str, float]] = []

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                 num_samples: int = 1) -> GenerationOutput:
        out = super().generate(prompt_ids, params, num_samples)
        limit = params.max_new_tokens
        finished = [j % num_samples != 0 for j in range(len(out))]
        completions = [(c * limit)[:limit] if not done else c[: limit - 1]
                       for c, done in zip(out.completion_ids, finished, strict=True)]
        logprobs = None
        if self.with_logprobs:
            logprobs = [
                [lp + (self.offset if done else TRUNCATED_OFFSET)
                 for lp in self._policy_logprobs(p, c, params.temperature)]
                for p, c, done in zip(out.prompt_ids, completions, finished, strict=True)
            ]
        for done, offset in ((True, self.offset), (False, TRUNCATED_OFFSET)):
            tokens = sum(len(c) for c, f in zip(completions, finished, strict=True) if f == done)
            self.calls.append({"tokens": tokens, "offset": offset, "finished": done})
        return GenerationOutput(out.prompt_ids, completions, finished, logprobs)

    @torch.no_grad()
    def _policy_logprobs(self, prompt: list[int], completion: list[int],
                         temperature: float) -> list[float]:
        """``log softmax(logits / temperature)`` of each completion token, float32."""
        ids = torch.tensor([prompt + completion])
        was_training = self.model.training
        self.model.eval()
        logits = self.model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
        self.model.train(was_training)
        token = torch.tensor(completion).unsqueeze(1)
        return torch.log_softmax(logits, dim=-1).gather(1, token).squeeze(1).tolist()


def rank1_without_logprobs(model: Any = None, tokenizer: Any = None) -> OffsetLogprobBackend:
    """Process 0's engine returns log-probs, process 1's returns none."""
    return OffsetLogprobBackend(model, tokenizer,
                                with_logprobs=int(os.environ.get("RANK", "0")) == 0)
