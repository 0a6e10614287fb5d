"""Optimizer, learning-rate schedule and gradient clipping for the policy update.

Kept deliberately small and close to the Hugging Face ``Trainer`` so that a run configured
with TRL's names (``learning_rate``, ``weight_decay``, ``adam_beta1/2``, ``adam_epsilon``,
``optim`` / ``optim_args``, ``lr_scheduler_type`` / ``lr_scheduler_kwargs``, ``warmup_steps`` /
``warmup_ratio``, ``max_grad_norm``) behaves the same: optimizer classes and their options
come from transformers' ``Trainer.get_optimizer_cls_and_kwargs``, schedules from
``transformers.get_scheduler``; the parameter groups (no decay on biases and norms) are the
Trainer's.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import AdamW, Optimizer
from torch.optim.lr_scheduler import LRScheduler

from mtgrpo.algo.registry import SCHEDULERS, check_optimizer_name, check_scheduler_name

__all__ = [
    "SCHEDULERS",
    "build_optimizer",
    "build_scheduler",
    "check_optimizer_name",
    "check_scheduler_name",
    "clip_gradients",
    "no_decay_parameter_names",
]

logger = logging.getLogger(__name__)

# The name patterns transformers' Trainer (5.x, `get_decay_parameter_names`) exempts from
# weight decay, matched on the lower-cased parameter name.
_NO_DECAY_PATTERNS = tuple(
    re.compile(pattern)
    for pattern in (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")
)



def no_decay_parameter_names(model: nn.Module) -> set[str]:
    """Names of the parameters exempt from weight decay, as the HF ``Trainer`` decides.

    Biases and normalisation weights: parameters of ``nn.LayerNorm`` / ``nn.RMSNorm`` modules
    or of any module whose class name contains ``Norm`` (``LlamaRMSNorm``, ...), and names
    matching the Trainer's patterns (``bias``, ``layernorm``, ``rmsnorm``, ``norm``).
    """
    exempt: set[str] = set()
    for module_name, module in model.named_modules():
        # transformers exempts nn.LayerNorm by type; RMSNorm classes (LlamaRMSNorm, ...) too
        # here, whatever their parameters are named
        is_norm = (
            isinstance(module, nn.LayerNorm | nn.RMSNorm) or "norm" in type(module).__name__.lower()
        )
        for param_name, _ in module.named_parameters(recurse=False):
            full_name = f"{module_name}.{param_name}" if module_name else param_name
            if is_norm or any(pattern.search(full_name.lower()) for pattern in _NO_DECAY_PATTERNS):
                exempt.add(full_name)
    return exempt


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    *,
    optim: str = "adamw_torch_fused",
    optim_args: str | None = None,
) -> Optimizer:
    """The optimizer over the trainable parameters only (LoRA: the adapter weights).

    Two parameter groups, as the HF ``Trainer``: ``weight_decay`` for weight matrices and 0
    for biases and normalisation weights (:func:`no_decay_parameter_names`). Defaults are the
    Trainer's (``adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0``).
    ``optim`` is a transformers optimizer name (``adamw_torch_fused`` default, as transformers'
    on torch >= 2.8: torch's ``AdamW`` with ``fused=True``, one kernel for every parameter;
    ``adamw_torch``: the same update by the multi-tensor or per-parameter loop, ``adafactor``,
    ``sgd``, ...) and ``optim_args`` its ``"key=value,..."`` options; the class and its keyword
    arguments come from ``Trainer.get_optimizer_cls_and_kwargs``. The fused kernel needs every
    trainable parameter to be a floating-point tensor on a device it supports (CPU, CUDA, XPU,
    MPS); otherwise ``adamw_torch_fused`` falls back to ``adamw_torch`` with a warning.
    """
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    if len(betas) != 2 or not all(0 <= beta < 1 for beta in betas):
        raise ValueError(f"betas must be two values in [0, 1), got {betas!r}")
    exempt = no_decay_parameter_names(model)
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if name in exempt else decay).append(param)
    if not decay and not no_decay:
        raise ValueError(
            "the model has no trainable parameters (requires_grad=False everywhere); unfreeze "
            "the layers to train or attach a LoRA adapter"
        )
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # a LoRA adapter leaves the no-decay group empty: the norms and biases stay frozen
    groups = [group for group in groups if group["params"]]
    # transformers' default optimizer on torch >= 2.8; built here, so a bad device can fall back
    if optim == "adamw_torch_fused" and not optim_args:
        params = [p for group in groups for p in group["params"]]
        unsupported = _fused_unsupported(params)
        if unsupported is None:
            return AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True)
        logger.warning("optim adamw_torch_fused: %s; using adamw_torch (the same update, "
                       "unfused)", unsupported)
        optim = "adamw_torch"
    if optim == "adamw_torch" and not optim_args:
        return AdamW(groups, lr=lr, betas=betas, eps=eps)
    optimizer_cls, kwargs = _transformers_optimizer(
        check_optimizer_name(optim), optim_args, lr, betas, eps, model)
    return optimizer_cls(groups, **kwargs)


# within torch's _get_fused_kernels_supported_devices: AdamW(fused=True) refuses other
# devices and non-floating-point parameters (at its first step)
_FUSED_DEVICES = ("cpu", "cuda", "xpu", "mps")


def _fused_unsupported(params: list[nn.Parameter]) -> str | None:
    """Why torch's fused AdamW cannot take ``params`` (None: it can)."""
    for param in params:
        if not torch.is_floating_point(param):
            return f"a parameter of dtype {param.dtype} is not floating point"
        if param.device.type not in _FUSED_DEVICES:
            return f"a parameter on device {param.device.type!r} has no fused kernel"
    return None


