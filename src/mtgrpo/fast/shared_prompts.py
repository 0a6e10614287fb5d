"""The shared-prompt forward: the ``G`` completions of a GRPO group share one prompt, so the
backbone runs once per distinct prompt and its key/value cache is repeated for the rows that
share it before the completions run on top (:func:`mtgrpo.policy.sequence_logprobs` uses it on
its chunked route when the padding-free forward of :mod:`mtgrpo.fast.packed` does not apply).

Notation: ``N`` rows, ``T`` columns (prompt columns left-padded, then ``L`` completion columns),
``U`` distinct prompts, ``H`` hidden size.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mtgrpo.fast.transformers_compat import cache_argument, returned_cache

__all__ = [
    "PROMPT_SHARING_MODEL_TYPES",
    "distinct_prompts",
    "shared_prompt_hidden",
    "shared_prompt_rows",
]


# Model types whose backbone accepts a key/value cache built from a shared prompt pass and
# attends from the completions to it exactly as in one full forward (checked by tests on each).
PROMPT_SHARING_MODEL_TYPES: tuple[str, ...] = ("llama", "qwen2", "qwen3", "mistral")


def shared_prompt_rows(
    backbone: nn.Module, input_ids: Tensor, attention_mask: Tensor, length: int
) -> tuple[Tensor, Tensor] | None:
    """``(first row of each distinct prompt [U], each row's prompt index [N])``, or ``None``
    when sharing does not apply: the backbone is not a :data:`PROMPT_SHARING_MODEL_TYPES`
    model with a plain (non-sliding) cache, gradient checkpointing is on, the rows have no
    prompt column, fewer than two rows, or more than half the rows have distinct prompts.
    ``input_ids, attention_mask: [N, T]``, the last ``length`` columns are completions."""
    config = getattr(backbone, "config", None)
    width = input_ids.shape[1] - length
    if (
        config is None
        or getattr(config, "model_type", None) not in PROMPT_SHARING_MODEL_TYPES
        # Mistral's config sets sliding_window (4096 by default); Qwen2's use_sliding_window flag
        # decides whether its window applies (transformers 5.24 configuration_qwen2)
        or (getattr(config, "sliding_window", None) is not None
        and getattr(config, "use_sliding_window", True))
        # checkpointed layers keep no cache for the completions to attend to
        or getattr(backbone, "gradient_checkpointing", False)
        or width < 1
        or input_ids.shape[0] < 2
    ):
        return None
    first, inverse = distinct_prompts(input_ids, attention_mask, width)
    if 2 * first.shape[0] > input_ids.shape[0]:
        return None
    return first, inverse


def distinct_prompts(
    input_ids: Tensor, attention_mask: Tensor, width: int
) -> tuple[Tensor, Tensor]:
    """``(first row of each distinct prompt [U], each row's prompt index [N])``: rows whose
    first ``width`` columns hold the same tokens under the same mask share a prompt."""
    # pad ids zeroed (they are never attended to), the mask kept (where padding is matters)
    prompts = torch.cat([input_ids[:, :width] * attention_mask[:, :width],
                         attention_mask[:, :width]], dim=1)
    # torch.unique sorts the rows: each prompt's first row is recovered below with "amin"
    unique, inverse = torch.unique(prompts, dim=0, return_inverse=True)
    # N, above every row index: amin's starting value
    first = torch.full((unique.shape[0],), input_ids.shape[0], dtype=torch.long,
                       device=input_ids.device)
    first = first.scatter_reduce(0, inverse, torch.arange(input_ids.shape[0],
                                                          device=input_ids.device), "amin")
    return first, inverse


def shared_prompt_hidden(
    backbone: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    length: int,
    first: Tensor,
    inverse: Tensor,
) -> Tensor:
    """``[N, L, H]`` hidden states before each completion token, the prompts run once each.

    ``first, inverse``: :func:`shared_prompt_rows`. The backbone runs on the ``U`` distinct
    prompts, its key/value cache is repeated for the rows that share each, and the completions
    run on top of it; autograd sums the rows' gradients into the shared prompt pass.
    """
    from transformers import DynamicCache

    width = input_ids.shape[1] - length
    prompt = backbone(
        input_ids=input_ids[first, :width],
        attention_mask=attention_mask[first, :width],
        position_ids=position_ids[first, :width],
        use_cache=True,
    )  # fmt: skip
    cache = returned_cache(prompt)
    layers = getattr(cache, "layers", None)
    if layers is None or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
        raise RuntimeError(f"shared prompts need a plain DynamicCache, got {type(cache).__name__}")
    # indexed per row, not expanded: the index's backward sums the rows' gradients into the prompt
    repeated = DynamicCache(
        ddp_cache_data=[(layer.keys[inverse], layer.values[inverse]) for layer in layers]
    )
    completion = backbone(
        input_ids=input_ids[:, width:],
        attention_mask=attention_mask,
        position_ids=position_ids[:, width:],
        use_cache=True,
        **cache_argument(repeated),
    ).last_hidden_state  # [N, L, H]
    last_prompt = prompt.last_hidden_state[inverse, -1:]  # [N, 1, H]: predicts token 0
    return torch.cat([last_prompt, completion[:, :-1]], dim=1)
