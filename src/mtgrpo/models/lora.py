"""LoRA adapters (through peft) and the adapter-off reference policy.

With LoRA the reference policy of the KL term is the base model, which the same object computes
when its adapters are switched off (``PeftModel.disable_adapter``), so no second copy of the
weights is kept in memory (TRL's GRPOTrainer does the same when it is given a ``peft_config``).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mtgrpo._config_types import check_option_types, coerce_numbers, option, refuse_unknown

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel
    from transformers import PreTrainedModel

__all__ = [
    "DEFAULT_LORA_TARGET_MODULES",
    "LoraSettings",
    "apply_lora",
    "make_lora_config",
    "reference_mode",
]

# The attention and MLP projections of Llama, Qwen2/2.5/3, Mistral and most decoder LMs.
DEFAULT_LORA_TARGET_MODULES: tuple[str, ...] = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
)



@dataclass
class LoraSettings:
    """A LoRA adapter: the ``peft:`` section of a run file, or ``peft_config`` as a mapping.

    Departures from peft's own defaults (r=8, alpha=8): the common RL fine-tuning choice r=16,
    alpha=32; dropout 0 so that the adapter computes the same log-probabilities when the
    rollout is generated (eval mode) and when the policy is updated (train mode): with dropout
    the importance ratio would not start at 1. Any other ``peft.LoraConfig`` field may be given
    too (checked against peft when the settings are built) and is passed on as is.
    """

    # r=16, alpha=32: also TRL 1.16's ModelConfig defaults (lora_r, lora_alpha)
    r: int = option("LoRA rank.", default=16)
    lora_alpha: float = option("Scale numerator: the update is scaled by lora_alpha / r.",
                               default=32)
    lora_dropout: float = option("Dropout on the adapter's input (0 keeps generation and "
                                 "update log-probs equal, so the ratio starts at 1).",
                                 # TRL 1.16's ModelConfig uses 0.05; see the class docstring
                                 default=0.0)
    bias: str = option("Biases trained too: none, all or lora_only.", default="none")
    target_modules: list[str] | str | None = option(
        "Modules to adapt (None: the model's q/k/v/o/gate/up/down projections, else "
        "all-linear).", default=None)
    modules_to_save: list[str] | None = option(
        "Modules trained in full and saved with the adapter (e.g. lm_head).", default=None)
    use_rslora: bool = option("Rank-stabilised scale lora_alpha / sqrt(r).", default=False)
    use_dora: bool = option("Weight-decomposed LoRA (DoRA).", default=False)
    # CAUSAL_LM wraps the model in PeftModelForCausalLM (generate works)
    task_type: str = option("peft's task type.", default="CAUSAL_LM")
    other: dict[str, Any] = option(
        "Any other peft.LoraConfig field (written at the section's top level in a run file).",
        default_factory=dict)

    def __post_init__(self) -> None:
        check_option_types(self, "peft")
        if self.r < 1:
            raise ValueError(f"peft.r={self.r} must be a positive integer (the LoRA rank)")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"peft.lora_dropout={self.lora_dropout} must be in [0, 1)")
        if self.other:
            from peft import LoraConfig  # only for fields beyond the common ones

            # checked against the installed peft, so a newer field is accepted
            valid = [f.name for f in dataclasses.fields(LoraConfig) if f.init]
            refuse_unknown([k for k in self.other if k not in valid], valid, "peft (LoRA)")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> LoraSettings:
        """From a mapping of ``LoraConfig`` fields (a run file's flat ``peft:`` section)."""
        if not isinstance(values, Mapping):
            raise ValueError(f"the peft section must be a mapping of LoRA options, got "
                             f"{type(values).__name__} {values!r:.80}")
        # unknown keys go to other and are checked against peft in __post_init__
        own = {f.name for f in dataclasses.fields(cls)} - {"other"}
        known = coerce_numbers(cls, {k: v for k, v in values.items() if k in own})
        return cls(**known, other={k: v for k, v in values.items() if k not in own})

    def to_dict(self) -> dict[str, Any]:
        """The flat mapping of ``LoraConfig`` fields (what a run file holds)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "other"}
        return {**out, **self.other}


def _default_target_modules(model: PreTrainedModel) -> list[str] | str:
    """The Llama-style projections the model has, else peft's ``"all-linear"``."""
    import torch

    leaf_names = {
        name.rsplit(".", 1)[-1]  # peft matches target_modules on the last name component
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    present = [name for name in DEFAULT_LORA_TARGET_MODULES if name in leaf_names]
    return present if present else "all-linear"  # peft's all-linear leaves the output head out


def make_lora_config(
    model: PreTrainedModel, config: LoraConfig | Mapping[str, Any] | None = None
) -> LoraConfig:
    """A ``LoraConfig`` for ``model`` from a config, :class:`LoraSettings`, a mapping of
    ``LoraConfig`` fields, or None.

    Fields a mapping leaves out take :class:`LoraSettings`' defaults (r=16, lora_alpha=32,
    lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", and the model's q/k/v/o/gate/up/down
    projections, or "all-linear" for a model without them).
    """
    from peft import LoraConfig

    # a LoraConfig the user built is taken as is: no default is applied over it
    if isinstance(config, LoraConfig):
        return config
    if config is not None and not isinstance(config, Mapping | LoraSettings):
        raise TypeError(
            f"LoRA config must be a peft LoraConfig, LoraSettings, a mapping of its fields or "
            f"None, got {type(config).__name__}"
        )
    settings = config if isinstance(config, LoraSettings) else \
        LoraSettings.from_dict(config or {})
    options = settings.to_dict()
    # peft's per-architecture default adapts fewer projections (q and v for Llama)
    if options.get("target_modules") is None:
        options["target_modules"] = _default_target_modules(model)
    # peft's LoraConfig.__post_init__ checks the combinations (e.g. layers_to_transform with a
    # str target_modules)
    return LoraConfig(**options)


@contextmanager
def quiet_peft_wrapping() -> Iterator[None]:
    """Within the block, peft's read of transformers' deprecated ``is_gradient_checkpointing``
    alias (peft 0.21 on transformers 5.x, when it wraps a model) warns no more: a
    ``FutureWarning`` about code inside peft, which no user setting changes."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        yield


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
    with quiet_peft_wrapping():
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
    # the base weights are the reference: no second copy in memory (ALGORITHMS.md §3)
    with model.disable_adapter():
        yield model
