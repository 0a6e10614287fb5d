"""Checkpoints that resume a run exactly: written atomically, rotated, found again.

A checkpoint directory ``checkpoint-<step>/`` holds

* ``model/``: the model (or the LoRA adapter) and tokenizer in ``save_pretrained`` format, for
  users (``from_pretrained`` / ``PeftModel.from_pretrained`` load it);
* ``trainable.safetensors``: the trainable parameters by their ``named_parameters`` names, which
  is what resuming loads (exact, whatever the model's save format does to key names);
* ``optimizer.pt``, ``scheduler.pt``;
* ``trainer_state.json``: step, task-weighting state, sampler state and other loop state;
* ``rng_state_<rank>.pt``: Python, NumPy and torch RNG states of every process.

It is written into a temporary sibling directory (``.checkpoint-<step>.tmp-<pid>``) and
renamed into place, so a crash during a save never leaves a half-written ``checkpoint-<step>``;
the temporary directories such a crash leaves are removed when a run starts or resumes
(:func:`remove_stale_temporaries`).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "latest_checkpoint",
    "list_checkpoints",
    "load_rng_state",
    "load_trainable",
    "read_trainer_state",
    "remove_stale_temporaries",
    "rng_state",
    "rotate_checkpoints",
    "save_trainable",
    "set_rng_state",
]

_NAME = re.compile(r"^checkpoint-(\d+)$")
_TEMPORARY = re.compile(r"^\.checkpoint-\d+\.tmp-\d+$")


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
    return [path for _, path in sorted(found)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    checkpoints = list_checkpoints(output_dir)
    return checkpoints[-1] if checkpoints else None


def rotate_checkpoints(output_dir: str | Path, limit: int | None,
                       keep: Path | None = None) -> None:
    """Delete all but the newest ``limit`` checkpoints (``None`` keeps all); ``keep`` (the
    best checkpoint) is never deleted."""
    if limit is None:
        return
    checkpoints = list_checkpoints(output_dir)
    for old in checkpoints[: max(len(checkpoints) - limit, 0)]:
        if keep is not None and old.resolve() == keep.resolve():
            continue
        shutil.rmtree(old, ignore_errors=True)


def remove_stale_temporaries(output_dir: str | Path) -> list[Path]:
    """Remove the ``.checkpoint-<step>.tmp-<pid>`` directories an interrupted save left in
    ``output_dir`` (call it before a run writes checkpoints); the removed paths."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    stale = [child for child in root.iterdir() if _TEMPORARY.match(child.name) and child.is_dir()]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def save_trainable(model: torch.nn.Module, path: Path) -> None:
    from safetensors.torch import save_file

    tensors = {
        name: p.detach().to("cpu").contiguous()
        for name, p in model.named_parameters() if p.requires_grad
    }
    save_file(tensors, str(path))


def load_trainable(model: torch.nn.Module, path: Path) -> None:
    """Copy saved trainable parameters into ``model``; every trainable one must be present."""
    from safetensors.torch import load_file

    saved = load_file(str(path))
    params = dict(model.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and n not in saved]
    unknown = [n for n in saved if n not in params]
    if missing or unknown:
        raise ValueError(
            f"checkpoint {path.parent} does not match the model: missing {missing[:3]}, "
            f"unexpected {unknown[:3]}; resume with the same model and LoRA settings"
        )
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
    set_rng_state(torch.load(path, weights_only=False))


def read_trainer_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / "trainer_state.json").read_text())
