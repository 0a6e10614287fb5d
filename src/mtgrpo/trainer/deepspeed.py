"""DeepSpeed ZeRO (stages 2 and 3) under ``accelerate launch --use_deepspeed`` or a DeepSpeed
config file.

accelerate's ``prepare`` hands the model and mtgrpo's optimizer to ``deepspeed.initialize``;
the engine then owns what mtgrpo's update does itself in a plain run:

* the backward pass and the step: mtgrpo runs a number of micro-batches per optimizer step
  that changes from step to step (token budgets, every process kept in step), so the engine's
  ``gradient_accumulation_steps`` is 1 and :meth:`ZeroEngine.backward` marks the last
  micro-batch of each step as the accumulation boundary
  (``engine.set_gradient_accumulation_boundary``); ``scale_wrt_gas=False`` keeps the loss as
  mtgrpo's normaliser made it (the engine would divide it by its accumulation steps). The
  engine averages the gradients over processes, as DDP, which the normaliser already counts;
* clipping: ``max_grad_norm`` is the engine's ``gradient_clipping``; the learning rate is
  mtgrpo's scheduler over the optimizer the engine wraps (the engine's param groups are its);
* generation (ZeRO-3): every parameter is a partition, an empty tensor outside a module's
  forward. The generation phases run inside :meth:`ZeroEngine.gathered` (whole parameters on
  every process, ``deepspeed.zero.GatheredParameters``) with the engine's module hooks removed,
  as TRL does: a hooked module would release the gathered parameters after its forward, and
  gather them again (a collective) in a generation that other processes do not run;
* checkpoints: every process writes its partitions (``engine.save_checkpoint``, the
  ``deepspeed/`` folder of a checkpoint) and resumes from them (``engine.load_checkpoint``);
  the checkpoint's ``model/`` and ``trainable.safetensors`` hold the whole model, gathered.

The model is loaded whole on every process (accelerate's ``zero3_init_flag`` is turned off):
generation gathers the whole model on every process anyway, and the checks before the engine
(context length, the reference copy, the generation backend) read plain tensors.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["CHECKPOINT_FOLDER", "SUPPORTED_STAGES", "ZeroEngine", "check_before_loading",
           "configure", "launched"]

SUPPORTED_STAGES = (2, 3)
CHECKPOINT_FOLDER = "deepspeed"  # the engine's files in a checkpoint (its tag)


def launched(accelerator: Any = None) -> bool:
    """Whether accelerate runs DeepSpeed: ``accelerate launch --use_deepspeed`` (or a config
    file with a DeepSpeed section) sets ``ACCELERATE_USE_DEEPSPEED``; an accelerator built
    with a ``DeepSpeedPlugin`` says so itself."""
    if accelerator is not None:
        return accelerator.distributed_type.value == "DEEPSPEED"
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("true", "1", "yes")


def check_before_loading(args: Any, *, peft: bool, optimizer: Any) -> None:
    """What mtgrpo cannot run under DeepSpeed, refused before any model loads, each error
    naming the value and what to use instead."""
    try:
        import deepspeed  # noqa: F401
    except ImportError as error:
        raise ValueError(
            "accelerate launches DeepSpeed, which is not installed: install it with "
            "`DS_BUILD_OPS=0 pip install 'mtgrpo[deepspeed]'`, or launch without "
            "--use_deepspeed") from error
    refused = {
        "fsdp='full_shard'": (args.fully_sharded, "both shard the model; keep one (drop fsdp "
                              "or launch without --use_deepspeed)"),
        "use_vllm=True": (args.vllm.use_vllm, "vLLM reads whole weights, which ZeRO "
                          "partitions; generate with generation_backend 'static' or 'hf'"),
        "peft_config (LoRA)": (peft, "an adapter is small enough to train replicated; train "
                               "it without --use_deepspeed (DDP)"),
        "optimizers=(optimizer, ...)": (optimizer is not None, "the engine wraps the optimizer "
                                        "mtgrpo builds; pass optimizers=None and set optim / "
                                        "optim_args"),
        f"max_memory_per_microbatch={args.batch.max_memory_per_microbatch!r}": (
            args.batch.max_memory_per_microbatch is not None,
            "its measurement reads the partitioned weights; set max_tokens_per_microbatch"),
        # accelerate ignores DeepSpeed on cpu=True, so the trainer asks for the device DeepSpeed
        # finds: on a machine with GPUs that is a GPU
        "use_cpu=True": (args.compute.use_cpu and torch.cuda.is_available(),
                         "DeepSpeed trains on the GPUs it finds; launch without --use_deepspeed "
                         "to train on the CPU"),
    }
    for name, (given, alternative) in refused.items():
        if given:
            raise ValueError(f"{name} is not supported with DeepSpeed: {alternative}")


def configure(accelerator: Any, args: Any) -> None:
    """Check accelerate's DeepSpeed configuration and fill in what mtgrpo decides (the
    micro-batch size, accumulation steps and clipping), before any model loads."""
    plugin = accelerator.state.deepspeed_plugin
    config = plugin.deepspeed_config
    zero = config.get("zero_optimization", {})
    stage = zero.get("stage")
    if stage not in SUPPORTED_STAGES:
        raise ValueError(
            f"DeepSpeed ZeRO stage {stage!r} is not supported: use --zero_stage 3 (or 2), or "
            "zero_optimization.stage 3 (or 2) in the DeepSpeed config")
    for part in ("offload_optimizer", "offload_param"):
        device = (zero.get(part) or {}).get("device", "none")
        if device not in (None, "none"):
            raise ValueError(
                f"DeepSpeed zero_optimization.{part}.device={device!r} is not supported: the "
                "offloaded optimizer is DeepSpeed's own (DeepSpeedCPUAdam), not the one mtgrpo "
                "builds; set it to 'none'")
    for section in ("optimizer", "scheduler"):
        if section in config:
            raise ValueError(
                f"the DeepSpeed config's {section!r} section is not supported: mtgrpo builds "
                "the optimizer and the learning-rate schedule from its own options (optim, "
                "learning_rate, lr_scheduler_type, ...); remove the section")
    _fill(config, "gradient_accumulation_steps", 1,
          "mtgrpo marks each optimizer step's last micro-batch itself; set it to 'auto' (or 1) "
          "and use gradient_accumulation_steps / steps_per_generation in mtgrpo's options")
    _fill(config, "gradient_clipping", float(args.optimization.max_grad_norm or 0.0),
          "it is mtgrpo's max_grad_norm; set it to 'auto' or to the same value")
    _fill(config, "train_micro_batch_size_per_gpu", args.batch.per_device_train_batch_size,
          "mtgrpo plans its micro-batches; set it to 'auto' or per_device_train_batch_size")
    world = accelerator.num_processes
    _fill(config, "train_batch_size", args.batch.per_device_train_batch_size * world,
          "DeepSpeed checks it against the micro-batch size; set it to 'auto'")
    # no zero.Init: the model loads whole (module docstring), and transformers' generate would
    # otherwise run in lockstep across processes (synced_gpus), which the phases do not need
    plugin.zero3_init_flag = False
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()


def _fill(config: dict[str, Any], key: str, value: Any, alternative: str) -> None:
    """Set an ``auto`` (or absent) entry to mtgrpo's ``value``; another value is refused."""
    given = config.get(key, "auto")
    if given == "auto" or given == value:
        config[key] = value
        return
    raise ValueError(f"the DeepSpeed config's {key}={given!r} differs from mtgrpo's {value!r}: "
                     f"{alternative}")


