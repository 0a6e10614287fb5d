"""Generation from a copy of the policy's weights in another dtype (mtgrpo.fast.replica):
the copy equals the policy (LoRA merged), follows it after every change, and in bfloat16 gives
log-probabilities within a stated distance of the float32 policy's."""

from __future__ import annotations

import pytest
import torch
import transformers

from mtgrpo.fast import replica as replica_module
from mtgrpo.fast.replica import WeightReplica
from mtgrpo.models import apply_lora
from mtgrpo.policy import sequence_logprobs
from mtgrpo.rollout import SamplingParams, StaticCacheBackend
from tolerance import assert_close_f32

PROMPTS = [[5, 9, 14, 3, 22, 8], [7, 21], [30, 31, 32, 33]]
BF16_EPS = torch.finfo(torch.bfloat16).eps  # 2**-7 = 7.8e-3


def _llama(seed: int = 0) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, eos_token_id=2, pad_token_id=0,
        max_position_embeddings=128,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return transformers.LlamaForCausalLM(config).eval()


def _lora(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    policy = apply_lora(model, {"r": 4, "lora_alpha": 8})
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:  # zero-initialised: make the adapter change the outputs
                param.normal_(std=0.3, generator=generator)
    return policy


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.tensor([[5, 9, 14, 3, 22, 8, 40]])
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def test_a_float32_copy_is_the_model() -> None:
    model = _llama()
    copy = WeightReplica(model, torch.float32)
    assert copy.module is not model
    assert torch.equal(_logits(copy.module), _logits(model))
    assert not any(p.requires_grad for p in copy.module.parameters())


def test_lora_is_merged_into_the_copy() -> None:
    policy = _lora(_llama())
    copy = WeightReplica(policy, torch.float32)
    assert not any("lora" in name for name, _ in copy.module.named_parameters())
    # W + s*B@A against x@W^T + s*(x@A^T)@B^T: the same value summed in another order
    # (64 ulps of the logits' magnitude; an adapter left out changes them by > 1e-1 here)
    assert_close_f32(_logits(copy.module), _logits(policy), ulps=64)
    with policy.disable_adapter():
        assert (_logits(copy.module) - _logits(policy)).abs().max() > 1e-2


def test_the_copy_follows_every_change_of_the_policy() -> None:
    policy = _lora(_llama())
    copy = WeightReplica(policy, torch.float32)
    assert not copy.stale()
    with torch.no_grad():  # an optimizer step: in place, on the trainable tensors only
        for name, param in policy.named_parameters():
            if "lora_A" in name:
                param.add_(0.05)
    assert copy.stale()
    copied = []
    original = replica_module._copy_weights
    replica_module._copy_weights = lambda pair: (copied.append(pair.name), original(pair))
    try:
        copy.refresh()
    finally:
        replica_module._copy_weights = original
    assert not copy.stale()
    assert_close_f32(_logits(copy.module), _logits(policy), ulps=64)
    # only the LoRA-wrapped projections are copied again, not the frozen rest
    assert copied
    assert all(name.endswith("_proj") for name in copied)


def test_other_adapters_are_refused() -> None:
    from peft import IA3Config, get_peft_model

    ia3 = get_peft_model(_llama(), IA3Config(task_type="CAUSAL_LM",
                                             target_modules=["k_proj", "v_proj", "down_proj"],
                                             feedforward_modules=["down_proj"]))
    with pytest.raises(ValueError, match="merges LoRA adapters only: set bf16 to false"):
        WeightReplica(ia3, torch.bfloat16)


def test_the_backend_generates_from_a_bfloat16_copy_that_stays_current() -> None:
    policy = _lora(_llama())
    backend = StaticCacheBackend(policy, eos_token_ids=[2], dtype="bfloat16")
    assert backend.dtype is torch.bfloat16
    served = backend.engine._lm
    assert served is not policy
    assert next(served.parameters()).dtype == torch.bfloat16
    params = SamplingParams(max_new_tokens=5, greedy=True)
    backend.generate(PROMPTS, params)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.mul_(-1.0)  # a large change, no update_weights call
    backend.generate(PROMPTS, params)
    merged = WeightReplica(policy, torch.float32).module
    for (name, got), want in zip(served.named_parameters(), merged.parameters(), strict=True):
        assert torch.equal(got, want.to(torch.bfloat16)), name
    backend.update_weights(policy, 7)
    assert backend.weights_version == 7


def test_bfloat16_log_probs_stay_close_to_the_float32_policy() -> None:
    """The distance the README states: sampled tokens' log-probs under the bfloat16 copy
    against the float32 policy's, on this random model."""
    policy = _llama()
    backend = StaticCacheBackend(policy, eos_token_ids=[2], dtype=torch.bfloat16)
    out = backend.generate(PROMPTS, SamplingParams(max_new_tokens=12, seed=0,
                                                  return_logprobs=True), num_samples=4)
    width = max(map(len, out.prompt_ids))
    length = max(map(len, out.completion_ids))
    rows = []
    for prompt, completion in zip(out.prompt_ids, out.completion_ids, strict=True):
        rows.append([0] * (width - len(prompt)) + prompt + completion
                    + [0] * (length - len(completion)))
    ids = torch.tensor(rows)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * (len(p) + len(c))
                         + [0] * (length - len(c))
                         for p, c in zip(out.prompt_ids, out.completion_ids, strict=True)])
    with torch.no_grad():
        reference = sequence_logprobs(policy, ids, mask, length, temperature=1.0).logps
    differences = []
    for row, logps in enumerate(out.logprobs):
        differences += [abs(a - float(b)) for a, b in zip(logps, reference[row], strict=False)]
    # bfloat16 keeps 8 bits: each weight and activation is off by up to eps/2 = 3.9e-3
    # relative. Measured here: mean 7e-4, max 2.4e-3. Stated bound: mean below eps, max below
    # 2 eps; another model of the same shape (a stale or wrong copy) differs by 0.085 on
    # average, ten times the bound.
    mean = sum(differences) / len(differences)
    assert mean < BF16_EPS, mean
    assert max(differences) < 2 * BF16_EPS, max(differences)


def test_a_policy_with_forward_hooks_is_not_copied() -> None:
    model = _llama()
    model.lm_head.register_forward_pre_hook(lambda module, inputs: inputs)
    with pytest.raises(ValueError, match=r"modules \['lm_head'\] have forward hooks"):
        WeightReplica(model, torch.bfloat16)
