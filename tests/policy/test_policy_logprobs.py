"""Log-probabilities: chunked scoring equals the naive full-logits computation.

The reference everywhere is ``log_softmax(float32(model(...).logits) / T).gather(...)`` on the
whole ``[N, T, V]`` logits, with generate's position ids for left-padded rows.

The two sides run different kernels (the head on a few gathered rows against the head on every
position; a chunked against a whole log-softmax), whose float32 roundings differ by CPU and
thread count, so they are compared in float32 ulps of the values' magnitude (tests/tolerance.py).
The bugs they guard against are far larger: a wrong temperature, position id, shifted target or
missed adapter moves a log-prob by more than 1e-3 (several tests below show it).
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from mtgrpo.fast import head_logprobs as logprobs_module
from mtgrpo.policy import (
    LOGIT_TRANSFORM_FIELDS,
    entropy_from_logits,
    position_ids_from_attention_mask,
    resolve_logprob_path,
    selective_log_softmax,
    sequence_logprobs,
)
from tolerance import assert_close_f32, f32_atol

VOCAB = 300
PROMPT_LEN = 6
COMPLETION_LEN = 5


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    return tiny_llama()


def padded_batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Four rows: left-padded prompts (0, 2, 5 pads) and right-padded completions (0, 1, 3 pads)."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (4, PROMPT_LEN + COMPLETION_LEN), generator=generator)
    mask = torch.ones_like(input_ids)
    for row, (prompt_pads, completion_pads) in enumerate([(0, 0), (2, 1), (5, 3), (1, 0)]):
        mask[row, :prompt_pads] = 0
        if completion_pads:
            mask[row, -completion_pads:] = 0
    return input_ids, mask


def naive_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    length: int,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Full [N, T, V] logits, then log-softmax and gather; zero at padded completion positions."""
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_attention_mask(attention_mask),
    ).logits
    log_probs = torch.log_softmax(logits[:, -length - 1 : -1].float() / temperature, dim=-1)
    logps = log_probs.gather(-1, input_ids[:, -length:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    scored = attention_mask[:, -length:].bool()
    return logps * scored, entropy * scored


# --- selective_log_softmax / entropy_from_logits -------------------------------------------


def test_selective_log_softmax_matches_a_plain_loop_on_random_shapes() -> None:
    generator = torch.Generator().manual_seed(3)
    for shape, temperature, chunk in [
        ((2, 3, 11), 1.0, 4),
        ((5, 7), 0.6, 3),
        ((1, 1, 1, 9), 2.0, 1),
    ]:
        logits = torch.randn(shape, generator=generator) * 3
        index = torch.randint(0, shape[-1], shape[:-1], generator=generator)
        got = selective_log_softmax(logits, index, temperature=temperature, chunk_size=chunk)
        flat_logits = logits.reshape(-1, shape[-1]).double().tolist()
        flat_index = index.reshape(-1).tolist()
        expected = []
        for row, target in zip(flat_logits, flat_index, strict=True):
            scaled = [value / temperature for value in row]
            top = max(scaled)
            log_norm = top + math.log(sum(math.exp(value - top) for value in scaled))
            expected.append(scaled[target] - log_norm)
        assert got.dtype == torch.float32
        assert got.shape == index.shape
        # float32 x / T and logsumexp against a float64 loop: a few roundings of values up to
        # ~20 in size; a wrong temperature or target is off by more than 0.1
        assert_close_f32(got.reshape(-1), torch.tensor(expected, dtype=torch.float32), ulps=8)


def test_selective_log_softmax_upcasts_bf16_before_the_softmax() -> None:
    generator = torch.Generator().manual_seed(4)
    logits = (torch.randn(6, 8, 50, generator=generator) * 4).to(torch.bfloat16)
    index = torch.randint(0, 50, (6, 8), generator=generator)
    got = selective_log_softmax(logits, index, temperature=0.7, chunk_size=5)
    # Reference: the same bf16 values, upcast once, softmax in float32 (x[y] - logsumexp x
    # and log_softmax(x)[y] differ by a few float32 roundings of values near -16).
    expected = torch.log_softmax(logits.float() / 0.7, -1).gather(-1, index[..., None])[..., 0]
    assert got.dtype == torch.float32
    assert_close_f32(got, expected, ulps=8)
    # A bf16 softmax (no upcast) is off by far more than that.
    in_bf16 = torch.log_softmax(logits / 0.7, -1).gather(-1, index[..., None])[..., 0]
    assert (in_bf16.float() - expected).abs().max() > 1e-2


def test_selective_log_softmax_gradient_matches_naive() -> None:
    generator = torch.Generator().manual_seed(5)
    base = torch.randn(3, 4, 20, generator=generator)
    index = torch.randint(0, 20, (3, 4), generator=generator)
    weights = torch.randn(3, 4, generator=generator)
    chunked = base.clone().requires_grad_(True)
    (
        selective_log_softmax(chunked, index, temperature=0.5, chunk_size=5) * weights
    ).sum().backward()
    naive = base.clone().requires_grad_(True)
    logps = torch.log_softmax(naive / 0.5, -1).gather(-1, index[..., None])[..., 0]
    (logps * weights).sum().backward()
    # (onehot - softmax) * w / T from two kernels: a few roundings; a wrong T scales it by 2x
    assert_close_f32(chunked.grad, naive.grad, ulps=8)


def test_entropy_from_logits_hand_values() -> None:
    # Row 0: two equal logits -> p = (1/2, 1/2), H = ln 2.
    # Row 1: logits (0, ln 3) -> p = (1/4, 3/4), H = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.562335.
    # Row 2: the same logits at T = 0.5 -> logits (0, 2 ln 3), p = (1/10, 9/10),
    #        H = -(0.1 ln 0.1 + 0.9 ln 0.9) = 0.325083.
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3)]])
    got = entropy_from_logits(logits, chunk_size=1)
    expected = torch.tensor([math.log(2), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))])
    # float32 evaluation of a two-term formula: a few roundings (the rows differ by > 0.1)
    assert_close_f32(got, expected, ulps=4)
    cooled = entropy_from_logits(logits[1:], temperature=0.5)
    assert_close_f32(
        cooled, torch.tensor([-(0.1 * math.log(0.1) + 0.9 * math.log(0.9))]), ulps=4
    )


