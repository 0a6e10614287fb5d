"""Per-token log-probabilities of completions without a float32 ``[N, L, V]`` logits tensor.

Notation: ``N`` rows (completions), ``T`` tokens per row (prompt + completion), ``L``
completion tokens (the last ``L`` columns of every row), ``V`` vocabulary size, ``H`` hidden
size, ``M`` scored completion positions (``attention_mask[:, -L:].sum()``).

The log-probability of completion token ``y_t`` is taken under the *sampling* distribution,
``log softmax(float32(logits_t) / temperature)[y_t]``, exactly as ``transformers``'
``generate`` forms it (it copies the next-token logits to float32, then the temperature warper
divides them), so that with one policy update per generation batch the ratio
``pi_theta / pi_old`` starts at 1.

Memory: the output head runs on scored positions chunk by chunk, so the ``[N, L, V]`` float32
logits never exist whole (:mod:`mtgrpo.fast.head_logprobs` says how, what is recomputed and
when, and how a tied head's gradient is accumulated); this module picks the route and why.

Gradient checkpointing is honoured on every route: the padded backbone and the model's own
forward checkpoint their layers themselves, the padding-free forward checkpoints each layer with
the layer's own checkpoint function (:mod:`mtgrpo.fast.packed`); only the shared-prompt forward,
whose completions attend to a cache that checkpointed layers do not keep, is not used under it.

Departures from TRL 1.16 (``GRPOTrainer._get_per_token_logps_and_entropies`` with its fused
LM head, ``trl.trainer.utils.add_fused_lm_head``):

1. TRL calls the patched model forward and projects through ``lm_head.weight`` in its own
   autograd kernel, applying soft-capping and logit scales itself. We call the backbone and
   the head *modules*, so LoRA layers on the head (and anything else a module wrapper adds)
   still apply; for models whose forward transforms the head's output we fall back to the
   model's own forward (see :func:`resolve_logprob_path`) instead of re-implementing each
   transform.
2. TRL's kernel tiles positions and vocabulary columns with a hand-written backward; we tile
   positions only and let activation checkpointing recompute each tile
   (:mod:`mtgrpo.fast.head_logprobs`).
3. Like TRL's fused head, padded completion positions (``attention_mask == 0``) get
   log-probability 0 and entropy 0.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from mtgrpo.fast import (
    DEFAULT_CHUNK_SIZE,
    causal_lm_and_reason,
    check_scoring_options,
    chunked_head_scores,
    distinct_prompts,
    entropy_from_logits,
    model_forward_scores,
    packed_layout,
    packed_mismatch,
    selective_log_softmax,
    shared_prompt_rows,
)
from mtgrpo.models.positions import position_ids_from_attention_mask

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "LOGIT_TRANSFORM_FIELDS",
    "LogprobOutput",
    "LogprobPath",
    "LogprobRoute",
    "entropy_from_logits",
    "position_ids_from_attention_mask",
    "resolve_logprob_path",
    "selective_log_softmax",
    "sequence_logprobs",
]

LogprobPath = Literal["chunked_head", "model_forward"]

# Config fields (of the text config) through which a transformers causal LM's forward changes
# `lm_head(hidden)` before returning logits: tanh soft-capping (Gemma 2/3, Mistral-Large-4,
# RecurrentGemma), multiplicative scales (Cohere, Falcon-H1, HyperCLOVA X, Muse), division by a
# scale (Granite, MiniCPM3) and a vocabulary cut (Inkling). Found by reading every
# `*ForCausalLM.forward` of transformers 5.23 (TRL's fused head re-implements the soft-cap and
# the scales; we let the model's own forward apply them).
LOGIT_TRANSFORM_FIELDS: tuple[str, ...] = (
    "final_logit_softcapping",
    "logits_soft_cap",
    "logit_scale",
    "logits_scaling",
    "output_multiplier",
    "lm_head_multiplier",
    "unpadded_vocab_size",
)
# A field set to one of these values leaves the logits unchanged.
_NEUTRAL_VALUES: dict[str, tuple[object, ...]] = {
    "final_logit_softcapping": (None,),
    "logits_soft_cap": (None,),
    "unpadded_vocab_size": (None,),
}


@dataclass(frozen=True)
class LogprobOutput:
    """Result of :func:`sequence_logprobs`.

    ``path`` says how the logits were produced: ``"chunked_head"`` (backbone once, then the
    output head chunk by chunk) or ``"model_forward"`` (the model's own forward with
    ``logits_to_keep``, see :func:`resolve_logprob_path`).
    """

    logps: Tensor  # [N, L] float32, 0 at padded completion positions
    entropy: Tensor | None  # [N, L] float32 (nats) or None when not requested
    path: LogprobPath


@dataclass(frozen=True)
class LogprobRoute:
    """How :func:`sequence_logprobs` will score a model, and why.

    ``backbone`` and ``head`` are the modules the ``"chunked_head"`` path calls (``None`` on
    the ``"model_forward"`` path); ``via`` is the DDP wrapper whose forward the computation
    runs inside, if any; ``packed``: the backbone can run the padding-free forward of
    :mod:`mtgrpo.fast.packed` (Llama family, ``sdpa``/``eager`` attention, no sliding window).
    """

    path: LogprobPath
    reason: str
    backbone: nn.Module | None = None
    head: nn.Module | None = None
    via: nn.Module | None = None
    packed: bool = False  # the backbone runs padding-free (mtgrpo.fast.packed)


def resolve_logprob_path(model: nn.Module) -> LogprobRoute:
    """Decide whether ``model`` can be scored by calling its backbone and head directly.

    The chunked path needs (a) the causal LM behind any ``torch.compile`` / PEFT wrapper
    (LoRA layers are injected into the backbone and head modules, so calling them applies the
    adapter, and ``disable_adapter()`` still works), (b) its backbone,
    ``getattr(lm, lm.base_model_prefix)``, and head, ``lm.get_output_embeddings()``, and
    (c) a forward that returns ``head(backbone(...).last_hidden_state)`` unchanged, which we
    cannot guarantee when the config sets one of :data:`LOGIT_TRANSFORM_FIELDS`. A model
    that transforms its logits without such a config field is not detected: score it with
    ``path="model_forward"``.

    A ``DistributedDataParallel`` wrapper keeps the chunked path but is *called*: the
    computation temporarily replaces its child's ``forward`` (as TRL's fused head patches the
    model forward), so DDP's forward hooks, which set up the gradient all-reduce, still run.
    Everything else falls back to ``"model_forward"`` (correct, but the model materialises
    ``[N, L + 1, V]`` logits in its own dtype): FSDP (v1) wrappers, a head whose weight is an
    FSDP2 ``DTensor`` (its root forward gathers the shards), a DeepSpeed engine (its forward
    runs ZeRO's hooks), prompt-learning PEFT methods (the virtual tokens are added by the PEFT
    forward), and models without a separable backbone or head.
    """
    # DDP is called, not bypassed: its forward hooks set up the gradient all-reduce every rank runs
    via = model if _is_instance_of(model, "torch.nn.parallel", "DistributedDataParallel") else None
    inner = model.module if via is not None else model
    # FSDP (v1): only its root forward gathers the sharded weights, so the model's forward must run
    if _is_instance_of(inner, "torch.distributed.fsdp", "FullyShardedDataParallel"):
        return LogprobRoute("model_forward", "the model is wrapped in FullyShardedDataParallel")
    # a DeepSpeed engine: its forward runs ZeRO's hooks (ZeRO-3 gathers each module's
    # partitioned weights in them; the head's weight is an empty tensor outside its forward)
    if any(cls.__name__ == "DeepSpeedEngine" and cls.__module__.startswith("deepspeed.")
           for cls in type(inner).__mro__):
        return LogprobRoute("model_forward", "the model is a DeepSpeed engine")
    causal_lm, reason = causal_lm_and_reason(inner)
    if reason is not None:
        return LogprobRoute("model_forward", reason)
    transform = _logit_transform(causal_lm)
    if transform is not None:
        return LogprobRoute("model_forward", f"the model's forward transforms logits ({transform})")
    prefix = getattr(causal_lm, "base_model_prefix", "")
    backbone = getattr(causal_lm, prefix, None) if prefix else None
    get_head = getattr(causal_lm, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(backbone, nn.Module) or not isinstance(head, nn.Module):
        return LogprobRoute("model_forward", "no separable backbone and output head were found")
    # an FSDP2 head's weight is a shard; its root forward gathers it, calling the head would not
    if _is_instance_of(getattr(head, "weight", None), "torch.distributed.tensor", "DTensor"):
        return LogprobRoute("model_forward", "the output head is sharded by FSDP2")
    reason = "plain causal LM head" + (" (called through the DDP forward)" if via else "")
    return LogprobRoute("chunked_head", reason, backbone=backbone, head=head, via=via,
                        packed=packed_mismatch(backbone) is None)


def sequence_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_length: int,
    *,
    temperature: float,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    compute_entropy: bool = False,
    entropy_grad: bool = True,
    path: Literal["auto", "chunked_head", "model_forward"] = "auto",
    share_prompts: bool = True,
    pack: bool = True,
) -> LogprobOutput:
    """Log-probabilities of the last ``completion_length`` tokens of every row.

    ``input_ids, attention_mask: [N, T]`` hold left-padded prompts followed by right-padded
    completions (the layout of TRL's ``torch.cat([prompt_ids, completion_ids], 1)``); the
    completion is the last ``L = completion_length`` columns. Returns ``logps[n, t] =
    log softmax(float32(logits[n, T-L-1+t]) / temperature)[input_ids[n, T-L+t]]`` (and the
    entropy of the same distribution), 0 where ``attention_mask[n, T-L+t] == 0``.
    ``entropy_grad=False`` computes the entropy without a graph (for an entropy that is only
    logged or masks tokens): the same values, and nothing of it kept for the backward.

    Position ids come from the attention mask (:func:`position_ids_from_attention_mask`) so a
    left-padded row sees the positions it was generated with. With ``path="auto"`` the route
    is :func:`resolve_logprob_path`'s; ``"model_forward"`` forces the fallback (for a model
    whose forward alters logits in a way the config does not reveal), ``"chunked_head"``
    forces the direct route and raises when the model has no separable backbone and head.

    Mixed precision: the chunked route calls the backbone and head modules, not the model's
    forward, so a forward wrapper's autocast (accelerate's) does not apply; call this inside
    ``accelerator.autocast()`` (as TRL does) when training with autocast.

    Shared prompts (``share_prompts``, on the chunked route): the ``G`` completions of a GRPO
    group share one prompt, so the backbone runs once per distinct prompt and its key/value
    cache is repeated for the rows that share it, before the completions run on top of it.
    Autograd sums the rows' gradients into the shared prompt pass, so log-probs and gradients
    equal those of the full forward up to float rounding, for a fraction of the prompt tokens'
    cost (:mod:`mtgrpo.fast.shared_prompts`). Used when at most half the rows have distinct
    prompts, the backbone is a :data:`mtgrpo.fast.PROMPT_SHARING_MODEL_TYPES` model with a plain
    (non-sliding) cache and gradient checkpointing is off; otherwise every row runs in full.

    Padding-free (``pack``, on the chunked route, for :attr:`LogprobRoute.packed` backbones:
    the Llama family): the real tokens of the rows are packed into one sequence, each distinct
    prompt once, and only attention sees the rows apart (:mod:`mtgrpo.fast.packed`), so
    neither padding nor a repeated prompt costs a projection or an MLP. It needs TRL's layout
    (left-padded prompts, right-padded completions, at least one prompt token per row) and
    takes precedence over ``share_prompts``; a batch laid out otherwise runs padded.
    """
    _check_sequence_inputs(input_ids, attention_mask, completion_length)
    check_scoring_options(temperature, chunk_size)
    route = _route_for(model, path)
    # positions from the mask, so a left-padded row sees the positions it was generated with
    position_ids = position_ids_from_attention_mask(attention_mask)  # [N, T]
    if route.path == "chunked_head":
        layout = None
        if pack and route.packed:
            width = input_ids.shape[1] - completion_length
            layout = packed_layout(input_ids, attention_mask, position_ids, completion_length,
                                   *distinct_prompts(input_ids, attention_mask, width))
        # the padding-free layout already runs each distinct prompt once: it takes precedence
        shared = share_prompts and layout is None
        logps_full, entropy_full = chunked_head_scores(
            route.backbone, route.head, route.via, input_ids, attention_mask, position_ids,
            completion_length,
            temperature=temperature, chunk_size=chunk_size, compute_entropy=compute_entropy,
            entropy_grad=entropy_grad,
            prompt_rows=shared_prompt_rows(route.backbone, input_ids, attention_mask,
                                           completion_length)
            if shared else None,
            layout=layout,
        )  # fmt: skip
    else:
        logps_full, entropy_full = model_forward_scores(
            model, input_ids, attention_mask, position_ids, completion_length,
            temperature=temperature, chunk_size=chunk_size, compute_entropy=compute_entropy,
            entropy_grad=entropy_grad,
        )  # fmt: skip
    return LogprobOutput(logps=logps_full, entropy=entropy_full, path=route.path)


def _route_for(model: nn.Module, path: str) -> LogprobRoute:
    route = resolve_logprob_path(model)
    if path == "auto" or path == route.path:
        return route
    if path == "model_forward":
        return LogprobRoute("model_forward", "requested by the caller")
    if path == "chunked_head":
        raise ValueError(
            f"path='chunked_head' is not available for this model: {route.reason}; "
            "use path='auto' or 'model_forward'"
        )
    raise ValueError(
        f"unknown logprob path {path!r}; valid values: 'auto', 'chunked_head', 'model_forward'"
    )


def _is_instance_of(value: object, module_name: str, class_name: str) -> bool:
    """``isinstance`` against a ``torch.distributed`` class, False where that is unavailable."""
    if value is None or not torch.distributed.is_available():
        return False
    cls = getattr(importlib.import_module(module_name), class_name, None)
    return cls is not None and isinstance(value, cls)


def _logit_transform(causal_lm: nn.Module) -> str | None:
    """``"field=value"`` for the first logit-transforming config field that is set, else None."""
    config = getattr(causal_lm, "config", None)
    if config is None:
        return None
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for field in LOGIT_TRANSFORM_FIELDS:
        value = getattr(text_config, field, None)
        # a scale field at 1 (or unset) leaves the logits as the head returned them
        if value not in _NEUTRAL_VALUES.get(field, (None, 1, 1.0)):
            return f"{field}={value!r}"
    return None


def _check_sequence_inputs(
    input_ids: Tensor, attention_mask: Tensor, completion_length: int
) -> None:
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids and attention_mask must both be [N, T]; got {tuple(input_ids.shape)} "
            f"and {tuple(attention_mask.shape)}"
        )
    total = input_ids.shape[1]
    if isinstance(completion_length, bool) or not isinstance(completion_length, int):
        raise TypeError(f"completion_length must be an int, got {type(completion_length).__name__}")
    # the first completion token is predicted from the last prompt position, so one must exist
    if not 1 <= completion_length <= total - 1:
        raise ValueError(
            f"completion_length must be between 1 and T - 1 = {total - 1} (at least one prompt "
            f"token precedes the completion), got {completion_length}"
        )
