"""The tiny local model: files, size, determinism, and the tokenizer round trip."""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import pytest
import torch
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer

from mtgrpo.models import build_tiny_model, build_tiny_tokenizer, ensure_tiny_model

SPECIAL_IDS = {"<|endoftext|>": 256, "<|im_start|>": 257, "<|im_end|>": 258}

VARIED_TEXT = (
    "Hello, World! It's 12:45 -- (a+b)*c = 3.14159; x_1 != y_2?\n"
    "\ttabs\tand  double  spaces,\r\nCRLF, trailing space \n"
    "unicode: caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \u0421\u043b\u0430\u0432\u0430 "
    "\U0001f600 \u00bd\u2192\u221e\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|><|endoftext|>"
)


def _reference_ids(text: str) -> list[int]:
    """Ids from first principles: special tokens by name, every other byte of the NFC-normalised
    UTF-8 text to its position in the byte-level alphabet sorted by code point."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    byte_to_char = dict(enumerate(_gpt2_bytes_to_unicode()))
    pieces = re.split("(" + "|".join(re.escape(t) for t in SPECIAL_IDS) + ")", text)
    ids = []
    for piece in pieces:
        if piece in SPECIAL_IDS:
            ids.append(SPECIAL_IDS[piece])
            continue
        for byte in unicodedata.normalize("NFC", piece).encode("utf-8"):
            ids.append(alphabet.index(byte_to_char[byte]))
    return ids


def _gpt2_bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table, written out (byte order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def test_saved_files_and_generation_config(tiny_model_dir: Path) -> None:
    names = {p.name for p in tiny_model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= names
    tokenizer_config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert "{%- if add_generation_prompt %}" in tokenizer_config["chat_template"]
    generation = json.loads((tiny_model_dir / "generation_config.json").read_text())
    # EOS = <|im_end|> (end of a chat turn) and <|endoftext|>; pad = <|endoftext|>.
    assert generation["eos_token_id"] == [258, 256]
    assert generation["pad_token_id"] == 256


@pytest.mark.parametrize(("arch", "qkv_bias"), [("llama", 0), ("qwen2", 1)])
def test_parameter_count_follows_the_shape(tmp_path: Path, arch: str, qkv_bias: int) -> None:
    build_tiny_model(tmp_path, arch=arch)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    # Defaults V=259, H=64, L=2, heads 4 of 16 dims, 2 kv heads (kv width 32), MLP I=128:
    # embed + lm_head 2*V*H; per layer q,o H*H each, k,v H*32 each, gate/up/down 3*H*I,
    # two RMSNorm H each, Qwen2 q/k/v biases 64+32+32; final norm H.
    V, H, L, KV, MLP = 259, 64, 2, 32, 128
    per_layer = 2 * H * H + 2 * H * KV + 3 * H * MLP + 2 * H + qkv_bias * (H + 2 * KV)
    expected = 2 * V * H + L * per_layer + H
    assert sum(p.numel() for p in model.parameters()) == expected
    assert model.config.model_type == arch
    assert model.config.vocab_size == 259


def test_same_seed_gives_identical_files_and_leaves_rng_alone(tmp_path: Path) -> None:
    state = torch.random.get_rng_state()
    first = build_tiny_model(tmp_path / "a", seed=7)
    assert torch.equal(torch.random.get_rng_state(), state)
    second = build_tiny_model(tmp_path / "b", seed=7)
    other = build_tiny_model(tmp_path / "c", seed=8)
    weights = [(d / "model.safetensors").read_bytes() for d in (first, second, other)]
    assert weights[0] == weights[1]
    assert weights[0] != weights[2]
    assert (first / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()


def test_ensure_tiny_model_builds_once(tmp_path: Path) -> None:
    out = ensure_tiny_model(tmp_path / "m", hidden_size=32, num_heads=2, num_kv_heads=1)
    weights = out / "model.safetensors"
    built_at = weights.stat().st_mtime_ns
    # an existing model is reused as it is, whatever the options
    assert ensure_tiny_model(out, hidden_size=64) == out
    assert weights.stat().st_mtime_ns == built_at
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 32


def test_in_memory_tokenizer_matches_first_principles() -> None:
    tokenizer = build_tiny_tokenizer()
    assert len(tokenizer) == 259
    assert tokenizer.encode(VARIED_TEXT) == _reference_ids(VARIED_TEXT)
    # every single byte is its own token: no unknown token for any input
    all_bytes = bytes(range(1, 128)).decode("ascii")
    assert tokenizer.encode(all_bytes) == _reference_ids(all_bytes)


@pytest.mark.parametrize(
    ("fixture", "expected_class"),
    [("tiny_model_dir", "TokenizersBackend"), ("tiny_qwen2_model_dir", "Qwen2Tokenizer")],
)
def test_tokenizer_round_trip_through_auto_tokenizer(
    request: pytest.FixtureRequest, fixture: str, expected_class: str
) -> None:
    path = request.getfixturevalue(fixture)
    tokenizer = AutoTokenizer.from_pretrained(path)
    # transformers 5 swaps in its own Qwen2Tokenizer for a qwen2 config; ours is built so that
    # the swap changes nothing (same normaliser, split regex and byte-level mapping).
    assert type(tokenizer).__name__ == expected_class
    ids = tokenizer.encode(VARIED_TEXT)
    assert ids == _reference_ids(VARIED_TEXT)
    assert tokenizer.decode(ids) == VARIED_TEXT
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id == 258
    assert tokenizer.pad_token_id == 256
    assert tokenizer.bos_token is None


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_qwen2_model_dir"])
def test_chat_template_is_chatml(request: pytest.FixtureRequest, fixture: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(request.getfixturevalue(fixture))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Sum 2 and 3."},
    ]
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nSum 2 and 3.<|im_end|>\n"
    )
    assert tokenizer.apply_chat_template(messages, tokenize=False) == expected
    with_prompt = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert with_prompt == expected + "<|im_start|>assistant\n"
    ids = tokenizer.encode(with_prompt)
    assert ids == _reference_ids(with_prompt)
    assert ids.count(257) == 3
    assert tokenizer.decode(ids) == with_prompt


def test_model_runs_and_is_deterministic_from_disk(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    again = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.tensor([_reference_ids("2+3=")])
    with torch.no_grad():
        logits = model(ids).logits  # [1, 4, V]
        assert logits.shape == (1, 4, 259)
        assert torch.equal(logits, again(ids).logits)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"hidden_size": 60, "num_heads": 8}, "multiple of num_heads"),
        ({"hidden_size": 36, "num_heads": 4}, "must be even"),
        ({"num_heads": 4, "num_kv_heads": 3}, "multiple of num_kv_heads"),
        ({"num_layers": 0}, "num_layers must be a positive integer"),
        ({"hidden_size": 64.0}, "hidden_size must be a positive integer"),
        ({"arch": "gpt9"}, "unknown tiny model architecture 'gpt9'; valid names: llama, qwen2"),
    ],
)
def test_invalid_shapes_are_refused_before_building(
    tmp_path: Path, kwargs: dict, match: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(match)):
        build_tiny_model(tmp_path / "m", **kwargs)
    assert not (tmp_path / "m").exists()


def test_out_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        build_tiny_model(target)
