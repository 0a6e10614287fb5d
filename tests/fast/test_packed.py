"""The padding-free forward of ``sequence_logprobs`` (mtgrpo.fast.packed): every real token runs
once (each distinct prompt once), and the log-probs, entropies and gradients equal those of the
model's own padded forward (``pack=False, share_prompts=False``)."""

from __future__ import annotations

import pytest
import torch
import transformers

import logprob_helpers
from mtgrpo.fast import (
    distinct_prompts,
    enable_activation_checkpointing,
    packed_layout,
    packed_mismatch,
)
from mtgrpo.policy import sequence_logprobs
from mtgrpo.policy.logprobs import position_ids_from_attention_mask, resolve_logprob_path
from tolerance import assert_close_f32

VOCAB, PROMPT, COMPLETION = 61, 6, 7


def tiny(family: str, attn: str = "sdpa", kv_heads: int = 2) -> torch.nn.Module:
    torch.manual_seed(3)
    sizes = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": kv_heads}
    configs = {
        "llama": lambda: transformers.LlamaConfig(**sizes),
        "qwen2": lambda: transformers.Qwen2Config(**sizes),
        "qwen3": lambda: transformers.Qwen3Config(head_dim=16, **sizes),
        "mistral": lambda: transformers.MistralConfig(sliding_window=None, **sizes),
    }
    config = configs[family]()
    config._attn_implementation = attn
    return transformers.AutoModelForCausalLM.from_config(config)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three prompts (0, 2 and 4 left pads) shared by three rows each, rows interleaved, plus
    one row with a prompt of its own; completions of 7, 5, 1 and 0 tokens (an all-padding row,
    as a masked-out truncated completion leaves it)."""
    generator = torch.Generator().manual_seed(5)
    prompts = torch.randint(1, VOCAB, (4, PROMPT), generator=generator)
    prompt_mask = torch.ones(4, PROMPT, dtype=torch.long)
    prompt_mask[1, :2] = 0
    prompt_mask[2, :4] = 0
    prompt_mask[3, :1] = 0
    of_row = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 3])
    completions = torch.randint(1, VOCAB, (len(of_row), COMPLETION), generator=generator)
    completion_mask = torch.ones_like(completions)
    completion_mask[1, 5:] = 0
    completion_mask[5, 1:] = 0
    completion_mask[7, :] = 0
    completion_mask[9, 3:] = 0
    input_ids = torch.cat([prompts[of_row] * prompt_mask[of_row], completions * completion_mask], 1)
    return input_ids, torch.cat([prompt_mask[of_row], completion_mask], 1)


def scores_and_grads(model, input_ids, mask, *, pack: bool):
    return logprob_helpers.scores_and_grads(
        model, input_ids, mask, COMPLETION, pack=pack, share_prompts=False
    )


def mlp_tokens(model) -> tuple[list[int], object]:
    """Tokens per call of the first layer's MLP, and the hook's handle."""
    seen: list[int] = []
    handle = model.model.layers[0].mlp.register_forward_hook(
        lambda module, args, output: seen.append(args[0].shape[:-1].numel())
    )
    return seen, handle


def assert_same(packed, padded) -> None:
    """Equal up to float32 rounding (tests/tolerance.py): the packed forward runs other
    attention kernels (one varlen sequence against padded rows with a mask) and other matmul
    shapes through two layers, then sums each gradient over the tokens in another order.
    Log-probs and entropies are near 4 and gradient entries below 1; a token attending to the
    wrong one, a position off by one or a lost row moves them by more than 1e-2."""
    assert_close_f32(packed[0], padded[0], ulps=32)
    assert_close_f32(packed[1], padded[1], ulps=32)
    assert packed[2].keys() == padded[2].keys()
    for name, grad in padded[2].items():
        assert_close_f32(packed[2][name], grad, ulps=64, msg=name)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_forward_equals_the_padded_forward(family: str, attn: str) -> None:
    model = tiny(family, attn)
    assert resolve_logprob_path(model).packed
    input_ids, mask = batch()
    padded = scores_and_grads(model, input_ids, mask, pack=False)
    seen, handle = mlp_tokens(model)
    packed = scores_and_grads(model, input_ids, mask, pack=True)
    handle.remove()
    # the four distinct prompts once (6 + 4 + 2 + 5 tokens), then the completions' real tokens
    assert seen == [6 + 4 + 2 + 5 + int(mask[:, PROMPT:].sum())]
    assert_same(packed, padded)
    assert bool((packed[0][mask[:, PROMPT:] == 0] == 0).all())
    assert bool((packed[0][mask[:, PROMPT:] == 1] != 0).all())


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_fused_projections_equal_the_padded_forward(
    family: str, attn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mtgrpo.fast import packed as packed_module

    model = tiny(family, attn)  # no hooks: the layers' projections may run fused
    calls: list[int] = []
    original = packed_module._fused_attention_states
    monkeypatch.setattr(packed_module, "_fused_attention_states",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    input_ids, mask = batch()
    padded = scores_and_grads(model, input_ids, mask, pack=False)
    packed = scores_and_grads(model, input_ids, mask, pack=True)
    assert_same(packed, padded)
    # one product for q | k | v per layer (Qwen2's biases concatenated too); Qwen3's
    # per-head q/k norms sit between the projections and the rotary: projections one by one
    layers = model.config.num_hidden_layers
    assert len(calls) == (0 if family == "qwen3" else layers)


def test_a_fused_product_keeps_no_copy_of_the_weights_for_the_backward_pass() -> None:
    """The concatenated weights are a copy: kept for the backward pass of every layer they
    would cost most of a layer's weights per layer; with ``recat`` only the input is kept (the
    copy is made again in the backward pass), and the gradients are the same."""
    from mtgrpo.fast.packed import _linear_by_parts
    from mtgrpo.policy.memory_budget import saved_bytes

    torch.manual_seed(0)
    parts = (torch.nn.Linear(8, 6, bias=True), torch.nn.Linear(8, 4, bias=True))
    weights = {p.untyped_storage().data_ptr() for part in parts for p in part.parameters()}
    x = torch.randn(5, 8, requires_grad=True)
    kept = saved_bytes(lambda: _linear_by_parts(x, parts, recat=False), weights)
    recat = saved_bytes(lambda: _linear_by_parts(x, parts, recat=True), weights)
    assert kept == 5 * 8 * 4 + 10 * 8 * 4  # the input and the [10, 8] copy of the weights
    assert recat == 5 * 8 * 4  # the input only
    for autocast in (False, True):  # bf16 autocast: the same casts as autograd's path
        grads = []
        for flag in (False, True):
            x.grad = None
            for part in parts:
                part.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = _linear_by_parts(x, parts, recat=flag)
            assert out.dtype == (torch.bfloat16 if autocast else torch.float32)
            out.float().pow(2).sum().backward()
            grads.append([x.grad.clone(), *(p.grad.clone() for part in parts
                                            for p in part.parameters())])
        for a, b in zip(*grads, strict=True):
            assert a.dtype == torch.float32
            torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same products and casts


@pytest.mark.parametrize("kv_heads", [1, 4])  # multi-query; one key/value head per query head
def test_packed_forward_equals_the_padded_forward_for_other_head_groupings(kv_heads: int) -> None:
    model = tiny("llama", kv_heads=kv_heads)
    input_ids, mask = batch()
    assert_same(scores_and_grads(model, input_ids, mask, pack=True),
                scores_and_grads(model, input_ids, mask, pack=False))


def test_gathers_off_the_cpu_use_advanced_indexing() -> None:
    from mtgrpo.fast.packed import _gather

    states = torch.arange(24.0).view(2, 4, 3)
    index = torch.tensor([3, 0, 3])
    assert torch.equal(_gather(states, 1, index), states[:, index])
    assert torch.equal(_gather(states, 0, index[:2] % 2), states[[1, 0]])
    on_meta = _gather(states.to("meta"), 1, index.to("meta"))  # the non-CPU branch
    assert on_meta.shape == (2, 3, 3)


def test_packed_forward_under_lora_applies_the_adapter() -> None:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny("llama"), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj", "lm_head"],
        init_lora_weights=False,
    ))
    assert resolve_logprob_path(model).packed
    input_ids, mask = batch()
    padded = scores_and_grads(model, input_ids, mask, pack=False)
    packed = scores_and_grads(model, input_ids, mask, pack=True)
    assert_same(packed, padded)
    assert any("lora" in name for name in packed[2])
    with model.disable_adapter(), torch.no_grad():
        base = sequence_logprobs(model, input_ids, mask, COMPLETION, temperature=0.7).logps
    assert not torch.allclose(base, packed[0], atol=1e-3)


def test_attention_groups_cover_every_token_once() -> None:
    input_ids, mask = batch()
    first, inverse = distinct_prompts(input_ids, mask, PROMPT)
    layout = packed_layout(input_ids, mask, position_ids_from_attention_mask(mask), COMPLETION,
                           first, inverse)
    assert layout is not None
    served = torch.cat([g.query_index.reshape(-1)[g.query_valid] for g in layout.groups])
    total = 17 + int(mask[:, PROMPT:].sum())
    assert sorted(served.tolist()) == list(range(total))
    slots = torch.cat([g.query_index.reshape(-1) for g in layout.groups])
    assert torch.equal(layout.query_slots, slots)
    key_slots = torch.cat([g.key_index.reshape(-1) for g in layout.groups])
    assert torch.equal(layout.key_slots, key_slots)
    valid = torch.cat([g.query_valid for g in layout.groups])
    assert bool(valid[layout.order].all())  # each token's output comes from a real query slot
    assert torch.equal(slots[layout.order], torch.arange(total))
    # each distinct prompt's tokens, its positions restarting at 0; then the completions'
    prompt_lengths = mask[first, :PROMPT].sum(1).tolist()
    assert sorted(prompt_lengths) == [2, 4, 5, 6]
    starts = [sum(prompt_lengths[:u]) for u in range(4)]
    assert layout.positions[:17].tolist() == [j for n in prompt_lengths for j in range(n)]
    assert layout.positions[17:24].tolist() == list(range(6, 13))  # row 0: 6 prompt tokens
    row0 = input_ids[0, PROMPT:]
    assert torch.equal(layout.token_ids[17:24], row0)
    # a predictor per scored token: the last prompt token for the first completion token
    assert layout.predictor.shape == (int(mask[:, PROMPT:].sum()),)
    assert layout.predictor[:7].tolist() == [starts[int(inverse[0])] + 5, *range(17, 23)]


def prefixed_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of :func:`batch` with prompts of 6, 5 and 4 real tokens (the fourth row's: 6)
    whose first 3 tokens are the same (a chat template's system turn, say), at 0, 1 and 2
    left pads."""
    input_ids, mask = batch()
    prompt_mask = torch.ones(len(mask), PROMPT, dtype=torch.long)
    prompt_mask[[1, 4, 7], :1] = 0
    prompt_mask[[2, 5, 8], :2] = 0
    input_ids[:, :PROMPT] = torch.where(prompt_mask.bool(), input_ids[:, :PROMPT].clamp(min=1), 0)
    for row in range(len(mask)):
        start = PROMPT - int(prompt_mask[row].sum())
        input_ids[row, start:start + 3] = torch.tensor([7, 11, 13])
    return input_ids, torch.cat([prompt_mask, mask[:, PROMPT:]], 1)


