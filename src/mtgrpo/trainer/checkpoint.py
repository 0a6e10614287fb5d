"""Checkpoints that resume a run exactly: written atomically, rotated, found again.

A checkpoint directory ``checkpoint-<step>/`` holds

* ``model/``: the model (or the LoRA adapter) and tokenizer in ``save_pretrained`` format, for
  users (``from_pretrained`` / ``PeftModel.from_pretrained`` load it);
* ``trainable.safetensors``: the trainable parameters by their ``named_parameters`` names, which
  is what resuming loads (exact, whatever the model's save format does to key names);
* ``optimizer.pt``, ``scheduler.pt`` (under DeepSpeed, ``deepspeed/`` instead of
  ``optimizer.pt``: every process's partitions of the model and optimizer state, written by
  ``engine.save_checkpoint``, :mod:`mtgrpo.trainer.deepspeed`);
* ``trainer_state.json``: step, task-weighting state, sampler state and other loop state;
* ``rng_state_<rank>.pt``: Python, NumPy and torch RNG states of every process.

It is written into a temporary sibling directory (``.checkpoint-<step>.tmp-<pid>``) and
renamed into place, so a crash during a save never leaves a half-written ``checkpoint-<step>``;
the temporary directories such a crash leaves are removed when a run starts or resumes
(:func:`remove_stale_temporaries`).
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "check_output_dir",
    "check_trainable",
    "damaged_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_rng_state",
    "load_trainable",
    "read_checked_trainable",
    "read_trainable",
    "read_trainer_state",
    "remove_stale_temporaries",
    "rng_state",
    "rotate_checkpoints",
    "save_failure",
    "save_trainable",
    "set_rng_state",
]

_NAME = re.compile(r"^checkpoint-(\d+)$")
_TEMPORARY = re.compile(r"^\.checkpoint-\d+\.tmp-\d+$")
_REPLACED = re.compile(r"^\.(checkpoint-\d+)\.old-\d+$")  # _files.old_path


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints in ``output_dir``, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _NAME.match(child.name)
        if match and (child / "trainer_state.json").is_file():
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]  # by step: checkpoint-10 after checkpoint-9


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    checkpoints = list_checkpoints(output_dir)
    return checkpoints[-1] if checkpoints else None


def rotate_checkpoints(output_dir: str | Path, limit: int | None,
                       keep: Path | None = None) -> None:
    """Delete all but the newest ``limit`` checkpoints (``None`` or ``limit <= 0`` keeps all,
    as transformers' ``rotate_checkpoints``); ``keep`` (the best checkpoint) is never
    deleted."""
    if limit is None or limit <= 0:
        return
    checkpoints = list_checkpoints(output_dir)
    # oldest first; the newest `limit` stay, the best one on top of them (transformers'
    # rotate_checkpoints counts the best one within the limit)
    for old in checkpoints[: max(len(checkpoints) - limit, 0)]:
        if keep is not None and old.resolve() == keep.resolve():
            continue
        shutil.rmtree(old, ignore_errors=True)


def remove_stale_temporaries(output_dir: str | Path) -> list[Path]:
    """Remove the ``.checkpoint-<step>.tmp-<pid>`` directories an interrupted save left in
    ``output_dir`` (call it before a run writes checkpoints); the removed paths. A checkpoint
    that save was replacing (``.checkpoint-<step>.old-<pid>``) is put back under its name when
    the save stopped before the new one took it, and removed otherwise."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    stale = []
    for child in list(root.iterdir()):
        if not child.is_dir():
            continue
        replaced = _REPLACED.match(child.name)
        if _TEMPORARY.match(child.name) or (replaced and (root / replaced.group(1)).exists()):
            shutil.rmtree(child, ignore_errors=True)
            stale.append(child)
        elif replaced:
            child.rename(root / replaced.group(1))
    return stale


def save_trainable(model: torch.nn.Module, path: Path,
                   state: Mapping[str, torch.Tensor] | None = None) -> None:
    """The trainable parameters of ``model`` by name (``state``: the whole values of a sharded
    model's, gathered by :func:`mtgrpo.trainer.sharding.full_model_state`)."""
    from safetensors.torch import save_file

    # frozen parameters are left out: the resuming run loads the same model (run identity)
    tensors = {
        # safetensors refuses non-contiguous tensors
        name: (p if state is None else state[name]).detach().to("cpu").contiguous()
        for name, p in model.named_parameters() if p.requires_grad
    }
    save_file(tensors, str(path))


def read_trainable(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def check_trainable(model: torch.nn.Module, saved: Mapping[str, Any], checkpoint: Path) -> None:
    """Every trainable parameter of ``model`` is in ``saved``, and nothing else."""
    params = dict(model.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and n not in saved]
    unknown = [n for n in saved if n not in params]
    if missing or unknown:
        raise ValueError(
            f"checkpoint {checkpoint} does not match the model: missing {missing[:3]}, "
            f"unexpected {unknown[:3]}; resume with the same model and LoRA settings"
        )


def read_checked_trainable(model: torch.nn.Module, path: Path) -> dict[str, torch.Tensor]:
    """The trainable parameters saved at ``path``, checked against ``model``'s
    (:func:`check_trainable`)."""
    saved = read_trainable(path)
    check_trainable(model, saved, path.parent)
    return saved


def load_trainable(model: torch.nn.Module, path: Path) -> None:
    """Copy saved trainable parameters into ``model``; every trainable one must be present."""
    saved = read_checked_trainable(model, path)
    params = dict(model.named_parameters())
    # in place, under no_grad: the optimizer holds these very Parameter objects
    with torch.no_grad():
        for name, tensor in saved.items():
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        # every visible device's generator (transformers' get_rng_state_all in a distributed run)
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_rng_state(checkpoint: Path, rank: int) -> None:
    path = checkpoint / f"rng_state_{rank}.pt"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the checkpoint was written by fewer processes; resume with the "
            "same number of processes"
        )
    # weights_only=False: the state holds Python's and NumPy's RNG tuples, not only tensors
    set_rng_state(torch.load(path, weights_only=False))


def read_trainer_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / "trainer_state.json").read_text())


