"""Fully sharded training (FSDP2, ``fully_shard``): TRL's ``fsdp="full_shard"``.

With ``fsdp: full_shard`` each process keeps ``1/world`` of every parameter, gradient and
optimizer state; a layer's parameters are gathered for its forward and backward and freed
after, and the gradients are reduce-scattered. The trainer shards the model itself (every
module whose class the model lists in ``_no_split_modules``, its decoder layers, then the whole
model), so the same run works on GPUs (NCCL) and on CPU processes (gloo), which accelerate's
FSDP plugin does not shard. What changes around the sharded model:

* generation: the engine reads whole weights, so every shard is gathered for the length of the
  generation phase of a step, and of an evaluation (:func:`unsharded`), and freed after; the
  engine sees a plain model;
* log-probabilities go through the model's own forward, which gathers the shards
  (:func:`mtgrpo.policy.resolve_logprob_path` picks that route for a sharded head);
* checkpoints hold the *full* state (:func:`full_model_state`, :func:`full_optimizer_state`),
  gathered on the main process, in the files of an unsharded checkpoint (the optimizer's
  state keyed by parameter names): a sharded checkpoint resumes exactly, and its ``model/``
  loads with ``from_pretrained`` like any other. Loading hands the state to every process's
  shards from the main process's copy (:func:`load_full_state`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

__all__ = ["ShardedGeneration", "full_model_state", "full_optimizer_state",
           "load_full_state", "load_model_state", "shard_model", "unsharded"]

def _fsdp_modules(model: nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def shard_model(model: nn.Module) -> nn.Module:
    """Shard ``model`` in place: each module whose class is in its ``_no_split_modules`` (the
    transformer blocks), then the root. Needs an initialised process group."""
    from torch.distributed.fsdp import fully_shard

    blocks = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in blocks]
    if not layers:
        raise ValueError(
            f"fsdp=full_shard shards a model block by block, but {type(model).__name__} names no "
            "blocks in _no_split_modules; train it without fsdp, or set "
            "model._no_split_modules to its decoder layer class name")
    # blocks first, then the root: each block is gathered and freed on its own
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


@contextlib.contextmanager
def unsharded(model: nn.Module) -> Iterator[None]:
    """Every shard of ``model`` gathered for the block (whole parameters on every process),
    freed after; forwards inside the block keep them gathered. Gathering is collective: every
    process must enter the block (the trainer gathers around whole phases, generation and
    evaluation, which every process runs, whether or not it holds prompts). A block inside
    another is a no-op."""
    if getattr(model, "_mtgrpo_gathered", False):
        yield
        return
    modules = _fsdp_modules(model)
    for module in modules:
        # forwards inside the block must not free what the phase gathered
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    model._mtgrpo_gathered = True
    try:
        yield
    finally:
        model._mtgrpo_gathered = False
        for module in modules:
            module.reshard()
            # resharded after each forward again: the update holds one gathered block at a time
            module.set_reshard_after_forward(True, recurse=False)


class ShardedGeneration:
    """A generation backend for a sharded model: each call runs with the shards gathered (by
    the phase around it, :func:`unsharded`; gathered here when called outside one).
    ``gathered``: the context that gathers them (the trainer's, FSDP's or DeepSpeed's)."""

    def __init__(self, backend: Any,
                 gathered: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
        self.backend, self.gathered = backend, gathered

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with self.gathered(), torch.no_grad():
            return self.backend.generate(*args, **kwargs)

    def update_weights(self, model_or_state: Any, version: int) -> None:
        with self.gathered():
            self.backend.update_weights(model_or_state, version)

    def __getattr__(self, name: str) -> Any:  # name, decoder_name, eos_token_ids, ...
        return getattr(self.backend, name)


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on the main process (CPU tensors; empty elsewhere). Every
    process must call it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    # full_state_dict with cpu_offload: torch gathers to rank 0's host memory, {} elsewhere
    return get_model_state_dict(model, options=_options(cpu_offload=True))


def full_optimizer_state(model: nn.Module, optimizer: Any) -> dict[str, Any]:
    """The optimizer's whole state, keyed by parameter names, on the main process (empty
    elsewhere). Every process must call it."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    # accelerate's AcceleratedOptimizer wraps the torch optimizer in `.optimizer`
    return get_optimizer_state_dict(model, getattr(optimizer, "optimizer", optimizer),
                                    options=_options(cpu_offload=True))


def load_model_state(model: nn.Module, model_state: dict[str, Any]) -> None:
    """Shard the main process's full ``model_state`` (trainable parameters at least; other
    processes pass ``{}``) into every process's model. Every process must call it."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    # broadcast_from_rank0: only the main process read the checkpoint; torch sends each
    # tensor from it to every process's shard. strict=False: a checkpoint holds the trainable
    # parameters, not necessarily all
    set_model_state_dict(model, model_state, options=_options(broadcast_from_rank0=True,
                                                              strict=False))


def load_full_state(model: nn.Module, optimizer: Any, model_state: dict[str, Any],
                    optimizer_state: dict[str, Any]) -> None:
    """Shard the main process's full ``model_state`` and ``optimizer_state`` (other processes
    pass ``{}``) into every process's model and optimizer. Every process must call it."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    options = _options(broadcast_from_rank0=True)
    load_model_state(model, model_state)
    set_optimizer_state_dict(model, getattr(optimizer, "optimizer", optimizer), optimizer_state,
                             options=options)
