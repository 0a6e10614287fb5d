"""The static-cache backend on the tiny models: token-for-token agreement with the "hf" backend,
log-probabilities equal to the trainer's, the sampling distribution, stopping, ordering,
seeding, weights updates, refusals, and the CUDA-graph bookkeeping (run on the CPU with a
stand-in capture)."""

from __future__ import annotations

import contextlib
import logging
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from scipy.stats import chisquare

import logprob_helpers
import mtgrpo.fast.static as static_module
from mtgrpo.fast.static import length_buckets
from mtgrpo.models import load_model, load_model_and_tokenizer
from mtgrpo.rollout import (
    BACKENDS,
    GenerationBackend,
    HFGenerateBackend,
    SamplingParams,
    StaticCacheBackend,
    make_backend,
)
from tolerance import assert_close_f32

EOS, PAD = 258, 256  # <|im_end|>, <|endoftext|>: the tiny model's generation_config EOS ids
# Prompts of different lengths (1 to 12 tokens), so a sub-batch needs left padding.
PROMPTS = [[71, 100, 107, 107, 110], [257, 116, 114, 100, 113, 11, 1, 3, 9, 11, 80, 12], [42],
           [12, 11, 12, 28]]  # fmt: skip
ARCHS = ["tiny_model_dir", "tiny_qwen2_model_dir"]
PATHS = ["llama_modules", "model_forward"]


def _model(path: Path, **options: object) -> torch.nn.Module:
    return load_model(path, for_training=False, **options)


def _greedy(max_new_tokens: int, **options: object) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, greedy=True, **options)


def _chi_square_pvalue(samples: list[int], probs: torch.Tensor) -> float:
    """Pearson's test of the sample counts against ``probs``, pooling tokens expected < 5 times."""
    n = len(samples)
    counts = Counter(samples)
    expected = (probs * n).tolist()
    big = [t for t, e in enumerate(expected) if e >= 5]
    observed = [counts[t] for t in big] + [n - sum(counts[t] for t in big)]
    wanted = [expected[t] for t in big] + [n - sum(expected[t] for t in big)]
    if wanted[-1] < 1e-9:
        observed, wanted = observed[:-1], wanted[:-1]
    return float(chisquare(observed, wanted).pvalue)


# -- agreement with the "hf" backend ---------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("decode_path", PATHS)
def test_greedy_equals_hf_batched_and_alone(
    arch: str, decode_path: str, request: pytest.FixtureRequest
) -> None:
    model = _model(request.getfixturevalue(arch))
    params = _greedy(24)
    expected = HFGenerateBackend(model, max_batch_size=None).generate(PROMPTS, params)
    batched = StaticCacheBackend(model, decode_path=decode_path).generate(PROMPTS, params)
    alone = StaticCacheBackend(model, max_batch_size=1, decode_path=decode_path).generate(
        PROMPTS, params
    )
    plain = StaticCacheBackend(model, decode_path=decode_path, transpose_weights=False)
    assert batched.completion_ids == expected.completion_ids == alone.completion_ids
    assert plain.generate(PROMPTS, params).completion_ids == expected.completion_ids
    assert batched.finished == expected.finished == alone.finished
    assert batched.prompt_ids == PROMPTS


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_hf_with_lora(arch: str, request: pytest.FixtureRequest) -> None:
    policy = logprob_helpers.active_lora(_model(request.getfixturevalue(arch)))
    params = _greedy(16)
    backend = make_backend("static", policy, None)
    assert backend.decoder_name == "llama_modules"  # LoRA layers sit inside the modules
    got = backend.generate(PROMPTS, params).completion_ids
    assert got == HFGenerateBackend(policy).generate(PROMPTS, params).completion_ids
    with policy.disable_adapter():  # the adapter changed the output, so it really applied
        assert backend.generate(PROMPTS, params).completion_ids != got


def test_greedy_equals_hf_with_eager_attention(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir, attn_implementation="eager")
    params = _greedy(16)
    for decode_path in PATHS:
        got = StaticCacheBackend(model, decode_path=decode_path).generate(PROMPTS, params)
        expected = HFGenerateBackend(model).generate(PROMPTS, params)
        assert got.completion_ids == expected.completion_ids


def _tiny_config(family: str) -> transformers.PretrainedConfig:
    common = {"vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 96, "max_position_embeddings": 128,
              "eos_token_id": 2, "pad_token_id": 0}  # fmt: skip
    configs = {
        "qwen3": lambda: transformers.Qwen3Config(num_key_value_heads=2, head_dim=16, **common),
        "mistral": lambda: transformers.MistralConfig(
            num_key_value_heads=2, sliding_window=None, **common
        ),
        "phi3": lambda: transformers.Phi3Config(num_key_value_heads=2, **common),
        "gpt2": lambda: transformers.GPT2Config(
            vocab_size=300, n_embd=64, n_layer=2, n_head=4, n_positions=128, eos_token_id=2,
            bos_token_id=1,
        ),
    }
    return configs[family]()


def _in_memory_model(family: str) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(_tiny_config(family)).eval()


@pytest.mark.parametrize(
    ("family", "decode_path"),
    [("qwen3", "llama_modules"), ("mistral", "llama_modules"), ("phi3", "model_forward"),
     ("gpt2", "model_forward")],
)
@pytest.mark.parametrize("num_samples", [1, 2])  # 2: each prompt's prefill is shared by 2 rows
def test_other_architectures_pick_their_decode_path_and_equal_hf(
    family: str, decode_path: str, num_samples: int
) -> None:
    model = _in_memory_model(family)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
    backend = StaticCacheBackend(model, eos_token_ids=[2])
    assert backend.decoder_name == decode_path
    params = _greedy(12)
    expected = HFGenerateBackend(model, eos_token_ids=[2]).generate(prompts, params, num_samples)
    got = backend.generate(prompts, params, num_samples)
    assert got.completion_ids == expected.completion_ids


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_module_decode_step_equals_the_model_forward_bit_for_bit(
    family: str, tiny_model_dir: Path, tiny_qwen2_model_dir: Path
) -> None:
    from mtgrpo.fast.static_decoders import LlamaModulesDecoder, ModelForwardDecoder

    paths = {"llama": tiny_model_dir, "qwen2": tiny_qwen2_model_dir}
    model = _model(paths[family]) if family in paths else _in_memory_model(family)
    logits = [_one_decode_step(model, decoder)
              for decoder in (ModelForwardDecoder(model), LlamaModulesDecoder(model))]
    assert logits[0].shape == (3, model.config.vocab_size)
    assert torch.equal(logits[0], logits[1])


