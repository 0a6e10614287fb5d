"""Gradient checkpointing (TRL's ``gradient_checkpointing`` and ``gradient_checkpointing_kwargs``)
on every route of ``sequence_logprobs``: the padding-free (packed) forward, the padded backbone,
the model's own forward, each with and without LoRA, reentrant or not. With it on, every
decoder layer runs again in the backward pass (its MLP is called once more per forward) and the
output head's chunks are recomputed; log-probs, entropies and gradients equal those of the run
without it."""

from __future__ import annotations

import pytest
import torch
import transformers

import logprob_helpers
from mtgrpo.fast import enable_activation_checkpointing
from mtgrpo.policy.logprobs import resolve_logprob_path
from tolerance import assert_close_f32

# peft reads transformers' deprecated `is_gradient_checkpointing` when checkpointing is on
pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

VOCAB, PROMPT, COMPLETION, LAYERS = 61, 6, 7, 3

ROUTES = {
    "packed": {"pack": True, "share_prompts": False},
    "padded": {"pack": False, "share_prompts": False},
    "model_forward": {"path": "model_forward"},
}


def tiny(lora: bool) -> torch.nn.Module:
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa"))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
            init_lora_weights=False))
    return model.train()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts (0 and 2 left pads) of two rows each; completions of 7, 4, 7 and 1 tokens."""
    return logprob_helpers.two_groups(VOCAB, PROMPT, COMPLETION, (7, 4, 7, 1), seed=5)


class CallCounter:
    """Calls of each decoder layer's MLP and of the output head, split at a mark (the end of
    the forward pass): calls after it ran in the backward pass, as recomputation."""

    def __init__(self, model: torch.nn.Module) -> None:
        route = resolve_logprob_path(model)
        self.calls = {"mlp": 0, "head": 0}
        # Pre-hooks: a recomputation stops once it has rebuilt the last tensor the backward
        # pass needs (torch's checkpoint "early stop"), inside the MLP, before its forward
        # hooks would run.
        self.handles = [layer.mlp.register_forward_pre_hook(self._hook("mlp"))
                        for layer in route.backbone.layers]
        head = route.head if route.head is not None else model.get_output_embeddings()
        self.handles.append(head.register_forward_pre_hook(self._hook("head")))
        self.at_mark = dict(self.calls)

    def _hook(self, name: str):
        def count(module, args) -> None:
            self.calls[name] += 1

        return count

    def mark(self) -> None:
        self.at_mark = dict(self.calls)

    def in_backward(self, name: str) -> int:
        return self.calls[name] - self.at_mark[name]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def scored(model, route: str) -> tuple[tuple, CallCounter]:
    """``logprob_helpers.scores_and_grads`` (log-probs, entropies, gradients) and the calls."""
    input_ids, mask = batch()
    counter = CallCounter(model)
    original = logprob_helpers.sequence_logprobs

    def marked(*args, **kwargs):
        out = original(*args, **kwargs)
        counter.mark()  # the forward pass is over; what runs from here on is the backward
        return out

    logprob_helpers.sequence_logprobs = marked
    try:
        result = logprob_helpers.scores_and_grads(model, input_ids, mask, COMPLETION,
                                                  **ROUTES[route])
    finally:
        logprob_helpers.sequence_logprobs = original
        counter.remove()
    return result, counter


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
@pytest.mark.parametrize("route", ROUTES)
def test_checkpointing_recomputes_every_layer_and_keeps_the_gradients(route, reentrant, lora):
    model = tiny(lora)
    assert resolve_logprob_path(model).packed  # the packed route is the one taken by default
    plain, without = scored(model, route)
    assert without.in_backward("mlp") == 0
    assert without.in_backward("head") == 0  # small logits are kept, not recomputed
    enable_activation_checkpointing(model, {"use_reentrant": reentrant})
    if lora:  # what the trainer does (mtgrpo.trainer.setup.load_policy), as TRL does
        model.enable_input_require_grads()
    checkpointed, counter = scored(model, route)
    forward_calls = without.calls["mlp"]
    assert forward_calls == LAYERS  # one call of each layer's MLP: a single forward pass
    # every layer runs once more, in the backward pass; so does the head on its one chunk,
    # except on the model's own forward, whose logits come whole (what is recomputed there is
    # each chunk's float32 copy)
    assert counter.in_backward("mlp") == LAYERS
    assert without.calls["head"] == 1
    assert counter.in_backward("head") == (0 if route == "model_forward" else 1)
    # The recomputation runs the same kernels on the same inputs; only the order in which the
    # backward pass sums a gradient may change: a few roundings of entries below 1. A lost
    # gradient (a LoRA adapter cut off by reentrant checkpointing) is off by the whole entry.
    assert_close_f32(checkpointed[0], plain[0], ulps=4)
    assert_close_f32(checkpointed[1], plain[1], ulps=4)
    assert checkpointed[2].keys() == plain[2].keys()
    assert any("lora" in name for name in plain[2]) == lora
    for name, grad in plain[2].items():
        assert_close_f32(checkpointed[2][name], grad, ulps=16, msg=name)


def test_checkpointing_applies_in_training_mode_with_gradients_only():
    model = tiny(lora=False)
    enable_activation_checkpointing(model)
    input_ids, mask = batch()
    counter = CallCounter(model)
    model.eval()
    _, _, grads = logprob_helpers.scores_and_grads(model, input_ids, mask, COMPLETION)
    assert grads
    assert counter.calls["mlp"] == LAYERS  # eval mode: no recomputation
    counter.remove()
