"""A run killed with SIGKILL and resumed from its last checkpoint equals an uninterrupted run."""

from __future__ import annotations

import json
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
    # the rollout logs likewise: each step's records once, as the uninterrupted run wrote them
    for log in ("rollouts.jsonl", "completions.jsonl"):
        records = [json.loads(line) for line in (crashed / log).read_text().splitlines()]
        assert sorted({r["step"] for r in records}) == [1, 2, 3, 4, 5, 6]
        assert records == [json.loads(line) for line in (full / log).read_text().splitlines()]
        stem = log.removesuffix(".jsonl")
        assert '"step": 5' in next(crashed.glob(f"{stem}.after-step-4.*.jsonl")).read_text()

    final_full = load_file(str(full / "checkpoint-6" / "trainable.safetensors"))
    final_resumed = load_file(str(crashed / "checkpoint-6" / "trainable.safetensors"))
    assert final_full.keys() == final_resumed.keys()
    for name, tensor in final_full.items():
        assert torch.equal(tensor, final_resumed[name]), name


def test_a_resumed_run_reads_the_validation_results_the_uninterrupted_one_did(
    tiny_model_dir, tmp_path
):
    """Weights read from held-out accuracy (evaluated after 0 and 3 steps): the run resumed
    from checkpoint-4 carries both results, so its I_k, J_k and weights are the same."""
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    with ThreadPoolExecutor(2) as pool:
        done, killed = pool.map(lambda args: _run(tiny_model_dir, *args, "--validation"),
                                [(full,), (crashed, "--kill-at", "6")])
    assert done.returncode == 0, done.stderr[-3000:]
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    state = json.loads((crashed / "checkpoint-4" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["validation"]["evaluations"]] == [0, 3]
    resumed = _run(tiny_model_dir, crashed, "--resume", "--validation")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = [_comparable(r) for r in _steps(full)]
    assert [r["weighting/validation_step"] for r in expected if r["split"] == "train"] == [
        0, 0, 0, 3, 3, 3]
    assert all("validation/alpha/accuracy" in r for r in expected if r["split"] == "train")
    assert [_comparable(r) for r in _steps(crashed)] == expected


def test_sigterm_stops_cleanly_and_the_resumed_run_equals_the_uninterrupted_one(
    tiny_model_dir, tmp_path
):
    full, stopped = tmp_path / "full", tmp_path / "stopped"
    with ThreadPoolExecutor(2) as pool:
        done, terminated = pool.map(lambda args: _run(tiny_model_dir, *args),
                                    [(full,), (stopped, "--term-at", "3")])
    assert done.returncode == 0, done.stderr[-3000:]
    # the step in flight finished, was checkpointed, and the exit status says SIGTERM
    assert terminated.returncode == 128 + signal.SIGTERM, terminated.stderr[-3000:]
    assert (stopped / "checkpoint-3").is_dir()  # save_steps is 2: written because of the stop
    assert "SIGTERM: training stopped after step 3 of 6" in terminated.stderr
    assert "--resume_from_checkpoint true" in terminated.stderr
    assert [r["step"] for r in _steps(stopped)] == [1, 2, 3]
    resumed = _run(tiny_model_dir, stopped, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [_comparable(r) for r in _steps(stopped)] == [_comparable(r) for r in _steps(full)]


def test_resume_refuses_a_different_run_unless_told(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    first = _run(tiny_model_dir, run, "--term-at", "3")
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-3000:]
    refused = _run(tiny_model_dir, run, "--resume", "--num-generations", "2")
    assert refused.returncode == 1
    assert "was written by a different run (num_generations: 4 in the checkpoint, 2 now" \
        in refused.stderr
    assert "resume_allow_changes: [num_generations]" in refused.stderr
    assert [r["step"] for r in _steps(run)] == [1, 2, 3]  # nothing was trained or rewritten
    allowed = _run(tiny_model_dir, run, "--resume", "--num-generations", "2",
                   "--allow", "num_generations")
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert [entry["from_step"] for entry in history] == [0, 3]
    assert history[1]["changes"] == {"num_generations": {"checkpoint": 4, "now": 2}}
    assert history[0]["config"]["num_generations"] == 4


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


def test_a_replaced_checkpoint_survives_a_crash_between_the_renames(tmp_path, monkeypatch):
    import pytest

    from mtgrpo import _files
    from mtgrpo.trainer.checkpoint import remove_stale_temporaries

    final = tmp_path / "checkpoint-4"
    _files.write_atomically(final, lambda tmp: (tmp / "f").write_text("old"))
    _files.write_atomically(final, lambda tmp: (tmp / "f").write_text("new"))  # a replacement
    assert (final / "f").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4"]  # nothing aside left
    renames = []
    real_replace = os.replace

    def crash_on_second(source, target):  # the process dies after moving the old copy aside
        renames.append(Path(target).name)
        if len(renames) == 2:
            raise KeyboardInterrupt
        real_replace(source, target)

    monkeypatch.setattr(_files.os, "replace", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        _files.write_atomically(final, lambda tmp: (tmp / "f").write_text("newer"))
    monkeypatch.undo()
    assert not final.exists()
    assert renames == [f".checkpoint-4.old-{os.getpid()}", "checkpoint-4"]
    removed = remove_stale_temporaries(tmp_path)  # the next start: the old copy comes back
    assert [p.name for p in removed] == [f".checkpoint-4.tmp-{os.getpid()}"]
    assert (final / "f").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4"]
    # a copy left aside after the new one took the name is removed, the new one kept
    (tmp_path / ".checkpoint-4.old-77").mkdir()
    assert [p.name for p in remove_stale_temporaries(tmp_path)] == [".checkpoint-4.old-77"]
    assert (final / "f").read_text() == "new"


def test_a_checkpoint_limit_of_zero_or_less_keeps_every_checkpoint(tmp_path):
    from mtgrpo.trainer.checkpoint import rotate_checkpoints

    def checkpoints() -> list[str]:
        return sorted((p.name for p in tmp_path.iterdir()), key=lambda n: int(n.split("-")[1]))

    for step in (2, 4, 6):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    for limit in (None, 0, -1):  # transformers' rule: no deletion
        rotate_checkpoints(tmp_path, limit)
        assert checkpoints() == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    rotate_checkpoints(tmp_path, 2, keep=tmp_path / "checkpoint-2")  # the best one stays
    assert checkpoints() == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    rotate_checkpoints(tmp_path, 1)
    assert checkpoints() == ["checkpoint-6"]


def test_an_atomic_rewrite_keeps_the_mode_a_plain_write_gives(tmp_path):
    from mtgrpo._files import write_text_atomically

    plain, atomic = tmp_path / "plain.txt", tmp_path / "metrics.jsonl"
    plain.write_text("x")
    write_text_atomically(atomic, "x")  # mkstemp's 0600 would hide a rewound log from others
    assert (atomic.stat().st_mode & 0o777) == (plain.stat().st_mode & 0o777)
    old = os.umask(0o077)
    try:
        write_text_atomically(atomic, "y")
        assert atomic.stat().st_mode & 0o777 == 0o600  # the umask still applies
    finally:
        os.umask(old)


def test_a_resume_refused_by_the_sampler_loads_nothing(tiny_model_dir, tmp_path):
    import pytest
    import trainer_helpers as common

    from mtgrpo import GRPOTrainer

    def trainer(**options):
        return GRPOTrainer(str(tiny_model_dir), [common.alpha_reward, common.beta_reward],
                           args=common.args(tmp_path, max_steps=2, save_steps=2, **options),
                           train_dataset=common.rows())

    trainer(shuffle_dataset=True).train()
    other = trainer(shuffle_dataset=False)  # another prompt order: the sampler refuses it
    before = {n: p.detach().clone() for n, p in other.unwrapped.named_parameters()}
    with pytest.raises(ValueError, match="shuffle=True"):
        other._resume(True)
    assert other.step == 0
    for name, tensor in other.unwrapped.named_parameters():
        assert torch.equal(tensor, before[name]), name  # the checkpoint's weights not loaded
