"""A run killed with SIGKILL and resumed from its last checkpoint equals an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors.torch import load_file

from mtgrpo.reporting import read_metrics

SCRIPT = Path(__file__).with_name("resume_script.py")


def _run(model: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SCRIPT.parent), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(model), str(out), *extra],
        env=env, capture_output=True, text=True, timeout=300,
    )


def _comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(("time/", "throughput/"))}


def _steps(run) -> list[dict]:
    """The step records (train and eval), without the run records each train() call writes."""
    return [r for r in read_metrics(run) if r["split"] != "run"]


def test_sigkill_and_resume_reproduce_the_uninterrupted_run(tiny_model_dir, tmp_path):
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    with ThreadPoolExecutor(2) as pool:  # the two runs are independent: side by side
        done, killed = pool.map(lambda args: _run(tiny_model_dir, *args),
                                [(full,), (crashed, "--kill-at", "6")])
    assert done.returncode == 0, done.stderr[-3000:]
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert (crashed / "checkpoint-4").is_dir()
    assert not (crashed / "checkpoint-6").exists()
    # the killed run logged step 5 after its last checkpoint (step 4)
    assert [r["step"] for r in _steps(crashed)] == [1, 2, 3, 4, 5]

    # what a kill during a checkpoint write leaves: a temporary directory, removed on resume
    stale = crashed / ".checkpoint-6.tmp-99999"
    (stale / "model").mkdir(parents=True)
    resumed = _run(tiny_model_dir, crashed, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not stale.exists()

    expected = [_comparable(r) for r in _steps(full)]
    actual = [_comparable(r) for r in _steps(crashed)]
    assert [r["step"] for r in actual] == [1, 2, 3, 4, 5, 6]
    assert actual == expected
    # each train() call says how it computes: the first run at step 0, the resumed one at 4
    assert [r["step"] for r in read_metrics(crashed, split="run")] == [0, 4]
    # nothing logged is lost: the interrupted run's step-5 line was moved aside, not deleted
    side_files = list(crashed.glob("metrics.after-step-4.*.jsonl"))
    assert len(side_files) == 1
    assert '"step": 5' in side_files[0].read_text()

    final_full = load_file(str(full / "checkpoint-6" / "trainable.safetensors"))
    final_resumed = load_file(str(crashed / "checkpoint-6" / "trainable.safetensors"))
    assert final_full.keys() == final_resumed.keys()
    for name, tensor in final_full.items():
        assert torch.equal(tensor, final_resumed[name]), name


def test_stale_checkpoint_temporaries_are_removed_and_nothing_else(tmp_path):
    from mtgrpo._files import write_atomically
    from mtgrpo.trainer.checkpoint import remove_stale_temporaries

    for name in (".checkpoint-3.tmp-123", ".checkpoint-10.tmp-4", "checkpoint-2",
                 ".checkpoint-3.tmp-abc", "notes.tmp-1"):
        (tmp_path / name).mkdir()
    assert sorted(p.name for p in remove_stale_temporaries(tmp_path)) == [
        ".checkpoint-10.tmp-4", ".checkpoint-3.tmp-123"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".checkpoint-3.tmp-abc", "checkpoint-2", "notes.tmp-1"]
    written = write_atomically(tmp_path / "checkpoint-5", lambda tmp: (tmp / "f").write_text("x"))
    assert written.name == "checkpoint-5"
    assert remove_stale_temporaries(tmp_path) == []  # a finished write leaves nothing
    assert remove_stale_temporaries(tmp_path / "missing") == []
