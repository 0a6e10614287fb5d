"""The logged ``loss`` of a log window under ``logging_nan_inf_filter``, against transformers'
Trainer rule (trainer.py: a NaN or inf step loss adds ``tr_loss / (1 + steps since the log)``
to the window's sum instead of itself)."""

from __future__ import annotations

import math

from mtgrpo.trainer.hooks import LogWindow
from tolerance import f32_atol


def _transformers_window_loss(losses: list[float], nan_inf_filter: bool) -> float:
    """transformers 5.24 Trainer's logged loss of one window, step by step."""
    tr_loss = 0.0
    for steps_done, loss in enumerate(losses):
        if nan_inf_filter and not math.isfinite(loss):
            tr_loss += tr_loss / (1 + steps_done)
        else:
            tr_loss += loss
    return tr_loss / len(losses)


def _logged(losses: list[float], nan_inf_filter: bool) -> float:
    window = LogWindow()
    for loss in losses:
        window.add_step({"loss": loss}, nan_inf_filter)
    return window.record({}, epoch=0.0)["loss"]


def test_nan_inf_filter_keeps_non_finite_step_losses_out_of_the_logged_loss():
    for losses in ([1.0, math.nan, 3.0], [2.0, 4.0, math.inf], [math.nan, 2.0],
                   [-math.inf, math.nan, 5.0, 1.0]):
        expected = _transformers_window_loss(losses, True)
        got = _logged(losses, True)
        assert math.isfinite(got), losses
        assert abs(got - expected) <= f32_atol(expected, 4), (losses, got, expected)


def test_without_the_filter_a_nan_step_loss_stays_in_the_logged_loss():
    assert math.isnan(_logged([1.0, math.nan, 3.0], False))
    assert _logged([1.0, math.inf], False) == math.inf


def test_nan_inf_filter_leaves_non_finite_losses_out_of_train_loss():
    window = LogWindow()
    for loss in (1.0, math.nan, 3.0):
        window.add_step({"loss": loss}, True)
    assert window.run_losses == [1.0, 3.0]
