"""Per-token log-probabilities of completions without a float32 ``[N, L, V]`` logits tensor.

Notation: ``N`` rows (completions), ``T`` tokens per row (prompt + completion), ``L``
completion tokens (the last ``L`` columns of every row), ``V`` vocabulary size, ``H`` hidden
size, ``M`` scored completion positions (``attention_mask[:, -L:].sum()``).

The log-probability of completion token ``y_t`` is taken under the *sampling* distribution,
``log softmax(float32(logits_t) / temperature)[y_t]``, exactly as ``transformers``'
``generate`` forms it (it copies the next-token logits to float32, then the temperature warper
divides them), so that with one policy update per generation batch the ratio
``pi_theta / pi_old`` starts at 1.

Memory. A 150k-token vocabulary makes ``[N, L, V]`` float32 logits the largest tensor of a
GRPO step by far. Here the output head is applied to ``chunk_size`` scored positions at a time
and, when gradients are needed, each chunk is wrapped in activation checkpointing, so at most
one ``[chunk_size, V]`` slice of logits (plus its float32 copy) exists at a time, in the
forward pass and in the backward pass (which recomputes the slice). Recomputing costs one more
product through the head per chunk; when the float32 logits of all the call's scored
positions take at most :data:`KEEP_LOGITS_BYTES` (256 MiB: 1,365 positions of a 49,152-token
vocabulary, 436 of a 151,936-token one), autograd keeps them instead and nothing is
recomputed: on a CPU step of SmolLM2-135M with LoRA (200 positions), the head's forward and
backward take 386 ms instead of 610 ms (2-core AMD EPYC, float32). Under gradient
checkpointing (the model's decoder layers checkpointed: TRL's ``gradient_checkpointing``) the
user has chosen memory over time, so the chunks are always recomputed, as TRL's fused head
always does.

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
2. TRL's kernel tiles 4,096 positions x 32,768 vocabulary columns with an online
   logsumexp and a hand-written backward. We tile positions only (whole vocabulary rows,
   ``chunk_size`` positions, default 512) and let activation checkpointing recompute each
   tile in the backward pass: plain PyTorch, any head module, the same bounded memory.
   The chunks run along the flattened scored positions of all rows (not ``[N, chunk, V]``
   along the sequence), so memory does not grow with ``N`` and padding is never projected.
3. Like TRL's fused head, padded completion positions (``attention_mask == 0``) get
   log-probability 0 and entropy 0.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from mtgrpo.fast import (
    PackedLayout,
    causal_lm_and_reason,
    distinct_prompts,
    packed_hidden,
    packed_layout,
    packed_mismatch,
    shared_prompt_hidden,
    shared_prompt_rows,
)
from mtgrpo.models.positions import position_ids_from_attention_mask

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "KEEP_LOGITS_BYTES",
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

DEFAULT_CHUNK_SIZE = 512

# Float32 logits of a call's scored positions that autograd may keep rather than recompute
# (module docstring, "Memory").
KEEP_LOGITS_BYTES = 256 << 20

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


def selective_log_softmax(
    logits: Tensor,
    index: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor:
    """``log_softmax(float32(logits) / temperature).gather(-1, index)`` without the full result.

    ``logits: [..., V]`` (any float dtype), ``index: [...]`` (integer) -> float32 ``[...]``.
    Computed as ``x[index] - logsumexp(x)`` on ``chunk_size`` rows at a time; each chunk is
    upcast to float32 first (float32 accumulation for bf16/fp16 logits; TRL instead runs a
    bf16 log-softmax row by row), and, when gradients are needed, recomputed in the backward pass
    instead of being kept, so only one ``[chunk_size, V]`` float32 slice is alive at a time.
    A non-contiguous ``logits`` is copied once by the flattening reshape.
    """
    _check_scoring_options(temperature, chunk_size)
    if index.shape != logits.shape[:-1]:
        raise ValueError(
            f"index must have the shape of logits without its last (vocabulary) dimension: "
            f"logits {tuple(logits.shape)} needs index {tuple(logits.shape[:-1])}, "
            f"got {tuple(index.shape)}"
        )
    vocab = logits.shape[-1]
    logps, _ = _chunked_scores(
        _logits_scorer(temperature, with_entropy=False),
        logits.reshape(-1, vocab),
        index.reshape(-1),
        chunk_size,
        recompute=_recompute(index.numel(), vocab),
    )
    return logps.reshape(index.shape)


def entropy_from_logits(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor:
    """Entropy (nats) of ``softmax(float32(logits) / temperature)`` over the last dimension.

    ``logits: [..., V]`` -> float32 ``[...]``; ``H = -sum_v p_v log p_v``, computed
    ``chunk_size`` rows at a time with the same float32 upcast and checkpointing as
    :func:`selective_log_softmax` (TRL's ``entropy_from_logits`` chunks by 128 rows without
    upcasting).
    """
    _check_scoring_options(temperature, chunk_size)
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    dummy_index = torch.zeros(flat.shape[0], dtype=torch.long, device=logits.device)
    _, entropy = _chunked_scores(
        _logits_scorer(temperature, with_entropy=True), flat, dummy_index, chunk_size,
        recompute=_recompute(flat.shape[0], vocab),
    )
    assert entropy is not None
    return entropy.reshape(logits.shape[:-1])


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
    FSDP2 ``DTensor`` (its root forward gathers the shards), prompt-learning PEFT methods (the
    virtual tokens are added by the PEFT forward), and models without a separable backbone
    or head.
    """
    via = model if _is_instance_of(model, "torch.nn.parallel", "DistributedDataParallel") else None
    inner = model.module if via is not None else model
    if _is_instance_of(inner, "torch.distributed.fsdp", "FullyShardedDataParallel"):
        return LogprobRoute("model_forward", "the model is wrapped in FullyShardedDataParallel")
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
    _check_scoring_options(temperature, chunk_size)
    route = _route_for(model, path)
    position_ids = position_ids_from_attention_mask(attention_mask)  # [N, T]
    if route.path == "chunked_head":
        layout = None
        if pack and route.packed:
            width = input_ids.shape[1] - completion_length
            layout = packed_layout(input_ids, attention_mask, position_ids, completion_length,
                                   *distinct_prompts(input_ids, attention_mask, width))
        shared = share_prompts and layout is None
        logps_full, entropy_full = _chunked_head_scores(
            route, input_ids, attention_mask, position_ids, completion_length,
            temperature=temperature, chunk_size=chunk_size, compute_entropy=compute_entropy,
            entropy_grad=entropy_grad,
            prompt_rows=shared_prompt_rows(route.backbone, input_ids, attention_mask,
                                           completion_length)
            if shared else None,
            layout=layout,
        )  # fmt: skip
    else:
        logps_full, entropy_full = _model_forward_scores(
            model, input_ids, attention_mask, position_ids, completion_length,
            temperature=temperature, chunk_size=chunk_size, compute_entropy=compute_entropy,
            entropy_grad=entropy_grad,
        )  # fmt: skip
    return LogprobOutput(logps=logps_full, entropy=entropy_full, path=route.path)


