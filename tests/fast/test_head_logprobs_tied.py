"""An output head tied to the input embedding: on the chunked route its weight gradient is added
into ``.grad`` chunk by chunk (``_GradIntoParameter``) instead of autograd's out-of-place sum of
the head's and the embedding's ``[V, H]`` gradients. Every gradient equals the model's own
forward's (where autograd sums them), over two accumulated micro-batches, on every chunked route,
with several chunks, with and without recomputation; the weight's accumulation hooks still run;
and the shortcut is taken only where nothing else reads the weight's gradient on its way."""

from __future__ import annotations

import pytest
import torch
import transformers

import logprob_helpers
from mtgrpo.fast import enable_activation_checkpointing
from mtgrpo.fast.head_logprobs import grad_goes_into_weight
from mtgrpo.policy import sequence_logprobs
from mtgrpo.policy.logprobs import resolve_logprob_path
from tolerance import assert_close_f32

VOCAB, PROMPT, COMPLETION = 61, 6, 7

ROUTES = {
    "packed": {"pack": True, "share_prompts": False},
    "padded": {"pack": False, "share_prompts": False},
    "shared_prompts": {"pack": False, "share_prompts": True},
}


def _shortcut(route) -> bool:
    return grad_goes_into_weight(route.backbone, route.head, route.via)


def tiny(tied: bool = True) -> torch.nn.Module:
    torch.manual_seed(7)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa",
        tie_word_embeddings=tied))
    return model.train()


def micro_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of two rows each, the second prompt left-padded; completions of 7, 3, 7, 5."""
    return logprob_helpers.two_groups(VOCAB, PROMPT, COMPLETION, (7, 3, 7, 5), seed)


def accumulated_grads(model, **options) -> dict[str, torch.Tensor]:
    """Every gradient after two micro-batches' backward passes (the second one adds into the
    ``.grad`` the first left), at temperature 0.7 with the entropy in the loss."""
    model.zero_grad(set_to_none=True)
    for seed in (1, 2):
        input_ids, mask = micro_batch(seed)
        out = sequence_logprobs(model, input_ids, mask, COMPLETION, temperature=0.7,
                                compute_entropy=True, chunk_size=4, **options)
        weights = torch.linspace(-1.0, 2.0, out.logps.numel()).view_as(out.logps)
        ((out.logps * weights).sum() + out.entropy.sum()).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing", [False, True], ids=["kept", "recomputed"])
@pytest.mark.parametrize("route", ROUTES)
def test_tied_head_gradients_equal_autograds_sum(route, checkpointing):
    model = tiny()
    assert _shortcut(resolve_logprob_path(model))
    expected = accumulated_grads(model, path="model_forward")  # autograd sums the two parts
    if checkpointing:  # the head's chunks are then recomputed in the backward pass
        enable_activation_checkpointing(model, {"use_reentrant": False})
    actual = accumulated_grads(model, **ROUTES[route])
    assert expected.keys() == actual.keys()
    weight = "model.embed_tokens.weight"
    assert actual[weight].abs().sum() > 0
    for name in expected:
        # the same terms, summed in another order (chunks of 4 positions, two micro-batches)
        assert_close_f32(actual[name], expected[name], ulps=64, msg=name)


def test_the_weights_accumulation_hook_runs_once_per_backward_with_the_whole_gradient():
    model = tiny()
    weight = model.get_input_embeddings().weight
    seen: list[torch.Tensor] = []
    weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    grads = accumulated_grads(model)
    assert len(seen) == 2  # once per micro-batch, from the embedding's gradient
    # at the last one the head's part is already in: what a hook (DDP's reducer) reads is whole
    assert_close_f32(seen[-1], grads["model.embed_tokens.weight"], ulps=0)


def test_the_shortcut_is_taken_only_for_a_trained_plain_head_tied_to_the_embedding():
    assert not _shortcut(resolve_logprob_path(tiny(tied=False)))
    frozen = tiny()
    frozen.get_input_embeddings().weight.requires_grad_(False)
    assert not _shortcut(resolve_logprob_path(frozen))

    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(tiny(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    assert not _shortcut(resolve_logprob_path(lora))  # the head is frozen
    wrapped = get_peft_model(tiny(), LoraConfig(r=4, lora_alpha=8, target_modules=["lm_head"]))
    assert not _shortcut(resolve_logprob_path(wrapped))  # not a plain Linear