def check_output_dir(output_dir: str | Path) -> None:
    """Refuse, before any model loads, an ``output_dir`` the run cannot write: a file, or a
    directory (or the nearest existing parent of one to create) without write access."""
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(
            f"output_dir {str(path)!r} is a file; give a directory (it is created if missing)"
        )
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(
            f"output_dir {str(path)!r} cannot be written ({str(existing)!r} is not writable by "
            "this user); choose a directory you can write, or fix its permissions"
        )


def save_failure(target: Path, error: BaseException, previous: Path | None) -> OSError:
    """The error for a checkpoint that could not be written: where, how much space there is
    and roughly how much a checkpoint takes, and what is still safe."""
    free = shutil.disk_usage(target.parent).free if target.parent.exists() else 0
    needed = sum(f.stat().st_size for f in previous.rglob("*") if f.is_file()) if previous else 0
    # torch's zip writer reports a full disk as a RuntimeError "[enforce fail at ...]"
    full = (isinstance(error, OSError) and error.errno == errno.ENOSPC) or "enforce fail" in \
        str(error) or "No space" in str(error)
    cause = "the disk is full" if full or (needed and free < needed) else f"{error}"
    size = f"; a checkpoint takes about {_size(needed)}" if needed else ""
    kept = f"; the previous checkpoint {previous} is intact" if previous else ""
    return OSError(
        errno.ENOSPC if full else getattr(error, "errno", None) or errno.EIO,
        f"writing {target} failed: {cause} ({_size(free)} free in {target.parent}{size}){kept}."
        " Free space there, lower save_total_limit, or set output_dir to a larger disk; nothing "
        "already written was lost",
    )


def _size(count: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} bytes"


def damaged_checkpoint(path: Path, error: BaseException) -> ValueError:
    """The error for a checkpoint file that cannot be read: the file, and the previous
    complete checkpoint to resume from instead."""
    checkpoint = path.parent
    older = [c for c in list_checkpoints(checkpoint.parent) if c != checkpoint and
             _step_of(c) < _step_of(checkpoint)]  # fmt: skip
    instead = (f"resume from the previous complete checkpoint instead: "
               f"resume_from_checkpoint={str(older[-1])!r}" if older
               else "there is no earlier checkpoint: train from scratch")
    return ValueError(f"{path} is damaged ({type(error).__name__}: {str(error)[:200]}); {instead}")


def _step_of(checkpoint: Path) -> int:
    match = _NAME.match(checkpoint.name)
    return int(match.group(1)) if match else -1
