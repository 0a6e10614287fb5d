"""Which generation backend runs: an object as given, a registered name, an import path, or
``"auto"`` (the fast ``static`` backend where the model supports it, else ``hf``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from mtgrpo.algo.registry import import_object
from mtgrpo.rollout.base import GenerationBackend, make_backend

logger = logging.getLogger(__name__)

__all__ = ["build_backend"]


def build_backend(
    backend: Any,
    model: Any,
    tokenizer: Any,
    *,
    max_batch_size: int | None = None,
    generation_options: Mapping[str, Any] | None = None,
    requires_generate: str | None = None,
    generation_dtype: Any = None,
) -> GenerationBackend:
    """The generation backend for ``model``.

    ``backend``: a :class:`GenerationBackend` object (used as is), a registered name, an import
    path ``"package.module:factory"`` (called as ``factory(model, tokenizer)``) or ``"auto"``.
    ``generation_options``: extra transformers ``GenerationConfig`` fields for the ``hf``
    backend. ``requires_generate``: the options set that only transformers ``generate``
    implements (e.g. ``"min_p, repetition_penalty"``); ``auto`` then picks ``hf`` and any other
    name is refused. ``generation_dtype``: the static backend generates in this dtype (from a
    copy of the weights) when it differs from the model's; other backends ignore it.
    """
    if not isinstance(backend, str):
        if not isinstance(backend, GenerationBackend):
            raise TypeError(
                f"generation_backend {type(backend).__name__} lacks generate(prompt_ids, params, "
                "num_samples) and update_weights(model, version); see mtgrpo.rollout"
            )
        return backend
    if ":" in backend:
        return import_object(backend)(model, tokenizer)
    name = backend
    if backend == "auto":
        name = "hf" if _needs_hf_generate(model, requires_generate) else _auto_backend(model)
    if name != "hf" and requires_generate:
        raise ValueError(
            f"{requires_generate} need transformers generate, but generation_backend="
            f"{name!r}; use generation_backend='hf' (or 'auto')"
        )
    options: dict[str, Any] = {"max_batch_size": max_batch_size}
    if name == "hf":
        options["generation_options"] = dict(generation_options or {})
    elif name == "static" and generation_dtype is not None:
        options["dtype"] = generation_dtype
    return make_backend(name, model, tokenizer, **options)


def _custom_generate(model: Any) -> bool:
    """The model's class replaces transformers' ``generate`` (custom decoding, or a test's
    mock of it): generation must go through it."""
    from mtgrpo.fast import unwrap_causal_lm

    # the class's attribute: an instance's is a bound method, never `is` the function
    generate = getattr(type(unwrap_causal_lm(model)), "generate", None)
    return generate is not None and generate is not _TRANSFORMERS_GENERATE


def _transformers_generate() -> Any:
    from transformers.generation.utils import GenerationMixin

    return GenerationMixin.generate


_TRANSFORMERS_GENERATE = _transformers_generate()


def _needs_hf_generate(model: Any, requires_generate: str | None) -> bool:
    """Generation must go through transformers ``generate``: an option only it implements, or
    a model class with its own ``generate``."""
    if requires_generate:
        logger.info("generation backend 'hf' (%s need transformers generate)", requires_generate)
        return True
    if _custom_generate(model):
        logger.info("generation backend 'hf' (the model's class has its own generate)")
        return True
    return False


def _auto_backend(model: Any) -> str:
    """``"static"`` (the fast backend) when the model supports a static cache, else ``"hf"``.

    Falling back is logged as a WARNING with the reason and its fix whenever the reason is not
    the model's own architecture (an attention implementation, an installed transformers
    whose interface changed): the fast path is never lost in silence.
    """
    from mtgrpo.fast import check_static_cache_support, unwrap_causal_lm

    try:
        check_static_cache_support(unwrap_causal_lm(model))
    except (ValueError, TypeError) as exc:
        # TypeError: no transformers model at all; otherwise the error says if a setting could
        # fix it, and only such a fallback is worth a WARNING
        inherent = isinstance(exc, TypeError) or getattr(exc, "inherent", True)
        logger.log(
            logging.INFO if inherent else logging.WARNING,
            "generation backend 'hf' (the fast 'static' backend does not apply: %s)", exc,
        )
        return "hf"
    return "static"
