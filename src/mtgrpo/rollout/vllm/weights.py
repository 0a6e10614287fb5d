"""The policy's weights as vLLM loads them: names, LoRA merged in, and the wire format.

vLLM's models load transformers checkpoint names (``model.layers.0.self_attn.q_proj.weight``)
and fuse them themselves (``qkv_proj``), so the trainer sends its parameters under their
transformers names. A peft (LoRA) model is sent merged: the adapter is merged into the base
weights for the read and unmerged right after, and the names lose peft's prefixes
(``base_model.model.``, ``.base_layer``); the ``lora_`` tensors themselves are not sent
(docs/engines.md has the measurement behind merging rather than loading an adapter).

Between processes the weights travel as one safetensors blob: written to a file in shared
memory (``/dev/shm``) when the server can read the trainer's files (same machine), else in
the body of the HTTP request.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["check_weight_names", "merged_named_weights", "pack_weights", "shared_memory_dir",
           "unpack_weights", "write_weights_file"]


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and callable(getattr(model, "merge_adapter", None))


@contextlib.contextmanager
def merged_named_weights(model: torch.nn.Module) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``[(transformers name, tensor)]`` of the policy as vLLM loads it; a LoRA adapter is
    merged for the duration of the block (the tensors are views: copy them inside it)."""
    if not _is_peft(model):
        # named_parameters yields a tied weight once, as vLLM's loader expects (TRL 1.16 relies
        # on the same in generation/vllm_generation.py)
        yield [(name, p.detach()) for name, p in model.named_parameters()]
        return
    prefix = getattr(model, "prefix", "lora_")
    with torch.no_grad():
        # merged for the read, as TRL 1.16 pushes a peft policy (docs/engines.md: faster than a
        # vLLM LoRA request on the measured model)
        model.merge_adapter()
        try:
            named = []
            for name, param in model.named_parameters():
                # peft's wrapped names back to the checkpoint's, by which vLLM loads
                # the renames of TRL 1.16's _iter_named_params (generation/vllm_generation.py)
                name = name.removeprefix("base_model.model.").replace(".base_layer", "")
                # adapter factors, modules_to_save originals: merged already, no checkpoint names
                if prefix in name or "original_module" in name:
                    continue
                named.append((name.replace("modules_to_save.default.", ""), param.detach()))
            yield named
        finally:
            # training continues on the unmerged base weights and adapter
            model.unmerge_adapter()


def check_weight_names(model: torch.nn.Module, state: Any) -> None:
    """A state dict pushed instead of the model: its names must be the policy's (as vLLM loads
    them), or the push would load nothing and the engine keep its old weights."""
    with merged_named_weights(model) as named:
        known = {name for name, _ in named}
    unknown = sorted(set(state) - known)
    if unknown:
        raise ValueError(
            f"the weights pushed hold {len(unknown)} name(s) the policy does not have, e.g. "
            f"{unknown[:3]}; push the policy model itself, or a state dict in its "
            f"transformers names (e.g. {sorted(known)[:2]})"
        )


def pack_weights(named: list[tuple[str, torch.Tensor]]) -> bytes:
    """One safetensors blob (CPU copies; tied tensors are sent once per name)."""
    from safetensors.torch import save

    # contiguous copies: safetensors refuses non-contiguous and storage-sharing (tied) tensors
    return save({name: t.detach().to("cpu").contiguous().clone() for name, t in named})


def unpack_weights(blob: bytes) -> list[tuple[str, torch.Tensor]]:
    from safetensors.torch import load

    return list(load(blob).items())


def shared_memory_dir() -> Path:
    """``/dev/shm`` where it exists (RAM-backed), else the temporary directory."""
    # RAM-backed where it exists: the weights file never reaches a disk
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def write_weights_file(named: list[tuple[str, torch.Tensor]], directory: Path | None = None
                       ) -> Path:
    """The weights as a safetensors file in shared memory; the caller removes it."""
    from safetensors.torch import save_file

    directory = directory or shared_memory_dir()
    path = directory / f"mtgrpo-weights-{os.getpid()}-{uuid.uuid4().hex}.safetensors"
    save_file({name: t.detach().to("cpu").contiguous().clone() for name, t in named},
              str(path))
    return path
