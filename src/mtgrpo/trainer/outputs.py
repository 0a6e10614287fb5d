"""What :class:`~mtgrpo.trainer.GRPOTrainer` does at the switches of its flow
(:mod:`~mtgrpo.trainer.flow`): log records (``state.log_history``, metrics.jsonl, the
trackers), evaluation, checkpoints, the best model and its reload, the reference-model sync,
``push_to_hub``; and the hooks reward functions log through (``log_extra``, ``log_metric``).
The state it reads (``state``, ``flow``, ``log_window``, ...) is built by the trainer
(``_build_loop_state``)."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mtgrpo.trainer import checkpoint as ckpt
from mtgrpo.trainer import hooks, sharding
from mtgrpo.trainer.hub import HubUploader, default_repo_id
from mtgrpo.trainer.metrics import step_line

logger = logging.getLogger("mtgrpo.trainer.trainer")  # the trainer's logger


class RunOutputs:
    """Mixed into :class:`~mtgrpo.trainer.GRPOTrainer` (see the module docstring)."""

    @property
    def control(self) -> Any:
        """The flow's switches (``should_log``, ``should_evaluate``, ``should_save``,
        ``should_training_stop``), transformers' ``TrainerControl`` names."""
        return self.flow.control

    @control.setter
    def control(self, value: Any) -> None:
        self.flow.control = value

    def _log_completion_extra(self, column: str, values: list[Any]) -> None:
        """``log_extra(column, values)`` from a reward function: a column of the completion
        logs (``trainer._logs["extra"]``, and completions.jsonl when one value per completion)."""
        self._logs["extra"][column].extend(values)
        self._pending_extra.setdefault(column, []).extend(values)

    def _log_metric(self, name: str, value: float) -> None:
        """``log_metric(name, value)`` from a reward function: averaged over each log window."""
        self.log_window.add_custom(name, value)

    def push_to_hub(self, repo_id: str | None = None, *, commit_message: str = "End of training",
                    private: bool | None = None, token: str | None = None,
                    revision: str | None = None, **_: Any) -> Any:
        """Upload the model (or the LoRA adapter) and tokenizer to the Hugging Face Hub.

        ``repo_id`` defaults to ``hub_model_id`` (or ``output_dir``'s name); ``private``,
        ``token`` and ``revision`` to ``hub_private_repo``, ``hub_token`` and ``hub_revision``.
        Needs network access and a token (``hf auth login`` or ``HF_TOKEN``); only the main
        process uploads. (transformers' first positional argument is ``commit_message``: pass
        it by keyword.)
        """
        # a sharded model is gathered by every process (the trainer calls this on each)
        weights = self._whole_weights()
        if not self.is_main_process:
            return None
        args = self.config
        uploader = HubUploader(
            repo_id or default_repo_id(args.output.output_dir, args.saving.hub_model_id),
            token=token or args.saving.hub_token,
            private=args.saving.hub_private_repo if private is None else private,
            revision=revision or args.saving.hub_revision,
        )
        with tempfile.TemporaryDirectory(prefix="mtgrpo-hub-") as folder:
            self._write_model(Path(folder), weights)
            return uploader.upload(folder, commit_message=commit_message)

    def _record(self, logs: Mapping[str, Any]) -> None:
        """Append to ``state.log_history``: the flow's ``on_log`` event."""
        # transformers' Trainer.log: the record with the optimizer step, appended to
        # log_history, then on_log
        entry = {**logs, "step": self.state.global_step}
        entry.setdefault("epoch", self.state.epoch)
        self.state.log_history.append(entry)
        self.flow.log(self.state, dict(logs))

    def _after_step(self) -> None:
        """TRL's per-step extras: the reference-model sync and the CUDA cache."""
        args = self.config
        # in training steps, the config's unit (TRL's SyncRefModelCallback counts global_step)
        if args.loss.sync_ref_model and self.ref_model is not None and \
                self.step % args.loss.ref_model_sync_steps == 0:
            alpha = args.loss.ref_model_mixup_alpha
            # the policy's whole weights: ZeRO-3 and FSDP hold partitions outside a forward
            # (collective: every process ends its step here)
            with torch.no_grad(), self._gathered():
                for ref, current in zip(self.ref_model.parameters(),
                                        self.unwrapped.parameters(), strict=True):
                    # TR-DPO's soft update, as TRL's SyncRefModelCallback
                    ref.mul_(1 - alpha).add_(current.detach(), alpha=alpha)
        # in training steps too (transformers' training_step counts global_step)
        every = args.compute.torch_empty_cache_steps
        if every and self.step % every == 0 and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _log_save_evaluate(self, metrics: dict[str, Any]) -> None:
        """Act on the flow's switches (the last step is always logged)."""
        control = self.control
        if control.should_log or self.step == self.max_steps or control.should_training_stop:
            record = self.log_window.record(metrics, self.state.epoch)
            self._write(record, "train")
            self._record(record)
            if self.is_main_process and not self._bar_is_live:  # the bar shows the step
                logger.info("%s", step_line(self.step, self.max_steps, record))
            self._print_completions()
            control.should_log = False
        # transformers' _maybe_log_save_evaluate order: log, evaluate, then save, so a save
        # sees the best metric this evaluation set
        if control.should_evaluate:
            control.should_evaluate = False
            if self.eval_sets:
                self._track_best(self.evaluate())
        # transformers' save_strategy='best': save exactly when the evaluation set a new best
        if self.config.saving.save_strategy == "best" and self._improved:
            control.should_save = True
        if control.should_training_stop and self.config.saving.save_strategy in ("steps", "epoch"):
            control.should_save = True  # a run always ends with a checkpoint to resume from
        if control.should_save and self.config.saving.save_strategy != "no":
            self.save_checkpoint()
        self.control.should_save = False
        self._improved = False

    def _track_best(self, metrics: Mapping[str, Any]) -> None:
        """transformers' best-metric bookkeeping for save_strategy='best' and
        load_best_model_at_end."""
        name = self.config.saving.metric_for_best_model
        if name is None:
            return
        key = name if name.startswith("eval_") else f"eval_{name}"  # transformers' rule
        if key not in metrics:
            raise ValueError(f"metric_for_best_model={name!r} is not an eval metric; have: "
                             f"{', '.join(sorted(metrics))}")
        value = metrics[key]
        if hooks.best_metric_improved(name, self.config.saving.greater_is_better, value,
                                      self.state.best_metric):
            # save_checkpoint names best_model_checkpoint when it saves at best_global_step
            self.state.best_metric, self.state.best_global_step = value, self.state.global_step
            self._improved = True

    def _load_best_model(self) -> None:
        best = Path(self.state.best_model_checkpoint)
        weights = best / "trainable.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(f"the best checkpoint {best} holds no trainable weights")
        if self.sharded or self.zero is not None:  # the main process reads, all take theirs
            saved = ckpt.read_checked_trainable(self.unwrapped, weights) \
                if self.is_main_process else {}
            if self.zero is not None:
                self.zero.load_model_state(saved)
            else:
                sharding.load_model_state(self.unwrapped, saved)
        else:
            ckpt.load_trainable(self.unwrapped, weights)
        logger.info("loaded the best model (%s = %s) from %s",
                    self.config.saving.metric_for_best_model, self.state.best_metric, best)
