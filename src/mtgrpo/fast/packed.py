"""Padding-free training forward for Llama-family backbones: every real token once, no padding.

Notation: ``N`` rows, ``T`` columns (``W`` prompt columns, left-padded, then ``L`` completion
columns, right-padded), ``U`` distinct prompts, ``c`` leading tokens all of them share, ``M``
real tokens (those ``c`` once, each distinct prompt's other tokens once, plus every row's
completion tokens), ``S`` attention segments, ``H`` hidden size.

A GRPO micro-batch is mostly padding and repeated prompts: completions of one group range from a
few tokens to the length cap, the ``G`` rows of a group carry the same prompt, and the prompts
of a chat model start with the same template turn (SmolLM2's system turn: 24 of a 75-token
prompt). Here the tokens are packed into one ``[M, H]`` sequence: the shared prefix once, each
distinct prompt's own tokens once, then each row's completion tokens. Embedding, norms,
projections, MLP and the LM head run on those ``M`` tokens only. Attention is the one place
where rows must stay apart; it runs on ``S = [c > 0] + U + N'`` segments gathered from the
packed keys and values (``N'`` rows with at least one completion token):

* the shared prefix (when ``c > 0``): queries = its tokens, keys = the same, causal;
* prompt segment ``u``: queries = its own tokens, keys = the prefix followed by the same,
  causal;
* completion segment ``n``: queries = its completion tokens, keys = the prefix, its prompt's
  own tokens and its own completion tokens, causal.

The static generation backend prefills prompts the same way (``L = 0``, see
:func:`packed_states`).

Segments of similar length are grouped (like length-bucketed micro-batches) and each group is
padded to its longest, at the front: a segment's queries are its last keys, so with keys and
queries right-aligned the group's ``[S, heads, Lq, d]`` queries are the last ``Lq`` of its
``[S, ., Lk, d]`` key slots, and one gather of the packed query, key and value heads together
at the key slots serves every group of a layer (a ``[S, 1, Lq, Lk]`` mask, boolean for ``sdpa``,
additive for ``eager``, keeps each query to its segment's keys). The attention function is the
model's own (on the CPU, ``sdpa`` is called with ``enable_gqa`` rather than through
transformers' wrapper, which copies the key/value heads when a mask is given, and in float32
when the states are in half precision), and the outputs of real queries are gathered back
into packed order.
Where a layer's projections are plain ``nn.Linear`` modules (no LoRA layer, hook or per-head
q/k norm: :func:`_fusable`), the query, key and value come from one product by their
concatenated weights and get the rotary embedding together (value heads with tables 1 and 0),
and the MLP's gate and up are one product: the same arithmetic with fewer operators forward
and backward (per layer and micro-batch of the profile's workload, about 40 fewer).
Autograd sums every row's gradient into its shared prompt tokens, as in the shared-prompt
forward of :mod:`mtgrpo.fast.shared_prompts`, so log-probabilities, entropies and gradients equal
those of the model's padded forward up to float rounding (tests check them against it).

The computation mirrors ``<Family>Model.forward``, ``<Family>DecoderLayer.forward`` and
``<Family>Attention.forward`` of transformers 5.23, calling the model's own submodules (so LoRA
layers still apply) and its ``apply_rotary_pos_emb``; :func:`packed_mismatch` says when it does
not apply (another architecture, a sliding-window layer, an attention implementation other than
``sdpa``/``eager``, parameters sharded by FSDP2), and the caller then runs the padded forward.

Gradient checkpointing (TRL's ``gradient_checkpointing`` and ``gradient_checkpointing_kwargs``,
set on the model by ``activation_checkpointing_enable``) is honoured as the model's own forward
honours it: a decoder layer whose ``gradient_checkpointing`` flag is set runs, in training mode
with gradients on, under the layer's ``_gradient_checkpointing_func`` (``torch.utils.checkpoint``
with the user's kwargs), so autograd keeps one ``[M, H]`` input per layer and the backward pass
recomputes the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from mtgrpo.fast.buckets import plan_micro_batches
from mtgrpo.fast.llama_family import (
    SUPPORTED_ATTENTION,
    attention_inputs,
    llama_backbone_mismatch,
    llama_functions,
    rotate_half_function,
)

__all__ = [
    "ATTENTION_MAX_PADDING",
    "AttentionGroup",
    "PackedLayout",
    "packed_hidden",
    "packed_layout",
    "packed_mismatch",
    "packed_states",
    "shared_prefix",
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

    ``query_index: [S, Lq]`` and ``key_index: [S, Lk]`` index packed tokens, right-aligned
    (0 in the leading slots where a segment is shorter: those keys are masked, those queries'
    outputs discarded); query slot ``i`` is key slot ``Lk - Lq + i`` (a segment's queries are
    its last keys). ``query_valid: [S * Lq]`` marks real queries; ``mask: [S, 1, Lq, Lk]`` is
    True where a query may attend a key (and on the diagonal for a padding query slot, which
    would otherwise attend nothing and make the kernel's softmax NaN).
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
    flattened and concatenated (a layer gathers its query, key and value heads once, at the key
    slots, for all groups).
    ``prefix``: the number of leading prompt tokens every distinct prompt shares (packed once,
    first); ``prompt_index: [U, W]``: the packed token of each distinct prompt's column (0 at
    its left padding).
    """

    token_ids: Tensor
    positions: Tensor
    groups: tuple[AttentionGroup, ...]
    order: Tensor
    predictor: Tensor
    query_slots: Tensor
    key_slots: Tensor
    prefix: int
    prompt_index: Tensor


