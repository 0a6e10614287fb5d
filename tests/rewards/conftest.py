"""Fixtures of the reward tests."""

from __future__ import annotations

import tempfile
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
    assert sandbox_processes() == {}