def _one_decode_step(model: torch.nn.Module, decoder: object) -> torch.Tensor:
    """Prefill 3 prompts (one left-padded) into a fresh static cache with the model's forward
    (the same keys and values for every decoder), decode one token each."""
    from transformers import StaticCache

    from mtgrpo.fast.static_decoders import ModelForwardDecoder

    n, width, columns = 3, 5, 9
    input_ids = torch.randint(3, 250, (n, width), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones((n, width), dtype=torch.long)
    attention_mask[1, :2] = 0  # a left-padded row
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    visible = torch.full((n, columns), torch.finfo(torch.float32).min)
    visible[:, :width].masked_fill_(attention_mask.bool(), 0.0)
    visible[:, width] = 0.0
    tokens, positions = torch.tensor([[7], [8], [9]]), attention_mask.sum(-1, keepdim=True)
    with torch.inference_mode():
        cache = StaticCache(config=model.config, max_cache_len=columns)
        ModelForwardDecoder.prefill(decoder, cache, input_ids, attention_mask, position_ids)  # type: ignore[arg-type]
        return decoder.decode(  # type: ignore[attr-defined,no-any-return]
            cache, tokens, positions, visible[:, None, None, :], torch.tensor([width])
        )


def _prefilled(model: torch.nn.Module, prefill: Callable[..., torch.Tensor],
               shared: bool) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Prefill 4 prompts of 7, 4, 5 and 7 tokens whose first 3 are the same (prompts 0 and 3
    are equal), left-padded to 7 columns, into a fresh static cache of 9 columns; with
    ``shared``, the first three prompts for 5 rows (``source = [2, 0, 0, 1, 2]``). Returns the
    logits and the real columns of each layer's keys and values."""
    from transformers import StaticCache

    generator = torch.Generator().manual_seed(4)
    lengths = [7, 4, 5, 7]
    input_ids = torch.full((4, 7), PAD)
    attention_mask = torch.zeros((4, 7), dtype=torch.long)
    for row, n in enumerate(lengths):
        input_ids[row, 7 - n:] = torch.randint(3, 250, (n,), generator=generator)
        input_ids[row, 7 - n:7 - n + 3] = torch.tensor([17, 18, 19])
        attention_mask[row, 7 - n:] = 1
    input_ids[3] = input_ids[0]
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    source = torch.tensor([2, 0, 0, 1, 2])
    cache = StaticCache(config=model.config, max_cache_len=9)
    with torch.inference_mode():
        if shared:
            logits = prefill.__self__.prefill_shared(  # type: ignore[attr-defined]
                cache, input_ids[:3], attention_mask[:3], position_ids[:3], source)
            real = attention_mask[source].bool()
        else:
            logits = prefill(cache, input_ids, attention_mask, position_ids)
            real = attention_mask.bool()
    keys = [layer.keys[:, :, :7].transpose(1, 2)[real] for layer in cache.layers]
    values = [layer.values[:, :, :7].transpose(1, 2)[real] for layer in cache.layers]
    assert all(int(layer.cumulative_length) == 7 for layer in cache.layers)
    return logits, keys, values


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral", "llama+lora"])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
def test_packed_prefill_equals_the_model_forward(
    family: str, shared: bool, transposed: bool, tiny_model_dir: Path,
    tiny_qwen2_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mtgrpo.fast import packed as packed_module
    from mtgrpo.fast.static_decoders import LlamaModulesDecoder, ModelForwardDecoder

    paths = {"llama": tiny_model_dir, "llama+lora": tiny_model_dir, "qwen2": tiny_qwen2_model_dir}
    model = _model(paths[family]) if family in paths else _in_memory_model(family)
    lm = logprob_helpers.active_lora(model).get_base_model() if family.endswith("lora") else model
    forward, modules = ModelForwardDecoder(lm), LlamaModulesDecoder(lm)
    embedded: list[int] = []
    hook = lm.model.embed_tokens.register_forward_pre_hook(
        lambda _module, inputs: embedded.append(inputs[0].numel()))
    expected = _prefilled(lm, forward.prefill, shared)
    shares: list[int] = []
    original = packed_module.shared_prefix
    monkeypatch.setattr(packed_module, "shared_prefix",
                        lambda *a: shares.append(original(*a)) or shares[-1])
    with modules.transposed_weights() if transposed else contextlib.nullcontext():
        got = _prefilled(lm, modules.prefill, shared)
    hook.remove()
    # padded: 4 x 7 (or 3 x 7) tokens; packed: the 3 shared tokens once, then each distinct
    # prompt's own 4, 1 and 2 tokens (prompt 3 is prompt 0)
    assert embedded == [21 if shared else 28, 3 + 4 + 1 + 2]
    assert shares == [3]
    # one forward over other kernels and shapes (packed against padded rows, merged copies):
    # float32 rounding through every layer; a key written to the wrong row or column, a
    # position off by one or a prompt that misses the shared prefix moves them by far more
    assert_close_f32(got[0], expected[0], ulps=32)
    for got_states, expected_states in zip(got[1] + got[2], expected[1] + expected[2],
                                           strict=True):
        assert_close_f32(got_states, expected_states, ulps=32)


def test_packed_prefill_falls_back_where_the_packed_forward_cannot_serve(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mtgrpo.fast import static_decoders
    from mtgrpo.fast.static_decoders import LlamaModulesDecoder, ModelForwardDecoder

    model = _model(tiny_model_dir)
    expected = _prefilled(model, ModelForwardDecoder(model).prefill, True)
    with monkeypatch.context() as patched:  # a backbone the packed forward cannot serve
        patched.setattr(static_decoders, "packed_mismatch", lambda backbone: "a stand-in")
        embedded: list[int] = []
        hook = model.model.embed_tokens.register_forward_pre_hook(
            lambda _module, inputs: embedded.append(inputs[0].numel()))
        got = _prefilled(model, LlamaModulesDecoder(model).prefill, True)
        hook.remove()
    assert embedded == [21]  # the padded forward ran
    assert torch.equal(got[0], expected[0])
    ids = torch.tensor([[5, 6, 7], [5, 6, 8]], device="meta")
    ones = torch.ones_like(ids)  # off the CPU the forward prefills, before any packing work
    assert LlamaModulesDecoder(model)._packed_prefill(None, ids, ones, ones, None) is None


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral", "llama+lora"])
def test_decode_with_transposed_weights_equals_the_module_calls(
    family: str, tiny_model_dir: Path, tiny_qwen2_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mtgrpo.fast import static_decoders
    from mtgrpo.fast.static_decoders import LlamaModulesDecoder
    from mtgrpo.fast.transformers_compat import sdpa_packs_one_token_queries

    monkeypatch.setattr(static_decoders, "HEAD_BLOCK_ROWS", 7)  # several blocks, a short last

    paths = {"llama": tiny_model_dir, "llama+lora": tiny_model_dir, "qwen2": tiny_qwen2_model_dir}
    model = _model(paths[family]) if family in paths else _in_memory_model(family)
    lm = logprob_helpers.active_lora(model).get_base_model() if family.endswith("lora") else model
    decoder = LlamaModulesDecoder(lm)
    plain = _one_decode_step(lm, decoder)
    # the last layer's MLP output feeds only the logits, not the prefilled keys and values
    down = lm.model.layers[-1].mlp.down_proj
    down = getattr(down, "base_layer", down)  # the weight under a LoRA layer
    fused_steps: list[int] = []
    original_fused = decoder._decode_fused
    monkeypatch.setattr(decoder, "_decode_fused",
                        lambda *a: fused_steps.append(1) or original_fused(*a))
    with decoder.transposed_weights():
        transposed = _one_decode_step(lm, decoder)
        copied, blocks = set(decoder._transposed), decoder._head_blocks
        fused = dict(decoder._fused)
        with torch.no_grad():  # the step reads the copies taken on entry, not the modules
            down.weight.mul_(-1.0)
        frozen = _one_decode_step(lm, decoder)
        with torch.no_grad():
            down.weight.mul_(-1.0)
    assert decoder._transposed == {}  # dropped on exit
    assert decoder._fused == {}
    # one [in, q+k+v] and one [in, gate+up] copy per layer, and the decode steps used them
    attn, mlp = lm.model.layers[0].self_attn, lm.model.layers[0].mlp
    assert len(fused) == 2 * lm.config.num_hidden_layers
    heads, kv_heads = lm.config.num_attention_heads, lm.config.num_key_value_heads
    assert fused[attn][0].shape == (lm.config.hidden_size, (heads + 2 * kv_heads) * attn.head_dim)
    assert fused[mlp][0].shape == (lm.config.hidden_size, 2 * lm.config.intermediate_size)
    # both decode steps under the copies took the fused path, which calls torch's attention
    # itself where the step would (sdpa packing one-token queries: transformers 5.23 on); on
    # older releases the step goes through transformers' wrapper, unfused
    assert len(fused_steps) == (2 if sdpa_packs_one_token_queries() else 0)
    assert decoder._head_blocks == ()
    # x @ W.T from the module against x @ (W.T copied), and the head in row blocks: other
    # matmul kernels, float32 rounding through every layer of hidden states near 1 (logits
    # below 1); reading the negated projection instead of its copy would change every logit.
    assert_close_f32(transposed, plain, ulps=32)
    assert_close_f32(frozen, plain, ulps=32)
    layers = lm.config.num_hidden_layers
    # q, k, v, o, gate, up, down per layer (peft's LoRA layers merged); the float32 head is
    # multiplied in blocks of HEAD_BLOCK_ROWS rows of its own weight, not copied
    assert len(copied) == 7 * layers
    assert lm.lm_head not in copied
    assert [len(block) for block in blocks[:2]] == [7, 7]
    assert blocks[-1].shape[0] <= 7
    assert sum(len(block) for block in blocks) == lm.lm_head.weight.shape[0]
    assert all(block.data_ptr() >= lm.lm_head.weight.data_ptr() for block in blocks)
    if family.endswith("lora"):
        attn = lm.model.layers[0].self_attn
        assert attn.q_proj in copied
        assert type(attn.q_proj) is not torch.nn.Linear  # peft's LoRA layer


def test_transposed_weights_respect_the_size_cap_and_other_decoders(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(tiny_model_dir)
    params = _greedy(6)
    expected = StaticCacheBackend(model, transpose_weights=False).generate(PROMPTS, params)
    for cap, copied in ((0, False), (1 << 30, True)):  # "auto": copies only within the cap
        monkeypatch.setattr(static_module, "_AUTO_TRANSPOSE_MAX_BYTES", cap)
        backend = StaticCacheBackend(model)
        seen = _copies_per_decode_step(backend, monkeypatch)
        assert backend.generate(PROMPTS, params).completion_ids == expected.completion_ids
        assert (min(seen) > 0) is copied
    # the model's own forward has no copies to make: the option is a no-op there
    forward = StaticCacheBackend(model, decode_path="model_forward", transpose_weights=True)
    assert forward.generate(PROMPTS, params).completion_ids == expected.completion_ids


def _copies_per_decode_step(
    backend: StaticCacheBackend, monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """Record, at each decode step of ``backend``, how many weight copies its decoder holds."""
    decoder, seen = backend.engine._decoder, []
    original = decoder.decode

    def decode(*args: object, **options: object) -> torch.Tensor:
        seen.append(len(decoder._transposed))  # type: ignore[attr-defined]
        return original(*args, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(decoder, "decode", decode)
    return seen


def test_hooked_projections_are_called_under_transposed_weights(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    calls: list[int] = []
    mlp = model.model.layers[0].mlp
    handle = mlp.down_proj.register_forward_hook(lambda *_: calls.append(1))
    params = _greedy(6)
    got = StaticCacheBackend(model, transpose_weights=True).generate(PROMPTS, params)
    assert len(calls) >= 6  # the prefill and every decode step ran the hooked module
    handle.remove()
    expected = StaticCacheBackend(model, transpose_weights=False).generate(PROMPTS, params)
    assert got.completion_ids == expected.completion_ids


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_grouped_query_decode_attention_equals_sdpa_with_repeated_heads(kv_heads: int) -> None:
    from transformers.models.llama.modeling_llama import repeat_kv

    from mtgrpo.fast.static_decoders import _grouped_query_sdpa

    rows, heads, columns, dim = 5, 4, 11, 8
    generator = torch.Generator().manual_seed(kv_heads)
    query = torch.randn(rows, heads, 1, dim, generator=generator)
    keys, values = (torch.randn(rows, kv_heads, columns, dim, generator=generator) for _ in "kv")
    mask = torch.zeros(rows, 1, 1, columns)
    mask[1, ..., :3] = torch.finfo(torch.float32).min  # left padding
    mask[:, ..., -2:] = torch.finfo(torch.float32).min  # columns not written yet
    rep = heads // kv_heads
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, repeat_kv(keys, rep), repeat_kv(values, rep), attn_mask=mask, scale=0.3
    )  # [rows, heads, 1, dim]
    got = _grouped_query_sdpa(query, keys, values, mask, 0.3)
    assert got.shape == (rows, 1, heads * dim)
    # grouped queries against repeated key/value heads: the same softmax over 11 columns and
    # weighted sum in other shapes, a few roundings of values up to ~2; a query read against
    # the wrong key/value head is off by about 1
    assert_close_f32(got, expected.transpose(1, 2).reshape(rows, 1, -1), ulps=16)
    # the masked columns are not read: changing them changes nothing
    keys[:, :, -2:] += 100.0
    torch.testing.assert_close(_grouped_query_sdpa(query, keys, values, mask, 0.3), got,
                               rtol=0, atol=0)


# -- log-probabilities and the sampling distribution -----------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_logprobs_equal_the_trainers_sequence_logprobs(
    arch: str, request: pytest.FixtureRequest
) -> None:
    model = _model(request.getfixturevalue(arch))
    temperature = 0.7
    out = StaticCacheBackend(model, max_batch_size=3).generate(
        PROMPTS, SamplingParams(max_new_tokens=10, temperature=temperature, seed=4,
                                return_logprobs=True), num_samples=2,
    )  # fmt: skip
    assert out.logprobs is not None
    expected = logprob_helpers.trainer_layout_logprobs(model, out, PAD, temperature)
    # KV-cached decoding against one full forward: other attention and matmul shapes through
    # every layer (tests/tolerance.py). A log-prob at the wrong temperature or of the wrong
    # position is off by more than 1e-2.
    for row, logprobs in enumerate(out.logprobs):
        got = torch.tensor(logprobs, dtype=torch.float32)
        assert_close_f32(got, expected[row, : len(logprobs)], ulps=64)


def _first_token_probs(
    model: torch.nn.Module, prompt: list[int], temperature: float
) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].double()  # [V]
    return torch.softmax(logits / temperature, dim=-1)


def _restrict(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """softmax(logits / T) restricted to the top-k, then to the nucleus, renormalised (plain
    loop over tokens, most probable first)."""
    order = sorted(range(len(probs)), key=lambda t: -float(probs[t]))
    kept = order[:top_k] if top_k > 0 else order
    mass = sum(float(probs[t]) for t in kept)
    nucleus, mass_before = [], 0.0
    for token in kept:
        if mass_before >= top_p:
            break
        nucleus.append(token)
        mass_before += float(probs[token]) / mass
    restricted = torch.zeros_like(probs)
    restricted[nucleus] = probs[nucleus] / probs[nucleus].sum()
    return restricted


@pytest.mark.parametrize(("temperature", "top_k", "top_p"),
                         [(0.6, 0, 1.0), (1.0, 0, 1.0), (1.4, 6, 1.0), (0.8, 0, 0.7),
                          (1.2, 12, 0.9)])  # fmt: skip
def test_first_token_frequencies_match_the_restricted_softmax(
    tiny_model_dir: Path, temperature: float, top_k: int, top_p: float
) -> None:
    model = _model(tiny_model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(12.0)  # a peaked distribution, so temperature and top-p matter
    expected = _restrict(_first_token_probs(model, PROMPTS[2], temperature), top_k, top_p)
    support = torch.nonzero(expected).flatten().tolist()
    assert 5 < len(support) <= (top_k or 259)  # the restriction leaves a real choice
    n = 4000
    params = SamplingParams(max_new_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p,
                            seed=11, return_logprobs=True)  # fmt: skip
    out = StaticCacheBackend(model).generate([PROMPTS[2]], params, num_samples=n)
    samples = [c[0] for c in out.completion_ids]
    assert set(samples) <= set(support)
    assert _chi_square_pvalue(samples, expected) > 1e-3
    if temperature != 1.0 and top_k == 0:  # far from T = 1 (over a few top-k tokens, T is faint)
        unwarped = _restrict(_first_token_probs(model, PROMPTS[2], 1.0), top_k, top_p)
        assert _chi_square_pvalue(samples, unwarped) < 1e-6
    # the returned log-probs are those of the (restricted) distribution the token came from
    # (float32 logits of the cached decode against one forward, softmaxed in float32 against
    # float64; the restriction renormalises; a log-prob of the unrestricted softmax would be
    # off by -log(kept mass) > 1e-2)
    got = torch.tensor([lp[0] for lp in out.logprobs or []], dtype=torch.float64)
    assert_close_f32(got, expected.log()[samples], ulps=64)


def test_default_top_k_is_off(tiny_model_dir: Path) -> None:
    # ~259 distinct first tokens in 3000 draws from a near-uniform model (see the hf test).
    out = StaticCacheBackend(_model(tiny_model_dir)).generate(
        [PROMPTS[0]], SamplingParams(max_new_tokens=1, seed=0), num_samples=3000
    )
    assert len({c[0] for c in out.completion_ids}) > 200


def test_seeded_sampling_is_reproducible_and_leaves_the_global_rng(tiny_model_dir: Path) -> None:
    backend = StaticCacheBackend(_model(tiny_model_dir), max_batch_size=4)
    params = SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=123)
    state = torch.random.get_rng_state()
    first = backend.generate(PROMPTS, params, num_samples=2)
    assert torch.equal(torch.random.get_rng_state(), state)
    second = backend.generate(PROMPTS, params, num_samples=2)
    other = backend.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0.9,
                                                     top_p=0.95, seed=124), num_samples=2)
    assert (first.completion_ids, first.finished) == (second.completion_ids, second.finished)
    assert first.completion_ids != other.completion_ids


def test_unseeded_sampling_follows_the_global_rng(tiny_model_dir: Path) -> None:
    backend = StaticCacheBackend(_model(tiny_model_dir))
    params = SamplingParams(max_new_tokens=8)
    torch.manual_seed(5)
    first = backend.generate(PROMPTS, params).completion_ids
    second = backend.generate(PROMPTS, params).completion_ids
    torch.manual_seed(5)
    assert backend.generate(PROMPTS, params).completion_ids == first
    assert first != second


# -- stopping, ordering, grouping --------------------------------------------------------------


def _force_eos_after(model: torch.nn.Module, prompt: list[int]) -> None:
    """Make EOS's output row 3x that of the prompt's greedy first token: wherever that token's
    logit is the (positive) maximum, EOS's is 3x larger and wins."""
    with torch.no_grad():
        first = int(model(torch.tensor([prompt])).logits[0, -1].argmax())
        model.lm_head.weight[EOS] = 3 * model.lm_head.weight[first]


@pytest.mark.parametrize("decode_path", PATHS)
def test_rows_stop_at_their_first_stop_token(tiny_model_dir: Path, decode_path: str) -> None:
    model = _model(tiny_model_dir)
    _force_eos_after(model, PROMPTS[0])
    params = _greedy(8)
    out = StaticCacheBackend(model, decode_path=decode_path).generate(PROMPTS, params)
    expected = HFGenerateBackend(model).generate(PROMPTS, params)
    assert (out.completion_ids, out.finished) == (expected.completion_ids, expected.finished)
    assert out.completion_ids[0] == [EOS]  # the forced stop, kept
    assert out.finished[0]
    assert False in out.finished  # and at least one row cut at max_new_tokens
    for completion, finished in zip(out.completion_ids, out.finished, strict=True):
        stops = [i for i, t in enumerate(completion) if t in (EOS, PAD)]
        assert stops == ([len(completion) - 1] if finished else [])
        assert finished or len(completion) == 8


def test_extra_stop_token_and_one_token_completions(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    backend = StaticCacheBackend(model)
    free = backend.generate(PROMPTS, _greedy(10)).completion_ids
    stop = free[1][4]
    out = backend.generate(PROMPTS, _greedy(10, stop_token_ids=(stop,)))
    assert out.completion_ids[1] == free[1][: free[1].index(stop) + 1]
    assert out.finished[1]
    expected = HFGenerateBackend(model).generate(PROMPTS, _greedy(10, stop_token_ids=(stop,)))
    assert (out.completion_ids, out.finished) == (expected.completion_ids, expected.finished)
    single = backend.generate(PROMPTS, _greedy(1, return_logprobs=True))
    assert single.completion_ids == [c[:1] for c in free]
    assert single.completion_lengths == [1, 1, 1, 1]


@pytest.mark.parametrize("sync_every", [2, 4, 16])
def test_done_is_read_every_sync_every_steps(
    tiny_model_dir: Path, sync_every: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(tiny_model_dir)
    free = StaticCacheBackend(model).generate(PROMPTS, _greedy(30)).completion_ids
    # Stop every row at a token that ends each completion early (at index 2..6 of row 0).
    stops = tuple({row[min(i + 2, len(row) - 1)] for i, row in enumerate(free)})
    params = _greedy(30, stop_token_ids=stops)

    def count_decode_steps(backend: StaticCacheBackend) -> tuple[list[list[int]], int]:
        calls = []
        original = backend.engine._decoder.decode
        monkeypatch.setattr(backend.engine._decoder, "decode",
                            lambda *args: calls.append(1) or original(*args))  # fmt: skip
        return backend.generate(PROMPTS, params).completion_ids, len(calls)

    every, steps_needed = count_decode_steps(StaticCacheBackend(model, sync_every=1))
    assert steps_needed == max(map(len, every)) - 1 < 29  # stopped early, no wasted step
    bursts, steps = count_decode_steps(StaticCacheBackend(model, sync_every=sync_every))
    assert bursts == every
    # whole bursts until the check after the burst that finished the last row
    assert steps == min(math.ceil(steps_needed / sync_every) * sync_every, 29)


def _private_stop(completions: list[list[int]], row: int, earliest: int) -> int:
    """A position >= ``earliest`` of ``completions[row]`` whose token occurs neither earlier in
    that row nor anywhere in another row: stopping at it ends only this row, exactly there."""
    others = {t for i, c in enumerate(completions) if i != row for t in c}
    own = completions[row]
    return next(p for p in range(earliest, len(own))
                if own[p] not in others and own[p] not in own[:p])  # fmt: skip


def _compacted_batch_sizes(lengths: list[int], max_new_tokens: int, fraction: float) -> list[int]:
    """Rows decoded at each step, by a plain loop over the rule: before each step, when the rows
    still active (length > tokens so far) are at most ``fraction`` of those decoded, keep them."""
    decoded, sizes = len(lengths), []
    for emitted in range(1, max_new_tokens):
        active = sum(length > emitted for length in lengths)
        if active == 0:
            break
        if active < decoded and active <= fraction * decoded:
            decoded = active
        sizes.append(decoded)
    return sizes


@pytest.mark.parametrize("decode_path", PATHS)
def test_finished_rows_are_compacted_away_without_changing_results(
    tiny_model_dir: Path, decode_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(tiny_model_dir)
    free = StaticCacheBackend(model, compact_below=0).generate(PROMPTS, _greedy(20)).completion_ids
    positions = [_private_stop(free, row, earliest) for row, earliest in ((0, 2), (1, 5), (2, 8))]
    stops = tuple(free[row][p] for row, p in enumerate(positions))
    params = _greedy(20, stop_token_ids=stops, return_logprobs=True)
    reference = StaticCacheBackend(model, compact_below=0, decode_path=decode_path).generate(
        PROMPTS, params
    )
    backend = StaticCacheBackend(model, decode_path=decode_path)  # default compact_below
    batch_sizes: list[int] = []
    original = backend.engine._decoder.decode
    monkeypatch.setattr(backend.engine._decoder, "decode",
                        lambda cache, tokens, *rest: batch_sizes.append(tokens.shape[0])
                        or original(cache, tokens, *rest))  # fmt: skip
    out = backend.generate(PROMPTS, params)
    assert (out.completion_ids, out.finished) == (reference.completion_ids, reference.finished)
    lengths = [p + 1 for p in positions] + [20]
    assert out.completion_lengths == lengths
    # the same kernels on fewer rows: matmuls of another height may block (and round) another
    # way on some CPUs; a row decoded against another row's cache would be off by > 1e-2
    for got, want in zip(out.logprobs or [], reference.logprobs or [], strict=True):
        assert_close_f32(torch.tensor(got), torch.tensor(want), ulps=32)
    assert backend.engine.compact_below == 0.9
    assert batch_sizes == _compacted_batch_sizes(lengths, 20, backend.engine.compact_below)
    assert batch_sizes[-1] == 1  # it really shrank, down to the one running row
    assert backend.engine._slots == {}  # a compacted cache is not kept for reuse
    again = backend.generate(PROMPTS, params)
    assert again.completion_ids == out.completion_ids


def test_compaction_rule_by_hand() -> None:
    # 4 rows of lengths 3, 6, 9, 20: after 3 tokens 3 rows are active (3 <= 0.75 * 4): keep 3;
    # after 6, 2 of 3 (<= 2.25): keep 2; after 9, 1 of 2: keep 1.
    assert _compacted_batch_sizes([3, 6, 9, 20], 20, 0.75) == [4, 4] + [3] * 3 + [2] * 3 + [1] * 11
    assert _compacted_batch_sizes([3, 6, 9, 20], 20, 0.0) == [4] * 19


def test_length_buckets_sort_stably_and_cut_by_max_batch_size() -> None:
    lengths = [5, 12, 1, 4, 5, 1]
    assert length_buckets(lengths, None) == [[2, 5, 3, 0, 4, 1]]
    assert length_buckets(lengths, 4) == [[2, 5, 3, 0], [4, 1]]
    assert length_buckets(lengths, 1) == [[2], [5], [3], [0], [4], [1]]


def test_sub_batching_and_buckets_preserve_order_and_results(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    params = _greedy(12)
    reference = StaticCacheBackend(model).generate(PROMPTS, params)
    for options in ({"max_batch_size": 3}, {"max_batch_size": 2, "row_bucket": 8},
                    {"length_bucket": 64, "row_bucket": 3}):  # fmt: skip
        out = StaticCacheBackend(model, **options).generate(PROMPTS, params)
        assert out.prompt_ids == PROMPTS
        assert (out.completion_ids, out.finished) == (reference.completion_ids, reference.finished)


def test_num_samples_rows_are_grouped_by_prompt(tiny_model_dir: Path) -> None:
    backend = StaticCacheBackend(_model(tiny_model_dir), max_batch_size=5)
    greedy = backend.generate(PROMPTS[:2], _greedy(6), num_samples=3)
    alone = backend.generate(PROMPTS[:2], _greedy(6))
    assert greedy.prompt_ids == [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3
    assert greedy.completion_ids == [alone.completion_ids[0]] * 3 + [alone.completion_ids[1]] * 3
    sampled = backend.generate(PROMPTS, SamplingParams(max_new_tokens=6, seed=1), num_samples=4)
    assert sampled.prompt_ids == [p for p in PROMPTS for _ in range(4)]
    assert len(sampled) == 16
    # rows sharing a prompt were sampled independently
    assert len({tuple(c) for c in sampled.completion_ids[:4]}) > 1


def test_slots_are_reused_and_evicted(tiny_model_dir: Path) -> None:
    backend = StaticCacheBackend(_model(tiny_model_dir), max_cached_shapes=1)
    params = _greedy(6)
    first = backend.generate(PROMPTS, params).completion_ids
    backend.generate(PROMPTS[:2], params)  # another shape evicts the first slot
    assert len(backend.engine._slots) == 1
    again = backend.generate(PROMPTS, params).completion_ids
    assert again == first
    assert backend.generate(PROMPTS, params).completion_ids == first  # reused slot, reset cache


# -- CUDA-graph bookkeeping on the CPU ---------------------------------------------------------


class _StandInCapture:
    """Replaces ``capture_step``: runs the warm-up steps for real (as the CUDA path does) and
    returns the eager step as the "graph"."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    def __call__(self, step: Callable[[], None], *, warmup_steps: int) -> Callable[[], None]:
        self.calls += 1
        for _ in range(warmup_steps):
            step()
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        return step  # "replaying" the recorded step is running it again


@pytest.fixture
def cpu_graphs(monkeypatch: pytest.MonkeyPatch) -> _StandInCapture:
    capture = _StandInCapture()
    monkeypatch.setattr(static_module, "_GRAPH_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(static_module, "capture_step", capture)
    return capture


def test_graph_path_leaves_no_trace_of_its_warm_up(
    tiny_model_dir: Path, cpu_graphs: _StandInCapture
) -> None:
    model = _model(tiny_model_dir)
    params = SamplingParams(max_new_tokens=12, temperature=0.9, seed=7, return_logprobs=True)
    # graphs never compact finished rows (static shapes), so neither may the reference
    eager = StaticCacheBackend(
        model, use_cuda_graph=False, row_bucket=8, length_bucket=64, compact_below=0
    )
    expected = eager.generate(PROMPTS, params, num_samples=2)
    graphed = StaticCacheBackend(model)  # "auto" buckets: 8 rows, 64 columns
    first = graphed.generate(PROMPTS, params, num_samples=2)
    assert cpu_graphs.calls == 1
    second = graphed.generate(PROMPTS, params, num_samples=2)
    assert cpu_graphs.calls == 1  # same shape and rule: the recorded step is replayed
    for out in (first, second):
        assert (out.completion_ids, out.logprobs) == (expected.completion_ids, expected.logprobs)
    graphed.generate(PROMPTS, _greedy(12))
    assert cpu_graphs.calls == 2  # another sampling rule is another graph
    graphed.generate(PROMPTS, SamplingParams(max_new_tokens=1, temperature=0.5))
    assert cpu_graphs.calls == 2  # one token: prefill only, nothing to capture


def test_graph_steps_never_read_transposed_weight_copies(
    tiny_model_dir: Path, cpu_graphs: _StandInCapture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real graph would replay the addresses of the copies made by the call that captured it,
    # freed when that call ended: graph decoding must use the modules' own weights.
    model = _model(tiny_model_dir)
    copies: dict[bool, list[int]] = {}
    for graphs in (True, False):
        backend = StaticCacheBackend(model, use_cuda_graph=graphs, transpose_weights=True)
        copies[graphs] = _copies_per_decode_step(backend, monkeypatch)
        backend.generate(PROMPTS, _greedy(8))
    assert cpu_graphs.calls == 1
    assert set(copies[True]) == {0}
    assert min(copies[False]) > 0


def test_graphs_are_recaptured_when_parameters_are_reassigned(
    tiny_model_dir: Path, cpu_graphs: _StandInCapture
) -> None:
    model = _model(tiny_model_dir)
    backend = StaticCacheBackend(model)
    backend.generate(PROMPTS, _greedy(8))
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # in place: the recorded step stays valid
    backend.update_weights(model, version=1)
    backend.generate(PROMPTS, _greedy(8))
    assert cpu_graphs.calls == 1
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach() * 0.5)
    out = backend.generate(PROMPTS, _greedy(8))
    assert cpu_graphs.calls == 2  # a new address: captured again
    expected = StaticCacheBackend(model, use_cuda_graph=False).generate(PROMPTS, _greedy(8))
    assert out.completion_ids == expected.completion_ids
    with torch.autocast("cpu", dtype=torch.bfloat16):  # off inside: the model's own dtype
        assert backend.generate(PROMPTS, _greedy(8)).completion_ids == out.completion_ids
    assert cpu_graphs.calls == 2


def test_failed_capture_warns_once_and_decodes_eagerly(
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    failing = _StandInCapture(fail=True)
    monkeypatch.setattr(static_module, "_GRAPH_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(static_module, "capture_step", failing)
    model = _model(tiny_model_dir)
    params = SamplingParams(max_new_tokens=10, seed=3)
    expected = StaticCacheBackend(model, use_cuda_graph=False, row_bucket=8, length_bucket=64,
                                  compact_below=0).generate(PROMPTS, params)  # fmt: skip
    backend = StaticCacheBackend(model)
    with caplog.at_level(logging.WARNING, logger="mtgrpo.fast.static"):
        first = backend.generate(PROMPTS, params)
        second = backend.generate(PROMPTS, params)
    assert first.completion_ids == second.completion_ids == expected.completion_ids
    assert failing.calls == 1  # not retried for the same shape and rule
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "CUDA graph capture of the decode step failed (RuntimeError" in warnings[0]


def test_use_cuda_graph_true_needs_a_cuda_model(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"use_cuda_graph=True needs the model on a CUDA device, "
                                         r"but it is on 'cpu'"):  # fmt: skip
        StaticCacheBackend(_model(tiny_model_dir), use_cuda_graph=True)


# -- weights, modes, registration, refusals ----------------------------------------------------


def test_update_weights_records_the_version_and_loads_state(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from mtgrpo.models import build_tiny_model

    model = _model(tiny_model_dir)
    backend = StaticCacheBackend(model)
    greedy = _greedy(6)
    assert backend.generate(PROMPTS, greedy).weights_version is None
    backend.update_weights(model, version=3)
    assert backend.model is model
    assert backend.generate(PROMPTS, greedy).weights_version == 3

    other = _model(build_tiny_model(tmp_path / "other", seed=1))
    expected = HFGenerateBackend(other).generate(PROMPTS, greedy).completion_ids
    backend.update_weights(other.state_dict(), version=4)
    out = backend.generate(PROMPTS, greedy)
    assert (out.completion_ids, out.weights_version) == (expected, 4)
    assert backend.model is model  # loaded in place

    fresh = _model(tiny_model_dir)
    backend.update_weights(fresh, version=5)
    assert backend.model is fresh
    assert backend.generate(PROMPTS, greedy).completion_ids != expected

    with pytest.raises(ValueError, match=r"1 key\(s\) the generation model lacks"):
        backend.update_weights({"not.a.weight": torch.zeros(1)}, version=6)
    with pytest.raises(ValueError, match="version must be an int >= 0"):
        backend.update_weights(model, version=-1)
    with pytest.raises(TypeError, match="takes a model or a state dict, got list"):
        backend.update_weights([1, 2], version=7)


def test_model_mode_is_restored(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    backend = StaticCacheBackend(model)
    model.train()
    backend.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2, seed=0))
    assert model.training
    model.eval()
    backend.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2, seed=0))
    assert not model.training


def test_registered_with_eos_and_pad_from_model_and_tokenizer(tiny_model_dir: Path) -> None:
    assert "static" in BACKENDS
    assert "fast" in BACKENDS
    loaded = load_model_and_tokenizer(tiny_model_dir)
    backend = make_backend("static", loaded.model, loaded.tokenizer, max_batch_size=2)
    assert isinstance(backend, StaticCacheBackend)
    assert isinstance(backend, GenerationBackend)
    assert (backend.eos_token_ids, backend.pad_token_id) == ((EOS, PAD), PAD)
    assert StaticCacheBackend(loaded.model, eos_token_ids=[7]).eos_token_ids == (7,)


def test_architectures_the_static_cache_cannot_serve_are_refused(tiny_model_dir: Path) -> None:
    sliding = transformers.AutoModelForCausalLM.from_config(
        transformers.MistralConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=96, sliding_window=8, eos_token_id=2)
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"StaticSlidingWindowLayer.*use the 'hf' backend"):
        StaticCacheBackend(sliding)
    model = _model(tiny_model_dir)
    model.set_attn_implementation("flex_attention")
    with pytest.raises(ValueError, match=r"uses 'flex_attention'; load it with "
                                         r"attn_implementation='sdpa' or use the 'hf' backend"):
        StaticCacheBackend(model)  # fmt: skip
    from peft import PrefixTuningConfig, get_peft_model

    prefix = get_peft_model(_model(tiny_model_dir),
                            PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2))
    with pytest.raises(ValueError, match="prompt-learning peft models"):
        StaticCacheBackend(prefix)
    with pytest.raises(TypeError, match="has no transformers config"):
        StaticCacheBackend(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="decode path 'llama_modules' cannot serve this model: "
                                         "Phi3ForCausalLM is not one of"):  # fmt: skip
        StaticCacheBackend(_in_memory_model("phi3"), decode_path="llama_modules",
                           eos_token_ids=[2])  # fmt: skip


def test_bad_arguments_are_refused(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    with pytest.raises(ValueError, match=r"max_batch_size must be >= 1, got 0"):
        StaticCacheBackend(model, max_batch_size=0)
    with pytest.raises(TypeError, match=r"sync_every must be an int or None, got 2\.5"):
        StaticCacheBackend(model, sync_every=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"max_cached_shapes must be an int, got None"):
        StaticCacheBackend(model, max_cached_shapes=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"compact_below must be a fraction in \[0, 1\] "
                                         r"\(0 = never compact\), got 1\.5"):  # fmt: skip
        StaticCacheBackend(model, compact_below=1.5)
    with pytest.raises(ValueError, match=r"use_cuda_graph must be True, False or 'auto', got 'on'"):
        StaticCacheBackend(model, use_cuda_graph="on")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"transpose_weights must be True, False or 'auto', "
                                         r"got 'yes'"):  # fmt: skip
        StaticCacheBackend(model, transpose_weights="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"transpose_weights must be True, False or 'auto', "
                                         r"got 1"):  # fmt: skip
        StaticCacheBackend(model, transpose_weights=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown decode_path 'fused'; valid: 'auto', "
                                         r"'llama_modules', 'model_forward'"):  # fmt: skip
        StaticCacheBackend(model, decode_path="fused")
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module causal LM, got str"):
        StaticCacheBackend("Qwen/Qwen2.5-0.5B")  # type: ignore[arg-type]
    backend = StaticCacheBackend(model)
    with pytest.raises(TypeError, match="params must be a SamplingParams, got dict"):
        backend.generate(PROMPTS, {"max_new_tokens": 3})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"invalid token ids \[259\]; .* in \[0, 259\)"):
        backend.generate([[1, 259]], SamplingParams(max_new_tokens=3))
    with pytest.raises(ValueError, match="num_samples must be an int >= 1, got 0"):
        backend.generate(PROMPTS, SamplingParams(max_new_tokens=3), num_samples=0)


def test_bfloat16_model_decodes_with_a_bfloat16_mask(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir, dtype="bfloat16")
    backend = StaticCacheBackend(model)
    out = backend.generate(PROMPTS, _greedy(8, return_logprobs=True))
    expected = HFGenerateBackend(model).generate(PROMPTS, _greedy(8, return_logprobs=True))
    assert next(iter(backend.engine._slots.values())).buffers.visible.dtype == torch.bfloat16
    assert out.completion_ids == expected.completion_ids
    for got, want in zip(out.logprobs or [], expected.logprobs or [], strict=True):
        # float32 log-softmax of bf16 logits from two cache layouts: equal up to bf16 rounding
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=0.05)