# Attention segments are grouped like micro-batches: a new group when more than this fraction
# of a segment's padded query x key block would be padding.
# the default of the padded update's length bucketing too (max_padding_fraction,
# docs/configuration.md), where a quarter cut a padded micro-batch's 3.0 CPU-s to 1.9 s
ATTENTION_MAX_PADDING = 0.25


def _starts(counts: Tensor) -> Tensor:
    return torch.cumsum(counts, 0) - counts


def shared_prefix(tokens: Tensor, positions: Tensor, lengths: Tensor) -> int:
    """How many leading real tokens (same ids at the same positions) all the left-padded rows
    of ``tokens, positions: [U, W]`` (``lengths [U]`` real tokens each, right-aligned) share,
    leaving each row at least one token of its own; 0 for fewer than two rows."""
    if tokens.shape[0] < 2:
        return 0
    shortest = int(lengths.min())
    width = tokens.shape[1]
    columns = (width - lengths)[:, None] + torch.arange(shortest, device=tokens.device)  # [U, m]
    ids, places = tokens.gather(1, columns), positions.gather(1, columns)
    same = ((ids == ids[:1]) & (places == places[:1])).all(0)  # [m]
    # cumprod stops at the first column that differs; every prompt keeps an own token: its
    # last (packed_layout's own_start + own_len - 1) predicts its rows' first completion token
    return min(int(same.long().cumprod(0).sum()), shortest - 1)


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
    :meth:`~mtgrpo.policy.micro_batches.PolicyBatch.select` builds them. ``length`` may be 0
    (prompts only, as a generation prefill runs them).

    Packed order: the leading tokens all distinct prompts share (:func:`shared_prefix`: a
    chat template's system turn, say) once, then each prompt's own tokens, then each row's
    completion tokens. Every attention segment reads up to three runs of keys: the shared
    prefix, its prompt's own tokens, its own completion tokens.
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
    prompt_lengths = prompt_len.tolist()  # read once: the sizes below are host integers
    if not (left_padded and right_padded) or min(prompt_lengths) == 0:
        return None
    prefix = shared_prefix(input_ids[first, :width], position_ids[first, :width], prompt_len)
    own_len = prompt_len - prefix  # [U] each prompt's tokens after the shared prefix
    own_mask = prompt_mask & (torch.arange(width, device=device)
                              >= (width - own_len)[:, None])  # [U, W]
    shared_columns = slice(width - prompt_lengths[0], width - prompt_lengths[0] + prefix)
    token_ids = torch.cat([input_ids[first[0], shared_columns],
                           input_ids[first, :width][own_mask],
                           input_ids[:, width:][completion_mask]])
    positions = torch.cat([position_ids[first[0], shared_columns],
                           position_ids[first, :width][own_mask],
                           position_ids[:, width:][completion_mask]])
    own_start = prefix + _starts(own_len)  # [U] into the packed tokens
    completion_start = sum(prompt_lengths) - prefix * (len(prompt_lengths) - 1) + _starts(
        completion_len)  # [N]: after the prefix and every prompt's own tokens
    segments = _segment_table(prefix, prompt_len, own_start, own_len, completion_start,
                              completion_len, inverse)
    spans = torch.stack([segments["offset"], segments["query_count"]], 1).tolist()
    # an unbounded token budget: only the padding fraction splits attention groups
    plan = plan_micro_batches(spans, 1 << 62, max_padding=ATTENTION_MAX_PADDING)
    groups = tuple(
        _attention_group({k: v[torch.as_tensor(part, device=device)] for k, v in segments.items()},
                         # the group's widths: its most queries, its most keys (offset + queries)
                         max(spans[i][1] for i in part), max(sum(spans[i]) for i in part))
        for part in plan
    )
    query_slots = torch.cat([g.query_index.reshape(-1) for g in groups])  # [sum of S * Lq]
    valid = torch.cat([g.query_valid for g in groups])
    order = torch.empty(len(token_ids), dtype=torch.long, device=device)
    # every packed token is the query of exactly one segment: `order` is a permutation
    order[query_slots[valid]] = torch.nonzero(valid).squeeze(1)
    last_prompt = own_start + own_len - 1  # [U]
    # a row's first completion token is predicted by its prompt's last token
    predictor = torch.where(
        columns == 0, last_prompt[inverse][:, None], completion_start[:, None] + columns - 1
    )[completion_mask]
    offset = torch.arange(width, device=device) - (width - prompt_len)[:, None]  # [U, W]
    prompt_index = torch.where(
        offset < prefix, offset, own_start[:, None] + offset - prefix
    # left padding points at token 0: its cache columns hold some key, masked out by the caller
    ).masked_fill(~prompt_mask, 0)
    return PackedLayout(token_ids=token_ids, positions=positions, groups=groups, order=order,
                        predictor=predictor, query_slots=query_slots,
                        key_slots=torch.cat([g.key_index.reshape(-1) for g in groups]),
                        prefix=prefix, prompt_index=prompt_index)


def _segment_table(prefix: int, prompt_len: Tensor, own_start: Tensor, own_len: Tensor,
                   completion_start: Tensor, completion_len: Tensor,
                   inverse: Tensor) -> dict[str, Tensor]:
    """One entry per attention segment of :func:`packed_layout`: the shared prefix (when there
    is one), each prompt's own tokens, each row's completion (rows with one). Its queries
    (start, count, and ``offset``: the keys before its first query), its keys (the shared
    prefix, then its prompt's own tokens, then its own)."""
    rows = torch.nonzero(completion_len > 0).squeeze(1)  # rows with a completion segment
    own_prompt = inverse[rows]
    none = torch.zeros_like(own_len)
    segments = {
        "query_start": torch.cat([own_start, completion_start[rows]]),
        "query_count": torch.cat([own_len, completion_len[rows]]),
        "offset": torch.cat([none + prefix, prompt_len[own_prompt]]),
        "prefix_keys": torch.cat([none + prefix, none[own_prompt] + prefix]),
        "prompt_key_start": torch.cat([own_start, own_start[own_prompt]]),
        "prompt_keys": torch.cat([own_len, own_len[own_prompt]]),
        "own_key_start": torch.cat([none, completion_start[rows]]),
        "own_keys": torch.cat([none, completion_len[rows]]),
    }
    if prefix:  # the shared prefix's own segment, first
        head = {"query_start": 0, "query_count": prefix, "offset": 0, "prefix_keys": prefix,
                "prompt_key_start": 0, "prompt_keys": 0, "own_key_start": 0, "own_keys": 0}
        segments = {k: torch.cat([v.new_tensor([head[k]]), v]) for k, v in segments.items()}
    return segments


def _attention_group(segment: dict[str, Tensor], width_q: int, width_k: int) -> AttentionGroup:
    query_count = segment["query_count"][:, None]  # [S, 1]
    prefix_keys, prompt_keys = segment["prefix_keys"][:, None], segment["prompt_keys"][:, None]
    key_count = prefix_keys + prompt_keys + segment["own_keys"][:, None]  # [S, 1]
    device = query_count.device
    # right-aligned: slot j holds the segment's query / key j - (width - count)
    jq = torch.arange(width_q, device=device) - (width_q - query_count)  # [S, Lq]
    jk = torch.arange(width_k, device=device) - (width_k - key_count)  # [S, Lk]
    query_valid = jq >= 0
    query_index = torch.where(query_valid, segment["query_start"][:, None] + jq, 0)
    key_index = torch.where(  # the shared prefix sits at packed tokens 0..prefix-1
        jk < prefix_keys,
        jk,
        torch.where(
            jk < prefix_keys + prompt_keys,
            segment["prompt_key_start"][:, None] + jk - prefix_keys,
            segment["own_key_start"][:, None] + jk - prefix_keys - prompt_keys,
        ),
    )
    key_valid = jk >= 0  # [S, Lk]
    # query slot i is key slot Lk - Lq + i: it attends the valid key slots up to its own
    own_slot = torch.arange(width_k - width_q, width_k, device=device)  # [Lq]
    slots = torch.arange(width_k, device=device)
    causal = slots[None, :] <= own_slot[:, None]  # [Lq, Lk]
    diagonal = slots[None, :] == own_slot[:, None]
    return AttentionGroup(
        query_index=query_index,
        key_index=torch.where(key_valid, key_index, 0),
        query_valid=query_valid.reshape(-1),
        # the diagonal too: a padding query slot that attends nothing makes the softmax NaN
        mask=((causal & key_valid[:, None, :]) | diagonal).unsqueeze(1),
    )


def _additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    # finfo.min, not -inf, as transformers' own additive masks (masking_utils)
    return torch.where(mask, zero, torch.finfo(dtype).min)


def packed_hidden(backbone: nn.Module, layout: PackedLayout) -> Tensor:
    """Final-norm hidden states ``[K, H]`` that predict each scored completion token."""
    return backbone.norm(_gather(packed_states(backbone, layout), 0, layout.predictor))


def packed_states(
    backbone: nn.Module,
    layout: PackedLayout,
    *,
    project: Callable[[nn.Module, Tensor], Tensor] | None = None,
    mlp: Callable[[nn.Module, Tensor], Tensor] | None = None,
    keys_values: list[tuple[Tensor, Tensor]] | None = None,
) -> Tensor:
    """Hidden states ``[M, H]`` of every packed token after the last layer (before the final
    norm). ``project(module, x)`` and ``mlp(module, x)`` replace the projection and MLP calls
    (the static backend's prefill multiplies by its merged weight copies); ``keys_values``
    receives each layer's key and value ``[M, kv_heads, d]`` (after the rotary embedding), the
    states a key/value cache holds."""
    rotary, attention = llama_functions(backbone)
    # [M, H] with no batch dimension: every projection is one matrix product, no reshapes
    # (the embedding still sees one packed row [1, M], as the model's forward would).
    hidden = backbone.embed_tokens(layout.token_ids[None])[0]
    cos, sin = backbone.rotary_emb(hidden, layout.positions[None])  # [1, M, d]
    # sdpa takes the boolean mask as it is (True = attend); eager adds it to the scores.
    sdpa = backbone.config._attn_implementation == "sdpa"
    if sdpa and hidden.device.type == "cpu" and _SDPA_HAS_GQA:
        attention = _sdpa_with_grouped_heads
    # the slice LlamaModel.forward itself iterates over
    layers = backbone.layers[: backbone.config.num_hidden_layers]
    fused = project is None and mlp is None and keys_values is None and all(
        _fusable(layer) for layer in layers)
    shared = _LayerInputs(
        layout=layout, cos_sin=(cos[0], sin[0]), rotary=rotary, attention=attention,
        rotate_half=rotate_half_function(backbone) if fused else None,
        tables=_head_tables(cos[0], sin[0], layers[0].self_attn) if fused else None,
        masks=[g.mask if sdpa else _additive(g.mask, hidden.dtype) for g in layout.groups],
        # One gather per layer for all groups (and one gradient scatter in the backward,
        # where a gather per group would sum a full-size gradient per group).
        key_sizes=[g.key_index.numel() for g in layout.groups],
        upcast=attention is _sdpa_with_grouped_heads,
        project=project, mlp=mlp, keys_values=keys_values,
    )
    for layer in layers:
        checkpointed = (getattr(layer, "gradient_checkpointing", False) and layer.training
                        and torch.is_grad_enabled() and keys_values is None)
        # a checkpointed layer keeps none of its tensors: its fused weights need no recipe
        run = functools.partial(_decoder_layer, layer, shared, recat=not checkpointed)
        # Gradient checkpointing as the model's own forward does it (transformers'
        # GradientCheckpointingLayer): the layer's checkpoint function, set by
        # `activation_checkpointing_enable` with the user's kwargs (`use_reentrant`,
        # offloading), keeps the layer's input only and runs the layer again in the backward
        # pass. The hidden state goes positionally, as reentrant checkpointing needs.
        hidden = layer._gradient_checkpointing_func(run, hidden) if checkpointed else run(hidden)
    return hidden


@dataclass(frozen=True)
class _LayerInputs:
    """What every decoder layer of one :func:`packed_states` call reads besides its input.
    ``upcast``: attention runs in float32 when the states are in half precision."""

    layout: PackedLayout
    cos_sin: tuple[Tensor, Tensor]
    rotary: Callable[..., tuple[Tensor, Tensor]]
    # fused projections (:func:`_fusable` layers): the family's rotate_half and the rotary
    # tables per head of the fused query | key | value states (:func:`_head_tables`)
    rotate_half: Callable[[Tensor], Tensor] | None
    tables: tuple[Tensor, Tensor] | None
    attention: Callable[..., tuple[Tensor, Any]]
    masks: list[Tensor]
    key_sizes: list[int]
    upcast: bool
    project: Callable[[nn.Module, Tensor], Tensor] | None
    mlp: Callable[[nn.Module, Tensor], Tensor] | None
    keys_values: list[tuple[Tensor, Tensor]] | None


_HALF = (torch.bfloat16, torch.float16)


def _decoder_layer(layer: nn.Module, shared: _LayerInputs, hidden: Tensor, *,
                   recat: bool = True) -> Tensor:
    """``<Family>DecoderLayer.forward`` on the packed tokens: ``hidden [M, H]`` in and out
    (``recat``: fused weights are concatenated again in the backward pass, not kept)."""
    layout, project, attn = shared.layout, shared.project, layer.self_attn
    heads_of = attn.config.num_attention_heads, attn.config.num_key_value_heads
    heads = [heads_of[0], heads_of[1], heads_of[1]]
    if shared.tables is not None and shared.rotate_half is not None:
        states = _fused_attention_states(attn, layer.input_layernorm(hidden), shared.tables,
                                         shared.rotate_half, recat=recat)
    else:
        query, key, value = attention_inputs(  # [M, heads, d]; [M, kv_heads, d]
            attn, layer.input_layernorm(hidden), shared.cos_sin, shared.rotary, project,
            heads_first=False,
        )
        if shared.keys_values is not None:
            shared.keys_values.append((key, value))
        states = torch.cat([query, key, value], 1)  # [M, heads + 2 kv_heads, d]
    dtype = states.dtype
    if shared.upcast and dtype in _HALF:
        # torch's CPU flash-attention backward runs 4x slower in bfloat16 than in float32
        # (measured on an Intel Xeon with AMX), so the CPU attention runs in float32, outside
        # autocast; the forward too, so that a scoring pass gives the training pass's numbers.
        # (Under autocast the float32 rotary tables already made query and key float32 here.)
        states = states.float()
    gathered = _gather(states, 0, layout.key_slots)  # [sum of S * Lk, heads + 2 kv_heads, d]
    parts = gathered.split(shared.key_sizes) if len(shared.key_sizes) > 1 else (gathered,)
    outputs = [_group_attention(attn, shared.attention, group, mask, part, heads)
               for group, mask, part in zip(layout.groups, shared.masks, parts, strict=True)]
    output = _gather(torch.cat(outputs) if len(outputs) > 1 else outputs[0], 0, layout.order)
    if output.dtype != dtype:
        # back to the states' dtype after the float32 attention above
        output = output.to(dtype)  # [M, heads * d]
    hidden = hidden + (attn.o_proj(output) if project is None else project(attn.o_proj, output))
    normed = layer.post_attention_layernorm(hidden)
    if shared.tables is not None:
        return hidden + _fused_mlp(layer.mlp, normed, recat=recat)
    return hidden + (layer.mlp(normed) if shared.mlp is None else shared.mlp(layer.mlp, normed))


def _plain_linear(module: nn.Module) -> bool:
    """A ``torch.nn.Linear`` itself (no subclass, peft layer or hook)."""
    return (type(module) is nn.Linear and not module._forward_hooks
            and not module._forward_pre_hooks and not hasattr(module, "_hf_hook"))


def _fusable(layer: nn.Module) -> bool:
    """Whether a layer's query, key and value projections (and its MLP's gate and up) can run
    as one product each (:func:`_fused_attention_states`, :func:`_fused_mlp`): plain
    ``nn.Linear`` modules, biases all or none, no per-head q/k norms, the family's gated MLP."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv = (attn.q_proj, attn.k_proj, attn.v_proj)
    gate_up = (getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None))
    return (
        getattr(attn, "q_norm", None) is None
        and all(_plain_linear(m) for m in qkv) and len({m.bias is None for m in qkv}) == 1
        and type(mlp).__name__.endswith("MLP") and callable(getattr(mlp, "act_fn", None))
        and not mlp._forward_hooks and not mlp._forward_pre_hooks
        and all(m is not None and _plain_linear(m) for m in gate_up)
        and _plain_linear(mlp.down_proj)
        and len({m.bias is None for m in gate_up}) == 1
        and gate_up[0].weight.shape == gate_up[1].weight.shape
    )


def _head_tables(cos: Tensor, sin: Tensor, attn: nn.Module) -> tuple[Tensor, Tensor]:
    """The rotary tables ``[M, heads + 2 kv_heads, d]`` for fused query | key | value states:
    ``cos, sin [M, d]`` on every query and key head, 1 and 0 on the value heads (which the
    rotary embedding leaves as they are: ``v * 1 + rotate_half(v) * 0 == v``). Built once per
    forward for all layers."""
    rotated = attn.config.num_attention_heads + attn.config.num_key_value_heads
    values = attn.config.num_key_value_heads
    count, dim = cos.shape
    return (
        torch.cat([cos[:, None].expand(count, rotated, dim), cos.new_ones(count, values, dim)], 1),
        torch.cat([sin[:, None].expand(count, rotated, dim), sin.new_zeros(count, values, dim)], 1),
    )


def _linear_by_parts(x: Tensor, parts: tuple[nn.Module, ...], *, recat: bool) -> Tensor:
    """``x`` through ``parts`` (``nn.Linear`` modules of one input) as one product by their
    concatenated weights. The concatenation is a copy of the weights, which the product would
    keep for the backward pass of every layer (+269 MiB on the SmolLM2-135M update, about
    0.9 GiB on Qwen2.5-0.5B's); with ``recat`` (:class:`_ProductByParts`) the backward pass
    concatenates them again instead, one more operator per product."""
    weights = [part.weight for part in parts]
    biases = None if parts[0].bias is None else [part.bias for part in parts]
    if recat and torch.is_grad_enabled():
        return _ProductByParts.apply(x, len(weights), *weights, *(biases or []))
    bias = None if biases is None else torch.cat(biases)
    return torch.nn.functional.linear(x, torch.cat(weights), bias)


class _ProductByParts(torch.autograd.Function):
    """``linear(x, cat(weights), cat(biases))`` keeping ``x`` (in the product's dtype, as
    autocast keeps it) and the weights themselves for the backward pass, not their
    concatenated copy. The backward pass is ``torch.nn.functional.linear``'s (``g @ W``,
    ``g.T @ x``, ``g.sum(0)``) in the product's dtype, each gradient returned in its input's
    dtype: what autograd computes through autocast's casts."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, count: int, *tensors: Tensor) -> Tensor:
        weights, biases = tensors[:count], tensors[count:]
        bias = torch.cat(biases) if biases else None
        out = torch.nn.functional.linear(x, torch.cat(weights), bias)  # autocast applies
        ctx.x_dtype, ctx.bias_dtypes = x.dtype, [b.dtype for b in biases]
        ctx.save_for_backward(_as(x, out.dtype), *weights)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        # Casts and reshapes only where needed: each would be one more dispatched operator
        # per product, which this path exists to save (benchmarks/results/profile_step_cpu.md).
        x, *weights = ctx.saved_tensors
        sizes = [w.shape[0] for w in weights]
        rows = grad if grad.dim() == 2 else grad.reshape(-1, grad.shape[-1])  # [tokens, out]
        flat = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        grad_x = _as(torch.mm(rows, _as(torch.cat(weights), grad.dtype)), ctx.x_dtype)
        products = torch.mm(rows.t(), flat).split(sizes)
        grad_weights = [_as(g, w.dtype) for g, w in zip(products, weights, strict=True)]
        # not strict: without biases bias_dtypes is empty and the split's sums go unused
        grad_biases = [_as(g, dtype) for g, dtype in zip(
            rows.sum(0).split(sizes), ctx.bias_dtypes, strict=False)]
        return (grad_x if x.dim() == 2 else grad_x.view(x.shape), None, *grad_weights,
                *grad_biases)


def _as(tensor: Tensor, dtype: torch.dtype) -> Tensor:
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def _fused_attention_states(attn: nn.Module, normed: Tensor, tables: tuple[Tensor, Tensor],
                            rotate_half: Callable[[Tensor], Tensor], *,
                            recat: bool = True) -> Tensor:
    """Query, key and value heads ``[M, heads + 2 kv_heads, d]`` from one product by the
    concatenated projection weights, the rotary embedding applied to all heads at once
    (the family's ``x * cos + rotate_half(x) * sin``; the value heads' tables are 1 and 0).
    The same numbers as three projections, the family's rotary function and a concatenation
    of the heads, up to the product's float rounding; fewer operators forward and backward."""
    states = _linear_by_parts(normed, (attn.q_proj, attn.k_proj, attn.v_proj),
                              recat=recat).view(normed.shape[0], -1, attn.head_dim)
    cos, sin = tables
    return (states * cos) + (rotate_half(states) * sin)


def _fused_mlp(mlp: nn.Module, normed: Tensor, *, recat: bool = True) -> Tensor:
    """``down(act(gate(x)) * up(x))`` with gate and up as one product by their concatenated
    weights (:func:`_fusable`)."""
    gate, up = _linear_by_parts(normed, (mlp.gate_proj, mlp.up_proj),
                                recat=recat).chunk(2, dim=-1)
    return mlp.down_proj(mlp.act_fn(gate) * up)


def _group_attention(
    attn: nn.Module,
    attention: Callable[..., tuple[Tensor, Any]],
    group: AttentionGroup,
    mask: Tensor,
    gathered: Tensor,
    heads: list[int],
) -> Tensor:
    """One group's attention: ``gathered: [S * Lk, heads + 2 kv_heads, d]``, the query, key
    and value heads at the group's key slots, to the outputs ``[S * Lq, heads * d]`` of its
    query slots (the last ``Lq`` key slots of each segment)."""
    count, width_k = group.key_index.shape
    width_q = group.query_index.shape[1]
    states = gathered.view(count, width_k, -1, gathered.shape[-1]).transpose(1, 2)
    query, key, value = states.split(heads, 1)  # [S, heads | kv_heads, Lk, d]
    if width_q < width_k:
        query = query[:, :, width_k - width_q:]
    output, _ = attention(
        attn, query, key, value, mask,
        # as <Family>Attention.forward: attention dropout only in training mode
        dropout=attn.attention_dropout if attn.training else 0.0,
        scaling=attn.scaling,
    )  # [S, Lq, heads, d]
    return output.reshape(count * width_q, -1)


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
    shared by ``enable_gqa`` instead of copied by ``repeat_kv``: ``[S, Lq, heads, d]`` (a
    transposed view; the caller's reshape copies it once).

    transformers repeats the key/value heads whenever a mask is given (some CUDA kernels lack
    grouped-query support); on the CPU the copy and its backward (a sum over the copies) cost
    about a quarter of a group's attention forward and backward on the benchmark's model, with
    the same gradients. Used on the CPU only (measured there), outside autocast: the caller
    chose the dtype (float32 for half-precision states, see :func:`_decoder_layer`).
    """
    with torch.autocast("cpu", enabled=False):
        output = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling,
            # only when heads are shared: a plain multi-head model keeps sdpa's ordinary call
            enable_gqa=query.shape[1] != key.shape[1],
        )  # [S, heads, Lq, d]
    return output.transpose(1, 2), None
