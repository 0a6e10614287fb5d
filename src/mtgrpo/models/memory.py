"""Handing memory back between phases of one process (a warm start, then GRPO; one run of a
grid, then the next).

Python frees a model's tensors when the last reference goes (reference cycles wait for the
garbage collector), but on Linux with glibc the C allocator keeps the freed pages of its heap
for later ``malloc`` calls instead of returning them: after a full fine-tuning of the warm start
the process can hold gigabytes it no longer uses, which the next phase may not be able to reuse
(other sizes, other arenas) and which no other program can have. :func:`release_memory`
collects the garbage, empties the CUDA cache and asks glibc to return every free page
(``malloc_trim(0)``).
"""

from __future__ import annotations

import ctypes
import gc
import platform
from collections.abc import Callable
from functools import cache


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library is another (musl, macOS, Windows)."""
    # malloc_trim is a glibc extension: musl and macOS have no such symbol
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library already loaded in this process
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_memory() -> bool:
    """Collect garbage, empty the CUDA cache and return the C heap's free pages to the operating
    system; True when the C allocator could be trimmed (glibc), False elsewhere (the garbage
    collection and the CUDA cache are done on every platform)."""
    gc.collect()  # cycles first: their tensors are freed only by the collector
    import torch

    if torch.cuda.is_available():
        # the caching allocator otherwise keeps freed blocks for this process
        torch.cuda.empty_cache()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)  # 0: keep no padding at the top of the heap; return every free page
    return True
