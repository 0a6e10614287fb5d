"""Turning what a user passes into the objects the loop needs (cheap checks first)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mtgrpo._registry import import_object
from mtgrpo.config import GRPOConfig
from mtgrpo.models.transformers_compat import enable_activation_checkpointing
from mtgrpo.rewards import RewardSuite
from mtgrpo.rewards.registry import resolve_reward

logger = logging.getLogger(__name__)

__all__ = ["build_backend", "build_reward_suite", "load_policy", "training_rows"]


def training_rows(train: Any, evaluation: Any, task_column: str):
    """Train and eval rows as lists of dicts with a ``task`` key; test data refused for training."""
    from mtgrpo.tasks import ensure_trainable, load_rows
    from mtgrpo.trainer.data import is_lazy_split

    def rows_of(source: Any) -> Any:
        return source if is_lazy_split(source) else load_rows(source, task_column=task_column)

    train_rows = rows_of(train)
    if is_lazy_split(train_rows):
        if getattr(train_rows, "name", None) == "test":
            raise ValueError("a test split cannot be used for training; pass it as eval data")
    else:
        ensure_trainable(train_rows)
    eval_rows = None if evaluation is None else rows_of(evaluation)
    return train_rows, eval_rows


def _resolve_all(spec: Any) -> Any:
    if isinstance(spec, Mapping):
        return {task: _resolve_all(fns) for task, fns in spec.items()}
    if isinstance(spec, list | tuple):
        return [resolve_reward(f) for f in spec]
    return resolve_reward(spec)


def build_reward_suite(reward_funcs: Any, args: GRPOConfig) -> RewardSuite:
    """The reward suite from functions, names, import paths, reward models or a routing table."""
    if isinstance(reward_funcs, RewardSuite):
        return reward_funcs
    if reward_funcs is None or (isinstance(reward_funcs, list | tuple | Mapping)
                                and not reward_funcs):
        raise ValueError(
            "reward_funcs is empty; give at least one reward function, a routing table "
            "{task: [functions]}, or a reward model"
        )
    return RewardSuite.from_user(
        _resolve_all(reward_funcs), reward_weights=args.reward_weights,
        on_unscorable=args.on_unscorable,
    )


def _model_spec(model: Any, init: Mapping[str, Any]) -> Any:
    gguf_file = init.get("gguf_file")
    if gguf_file is not None and isinstance(model, str | Path):
        return {"path": str(model), "gguf_file": gguf_file}
    return model


def load_policy(model: Any, processing_class: Any, peft_config: Any, args: GRPOConfig):
    """``(model, tokenizer, is_peft)``: the policy ready for training (LoRA applied if asked)."""
    from mtgrpo.models import apply_lora, load_model, load_tokenizer

    init = dict(args.model_init_kwargs)
    unknown = sorted(set(init) - {"dtype", "torch_dtype", "attn_implementation",
                                  "trust_remote_code", "revision", "gguf_file"})
    if unknown:
        raise ValueError(
            f"model_init_kwargs has unknown option(s) {unknown}; use dtype, "
            "attn_implementation, trust_remote_code, revision or gguf_file"
        )
    spec = _model_spec(model, init)
    loaded = load_model(
        spec, dtype=init.get("dtype", init.get("torch_dtype")), for_training=True,
        trust_remote_code=bool(init.get("trust_remote_code", False)),
        revision=init.get("revision"), attn_implementation=init.get("attn_implementation"),
    )
    tokenizer = load_tokenizer(processing_class if processing_class is not None else (
        loaded if not isinstance(spec, str | Path | Mapping) else spec
    ), trust_remote_code=bool(init.get("trust_remote_code", False)))
    is_peft = _is_peft(loaded)
    if peft_config is not None:
        loaded = apply_lora(loaded, peft_config)
        is_peft = True
    if args.gradient_checkpointing:
        enable_activation_checkpointing(loaded, {"use_reentrant": False})
        if is_peft:
            loaded.enable_input_require_grads()
    return loaded, tokenizer, is_peft


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a core dependency
        return False
    return isinstance(model, PeftModel)


def build_backend(backend: Any, model: Any, tokenizer: Any, args: GRPOConfig) -> Any:
    """The generation backend: an object as given, a registered name, or an import path."""
    from mtgrpo.rollout import GenerationBackend, make_backend

    if backend is None:
        backend = args.generation_backend
    if not isinstance(backend, str):
        if not isinstance(backend, GenerationBackend):
            raise TypeError(
                f"generation_backend {type(backend).__name__} lacks generate(prompt_ids, params, "
                "num_samples) and update_weights(model, version); see mtgrpo.rollout"
            )
        return backend
    if ":" in backend:
        return import_object(backend)(model, tokenizer)
    name = _auto_backend(model) if backend == "auto" else backend
    return make_backend(name, model, tokenizer, max_batch_size=args.generation_batch_size)


def _auto_backend(model: Any) -> str:
    """``"static"`` (the fast backend) when the model supports a static cache, else ``"hf"``.

    Falling back is logged as a WARNING with the reason and its fix whenever the reason is not
    the model's own architecture (an attention implementation, an installed transformers
    whose interface changed): the fast path is never lost in silence.
    """
    from mtgrpo.rollout.static_decoders import check_static_cache_support, unwrap_causal_lm

    try:
        check_static_cache_support(unwrap_causal_lm(model))
    except (ValueError, TypeError) as exc:
        inherent = isinstance(exc, TypeError) or getattr(exc, "inherent", True)
        logger.log(
            logging.INFO if inherent else logging.WARNING,
            "generation backend 'hf' (the fast 'static' backend does not apply: %s)", exc,
        )
        return "hf"
    return "static"
