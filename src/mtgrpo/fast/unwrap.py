"""The transformers causal LM behind the wrappers a policy may wear (``torch.compile``, peft).

One definition for the speed layer (the static backend, the generation replica) and the
log-probabilities (:mod:`mtgrpo.policy.logprobs`): calling the base model of a LoRA-style peft
model applies the adapter (its layers live inside the base model's modules); a prompt-learning
peft method adds virtual tokens in the peft forward only, which calling the base model would
skip.
"""

from __future__ import annotations

from torch import nn

__all__ = ["causal_lm_and_reason", "unwrap_causal_lm"]


def causal_lm_and_reason(model: nn.Module) -> tuple[nn.Module, str | None]:
    """The causal LM behind ``model``'s wrappers, and why it must not be called directly
    (None when it may): a prompt-learning peft method (the base model is still returned, e.g.
    to read its signature)."""
    module = getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a core dependency
        return module, None
    if not isinstance(module, PeftModel):
        return module, None
    reason = None
    if module.active_peft_config.is_prompt_learning:
        reason = (f"prompt-learning peft ({type(module.active_peft_config).__name__}) adds "
                  "virtual tokens in its own forward")
    return module.get_base_model(), reason


def unwrap_causal_lm(model: nn.Module) -> nn.Module:
    """The causal LM behind ``model``'s wrappers, to call directly; a prompt-learning peft
    model is refused (``ValueError``): the static backend cannot serve it."""
    module, reason = causal_lm_and_reason(model)
    if reason is not None:
        config = type(getattr(model, "_orig_mod", model).active_peft_config).__name__
        raise ValueError(
            f"the static backend cannot serve prompt-learning peft models ({config}: virtual "
            "tokens are added in the peft forward); use the 'hf' generation backend")
    return module
