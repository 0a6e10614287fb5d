"""mtgrpo._progress: a bar in a terminal, plain periodic lines in a log, nested phases."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from mtgrpo._progress import accuracy_status, format_seconds, progress, use_bar
from mtgrpo.trainer.progress import TrainingProgress


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _log_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()  # not a tty: what `mtgrpo train > log` or a CI job gives
    return Console(file=out, width=200), out


@pytest.fixture(autouse=True)
def _no_forced_terminal(monkeypatch):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "MTGRPO_PROGRESS_SECONDS"):
        monkeypatch.delenv(name, raising=False)


def test_off_a_terminal_a_line_after_the_first_step_then_every_interval_then_at_the_end():
    console, out = _log_console()
    clock = FakeClock()
    assert not use_bar(console)
    with progress("train", 100, console=console, clock=clock, interval=30) as phase:
        for step in range(1, 101):
            clock.now += 1.0  # one second per step: a 100 s phase
            phase.update(step, status=f"loss {1 / step:.3f}")
    lines = out.getvalue().splitlines()
    # step 1 (the pace), then steps 31, 61, 91 (30 s apart), then the end
    assert [line.split()[1] for line in lines] == ["1/100", "31/100", "61/100", "91/100",
                                                   "100/100"]
    assert lines[-1].endswith("loss 0.010")
    assert lines[1] == "[train] 31/100 steps  elapsed 0:00:31  eta 0:01:09  loss 0.032"
    assert "eta 0:00:00" in lines[-1]
    assert "\x1b" not in out.getvalue()  # no escape codes, no bar in the log


def test_the_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("MTGRPO_PROGRESS_SECONDS", "0")
    console, out = _log_console()
    with progress("sft", 3, console=console, clock=FakeClock()) as phase:
        for step in range(1, 4):
            phase.update(step)
    # every step; the last step's line is the end's
    assert [line.split()[1] for line in out.getvalue().splitlines()] == ["1/3", "2/3", "3/3"]
    monkeypatch.setenv("MTGRPO_PROGRESS_SECONDS", "soon")
    with pytest.raises(ValueError, match="MTGRPO_PROGRESS_SECONDS='soon' is not a number"), \
            progress("sft", 3, console=console):
        pass


def test_in_a_terminal_a_bar_and_a_nested_phase_is_a_row_of_it():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    assert use_bar(console)
    with progress("train", 4, console=console) as outer:
        assert outer.bar is not None
        with progress("eval", 10, unit="prompts", console=console) as inner:
            assert inner.bar is outer.bar  # one live display, two rows
            assert len(outer.bar.tasks) == 2
            inner.update(advance=10)
            inner.summary = "eval: worst 10.0% (b) avg 20.0%"
        assert len(outer.bar.tasks) == 1  # the evaluation's row went with it
        assert outer.last_child_summary == "eval: worst 10.0% (b) avg 20.0%"
        outer.update(4)
    assert "train" in out.getvalue()


def test_a_disabled_phase_silences_the_phases_inside_it():
    console, out = _log_console()
    with progress("train", 4, console=console, enabled=False) as outer:
        with progress("eval", 2, console=console) as inner:
            inner.update(advance=2)
            inner.summary = "eval: done"
        outer.update(4)
    assert out.getvalue() == ""
    assert outer.last_child_summary == "eval: done"


def test_training_progress_labels_the_train_batch_and_the_last_evaluation(monkeypatch, capsys):
    monkeypatch.setenv("MTGRPO_PROGRESS_SECONDS", "0")
    batch = {"accuracy/worst": 0.0, "accuracy/worst_task": "countdown:2x20",
             "accuracy/average": 0.25, "time/step": 1.5}
    with TrainingProgress(3) as bar:
        bar.advance(1, batch)
        with progress("eval", 2, unit="prompts") as evaluation:  # as evaluate_prompts does
            evaluation.update(advance=2)
            evaluation.summary = accuracy_status("eval", 0.1875, "countdown:3x9", 0.5)
        bar.advance(2, batch)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[train] 1/3 steps")
    assert "train batch: worst 0.0% (countdown:2x20) avg 25.0%" in lines[0]
    assert "eval:" not in lines[0]  # no evaluation yet
    assert lines[-3].startswith("[eval] 2/2 prompts")
    assert lines[-3].endswith("eval: worst 18.8% (countdown:3x9) avg 50.0%")
    assert lines[-2].startswith("[train] 2/3 steps")
    assert "train batch: worst 0.0% (countdown:2x20) avg 25.0%  " \
           "eval: worst 18.8% (countdown:3x9) avg 50.0%  1.5s/step" in lines[-2]


def test_format_seconds():
    assert format_seconds(3725.2) == "1:02:05"
    assert format_seconds(float("nan")) == "-"
