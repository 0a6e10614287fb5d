"""Evaluating a trained run on a larger held-out split than its own: no problem it trained on.

A run's evaluation split is disjoint from its training problems by construction (the training
split replaces every problem of the evaluation split, the warm start avoids it too), but only
for the ``eval_size`` items the run was configured with. Past them, the same seed draws
problems the run may have trained on: in one-digit addition (45 distinct sums) nearly all.
"""

from __future__ import annotations

import json

import pytest

from mtgrpo.cli import main
from mtgrpo.config import run_config_from_dict
from mtgrpo.tasks import TaskSuite, problem_keys, resolve_task
from mtgrpo.trainer.run import held_out_suite, replaced_items, trained_problems

SMALL_COUNTDOWN = {"family": "countdown", "name": "countdown:small",
                   "config": {"min_numbers": 3, "max_numbers": 3, "min_value": 1, "max_value": 5,
                              "min_target": 1, "max_target": 60}}  # fmt: skip
ADDITION = {"family": "basic_arithmetic", "name": "addition:1d",
            "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                       "operators": ["+"], "allow_parentheses": False,
                       "allow_negation": False}}  # fmt: skip
TASKS = [SMALL_COUNTDOWN, ADDITION, "letter_counting"]
EVAL_SIZE = 10


def _run(tmp_path, sft: bool = True, **tasks):
    config = {"model": "unused", "output_dir": str(tmp_path / "run"),
              "tasks": {"tasks": TASKS, "train_size": 40, "eval_size": EVAL_SIZE, "workers": 0,
                        "cache_dir": str(tmp_path / "cache"), **tasks}}  # fmt: skip
    if sft:
        config["sft"] = {"num_examples": 20}
    return run_config_from_dict(config)


def _keys(task, rows):
    spec = resolve_task(next(t for t in TASKS if (t if isinstance(t, str) else t["name"]) == task))
    return problem_keys(spec, [row for row in rows if row["task"] == task])


def _metadata(row):
    return json.loads(row["metadata"])


def test_trained_problems_are_the_training_split_and_the_warm_start(tmp_path):
    run = _run(tmp_path)
    rows = trained_problems(run)
    with run.tasks.build_suite() as suite:
        training = suite.train.rows()
    assert [row for row in rows if row["split"] == "train" and row in training] == training
    assert len(rows) == 3 * 40 + 3 * 20  # every task is content-keyed; 20 warm-start problems
    warm = [row for row in rows if row not in training]
    assert {_metadata(row)["seed"] for row in warm} == {run.tasks.seed + run.sft.seed_offset}
    assert len(trained_problems(_run(tmp_path, sft=False))) == 3 * 40
    assert {row["task"] for row in trained_problems(run, ["addition:1d"])} == {"addition:1d"}


def test_the_runs_own_split_is_returned_as_it_was_trained(tmp_path):
    run = _run(tmp_path)
    told = []
    with run.tasks.build_suite() as trained, held_out_suite(run, progress=told.append) as own:
        assert own.exclude_eval_rows == []  # nothing to find: disjoint by construction
        assert told == []
        assert own.eval.rows() == trained.eval.rows()
    with held_out_suite(run, eval_size=EVAL_SIZE - 4) as smaller:
        assert smaller.exclude_eval_rows == []


def test_a_larger_split_replaces_exactly_the_trained_problems(tmp_path):
    run = _run(tmp_path)
    seen = trained_problems(run)
    with run.tasks.build_suite(train_size=1) as own:
        first = own.eval.rows()
    with run.tasks.build_suite(train_size=1, eval_size=60) as plain:  # what eval-size 60 drew
        unfiltered = plain.eval.rows()
    told = []
    with held_out_suite(run, eval_size=60, progress=told.append) as larger:
        rows = larger.eval.rows()
    assert told == ["a held-out split of 60 problems per task, seed 0 (the run's own: 10, seed "
                    "0): leaving out the problems the run trains on (40 per task and 20 of the "
                    "warm start; from the task cache, or generated now)"]
    replaced = replaced_items(rows)
    for task in ("countdown:small", "addition:1d", "letter_counting"):
        mine = [row for row in rows if row["task"] == task]
        before = [row for row in unfiltered if row["task"] == task]
        assert len(mine) == 60
        assert not _keys(task, mine) & _keys(task, seen), task
        # the first EVAL_SIZE items are the run's own split, unchanged
        assert mine[:EVAL_SIZE] == [row for row in first if row["task"] == task]
        # a position moves to another source index exactly where the unfiltered split held a
        # trained problem; every other position keeps its item
        trained_keys = _keys(task, seen)
        moved = [position for position, row in enumerate(before)
                 if _keys(task, [row]) & trained_keys]  # fmt: skip
        assert replaced[task] == len(moved)
        for position, (new, old) in enumerate(zip(mine, before, strict=True)):
            if position in moved:
                assert _metadata(new)["source_index"] % 60 == position
                assert _metadata(new)["source_index"] > position
            else:
                assert new == old
    # one-digit sums repeat: most of the 50 past the run's own were trained on
    assert replaced["addition:1d"] >= 10
    assert replaced["countdown:small"] >= 1


