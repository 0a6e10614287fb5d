"""Errors that name the thing and the fix, before the expensive work (issue 38): an output
directory that cannot be written, a disk that fills during a save, damaged checkpoint files,
files that are not UTF-8 or not YAML, negative lengths, a routing entry for a task the data
does not have."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
import trainer_helpers as common

from mtgrpo import GRPOConfig, GRPOTrainer
from mtgrpo.config import load_run_config
from mtgrpo.rewards import RewardError
from mtgrpo.tasks.data import load_rows
from mtgrpo.trainer import checkpoint as ckpt


def _trainer(model, out, **overrides) -> GRPOTrainer:
    return GRPOTrainer(str(model), [common.alpha_reward, common.beta_reward],
                       args=common.args(out, **overrides), train_dataset=common.rows())


def test_an_output_dir_that_is_a_file_fails_before_the_model_loads(tmp_path) -> None:
    target = tmp_path / "a-file"
    target.write_text("x")
    with pytest.raises(NotADirectoryError, match=r"output_dir .*a-file.* is a file"):
        _trainer(tmp_path / "no-model-here", target)  # the model path is never read


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_output_dir_fails_before_the_model_loads(tmp_path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(PermissionError, match="cannot be written"):
        _trainer(tmp_path / "no-model-here", locked / "run")


def test_the_output_dir_check_sees_permissions(tmp_path, monkeypatch) -> None:
    # (as root the real check cannot fail: access is what the check asks the kernel)
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(tmp_path))
    with pytest.raises(PermissionError, match=r"is not writable by this user.*fix its"):
        ckpt.check_output_dir(tmp_path / "new" / "run")


def test_a_full_disk_during_a_save_names_the_path_and_the_space(tiny_model_dir, tmp_path,
                                                                monkeypatch) -> None:  # fmt: skip
    trainer = _trainer(tiny_model_dir, tmp_path, max_steps=2, save_steps=1)
    real_save = torch.save
    calls = {"n": 0}

    def fills_up(obj, path, *args, **kwargs):
        calls["n"] += 1
        if "checkpoint-2" in str(path):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", fills_up)
    with pytest.raises(OSError, match=r"writing .*checkpoint-2 failed: .*free in .*checkpoint "
                                      r"takes about .*checkpoint-1 is intact") as caught:
        trainer.train()
    assert caught.value.errno == errno.ENOSPC
    assert (tmp_path / "checkpoint-1" / "trainer_state.json").is_file()
    assert not list(tmp_path.glob(".checkpoint-2.tmp-*"))  # the half-written one is gone
    assert [r["step"] for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text()
                                  .splitlines()) if r.get("split") == "train"] == [1, 2]


@pytest.mark.parametrize("damaged", ["trainer_state.json", "trainable.safetensors",
                                     "optimizer.pt", "scheduler.pt", "rng_state_0.pt"])
def test_a_damaged_checkpoint_file_is_named_with_the_previous_one(tiny_model_dir, tmp_path,
                                                                  damaged) -> None:  # fmt: skip
    _trainer(tiny_model_dir, tmp_path, max_steps=2, save_steps=1).train()
    (tmp_path / "checkpoint-2" / damaged).write_bytes(b"\x00garbage{")
    resumed = _trainer(tiny_model_dir, tmp_path, max_steps=3, save_steps=1,
                       resume_from_checkpoint=True)  # fmt: skip
    with pytest.raises(ValueError, match=rf"checkpoint-2/{damaged} is damaged .*previous "
                                         r"complete checkpoint .*checkpoint-1"):
        resumed.train()


def test_dataset_and_run_files_that_are_not_text_or_not_yaml(tmp_path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_bytes(b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:2 is not UTF-8.*re-encode"):
        load_rows(str(data))
    run = tmp_path / "run.yaml"
    run.write_text("max_steps: 3\nlearning_rate: [1e-4\nbeta: 0.1\n")
    with pytest.raises(ValueError, match=r"run.yaml, line \d+, column \d+: not valid YAML"):
        load_run_config(run)


@pytest.mark.parametrize("value", [-3, 0])
def test_non_positive_prompt_lengths_are_refused(value) -> None:
    with pytest.raises(ValueError, match=f"max_prompt_length={value} must be a positive"):
        GRPOConfig(max_prompt_length=value)


def test_a_routing_entry_for_a_task_without_rows_is_refused(tmp_path) -> None:
    routes = {"alpha": [common.alpha_reward_routed], "beta": [common.beta_reward_routed],
              "gamma": [common.length_bonus]}  # fmt: skip
    with pytest.raises(RewardError, match=r"names task\(s\) \['gamma'\] that no row"):
        GRPOTrainer(str(tmp_path / "no-model-here"), routes, args=common.args(tmp_path),
                    train_dataset=common.rows())  # fmt: skip


def test_config_history_is_not_lost_by_a_run_that_starts_over(tiny_model_dir: Path,
                                                               tmp_path: Path) -> None:
    _trainer(tiny_model_dir, tmp_path, max_steps=1).train()
    history = (tmp_path / "config_history.jsonl").read_text().splitlines()
    assert [json.loads(line)["from_step"] for line in history] == [0]


def test_a_reward_function_s_missing_column_is_named_before_anything_runs(tmp_path) -> None:
    def echo_reward(prompts, completions, word, **kwargs):
        return [1.0] * len(completions)

    # the model path does not exist: the column check comes first
    with pytest.raises(RewardError, match=r"'echo_reward' needs the dataset column\(s\) "
                                          r"\['word'\].*columns: \['prompt', 'target', 'task'\]"):
        GRPOTrainer(str(tmp_path / "no-model-here"), echo_reward, args=common.args(tmp_path),
                    train_dataset=common.rows())  # fmt: skip
