"""The transformers differences mtgrpo.fast.transformers_compat holds: each side of each one
(the installed release for real, the other through a stand-in), and that the installed
release's models really take and return the cache under the name the module gives."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
import transformers
from transformers import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast

from mtgrpo.fast.transformers_compat import (
    CACHE_KEYWORDS,
    cache_argument,
    cache_keyword,
    disable_activation_checkpointing,
    enable_activation_checkpointing,
    returned_cache,
    sdpa_packs_one_token_queries,
)
from tolerance import assert_close_f32


@dataclasses.dataclass
class _OutputBefore524:  # the field as transformers named it up to 5.23
    last_hidden_state: object = None
    past_key_values: object = None


@dataclasses.dataclass
class _OutputFrom524:  # ... and from 5.24 on
    last_hidden_state: object = None
    cache: object = None


def test_cache_keyword_reads_either_release_off_its_output_class() -> None:
    assert cache_keyword(_OutputBefore524) == "past_key_values"
    assert cache_keyword(_OutputFrom524) == "cache"
    assert cache_keyword(BaseModelOutputWithPast) == cache_keyword()
    assert cache_keyword() in CACHE_KEYWORDS


def test_an_output_class_without_a_cache_field_is_refused() -> None:
    @dataclasses.dataclass
    class Elsewhere:
        kv: object = None

    with pytest.raises(TypeError, match=r"Elsewhere has none of the cache fields \('cache', "
                                        r"'past_key_values'\).*requirements/lock\.txt"):
        cache_keyword(Elsewhere)


def test_cache_argument_and_returned_cache_on_both_sides() -> None:
    cache = object()
    assert cache_argument(cache, "past_key_values") == {"past_key_values": cache}
    assert cache_argument(cache, "cache") == {"cache": cache}
    assert cache_argument(cache) == {cache_keyword(): cache}
    assert returned_cache(_OutputBefore524(past_key_values=cache)) is cache
    assert returned_cache(_OutputFrom524(cache=cache)) is cache
    assert returned_cache(_OutputFrom524()) is None


def test_the_installed_release_takes_and_returns_the_cache_under_that_name() -> None:
    config = transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.tensor([[1, 2, 3]])
    cache = DynamicCache(config=config)
    with torch.no_grad():
        first = model(input_ids=ids, use_cache=True, **cache_argument(cache))
        assert returned_cache(first) is cache
        assert cache.get_seq_length() == 3  # written through the name, not a cache of its own
        second = model(input_ids=torch.tensor([[4]]), use_cache=True, **cache_argument(cache))
        full = model(input_ids=torch.tensor([[1, 2, 3, 4]]), use_cache=False)
    assert cache.get_seq_length() == 4
    # the cached step reads the first call's keys/values: it equals the full forward up to
    # float32 rounding of another summation order (a few ulps at the logits' magnitude),
    # where an ignored cache would change the logits by O(0.1) on this random model
    scale = float(full.logits.abs().max())
    assert_close_f32(second.logits[0, -1], full.logits[0, -1], ulps=64, scale=scale)


def test_sdpa_packing_read_off_either_wrapper() -> None:
    def pack_gqa(hidden: torch.Tensor | None, n_rep: int) -> torch.Tensor | None:
        return hidden

    assert sdpa_packs_one_token_queries(types.SimpleNamespace(pack_gqa=pack_gqa)) is True
    assert sdpa_packs_one_token_queries(types.SimpleNamespace()) is False
    from transformers.integrations import sdpa_attention

    assert sdpa_packs_one_token_queries() is hasattr(sdpa_attention, "pack_gqa")


class _Recorder:
    def __init__(self, *names: str) -> None:
        self.calls: list[tuple[str, dict]] = []
        for name in names:
            setattr(self, name, lambda _n=name, **kw: self.calls.append((_n, kw)))


def test_activation_checkpointing_through_either_name() -> None:
    new = _Recorder("activation_checkpointing_enable", "activation_checkpointing_disable",
                    "gradient_checkpointing_enable", "gradient_checkpointing_disable")
    enable_activation_checkpointing(new, {"use_reentrant": False})
    disable_activation_checkpointing(new)
    kwargs = {"use_reentrant": False}
    assert new.calls == [
        ("activation_checkpointing_enable", {"activation_checkpointing_kwargs": kwargs}),
        ("activation_checkpointing_disable", {}),
    ]
    old = _Recorder("gradient_checkpointing_enable", "gradient_checkpointing_disable")
    enable_activation_checkpointing(old, {"use_reentrant": False})
    disable_activation_checkpointing(old)
    assert old.calls == [
        ("gradient_checkpointing_enable", {"gradient_checkpointing_kwargs": kwargs}),
        ("gradient_checkpointing_disable", {}),
    ]


def test_activation_checkpointing_on_the_installed_release() -> None:
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # no deprecated name is called
        enable_activation_checkpointing(model, {"use_reentrant": False})
        assert model.model.gradient_checkpointing is True
        disable_activation_checkpointing(model)
        assert model.model.gradient_checkpointing is False
