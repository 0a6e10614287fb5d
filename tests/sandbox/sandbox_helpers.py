"""Shared by the sandbox tests: small limits, a planted secret, and the processes a sandbox
run may leave (there must be none)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from mtgrpo.sandbox import SandboxLimits
from mtgrpo.sandbox._view import LAUNCHER

LIMITS = SandboxLimits(
    timeout_seconds=4.0,
    test_timeout_seconds=0.5,
    cpu_seconds=2,
    memory_bytes=256 << 20,
    output_bytes=64 << 10,
    file_bytes=1 << 20,
    max_files=8,
)
SECRET = "hunter2-" + uuid.uuid4().hex


def sandbox_processes(state_filter: bool = True) -> dict[int, str]:
    """``{pid: /proc/<pid>/status}`` of live processes started by this checkout's sandbox
    (launcher, reaper or harness: their command line names its launcher; zombies excluded)."""
    marker = str(LAUNCHER).encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        zombie = "State:\tZ" in status
        if marker in cmdline.split(b"\0") and not (state_filter and zombie):
            found[int(entry)] = status
    return found


def status_field(status: str, name: str) -> str:
    """A field of a ``/proc/<pid>/status`` text (``CapEff``, ``Uid``, ...)."""
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise KeyError(name)