def test_entropy_from_logits_matches_naive_on_random_shapes() -> None:
    logits = torch.randn(4, 3, 33, generator=torch.Generator().manual_seed(6)) * 2
    log_probs = torch.log_softmax(logits / 1.3, -1)
    expected = -(log_probs.exp() * log_probs).sum(-1)
    got = entropy_from_logits(logits, temperature=1.3, chunk_size=5)
    # two float32 reductions of 33 terms in different orders (entropies near 3)
    assert_close_f32(got, expected, ulps=16)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"chunk_size": 0}, "chunk_size must be a positive int"),
    ],
)
def test_scoring_options_are_checked(kwargs: dict, message: str) -> None:
    logits, index = torch.zeros(2, 5), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match=message):
        selective_log_softmax(logits, index, **kwargs)


def test_selective_log_softmax_rejects_a_misshaped_index() -> None:
    with pytest.raises(ValueError, match=r"needs index \(2, 3\), got \(2,\)"):
        selective_log_softmax(torch.zeros(2, 3, 5), torch.zeros(2, dtype=torch.long))


# --- sequence_logprobs on a tiny Llama -------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sequence_logprobs_equals_full_logits_with_left_padding(
    llama: LlamaForCausalLM, temperature: float
) -> None:
    input_ids, mask = padded_batch()
    out = sequence_logprobs(
        llama, input_ids, mask, COMPLETION_LEN,
        temperature=temperature, chunk_size=3, compute_entropy=True,
    )  # fmt: skip
    expected_logps, expected_entropy = naive_scores(
        llama, input_ids, mask, COMPLETION_LEN, temperature
    )
    assert out.path == "chunked_head"
    assert out.logps.shape == (4, COMPLETION_LEN)
    # The head's matmul on 3 gathered rows against all 44 positions, a 300-term log-softmax and
    # entropy in two shapes: tens of roundings of values near 6 (entropies of 5.7, log-probs
    # down to -6). 32 ulps of 5.7 is 2.2e-5; a bug (wrong T, position or target) is > 1e-3.
    assert_close_f32(out.logps, expected_logps, ulps=32)
    assert out.entropy is not None
    assert_close_f32(out.entropy, expected_entropy, ulps=32)
    # Padded completion positions are exactly 0 (row 2 ends with 3 pads).
    assert torch.all(out.logps[2, -3:] == 0)