def test_another_seed_is_checked_too_and_some_tasks_can_be_picked(tmp_path):
    run = _run(tmp_path)
    with held_out_suite(run, ["addition:1d"], seed=3) as reseeded:
        assert reseeded.task_ids == ["addition:1d"]
        rows = reseeded.eval.rows()
        assert len(rows) == EVAL_SIZE
        assert not _keys("addition:1d", rows) & _keys("addition:1d", trained_problems(run))
    with pytest.raises(ValueError, match=r"countdown:easy is not a task of this config; its "
                       r"tasks are countdown:small, addition:1d, letter_counting"):
        held_out_suite(run, ["countdown:easy"])
    with pytest.raises(ValueError, match="no tasks section"):
        held_out_suite(run_config_from_dict({"model": "unused", "data": {"train": "x.jsonl"},
                                             "rewards": ["length_reward"]}))


def test_the_suite_replaces_evaluation_items_passed_as_exclude_eval(tmp_path):
    options = {"train_size": 1, "eval_size": 30, "workers": 0, "cache_dir": str(tmp_path)}
    with TaskSuite([ADDITION], **options) as plain:
        before = plain.eval.rows()
    banned = before[3:5] + before[20:21]
    with TaskSuite([ADDITION], exclude_eval=banned, max_retries=10, **options) as suite:
        after = suite.eval.rows()
    banned_keys = _keys("addition:1d", banned)
    assert not _keys("addition:1d", after) & banned_keys
    assert replaced_items(after)["addition:1d"] == sum(
        bool(_keys("addition:1d", [row]) & banned_keys) for row in before)
    assert replaced_items(before) == {"addition:1d": 0}


def test_mtgrpo_eval_config_with_a_larger_split(tmp_path, tiny_model_dir, capsys):
    import yaml

    config = {"model": {"name_or_path": str(tiny_model_dir)}, "output_dir": str(tmp_path / "r"),
              "tasks": {"tasks": TASKS, "train_size": 40, "eval_size": EVAL_SIZE, "workers": 0,
                        "cache_dir": str(tmp_path / "cache")},
              "max_completion_length": 4}  # fmt: skip
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(tiny_model_dir), "--config", str(path), "--tasks",
                 "addition:1d", "--eval-size", "40", "--num-samples", "1",
                 "--out", str(out)]) == 0  # fmt: skip
    captured = capsys.readouterr()
    printed = captured.out
    assert "leaving out the problems the run trains on (40 per task;" in captured.err
    result = json.loads((out / "results.json").read_text())
    with held_out_suite(_run(tmp_path, sft=False), ["addition:1d"], eval_size=40) as suite:
        expected = replaced_items(suite.eval.rows())
    assert result["replaced_problems"] == expected
    assert expected["addition:1d"] > 0
    assert f"addition:1d: {expected['addition:1d']} of 40 held-out problems replaced" in printed
    assert list(result["tasks"]) == ["addition:1d"]
    assert result["tasks"]["addition:1d"]["prompts"] == 40


def test_sibling_tasks_of_one_family_are_left_out_too(tmp_path):
    """Problems are matched by family: a task's larger split (alone, or the run's own split of
    a run with two tasks of one family) holds no problem of its sibling's training split."""
    plus = {**ADDITION, "name": "plus"}
    both = {**ADDITION, "name": "both", "config": {**ADDITION["config"],
                                                   "operators": ["+", "-"]}}
    config = {"model": "unused", "tasks": {"tasks": [plus, both], "train_size": 40,
                                           "eval_size": EVAL_SIZE, "workers": 0,
                                           "cache_dir": str(tmp_path / "cache")}}
    run = run_config_from_dict(config)
    spec = resolve_task(plus)
    seen = problem_keys(spec, trained_problems(run))  # both tasks' training problems
    for kwargs in ({"eval_size": 30}, {}):
        with held_out_suite(run, ["plus"], **kwargs) as suite:
            rows = suite.eval.rows()
        assert not problem_keys(spec, rows) & seen, kwargs
    with run.tasks.build_suite() as trained:  # the overlap this guards against exists
        plus_eval = [row for row in trained.eval.rows() if row["task"] == "plus"]
        sibling = [row for row in trained.train.rows() if row["task"] == "both"]
    with run.tasks.build_suite(train_size=1, eval_size=30) as larger:
        plus_larger = [row for row in larger.eval.rows() if row["task"] == "plus"]
    assert problem_keys(spec, plus_eval + plus_larger) & problem_keys(spec, sibling)
