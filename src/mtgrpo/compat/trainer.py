"""TRL's ``GRPOTrainer``: the trainer, taking TRL's flat :class:`~mtgrpo.compat.GRPOConfig`.

The trainer itself (:class:`mtgrpo.trainer.GRPOTrainer`) reads the native
:class:`~mtgrpo.config.TrainConfig`, which it builds from the ``GRPOConfig`` it is given
(``to_native()``) and keeps as ``trainer.config``; ``trainer.args`` stays the object given, as
TRL's code and callbacks expect. This class adds TRL's defaults and TRL's own checks:

* no ``args``: TRL's default ``GRPOConfig()`` (counted in optimizer steps);
* streaming datasets: transformers' ``accelerator_config.dispatch_batches`` must be off, and
  ``dataloader_num_workers`` is set to 0 (TRL 1.16's rules).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtgrpo.compat.config import GRPOConfig
from mtgrpo.trainer import GRPOTrainer as _Trainer

__all__ = ["GRPOTrainer"]


class GRPOTrainer(_Trainer):
    __doc__ = _Trainer.__doc__

    def __init__(self, model: Any, reward_funcs: Any = None, args: Any = None,
                 *positional: Any, **options: Any) -> None:
        super().__init__(model, reward_funcs, GRPOConfig() if args is None else args,
                         *positional, **options)

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