def test_bf16_model_scores_in_float32() -> None:
    model = tiny_llama(seed=14).to(torch.bfloat16)
    input_ids, mask = padded_batch(seed=5)
    out = sequence_logprobs(model, input_ids, mask, COMPLETION_LEN, temperature=0.8, chunk_size=3)
    expected, _ = naive_scores(model, input_ids, mask, COMPLETION_LEN, 0.8)  # upcasts logits
    assert out.logps.dtype == torch.float32
    # The chunked head multiplies 3 gathered rows, the reference all 44 positions at once. On
    # CPUs with bf16 matrix units (avx512_bf16, AMX) the kernel and its float32 accumulation
    # order depend on the row count, so a logit z_j may round to the neighbouring bf16 value,
    # one bf16 ulp away (8 significant bits: 2**(e - 8) for |z_j| = m * 2**e, m in [0.5, 1)).
    # The log-prob z_t/T - logsumexp(z/T) then moves by at most (ulp(z_t) + sum_j p_j ulp(z_j))
    # / T, on top of the float32 log-softmax's 32 ulps as in the float32 model.
    positions = position_ids_from_attention_mask(mask)
    forward = model(input_ids=input_ids, attention_mask=mask, position_ids=positions)
    logits = forward.logits[:, -COMPLETION_LEN - 1 : -1].detach().float()
    _, exponent = torch.frexp(logits.abs())
    ulp = torch.ldexp(torch.ones_like(logits), exponent - 8)
    probs = torch.softmax(logits / 0.8, dim=-1)
    targets = input_ids[:, -COMPLETION_LEN:, None]
    bf16_flip = (ulp.gather(-1, targets).squeeze(-1) + (probs * ulp).sum(-1)) / 0.8
    bound = (f32_atol(expected, 32) + bf16_flip) * mask[:, -COMPLETION_LEN:]
    error = (out.logps - expected).detach().abs()
    assert torch.all(error <= bound), (error - bound).max()
    # The allowance still catches a missing upcast: log-probs near -5.7 rounded to bf16 (one
    # ulp there is 2**-5 = 0.031) land outside it at most positions.
    unupcast_error = (expected.detach().bfloat16().float() - expected.detach()).abs()
    caught = int((unupcast_error > bound).sum())
    scored = int(mask[:, -COMPLETION_LEN:].sum())
    assert caught >= scored // 2, (caught, scored, bound)


