"""Generation backends: sample completions (token ids) for prompts (token ids).

:mod:`mtgrpo.rollout.base` holds the contract (:class:`SamplingParams`,
:class:`GenerationOutput`, the :class:`GenerationBackend` protocol) and the ``BACKENDS`` registry;
:mod:`mtgrpo.rollout.hf_generate` the transformers ``generate`` backend, registered as ``"hf"``;
:mod:`mtgrpo.rollout.static` the fast backend, registered as ``"static"``: the contract over the
speed layer's decode engine (:class:`mtgrpo.fast.StaticGenerator`: static KV cache, own decode
loop, CUDA graphs on a GPU). ``"auto"`` (the trainer's default) picks ``"static"`` when the
model supports it and ``"hf"`` otherwise.
``make_backend("hf", model, tokenizer, max_batch_size=...)`` builds one by name;
:func:`build_backend` (:mod:`mtgrpo.rollout.selection`) also resolves ``"auto"`` and import paths.
:mod:`mtgrpo.rollout.worker` turns prompt ids into scored groups (generate, then score with the
reward suite): the callable the batch-construction sampler and evaluation drive.
"""

from __future__ import annotations

from mtgrpo.rollout.base import (
    BACKENDS,
    BackendFactory,
    GenerationBackend,
    GenerationOutput,
    SamplingParams,
    backend_description,
    check_num_samples,
    check_prompt_ids,
    make_backend,
)
from mtgrpo.rollout.hf_generate import HFGenerateBackend
from mtgrpo.rollout.selection import build_backend
from mtgrpo.rollout.static import StaticCacheBackend
from mtgrpo.rollout.worker import GroupPayload, RolloutWorker, Shard

__all__ = [
    "BACKENDS",
    "BackendFactory",
    "GenerationBackend",
    "GenerationOutput",
    "GroupPayload",
    "HFGenerateBackend",
    "RolloutWorker",
    "SamplingParams",
    "Shard",
    "StaticCacheBackend",
    "backend_description",
    "build_backend",
    "check_num_samples",
    "check_prompt_ids",
    "make_backend",
]
