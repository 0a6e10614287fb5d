"""A copy of the policy's weights in another dtype, with LoRA adapters merged, for generation.

When the policy trains in float32 but the hardware multiplies bfloat16 natively (``bf16``
resolved on, see :mod:`mtgrpo.models.precision`), the static backend generates from a
bfloat16 replica instead of the policy itself, the way an external inference engine serves a
copy of the trained weights: every matrix product, the attention and the KV cache of the
decode loop run in bfloat16 (about twice float32's throughput on such CPUs), while the update
keeps float32 master weights. LoRA adapters are merged into the replica's weights
(``W + scaling * B @ A``, peft's own delta and its variants' safe merge), so decoding pays
nothing for them.

The replica follows the policy: :meth:`WeightReplica.refresh` copies what may have changed
(trainable parameters, and the merged weights of LoRA layers), and :meth:`WeightReplica.stale`
tells, from the parameters' storage and in-place version counters, whether anything did since
the last refresh (an optimizer step, ``load_state_dict``), so a generation never samples from
old weights even when nobody called the backend's ``update_weights``.

Sampling from the replica is sampling from a slightly different distribution than the
float32 policy's (rounding of bfloat16 weights and activations); the trainer recomputes the
log-probabilities it trains on in its own precision, and the backend returns the replica's
log-probabilities so that the difference is measured (``generation/logprob_mismatch_mean``,
``_max`` and ``generation/kl_k3``: the trainer asks the static backend for them by default).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mtgrpo.fast.unwrap import unwrap_causal_lm

__all__ = ["WeightReplica", "hooked_modules", "mergeable_lora", "merged_lora"]


@dataclass(frozen=True)
class _Pair:
    """A replica module and the policy module whose weights it holds."""

    name: str
    replica: nn.Module
    source: nn.Module
    lora: bool  # the source is a peft LoRA layer: merge its active adapters


class WeightReplica:
    """``module``: a plain copy of ``model``'s causal LM (peft unwrapped, LoRA merged) in
    ``dtype``, in eval mode, without gradients; kept current by :meth:`refresh`.

    ``model``: a transformers causal LM or a peft LoRA model wrapping one (as the static
    backend accepts). Adapters of other peft methods are refused.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        source = unwrap_causal_lm(model)
        self.dtype = dtype
        self.module = _plain_copy(source, dtype)
        self._pairs = [_pair(name, module, source) for name, module in
                       self.module.named_modules() if _owns_weights(module)]
        self._source = source
        self._stamp: tuple[tuple[int, int], ...] = ()
        self.refresh(model, everything=True)

    def _watched(self) -> list[Tensor]:
        """The policy's tensors a training step may change: every trainable parameter (LoRA
        factors included), every parameter when none is trainable (a frozen model may still
        be loaded into)."""
        params = list(self._source.parameters())
        trainable = [p for p in params if p.requires_grad]
        return trainable or params

    def _current_stamp(self) -> tuple[tuple[int, int], ...]:
        # an in-place optimizer step bumps _version; re-assigned or loaded tensors move data_ptr
        return tuple((p.data_ptr(), p._version) for p in self._watched())

    def stale(self) -> bool:
        """Whether a watched tensor of the policy changed (storage or in-place version) since
        the last :meth:`refresh`."""
        return self._current_stamp() != self._stamp

    @torch.no_grad()
    def refresh(self, model: nn.Module | None = None, *, everything: bool = False) -> None:
        """Copy the policy's current weights into the replica (cast to its dtype, LoRA
        merged). Only modules that hold a trainable tensor are copied, unless ``everything``.

        ``model``: the policy (default: the one the replica was built from; another object
        must have the same structure).
        """
        if model is not None:
            source = unwrap_causal_lm(model)
            if source is not self._source:
                self._source = source
                self._pairs = [_pair(p.name, p.replica, source) for p in self._pairs]
                everything = True
        for pair in self._pairs:
            if everything or _trainable(pair.source):
                _copy_weights(pair)
        self._stamp = self._current_stamp()


