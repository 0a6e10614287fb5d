"""On-disk cache of generated task items.

Layout: ``<root>/<family>/<level>-s<seed>-n<size>-<digest>/`` holds ``meta.json`` (the
full key, for humans) and ``chunk-<start>.jsonl`` files of :data:`CHUNK_SIZE` stored items
each, one JSON object per line in position order. The root is ``cache_dir`` if given,
else ``$MTGRPO_CACHE_DIR``, else ``~/.cache/mtgrpo/tasks``.

The key is (family, dataset, level, config, seed, size, max_retries, excluded content),
so a different level, config, seed or size is a different directory, and anything that
changes which source indices fill the positions changes the digest. Prompt and answer
formats are not in the key: items are stored format-independent and rendered on read.

Writes are atomic: a chunk is written to a temporary file in the same directory and
renamed over its final name, so a reader never sees half a chunk and two processes
generating the same chunk (e.g. data-parallel ranks) both end with a complete file. A
chunk that fails to parse is treated as missing and regenerated.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mtgrpo._files import write_text_atomically

__all__ = ["CACHE_ENV", "CHUNK_SIZE", "CacheKey", "ItemCache", "cache_root"]

CACHE_ENV = "MTGRPO_CACHE_DIR"
CHUNK_SIZE = 64  # positions per file; also the unit of background interleaving (suite._produce)
_FORMAT_VERSION = 1  # in the digest: bumping it retires every older cache directory


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache root: ``cache_dir``, else ``$MTGRPO_CACHE_DIR``, else ``~/.cache/mtgrpo/tasks``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "mtgrpo" / "tasks"


@dataclass(frozen=True)
class CacheKey:
    """Everything that determines the items of one task split."""

    family: str
    dataset: str
    level: str | None
    config_json: str
    seed: int
    size: int
    max_retries: int
    exclude_digest: str = ""

    @property
    def digest(self) -> str:
        payload = json.dumps({**asdict(self), "version": _FORMAT_VERSION}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @property
    def dirname(self) -> str:
        # One path component: separators and other odd characters become "_".
        level = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.level or "custom")
        return f"{level}-s{self.seed}-n{self.size}-{self.digest}"


class ItemCache:
    """Chunked JSONL storage of one task split's items under its :class:`CacheKey`."""

    def __init__(self, key: CacheKey, root: str | os.PathLike[str] | None = None) -> None:
        self.key = key
        family = re.sub(r"[^A-Za-z0-9_.-]+", "_", key.family)
        self.path = cache_root(root) / family / key.dirname

    def chunk_path(self, chunk: int) -> Path:
        # Zero-padded start position: a directory listing sorts in position order.
        return self.path / f"chunk-{chunk * CHUNK_SIZE:09d}.jsonl"

    def read_chunk(self, chunk: int, expected: int) -> list[dict[str, Any]] | None:
        """The chunk's items, or ``None`` if absent, unreadable or of the wrong length."""
        path = self.chunk_path(chunk)
        try:
            with path.open(encoding="utf-8") as handle:
                items = [json.loads(line) for line in handle if line.strip()]
        # json.JSONDecodeError is a ValueError: a corrupt chunk counts as missing.
        except (OSError, ValueError):
            return None
        # A truncated file, or one written with another CHUNK_SIZE.
        return items if len(items) == expected else None

    def write_chunk(self, chunk: int, items: Sequence[dict[str, Any]]) -> Path:
        """Atomically write one chunk (and ``meta.json`` the first time)."""
        self.path.mkdir(parents=True, exist_ok=True)
        meta = self.path / "meta.json"
        if not meta.exists():  # meta.json is for humans; reads never depend on it
            write_text_atomically(
                meta, json.dumps({**asdict(self.key), "chunk_size": CHUNK_SIZE}, indent=2)
            )
        # Sorted keys: ranks writing the same chunk write the same bytes.
        lines = "".join(json.dumps(item, sort_keys=True) + "\n" for item in items)
        path = self.chunk_path(chunk)
        write_text_atomically(path, lines)
        return path

