"""Session fixtures: the tiny local models (and a GGUF copy), built once per test session.

Other test packages reuse these fixtures (``tests/rollout/conftest.py`` re-exports them). The
directories are shared: treat them as read-only, and load a fresh model object per test when a
test modifies weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mtgrpo.models import build_tiny_model, write_tiny_gguf

TINY_SEED = 0


def _built_once(tmp_path_factory: pytest.TempPathFactory, arch: str) -> Path:
    # Keyed by a fixed directory under the session's base temp dir, so that fixture copies
    # re-exported by other conftest files reuse one build instead of building again.
    out = tmp_path_factory.getbasetemp() / f"tiny-{arch}-seed{TINY_SEED}"
    if not (out / "model.safetensors").is_file():
        build_tiny_model(out, arch=arch, seed=TINY_SEED)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default tiny model (Llama architecture, seed 0), in save_pretrained layout."""
    return _built_once(tmp_path_factory, "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with the Qwen2 architecture (seed 0)."""
    return _built_once(tmp_path_factory, "qwen2")


@pytest.fixture(scope="session")
def tiny_gguf_file(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The default tiny model written as a float32 GGUF file, alone in its directory."""
    pytest.importorskip("gguf")
    out = tmp_path_factory.getbasetemp() / "tiny-llama-gguf" / "tiny.gguf"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        write_tiny_gguf(tiny_model_dir, out)
    return out