def test_position_ids_follow_generate_for_absolute_position_embeddings() -> None:
    """GPT-2 adds learned absolute position embeddings, so left padding shifts its outputs
    unless positions restart at the first real token (RoPE models like Llama only see
    relative positions, which is why this check needs GPT-2)."""
    torch.manual_seed(13)
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32)
    model = GPT2LMHeadModel(config).eval()
    input_ids, mask = padded_batch()
    out = sequence_logprobs(model, input_ids, mask, COMPLETION_LEN, temperature=1.0)
    assert out.path == "chunked_head"
    expected, _ = naive_scores(model, input_ids, mask, COMPLETION_LEN, 1.0)
    assert_close_f32(out.logps, expected, ulps=32)  # head on gathered rows vs all (see above)
    # Naive positions 0..T-1 ignore the padding: wrong for padded rows, right for row 0.
    default_positions = model(input_ids=input_ids, attention_mask=mask).logits
    wrong = torch.log_softmax(default_positions[:, -COMPLETION_LEN - 1 : -1], -1)
    wrong = wrong.gather(-1, input_ids[:, -COMPLETION_LEN:, None])[..., 0]
    assert (out.logps[2, :2] - wrong[2, :2]).abs().max() > 1e-3
    assert_close_f32(out.logps[0], wrong[0], ulps=32)


def test_sequence_logprobs_matches_the_sampling_distribution_of_generate(
    llama: LlamaForCausalLM,
) -> None:
    prompts = torch.tensor([[0, 0, 0, 11, 12, 13], [21, 22, 23, 24, 25, 26]])
    prompt_mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    temperature, new_tokens = 0.8, 4
    torch.manual_seed(7)
    generated = llama.generate(
        input_ids=prompts, attention_mask=prompt_mask, do_sample=True, temperature=temperature,
        top_k=0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        output_logits=True, return_dict_in_generate=True, pad_token_id=0, eos_token_id=None,
    )  # fmt: skip
    completion = generated.sequences[:, -new_tokens:]
    raw_logits = torch.stack(generated.logits, dim=1).float()  # [N, L, V], before the warpers
    sampled = torch.log_softmax(raw_logits / temperature, -1).gather(-1, completion[..., None])
    attention_mask = torch.cat([prompt_mask, torch.ones_like(completion)], 1)
    out = sequence_logprobs(
        llama, generated.sequences, attention_mask, new_tokens, temperature=temperature
    )
    # KV-cached decoding and one full forward differ only by float32 rounding: other attention
    # shapes and matmul blockings through two layers (values near 6); sampling from the wrong
    # temperature or position would be off by > 1e-2.
    assert_close_f32(out.logps, sampled[..., 0], ulps=64)


