"""TRL's model arguments: ``ModelConfig`` and ``get_peft_config``, for scripts written for TRL.

``from mtgrpo import ModelConfig, get_peft_config`` takes the place of TRL's: the same fields
(TRL 1.16's, plus ``torch_dtype``, the name TRL's tutorials still use for ``dtype``), and
``get_peft_config`` builds the same ``peft.LoraConfig``. Run files describe the model in their
``model:`` section instead (:class:`mtgrpo.config.ModelConfig`, a different class).

Quantisation fields (``load_in_4bit``, ...) are recorded but not applied: load a quantised
model yourself and pass it to the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ModelConfig", "get_peft_config"]


@dataclass
class ModelConfig:
    """TRL's ``ModelConfig``: which model to load and, with ``use_peft``, its LoRA adapter."""

    # defaults: TRL 1.16's ModelConfig's; torch_dtype and trust_remote_code are not its fields
    model_name_or_path: str | None = None
    model_revision: str = "main"
    dtype: str | None = "float32"  # TRL's default
    torch_dtype: str | None = None  # the older name of dtype
    trust_remote_code: bool = False
    attn_implementation: str | None = None
    use_peft: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target_modules: list[str] | str | None = None
    lora_target_parameters: list[str] | None = None
    lora_modules_to_save: list[str] | None = None
    lora_task_type: str = "CAUSAL_LM"
    use_rslora: bool = False
    use_dora: bool = False
    load_in_8bit: bool = False
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "nf4"
    use_bnb_nested_quant: bool = False
    bnb_4bit_quant_storage: str | None = None

    def __post_init__(self) -> None:
        if self.torch_dtype is not None:
            self.dtype = self.torch_dtype
        if self.load_in_8bit and self.load_in_4bit:
            raise ValueError("load_in_8bit and load_in_4bit cannot both be true; pick one")
        if self.lora_r < 1:
            raise ValueError(f"lora_r={self.lora_r} must be a positive integer")


def get_peft_config(model_args: ModelConfig) -> Any:
    """The ``peft.LoraConfig`` of ``model_args`` (``None`` without ``use_peft``), as TRL's."""
    if not model_args.use_peft:
        return None
    from peft import LoraConfig

    extra: dict[str, Any] = {}
    # as TRL: peft gained target_parameters in 0.17, so it is passed only when asked for
    if model_args.lora_target_parameters is not None:
        extra["target_parameters"] = model_args.lora_target_parameters
    # as TRL's get_peft_config, bias="none" included
    return LoraConfig(
        task_type=model_args.lora_task_type, r=model_args.lora_r,
        target_modules=model_args.lora_target_modules, lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout, bias="none", use_rslora=model_args.use_rslora,
        use_dora=model_args.use_dora, modules_to_save=model_args.lora_modules_to_save, **extra,
    )
