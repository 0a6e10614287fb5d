"""The speed layer: fast paths that compute what the plain transformers forward computes, for
less time or memory. Everything here depends only on torch, transformers (and peft) and
:mod:`mtgrpo.models`; the RL code (:mod:`mtgrpo.rollout`, :mod:`mtgrpo.policy`,
:mod:`mtgrpo.trainer`) calls it through the names below, and knows nothing of how they work.
The model's own forward (``model_forward``) stays the reference: every fast path falls back to
it where it does not apply and is tested against it.

Generation (:class:`StaticGenerator`, behind the ``"static"`` backend of
:mod:`mtgrpo.rollout`):

* :mod:`mtgrpo.fast.static`: the decode engine (static KV cache, shared prefill of a group's
  prompt, compaction of finished rows, CUDA graphs on a GPU);
* :mod:`mtgrpo.fast.static_decoders`: the prefill and decode step (the Llama-family modules
  called directly, or the model's forward), and :func:`check_static_cache_support`;
* :mod:`mtgrpo.fast.static_sampling`: :class:`SamplingRule`, next-token sampling on the device;
* :mod:`mtgrpo.fast.static_graph`: capture and replay of the decode step;
* :mod:`mtgrpo.fast.replica`: a bfloat16 copy of a float32 policy (LoRA merged) to decode from.

Log-probabilities (behind :func:`mtgrpo.policy.sequence_logprobs`, which picks the route):

* :mod:`mtgrpo.fast.head_logprobs`: the output head on scored positions chunk by chunk (no
  ``[N, L, V]`` logits), or the model's own forward keeping only the needed logits;
* :mod:`mtgrpo.fast.packed`: the padding-free forward (each distinct prompt and every
  completion token once);
* :mod:`mtgrpo.fast.shared_prompts`: a group's prompt run once, its cache repeated for the rows;
* :mod:`mtgrpo.fast.buckets`: :func:`plan_micro_batches`, rows grouped by length under a
  token budget (also the policy's micro-batches).

Shared by both: :mod:`mtgrpo.fast.llama_family` (the Llama-family modules and functions the
fast paths call) and :mod:`mtgrpo.fast.transformers_compat` (the differences between the
transformers releases we support, each tested on both sides). A transformers upgrade touches
this package only.
"""

from __future__ import annotations

from mtgrpo.fast.buckets import plan_micro_batches
from mtgrpo.fast.head_logprobs import (
    DEFAULT_CHUNK_SIZE,
    KEEP_LOGITS_BYTES,
    check_scoring_options,
    chunked_head_scores,
    entropy_from_logits,
    model_forward_scores,
    selective_log_softmax,
)
from mtgrpo.fast.packed import PackedLayout, packed_hidden, packed_layout, packed_mismatch
from mtgrpo.fast.replica import WeightReplica, hooked_modules
from mtgrpo.fast.shared_prompts import (
    PROMPT_SHARING_MODEL_TYPES,
    distinct_prompts,
    shared_prompt_hidden,
    shared_prompt_rows,
)
from mtgrpo.fast.static import Completions, StaticGenerator
from mtgrpo.fast.static_decoders import check_static_cache_support
from mtgrpo.fast.static_sampling import SamplingRule
from mtgrpo.fast.transformers_compat import (
    disable_activation_checkpointing,
    enable_activation_checkpointing,
)
from mtgrpo.fast.unwrap import causal_lm_and_reason, unwrap_causal_lm

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "KEEP_LOGITS_BYTES",
    "PROMPT_SHARING_MODEL_TYPES",
    "Completions",
    "PackedLayout",
    "SamplingRule",
    "StaticGenerator",
    "WeightReplica",
    "causal_lm_and_reason",
    "check_scoring_options",
    "check_static_cache_support",
    "chunked_head_scores",
    "disable_activation_checkpointing",
    "distinct_prompts",
    "enable_activation_checkpointing",
    "entropy_from_logits",
    "hooked_modules",
    "model_forward_scores",
    "packed_hidden",
    "packed_layout",
    "packed_mismatch",
    "plan_micro_batches",
    "selective_log_softmax",
    "shared_prompt_hidden",
    "shared_prompt_rows",
    "unwrap_causal_lm",
]
