"""The stand-in for ``Qwen/Qwen2.5-0.5B-Instruct``, the model TRL's vLLM tests load ("tiny
model is too small for vLLM"): a Qwen2 with Qwen2.5-0.5B's layout where vLLM's CPU attention
cares (64-wide heads, tied embeddings, grouped-query attention) at a tiny width, with the
compact Qwen vocabulary of the other stand-ins plus the four tags of TRL's structured-outputs
case as tokens of their own (Qwen2.5's vocabulary spells ``<reasoning>`` in four tokens, the
byte-level stand-in in eleven, which would leave an 8-token completion no room to differ), in
the same hub cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from . import standins

NAME = "Qwen/Qwen2.5-0.5B-Instruct"


def build(cache: Path, tokenizers: dict[str, Any] | None = None) -> Path:
    import transformers

    repo = cache / "models--Qwen--Qwen2.5-0.5B-Instruct"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(standins._REVISION)
    snapshot = repo / "snapshots" / standins._REVISION
    if (snapshot / "config.json").is_file():
        return snapshot
    config = transformers.Qwen2Config(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=1024, tie_word_embeddings=True,
        use_sliding_window=False, **{**standins._ids("qwen", False), "vocab_size": 288})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(snapshot)
    tokenizer = standins.family_tokenizer("qwen", False)  # its own: tokens are added to it
    tokenizer.add_tokens(TAGS)
    assert len(tokenizer) <= config.vocab_size, (len(tokenizer), config.vocab_size)
    tokenizer.save_pretrained(snapshot)
    return snapshot


TAGS = ["<reasoning>", "</reasoning>", "<answer>", "</answer>"]
