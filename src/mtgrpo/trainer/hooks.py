"""The transformers ``Trainer``'s bookkeeping, kept by :class:`~mtgrpo.trainer.GRPOTrainer`.

* ``trainer.state`` is a :class:`RunState`, the fields and meanings of transformers'
  ``TrainerState`` (``global_step``, ``epoch``, ``max_steps``, ``log_history``,
  ``best_metric``, ...; TRL's surface keeps a ``TrainerState`` itself); it is stored in every
  checkpoint (``trainer_state.json``) and restored on resume, so ``log_history`` survives a
  restart.
* The flow (:mod:`mtgrpo.trainer.flow`) decides from ``logging_strategy`` / ``eval_strategy`` /
  ``save_strategy`` and their step counts when to log, evaluate and save, by the HF
  ``Trainer``'s rules; TRL's surface (:class:`mtgrpo.compat.GRPOTrainer`) runs them through
  transformers' ``CallbackHandler``, where a callback may also set
  ``control.should_training_stop``.
* A log record holds the step's metrics under mtgrpo's names and TRL's
  (:data:`TRL_ALIASES`), with ``loss`` averaged over the steps since the previous log (the
  ``Trainer``'s definition). The end of training appends TRL's summary record
  (``train_runtime``, ``train_loss``, ...).

``trainer.state`` counts optimizer steps, as TRL's: ``global_step``, ``max_steps``,
``logging_steps`` / ``eval_steps`` / ``save_steps`` and ``best_global_step``; a training step
(one generation batch) advances ``global_step`` by ``optimizer_steps_per_step()``, with one
``step_end`` event per optimizer step, so the flow decides as in TRL's loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "TRL_ALIASES",
    "LogWindow",
    "RunState",
    "TrainOutput",
    "best_metric_improved",
    "new_state",
    "train_summary",
    "with_trl_names",
]

TRL_ALIASES = {
    "clip_ratio/low": "clip_ratio/low_mean",
    "clip_ratio/high": "clip_ratio/high_mean",
    "clip_ratio/region": "clip_ratio/region_mean",
}
"""mtgrpo metric -> the name TRL 1.16 logs the same quantity under (both are written)."""


def with_trl_names(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """``metrics`` plus each :data:`TRL_ALIASES` name of the quantities it holds."""
    record = dict(metrics)
    for ours, theirs in TRL_ALIASES.items():
        if ours in record:
            record[theirs] = record[ours]
    return record


class TrainOutput(dict):
    """What :meth:`GRPOTrainer.train` returns: the last step's metrics (a dict), with the
    fields of transformers' ``TrainOutput``: ``global_step``, ``training_loss`` and
    ``metrics`` (the summary record)."""

    def __init__(self, last: Mapping[str, Any], global_step: int, training_loss: float,
                 summary: Mapping[str, Any]) -> None:
        super().__init__(last)
        self.global_step = global_step
        self.training_loss = training_loss
        self.metrics = dict(summary)


@dataclass
class RunState:
    """The loop's state: transformers 5.24's ``TrainerState`` fields, names, defaults and
    meanings (a test holds them equal), so a checkpoint's ``trainer_state.json`` reads the
    same whichever wrote it, and a reward function written for TRL's ``trainer_state`` reads
    this one unchanged. Step counts are optimizer steps."""

    epoch: float = 0
    global_step: int = 0
    max_steps: int = 0
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: int | None = None
    num_train_epochs: int = 0
    num_input_tokens_seen: int = 0
    total_flos: float = 0
    log_history: list[dict[str, Any]] = field(default_factory=list)
    best_metric: float | None = None
    best_global_step: int | None = None
    best_model_checkpoint: str | None = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: str | None = None
    trial_params: dict[str, Any] | None = None
    stateful_callbacks: Any = None


def new_state(max_steps: int, steps_per_epoch: int, num_train_epochs: float,
              intervals: Mapping[str, int], train_batch_size: int, is_main: bool,
              state_class: type = RunState) -> Any:
    """A fresh state (a :class:`RunState`, or ``state_class``: TRL's surface passes
    transformers' ``TrainerState``) for a run of ``max_steps`` optimizer steps."""
    return state_class(
        epoch=0.0, global_step=0, max_steps=max_steps,
        # transformers' Trainer rule: as many epochs as max_steps reaches into
        num_train_epochs=math.ceil(max_steps / steps_per_epoch) if steps_per_epoch else
        int(num_train_epochs),
        logging_steps=intervals["logging"], eval_steps=intervals["eval"],
        save_steps=intervals["save"], train_batch_size=train_batch_size,
        is_local_process_zero=is_main, is_world_process_zero=is_main,
    )


class LogWindow:
    """The steps since the previous log: their losses (for the averaged ``loss``) and the
    metrics reward functions logged with ``log_metric`` (averaged, as TRL; :meth:`step_custom`
    gives the current step's means for the step record)."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.run_losses: list[float] = []
        self.custom: dict[str, list[float]] = {}
        self.step_values: dict[str, list[float]] = {}

    def add_step(self, metrics: Mapping[str, Any], nan_inf_filter: bool) -> None:
        loss = metrics.get("loss")
        # a step whose update was skipped (no informative group) has no loss: in neither mean
        if isinstance(loss, float):
            # logging_nan_inf_filter (transformers'): a NaN or inf loss stays out of train_loss,
            # and the window's logged loss counts it as transformers' Trainer does, as the sum
            # of the window's earlier losses over their count plus one (0 as the window's first)
            if math.isfinite(loss) or not nan_inf_filter:
                self.losses.append(loss)
                self.run_losses.append(loss)
            else:
                self.losses.append(sum(self.losses) / (len(self.losses) + 1))

    def add_custom(self, name: str, value: float) -> None:
        self.custom.setdefault(name, []).append(float(value))
        self.step_values.setdefault(name, []).append(float(value))

    def step_custom(self) -> dict[str, float]:
        """The means of this step's ``log_metric`` values (and forget them)."""
        means = {name: sum(v) / len(v) for name, v in self.step_values.items()}
        self.step_values = {}
        return means

    def record(self, metrics: Mapping[str, Any], epoch: float) -> dict[str, Any]:
        """The log record of the window ending with the step of ``metrics``; resets it."""
        record = with_trl_names(metrics)
        if self.losses:  # the HF Trainer's logged loss: the mean since the previous log
            record["loss"] = sum(self.losses) / len(self.losses)
        for name, values in self.custom.items():  # TRL averages its metrics over the window
            record[name] = sum(values) / len(values)
        record["epoch"] = epoch
        self.losses, self.custom = [], {}
        return record


def train_summary(start: float, steps: int, prompts_per_step: int, num_generations: int,
                  run_losses: Sequence[float]) -> dict[str, float]:
    """TRL's end-of-training record (``train_loss``: the mean step loss of this run)."""
    runtime = max(time.time() - start, 1e-9)
    return {
        "train_runtime": runtime,
        "train_samples_per_second": steps * prompts_per_step * num_generations / runtime,
        "train_steps_per_second": steps / runtime,
        "total_flos": 0.0,  # transformers' summary key; mtgrpo does not count FLOPs
        "train_loss": sum(run_losses) / len(run_losses) if run_losses else math.nan,
    }


def best_metric_improved(metric: str, greater_is_better: bool | None, value: float,
                         best: float | None) -> bool:
    """Whether ``value`` of ``metric`` beats ``best`` (larger is better unless the name ends
    in ``loss`` or ``greater_is_better`` says otherwise, as transformers)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    # transformers' default: a metric named *loss is minimised, any other maximised
    greater = not metric.endswith("loss") if greater_is_better is None else greater_is_better
    if best is None:
        return True
    return value > best if greater else value < best
