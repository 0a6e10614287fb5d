"""LoRA adapters (through peft) and the adapter-off reference policy.

With LoRA the reference policy of the KL term is the base model, which the same object computes
when its adapters are switched off (``PeftModel.disable_adapter``), so no second copy of the
weights is kept in memory (TRL's GRPOTrainer does the same when it is given a ``peft_config``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel
    from transformers import PreTrainedModel

__all__ = ["DEFAULT_LORA_TARGET_MODULES", "apply_lora", "make_lora_config", "reference_mode"]

# The attention and MLP projections of Llama, Qwen2/2.5/3, Mistral and most decoder LMs.
DEFAULT_LORA_TARGET_MODULES: tuple[str, ...] = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
)

# Departures from peft's own defaults (r=8, alpha=8): the common RL fine-tuning choice r=16,
# alpha=32; dropout 0 so that the adapter computes the same log-probabilities when the rollout
# is generated (eval mode) and when the policy is updated (train mode): with dropout the
# importance ratio would not start at 1.
_DEFAULTS: dict[str, Any] = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "bias": "none"}


def _default_target_modules(model: PreTrainedModel) -> list[str] | str:
    """The Llama-style projections the model has, else peft's ``"all-linear"``."""
    import torch

    leaf_names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    present = [name for name in DEFAULT_LORA_TARGET_MODULES if name in leaf_names]
    return present if present else "all-linear"


def make_lora_config(
    model: PreTrainedModel, config: LoraConfig | Mapping[str, Any] | None = None
) -> LoraConfig:
    """A ``LoraConfig`` for ``model`` from a config, a mapping of ``LoraConfig`` fields, or None.

    Fields a mapping leaves out take mtgrpo's defaults (r=16, lora_alpha=32, lora_dropout=0.0,
    bias="none", task_type="CAUSAL_LM", and the model's q/k/v/o/gate/up/down projections, or
    "all-linear" for a model without them).
    """
    from peft import LoraConfig

    if isinstance(config, LoraConfig):
        return config
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(
            f"LoRA config must be a peft LoraConfig, a mapping of its fields or None, "
            f"got {type(config).__name__}"
        )
    fields = dict(config or {})
    valid = {f.name for f in dataclasses.fields(LoraConfig) if f.init}
    unknown = sorted(set(fields) - valid)
    if unknown:
        raise ValueError(
            f"unknown LoRA option(s) {unknown}; LoraConfig takes e.g. r, lora_alpha, "
            "lora_dropout, target_modules, modules_to_save, use_rslora, use_dora"
        )
    options = {**_DEFAULTS, "task_type": "CAUSAL_LM", **fields}
    if options.get("target_modules") is None:
        options["target_modules"] = _default_target_modules(model)
    return LoraConfig(**options)


def apply_lora(
    model: PreTrainedModel, config: LoraConfig | Mapping[str, Any] | None = None
) -> PeftModel:
    """Wrap ``model`` with LoRA adapters (``peft.get_peft_model``) and return the peft model.

    Only the adapter weights are trainable afterwards. ``config`` is read by
    :func:`make_lora_config`. A model that already carries peft adapters is refused, since
    stacking a second adapter on it is almost always a mistake.
    """
    from peft import PeftModel, get_peft_model

    if isinstance(model, PeftModel):
        raise ValueError(
            "the model already has peft adapters; pass the base model, or keep training the "
            "existing adapter without calling apply_lora"
        )
    return get_peft_model(model, make_lora_config(model, config))


@contextmanager
def reference_mode(model: PeftModel) -> Iterator[PeftModel]:
    """Within the block, ``model`` computes the reference (base) policy: adapters are off.

    ``with reference_mode(policy) as reference: ref_logits = reference(input_ids).logits``.
    Gradients are not switched off here; callers compute reference log-probs under
    ``torch.no_grad()``.
    """
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        raise TypeError(
            f"reference_mode needs a peft model (one wrapped by apply_lora), got "
            f"{type(model).__name__}; for full fine-tuning keep a separate frozen reference copy "
            "(load_model(spec, for_training=False))"
        )
    with model.disable_adapter():
        yield model