class ZeroEngine:
    """The DeepSpeed engine as mtgrpo's update, generation and checkpoints use it."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.stage = engine.zero_optimization_stage()
        self._gathered = False

    @property
    def partitioned(self) -> bool:
        """ZeRO-3: every parameter is a partition outside a module's forward."""
        return self.stage == 3

    # ------------------------------------------------------------------ the update
    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """One micro-batch's backward; ``last``: the optimizer step's last micro-batch (the
        accumulation boundary, where the engine reduces the gradients)."""
        self.engine.set_gradient_accumulation_boundary(last)
        # the loss is already normalised over the whole step (mtgrpo's LossNormalizer)
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        """The optimizer step at the boundary that :meth:`backward` marked (clipping to
        ``gradient_clipping`` first); the gradients' global norm before clipping."""
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm if norm is not None else float("nan"))

    # ------------------------------------------------------------------ whole weights
    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Whole parameters on every process for the block (ZeRO-3; a no-op otherwise), the
        engine's hooks removed meanwhile. Collective: every process enters the block. A block
        inside another is a no-op."""
        if not self.partitioned or self._gathered:
            yield
            return
        import deepspeed

        module = self.engine.module
        with deepspeed.zero.GatheredParameters(list(module.parameters())):
            _remove_hooks(self.engine)
            self._gathered = True
            try:
                yield
            finally:
                self._gathered = False
                _add_hooks(self.engine)

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict on the main process (CPU copies; ``{}`` elsewhere).
        Every process must call it."""
        main = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        with self.gathered():
            if not main:
                return {}
            return {name: tensor.detach().to("cpu", copy=True)
                    for name, tensor in self.engine.module.state_dict().items()}

    def load_model_state(self, saved: dict[str, torch.Tensor]) -> None:
        """The main process's ``saved`` parameters (``{}`` elsewhere) into every process's
        model (the best model at the end of a run; the optimizer's master copy is left as it
        is). Every process must call it."""
        import deepspeed

        module = self.engine.module
        if not self.partitioned:
            _broadcast_into(module, saved)
            return
        # modifier_rank=0: what the main process writes is broadcast and partitioned on exit
        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=0), \
                torch.no_grad():
            for name, param in module.named_parameters():
                if name in saved:
                    param.copy_(saved[name])

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory: Path) -> None:
        """Every process's partitions (model, optimizer) into ``directory/deepspeed``. Every
        process must call it, with the same directory."""
        # save_latest=False: the trainer finds its checkpoints itself (checkpoint-<step>)
        self.engine.save_checkpoint(str(directory), tag=CHECKPOINT_FOLDER, save_latest=False)

    def load(self, directory: Path) -> None:
        """The partitions :meth:`save` wrote into ``directory`` (the scheduler is mtgrpo's,
        restored with the rest of the checkpoint)."""
        path, _ = self.engine.load_checkpoint(str(directory), tag=CHECKPOINT_FOLDER,
                                              load_optimizer_states=True,
                                              load_lr_scheduler_states=False)
        if path is None:
            raise FileNotFoundError(f"{directory / CHECKPOINT_FOLDER} holds no DeepSpeed "
                                    "checkpoint")


