"""``mtgrpo tiny-model``: argument parsing, the model it writes, and its exit status."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mtgrpo.cli import tiny_model


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mtgrpo tiny-model")
    tiny_model.add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_match_build_tiny_model() -> None:
    args = _parse(["out"])
    assert (args.arch, args.hidden_size, args.num_layers, args.num_heads, args.num_kv_heads,
            args.intermediate_size, args.max_position_embeddings, args.seed, args.gguf) == (
        "llama", 64, 2, 4, 2, 128, 512, 0, False)


def test_builds_the_requested_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gguf")
    out = tmp_path / "qwen"
    argv = [str(out), "--arch", "qwen2", "--hidden-size", "32", "--num-heads", "2",
            "--num-kv-heads", "1", "--num-layers", "1", "--seed", "3", "--gguf"]
    assert tiny_model.run(_parse(argv)) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["num_hidden_layers"]) == ("qwen2", 32, 2, 1, 1)
    assert (out / "model.gguf").stat().st_size > 0
    printed = capsys.readouterr().out
    assert f"wrote tiny qwen2 model to {out}" in printed
    assert "wrote GGUF file" in printed


def test_invalid_shape_exits_2_with_the_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _parse([str(tmp_path / "m"), "--hidden-size", "30", "--num-heads", "4"])
    assert tiny_model.run(args) == 2
    assert "hidden_size (30) must be a multiple of num_heads (4)" in capsys.readouterr().err


def test_gguf_without_the_package_exits_2_before_building(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
    out = tmp_path / "m"
    assert tiny_model.run(_parse([str(out), "--gguf"])) == 2
    assert "pip install gguf" in capsys.readouterr().err
    assert not out.exists()


def test_unknown_arch_is_an_argparse_error() -> None:
    with pytest.raises(SystemExit):
        _parse(["out", "--arch", "gpt2"])


def test_module_import_stays_light() -> None:
    code = ("import sys, mtgrpo.cli.tiny_model; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60)
    assert result.stdout.strip() == "[]"


def test_tools_chat_template_renders_tools_and_plain_chats_as_chatml(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from mtgrpo.models import CHATML_TEMPLATE

    out = tmp_path / "tools"
    argv = [str(out), "--hidden-size", "32", "--num-layers", "1", "--chat-template", "tools"]
    assert tiny_model.run(_parse(argv)) == 0
    tokenizer = AutoTokenizer.from_pretrained(out)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]
    plain = AutoTokenizer.from_pretrained(out)
    plain.chat_template = CHATML_TEMPLATE
    for generation_prompt in (True, False):  # no tools: exactly ChatML
        assert tokenizer.apply_chat_template(chat, tokenize=False,
                                             add_generation_prompt=generation_prompt) == \
            plain.apply_chat_template(chat, tokenize=False,
                                      add_generation_prompt=generation_prompt)

    def add(a: int, b: int) -> int:
        """Add.

        Args:
            a: First.
            b: Second.
        """
        return a + b

    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    text = tokenizer.apply_chat_template(
        [chat[1], {"role": "assistant", "content": "", "tool_calls": [call]},
         {"role": "tool", "name": "add", "content": "3"}], tools=[add], tokenize=False,
        add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nTools: add(a, b)<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n3\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n")


def test_an_unknown_chat_template_is_refused() -> None:
    from mtgrpo.models import build_tiny_tokenizer

    with pytest.raises(ValueError, match=r"chat_template='jinja'.*chatml, tools"):
        build_tiny_tokenizer(chat_template="jinja")
