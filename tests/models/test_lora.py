"""LoRA wrapping and the adapter-off reference policy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from mtgrpo.models import DEFAULT_LORA_TARGET_MODULES, apply_lora, make_lora_config, reference_mode
from tolerance import assert_close_f32

INPUT_IDS = torch.tensor([[5, 17, 99, 200, 257, 3]])  # [1, 6]


def _trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_default_lora_targets_every_projection(tiny_model_dir: Path) -> None:
    model = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    assert isinstance(model, PeftModel)
    config = model.peft_config["default"]
    assert set(config.target_modules) == set(DEFAULT_LORA_TARGET_MODULES)
    assert (config.r, config.lora_alpha, config.lora_dropout) == (16, 32, 0.0)
    # A LoRA pair on Linear(d_in, d_out) has r * (d_in + d_out) weights. Per layer with H=64,
    # kv width 32, MLP 128: q,o 2*(64+64), k,v 2*(64+32), gate,up 2*(64+128), down (128+64);
    # times r=16 and 2 layers.
    per_layer = 2 * 128 + 2 * 96 + 2 * 192 + 192
    assert _trainable(model) == 16 * per_layer * 2
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)


def test_mapping_config_overrides_defaults(tiny_model_dir: Path) -> None:
    model = apply_lora(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]},
    )
    # r=4 on q_proj (64 -> 64) in 2 layers: 4 * (64 + 64) * 2
    assert _trainable(model) == 4 * 128 * 2


def test_lora_config_object_is_used_as_given(tiny_model_dir: Path) -> None:
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = LoraConfig(r=2, target_modules=["v_proj"], task_type="CAUSAL_LM")
    assert make_lora_config(base, config) is config
    # r=2 on v_proj (64 -> 32) in 2 layers
    assert _trainable(apply_lora(base, config)) == 2 * 96 * 2


def test_model_without_llama_projections_falls_back_to_all_linear() -> None:
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40))
    assert make_lora_config(model).target_modules == "all-linear"
    assert _trainable(apply_lora(model)) > 0


def test_bad_lora_configs_are_refused(tiny_model_dir: Path) -> None:
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(ValueError, match=r"unknown peft \(LoRA\) option\(s\): 'rank'"):
        apply_lora(base, {"rank": 8})
    with pytest.raises(TypeError, match="got list"):
        apply_lora(base, ["q_proj"])  # type: ignore[arg-type]
    wrapped = apply_lora(base)
    with pytest.raises(ValueError, match="already has peft adapters"):
        apply_lora(wrapped)


def test_reference_mode_computes_the_base_model(tiny_model_dir: Path) -> None:
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        base_logits = base(INPUT_IDS).logits
    policy = apply_lora(base)
    parameters_before = sum(p.numel() for p in policy.parameters())
    with torch.no_grad():
        # lora_B starts at zero (the adapter is the identity); move it so the policy differs
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5, generator=torch.Generator().manual_seed(0))
        policy_logits = policy(INPUT_IDS).logits
        with reference_mode(policy) as reference:
            reference_logits = reference(INPUT_IDS).logits
        after_logits = policy(INPUT_IDS).logits
    assert (policy_logits - base_logits).abs().max() > 1e-2
    # the disabled adapter calls the same base layers: equal up to float32 rounding (8 ulps of
    # logits below 1); the policy's logits differ by more than 1e-2 (above)
    assert_close_f32(reference_logits, base_logits, ulps=8)
    torch.testing.assert_close(after_logits, policy_logits, rtol=0, atol=0)
    # no second copy of the weights
    assert sum(p.numel() for p in policy.parameters()) == parameters_before


def test_reference_mode_needs_a_peft_model(tiny_model_dir: Path) -> None:
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with (
        pytest.raises(TypeError, match=r"needs a peft model.*keep a separate frozen reference"),
        reference_mode(base),  # type: ignore[arg-type]
    ):
        pass
