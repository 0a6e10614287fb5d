"""What differs between the transformers releases mtgrpo supports, in one place.

The fast paths (the static generation backend, the padding-free and shared-prompt
log-probabilities) call transformers' models below their ``generate``/``forward`` surface, so
they notice when transformers renames or reshapes something. Each such difference is one
function here, and ``tests/fast/test_transformers_compat.py`` tests both sides of it (the
installed release, and a stand-in of the other); ``scripts/test-matrix.sh`` runs the fast
paths' tests on the oldest admitted, the locked and the newest release.

* **The KV cache's name.** transformers 5.24 renamed the models' ``forward`` argument
  ``past_key_values`` to ``cache`` and the output field likewise (the old argument is
  accepted, with a deprecation warning, until 5.40). :func:`cache_keyword` gives the name the
  installed release uses, read off its output classes (not a version number, so development
  builds are read correctly); :func:`cache_argument` and :func:`returned_cache` use it.

* **One-token grouped-query attention.** From 5.23 transformers' ``sdpa`` wrapper runs a
  one-token query with the query heads that share a key/value head stacked as that head's
  queries (its ``pack_gqa``); before, it repeated the key/value heads. The static decoder
  calls torch's kernel directly the 5.23 way only where the wrapper does the same, so its
  logits stay those of the model's ``forward`` bit for bit
  (:func:`sdpa_packs_one_token_queries`).

* **Activation checkpointing's name.** 5.23 renamed ``gradient_checkpointing_enable(
  gradient_checkpointing_kwargs=...)`` to ``activation_checkpointing_enable(
  activation_checkpointing_kwargs=...)`` (the old name warns until 6.0):
  :func:`enable_activation_checkpointing` and :func:`disable_activation_checkpointing` call
  whichever the model has.

Which models the static backend can serve is decided by running them, not by reading names:
see :func:`mtgrpo.fast.static_decoders.check_static_cache_support`.

Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = [
    "CACHE_KEYWORDS",
    "cache_argument",
    "cache_keyword",
    "disable_activation_checkpointing",
    "enable_activation_checkpointing",
    "returned_cache",
    "sdpa_packs_one_token_queries",
]

# Every name a transformers release has given the KV cache argument, newest first.
CACHE_KEYWORDS = ("cache", "past_key_values")


def cache_keyword(output_type: type | None = None) -> str:
    """The name the installed transformers gives the KV cache, as a ``forward`` argument and
    as an output field: ``"cache"`` from 5.24 on, ``"past_key_values"`` before.

    ``output_type``: the output class to read it off (default: transformers'
    ``BaseModelOutputWithPast``, whose field the rename changed).
    """
    if output_type is None:
        return _installed_cache_keyword()
    # read off the class, not a version number: development builds are read correctly
    fields = getattr(output_type, "__dataclass_fields__", {})
    for name in CACHE_KEYWORDS:
        if name in fields:
            return name
    raise TypeError(
        f"{output_type.__name__} has none of the cache fields {CACHE_KEYWORDS}; this "
        "transformers release is not one mtgrpo supports (see requirements/lock.txt)"
    )


@functools.cache
def _installed_cache_keyword() -> str:
    from transformers.modeling_outputs import BaseModelOutputWithPast

    return cache_keyword(BaseModelOutputWithPast)


def cache_argument(cache: Any, keyword: str | None = None) -> dict[str, Any]:
    """``{name: cache}`` to pass to a model's ``forward``: ``keyword`` when given (a name a
    probe of the model found, see the static backend), else :func:`cache_keyword`."""
    return {keyword or cache_keyword(): cache}


def returned_cache(output: Any) -> Any:
    """The KV cache a model's output holds (``output.cache`` or ``output.past_key_values``),
    None when it holds none."""
    for name in CACHE_KEYWORDS:
        value = getattr(output, name, None)
        if value is not None:
            return value
    return None


def sdpa_packs_one_token_queries(sdpa_module: Any = None) -> bool:
    """Whether transformers' ``sdpa`` attention wrapper stacks grouped query heads for a
    one-token query (5.23 on) rather than repeating the key/value heads.

    ``sdpa_module``: the module to read it off (default:
    ``transformers.integrations.sdpa_attention``).
    """
    if sdpa_module is None:
        return _installed_sdpa_packs()
    return callable(getattr(sdpa_module, "pack_gqa", None))


@functools.cache
def _installed_sdpa_packs() -> bool:
    from transformers.integrations import sdpa_attention

    return sdpa_packs_one_token_queries(sdpa_attention)


def enable_activation_checkpointing(model: Any, kwargs: dict[str, Any] | None = None) -> None:
    """Turn on activation (gradient) checkpointing of a transformers or peft model with
    ``kwargs`` for ``torch.utils.checkpoint`` (transformers' default: ``use_reentrant=False``),
    through ``activation_checkpointing_enable`` where the release has it (5.23 on), else
    ``gradient_checkpointing_enable``."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if callable(enable):
        # transformers 5.23 on; the old name still works there but warns until 6.0
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def disable_activation_checkpointing(model: Any) -> None:
    """Turn activation checkpointing off (see :func:`enable_activation_checkpointing`)."""
    disable = getattr(model, "activation_checkpointing_disable", None)
    if callable(disable):
        disable()
    else:
        model.gradient_checkpointing_disable()
