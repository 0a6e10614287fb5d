"""TRL's ``GRPOTrainer``: the trainer with TRL's arguments, TRL's flat
:class:`~mtgrpo.compat.GRPOConfig` and the transformers ``Trainer`` surface.

The trainer itself (:class:`mtgrpo.trainer.GRPOTrainer`) reads the native
:class:`~mtgrpo.config.TrainConfig`, which it builds from the ``GRPOConfig`` it is given
(``to_native()``) and keeps as ``trainer.config``; ``trainer.args`` stays the object given, as
TRL's code and callbacks expect. This class adds:

* TRL's positional arguments (``callbacks`` is the eighth) and TRL's default ``GRPOConfig()``
  (counted in optimizer steps) when no ``args`` are given;
* transformers callbacks: the loop's events go to transformers' own ``CallbackHandler``, with
  ``DefaultFlowCallback`` first as in the ``Trainer``, so the flow's switches are
  transformers' (the native trainer applies the same rules itself, :mod:`mtgrpo.trainer.flow`);
  ``add_callback``, ``pop_callback``, ``remove_callback``, ``callback_handler``;
* TRL's ``log`` and attribute names (``entropy_coef``, ``get_off_policy_mask``);
* TRL 1.16's rules for streaming datasets: transformers' ``accelerator_config.dispatch_batches``
  must be off, and ``dataloader_num_workers`` is set to 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mtgrpo.compat.config import GRPOConfig
from mtgrpo.trainer import GRPOTrainer as _Trainer
from mtgrpo.trainer.flow import Flow

__all__ = ["GRPOTrainer"]


class _CallbackFlow(Flow):
    """The flow as transformers' ``Trainer`` runs it: every event through its
    ``CallbackHandler`` (which resets the switches, then calls ``DefaultFlowCallback`` and the
    user's callbacks in order; a callback may return a new control)."""

    def __init__(self, trainer: GRPOTrainer, callbacks: list[Any] | None) -> None:
        from transformers import TrainerControl
        from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

        super().__init__(trainer.config, TrainerControl())
        self.handler = CallbackHandler(
            [DefaultFlowCallback, *(callbacks or [])], trainer.unwrapped, trainer.tokenizer,
            trainer.optimizer, trainer.scheduler)
        # callbacks read transformers' flat argument names: TRL's GRPOConfig, or a flat view
        # of a native configuration
        self.args = trainer.callback_args

    def event(self, name: str, state: Any, **details: Any) -> None:
        self.control = getattr(self.handler, name)(self.args, state, self.control, **details)


class GRPOTrainer(_Trainer):
    """TRL's ``GRPOTrainer``: :class:`mtgrpo.trainer.GRPOTrainer`'s arguments in TRL's
    positional order, ``args`` a TRL :class:`~mtgrpo.compat.GRPOConfig` (TRL's defaults when
    None) or a native configuration, and ``callbacks`` (eighth): transformers
    ``TrainerCallback`` objects or classes, which hear every event of the loop."""

    def __init__(self, model: Any, reward_funcs: Any = None, args: Any = None,
                 train_dataset: Any = None, eval_dataset: Any = None,
                 processing_class: Any = None, reward_processing_classes: Any = None,
                 callbacks: list[Any] | None = None, optimizers: tuple[Any, Any] = (None, None),
                 quantization_config: Any = None, peft_config: Any = None, tools: Any = None,
                 rollout_func: Any = None, environment_factory: Any = None,
                 **options: Any) -> None:
        # TRL 1.16's positional order, all of it (a test holds it to TRL's signature)
        self._callbacks = callbacks  # read by _make_flow, which the constructor calls
        super().__init__(model, reward_funcs, GRPOConfig() if args is None else args,
                         train_dataset, eval_dataset, processing_class,
                         reward_processing_classes, optimizers=optimizers,
                         quantization_config=quantization_config, peft_config=peft_config,
                         tools=tools, rollout_func=rollout_func,
                         environment_factory=environment_factory, **options)

    def _make_flow(self) -> Flow:
        return _CallbackFlow(self, self._callbacks)

    @staticmethod
    def _state_class() -> type:
        """transformers' ``TrainerState``: what TRL's ``trainer.state`` is and callbacks get."""
        from transformers import TrainerState

        return TrainerState

    @property
    def callback_handler(self) -> Any:
        """transformers' ``CallbackHandler`` of the run's callbacks."""
        return self.flow.handler

    def add_callback(self, callback: Any) -> None:
        """Add a transformers ``TrainerCallback`` (an instance or a class)."""
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback: Any) -> Any:
        """Remove a callback (an instance or a class) and return it."""
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback: Any) -> None:
        self.callback_handler.remove_callback(callback)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's ``log``: record ``logs`` in ``state.log_history``, metrics.jsonl and the
        trackers, and call ``on_log``."""
        self._write(logs, "train")
        self._record({**logs, "epoch": self.state.epoch})

    @property
    def entropy_coef(self) -> float:
        """The entropy bonus coefficient now (TRL's attribute; adaptive when configured)."""
        return self.updater.entropy.coef

    @entropy_coef.setter
    def entropy_coef(self, value: float) -> None:
        self.updater.entropy.coef = float(value)

    @staticmethod
    def get_off_policy_mask(advantages: torch.Tensor, per_token_logps: torch.Tensor,
                            sampling_per_token_logps: torch.Tensor, mask: torch.Tensor,
                            off_policy_threshold: float) -> torch.Tensor:
        """TRL's off-policy sequence mask, ``[B, 1]`` (1.0 keep, 0.0 drop): see
        :func:`mtgrpo.algo.token_weights.off_policy_mask`."""
        from mtgrpo.algo.token_weights import off_policy_mask

        keep = off_policy_mask(advantages.reshape(-1), per_token_logps, sampling_per_token_logps,
                               mask, off_policy_threshold)
        return keep.unsqueeze(-1).to(mask.dtype)

    def _check_iterable(self, data: Any) -> None:
        args = self.args
        iterable_eval = self.eval_dataset is not None and any(
            type(v).__name__ == "IterableDataset" for v in (
                self.eval_dataset.values() if isinstance(self.eval_dataset, Mapping)
                else [self.eval_dataset]))
        if (data.iterable or iterable_eval) and hasattr(args, "accelerator_settings"):
            # TRL's rule: dispatching collates on the main process, which cannot concatenate
            # the prompt column (huggingface/trl#3213); off, each process reads its own slice
            if args.accelerator_settings().dispatch_batches:
                raise ValueError(
                    "Iterable datasets require `dispatch_batches=False`, but it is set to "
                    "`True` in `accelerator_config`; set it to False"
                )
            args.accelerator_settings().dispatch_batches = False
            if data.iterable:
                # TRL's rule: several workers would interleave the stream and split the groups
                args.dataloader_num_workers = 0
        super()._check_iterable(data)
