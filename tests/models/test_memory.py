"""``release_memory`` hands the C heap's free pages back to the operating system (glibc)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from mtgrpo.models import release_memory
from mtgrpo.models.memory import _malloc_trim

# In a fresh interpreter (a heap of known history): 2,000 tensors of 64 KiB (under glibc's
# mmap threshold, so they live on the heap), each followed by a small tensor that stays alive,
# then the 2,000 are freed: 125 MiB in holes between live chunks, the fragmentation a finished
# phase leaves. free() gives back only the heap's top, so glibc keeps the holes for later
# mallocs until malloc_trim(0) returns their pages.
_CHILD = textwrap.dedent("""
    import gc, sys
    import torch
    from mtgrpo.models import release_memory

    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    blocks, pins = [], []
    for _ in range(2000):
        blocks.append(torch.ones(16 * 1024))  # 64 KiB
        pins.append(torch.ones(64))
    held = rss_mib()
    del blocks
    gc.collect()
    freed = rss_mib()
    trimmed = release_memory() if sys.argv[1] == "release" else None
    print(held, freed, rss_mib(), trimmed)
""")


def _child(mode: str) -> tuple[float, float, float, str]:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    return float(out[0]), float(out[1]), float(out[2]), out[3]


@pytest.mark.skipif(_malloc_trim() is None, reason="malloc_trim needs glibc on Linux")
def test_release_memory_returns_the_freed_heap_to_the_system():
    held, freed, after, trimmed = _child("release")
    assert trimmed == "True"
    # without the trim the freed blocks stay resident (the run below)
    assert freed - after > 90, (held, freed, after)  # of 125 MiB: whole pages in each hole
    kept_held, kept_freed, kept_after, _ = _child("keep")
    assert kept_freed - kept_after < 10, (kept_held, kept_freed, kept_after)
    assert kept_after > kept_held - 25, "the heap gave the pages back without a trim"


def test_release_memory_says_whether_it_could_trim():
    assert release_memory() is (_malloc_trim() is not None)
