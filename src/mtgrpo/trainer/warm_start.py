"""Where a run's supervised warm start lives: one directory per content, shared by runs.

A warm start depends on the base model's contents, the problems it trains on (the ``tasks``
settings that choose them: the warm start leaves out GRPO's training and evaluation problems),
its own settings (the ``sft`` section, the run's seed) and the code that trains it
(:data:`WARM_START_VERSION` and mtgrpo's version). :func:`warm_start_settings` gathers those
and :func:`warm_start_key` digests them; the result is trained once into
``<cache root>/warm-start/<key>/`` (:func:`warm_start_entry`; the cache root is the task
cache's: ``tasks.cache_dir``, else ``$MTGRPO_CACHE_DIR``, else ``~/.cache/mtgrpo/tasks``) and
every later run with the same key, whatever its ``output_dir``, reuses it. A run's
``<output_dir>/sft`` is a link to that entry (:func:`link_run_directory`), so
``<output_dir>/sft/model`` is the model GRPO started from; a copy of the run directory that
follows the link holds the warm start itself and still reuses it (:func:`finished_warm_start`).

A local base model is known by its files (a hash of every file's bytes), not by its path: the
quickstart builds its tiny model inside the run directory, byte-identical for the same options,
so another run directory builds the same model and finds the same warm start. A hub or package
name is known by its name, revision and GGUF file (an unpinned hub model updated upstream is
not noticed: pin ``model.revision`` or set ``sft.reuse: false``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from mtgrpo._files import aside_path
from mtgrpo._version import __version__
from mtgrpo.config import RunConfig
from mtgrpo.tasks import cache_root

__all__ = [
    "MARKER",
    "WARM_START_VERSION",
    "finished_warm_start",
    "link_run_directory",
    "model_identity",
    "warm_start_entry",
    "warm_start_key",
    "warm_start_settings",
]

# Raise when the warm start's data or training changes in a way its settings do not show, so
# that no run reuses a warm start the current code would not train.
WARM_START_VERSION = 2
MARKER = "warm_start.json"
# The tasks options that choose the warm start's problems and how they read: its own seed is
# derived from `seed`, and it leaves out GRPO's training, evaluation and validation problems,
# which `train_size`, `eval_size`, `validation_size` and `max_retries` choose. Workers, time
# limits and the cache's place do not change a problem.
_PROBLEM_SETTINGS = ("seed", "train_size", "eval_size", "validation_size", "max_retries",
                     "prompt_format", "answer_format", "think_prefix", "system_prompt")
# SFT options that say where the warm start is written, not what it learns.
_PLACE_SETTINGS = ("output_dir", "overwrite_output_dir")


def _files_digest(directory: Path) -> str:
    """sha256 over every file's relative path and bytes (hidden files, such as a hub
    download's ``.cache``, left out: they change without the model changing)."""
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):  # sorted: independent of listing order
        relative = path.relative_to(directory)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file():
            continue
        with path.open("rb") as handle:
            content = hashlib.file_digest(handle, "sha256").hexdigest()
        digest.update(f"{relative.as_posix()}\0{content}\n".encode())
    return digest.hexdigest()


def model_identity(model: str, revision: str | None = None,
                   gguf_file: str | None = None) -> dict[str, Any]:
    """What a base model is, for the warm start's key: a local directory or file by the hash
    of its contents; any other name (a hub id, ``pypi:PACKAGE``) by name, revision and GGUF
    file."""
    path = Path(model)
    if path.is_dir():
        return {"files": _files_digest(path), "gguf_file": gguf_file}
    if path.is_file():
        with path.open("rb") as handle:
            return {"file": hashlib.file_digest(handle, "sha256").hexdigest()}
    return {"name": model, "revision": revision, "gguf_file": gguf_file}


def warm_start_settings(run: RunConfig, model: str) -> dict[str, Any]:
    """Everything the warm start of ``run`` on ``model`` depends on (JSON-ready)."""
    warm, tasks = run.sft, run.tasks
    # the caller checked the sections: sft, and tasks or environments
    assert warm is not None
    training = warm.sft_config("<output_dir>/sft", seed=run.training.schedule.seed).to_dict()
    # reuse says whether to look for a warm start, not what one learns
    section = {key: value for key, value in warm.to_dict().items() if key != "reuse"}
    settings = {
        "version": WARM_START_VERSION,
        "mtgrpo": __version__,
        "model": model_identity(model, run.model.revision, run.model.gguf_file),
        "training": {k: v for k, v in training.items() if k not in _PLACE_SETTINGS},
        "sft": section,
    }
    if tasks is None:  # the episodes (and the splits they are kept out of) and the template
        assert run.environments is not None
        return {**settings, "environments": run.environments.to_dict(),
                "chat_template_kwargs": run.training.rollout.chat_template_kwargs}
    return {**settings, "tasks": {"tasks": tasks.task_list,
                                  **{name: getattr(tasks, name) for name in _PROBLEM_SETTINGS}}}


def warm_start_key(settings: dict[str, Any]) -> str:
    """The digest of :func:`warm_start_settings` that names the warm start's directory."""
    # sort_keys: equal settings give one key whatever their order; str() for paths and such
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def warm_start_entry(run: RunConfig, key: str) -> Path:
    """``<cache root>/warm-start/<key>``: beside the task cache, relocated with it."""
    cache_dir = run.tasks.cache_dir if run.tasks is not None else None
    return cache_root(cache_dir) / "warm-start" / key


def finished_warm_start(directory: Path, key: str) -> dict[str, Any] | None:
    """The marker of the finished warm start with ``key`` in ``directory`` (an entry, a run's
    link to one or a copy of it), or ``None``: absent, unfinished, another key, or a link
    whose entry was deleted."""
    try:
        marker = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("key") != key:
        return None
    return marker if (directory / "model" / "config.json").is_file() else None


def link_run_directory(link: Path, entry: Path) -> Path | None:
    """Make ``link`` (a run's ``<output_dir>/sft``) a link to ``entry``, replacing what is
    there: a link to another warm start, or a directory of this run's earlier one (a run
    directory from before warm starts were shared, or a copy; its settings differ, or it
    would have been reused), which is moved aside to ``sft.previous-<time>``, never deleted.
    Returns where it was moved (None when nothing was)."""
    target = entry.resolve()
    if link.is_symlink() and link.resolve() == target:
        return None
    link.parent.mkdir(parents=True, exist_ok=True)
    temporary = link.with_name(f".{link.name}.link-{os.getpid()}")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target, target_is_directory=True)
    kept = None
    if link.is_dir() and not link.is_symlink():  # what the user trained stays on disk
        kept = aside_path(link.parent, f"{link.name}.previous")
        os.replace(link, kept)
    os.replace(temporary, link)  # a link replaces a link atomically
    return kept
