"""The warm start of a run: problems other than GRPO's, none of the evaluation split's."""

from __future__ import annotations

import json
import shutil

from mtgrpo.config import run_config_from_dict
from mtgrpo.reporting import read_metrics
from mtgrpo.trainer.run import _warm_start_rows, build_suite, run_training

TASKS = {"tasks": ["countdown:easy"], "train_size": 12, "eval_size": 6, "workers": 0,
         "prompt_format": "chat"}


def _question(row) -> str:
    return row["prompt"][-1]["content"]


def test_warm_start_problems_avoid_the_eval_split(tmp_path):
    tasks = {**TASKS, "cache_dir": str(tmp_path / "cache")}
    run = run_config_from_dict({"tasks": tasks, "model": "unused"})
    with build_suite(tasks) as suite:
        warm = _warm_start_rows(run, suite, per_task=12, offset=7)
        train = {_question(r) for r in suite.train.rows()}
        evaluation = {_question(r) for r in suite.eval.rows()}
    questions = {_question(r) for r in warm}
    assert len(warm) == 12
    assert not questions & evaluation
    assert questions != train  # another seed: mostly other problems


def _run_config(model, output_dir, tmp_path) -> dict:
    """One GRPO step after a two-step warm start."""
    return {
        "model": str(model), "output_dir": str(output_dir),
        "tasks": {**TASKS, "cache_dir": str(tmp_path / "cache")},
        "sft": {"num_examples": 8, "template": "answer_only", "max_steps": 2,
                "per_device_train_batch_size": 4, "learning_rate": 1e-3},
        "max_steps": 1, "num_generations": 2, "prompts_per_step": 2,
        "max_prompt_length": 300, "max_completion_length": 8, "save_steps": 0,
    }


def test_a_run_with_a_warm_start_trains_from_it_and_reuses_it(tmp_path, tiny_model_dir):
    config = _run_config(tiny_model_dir, tmp_path / "run", tmp_path)
    run_training(run_config_from_dict(config))
    marker = tmp_path / "run" / "sft" / "warm_start.json"
    first = marker.stat().st_mtime_ns
    assert (tmp_path / "run" / "sft" / "model" / "config.json").is_file()
    run_training(run_config_from_dict(config))
    assert marker.stat().st_mtime_ns == first  # the cached warm start was reused
    assert read_metrics(tmp_path / "run", split="train")[0]["step"] == 1
    assert "output_dir" not in json.loads(marker.read_text())["config"]

    # a run directory copied elsewhere finds its warm start: it is not trained again (a new
    # warm start would clear the model directory, and the sentinel with it), also when the
    # marker was written with the directory in it
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "run", moved)
    sentinel = moved / "sft" / "model" / "sentinel"
    sentinel.write_text("kept")
    old_style = json.loads(marker.read_text())
    old_style["config"]["output_dir"] = str(tmp_path / "run" / "sft")
    (moved / "sft" / "warm_start.json").write_text(json.dumps(old_style))
    run_training(run_config_from_dict({**config, "output_dir": str(moved)}))
    assert sentinel.read_text() == "kept"
    # other settings do train it again
    sft = {**config["sft"], "learning_rate": 5e-4}
    run_training(run_config_from_dict({**config, "output_dir": str(moved), "sft": sft}))
    assert not sentinel.exists()
    assert json.loads((moved / "sft" / "warm_start.json").read_text())["config"] != \
        old_style["config"]


def test_a_base_model_built_inside_the_run_directory_moves_with_it(tmp_path, tiny_model_dir):
    # the quickstart and the grid build their tiny model inside the run directory: a copy of
    # that directory, its base model included, reuses the warm start; a base model elsewhere
    # is still one of its settings
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_model_dir, run_dir / "base-model")
    config = _run_config(run_dir / "base-model", run_dir, tmp_path)
    run_training(run_config_from_dict(config))
    marker = json.loads((run_dir / "sft" / "warm_start.json").read_text())
    assert marker["model"] == "{output_dir}/base-model"

    moved = tmp_path / "moved"
    shutil.copytree(run_dir, moved)
    sentinel = moved / "sft" / "model" / "sentinel"
    sentinel.write_text("kept")
    moved_config = {**config, "model": str(moved / "base-model"), "output_dir": str(moved)}
    run_training(run_config_from_dict(moved_config))
    assert sentinel.read_text() == "kept"

    # the same weights under another name outside the run directory: trained again
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(tiny_model_dir, elsewhere)
    run_training(run_config_from_dict({**moved_config, "model": str(elsewhere)}))
    assert not sentinel.exists()
    assert json.loads((moved / "sft" / "warm_start.json").read_text())["model"] == \
        str(elsewhere)


def test_runs_sharing_a_directory_train_its_warm_start_once(tmp_path, monkeypatch):
    # a grid's parallel runs ask for the same warm start at once: one trains it, the other
    # waits for it and reuses it (before the lock, both trained into one directory)
    import threading
    import time
    from types import SimpleNamespace

    import mtgrpo.sft
    from mtgrpo.trainer.run import _warm_start

    trained = []

    def slow_sft_train(model, tokenizer, pairs, config, peft_config=None):
        trained.append(threading.current_thread().name)
        time.sleep(0.5)  # long enough for the other run to arrive while this one trains
        (tmp_path / "run" / "sft" / "model").mkdir(parents=True, exist_ok=True)
        return SimpleNamespace(model_dir=tmp_path / "run" / "sft" / "model")

    monkeypatch.setattr(mtgrpo.sft, "sft_train", slow_sft_train)
    config = _run_config("unused-model", tmp_path / "run", tmp_path)
    run = run_config_from_dict(config)
    results = {}
    with build_suite(config["tasks"]) as suite:
        threads = [threading.Thread(target=lambda n=n: results.update({n: _warm_start(
            run, "unused-model", suite)}), name=f"run-{n}") for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(trained) == 1
    model_dir = str(tmp_path / "run" / "sft" / "model")
    assert results == {0: model_dir, 1: model_dir}  # both runs returned (neither raised)
