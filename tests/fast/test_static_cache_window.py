"""Eager decoding's cache window (``mtgrpo.fast.static.widen_cache``): in half precision on the
CPU the static backend keeps its cache's tensors only as wide as the columns written so far
(rounded up to ``WINDOW_COLUMNS``), so that attention reads contiguous tensors. The window must
change nothing but float rounding: greedy completions equal the full-width decoding's token for
token, log-probs within bfloat16 rounding, for left-padded prompts of different lengths, groups
of one and several samples, rows that stop early (compaction), LoRA policies decoded from a
bfloat16 replica, and generations that cross several windows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import logprob_helpers
import mtgrpo.fast.static as static_module
from mtgrpo.fast.static import WINDOW_COLUMNS, widen_cache
from mtgrpo.fast.static_decoders import LlamaModulesDecoder
from mtgrpo.models import load_model
from mtgrpo.rollout import SamplingParams, StaticCacheBackend

EOS = 258
# 1 to 12 tokens: sub-batches need left padding
PROMPTS = [[71, 100, 107, 107, 110], [257, 116, 114, 100, 113, 11, 1, 3, 9, 11, 80, 12], [42],
           [12, 11, 12, 28]]  # fmt: skip
BF16_EPS = torch.finfo(torch.bfloat16).eps


def _no_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LlamaModulesDecoder, "cache_window", lambda self, device: False)



def _widths(backend: StaticCacheBackend, seen: list[int]) -> None:
    """Record the cache's key width at every decode step."""
    decoder = backend.engine._decoder
    original = decoder.decode

    def decode(cache, tokens, *rest):  # type: ignore[no-untyped-def]
        seen.append(cache.layers[0].keys.shape[2])
        return original(cache, tokens, *rest)

    decoder.decode = decode


def _generate(model: torch.nn.Module, params: SamplingParams, num_samples: int,
              **options: object) -> tuple[object, list[int]]:
    backend = StaticCacheBackend(model, **options)
    widths: list[int] = []
    _widths(backend, widths)
    return backend.generate(PROMPTS, params, num_samples=num_samples), widths


def _assert_same(windowed: object, full: object) -> None:
    assert windowed.completion_ids == full.completion_ids  # type: ignore[attr-defined]
    assert windowed.finished == full.finished  # type: ignore[attr-defined]
    for got, want in zip(windowed.logprobs, full.logprobs, strict=True):  # type: ignore[attr-defined]
        # the same products over more (masked, zero-weight) columns: bf16 rounding at most
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0,
                                   atol=4 * BF16_EPS)


@pytest.mark.parametrize("num_samples", [1, 3])
@pytest.mark.parametrize("lora", [False, True])
def test_windowed_decoding_equals_full_width_decoding(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, num_samples: int, lora: bool
) -> None:
    model = load_model(tiny_model_dir, for_training=False)
    if lora:
        model = logprob_helpers.active_lora(model, init_seed=0)
    # 40 new tokens after prompts of up to 12: several windows of 16 columns
    params = SamplingParams(max_new_tokens=40, greedy=True, return_logprobs=True)
    windowed, widths = _generate(model, params, num_samples, dtype="bfloat16")
    assert widths[0] == WINDOW_COLUMNS  # the 12-column prompt and the first token, rounded up
    # it grew by whole windows (to the cache's 52 columns for the last tokens, unless every
    # row stopped before them)
    assert widths == sorted(widths)
    assert {16, 32} <= set(widths) <= {16, 32, 48, 52}
    with monkeypatch.context() as patch:
        _no_window(patch)
        full, full_widths = _generate(model, params, num_samples, dtype="bfloat16")
    assert set(full_widths) == {12 + 40}
    _assert_same(windowed, full)