def assert_prefix_runs_once(model, input_ids, mask) -> None:
    """Packed equals padded, and the first layer's MLP sees the shared 3 tokens once, then the
    four prompts' own 3 + 2 + 1 + 3 tokens, then the completions."""
    padded = scores_and_grads(model, input_ids, mask, pack=False)
    seen, handle = mlp_tokens(model)
    packed = scores_and_grads(model, input_ids, mask, pack=True)
    handle.remove()
    assert seen == [3 + 3 + 2 + 1 + 3 + int(mask[:, PROMPT:].sum())]
    assert_same(packed, padded)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_prefix_all_prompts_share_runs_once(family: str, attn: str) -> None:
    assert_prefix_runs_once(tiny(family, attn), *prefixed_batch())


def test_every_row_its_own_prompt_shares_the_prefix_too() -> None:
    """A supervised batch: one row per prompt, each with its own completion."""
    input_ids, mask = prefixed_batch()
    assert_prefix_runs_once(tiny("llama"), input_ids[[0, 1, 2, 9]], mask[[0, 1, 2, 9]])


def test_the_shared_prefix_layout() -> None:
    input_ids, mask = prefixed_batch()
    positions = position_ids_from_attention_mask(mask)
    first, inverse = distinct_prompts(input_ids, mask, PROMPT)
    layout = packed_layout(input_ids, mask, positions, COMPLETION, first, inverse)
    assert layout is not None
    assert layout.prefix == 3
    lengths = mask[first, :PROMPT].sum(1).tolist()
    own = [n - 3 for n in lengths]
    assert layout.token_ids[:3].tolist() == [7, 11, 13]
    assert layout.positions[:3 + sum(own)].tolist() == [0, 1, 2] + [
        j for n in lengths for j in range(3, n)]
    starts = [3 + sum(own[:u]) for u in range(len(own))]
    for u, row in enumerate(first.tolist()):  # each prompt column's packed token
        real = input_ids[row, :PROMPT][mask[row, :PROMPT].bool()]
        index = layout.prompt_index[u][mask[row, :PROMPT].bool()]
        assert torch.equal(layout.token_ids[index], real)
        assert index.tolist() == [0, 1, 2, *range(starts[u], starts[u] + own[u])]
        assert bool((layout.prompt_index[u][~mask[row, :PROMPT].bool()] == 0).all())
    served = torch.cat([g.query_index.reshape(-1)[g.query_valid] for g in layout.groups])
    assert sorted(served.tolist()) == list(range(len(layout.token_ids)))
    # the first completion token of row 0 is predicted by its prompt's last token
    u = int(inverse[0])
    assert int(layout.predictor[0]) == starts[u] + own[u] - 1


