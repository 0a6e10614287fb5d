"""Log-probabilities through the output head without a float32 ``[N, L, V]`` logits tensor.

Notation as :mod:`mtgrpo.policy.logprobs` (whose :func:`~mtgrpo.policy.sequence_logprobs`
chooses the route and calls these): ``M`` scored completion positions, ``V`` vocabulary size,
``H`` hidden size.

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
always does. A head tied to the input embedding adds its weight gradient into ``.grad`` chunk
by chunk (:class:`_GradIntoParameter`).

Against TRL 1.16's fused head (``trl.trainer.utils.add_fused_lm_head``): its kernel tiles
4,096 positions x 32,768 vocabulary columns with an online logsumexp and a hand-written
backward; we tile positions only (whole vocabulary rows) and let activation checkpointing
recompute each tile: plain PyTorch, any head module (LoRA on the head included), the same
bounded memory. The chunks run along the flattened scored positions of all rows, so memory
does not grow with ``N`` and padding is never projected.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from mtgrpo.fast.packed import PackedLayout, packed_hidden
from mtgrpo.fast.shared_prompts import shared_prompt_hidden
from mtgrpo.fast.unwrap import causal_lm_and_reason

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "KEEP_LOGITS_BYTES",
    "check_scoring_options",
    "chunked_head_scores",
    "entropy_from_logits",
    "grad_goes_into_weight",
    "model_forward_scores",
    "selective_log_softmax",
]


DEFAULT_CHUNK_SIZE = 512


# Float32 logits of a call's scored positions that autograd may keep rather than recompute
# (module docstring, "Memory").
KEEP_LOGITS_BYTES = 256 << 20


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
    check_scoring_options(temperature, chunk_size)
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
    check_scoring_options(temperature, chunk_size)
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    # the scorer always gathers a target; id 0 exists in every vocabulary
    dummy_index = torch.zeros(flat.shape[0], dtype=torch.long, device=logits.device)
    _, entropy = _chunked_scores(
        _logits_scorer(temperature, with_entropy=True), flat, dummy_index, chunk_size,
        recompute=_recompute(flat.shape[0], vocab),
    )
    assert entropy is not None
    return entropy.reshape(logits.shape[:-1])


# A scorer maps a chunk of inputs [c, ...] and targets [c] to (logps [c], entropy [c] | None).
_Scorer = Callable[[Tensor, Tensor], tuple[Tensor, Tensor | None]]


def _row_scores(
    logits: Tensor, targets: Tensor, temperature: float, with_entropy: bool,
    entropy_grad: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of ``targets`` and entropy for logits ``[c, V]`` (float32 from here on);
    ``entropy_grad=False``: the entropy without a graph (for logging or masking)."""
    # float32 before the temperature, as generate's sampler forms the distribution
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
        if grad_into_weight:  # see grad_goes_into_weight
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
            # a copy with the parameter's strides, as torch's AccumulateGrad lays out a new
            # .grad (its gradient layout contract, autograd/functions/accumulate_grad.h)
            parameter.grad = torch.empty_like(parameter).copy_(grad)
        else:
            # in place, as AccumulateGrad adds into an existing .grad outside double backward
            parameter.grad.add_(grad)


def grad_goes_into_weight(backbone: nn.Module, head: nn.Module, via: nn.Module | None) -> bool:
    """Whether the head's weight gradient is added into ``.grad`` directly
    (:class:`_GradIntoParameter`): only where that is all autograd would do with it, so that no
    hook on the weight's accumulation misses a part: a plain ``nn.Linear`` head that trains,
    tied to the input embedding (whose own gradient then runs the weight's accumulation and its
    hooks, after the head's part is in), in a single process (DDP and FSDP reduce gradients
    from those hooks)."""
    if type(head) is not nn.Linear or not head.weight.requires_grad or via is not None:
        return False
    # DDP and FSDP reduce gradients from the accumulation hooks this shortcut would bypass
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    embeddings = getattr(backbone, "get_input_embeddings", lambda: None)()
    return embeddings is not None and getattr(embeddings, "weight", None) is head.weight


def _recompute(positions: int, vocab: int | None, checkpointing: bool = False) -> bool:
    """Whether the chunks of a call over ``positions`` scored positions should be recomputed
    in the backward pass: under gradient checkpointing (``checkpointing``: the model's layers
    are checkpointed), and otherwise when their float32 logits would take more than
    :data:`KEEP_LOGITS_BYTES` (or the vocabulary size is unknown)."""
    # 4 bytes per position and column: the scorer's float32 copy of the logits
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


def chunked_head_scores(
    backbone: nn.Module,
    head: nn.Module,
    via: nn.Module | None,
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
    forward; ``layout`` on the padding-free one. ``via``: the DDP wrapper whose forward the
    computation runs inside (so that its gradient hooks see it), or None.
    """

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
                         grad_into_weight=grad_goes_into_weight(backbone, head, via)),
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
    if via is None:
        return score(**inputs)
    # inside DDP's forward (as TRL's fused head patches the model forward): its hooks run
    with _forward_replaced(via.module, score):
        return via(**inputs)


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


def model_forward_scores(
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
        # + 1: the last prompt position's logits predict the first completion token
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


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    module = model
    while isinstance(getattr(module, "module", None), nn.Module):  # DDP / FSDP wrappers
        module = module.module
    causal_lm, _ = causal_lm_and_reason(module)
    return "logits_to_keep" in inspect.signature(causal_lm.forward).parameters


def check_scoring_options(temperature: float, chunk_size: int) -> None:
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