def test_rows_that_stop_early_are_compacted_inside_the_window(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_model(tiny_model_dir, for_training=False, dtype="bfloat16")
    probe = StaticCacheBackend(model).generate(PROMPTS, SamplingParams(max_new_tokens=30,
                                                                       greedy=True))
    # each of the first three rows stops at a token of its own, at a different step
    stops = tuple({row[position] for row, position in zip(probe.completion_ids, (3, 9, 20),
                                                          strict=False)})
    params = SamplingParams(max_new_tokens=30, greedy=True, return_logprobs=True,
                            stop_token_ids=stops)
    rows: list[int] = []
    backend = StaticCacheBackend(model)
    original = backend.engine._decoder.decode
    backend.engine._decoder.decode = (lambda cache, tokens, *rest: rows.append(tokens.shape[0])
                                      or original(cache, tokens, *rest))  # fmt: skip
    windowed = backend.generate(PROMPTS, params)
    assert min(rows) < len(PROMPTS)  # compacted
    assert min(map(len, windowed.completion_ids)) < 30
    with monkeypatch.context() as patch:
        _no_window(patch)
        full = StaticCacheBackend(model).generate(PROMPTS, params)
    _assert_same(windowed, full)


def test_sampled_completions_and_log_probs_follow_the_full_width_decoding(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_model(tiny_model_dir, for_training=False)
    params = SamplingParams(max_new_tokens=24, seed=3, return_logprobs=True, temperature=0.8,
                            top_p=0.95, top_k=50)
    windowed = StaticCacheBackend(model, dtype="bfloat16").generate(PROMPTS, params,
                                                                    num_samples=4)
    with monkeypatch.context() as patch:
        _no_window(patch)
        full = StaticCacheBackend(model, dtype="bfloat16").generate(PROMPTS, params,
                                                                    num_samples=4)
    # the same seed and draws: the same tokens unless a rounding difference tips a draw
    # (none on this model), and the same log-probs up to bfloat16 rounding
    _assert_same(windowed, full)


def test_the_slot_is_reused_at_full_width_after_a_windowed_call(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir, for_training=False, dtype="bfloat16")
    backend = StaticCacheBackend(model)
    # 12 + 21 cache columns; the last token's column, 32, ends the second window of 16
    params = SamplingParams(max_new_tokens=21, greedy=True, return_logprobs=True)
    first = backend.generate(PROMPTS, params)
    assert all(len(ids) == 21 for ids in first.completion_ids)  # no row stopped: no compaction
    (slot,) = backend.engine._slots.values()
    assert slot.cache.layers[0].keys.shape[2] < slot.cache.layers[0].max_cache_len
    second = backend.generate(PROMPTS, params)
    assert list(backend.engine._slots.values()) == [slot]
    assert second.completion_ids == first.completion_ids
    assert second.logprobs == first.logprobs


def test_float32_decoding_keeps_the_full_cache(tiny_model_dir: Path) -> None:
    """The window serves the two-product attention only (half precision on the CPU)."""
    model = load_model(tiny_model_dir, for_training=False)
    backend = StaticCacheBackend(model)
    widths: list[int] = []
    _widths(backend, widths)
    backend.generate(PROMPTS, SamplingParams(max_new_tokens=20, greedy=True))
    assert set(widths) == {12 + 20}
    assert not backend.engine._decoder.cache_window(torch.device("cpu"))


def test_widen_cache_keeps_written_columns_and_zeroes_the_rest() -> None:
    from transformers import LlamaConfig, StaticCache

    config = LlamaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=32, vocab_size=10)
    cache = StaticCache(config=config, max_cache_len=40)
    written = torch.randn(3, 1, 5, 8)
    for layer in cache.layers:
        layer.update(written, written + 1)
    assert widen_cache(cache, 6) == WINDOW_COLUMNS  # just prefilled: cut to the window
    assert widen_cache(cache, WINDOW_COLUMNS) == WINDOW_COLUMNS  # wide enough: unchanged
    assert widen_cache(cache, WINDOW_COLUMNS + 1) == 2 * WINDOW_COLUMNS
    assert widen_cache(cache, 39) == 40  # capped at max_cache_len
    for layer in cache.layers:
        assert layer.keys.shape == layer.values.shape == (3, 1, 40, 8)
        assert torch.equal(layer.keys[:, :, :5], written)
        assert torch.equal(layer.values[:, :, :5], written + 1)
        assert not layer.keys[:, :, 5:].any()
        assert not layer.values[:, :, 5:].any()
        assert layer.keys.is_contiguous()
    # back to full width (zeroed) when the slot starts again
    static_module._full_width(cache)
    assert cache.layers[0].keys.shape[2] == 40
