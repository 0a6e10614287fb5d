"""Shared test configuration: offline hub settings, GPU tests skip cleanly without CUDA, and the
tiny local models (built once per session; treat their directories as read-only and load a
fresh model object per test that changes weights)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mtgrpo.models import build_tiny_model, write_tiny_gguf

pytest_plugins = ["vllm_fixtures"]  # the real-vLLM tests' engines and server (marker vllm)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a core dependency
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    from vllm_fixtures import vllm_available

    has_vllm = vllm_available()
    skip_vllm = pytest.mark.skip(reason="needs vLLM: ./test.sh runs these in .venv-vllm "
                                        "(scripts/setup-vllm-env.sh)")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "vllm" in item.keywords and not has_vllm:
            item.add_marker(skip_vllm)


@pytest.fixture(autouse=True)
def _keep_torch_threads() -> Iterator[None]:
    """Restore torch's intra-op thread count after each test: the benchmark tests run their
    scripts in-process, and those call ``torch.set_num_threads``, which would otherwise run every
    later test with the benchmark's count instead of the ``OMP_NUM_THREADS`` the suite was
    started with (float results depend on it: see tests/tolerance.py)."""
    import torch

    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


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


@pytest.fixture
def single_process_group(tmp_path):
    """A one-process gloo group on CPU, enough to build a real DistributedDataParallel or an
    FSDP2-sharded model."""
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this build")
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    torch.distributed.destroy_process_group()
