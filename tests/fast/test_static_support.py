"""Which models the static backend serves is decided by running them (a probe forward), and
``generation_backend: auto`` never loses the fast path in silence."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
import transformers
from torch import nn

from mtgrpo.fast.static_decoders import (
    StaticCacheUnsupportedError,
    check_static_cache_support,
)
from mtgrpo.fast.transformers_compat import cache_argument, cache_keyword
from mtgrpo.rollout import SamplingParams, StaticCacheBackend
from mtgrpo.rollout.selection import _auto_backend

PROMPTS = [[5, 9, 14, 3], [7, 21]]


def _config() -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip


def _build(cls: type[nn.Module] = transformers.LlamaForCausalLM) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return cls(_config()).eval()


class _DropsTheCache(transformers.LlamaForCausalLM):
    """A forward that takes any cache argument and never writes it."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("cache", None)
        kwargs.pop("past_key_values", None)
        return super().forward(*args, **kwargs)


class _IgnoresPositionIds(transformers.LlamaForCausalLM):
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("position_ids", None)
        return super().forward(*args, **kwargs)


class _IgnoresFourDimensionalMasks(transformers.LlamaForCausalLM):
    """Drops a prepared 4-D mask, as a release that stopped accepting them might."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 4:
            kwargs["attention_mask"] = None
        return super().forward(*args, **kwargs)


class _CountsCalls(transformers.LlamaForCausalLM):
    calls = 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        type(self).calls += 1
        return super().forward(*args, **kwargs)


class _OldStyleModel(nn.Module):
    """A remote-code style model whose forward knows only ``past_key_values`` (and refuses
    ``cache``), whatever the installed transformers calls it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def get_input_embeddings(self) -> nn.Module:
        return self.inner.get_input_embeddings()

    def forward(
        self, input_ids: torch.Tensor, attention_mask: Any = None, position_ids: Any = None,
        past_key_values: Any = None, use_cache: bool | None = None,
    ) -> Any:  # fmt: skip
        extra = {} if past_key_values is None else cache_argument(past_key_values)
        return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids, use_cache=use_cache, **extra)


def test_a_transformers_model_is_served_under_the_installed_cache_name() -> None:
    assert check_static_cache_support(_build()) == cache_keyword()


@pytest.mark.parametrize(
    ("cls", "message", "inherent"),
    [
        (_DropsTheCache, r"does not write a StaticCache passed as cache or past_key_values.*"
                         r"install the tested versions", False),
        (_IgnoresFourDimensionalMasks, r"decoding a left-padded prompt over a StaticCache "
                                       r"under a 4-D mask gives other logits than the full "
                                       r"forward", False),
        (_IgnoresPositionIds, r"ignores position_ids", True),
    ],
)
def test_a_model_whose_forward_does_not_behave_is_refused(
    cls: type[nn.Module], message: str, inherent: bool
) -> None:
    with pytest.raises(StaticCacheUnsupportedError, match=message) as refused:
        check_static_cache_support(_build(cls))
    assert refused.value.inherent is inherent
    with pytest.raises(StaticCacheUnsupportedError, match=message):
        StaticCacheBackend(_build(cls))


def test_a_forward_that_knows_only_the_old_name_is_served_under_it() -> None:
    inner = _build()
    old = _OldStyleModel(inner)
    assert check_static_cache_support(old) == "past_key_values"
    params = SamplingParams(max_new_tokens=6, greedy=True)
    served = StaticCacheBackend(old, eos_token_ids=[2]).generate(PROMPTS, params)
    assert StaticCacheBackend(old, eos_token_ids=[2]).decoder_name == "model_forward"
    reference = StaticCacheBackend(inner, eos_token_ids=[2], decode_path="model_forward")
    assert served.completion_ids == reference.generate(PROMPTS, params).completion_ids


def test_the_probe_runs_once_per_model_and_leaves_no_trace() -> None:
    model = _build(_CountsCalls).train()
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    check_static_cache_support(model)
    probed = _CountsCalls.calls
    assert probed == 4  # reference, prefill, decode, shifted positions
    assert model.training  # put back in the mode it was found in
    assert torch.equal(torch.random.get_rng_state(), state)
    check_static_cache_support(model)
    StaticCacheBackend(model)
    assert _CountsCalls.calls == probed  # remembered for this model object


def test_auto_falls_back_loudly_when_a_setting_or_release_is_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="mtgrpo.rollout.selection"):
        assert _auto_backend(_build(_DropsTheCache)) == "hf"
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "fast 'static' backend does not apply" in record.getMessage()
    assert "install the tested versions" in record.getMessage()

    caplog.clear()
    flex = _build()
    flex.set_attn_implementation("flex_attention")
    with caplog.at_level(logging.INFO, logger="mtgrpo.rollout.selection"):
        assert _auto_backend(flex) == "hf"
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "attn_implementation='sdpa'" in record.getMessage()


def test_auto_falls_back_quietly_when_the_architecture_is_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sliding = transformers.AutoModelForCausalLM.from_config(
        transformers.MistralConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, sliding_window=8, eos_token_id=2)
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="mtgrpo.rollout.selection"):
        assert _auto_backend(sliding) == "hf"
        assert _auto_backend(_build()) == "static"
    [record] = caplog.records
    assert record.levelno == logging.INFO
    assert "StaticSlidingWindowLayer" in record.getMessage()