def _broadcast_into(module: nn.Module, saved: dict[str, torch.Tensor]) -> None:
    """ZeRO-2: whole parameters on every process; the main process's values sent to all."""
    main = torch.distributed.get_rank() == 0
    with torch.no_grad():
        for name, param in module.named_parameters():
            if main and name in saved:
                param.copy_(saved[name])
            torch.distributed.broadcast(param.data, src=0)


def _hooks_owner(engine: Any) -> Any:
    """The ZeRO-3 object that keeps the module hooks (``parameter_offload``)."""
    optimizer = engine.optimizer
    return getattr(optimizer, "parameter_offload", optimizer)


def _remove_hooks(engine: Any) -> None:
    """Remove ZeRO-3's fetch/release hooks from every module (TRL's ``remove_hooks``)."""
    from deepspeed.runtime.zero.partitioned_param_coordinator import iter_params

    owner = _hooks_owner(engine)
    for param in iter_params(owner.module, recurse=True):
        param.ds_active_sub_modules.clear()
    for hook in [*owner.forward_hooks, *owner.backward_hooks]:
        hook.remove()
    owner.forward_hooks, owner.backward_hooks = [], []


def _add_hooks(engine: Any) -> None:
    """Register ZeRO-3's hooks again (TRL's ``add_hooks``); the coordinator's recorded trace
    of module calls no longer holds after the generation's forwards, so it is invalidated."""
    owner = _hooks_owner(engine)
    coordinator = getattr(owner, "param_coordinator", None)
    if coordinator is not None and not coordinator.is_invalid_trace():
        coordinator._invalidate_trace()
    owner._register_deepspeed_module(owner.module)