@pytest.mark.parametrize(("prompts", "expected"), [
    ([[5, 6, 7, 8], [5, 6, 7, 9]], 3),
    ([[5, 6, 7], [5, 6, 7, 9]], 2),  # one prompt is the other's start: it keeps a token
    ([[5, 6, 7, 8], [4, 6, 7, 8]], 0),
    ([[5, 6, 7, 8]], 0),  # a single prompt: nothing to share
])
def test_shared_prefix_length(prompts: list[list[int]], expected: int) -> None:
    from mtgrpo.fast.packed import shared_prefix

    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    positions = position_ids_from_attention_mask(mask)
    assert shared_prefix(ids, positions, mask.sum(1)) == expected
    shifted = positions.clone()
    shifted[0] += 1  # the same tokens at other positions are not the same keys
    assert shared_prefix(ids, shifted, mask.sum(1)) == 0


def test_padding_that_is_not_trl_layout_runs_padded_with_the_same_result() -> None:
    model = tiny("llama")
    input_ids, mask = batch()
    holed = mask.clone()
    holed[0, PROMPT + 2] = 0  # a hole inside a completion: not right-padded
    first, inverse = distinct_prompts(input_ids, holed, PROMPT)
    positions = position_ids_from_attention_mask(holed)
    assert packed_layout(input_ids, holed, positions, COMPLETION, first, inverse) is None
    seen, handle = mlp_tokens(model)
    packed = scores_and_grads(model, input_ids, holed, pack=True)
    handle.remove()
    assert seen == [input_ids.numel()]  # the padded forward ran
    assert_same(packed, scores_and_grads(model, input_ids, holed, pack=False))


