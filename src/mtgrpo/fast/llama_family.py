"""The Llama family of transformers causal LMs, as the code that re-composes their layers sees it.

Llama, Mistral, Qwen2 and Qwen3 share one decoder-layer shape: pre-norm attention and MLP with
residual connections, rotary position embedding, grouped-query attention, optional per-head
q/k norms (Qwen3). Two places compose those layers from the model's own submodules instead of
calling its ``forward``: the static generation backend's decode step
(:class:`mtgrpo.fast.static_decoders.LlamaModulesDecoder`) and the padding-free training
forward (:mod:`mtgrpo.fast.packed`). Both call the same modules (so LoRA layers injected into
the projections still apply), the family's own ``apply_rotary_pos_emb`` and transformers'
attention function for the configured implementation (on the CPU with ``sdpa``, torch's
``scaled_dot_product_attention`` directly, the kernel that function calls; and the decode step
may multiply by transposed copies of plain ``nn.Linear`` weights); what they may serve is
decided here.

Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = [
    "LLAMA_FAMILY",
    "SUPPORTED_ATTENTION",
    "attention_inputs",
    "llama_backbone_mismatch",
    "llama_family_mismatch",
    "llama_functions",
    "rotate_half_function",
]

# Attention implementations whose mask is an additive [n, 1, q, k] tensor we can prepare
# ourselves; flash / flex kernels take other mask formats (and FA2 unpads with a host sync).
SUPPORTED_ATTENTION = ("sdpa", "eager")

# Causal LM class name -> its transformers modeling module. Exact types are checked, so a
# subclass that overrides a forward is not re-composed (its callers fall back to ``forward``).
LLAMA_FAMILY: dict[str, str] = {
    "LlamaForCausalLM": "transformers.models.llama.modeling_llama",
    "MistralForCausalLM": "transformers.models.mistral.modeling_mistral",
    "Qwen2ForCausalLM": "transformers.models.qwen2.modeling_qwen2",
    "Qwen3ForCausalLM": "transformers.models.qwen3.modeling_qwen3",
}
_BACKBONES = {name.removesuffix("ForCausalLM") + "Model": name for name in LLAMA_FAMILY}


def _own_class(module: Any) -> type:
    """``module``'s class, or for a module sharded by FSDP2 (``fully_shard`` makes its class
    ``FSDP<Class>(FSDPModule, Class)``, which adds hooks and methods but leaves every forward
    as it was) the class it was built as."""
    cls = type(module)
    if len(cls.__bases__) == 2 and cls.__bases__[0].__name__ == "FSDPModule" and \
            cls.__bases__[0].__module__.startswith("torch.distributed.fsdp"):
        return cls.__bases__[1]
    return cls


def llama_family_mismatch(lm: Any) -> str | None:
    """Why ``lm`` (a causal LM) cannot be re-composed from its modules; None when it can.

    Every class on the path must be exactly the family's transformers class (a subclass may
    change a forward that is re-composed); FSDP2's sharded classes count as the class they
    wrap (:func:`_own_class`).
    """
    name = _own_class(lm).__name__
    if name not in LLAMA_FAMILY:
        return f"{name} is not one of {sorted(LLAMA_FAMILY)}"
    expected = name.removesuffix("ForCausalLM") + "Model"
    modeling = importlib.import_module(LLAMA_FAMILY[name])
    if _own_class(lm) is not getattr(modeling, name, None):
        return f"{name} is a subclass, not {modeling.__name__}.{name}"
    backbone = getattr(lm, "model", None)
    if _own_class(backbone).__name__ != expected:
        return f"{_own_class(backbone).__name__} found where {expected} was expected"
    return llama_backbone_mismatch(backbone)


def llama_backbone_mismatch(backbone: Any) -> str | None:
    """Why a backbone (``LlamaModel``, ``Qwen2Model``, ...) cannot be re-composed; None when it
    can: the backbone, every decoder layer and every attention block must be exactly the
    family's classes."""
    name = _own_class(backbone).__name__
    if name not in _BACKBONES:
        return f"{name} is not one of {sorted(_BACKBONES)}"
    modeling = importlib.import_module(LLAMA_FAMILY[_BACKBONES[name]])
    family = name.removesuffix("Model")
    expected: list[tuple[object, str]] = [(backbone, name)]
    for layer in getattr(backbone, "layers", []):
        expected += [(layer, f"{family}DecoderLayer"), (layer.self_attn, f"{family}Attention")]
    for module, class_name in expected:
        if _own_class(module) is not getattr(modeling, class_name, None):
            return f"{type(module).__name__} found where {class_name} was expected"
    return None


def llama_functions(backbone: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``(apply_rotary_pos_emb, attention)`` of a family backbone: its modeling module's rotary
    function and transformers' attention function for ``config._attn_implementation``."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    modeling = importlib.import_module(LLAMA_FAMILY[_BACKBONES[_own_class(backbone).__name__]])
    # the same lookup <Family>Attention.forward makes, so both paths run one attention function
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(
        backbone.config._attn_implementation, modeling.eager_attention_forward
    )
    return modeling.apply_rotary_pos_emb, attention


def rotate_half_function(backbone: Any) -> Callable[[Any], Any]:
    """The family's ``rotate_half`` (what its ``apply_rotary_pos_emb`` applies to query and
    key: ``x * cos + rotate_half(x) * sin``)."""
    modeling = importlib.import_module(LLAMA_FAMILY[_BACKBONES[_own_class(backbone).__name__]])
    return modeling.rotate_half


def attention_inputs(
    attn: Any,
    hidden: Any,
    cos_sin: tuple[Any, Any],
    rotary: Callable[..., Any],
    project: Callable[[Any, Any], Any] | None = None,
    *,
    heads_first: bool = True,
) -> tuple[Any, Any, Any]:
    """Query, key and value of ``<Family>Attention.forward`` for ``hidden [b, s, H]``.

    Projections viewed per head, the per-head q/k norms where the family has them (Qwen3,
    before the rotary embedding), transposed to ``[b, heads, s, d]`` (key and value
    ``[b, kv_heads, s, d]``), rotary embedding on query and key with ``cos_sin`` from the
    backbone's ``rotary_emb`` and the family's ``rotary`` (see :func:`llama_functions`).
    ``project(module, x)`` applies a projection module (default: ``module(x)``).
    ``heads_first=False``: ``hidden [s, H]`` and ``cos_sin`` ``[s, d]`` give ``[s, heads, d]``
    (key and value ``[s, kv_heads, d]``), no transposes (the rotary function's
    ``unsqueeze(1)`` of ``cos_sin`` broadcasts over the heads).
    """
    if project is None:
        project = _call
    shape = (*hidden.shape[:-1], -1, attn.head_dim)
    query = project(attn.q_proj, hidden).view(shape)
    key = project(attn.k_proj, hidden).view(shape)
    q_norm = getattr(attn, "q_norm", None)
    if q_norm is not None:
        query, key = q_norm(query), attn.k_norm(key)
    value = project(attn.v_proj, hidden).view(shape)
    if not heads_first:
        return (*rotary(query, key, *cos_sin), value)
    query, key = rotary(query.transpose(1, 2), key.transpose(1, 2), *cos_sin)
    return query, key, value.transpose(1, 2)


def _call(module: Any, hidden: Any) -> Any:
    return module(hidden)
