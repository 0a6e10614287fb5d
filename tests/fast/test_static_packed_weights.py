"""The decode step's bfloat16 weight copies in oneDNN's packed layout
(``mtgrpo.fast.static_decoders._packed_copies``): on the CPU, inside ``transposed_weights``, a
bfloat16 decoder multiplies by packed copies of its fused and other projection weights. The
products must be those of ``torch.mm`` on the same copies up to summation order (bfloat16
outputs: one unit in the last place), and so within bfloat16 rounding of the module calls;
decoding must fall back to ``torch.mm`` where packing does not apply (float32, a torch build
without oneDNN's operators)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import logprob_helpers
import mtgrpo.fast.static_decoders as static_decoders
from mtgrpo.fast.static_decoders import LlamaModulesDecoder
from mtgrpo.models import load_model
from mtgrpo.rollout import SamplingParams, StaticCacheBackend

PROMPTS = [[71, 100, 107, 107, 110], [257, 116, 114, 100, 113, 11, 1, 3, 9, 11, 80, 12], [42],
           [12, 11, 12, 28]]  # fmt: skip
BF16_EPS = torch.finfo(torch.bfloat16).eps



def _bf16_lm(path: Path, lora: bool) -> torch.nn.Module:
    model = load_model(path, for_training=False)
    if lora:
        model = logprob_helpers.active_lora(model, init_seed=0)
        model = model.merge_and_unload()  # a plain model: the decoder serves its modules
    return model.to(torch.bfloat16)


def _decode_step(lm: torch.nn.Module, decoder: LlamaModulesDecoder) -> torch.Tensor:
    """Prefill 3 prompts (one left-padded) with the model's forward, decode one token each."""
    from transformers import StaticCache

    from mtgrpo.fast.static_decoders import ModelForwardDecoder

    n, width, columns = 3, 5, 9
    input_ids = torch.randint(3, 250, (n, width), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones((n, width), dtype=torch.long)
    attention_mask[1, :2] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    visible = torch.full((n, columns), torch.finfo(torch.bfloat16).min, dtype=torch.bfloat16)
    visible[:, :width].masked_fill_(attention_mask.bool(), 0.0)
    visible[:, width] = 0.0
    tokens, positions = torch.tensor([[7], [8], [9]]), attention_mask.sum(-1, keepdim=True)
    with torch.inference_mode():
        cache = StaticCache(config=lm.config, max_cache_len=columns)
        ModelForwardDecoder.prefill(decoder, cache, input_ids, attention_mask, position_ids)  # type: ignore[arg-type]
        return decoder.decode(cache, tokens, positions, visible[:, None, None, :],
                              torch.tensor([width])).float()


def _assert_bf16_close(got: torch.Tensor, want: torch.Tensor, units: int) -> None:
    """Within ``units`` bfloat16 units in the last place of the logits' magnitude."""
    scale = max(1.0, float(want.abs().max()))
    torch.testing.assert_close(got, want, rtol=0, atol=units * BF16_EPS * scale)


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("arch", ["tiny_model_dir", "tiny_qwen2_model_dir"])
def test_packed_products_equal_the_plain_products(
    arch: str, lora: bool, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    lm = _bf16_lm(request.getfixturevalue(arch), lora)
    decoder = LlamaModulesDecoder(lm)
    modules = _decode_step(lm, decoder)  # the module calls
    with decoder.transposed_weights():
        packed = dict(decoder._packed)
        with_packed = _decode_step(lm, decoder)
    assert decoder._packed == {}  # dropped on exit
    layers = lm.config.num_hidden_layers
    # each layer's fused q|k|v and gate|up copies, its o_proj and down_proj, and the head
    assert len(packed) == 4 * layers + 1
    assert lm.model.layers[0].self_attn in packed
    assert lm.model.layers[0].self_attn.o_proj in packed
    assert lm.model.layers[0].self_attn.q_proj not in packed  # its view serves the prefill
    assert lm.lm_head in packed
    monkeypatch.setattr(static_decoders, "_packed_copies", lambda *args: {})
    with decoder.transposed_weights():
        assert decoder._packed == {}
        with_mm = _decode_step(lm, decoder)
    # the same bfloat16 products, another summation order: bfloat16 rounding of each
    # layer's outputs, through 2 layers
    _assert_bf16_close(with_packed, with_mm, units=4)
    _assert_bf16_close(with_packed, modules, units=4)


def test_float32_decoding_is_not_packed(tiny_model_dir: Path) -> None:
    lm = load_model(tiny_model_dir, for_training=False)
    decoder = LlamaModulesDecoder(lm)
    with decoder.transposed_weights():
        assert decoder._transposed
        assert decoder._packed == {}


def test_a_torch_without_onednn_linear_decodes_with_plain_products(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lm = _bf16_lm(tiny_model_dir, lora=False)
    decoder = LlamaModulesDecoder(lm)

    def missing(*args: object) -> None:
        raise RuntimeError("no such operator")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", missing, raising=False)
    with decoder.transposed_weights():
        assert decoder._packed == {}
        assert decoder._fused
        fallback = _decode_step(lm, decoder)
    monkeypatch.undo()
    _assert_bf16_close(fallback, _decode_step(lm, decoder), units=4)


@pytest.mark.parametrize("num_samples", [1, 4])
def test_generation_from_a_bfloat16_replica_follows_the_plain_products(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, num_samples: int
) -> None:
    policy = logprob_helpers.active_lora(load_model(tiny_model_dir, for_training=False),
                                         init_seed=0)
    greedy = SamplingParams(max_new_tokens=24, greedy=True, return_logprobs=True)
    sampled = SamplingParams(max_new_tokens=24, seed=5, return_logprobs=True, temperature=0.9)
    packed = [StaticCacheBackend(policy, dtype="bfloat16").generate(PROMPTS, params,
                                                                   num_samples=num_samples)
              for params in (greedy, sampled)]
    monkeypatch.setattr(static_decoders, "_packed_copies", lambda *args: {})
    plain = [StaticCacheBackend(policy, dtype="bfloat16").generate(PROMPTS, params,
                                                                  num_samples=num_samples)
             for params in (greedy, sampled)]
    for got, want in zip(packed, plain, strict=True):
        # the same draws: the same tokens unless rounding tips one (none on this model)
        assert got.completion_ids == want.completion_ids
        for a, b in zip(got.logprobs, want.logprobs, strict=True):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0,
                                       atol=4 * BF16_EPS)
