"""Optimizer groups, learning-rate schedules and gradient clipping."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from mtgrpo.compat import GRPOConfig
from mtgrpo.policy import (
    build_optimizer,
    build_scheduler,
    clip_gradients,
    no_decay_parameter_names,
)
from tolerance import assert_close_f32


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, attention_bias=True,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def test_norms_and_biases_get_no_weight_decay() -> None:
    model = tiny_llama()
    exempt = no_decay_parameter_names(model)
    assert exempt == {
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.k_proj.bias",
        "model.layers.0.self_attn.v_proj.bias",
        "model.layers.0.self_attn.o_proj.bias",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.norm.weight",
    }
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-6)
    decay_group, no_decay_group = optimizer.param_groups
    assert decay_group["weight_decay"] == 0.1
    assert no_decay_group["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in no_decay_group["params"]} == exempt
    assert optimizer.defaults["betas"] == (0.9, 0.95)
    assert optimizer.defaults["eps"] == 1e-6


def test_only_trainable_parameters_are_optimized() -> None:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    optimizer = build_optimizer(model, lr=1e-4)
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert optimized == trainable
    assert len(trainable) == 4  # lora_A and lora_B of two projections


def test_weight_decay_is_applied_by_adamw() -> None:
    # One AdamW step with zero gradient: w <- w - lr * wd * w for decayed parameters only.
    layer = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))
    optimizer = build_optimizer(layer, lr=0.1, weight_decay=0.5)
    before = {n: p.detach().clone() for n, p in layer.named_parameters()}
    for p in layer.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    torch.testing.assert_close(layer[0].weight, before["0.weight"] * (1 - 0.1 * 0.5))
    torch.testing.assert_close(layer[0].bias, before["0.bias"])
    torch.testing.assert_close(layer[1].weight, before["1.weight"])


def _adamw_steps(optim: str, steps: int = 3) -> tuple[nn.Module, torch.optim.Optimizer]:
    """``steps`` AdamW steps (weight decay on) of the tiny Llama under fixed gradients."""
    model = tiny_llama()
    optimizer = build_optimizer(model, lr=1e-2, weight_decay=0.1, optim=optim)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()
    return model, optimizer


def test_the_default_optimizer_is_transformers_fused_adamw() -> None:
    # TRL's default (transformers' TrainingArguments.optim on torch >= 2.8): one fused kernel.
    assert GRPOConfig().optim == "adamw_torch_fused"
    optimizer = build_optimizer(tiny_llama(), lr=1e-3)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.defaults["fused"] is True
    assert not build_optimizer(tiny_llama(), lr=1e-3, optim="adamw_torch").defaults["fused"]


def test_fused_adamw_takes_the_unfused_update_and_state() -> None:
    # The same update up to rounding: after 3 steps of lr 1e-2 the weights (~0.02) differ by a
    # few roundings of the ~1e-2 step terms; a wrong beta, epsilon or decay moves them by ~1e-4.
    fused, fused_optimizer = _adamw_steps("adamw_torch_fused")
    plain, plain_optimizer = _adamw_steps("adamw_torch")
    assert fused_optimizer.defaults["fused"] is True
    for (name, a), b in zip(fused.named_parameters(), plain.parameters(), strict=True):
        assert_close_f32(a.detach(), b.detach(), ulps=16, msg=name)
    # A checkpoint of the unfused optimizer resumes in the fused one (a run saved before the
    # default changed): the next step matches the unfused optimizer's next step.
    # (copies: loading keeps the saved tensors, which both optimizers would then update)
    resumed = build_optimizer(plain, lr=1e-2, weight_decay=0.1)
    resumed.load_state_dict(copy.deepcopy(plain_optimizer.state_dict()))
    assert resumed.defaults["fused"] is True
    expected = {n: p.detach().clone() for n, p in plain.named_parameters()}
    reference = tiny_llama()
    reference.load_state_dict(plain.state_dict())
    reference_optimizer = build_optimizer(reference, lr=1e-2, weight_decay=0.1,
                                          optim="adamw_torch")
    reference_optimizer.load_state_dict(copy.deepcopy(plain_optimizer.state_dict()))
    generator = torch.Generator().manual_seed(2)
    for p, q in zip(plain.parameters(), reference.parameters(), strict=True):
        p.grad = torch.randn(p.shape, generator=generator)
        q.grad = p.grad.clone()
    resumed.step()
    reference_optimizer.step()
    for (name, a), b in zip(plain.named_parameters(), reference.parameters(), strict=True):
        assert not torch.equal(a.detach(), expected[name])  # the step moved it
        assert_close_f32(a.detach(), b.detach(), ulps=16, msg=name)


def test_fused_adamw_falls_back_where_its_kernel_cannot_run(caplog) -> None:
    model = nn.Linear(2, 2).to(torch.float64)
    with torch.device("meta"):
        meta = nn.Linear(2, 2)
    with caplog.at_level("WARNING", logger="mtgrpo.policy.optim"):
        optimizer = build_optimizer(meta, lr=1e-3)
    assert not optimizer.defaults["fused"]
    assert "device 'meta' has no fused kernel; using adamw_torch" in caplog.text
    assert build_optimizer(model, lr=1e-3).defaults["fused"] is True  # float64 is supported


def test_optimizer_errors() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="lr must be > 0"):
        build_optimizer(model, lr=0.0)
    model.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer(model, lr=1e-3)


def learning_rates(kind: str, total: int, **warmup: float) -> list[float]:
    optimizer = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0)
    scheduler = build_scheduler(optimizer, kind, total_steps=total, **warmup)
    rates = []
    for _ in range(total):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_schedules_follow_their_formulas() -> None:
    # constant with 2 warm-up steps: lr_t = min(t / 2, 1).
    assert learning_rates("constant", 5, warmup_steps=2) == [0.0, 0.5, 1.0, 1.0, 1.0]
    assert learning_rates("constant", 3) == [1.0, 1.0, 1.0]
    # linear: warm-up 1, then (total - t) / (total - warmup) = (5 - t) / 4.
    assert learning_rates("linear", 5, warmup_steps=1) == pytest.approx([0.0, 1.0, 0.75, 0.5, 0.25])
    # cosine, no warm-up: 0.5 (1 + cos(pi t / total)).
    expected = [0.5 * (1 + math.cos(math.pi * t / 4)) for t in range(4)]
    assert learning_rates("cosine", 4) == pytest.approx(expected)
    # warmup_ratio 0.25 of 10 steps rounds up to 3 warm-up steps.
    assert learning_rates("constant", 10, warmup_ratio=0.25)[:4] == pytest.approx(
        [0, 1 / 3, 2 / 3, 1]
    )


@pytest.mark.parametrize(
    ("kind", "kwargs", "message"),
    [
        ("exponential", {}, r"unknown learning-rate schedule 'exponential'; valid names"),
        ("linear", {"warmup_steps": 2, "warmup_ratio": 0.1}, "not both"),
        ("linear", {"warmup_steps": 11}, r"warmup_steps must be in \[0, total_steps=10\]"),
        ("linear", {"warmup_ratio": 1.5}, r"warmup_ratio must be in \[0, 1\]"),
    ],
)
def test_scheduler_errors(kind: str, kwargs: dict, message: str) -> None:
    optimizer = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0)
    with pytest.raises(ValueError, match=message):
        build_scheduler(optimizer, kind, total_steps=10, **kwargs)


def test_clip_gradients_returns_the_norm_before_clipping() -> None:
    # Gradients (3, 4) and (12,): global norm sqrt(9 + 16 + 144) = 13.
    first = nn.Parameter(torch.zeros(2))
    second = nn.Parameter(torch.zeros(1))
    frozen = nn.Parameter(torch.zeros(1), requires_grad=False)
    first.grad, second.grad = torch.tensor([3.0, 4.0]), torch.tensor([12.0])
    norm = clip_gradients([first, second, frozen], max_norm=6.5)
    assert float(norm) == pytest.approx(13.0)
    torch.testing.assert_close(first.grad, torch.tensor([1.5, 2.0]), rtol=1e-5, atol=0)
    torch.testing.assert_close(second.grad, torch.tensor([6.0]), rtol=1e-5, atol=0)
    # max_norm=None only measures.
    assert float(clip_gradients([first, second], None)) == pytest.approx(6.5, rel=1e-5)
    torch.testing.assert_close(second.grad, torch.tensor([6.0]), rtol=1e-5, atol=0)
    assert float(clip_gradients(nn.Linear(2, 2), 1.0)) == 0.0  # no gradients yet
    with pytest.raises(ValueError, match="max_norm must be > 0 or None"):
        clip_gradients([first], 0.0)