def _plain_copy(source: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of ``source`` without adapter layers, accelerate wrappers or gradients."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    hooked = hooked_modules(source)
    if hooked:
        raise ValueError(
            f"the policy's modules {hooked[:3]} have forward hooks, which a copy in another "
            "dtype would not compute alike (a cast to float32, a logging hook); generate "
            "from the policy itself (the static backend's dtype=None, or bf16 false)"
        )
    # deepcopy's memo keeps tied weights (head and input embedding) one tensor in the copy
    replica = copy.deepcopy(source)
    for name, module in list(replica.named_modules()):
        if isinstance(module, BaseTunerLayer):
            _check_lora(name, module)
            parent_name, _, child = name.rpartition(".")
            parent = replica.get_submodule(parent_name) if parent_name else replica
            # the adapter's base nn.Linear in its place; refresh() writes the merged weight into it
            setattr(parent, child, module.get_base_layer())
    for module in replica.modules():
        module.__dict__.pop("forward", None)  # accelerate's mixed-precision forward
        module.__dict__.pop("_original_forward", None)
    for param in replica.parameters():  # buffers (rotary frequencies) keep their precision
        # .data, not a new Parameter: a tied weight is one Parameter, cast once for both modules
        param.data = param.data.to(dtype)
    return replica.eval().requires_grad_(False)


def hooked_modules(model: nn.Module) -> list[str]:
    """Names of the modules of ``model`` with forward hooks or forward pre-hooks."""
    return [name or type(model).__name__ for name, module in model.named_modules()
            if module._forward_hooks or module._forward_pre_hooks]


def mergeable_lora(module: nn.Module) -> bool:
    """Whether ``module`` is a peft LoRA layer whose adapters :func:`merged_lora` can merge."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return (isinstance(module, BaseTunerLayer) and hasattr(module, "lora_A")
            and hasattr(module, "get_delta_weight"))


def _check_lora(name: str, module: nn.Module) -> None:
    if not mergeable_lora(module):
        raise ValueError(
            f"{name} is a {type(module).__name__} adapter layer; the bfloat16 generation "
            "replica merges LoRA adapters only: set bf16 to false or generation_backend to 'hf'"
        )


def _owns_weights(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False))


def _pair(name: str, replica: nn.Module, root: nn.Module) -> _Pair:
    from peft.tuners.tuners_utils import BaseTunerLayer

    source = root.get_submodule(name)
    return _Pair(name, replica, source, isinstance(source, BaseTunerLayer))


def _trainable(source: nn.Module) -> bool:
    return any(p.requires_grad for p in source.parameters())


def _copy_weights(pair: _Pair) -> None:
    """The replica module's own parameters from the source module's (buffers, such as rotary
    frequencies, are constants copied with the module)."""
    if not pair.lora:
        for name, tensor in pair.replica.named_parameters(recurse=False):
            # copy_ casts into the replica's own tensor: its address, which graphs replay on, stays
            tensor.copy_(getattr(pair.source, name))
        return
    weight, bias = merged_lora(pair.source)
    pair.replica.weight.copy_(weight)
    if bias is not None:
        pair.replica.bias.copy_(bias)


def merged_lora(layer: nn.Module) -> tuple[Tensor, Tensor | None]:
    """``(weight, bias)`` of a LoRA layer with its active adapters merged, computed on copies
    (the layer is never modified), as peft's ``merge(safe_merge=True)`` computes them."""
    base = layer.get_base_layer()
    weight = base.weight.detach().clone()
    bias = None if getattr(base, "bias", None) is None else base.bias.detach().clone()
    if layer.merged or layer.disable_adapters:
        return weight, bias  # merged: the base already holds them; disabled: none apply
    variants = getattr(layer, "lora_variant", {})
    for adapter in layer.active_adapters:
        # an active adapter need not target this layer: peft's merge skips it the same way
        if adapter not in layer.lora_A:
            continue
        if adapter in variants:  # DoRA and other variants: peft's safe merge
            weight = variants[adapter].merge_safe(layer, adapter, weight)
        else:
            # peft's own delta (scaling * B @ A), added to a copy: the layer is never modified
            weight += layer.get_delta_weight(adapter).to(weight.dtype)
        # peft's merge: base bias + lora_B's bias * scaling (tuners/lora/layer.py)
        if getattr(layer, "lora_bias", {}).get(adapter, False):
            bias = bias + layer.lora_B[adapter].bias * layer.scaling[adapter]
    return weight, bias