@pytest.mark.parametrize("keep_bytes", [0, None], ids=["recomputed", "kept"])
def test_sequence_logprobs_gradient_equals_naive(
    llama: LlamaForCausalLM, keep_bytes: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if keep_bytes is not None:  # 0: every chunk is checkpointed and recomputed
        monkeypatch.setattr(logprobs_module, "KEEP_LOGITS_BYTES", keep_bytes)
    input_ids, mask = padded_batch(seed=2)
    weights = torch.randn(4, COMPLETION_LEN, generator=torch.Generator().manual_seed(8))
    llama.zero_grad()
    out = sequence_logprobs(
        llama, input_ids, mask, COMPLETION_LEN, temperature=0.9, chunk_size=2, compute_entropy=True
    )
    ((out.logps * weights).sum() + out.entropy.sum()).backward()
    chunked = {name: p.grad.clone() for name, p in llama.named_parameters()}
    llama.zero_grad()
    logps, entropy = naive_scores(llama, input_ids, mask, COMPLETION_LEN, 0.9)
    ((logps * weights).sum() + entropy.sum()).backward()
    # Gradients summed over 16 positions in another order, through recomputed (checkpointed)
    # or kept chunks: tens of roundings of the largest entry; a missed chunk or a wrong
    # weight changes whole rows of a gradient by more than 1e-2 of its size.
    for name, param in llama.named_parameters():
        assert_close_f32(chunked[name], param.grad, ulps=64, msg=name)
    llama.zero_grad()


@pytest.mark.parametrize("path", ["chunked_head", "model_forward"])
@pytest.mark.parametrize("keep_bytes", [0, None], ids=["recomputed", "kept"])
def test_a_logged_entropy_has_no_graph_and_leaves_the_gradient_unchanged(
    llama: LlamaForCausalLM, keep_bytes: int | None, path: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``entropy_grad=False`` (the entropy only logged or masked): the same values, no graph
    through it, and the log-probs' gradient exactly as with the graph."""
    if keep_bytes is not None:
        monkeypatch.setattr(logprobs_module, "KEEP_LOGITS_BYTES", keep_bytes)
    input_ids, mask = padded_batch(seed=3)
    weights = torch.randn(4, COMPLETION_LEN, generator=torch.Generator().manual_seed(9))
    grads = []
    entropies = []
    for entropy_grad in (True, False):
        llama.zero_grad()
        out = sequence_logprobs(llama, input_ids, mask, COMPLETION_LEN, temperature=0.9,
                                chunk_size=2, compute_entropy=True, entropy_grad=entropy_grad,
                                path=path)
        assert out.entropy.requires_grad is entropy_grad
        (out.logps * weights).sum().backward()
        grads.append({name: p.grad.clone() for name, p in llama.named_parameters()})
        entropies.append(out.entropy.detach())
    assert torch.equal(entropies[0], entropies[1])
    for name in grads[0]:
        assert torch.equal(grads[0][name], grads[1][name]), name
    llama.zero_grad()


@pytest.mark.parametrize(("keep_bytes", "recomputed"),
                         [(None, False), (16 * VOCAB * 4, False), (16 * VOCAB * 4 - 1, True)])
def test_chunks_are_recomputed_only_when_their_logits_exceed_the_budget(
    llama: LlamaForCausalLM, keep_bytes: int | None, recomputed: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The head runs once per chunk in the forward pass, and once more in the backward pass
    when the float32 logits of all 16 scored positions exceed KEEP_LOGITS_BYTES."""
    if keep_bytes is not None:
        monkeypatch.setattr(logprobs_module, "KEEP_LOGITS_BYTES", keep_bytes)
    input_ids, mask = padded_batch()
    calls: list[int] = []
    hook = llama.lm_head.register_forward_hook(lambda m, i, o: calls.append(o.shape[0]))
    try:
        out = sequence_logprobs(llama, input_ids, mask, COMPLETION_LEN, temperature=1.0,
                                chunk_size=4)
        assert calls == [4] * 4
        out.logps.sum().backward()
    finally:
        hook.remove()
        llama.zero_grad()
    assert calls == [4] * (8 if recomputed else 4)


def test_head_sees_at_most_chunk_size_scored_positions(llama: LlamaForCausalLM) -> None:
    """No [N, L, V] logits: the head runs on <= chunk_size positions, padding excluded."""
    input_ids, mask = padded_batch()
    seen: list[tuple[int, ...]] = []
    hook = llama.lm_head.register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape)))
    try:
        sequence_logprobs(llama, input_ids, mask, COMPLETION_LEN, temperature=1.0, chunk_size=4)
    finally:
        hook.remove()
    scored = int(mask[:, -COMPLETION_LEN:].sum())  # 20 positions - 4 pads = 16
    assert scored == 16
    assert seen == [(4, VOCAB)] * 4


def test_forced_model_forward_path_agrees_with_the_chunked_head(llama: LlamaForCausalLM) -> None:
    input_ids, mask = padded_batch()
    chunked = sequence_logprobs(llama, input_ids, mask, 3, temperature=0.8, compute_entropy=True)
    forward = sequence_logprobs(
        llama, input_ids, mask, 3, temperature=0.8, compute_entropy=True, path="model_forward"
    )
    assert forward.path == "model_forward"
    # the model's own head on every position against the chunked head (as above)
    assert_close_f32(forward.logps, chunked.logps, ulps=32)
    assert_close_f32(forward.entropy, chunked.entropy, ulps=32)


def test_all_padding_completions_give_a_differentiable_zero(llama: LlamaForCausalLM) -> None:
    input_ids, mask = padded_batch()
    mask[:, -COMPLETION_LEN:] = 0
    llama.zero_grad()
    out = sequence_logprobs(llama, input_ids, mask, COMPLETION_LEN, temperature=1.0)
    assert torch.all(out.logps == 0)
    out.logps.sum().backward()  # must not raise "does not require grad"
    assert all(float(p.grad.abs().max()) == 0 for p in llama.parameters() if p.grad is not None)
    llama.zero_grad()


def test_no_grad_scoring_builds_no_graph(llama: LlamaForCausalLM) -> None:
    input_ids, mask = padded_batch()
    with torch.no_grad():
        out = sequence_logprobs(llama, input_ids, mask, COMPLETION_LEN, temperature=1.0)
    assert not out.logps.requires_grad


@pytest.mark.parametrize(
    ("length", "error", "message"),
    [
        (0, ValueError, "completion_length must be between 1 and T - 1 = 10"),
        (11, ValueError, "completion_length must be between 1 and T - 1 = 10"),
        (2.0, TypeError, "completion_length must be an int"),
    ],
)
def test_sequence_logprobs_checks_completion_length(
    llama: LlamaForCausalLM, length: object, error: type, message: str
) -> None:
    input_ids, mask = padded_batch()
    with pytest.raises(error, match=message):
        sequence_logprobs(llama, input_ids, mask, length, temperature=1.0)  # type: ignore[arg-type]


def test_sequence_logprobs_checks_shapes_and_path(llama: LlamaForCausalLM) -> None:
    input_ids, mask = padded_batch()
    with pytest.raises(ValueError, match="must both be"):
        sequence_logprobs(llama, input_ids, mask[:, 1:], 2, temperature=1.0)
    with pytest.raises(ValueError, match="unknown logprob path 'fused'"):
        sequence_logprobs(llama, input_ids, mask, 2, temperature=1.0, path="fused")  # type: ignore[arg-type]


# --- PEFT ---------------------------------------------------------------------------------


def test_lora_adapters_on_backbone_and_head_are_applied() -> None:
    from peft import LoraConfig, get_peft_model

    base_reference = tiny_llama(seed=11)
    input_ids, mask = padded_batch(seed=3)
    base_logps, _ = naive_scores(base_reference, input_ids, mask, COMPLETION_LEN, 1.0)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"], init_lora_weights=False
    )
    model = get_peft_model(tiny_llama(seed=11), config)
    assert resolve_logprob_path(model).path == "chunked_head"
    out = sequence_logprobs(model, input_ids, mask, COMPLETION_LEN, temperature=1.0)
    expected, _ = naive_scores(model, input_ids, mask, COMPLETION_LEN, 1.0)
    assert_close_f32(out.logps, expected, ulps=32)  # chunked head vs full logits (see top)
    # The adapter (random B, not the zero init) really changes the scores ...
    assert (out.logps - base_logps).abs().max() > 1e-3
    # ... and disabling it gives the base model back: the reference policy of a LoRA run.
    with model.disable_adapter():
        reference = sequence_logprobs(model, input_ids, mask, COMPLETION_LEN, temperature=1.0)
    assert_close_f32(reference.logps, base_logps, ulps=32)
    # Gradients reach the LoRA weights of the head through the checkpointed chunks.
    out = sequence_logprobs(model, input_ids, mask, COMPLETION_LEN, temperature=1.0, chunk_size=3)
    out.logps.sum().backward()
    head_lora = [p for n, p in model.named_parameters() if "lm_head.lora_B" in n]
    assert head_lora
    assert float(head_lora[0].grad.abs().sum()) > 0


def test_prompt_learning_peft_falls_back_to_the_model_forward() -> None:
    from peft import PromptTuningConfig, get_peft_model

    model = get_peft_model(
        tiny_llama(), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2)
    )
    route = resolve_logprob_path(model)
    assert route.path == "model_forward"
    assert "prompt-learning" in route.reason


# --- distributed wrappers -----------------------------------------------------------------


@pytest.mark.usefixtures("single_process_group")
def test_ddp_is_called_so_its_hooks_run_and_the_chunked_path_is_kept() -> None:
    from torch.nn.parallel import DistributedDataParallel

    model = tiny_llama(seed=15)
    previous_forward = model.forward  # set on the instance, as accelerate's autocast wrapper is
    model.forward = previous_forward
    ddp = DistributedDataParallel(model)
    calls: list[int] = []
    ddp.register_forward_pre_hook(lambda module, args: calls.append(1))
    route = resolve_logprob_path(ddp)
    assert route.path == "chunked_head"
    assert "DDP forward" in route.reason
    input_ids, mask = padded_batch(seed=6)
    out = sequence_logprobs(ddp, input_ids, mask, COMPLETION_LEN, temperature=0.8, chunk_size=3)
    assert calls == [1]  # through DDP's forward, where its gradient-sync bookkeeping lives
    assert model.__dict__["forward"] is previous_forward  # the instance forward is restored
    out.logps.sum().backward()
    through_ddp = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    expected, _ = naive_scores(model, input_ids, mask, COMPLETION_LEN, 0.8)
    assert_close_f32(out.logps, expected, ulps=32)  # chunked head vs full logits (see top)
    expected.sum().backward()
    for name, param in model.named_parameters():  # as in ..._gradient_equals_naive
        assert_close_f32(through_ddp[name], param.grad, ulps=64, msg=name)
    forced = sequence_logprobs(
        ddp, input_ids, mask, COMPLETION_LEN, temperature=0.8, path="model_forward"
    )
    assert_close_f32(forced.logps, expected, ulps=32)


# --- models whose forward transforms the logits ----------------------------------------------


def test_softcapped_model_takes_the_model_forward_path() -> None:
    torch.manual_seed(12)
    config = Gemma2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, final_logit_softcapping=0.5,
    )  # fmt: skip
    model = Gemma2ForCausalLM(config).eval()
    input_ids, mask = padded_batch(seed=4)
    route = resolve_logprob_path(model)
    assert route.path == "model_forward"
    assert "final_logit_softcapping=0.5" in route.reason
    out = sequence_logprobs(model, input_ids, mask, COMPLETION_LEN, temperature=0.9)
    assert out.path == "model_forward"
    expected, _ = naive_scores(model, input_ids, mask, COMPLETION_LEN, 0.9)
    assert_close_f32(out.logps, expected, ulps=32)  # the same forward, softmaxed in two shapes
    # The head alone (what the chunked path would use) gives different numbers here.
    hidden = model.model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=position_ids_from_attention_mask(mask),
    ).last_hidden_state[:, -COMPLETION_LEN - 1 : -1]
    uncapped = torch.log_softmax(model.lm_head(hidden) / 0.9, -1)
    uncapped = uncapped.gather(-1, input_ids[:, -COMPLETION_LEN:, None])[..., 0]
    assert ((uncapped - expected) * mask[:, -COMPLETION_LEN:]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="path='chunked_head' is not available"):
        sequence_logprobs(model, input_ids, mask, 2, temperature=1.0, path="chunked_head")


@pytest.mark.parametrize("field", LOGIT_TRANSFORM_FIELDS)
def test_every_logit_transform_field_selects_the_fallback(field: str) -> None:
    model = tiny_llama()
    setattr(model.config, field, 30)
    assert resolve_logprob_path(model).path == "model_forward"


@pytest.mark.parametrize(
    ("field", "value"), [("logit_scale", 1.0), ("final_logit_softcapping", None)]
)
def test_neutral_logit_fields_keep_the_chunked_head(field: str, value: object) -> None:
    model = tiny_llama()
    setattr(model.config, field, value)
    assert resolve_logprob_path(model).path == "chunked_head"
