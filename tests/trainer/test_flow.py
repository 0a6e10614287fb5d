"""The native flow (:mod:`mtgrpo.trainer.flow`) against transformers' own: the same events on
the same state give the same switches as a ``CallbackHandler`` holding only
``DefaultFlowCallback`` (what :class:`mtgrpo.compat.GRPOTrainer` runs), for every strategy."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from transformers import TrainerControl, TrainerState
from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

from mtgrpo.config import FlatOptions, TrainConfig
from mtgrpo.trainer.flow import Control, Flow

SWITCHES = [f.name for f in dataclasses.fields(Control)]


def _config(logging: str, evaluation: str, saving: str, first: bool, delay: float) -> TrainConfig:
    return TrainConfig.from_flat({
        "logging_strategy": logging, "eval_strategy": evaluation, "save_strategy": saving,
        "logging_first_step": first, "eval_delay": delay, "logging_steps": 3, "eval_steps": 2,
        "save_steps": 4, "max_steps": 9,
        **({"metric_for_best_model": "loss"} if saving == "best" else {}),
    })


def _switches(control) -> dict[str, bool]:
    return {name: getattr(control, name) for name in SWITCHES}


def _run(flow_event, state: TrainerState, epoch_every: int, steps: int) -> list[dict[str, bool]]:
    """A loop's events over ``steps`` optimizer steps; the switches after each event."""
    seen = []
    flow_event("on_train_begin")
    for step in range(1, steps + 1):
        if (step - 1) % epoch_every == 0:
            flow_event("on_epoch_begin")
        flow_event("on_step_begin")
        state.global_step = step
        state.epoch = step / epoch_every
        seen.append(flow_event("on_step_end"))
        if step % epoch_every == 0:
            seen.append(flow_event("on_epoch_end"))
        # what the trainer does with the switches announces these, which reset them
        seen.append(flow_event("on_log", logs={"loss": 1.0}))
        seen.append(flow_event("on_evaluate", metrics={"eval_loss": 1.0}))
        if step == 5:  # a switch a run acts on late: set, then reset by its event
            seen.append(flow_event("on_save"))
    return seen


def _state() -> TrainerState:
    return TrainerState(global_step=0, max_steps=9, logging_steps=3, eval_steps=2, save_steps=4)


@pytest.mark.parametrize(("logging", "evaluation", "saving"), list(itertools.product(
    ["steps", "epoch", "no"], ["steps", "epoch", "no"], ["steps", "epoch", "best", "no"])))
@pytest.mark.parametrize(("first", "delay"), [(False, 0), (True, 5)])
def test_the_native_flow_sets_the_switches_transformers_sets(logging, evaluation, saving, first,
                                                             delay):
    config = _config(logging, evaluation, saving, first, delay)
    native, native_state = Flow(config), _state()

    def native_event(name, **details):
        native.event(name, native_state, **details)
        return _switches(native.control)

    handler = CallbackHandler([DefaultFlowCallback], None, None, None, None)
    args, theirs_state, theirs = FlatOptions(config), _state(), [TrainerControl()]

    def transformers_event(name, **details):
        theirs[0] = getattr(handler, name)(args, theirs_state, theirs[0], **details)
        return _switches(theirs[0])

    expected = _run(transformers_event, theirs_state, epoch_every=3, steps=9)
    assert _run(native_event, native_state, epoch_every=3, steps=9) == expected
    if {logging, evaluation, saving} & {"steps", "epoch"}:  # a comparison of switches set
        assert any(any(switches.values()) for switches in expected)


def test_the_run_state_has_transformers_trainer_state_fields_and_defaults():
    import dataclasses

    from mtgrpo.trainer.hooks import RunState

    def defaults(cls: type) -> dict:
        return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(cls)}

    ours, theirs = defaults(RunState), defaults(TrainerState)
    theirs["log_history"] = []  # TrainerState's __post_init__ turns its None into a list
    assert list(ours) == list(theirs)
    assert ours == theirs
    # a checkpoint's record reads the same whichever wrote it
    saved = dataclasses.asdict(RunState(global_step=3, log_history=[{"loss": 1.0}]))
    assert TrainerState(**saved).global_step == 3
