"""Saving and resuming :class:`~mtgrpo.trainer.GRPOTrainer`: checkpoints (model or adapter,
optimizer, scheduler, every process's RNG, the sampler's and the weighting's state), the final
model, ``config.yaml`` and the run's identity, and the exact resume from any of them (a
sharded run's checkpoint included). The file formats are in :mod:`mtgrpo.trainer.checkpoint`."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mtgrpo._files import aside_path, temporary_path, write_atomically, write_text_atomically
from mtgrpo.reporting import MetricsWriter
from mtgrpo.trainer import checkpoint as ckpt
from mtgrpo.trainer import deepspeed as zero
from mtgrpo.trainer import sharding
from mtgrpo.trainer.identity import check_resumable, run_identity

logger = logging.getLogger("mtgrpo.trainer.trainer")  # the trainer's logger

_RUN_OUTPUTS = ("metrics.jsonl", "completions.jsonl", "rollouts.jsonl", "config.yaml")


class Checkpointing:
    """Mixed into :class:`~mtgrpo.trainer.GRPOTrainer` (see the module docstring)."""

    def _trainer_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            # one RNG file per rank, and B, steps per epoch and max_steps depend on it: resume
            # needs the same count
            "world_size": self.world,
            "task_names": self.task_names,
            "weighting": self.weighting.state_dict(),
            **({"validation": self.validation.state_dict()} if self.validation else {}),
            "sampler": self.sampler.state_dict(),
            "entropy": self.updater.entropy.state_dict(),
            "hf_state": dataclasses.asdict(self.state),
            "identity": self._identity(),
            **({"sharded": True} if self.sharded else {}),
            **({"deepspeed_stage": self.zero.stage} if self.zero is not None else {}),
        }

    def _identity(self) -> dict[str, Any]:
        """What this run's steps mean (:mod:`mtgrpo.trainer.identity`)."""
        config = getattr(self.unwrapped, "config", None)
        # ZeRO-3 partitions are empty tensors: DeepSpeed keeps each parameter's size in ds_numel
        parameters = sum(getattr(p, "ds_numel", p.numel()) for p in self.unwrapped.parameters())
        model = f"{getattr(config, 'model_type', type(self.unwrapped).__name__)}, " \
                f"{parameters} parameters"
        return run_identity(self.callback_args, tasks=self.task_names,
                            channels=self.rewards.channel_names, model=model)

    def save_checkpoint(self) -> Path | None:
        """Write ``checkpoint-<step>`` atomically (main process) and rotate old ones.

        With ``save_only_model`` only the model is written (no resuming from it)."""
        # a collective: every process's RNG state goes to the main process, which writes them all
        rng_states = self._gather_objects([ckpt.rng_state()]) if self.world > 1 \
            else [ckpt.rng_state()]
        final = self.output_dir / f"checkpoint-{self.state.global_step}"
        # sharded: the whole state, gathered on the main process by every process
        weights = self._whole_weights()
        optimizer_state = sharding.full_optimizer_state(self.unwrapped, self.optimizer) \
            if self.sharded and not self.config.saving.save_only_model else None
        staged = self.zero is not None and not self.config.saving.save_only_model
        if staged:
            self._stage_engine_state(final)
        if self.is_main_process:
            def write(tmp: Path) -> None:
                self._write_model(tmp / "model", weights)
                if not self.config.saving.save_only_model:
                    ckpt.save_trainable(self.unwrapped, tmp / "trainable.safetensors", weights)
                    if not staged:  # DeepSpeed's optimizer state is in its own files
                        torch.save(self.optimizer.state_dict() if optimizer_state is None
                                   else optimizer_state, tmp / "optimizer.pt")
                    torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
                    for rank, state in enumerate(rng_states):
                        torch.save(state, tmp / f"rng_state_{rank}.pt")
                # the file list_checkpoints and the SIGTERM save take as a complete checkpoint
                (tmp / "trainer_state.json").write_text(json.dumps(self._trainer_state()))

            # named before the rotation below, which never deletes the best checkpoint
            if self.state.best_global_step == self.state.global_step:
                self.state.best_model_checkpoint = str(final)
            previous = ckpt.latest_checkpoint(self.output_dir)
            try:
                write_atomically(final, write, staged=staged)
            except (OSError, RuntimeError) as error:  # torch reports a full disk as RuntimeError
                raise ckpt.save_failure(final, error, previous) from error
            best = self.state.best_model_checkpoint
            ckpt.rotate_checkpoints(self.output_dir, self.config.saving.save_total_limit,
                                    keep=Path(best) if best else None)
            if self._hub is not None:
                self._hub.on_save(self.config.saving.hub_strategy, final / "model", final,
                                  self.state.global_step)
        # no process runs ahead while the main process still writes the checkpoint
        self.accelerator.wait_for_everyone()
        # transformers' order: on_save right after _save_checkpoint, the files on disk
        self.flow.save(self.state)
        return final if self.is_main_process else None

    def _whole_weights(self) -> dict[str, torch.Tensor] | None:
        """A sharded (FSDP) or DeepSpeed model's whole state dict on the main process (``{}``
        elsewhere); None where every process holds the model whole. Every process must call
        it."""
        if self.zero is not None:
            return self.zero.full_model_state()
        return sharding.full_model_state(self.unwrapped) if self.sharded else None

    def _stage_engine_state(self, final: Path) -> None:
        """DeepSpeed: every process writes its partitions (model, optimizer) into the main
        process's temporary directory of ``final``, which the main process then completes and
        renames into place (a kill before the rename leaves only a temporary directory)."""
        pid = self._gather_objects([os.getpid()])[0] if self.world > 1 else os.getpid()
        staging = temporary_path(final, pid)
        if self.is_main_process:
            shutil.rmtree(staging, ignore_errors=True)  # what an earlier failed save left
        self.accelerator.wait_for_everyone()
        self.zero.save(staging)
        # every process's files are written before the main process renames the directory
        self.accelerator.wait_for_everyone()

    def save_model(self, directory: str | Path | None = None) -> None:
        """The model (or LoRA adapter) and tokenizer in ``save_pretrained`` format (default
        directory: ``output_dir``, as transformers). A sharded model is gathered first (every
        process must call it) and written by the main process."""
        weights = self._whole_weights()
        if weights is not None and not self.is_main_process:
            return
        target = directory if directory is not None else self.config.output.output_dir
        self._write_model(Path(target), weights)

    def _write_model(self, directory: Path, weights: dict[str, torch.Tensor] | None) -> None:
        """``save_pretrained`` of the model (``weights``: its gathered state when sharded) and
        of the tokenizer."""
        self.unwrapped.save_pretrained(directory, safe_serialization=True, state_dict=weights)
        self.tokenizer.save_pretrained(directory)

    def _resume(self, target: str | bool) -> None:
        checkpoint = ckpt.latest_checkpoint(self.output_dir) if target is True else Path(target)
        if checkpoint is None or not (checkpoint / "trainer_state.json").is_file():
            raise FileNotFoundError(
                f"no checkpoint to resume from ({target!r} in {self.output_dir}); train from "
                "scratch by leaving resume_from_checkpoint unset"
            )
        state = _read(checkpoint / "trainer_state.json",
                      lambda p: ckpt.read_trainer_state(p.parent))
        if not (checkpoint / "trainable.safetensors").is_file():
            raise ValueError(f"{checkpoint} was written with save_only_model=True and holds no "
                             "optimizer or sampler state; it cannot be resumed from")
        if state["world_size"] != self.world or state["task_names"] != self.task_names:
            raise ValueError(
                f"{checkpoint} was written by {state['world_size']} process(es) for tasks "
                f"{state['task_names']}; resume with the same processes and tasks"
            )
        self._accepted_changes = check_resumable(checkpoint, state.get("identity"),
                                                 self._identity(),
                                                 self.config.saving.resume_allow_changes)
        if bool(state.get("sharded", False)) != self.sharded:
            raise ValueError(
                f"{checkpoint} was written by a {'sharded' if state.get('sharded') else 'plain'}"
                f" run (fsdp={'full_shard' if state.get('sharded') else 'unset'}); resume with "
                "the same fsdp setting")
        self._check_layout(checkpoint, state)
        # the sampler's state refuses another prompt set or order, and changes nothing when it
        # does: restored before the weights, so a refused resume has loaded nothing
        self.sampler.load_state_dict(state["sampler"])
        # every check above runs before the weights are loaded: a refused resume changes nothing
        if self.zero is not None:
            _read(checkpoint / zero.CHECKPOINT_FOLDER, lambda p: self.zero.load(p.parent))
        elif self.sharded:
            self._load_sharded(checkpoint)
        else:
            _read(checkpoint / "trainable.safetensors",
                  lambda p: ckpt.load_trainable(self.unwrapped, p))
            saved = _read(checkpoint / "optimizer.pt",
                          lambda p: torch.load(p, weights_only=False))
            _read(checkpoint / "optimizer.pt", lambda _: self.optimizer.load_state_dict(saved))
        saved = _read(checkpoint / "scheduler.pt", lambda p: torch.load(p, weights_only=False))
        _read(checkpoint / "scheduler.pt", lambda _: self.scheduler.load_state_dict(saved))
        self.weighting.load_state_dict(state["weighting"])
        if self.validation is not None and "validation" in state:  # else: evaluated at once
            self.validation.load_state_dict(state["validation"])
        if "entropy" in state:
            self.updater.entropy.load_state_dict(state["entropy"])
        if "hf_state" in state:
            self._restore_state(state["hf_state"])
        self.step = int(state["step"])
        # TRL's count from the training steps done, capped by this run's max_steps
        self.state.global_step = self._optimizer_steps_after(self.step)
        # this process's own stream (seeded seed + rank), so sampling continues where it stopped
        _read(checkpoint / f"rng_state_{self.rank}.pt",
              lambda p: ckpt.load_rng_state(p.parent, self.rank))
        if self.is_main_process:
            # records past the checkpoint's step would otherwise appear twice (moved aside,
            # never deleted); the rollout logs carry the step their records belong to too
            for log in ("metrics.jsonl", "rollouts.jsonl", "completions.jsonl"):
                MetricsWriter.rewind(self.output_dir / log, self.step)
        logger.info("resumed from %s at step %d", checkpoint, self.step)

    def _check_layout(self, checkpoint: Path, state: Mapping[str, Any]) -> None:
        """A DeepSpeed checkpoint resumes under DeepSpeed with the same ZeRO stage (its files
        hold each process's partitions), and only there."""
        saved = state.get("deepspeed_stage")
        current = None if self.zero is None else self.zero.stage
        if saved != current:
            def name(stage: Any) -> str:
                return "without DeepSpeed" if stage is None else f"with DeepSpeed ZeRO-{stage}"

            raise ValueError(f"{checkpoint} was written by a run {name(saved)} and this run "
                             f"is {name(current)}: resume it {name(saved)}")

    def _load_sharded(self, checkpoint: Path) -> None:
        """The checkpoint's whole model and optimizer state, read by the main process and
        handed to every process's shards."""
        weights: dict[str, Any] = {}
        optimizer_state: dict[str, Any] = {}
        if self.is_main_process:
            weights = _read(checkpoint / "trainable.safetensors",
                            lambda p: ckpt.read_checked_trainable(self.unwrapped, p))
            optimizer_state = _read(checkpoint / "optimizer.pt",
                                    lambda p: torch.load(p, weights_only=False))
        sharding.load_full_state(self.unwrapped, self.optimizer, weights, optimizer_state)

    def _restore_state(self, saved: Mapping[str, Any]) -> None:
        """The checkpoint's TrainerState (log history, best metric), kept in this object so
        reward functions holding ``trainer_state`` see the same one."""
        for name, value in saved.items():
            if hasattr(self.state, name):  # skips what this transformers lacks
                setattr(self.state, name, value)
        # this run's, not the checkpoint's: max_steps is no identity field, a resume may extend it
        self.state.max_steps = self.max_optimizer_steps

    def _write_config(self) -> None:
        import yaml

        config = self.run_config if self.run_config is not None \
            else self.config.to_dict()
        # atomically: another process (a grid planning its runs) may read it meanwhile
        write_text_atomically(self.output_dir / "config.yaml",
                              yaml.safe_dump(config, sort_keys=False))

    def _write(self, metrics: Mapping[str, Any], split: str) -> None:
        """One record of metrics.jsonl and the trackers (main process, during train())."""
        if self._writer is None:
            return
        self._writer.write({"step": self.step, "split": split, **metrics})
        if self._trackers is not None:
            self._trackers.log(metrics, self.step, split)


def _read(path: Path, load: Any) -> Any:
    """``load(path)``; a damaged file is an error naming it and the checkpoint to use instead
    (a missing one keeps its own message)."""
    try:
        return load(path)
    except FileNotFoundError:
        raise
    except Exception as error:
        # check_trainable's mismatch is a wrong model, not a damaged file
        if isinstance(error, ValueError) and "does not match the model" in str(error):
            raise
        raise ckpt.damaged_checkpoint(path, error) from error


def _set_aside_previous_run(output_dir: Path) -> Path | None:
    """A fresh run in a directory that holds an earlier run: move the earlier run's logs and
    checkpoints into ``previous-<time>/`` (nothing is deleted) so the new logs start clean."""
    old = [output_dir / name for name in _RUN_OUTPUTS if (output_dir / name).exists()]
    old += ckpt.list_checkpoints(output_dir)
    if not old:
        return None
    target = aside_path(output_dir, "previous")
    target.mkdir()
    for path in old:
        path.rename(target / path.name)
    logger.warning("%s held an earlier run; its logs and checkpoints were moved to %s "
                   "(use resume_from_checkpoint to continue it instead)", output_dir, target)
    return target
