"""The tiny model with a BPE vocabulary learned from task texts."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from mtgrpo.models import build_tiny_model, build_tiny_tokenizer

CORPUS = [
    "Calculate 5 - 3.\n\nPut your final answer in <answer> </answer> tags.",
    "Spell this word backward (example: sun -> nus): cat",
    "<answer> 2 </answer>",
] * 50


def test_learned_vocabulary_shortens_task_text_and_round_trips(tmp_path):
    text = "Calculate 7 - 2.\n\nPut your final answer in <answer> </answer> tags. é ✓"
    byte_level = build_tiny_tokenizer()
    learned = build_tiny_tokenizer(corpus=CORPUS, vocab_size=400)
    assert 256 < len(learned) <= 400 + 3
    assert len(learned(text)["input_ids"]) < len(byte_level(text)["input_ids"]) / 2
    assert learned.decode(learned(text)["input_ids"]) == text  # every byte stays representable

    out = build_tiny_model(tmp_path / "m", corpus=CORPUS, vocab_size=400)
    reloaded = AutoTokenizer.from_pretrained(out)
    chat = [{"role": "user", "content": text}]
    for probe in (text, reloaded.apply_chat_template(chat, tokenize=False,
                                                      add_generation_prompt=True)):
        assert reloaded(probe)["input_ids"] == learned(probe)["input_ids"]
    assert reloaded.eos_token == "<|im_end|>"
    assert reloaded.convert_tokens_to_ids("<|im_end|>") == len(reloaded) - 1


def test_learned_vocabulary_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="give both corpus and vocab_size"):
        build_tiny_tokenizer(corpus=CORPUS)
    with pytest.raises(ValueError, match="must be in"):
        build_tiny_tokenizer(corpus=CORPUS, vocab_size=100)
    with pytest.raises(ValueError, match="needs arch='llama'"):
        build_tiny_model(tmp_path / "q", arch="qwen2", corpus=CORPUS, vocab_size=400)