def test_models_the_packed_forward_cannot_serve_fall_back() -> None:
    model = tiny("llama")
    assert resolve_logprob_path(model).packed
    enable_activation_checkpointing(model)  # layer by layer: see test_policy_checkpointing
    assert resolve_logprob_path(model).packed
    qwen = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
        max_window_layers=1,  # layer 1 slides
    ))
    assert packed_mismatch(qwen.model) == "a layer uses sliding-window attention"
    assert "attn_implementation" in packed_mismatch(tiny("llama", "flex_attention").model)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2))
    assert not resolve_logprob_path(gpt2).packed
    assert "GPT2Model is not one of" in packed_mismatch(gpt2.transformer)


@pytest.mark.usefixtures("single_process_group")
def test_fsdp2_sharded_parameters_fall_back() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = tiny("llama")
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))  # the root: layer classes unchanged
    assert type(model.model.layers[0]) is transformers.models.llama.modeling_llama.LlamaDecoderLayer
    assert packed_mismatch(model.model) == "parameters are sharded DTensors (FSDP2)"


def test_queries_are_the_last_key_slots_of_their_segment() -> None:
    """Right-aligned groups: query slot ``i`` of a ``[S, Lq]`` group is key slot ``Lk - Lq + i``
    (a layer gathers query, key and value heads once, at the key slots), and every query slot,
    padding included, may attend at least one key (a row with none makes the softmax NaN)."""
    for input_ids, mask in (batch(), prefixed_batch()):
        first, inverse = distinct_prompts(input_ids, mask, PROMPT)
        layout = packed_layout(input_ids, mask, position_ids_from_attention_mask(mask),
                               COMPLETION, first, inverse)
        assert layout is not None
        for group in layout.groups:
            width_q, width_k = group.query_index.shape[1], group.key_index.shape[1]
            valid = group.query_valid.view(group.query_index.shape)
            last_keys = group.key_index[:, width_k - width_q:]
            assert torch.equal(last_keys[valid], group.query_index[valid])
            assert bool(group.mask.any(-1).all())


def test_packed_attention_runs_in_float32_under_bf16_autocast(monkeypatch) -> None:
    """On the CPU the packed attention of bfloat16 states (autocast) runs in float32, where
    torch's flash-attention backward is several times faster; the model's padded forward keeps
    bfloat16 attention under the same autocast. Both round every projection to bfloat16, so
    their log-probs and entropies agree to bfloat16 precision only: one bfloat16 eps (2**-7)
    at their magnitude (near 4.5: 0.035; observed 0.0015 on an Intel Xeon), while a wrong key
    or position moves a log-prob by more than 0.1."""
    model = tiny("llama")
    input_ids, mask = batch()
    dtypes: list[torch.dtype] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):  # the dtype the kernel ran in (autocast casts inside the call)
        output = sdpa(*args, **kwargs)
        dtypes.append(output.dtype)
        return output

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        packed = scores_and_grads(model, input_ids, mask, pack=True)
        assert set(dtypes) == {torch.float32}
        dtypes.clear()
        padded = scores_and_grads(model, input_ids, mask, pack=False)
        assert set(dtypes) == {torch.bfloat16}
    eps = torch.finfo(torch.bfloat16).eps
    for ours, theirs in zip(packed[:2], padded[:2], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0,
                                   atol=eps * max(1.0, float(theirs.abs().max())))
    assert packed[2].keys() == padded[2].keys()
