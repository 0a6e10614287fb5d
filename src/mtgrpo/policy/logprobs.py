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
and each chunk is wrapped in activation checkpointing when gradients are needed, so at most one
``[chunk_size, V]`` slice of logits (plus its float32 copy) exists at a time, in the forward
pass and in the backward pass (which recomputes the slice).

Departures from TRL 1.16 (``GRPOTrainer._get_per_token_logps_and_entropies`` with its fused
LM head, ``trl.trainer.utils.add_fused_lm_head``):

1. TRL calls the patched model forward and projects through ``lm_head.weight`` in its own
   autograd kernel, applying soft-capping and logit scales itself. We call the backbone and
   the head *modules*, so LoRA layers on the head (and anything else a module wrapper adds)
   still apply; for models whose forward transforms the head's output we fall back to the
   model's own forward (see :func:`resolve_logprob_path`) instead of re-implementing each
   transform.
2. TRL chunks rows of the flattened scored positions by 32,768 tokens inside its kernel; we
   chunk the same way but by ``chunk_size`` (default 512) so the slice fits in plain PyTorch.
3. Like TRL's fused head, padded completion positions (``attention_mask == 0``) get
   log-probability 0 and entropy 0.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

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

DEFAULT_CHUNK_SIZE = 512

LogprobPath = Literal["chunked_head", "model_forward"]

# Config fields (of the text config) through which a transformers causal LM's forward changes
# `lm_head(hidden)` before returning logits: tanh soft-capping (Gemma 2/3, Mistral-Large-4,
# RecurrentGemma), multiplicative scales (Cohere, Falcon-H1, HyperCLOVA X, Muse), division by a
# scale (Granite, MiniCPM3) and a vocabulary cut (Inkling). Found by reading every
# `*ForCausalLM.forward` of transformers 5.23; TRL's fused head handles the same set.
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
    """How :func:`sequence_logprobs` will score a model, and why."""

    path: LogprobPath
    reason: str
    backbone: nn.Module | None = None
    head: nn.Module | None = None


def position_ids_from_attention_mask(attention_mask: Tensor) -> Tensor:
    """Position ids for (left- or right-) padded rows, as ``generate`` derives them.

    ``position_t = (number of attended tokens up to and including t) - 1``, and 0 at padded
    positions (``GenerationMixin._prepare_position_ids_for_generation`` in transformers 5).
    A left-padded prompt therefore starts at position 0 whatever its padding, and completion
    tokens continue from the last prompt position, as they did while being generated.
    """
    mask = attention_mask.long()  # [N, T]
    positions = mask.cumsum(-1) - 1
    return positions.masked_fill(mask == 0, 0)


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
        _logits_scorer(temperature, with_entropy=True), flat, dummy_index, chunk_size
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
    cannot guarantee when the config sets one of :data:`LOGIT_TRANSFORM_FIELDS`.

    Everything else falls back to ``"model_forward"`` (correct, but the model materialises
    ``[N, L + 1, V]`` logits in its own dtype): DDP / FSDP wrappers (their forward is what
    synchronises gradients or gathers shards, so sub-modules must not be called around it), a
    head whose weight is an FSDP2 ``DTensor``, prompt-learning PEFT methods (the virtual tokens
    are added by the PEFT forward), and models without a separable backbone or head.
    """
    wrapper = _distributed_wrapper_name(model)
    if wrapper is not None:
        return LogprobRoute("model_forward", f"the model is wrapped in {wrapper}")
    causal_lm, reason = _unwrap_causal_lm(model)
    if reason is not None:
        return LogprobRoute("model_forward", reason)
    config = getattr(causal_lm, "config", None)
    if config is not None:
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        for field in LOGIT_TRANSFORM_FIELDS:
            value = getattr(text_config, field, None)
            if value not in _NEUTRAL_VALUES.get(field, (None, 1, 1.0)):
                return LogprobRoute(
                    "model_forward", f"the model's forward transforms logits ({field}={value!r})"
                )
    prefix = getattr(causal_lm, "base_model_prefix", "")
    backbone = getattr(causal_lm, prefix, None) if prefix else None
    get_head = getattr(causal_lm, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(backbone, nn.Module) or not isinstance(head, nn.Module):
        return LogprobRoute("model_forward", "no separable backbone and output head were found")
    if _is_dtensor(getattr(head, "weight", None)):
        return LogprobRoute("model_forward", "the output head is sharded by FSDP2")
    return LogprobRoute("chunked_head", "plain causal LM head", backbone=backbone, head=head)


def sequence_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_length: int,
    *,
    temperature: float,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    compute_entropy: bool = False,
    path: Literal["auto", "chunked_head", "model_forward"] = "auto",
) -> LogprobOutput:
    """Log-probabilities of the last ``completion_length`` tokens of every row.

    ``input_ids, attention_mask: [N, T]`` hold left-padded prompts followed by right-padded
    completions (the layout of TRL's ``torch.cat([prompt_ids, completion_ids], 1)``); the
    completion is the last ``L = completion_length`` columns. Returns ``logps[n, t] =
    log softmax(float32(logits[n, T-L-1+t]) / temperature)[input_ids[n, T-L+t]]`` (and the
    entropy of the same distribution), 0 where ``attention_mask[n, T-L+t] == 0``.

    Position ids come from the attention mask (:func:`position_ids_from_attention_mask`) so a
    left-padded row sees the positions it was generated with. With ``path="auto"`` the route
    is :func:`resolve_logprob_path`'s; ``"model_forward"`` forces the fallback (for a model
    whose forward alters logits in a way the config does not reveal), ``"chunked_head"``
    forces the direct route and raises when the model has no separable backbone and head.
    """
    _check_sequence_inputs(input_ids, attention_mask, completion_length)
    _check_scoring_options(temperature, chunk_size)
    route = _route_for(model, path)
    length = completion_length
    position_ids = position_ids_from_attention_mask(attention_mask)  # [N, T]
    targets = input_ids[:, -length:]  # [N, L]
    scored = attention_mask[:, -length:].bool()  # [N, L]
    if route.path == "chunked_head":
        logps_full, entropy_full = _chunked_head_scores(
            route, input_ids, attention_mask, position_ids, targets, scored,
            temperature=temperature, chunk_size=chunk_size, compute_entropy=compute_entropy,
        )  # fmt: skip
    else:
        logps_full, entropy_full = _model_forward_scores(
            model, input_ids, attention_mask, position_ids, targets, scored,
            temperature=temperature, chunk_size=chunk_size, compute_entropy=compute_entropy,
        )  # fmt: skip
    return LogprobOutput(logps=logps_full, entropy=entropy_full, path=route.path)


# A scorer maps a chunk of inputs [c, ...] and targets [c] to (logps [c], entropy [c] | None).
_Scorer = Callable[[Tensor, Tensor], tuple[Tensor, Tensor | None]]


def _row_scores(
    logits: Tensor, targets: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of ``targets`` and entropy for logits ``[c, V]`` (float32 from here on)."""
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    if not with_entropy:
        # log softmax(x)[y] = x[y] - logsumexp(x): no [c, V] log-probability tensor is formed.
        selected = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [c]
        return selected - torch.logsumexp(scaled, dim=-1), None
    log_probs = torch.log_softmax(scaled, dim=-1)  # [c, V]
    logps = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [c]
    return logps, -(log_probs.exp() * log_probs).sum(-1)