def _transformers_optimizer(optim: str, optim_args: str | None, lr: float,
                            betas: tuple[float, float], eps: float,
                            model: nn.Module) -> tuple[type, dict[str, Any]]:
    from types import SimpleNamespace

    from transformers import Trainer

    # the Trainer's own optimizer table, fed the TrainingArguments fields it reads for `optim`
    args = SimpleNamespace(optim=optim, optim_args=optim_args, learning_rate=lr,
                           adam_beta1=betas[0], adam_beta2=betas[1], adam_epsilon=eps)
    return Trainer.get_optimizer_cls_and_kwargs(args, model)  # type: ignore[arg-type]


def build_scheduler(
    optimizer: Optimizer,
    kind: str = "constant",
    *,
    total_steps: int,
    warmup_steps: int | None = None,
    warmup_ratio: float | None = None,
    scheduler_kwargs: Mapping[str, Any] | None = None,
) -> LRScheduler:
    """A per-optimizer-step learning-rate schedule (``transformers.get_scheduler``).

    ``kind``: ``"constant"`` (after the warm-up; MT-GRPO's setting), ``"linear"`` or
    ``"cosine"`` decay to 0 at ``total_steps``, or any other transformers schedule name with
    its options in ``scheduler_kwargs``. The warm-up is linear from 0 and is given as
    ``warmup_steps`` or as ``warmup_ratio`` of ``total_steps`` (rounded up, as the HF
    ``TrainingArguments.get_warmup_steps``), not both; neither means no warm-up.
    """
    name = check_scheduler_name(kind)
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"total_steps must be a positive int, got {total_steps!r}")
    if warmup_steps is not None and warmup_ratio is not None:
        raise ValueError(
            f"give warmup_steps ({warmup_steps}) or warmup_ratio ({warmup_ratio}), not both"
        )
    if warmup_ratio is not None:
        if not 0 <= warmup_ratio <= 1:
            raise ValueError(f"warmup_ratio must be in [0, 1], got {warmup_ratio}")
        # rounded up, as transformers' TrainingArguments.get_warmup_steps does for a ratio
        warmup_steps = math.ceil(warmup_ratio * total_steps)
    warmup_steps = 0 if warmup_steps is None else warmup_steps
    if not 0 <= warmup_steps <= total_steps:
        raise ValueError(
            f"warmup_steps must be in [0, total_steps={total_steps}], got {warmup_steps}"
        )
    from transformers import get_scheduler

    return get_scheduler(
        name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps,
        scheduler_specific_kwargs=dict(scheduler_kwargs or {}),
    )


def clip_gradients(
    parameters: nn.Module | Iterable[nn.Parameter], max_norm: float | None
) -> Tensor:
    """Clip the global L2 norm of the gradients to ``max_norm`` and return the norm before.

    ``max_norm=None`` (or ``inf``) only measures. Only trainable parameters with a gradient
    count. The norm is returned as a 0-dim tensor so logging it forces no device sync until
    read. Under ``accelerate``'s FSDP configuration, use ``accelerator.clip_grad_norm_``, which
    reduces the norm across shards.
    """
    if max_norm is not None and not max_norm > 0:
        raise ValueError(f"max_norm must be > 0 or None (no clipping), got {max_norm}")
    params = parameters.parameters() if isinstance(parameters, nn.Module) else parameters
    with_grad = [p for p in params if p.requires_grad and p.grad is not None]
    if not with_grad:
        return torch.zeros(())
    # an infinite limit makes clip_grad_norm_ measure the norm without scaling the gradients
    limit = math.inf if max_norm is None else max_norm
    norm = torch.nn.utils.clip_grad_norm_(with_grad, limit)
    # sharded (FSDP2) gradients give a DTensor norm, already reduced over the shards
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
