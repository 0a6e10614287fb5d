"""Fixtures of the tests that run the real vLLM (marked ``vllm``).

They run where vLLM imports: ``./test.sh`` runs them a second time in ``.venv-vllm`` (vLLM's
tested pins, requirements/lock-vllm.txt), and they skip elsewhere with that reason. Engines
start once per session: the colocated backends of one session share one in-process engine per
model and options (:func:`mtgrpo.rollout.vllm.engine.start_engine`), and the server tests share
one ``mtgrpo vllm-serve`` process, stopped at the end of the session (every wait has a
timeout; no process outlives the session).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVER_START_TIMEOUT = 300.0  # seconds: an engine starts in ~20 s here, minutes on a busy box
KV_FRACTION = "0.01"  # of host memory, capped by what a full batch needs (tiny models: MiBs)


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with 64-wide heads (vLLM's CPU attention runs 32, 64, 80, ... not 16)."""
    from mtgrpo.models import build_tiny_model

    out = tmp_path_factory.getbasetemp() / "tiny-llama-vllm"
    if not (out / "model.safetensors").is_file():
        build_tiny_model(out, hidden_size=128, num_heads=2, num_kv_heads=1, seed=0)
    return out


class ServerProcess:
    """A ``mtgrpo vllm-serve`` process on a free local port."""

    def __init__(self, model: Path, log: Path, port: int | None = None) -> None:
        self.model, self.log_path = model, log
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> ServerProcess:
        env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}
        self.log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mtgrpo.cli", "vllm-serve", str(self.model), "--port",
             str(self.port), "--dtype", "float32", "--max-model-len", "512",
             "--gpu-memory-utilization", KV_FRACTION, "--max-num-seqs", "64"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env,
        )
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm-serve exited with {self.process.returncode}; log: "
                                   f"{self.log_path.read_text(errors='replace')[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    return self
            except OSError:
                time.sleep(1)
        self.stop()
        raise TimeoutError(f"vllm-serve did not answer within {SERVER_START_TIMEOUT} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self.process = None
        if getattr(self, "log", None) is not None:
            self.log.close()
            self.log = None


@pytest.fixture(scope="session")
def vllm_server(vllm_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[ServerProcess]:
    """One ``mtgrpo vllm-serve`` for the session's server tests."""
    log = tmp_path_factory.getbasetemp() / "vllm-serve.log"
    server = ServerProcess(vllm_model_dir, log).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session", autouse=False)
def vllm_engines_stopped() -> Iterator[None]:
    yield
    from mtgrpo.rollout.vllm.engine import shutdown_engines

    shutdown_engines()