def _logits_scorer(temperature: float, with_entropy: bool) -> _Scorer:
    def score(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor | None]:
        return _row_scores(logits, targets, temperature, with_entropy)

    return score


def _head_scorer(head: nn.Module, temperature: float, with_entropy: bool) -> _Scorer:
    def score(hidden: Tensor, targets: Tensor) -> tuple[Tensor, Tensor | None]:
        return _row_scores(head(hidden), targets, temperature, with_entropy)

    return score


def _chunked_scores(
    score: _Scorer, inputs: Tensor, targets: Tensor, chunk_size: int
) -> tuple[Tensor, Tensor | None]:
    """Apply ``score`` to ``chunk_size`` rows at a time and concatenate.

    When autograd will need the chunk (grad mode on and the inputs or the scorer's
    parameters require grad), the chunk runs under non-reentrant activation checkpointing:
    autograd keeps the chunk's inputs, not its ``[chunk, V]`` logits, and recomputes them in
    the backward pass (RNG state preserved, so LoRA dropout draws the same mask).
    """
    logps: list[Tensor] = []
    entropies: list[Tensor] = []
    # Grad mode alone decides: the head's parameters may need grad even when `inputs` don't.
    use_checkpoint = torch.is_grad_enabled()
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
    targets: Tensor,
    scored: Tensor,
    *,
    temperature: float,
    chunk_size: int,
    compute_entropy: bool,
) -> tuple[Tensor, Tensor | None]:
    """The direct route: the backbone once, then the head on scored positions chunk by chunk."""
    assert route.backbone is not None
    assert route.head is not None
    length = targets.shape[1]
    hidden = route.backbone(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    ).last_hidden_state[:, -length - 1 : -1]  # [N, L, H]: the state before each token
    # Only scored positions reach the head: padding costs no [V]-wide work at all.
    logps, entropy = _chunked_scores(
        _head_scorer(route.head, temperature, compute_entropy),
        hidden[scored],  # [M, H]
        targets[scored],  # [M]
        chunk_size,
    )
    logps_full = _scatter_scored(scored, logps)  # [N, L]
    return logps_full, (None if entropy is None else _scatter_scored(scored, entropy))


def _model_forward_scores(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    targets: Tensor,
    scored: Tensor,
    *,
    temperature: float,
    chunk_size: int,
    compute_entropy: bool,
) -> tuple[Tensor, Tensor | None]:
    """The fallback route: the model's own forward, keeping only the needed logits."""
    length = targets.shape[1]
    kwargs: dict[str, object] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "use_cache": False,
    }
    if _accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = length + 1
    logits = model(**kwargs).logits[:, -length - 1 : -1]  # [N, L, V] in the model's dtype
    scorer = _logits_scorer(temperature, compute_entropy)
    row_logps: list[Tensor] = []
    row_entropies: list[Tensor] = []
    # Row by row: logits[n] is a contiguous [L, V] slice, so no copy of the whole tensor.
    for row in range(logits.shape[0]):
        logps, entropy = _chunked_scores(scorer, logits[row], targets[row], chunk_size)
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


def _unwrap_causal_lm(model: nn.Module) -> tuple[nn.Module, str | None]:
    """The causal LM behind ``torch.compile`` and PEFT wrappers, or a reason to fall back."""
    module = getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a core dependency
        return module, None
    if isinstance(module, PeftModel):
        if module.active_peft_config.is_prompt_learning:
            return module, "prompt-learning PEFT adds virtual tokens in its own forward"
        module = module.get_base_model()
    return module, None


def _distributed_wrapper_name(model: nn.Module) -> str | None:
    if not torch.distributed.is_available():
        return None
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel

    for wrapper in (DistributedDataParallel, FullyShardedDataParallel):
        if isinstance(model, wrapper):
            return wrapper.__name__
    return None


def _is_dtensor(value: object) -> bool:
    if value is None or not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    causal_lm, _ = _unwrap_causal_lm(model)
    causal_lm = getattr(causal_lm, "module", causal_lm)  # DDP / FSDP keep the model in .module
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
