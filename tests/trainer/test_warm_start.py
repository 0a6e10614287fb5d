"""The warm start of a run: problems apart from GRPO's, trained once per content and shared."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from mtgrpo.config import run_config_from_dict
from mtgrpo.reporting import read_metrics
from mtgrpo.tasks import GenerationError
from mtgrpo.tasks.families import FAMILIES
from mtgrpo.trainer.run import _warm_start_rows, build_suite, run_training
from mtgrpo.trainer.warm_start import link_run_directory, model_identity

TASKS = {"tasks": ["countdown:easy"], "train_size": 12, "eval_size": 6, "workers": 0,
         "prompt_format": "chat"}
REUSED = "reusing the warm start from"


def _question(row) -> str:
    return row["prompt"][-1]["content"]


def test_warm_start_problems_avoid_the_eval_and_training_splits(tmp_path):
    tasks = {**TASKS, "cache_dir": str(tmp_path / "cache")}
    run = run_config_from_dict({"tasks": tasks, "model": "unused"})
    with build_suite(tasks) as suite:
        warm = _warm_start_rows(run, suite, per_task=12, offset=7)
        train = {_question(r) for r in suite.train.rows()}
        evaluation = {_question(r) for r in suite.eval.rows()}
    questions = {_question(r) for r in warm}
    assert len(warm) == 12
    assert not questions & evaluation
    assert not questions & train


def _run_config(model, output_dir, tmp_path, **sft) -> dict:
    """One GRPO step after a two-step warm start."""
    return {
        "model": str(model), "output_dir": str(output_dir),
        "tasks": {**TASKS, "cache_dir": str(tmp_path / "cache")},
        "sft": {"num_examples": 8, "template": "answer_only", "max_steps": 2,
                "per_device_train_batch_size": 4, "learning_rate": 1e-3, **sft},
        "max_steps": 1, "num_generations": 2, "prompts_per_step": 2,
        "max_prompt_length": 300, "max_completion_length": 8, "save_steps": 0,
    }


def _weights(run_dir):
    return (run_dir / "sft" / "model" / "model.safetensors").resolve()


def test_runs_in_other_directories_reuse_one_warm_start(tmp_path, tiny_model_dir, caplog):
    caplog.set_level(logging.INFO, logger="mtgrpo.trainer.run")
    first, second = tmp_path / "q1", tmp_path / "q2"
    run_training(run_config_from_dict(_run_config(tiny_model_dir, first, tmp_path)))
    assert REUSED not in caplog.text
    # trained once into the shared cache, beside the task cache; the run directory links to it
    entry = (first / "sft").resolve()
    assert entry.parent == (tmp_path / "cache" / "warm-start").resolve()
    assert (first / "sft").is_symlink()
    trained_at = _weights(first).stat().st_mtime_ns
    marker = json.loads((first / "sft" / "warm_start.json").read_text())
    assert marker["trained_for"] == str(first.resolve())

    caplog.clear()
    run_training(run_config_from_dict(_run_config(tiny_model_dir, second, tmp_path)))
    assert f"{REUSED} {entry} (trained for {first.resolve()})" in caplog.text
    assert "sft.reuse: false" in caplog.text  # how to train a new one
    assert _weights(second) == _weights(first)
    assert _weights(second).stat().st_mtime_ns == trained_at  # not trained again
    assert read_metrics(second, split="train")[0]["step"] == 1

    # a setting that changes what it learns trains another one; the first stays
    caplog.clear()
    run_training(run_config_from_dict(_run_config(tiny_model_dir, second, tmp_path,
                                                  max_steps=3)))
    assert REUSED not in caplog.text
    assert _weights(second) != _weights(first)
    assert _weights(first).stat().st_mtime_ns == trained_at

    # sft.reuse: false trains the first settings' warm start anew, in place of the shared one
    caplog.clear()
    run_training(run_config_from_dict(_run_config(tiny_model_dir, second, tmp_path,
                                                  reuse=False)))
    assert REUSED not in caplog.text
    assert _weights(second) == _weights(first)
    assert _weights(first).stat().st_mtime_ns != trained_at


def test_the_base_model_is_known_by_its_contents(tmp_path, tiny_model_dir):
    # the quickstart builds its tiny model inside the run directory: another directory builds
    # the same bytes, which must find the same warm start; other weights must not
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    assert model_identity(str(copy)) == model_identity(str(tiny_model_dir))
    (copy / ".cache").mkdir()  # a hub download's bookkeeping is not the model
    (copy / ".cache" / "note").write_text("x")
    assert model_identity(str(copy)) == model_identity(str(tiny_model_dir))
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert model_identity(str(copy)) != model_identity(str(tiny_model_dir))
    assert model_identity("org/model", "v1") != model_identity("org/model", "v2")


def test_a_copied_run_directory_keeps_its_warm_start(tmp_path, tiny_model_dir, caplog):
    caplog.set_level(logging.INFO, logger="mtgrpo.trainer.run")
    config = _run_config(tiny_model_dir, tmp_path / "run", tmp_path)
    run_training(run_config_from_dict(config))
    # a copy that follows the link holds the warm start itself: it is reused from there, even
    # when the shared cache is gone (a new warm start would replace the sentinel's directory)
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "run", moved)
    assert not (moved / "sft").is_symlink()
    sentinel = moved / "sft" / "model" / "sentinel"
    sentinel.write_text("kept")
    shutil.rmtree(tmp_path / "cache" / "warm-start")
    caplog.clear()
    run_training(run_config_from_dict({**config, "output_dir": str(moved)}))
    assert f"{REUSED} {(moved / 'sft').resolve()}" in caplog.text
    assert sentinel.read_text() == "kept"
    # the original's link now points at nothing: its next run trains the warm start again
    caplog.clear()
    run_training(run_config_from_dict(config))
    assert REUSED not in caplog.text
    assert (tmp_path / "run" / "sft" / "model" / "config.json").is_file()


def test_an_earlier_warm_start_directory_of_the_run_is_moved_aside_not_deleted(tmp_path):
    # a run directory from before warm starts were shared holds a real sft/ directory: the
    # link to the shared entry takes its place, and what the user trained stays on disk
    entry, run = tmp_path / "cache" / "key", tmp_path / "run"
    (entry / "model").mkdir(parents=True)
    (run / "sft" / "model").mkdir(parents=True)
    (run / "sft" / "model" / "weights.bin").write_bytes(b"earlier")
    kept = link_run_directory(run / "sft", entry)
    assert (run / "sft").is_symlink()
    assert (run / "sft").resolve() == entry.resolve()
    assert kept is not None
    assert kept.parent == run
    assert kept.name.startswith("sft.previous-")
    assert (kept / "model" / "weights.bin").read_bytes() == b"earlier"
    assert link_run_directory(run / "sft", entry) is None  # already linked: nothing moves


def test_runs_asking_at_once_train_one_warm_start(tmp_path, monkeypatch):
    # a grid's parallel runs ask for the same warm start at once: one trains it, the other
    # waits for it and reuses it (before the lock, both trained into one directory)
    import threading
    import time

    import mtgrpo.sft
    from mtgrpo.trainer.run import _warm_start

    trained = []

    def slow_sft_train(model, tokenizer, pairs, config, peft_config=None):
        trained.append(threading.current_thread().name)
        time.sleep(0.5)  # long enough for the other run to arrive while this one trains
        (Path(config.output_dir) / "model").mkdir(parents=True)
        (Path(config.output_dir) / "model" / "config.json").write_text("{}")

    monkeypatch.setattr(mtgrpo.sft, "sft_train", slow_sft_train)
    runs = [run_config_from_dict(_run_config("unused-model", tmp_path / f"run{n}", tmp_path))
            for n in range(2)]
    results = {}
    with build_suite(runs[0].tasks) as suite:
        threads = [threading.Thread(target=lambda n=n: results.update({n: _warm_start(
            runs[n], "unused-model", suite)}), name=f"run-{n}") for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(trained) == 1
    # both runs returned (neither raised), each its own link to the one warm start
    assert results == {n: str(tmp_path / f"run{n}" / "sft" / "model") for n in range(2)}
    assert (tmp_path / "run0" / "sft").resolve() == (tmp_path / "run1" / "sft").resolve()


def test_a_problem_space_grpo_covers_fails_naming_the_task_and_fixes(tmp_path):
    # two ones and a target up to 2: two problems (1+1, 1*1), one in GRPO's evaluation split
    # and the other in its training split, so none is left for the warm start
    tiny = {"family": "countdown", "name": "countdown:tiny",
            "config": {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 1,
                       "min_target": 1, "max_target": 2}}
    tasks = {"tasks": [tiny], "train_size": 20, "eval_size": 1, "max_retries": 40,
             "workers": 0, "cache_dir": str(tmp_path / "cache")}
    run = run_config_from_dict({"tasks": tasks, "model": "unused"})
    with build_suite(tasks) as suite, \
            pytest.raises(GenerationError, match=r"the warm start found too few problems "
                          r"outside GRPO's training and evaluation splits \(20 and 1 per task\): "
                          r"countdown:tiny \(train\) position 0: .*\(800 in all\).*widen that "
                          r"task's config, lower tasks.train_size, or raise tasks.max_retries"):
        _warm_start_rows(run, suite, per_task=1, offset=1_000_003)


def test_a_seed_offset_inside_grpo_s_draws_is_refused_for_keyless_families(tmp_path):
    # zebra puzzles are kept apart from GRPO's by their seeds only: an offset GRPO's training
    # draws reach would repeat its problems
    tasks = {"tasks": ["zebra_puzzles:easy"], "train_size": 50, "eval_size": 2, "workers": 0,
             "cache_dir": str(tmp_path / "cache")}
    run = run_config_from_dict({"tasks": tasks, "model": "unused"})
    with build_suite(tasks) as suite, \
            pytest.raises(ValueError, match=r"sft.seed_offset=100 would let the warm start of "
                          r"zebra_puzzles:easy repeat GRPO's problems: .* 200 source indices"):
        _warm_start_rows(run, suite, per_task=4, offset=100)


def _identity(spec, row) -> str:
    """A problem's identity: its family's content key, else its question (zebra, ARC)."""
    metadata = json.loads(row["metadata"])
    key = spec.family.content_key
    return key(metadata) if key is not None else _question(row)


@pytest.mark.parametrize("family", [*FAMILIES.names(), "basic_arithmetic"])
def test_warm_start_and_validation_problems_are_new_to_grpo_in_every_family(tmp_path, family):
    # every built-in family, and a generic reasoning-gym one (one-digit addition: a small
    # space where GRPO's training problems are a large share of all)
    task = (f"{family}:easy" if family in FAMILIES else
            {"family": family, "name": "addition",
             "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                        "operators": ["+"]}})
    tasks = {"tasks": [task], "train_size": 40, "eval_size": 8, "validation_size": 8,
             "workers": 0, "prompt_format": "chat", "cache_dir": str(tmp_path / "cache")}
    run = run_config_from_dict({"tasks": tasks, "model": "unused", "sft": {"num_examples": 40}})
    with build_suite(tasks) as suite:
        spec = suite.tasks[0]
        warm = _warm_start_rows(run, suite, per_task=40, offset=run.sft.seed_offset)
        splits = {name: {_identity(spec, row) for row in suite.split(name).rows()}
                  for name in ("train", "eval", "validation")}
    problems = {_identity(spec, row) for row in warm}
    assert len(warm) == 40
    assert not problems & splits["train"]
    assert not problems & splits["eval"]
    assert not problems & splits["validation"]
    # the validation split is held out from GRPO's training and evaluation problems as well
    assert not splits["validation"] & (splits["train"] | splits["eval"])
