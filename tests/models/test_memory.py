"""``release_memory`` hands the C heap's free pages back to the operating system (glibc)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import weakref

import pytest

from mtgrpo.models import release_memory
from mtgrpo.models.memory import _malloc_trim

# In a fresh interpreter (a heap of known history): 2,000 tensors of 64 KiB (under glibc's
# mmap threshold, so they live on the heap), each followed by a small tensor that stays alive,
# then the 2,000 are freed: 125 MiB in holes between live chunks, the fragmentation a finished
# phase leaves. free() gives back only the heap's top, so glibc keeps the holes for later
# mallocs until malloc_trim(0) returns their pages.
_CHILD = textwrap.dedent("""
    import gc, os, sys
    import torch
    from mtgrpo.models import release_memory

    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

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


@pytest.mark.skipif(_malloc_trim() is None or "LD_PRELOAD" in os.environ,
                    reason="glibc's own allocator on Linux (not a preloaded jemalloc/tcmalloc)")
def test_release_memory_returns_the_freed_heap_to_the_system():
    held, freed, after, trimmed = _child("release")
    assert trimmed == "True"
    # without the trim the freed blocks stay resident (the run below)
    assert freed - after > 90, (held, freed, after)  # of 125 MiB: whole pages in each hole
    kept_held, kept_freed, kept_after, _ = _child("keep")
    assert kept_freed - kept_after < 10, (kept_held, kept_freed, kept_after)
    assert kept_after > kept_held - 25, "the heap gave the pages back without a trim"


class _Node:
    pass


def test_release_memory_frees_what_only_a_reference_cycle_holds():
    """A model in a reference cycle (module hooks, closures) is freed by the collector, not
    when its last name goes: release_memory runs it."""
    gc.disable()  # so that no automatic collection frees the cycle first
    try:
        node = _Node()
        node.self = node
        alive = weakref.ref(node)
        del node
        assert alive() is not None  # only the cycle holds it
        release_memory()
        assert alive() is None
    finally:
        gc.enable()
