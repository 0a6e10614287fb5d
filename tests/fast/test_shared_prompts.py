"""The shared-prompt forward of ``sequence_logprobs``: each distinct prompt runs once, its
key/value cache is repeated for the rows that share it, and the log-probs, entropies and
gradients equal those of the full forward (``share_prompts=False``). The padding-free forward,
which takes precedence where it applies, is switched off here (``pack=False``); it has its own
tests in test_packed.py."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import logprob_helpers
from mtgrpo.fast import (
    disable_activation_checkpointing,
    enable_activation_checkpointing,
    shared_prompt_rows,
)
from mtgrpo.policy.logprobs import resolve_logprob_path
from tolerance import assert_close_f32

VOCAB, PROMPT, COMPLETION, GROUP = 61, 6, 5, 3


def tiny(arch: str) -> torch.nn.Module:
    torch.manual_seed(3)
    sizes = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**sizes))
    return Qwen2ForCausalLM(Qwen2Config(**sizes))


def grouped_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three prompts (0, 2 and 4 left pads) x GROUP completions (some right-padded),
    rows interleaved (prompt of row i: i % 3) as length bucketing leaves them."""
    generator = torch.Generator().manual_seed(5)
    prompts = torch.randint(1, VOCAB, (3, PROMPT), generator=generator)
    prompt_mask = torch.ones(3, PROMPT, dtype=torch.long)
    prompt_mask[1, :2] = 0
    prompt_mask[2, :4] = 0
    of_row = torch.arange(3 * GROUP) % 3
    completions = torch.randint(1, VOCAB, (3 * GROUP, COMPLETION), generator=generator)
    completion_mask = torch.ones_like(completions)
    completion_mask[1, 3:] = 0
    completion_mask[5, 1:] = 0
    completion_mask[7, 4:] = 0
    input_ids = torch.cat([prompts[of_row] * prompt_mask[of_row], completions], 1)
    return input_ids, torch.cat([prompt_mask[of_row], completion_mask], 1)


def scores_and_grads(model, input_ids, mask, *, share: bool):
    return logprob_helpers.scores_and_grads(
        model, input_ids, mask, COMPLETION, share_prompts=share, pack=False
    )


def count_backbone_rows(model) -> tuple[list[int], object]:
    """Rows per backbone call (a forward pre-hook on the decoder stack)."""
    rows: list[int] = []
    handle = model.model.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    return rows, handle


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_shared_prompts_give_the_full_forwards_logps_entropy_and_gradients(arch: str) -> None:
    model = tiny(arch)
    input_ids, mask = grouped_batch()
    full = scores_and_grads(model, input_ids, mask, share=False)
    rows, handle = count_backbone_rows(model)
    shared = scores_and_grads(model, input_ids, mask, share=True)
    handle.remove()
    assert rows == [3, 3 * GROUP]  # the three prompts once, then the nine completions
    # Float32 rounding only (tests/tolerance.py): the prompt's keys and values computed once and
    # repeated, attention over a cache plus the completion against one masked forward, and
    # each gradient summed in another order. A completion that missed its prompt (or saw
    # another row's) would differ by more than 1e-2.
    assert_close_f32(shared[0], full[0], ulps=32)
    assert_close_f32(shared[1], full[1], ulps=32)
    assert bool((shared[0][mask[:, -COMPLETION:] == 0] == 0).all())
    for name, grad in full[2].items():
        assert_close_f32(shared[2][name], grad, ulps=64, msg=name)


def test_rows_are_mapped_to_their_prompts() -> None:
    model = tiny("llama")
    input_ids, mask = grouped_batch()
    backbone = resolve_logprob_path(model).backbone
    first, inverse = shared_prompt_rows(backbone, input_ids, mask, COMPLETION)
    assert len(first) == 3
    # every row points at a representative with the same prompt tokens and mask
    prompt = input_ids[:, :PROMPT] * mask[:, :PROMPT]
    assert torch.equal(prompt[first[inverse]], prompt)
    assert torch.equal(mask[first[inverse], :PROMPT], mask[:, :PROMPT])
    # same tokens under a different padding are different prompts
    other = mask.clone()
    other[0, 0] = 0
    assert len(shared_prompt_rows(backbone, input_ids, other,
                                   COMPLETION)[0]) == 4


def test_falls_back_to_the_full_forward_where_sharing_does_not_apply() -> None:
    model = tiny("llama")
    route = resolve_logprob_path(model)
    input_ids, mask = grouped_batch()
    # more than half the rows with distinct prompts: nothing to gain
    assert shared_prompt_rows(route.backbone, input_ids[:5], mask[:5], COMPLETION) is None
    # gradient checkpointing drops the cache the completions would attend to
    enable_activation_checkpointing(model)
    assert shared_prompt_rows(route.backbone, input_ids, mask, COMPLETION) is None
    disable_activation_checkpointing(model)
    # a model type the sharing has not been checked on, or a sliding-window cache
    model.config.model_type = "gpt_neox"
    assert shared_prompt_rows(route.backbone, input_ids, mask, COMPLETION) is None
    qwen = tiny("qwen2")
    qwen.config.use_sliding_window, qwen.config.sliding_window = True, 4
    qwen_backbone = resolve_logprob_path(qwen).backbone
    assert shared_prompt_rows(qwen_backbone, input_ids, mask, COMPLETION) is None