# A scorer maps a chunk of inputs [c, ...] and targets [c] to (logps [c], entropy [c] | None).
_Scorer = Callable[[Tensor, Tensor], tuple[Tensor, Tensor | None]]


def _row_scores(
    logits: Tensor, targets: Tensor, temperature: float, with_entropy: bool,
    entropy_grad: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of ``targets`` and entropy for logits ``[c, V]`` (float32 from here on);
    ``entropy_grad=False``: the entropy without a graph (for logging or masking)."""
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    if not with_entropy:
        # log softmax(x)[y] = x[y] - logsumexp(x): no [c, V] log-probability tensor is formed.
        selected = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [c]
        return selected - torch.logsumexp(scaled, dim=-1), None
    log_probs = torch.log_softmax(scaled, dim=-1)  # [c, V]
    logps = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [c]
    if entropy_grad:
        return logps, -(log_probs.exp() * log_probs).sum(-1)
    # An entropy that is only logged keeps nothing for the backward: under the chunk's
    # recomputation its [c, V] slices would otherwise stay alive until the whole backward ends
    # (autograd never reaches them); measured 2 x 144 MiB at the 0.5B update's peak.
    with torch.no_grad():
        detached = log_probs.detach()
        return logps, -(detached.exp() * detached).sum(-1)


def _logits_scorer(temperature: float, with_entropy: bool,
                   entropy_grad: bool = True) -> _Scorer:
    def score(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor | None]:
        return _row_scores(logits, targets, temperature, with_entropy, entropy_grad)

    return score


def _head_scorer(head: nn.Module, temperature: float, with_entropy: bool,
                 entropy_grad: bool = True, grad_into_weight: bool = False) -> _Scorer:
    def score(hidden: Tensor, targets: Tensor) -> tuple[Tensor, Tensor | None]:
        if grad_into_weight:  # see _grad_goes_into_weight
            logits = nn.functional.linear(hidden, _GradIntoParameter.apply(head.weight),
                                          head.bias)
        else:
            logits = head(hidden)
        return _row_scores(logits, targets, temperature, with_entropy, entropy_grad)

    return score


class _GradIntoParameter(torch.autograd.Function):
    """The identity on a parameter, whose backward adds the incoming gradient into
    ``parameter.grad`` in place and passes nothing on (the technique of Megatron-LM's
    ``gradient_accumulation_fusion``, which writes weight gradients straight into ``main_grad``).

    Autograd sums the gradients of a leaf used twice out of place before accumulating them:
    for an output head tied to the input embedding that is the head's ``[V, H]`` gradient, the
    embedding's and their sum alive at once, on top of ``.grad``: 3 x 519 MiB for a
    Qwen2.5-0.5B head, the update's peak (benchmarks/results/update_memory_cpu.md). Added here
    chunk by chunk, one ``[V, H]`` temporary is alive at a time."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, parameter: Tensor) -> Tensor:
        ctx.parameter = parameter  # type: ignore[attr-defined]
        return parameter.view_as(parameter)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> None:
        parameter: Tensor = ctx.parameter  # type: ignore[attr-defined]
        if parameter.grad is None:
            parameter.grad = torch.empty_like(parameter).copy_(grad)
        else:
            parameter.grad.add_(grad)


def _grad_goes_into_weight(route: LogprobRoute) -> bool:
    """Whether the head's weight gradient is added into ``.grad`` directly
    (:class:`_GradIntoParameter`): only where that is all autograd would do with it, so that no
    hook on the weight's accumulation misses a part: a plain ``nn.Linear`` head that trains,
    tied to the input embedding (whose own gradient then runs the weight's accumulation and its
    hooks, after the head's part is in), in a single process (DDP and FSDP reduce gradients
    from those hooks)."""
    head, backbone = route.head, route.backbone
    if type(head) is not nn.Linear or not head.weight.requires_grad or route.via is not None:
        return False
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    embeddings = getattr(backbone, "get_input_embeddings", lambda: None)()
    return embeddings is not None and getattr(embeddings, "weight", None) is head.weight


def _recompute(positions: int, vocab: int | None, checkpointing: bool = False) -> bool:
    """Whether the chunks of a call over ``positions`` scored positions should be recomputed
    in the backward pass: under gradient checkpointing (``checkpointing``: the model's layers
    are checkpointed), and otherwise when their float32 logits would take more than
    :data:`KEEP_LOGITS_BYTES` (or the vocabulary size is unknown)."""
    return checkpointing or vocab is None or positions * vocab * 4 > KEEP_LOGITS_BYTES


def _checkpointing(module: nn.Module) -> bool:
    """Whether gradient checkpointing is on for ``module`` or any of its submodules (the flag
    transformers' ``activation_checkpointing_enable`` sets on the backbone and its layers)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in module.modules())


def _chunked_scores(
    score: _Scorer, inputs: Tensor, targets: Tensor, chunk_size: int, *, recompute: bool
) -> tuple[Tensor, Tensor | None]:
    """Apply ``score`` to ``chunk_size`` rows at a time and concatenate.

    When autograd will need the chunk (grad mode on and the inputs or the scorer's
    parameters require grad) and ``recompute`` is set, the chunk runs under non-reentrant
    activation checkpointing: autograd keeps the chunk's inputs, not its ``[chunk, V]``
    logits, and recomputes them in the backward pass (RNG state preserved, so LoRA dropout
    draws the same mask).
    """
    logps: list[Tensor] = []
    entropies: list[Tensor] = []
    # Grad mode decides: the head's parameters may need grad even when `inputs` don't.
    use_checkpoint = recompute and torch.is_grad_enabled()
    # With no rows, score one empty chunk anyway: the empty result then stays connected to
    # the graph (a micro-batch whose completions are all padding contributes a
    # differentiable zero, as with TRL's fused head, instead of failing in backward).
    for start in range(0, max(inputs.shape[0], 1), chunk_size):
        chunk = inputs[start : start + chunk_size]
        chunk_targets = targets[start : start + chunk_size]
        if use_checkpoint:
            chunk_logps, chunk_entropy = checkpoint(
                score, chunk, chunk_targets, use_reentrant=False
            )
        else:
            chunk_logps, chunk_entropy = score(chunk, chunk_targets)
        logps.append(chunk_logps)
        if chunk_entropy is not None:
            entropies.append(chunk_entropy)
    return torch.cat(logps), (torch.cat(entropies) if entropies else None)


def _scatter_scored(scored: Tensor, values: Tensor) -> Tensor:
    """Place per-position ``values [M]`` into a zero ``[N, L]`` float32 tensor at ``scored``."""
    out = torch.zeros(scored.shape, dtype=torch.float32, device=values.device)
    return out.masked_scatter(scored, values)


def _chunked_head_scores(
    route: LogprobRoute,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    length: int,
    *,
    temperature: float,
    chunk_size: int,
    compute_entropy: bool,
    entropy_grad: bool = True,
    prompt_rows: tuple[Tensor, Tensor] | None = None,
    layout: PackedLayout | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The direct route: the backbone once, then the head on scored positions chunk by chunk.

    ``prompt_rows`` (``[U]`` row indices, one per distinct prompt, and ``[N]`` each row's
    index into them, see :func:`mtgrpo.fast.shared_prompt_rows`) switches on the shared-prompt
    forward; ``layout`` on the padding-free one.
    """
    backbone, head = route.backbone, route.head
    assert backbone is not None
    assert head is not None

    def score(
        input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        targets = input_ids[:, -length:]  # [N, L]
        scored = attention_mask[:, -length:].bool()  # [N, L]
        if layout is not None:
            hidden = packed_hidden(backbone, layout)  # [M, H], scored positions only
        elif prompt_rows is None:
            hidden = backbone(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=False,
            ).last_hidden_state[:, -length - 1 : -1]  # [N, L, H]: the state before each token
        else:
            hidden = shared_prompt_hidden(
                backbone, input_ids, attention_mask, position_ids, length, *prompt_rows
            )
        if layout is None:
            hidden = hidden[scored]  # [M, H]
        # Only scored positions reach the head: padding costs no [V]-wide work at all.
        logps, entropy = _chunked_scores(
            _head_scorer(head, temperature, compute_entropy, entropy_grad,
                         grad_into_weight=_grad_goes_into_weight(route)),
            hidden,
            targets[scored],  # [M]
            chunk_size,
            recompute=_recompute(hidden.shape[0], getattr(head, "out_features", None),
                                 _checkpointing(backbone)),
        )
        logps_full = _scatter_scored(scored, logps)  # [N, L]
        return logps_full, (None if entropy is None else _scatter_scored(scored, entropy))

    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
    }
    if route.via is None:
        return score(**inputs)
    with _forward_replaced(route.via.module, score):
        return route.via(**inputs)


@contextmanager
def _forward_replaced(module: nn.Module, forward: Callable[..., object]) -> Iterator[None]:
    """Make ``module(...)`` run ``forward`` for the duration of the block.

    An instance attribute shadows the class's ``forward``; a forward already set on the
    instance (accelerate's mixed-precision wrapper, for one) is put back afterwards.
    """
    previous = module.__dict__.get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if previous is None:
            del module.forward
        else:
            module.forward = previous


def _model_forward_scores(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    length: int,
    *,
    temperature: float,
    chunk_size: int,
    compute_entropy: bool,
    entropy_grad: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """The fallback route: the model's own forward, keeping only the needed logits."""
    targets = input_ids[:, -length:]  # [N, L]
    scored = attention_mask[:, -length:].bool()  # [N, L]
    kwargs: dict[str, object] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "use_cache": False,
    }
    if _accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = length + 1
    logits = model(**kwargs).logits[:, -length - 1 : -1]  # [N, L, V] in the model's dtype
    scorer = _logits_scorer(temperature, compute_entropy, entropy_grad)
    row_logps: list[Tensor] = []
    row_entropies: list[Tensor] = []
    recompute = _recompute(logits.shape[0] * logits.shape[1], logits.shape[-1],
                           _checkpointing(model))
    # Row by row: logits[n] is a contiguous [L, V] slice, so no copy of the whole tensor.
    for row in range(logits.shape[0]):
        logps, entropy = _chunked_scores(scorer, logits[row], targets[row], chunk_size,
                                         recompute=recompute)
        row_logps.append(logps)
        if entropy is not None:
            row_entropies.append(entropy)
    zero = torch.zeros((), dtype=torch.float32, device=logits.device)
    logps_full = torch.where(scored, torch.stack(row_logps), zero)  # [N, L]
    if not compute_entropy:
        return logps_full, None
    return logps_full, torch.where(scored, torch.stack(row_entropies), zero)


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
        if value not in _NEUTRAL_VALUES.get(field, (None, 1, 1.0)):
            return f"{field}={value!r}"
    return None


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    module = model
    while isinstance(getattr(module, "module", None), nn.Module):  # DDP / FSDP wrappers
        module = module.module
    causal_lm, _ = causal_lm_and_reason(module)
    return "logits_to_keep" in inspect.signature(causal_lm.forward).parameters


def _check_scoring_options(temperature: float, chunk_size: int) -> None:
    if not temperature > 0:
        raise ValueError(
            f"temperature must be > 0 (the logits are divided by it), got {temperature}; "
            "use the temperature the completions were sampled with"
        )
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(
            f"chunk_size must be a positive int (positions scored per output-head call), "
            f"got {chunk_size!r}"
        )


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
    if not 1 <= completion_length <= total - 1:
        raise ValueError(
            f"completion_length must be between 1 and T - 1 = {total - 1} (at least one prompt "
            f"token precedes the completion), got {completion_length}"
        )
