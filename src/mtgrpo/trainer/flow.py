"""When the training loop logs, evaluates, saves and stops.

The rules are the Hugging Face ``Trainer``'s (transformers 5.24's ``DefaultFlowCallback``, and
the switches its ``CallbackHandler`` resets before each event), read from the native
configuration, so a run logs, evaluates and saves at the steps a transformers or TRL user
expects:

* after an optimizer step: log at step 1 with ``logging_first_step`` and every
  ``logging_steps``; evaluate every ``eval_steps`` once ``eval_delay`` is reached; save every
  ``save_steps``; at ``max_steps`` stop, evaluate (if that step was not evaluated already) and
  save (``steps`` strategies);
* at the end of an epoch: log, evaluate (from ``eval_delay`` epochs on) and save for the
  ``epoch`` strategies.

The step counts are those of ``state`` (a :class:`~mtgrpo.trainer.hooks.RunState`, or TRL's
surface's ``TrainerState``: the checkpoint's ``trainer_state.json``), in optimizer steps, as TRL
counts them. The trainer calls one method per event (:meth:`Flow.step_end`, ...), each through
:meth:`Flow.event`; :class:`mtgrpo.compat.GRPOTrainer`'s flow hands the events to transformers'
own ``CallbackHandler`` instead (``DefaultFlowCallback`` first, then the user's callbacks), and
``tests/trainer/test_flow.py`` holds the two to the same switches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mtgrpo.config import TrainConfig

__all__ = ["Control", "Flow"]


@dataclass
class Control:
    """The loop's switches, named as transformers' ``TrainerControl`` (whose instances a
    :class:`Flow` also takes)."""

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False


class Flow:
    """The loop's events. Each resets the switches transformers' ``CallbackHandler`` resets for
    it and applies the rules of the module docstring to :attr:`control`."""

    def __init__(self, config: TrainConfig, control: Any = None) -> None:
        self.config = config
        self.control = Control() if control is None else control

    def train_begin(self, state: Any) -> None:
        self.event("on_train_begin", state)

    def train_end(self, state: Any) -> None:
        self.event("on_train_end", state)

    def epoch_begin(self, state: Any) -> None:
        self.event("on_epoch_begin", state)

    def epoch_end(self, state: Any) -> None:
        self.event("on_epoch_end", state)

    def step_begin(self, state: Any) -> None:
        self.event("on_step_begin", state)

    def step_end(self, state: Any) -> None:
        """After each optimizer step (``state.global_step`` already counts it)."""
        self.event("on_step_end", state)

    def log(self, state: Any, logs: dict[str, Any]) -> None:
        self.event("on_log", state, logs=logs)

    def evaluate(self, state: Any, metrics: dict[str, Any]) -> None:
        self.event("on_evaluate", state, metrics=metrics)

    def save(self, state: Any) -> None:
        self.event("on_save", state)

    def event(self, name: str, state: Any, **details: Any) -> None:
        """Apply event ``name``'s resets and rules (``details``: its logs or metrics)."""
        control = self.control
        # the resets are transformers 5.24 CallbackHandler.on_*'s, made before any callback runs
        if name == "on_train_begin":
            control.should_training_stop = False
        elif name == "on_epoch_begin":
            control.should_epoch_stop = False
        elif name == "on_step_begin":
            control.should_log = control.should_evaluate = control.should_save = False
        elif name == "on_step_end":
            # DefaultFlowCallback.on_step_end's rules; the handler itself resets nothing here
            self._after_optimizer_step(state)
        elif name == "on_epoch_end":
            self._after_epoch(state)
        elif name == "on_log":
            control.should_log = False
        elif name == "on_evaluate":
            control.should_evaluate = False
        elif name == "on_save":
            control.should_save = False

    def _after_optimizer_step(self, state: Any) -> None:
        control, step = self.control, state.global_step
        output, evaluation = self.config.output, self.config.evaluation
        # state.logging_steps / eval_steps / save_steps, as DefaultFlowCallback: absolute
        # optimizer-step counts (a ratio below 1 resolved), not the config's values
        if step == 1 and output.logging_first_step:
            control.should_log = True
        if output.logging_strategy == "steps" and step % state.logging_steps == 0:
            control.should_log = True
        # transformers compares eval_delay with the step here and with the epoch below
        evaluates = evaluation.eval_strategy == "steps" and evaluation.eval_delay <= step
        if evaluates and step % state.eval_steps == 0:
            control.should_evaluate = True
        saves = self.config.saving.save_strategy == "steps"
        if saves and state.save_steps > 0 and step % state.save_steps == 0:
            control.should_save = True
        if step >= state.max_steps:
            control.should_training_stop = True
            # the last step is evaluated and saved, once, under the steps strategies
            if evaluates and step % state.eval_steps != 0:
                control.should_evaluate = True
            if saves:
                control.should_save = True

    def _after_epoch(self, state: Any) -> None:
        control = self.control
        if self.config.output.logging_strategy == "epoch":
            control.should_log = True
        evaluation = self.config.evaluation
        if evaluation.eval_strategy == "epoch" and evaluation.eval_delay <= state.epoch:
            control.should_evaluate = True
        if self.config.saving.save_strategy == "epoch":
            control.should_save = True
