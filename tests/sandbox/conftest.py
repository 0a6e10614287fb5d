"""Fixtures of the reward tests."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import SECRET, sandbox_processes


@pytest.fixture
def sandbox_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private temporary root for the sandboxes' working directories, plus a planted
    secret in this process's environment; after the test, the root must be empty and no
    sandbox process alive."""
    root = tmp_path / "sandboxes"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    monkeypatch.setenv("MTGRPO_FAKE_SECRET", SECRET)
    yield root
    assert list(root.iterdir()) == []
    # Killed processes end within moments (SIGKILL cannot be blocked); a zombie waiting to
    # be reaped is not alive.
    give_up = time.monotonic() + 2.0
    while sandbox_processes() and time.monotonic() < give_up:
        time.sleep(0.01)
    assert sandbox_processes() == {}
