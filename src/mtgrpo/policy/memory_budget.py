"""Micro-batches sized from a memory budget (``max_memory_per_microbatch``).

A micro-batch's memory above the weights, gradients and optimizer state is what its forward
pass saves for the backward pass, which grows with its tokens, plus what does not: the
weights' autocast copies, the output head's ``[chunk, V]`` logits slice and its float32
softmax. :func:`activation_cost` measures the first by the tensors autograd actually saves
(``torch.autograd.graph.saved_tensors_hooks``) in two forwards of the policy at two lengths,
so the cost per token is the slope and what does not grow with tokens the intercept: gradient
checkpointing, LoRA, the padding-free forward and bf16 autocast are all accounted for as they
run. :meth:`ActivationCost.tokens_within` turns a budget into the token budget
:func:`mtgrpo.fast.plan_micro_batches` packs micro-batches by (TRL has no equivalent: its
micro-batches are a fixed row count).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["ActivationCost", "activation_cost", "saved_bytes"]

# The head's transient per scored position of a chunk: the float32 logits, their softmax (or
# log-softmax) and the gradient of the logits in the backward pass.
_HEAD_TRANSIENT_COPIES = 3


def saved_bytes(forward: Callable[[], Any], exclude: set[int]) -> int:
    """Bytes of the storages autograd saves for the backward pass while ``forward()`` runs,
    each storage once, leaving out those whose data pointer is in ``exclude`` (the weights:
    they are held anyway). The output is dropped, so the graph is freed on return."""
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        # keyed by storage: views of one tensor, saved by several operators, count once
        if storage.data_ptr() not in exclude:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = forward()
    del out
    return sum(seen.values())


@dataclass(frozen=True)
class ActivationCost:
    """A micro-batch's memory beyond the model's state: ``per_token`` bytes saved for the
    backward per planned token, ``fixed`` bytes that do not grow with the tokens."""

    per_token: float
    fixed: float

    def tokens_within(self, budget: int, *, width: int, name: str) -> int:
        """The planned tokens (rows x padded width) whose micro-batch fits ``budget`` bytes;
        an error when not even one row of ``width`` tokens (the longest a run allows) fits."""
        room = budget - self.fixed
        needed = self.fixed + self.per_token * width
        if room < self.per_token * width:
            raise ValueError(
                f"{name}={budget / 2**20:.0f} MiB does not hold one row of {width} tokens, the "
                f"longest this run allows: that needs about {needed / 2**20:.0f} MiB "
                f"({self.per_token / 2**10:.1f} KiB per token saved for the backward pass, "
                f"{self.fixed / 2**20:.0f} MiB that does not grow with tokens); raise it, turn "
                "on gradient_checkpointing, or shorten max_prompt_length / "
                "max_completion_length")
        # floor of 1 byte: a forward that saves nothing per token must not divide by zero
        return int(room // max(self.per_token, 1.0))


def activation_cost(model: nn.Module, forward: Callable[[int], Any], lengths: tuple[int, int],
                    *, head_chunk: int, vocab: int) -> ActivationCost:
    """Measure :class:`ActivationCost` from ``forward(tokens)`` (one policy forward on a
    row of that many tokens, with the update's settings) at the two ``lengths``; ``head_chunk``
    positions of a ``vocab``-wide head add their transient to the fixed part."""
    exclude = {tensor.untyped_storage().data_ptr()
               for tensor in [*model.parameters(), *model.buffers()]}
    short, long = lengths
    if not 0 < short < long:
        raise ValueError(f"activation_cost needs two lengths 0 < short < long, got {lengths}")
    at_short = saved_bytes(lambda: forward(short), exclude)
    at_long = saved_bytes(lambda: forward(long), exclude)
    # two-point linear fit: the slope is the per-token cost, the intercept what does not grow
    per_token = max((at_long - at_short) / (long - short), 0.0)
    fixed = max(at_short - per_token * short, 0.0)
    head = _HEAD_TRANSIENT_COPIES * 4 * head_chunk * vocab  # float32
    return ActivationCost(per_token=per_token, fixed=fixed + head)
