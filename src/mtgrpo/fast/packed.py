"""Padding-free training forward for Llama-family backbones: every real token once, no padding.

Notation: ``N`` rows, ``T`` columns (``W`` prompt columns, left-padded, then ``L`` completion
columns, right-padded), ``U`` distinct prompts, ``M`` real tokens (each distinct prompt's once,
plus every row's completion tokens), ``S`` attention segments, ``H`` hidden size.

A GRPO micro-batch is mostly padding and repeated prompts: completions of one group range from a
few tokens to the length cap, and the ``G`` rows of a group carry the same prompt. Here the
tokens are packed into one ``[M, H]`` sequence: each distinct prompt's tokens once, then each
row's completion tokens. Embedding, norms, projections, MLP and the LM head run on those ``M``
tokens only. Attention is the one place where rows must stay apart; it runs on ``S = U + N'``
segments gathered from the packed keys and values (``N'`` rows with at least one completion
token):

* prompt segment ``u``: queries = its prompt tokens, keys = the same, causal;
* completion segment ``n``: queries = its completion tokens, keys = its prompt's tokens followed
  by its own completion tokens, causal.

Segments of similar length are grouped (like length-bucketed micro-batches) and each group is
padded to its longest (``[S, heads, Lq, d]`` queries, ``[S, kv_heads, Lk, d]`` keys/values, a
``[S, 1, Lq, Lk]`` mask: boolean for ``sdpa``, additive for ``eager``); the attention function is
the model's own (on the CPU, ``sdpa`` is called with ``enable_gqa`` rather than through
transformers' wrapper, which copies the key/value heads when a mask is given), and the outputs
of real queries are gathered back into packed order.
Autograd sums every row's gradient into its shared prompt tokens, as in the shared-prompt
forward of :mod:`mtgrpo.fast.shared_prompts`, so log-probabilities, entropies and gradients equal
those of the model's padded forward up to float rounding (tests check them against it).

The computation mirrors ``<Family>Model.forward``, ``<Family>DecoderLayer.forward`` and
``<Family>Attention.forward`` of transformers 5.23, calling the model's own submodules (so LoRA
layers still apply) and its ``apply_rotary_pos_emb``; :func:`packed_mismatch` says when it does
not apply (another architecture, a sliding-window layer, gradient checkpointing, an attention
implementation other than ``sdpa``/``eager``, parameters sharded by FSDP2), and the caller
then runs the padded forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mtgrpo.fast.buckets import plan_micro_batches
from mtgrpo.fast.llama_family import (
    SUPPORTED_ATTENTION,
    attention_inputs,
    llama_backbone_mismatch,
    llama_functions,
)

__all__ = [
    "ATTENTION_MAX_PADDING",
    "AttentionGroup",
    "PackedLayout",
    "packed_hidden",
    "packed_layout",
    "packed_mismatch",
]


def packed_mismatch(backbone: nn.Module) -> str | None:
    """Why ``backbone`` cannot run the packed forward (None when it can)."""
    reason = llama_backbone_mismatch(backbone)
    if reason is not None:
        return reason
    config = backbone.config
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in SUPPORTED_ATTENTION:
        return f"attn_implementation {implementation!r} is not one of {SUPPORTED_ATTENTION}"
    if getattr(backbone, "gradient_checkpointing", False):
        return "gradient checkpointing is on (the padded forward checkpoints each layer)"
    if _sharded(backbone):
        # FSDP2 gathers a layer's parameters in the layer's own forward, which is not called.
        return "parameters are sharded DTensors (FSDP2)"
    for layer in backbone.layers[: config.num_hidden_layers]:
        if getattr(layer.self_attn, "sliding_window", None) is not None:
            return "a layer uses sliding-window attention"
    return None


def _sharded(backbone: nn.Module) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(parameter, DTensor) for parameter in backbone.parameters())


@dataclass(frozen=True)
class AttentionGroup:
    """Segments that run through one attention call, padded to the group's longest.

    ``query_index: [S, Lq]`` and ``key_index: [S, Lk]`` index packed tokens (0 where a segment
    is shorter: those slots are masked or discarded); ``query_valid: [S * Lq]`` marks real
    queries; ``mask: [S, 1, Lq, Lk]`` is True where a query may attend a key.
    """

    query_index: Tensor
    key_index: Tensor
    query_valid: Tensor
    mask: Tensor


@dataclass(frozen=True)
class PackedLayout:
    """Where every packed token comes from and goes to (index tensors on the batch's device).

    ``token_ids, positions: [M]``; ``groups``: the attention calls; ``order: [M]``: packed
    token ``t``'s attention output is row ``order[t]`` of the groups' padded query slots
    concatenated (``S * Lq`` rows per group, row-major); ``predictor: [K]``: for each scored
    completion token (row-major over the completion mask), the packed token whose hidden state
    predicts it. ``query_slots`` / ``key_slots``: every group's ``query_index`` / ``key_index``
    flattened and concatenated, so that a layer gathers each tensor once for all groups.
    """

    token_ids: Tensor
    positions: Tensor
    groups: tuple[AttentionGroup, ...]
    order: Tensor
    predictor: Tensor
    query_slots: Tensor
    key_slots: Tensor


# Attention segments are grouped like micro-batches: a new group when more than this fraction
# of a segment's padded query x key block would be padding.
ATTENTION_MAX_PADDING = 0.25


def _starts(counts: Tensor) -> Tensor:
    return torch.cumsum(counts, 0) - counts


def packed_layout(
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    length: int,
    first: Tensor,
    inverse: Tensor,
) -> PackedLayout | None:
    """The packed layout of a padded batch, or None when its padding is not TRL's layout.

    ``first [U]`` is one row per distinct prompt and ``inverse [N]`` each row's prompt (pass
    ``arange(N)`` twice for no sharing). The layout needs every prompt to be left-padded with
    at least one real token and every completion right-padded (real tokens first), which is how
    :meth:`~mtgrpo.policy.micro_batches.PolicyBatch.select` builds them.
    """
    width = input_ids.shape[1] - length
    device = input_ids.device
    prompt_mask = attention_mask[first, :width].bool()  # [U, W]
    completion_mask = attention_mask[:, width:].bool()  # [N, L]
    prompt_len = prompt_mask.sum(1)
    completion_len = completion_mask.sum(1)
    columns = torch.arange(length, device=device)
    left_padded = torch.equal(
        prompt_mask, torch.arange(width, device=device) >= (width - prompt_len)[:, None]
    )
    right_padded = torch.equal(completion_mask, columns < completion_len[:, None])
    if not (left_padded and right_padded) or bool((prompt_len == 0).any()):
        return None
    num_prompt_tokens = int(prompt_len.sum())
    token_ids = torch.cat([input_ids[first, :width][prompt_mask],
                           input_ids[:, width:][completion_mask]])
    positions = torch.cat([position_ids[first, :width][prompt_mask],
                           position_ids[:, width:][completion_mask]])
    prompt_start = _starts(prompt_len)  # [U] into the packed tokens
    completion_start = num_prompt_tokens + _starts(completion_len)  # [N]
    rows = torch.nonzero(completion_len > 0).squeeze(1)  # rows with a completion segment
    own_prompt = inverse[rows]
    no_keys = torch.zeros_like(prompt_len)
    # One entry per segment (prompt segments first): where its queries start and how many
    # there are; its keys: the first `prompt_keys` from the prompt at `prompt_key_start`,
    # then its own tokens from `own_key_start`; query j sits at sequence index offset + j.
    segments = {
        "query_start": torch.cat([prompt_start, completion_start[rows]]),
        "query_count": torch.cat([prompt_len, completion_len[rows]]),
        "prompt_key_start": torch.cat([prompt_start, prompt_start[own_prompt]]),
        "prompt_keys": torch.cat([prompt_len, prompt_len[own_prompt]]),
        "own_keys": torch.cat([no_keys, completion_len[rows]]),
        # key j >= the prompt's length is the segment's own token j - prompt length
        "own_key_start": torch.cat([prompt_start, completion_start[rows] - prompt_len[own_prompt]]),
        "offset": torch.cat([no_keys, prompt_len[own_prompt]]),
    }
    spans = torch.stack([segments["offset"], segments["query_count"]], 1).tolist()
    plan = plan_micro_batches(spans, 1 << 62, max_padding=ATTENTION_MAX_PADDING)
    groups = tuple(
        _attention_group({k: v[torch.as_tensor(part, device=device)] for k, v in segments.items()})
        for part in plan
    )
    query_slots = torch.cat([g.query_index.reshape(-1) for g in groups])  # [sum of S * Lq]
    valid = torch.cat([g.query_valid for g in groups])
    order = torch.empty(len(token_ids), dtype=torch.long, device=device)
    order[query_slots[valid]] = torch.nonzero(valid).squeeze(1)
    last_prompt = prompt_start + prompt_len - 1  # [U]
    predictor = torch.where(
        columns == 0, last_prompt[inverse][:, None], completion_start[:, None] + columns - 1
    )[completion_mask]
    return PackedLayout(token_ids=token_ids, positions=positions, groups=groups, order=order,
                        predictor=predictor, query_slots=query_slots,
                        key_slots=torch.cat([g.key_index.reshape(-1) for g in groups]))


def _attention_group(segment: dict[str, Tensor]) -> AttentionGroup:
    query_count = segment["query_count"]
    key_count = segment["prompt_keys"] + segment["own_keys"]
    device = query_count.device
    jq = torch.arange(int(query_count.max()), device=device)
    jk = torch.arange(int(key_count.max()), device=device)
    query_valid = jq < query_count[:, None]  # [S, Lq]
    query_index = torch.where(query_valid, segment["query_start"][:, None] + jq, 0)
    key_index = torch.where(
        jk < segment["prompt_keys"][:, None],
        segment["prompt_key_start"][:, None] + jk,
        segment["own_key_start"][:, None] + jk,
    )
    key_valid = jk < key_count[:, None]  # [S, Lk]
    causal = jk[None, None, :] <= (segment["offset"][:, None] + jq)[:, :, None]  # [S, Lq, Lk]
    return AttentionGroup(
        query_index=query_index,
        key_index=torch.where(key_valid, key_index, 0),
        query_valid=query_valid.reshape(-1),
        mask=(causal & key_valid[:, None, :]).unsqueeze(1),
    )


def _additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, torch.finfo(dtype).min)


def packed_hidden(backbone: nn.Module, layout: PackedLayout) -> Tensor:
    """Final-norm hidden states ``[K, H]`` that predict each scored completion token."""
    rotary, attention = llama_functions(backbone)
    hidden = backbone.embed_tokens(layout.token_ids[None])  # [1, M, H]
    cos_sin = backbone.rotary_emb(hidden, layout.positions[None])
    # sdpa takes the boolean mask as it is (True = attend); eager adds it to the scores.
    sdpa = backbone.config._attn_implementation == "sdpa"
    masks = [g.mask if sdpa else _additive(g.mask, hidden.dtype) for g in layout.groups]
    if sdpa and hidden.device.type == "cpu" and _SDPA_HAS_GQA:
        attention = _sdpa_with_grouped_heads
    # One gather per tensor and layer for all groups (and one gradient scatter in the
    # backward, where a gather per group would sum a full-size gradient per group).
    query_sizes = [g.query_index.numel() for g in layout.groups]
    key_sizes = [g.key_index.numel() for g in layout.groups]
    for layer in backbone.layers[: backbone.config.num_hidden_layers]:
        attn = layer.self_attn
        # query [heads, M, d]; key, value [kv_heads, M, d]
        query, key, value = (
            t.squeeze(0)
            for t in attention_inputs(attn, layer.input_layernorm(hidden), cos_sin, rotary)
        )
        queries = _gather(query, 1, layout.query_slots).split(query_sizes, 1)
        keys = _gather(key, 1, layout.key_slots).split(key_sizes, 1)
        values = _gather(value, 1, layout.key_slots).split(key_sizes, 1)
        outputs = []
        for group, mask, q, k, v in zip(layout.groups, masks, queries, keys, values, strict=True):
            output, _ = attention(
                attn,
                _segments(q, group.query_index),  # [S, heads, Lq, d]
                _segments(k, group.key_index),  # [S, kv_heads, Lk, d]
                _segments(v, group.key_index),
                mask,
                dropout=attn.attention_dropout if attn.training else 0.0,
                scaling=attn.scaling,
            )  # [S, Lq, heads, d]
            outputs.append(output.reshape(group.query_valid.shape[0], -1))
        output = _gather(torch.cat(outputs), 0, layout.order)  # [M, heads * d], packed order
        hidden = hidden + attn.o_proj(output[None])
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return _gather(backbone.norm(hidden).squeeze(0), 0, layout.predictor)


# ``enable_gqa`` arrived in torch 2.5; before it the CPU path keeps transformers' function.
_SDPA_HAS_GQA = torch.torch_version.TorchVersion(torch.__version__) >= "2.5"


def _gather(states: Tensor, dim: int, index: Tensor) -> Tensor:
    """``states`` at ``index`` along ``dim``. On the CPU ``index_select``, whose backward
    (``index_add_``) is faster than advanced indexing's accumulating ``index_put_``; elsewhere
    advanced indexing, whose backward stays deterministic on CUDA where ``index_add_`` would
    add the gradients of repeated indices (shared prompt keys) atomically, in any order."""
    if states.device.type == "cpu":
        return states.index_select(dim, index)
    return states[(slice(None),) * dim + (index,)]


def _sdpa_with_grouped_heads(
    attn: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor,
    dropout: float,
    scaling: float,
) -> tuple[Tensor, None]:
    """transformers' ``sdpa_attention_forward`` for a boolean mask, with the key/value heads
    shared by ``enable_gqa`` instead of copied by ``repeat_kv``: ``[S, Lq, heads, d]``.

    transformers repeats the key/value heads whenever a mask is given (some CUDA kernels lack
    grouped-query support); on the CPU the copy and its backward (a sum over the copies) cost
    about a quarter of a group's attention forward and backward on the benchmark's model, with
    the same gradients. Used on the CPU only (measured there).
    """
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )  # [S, heads, Lq, d]
    return output.transpose(1, 2).contiguous(), None


def _segments(gathered: Tensor, index: Tensor) -> Tensor:
    """``gathered: [heads, S * Lq, d]`` (the states at ``index``'s slots, row-major) viewed as
    ``[S, heads, Lq, d]``."""
    heads, _, dim = gathered.shape
    return gathered.view(heads, *index.shape, dim).transpose(0, 1)
