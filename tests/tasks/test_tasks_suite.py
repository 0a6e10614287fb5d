"""Task suites: deterministic disjoint splits, the disk cache, lazy generation, time limits."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import reasoning_gym

from mtgrpo.tasks.cache import CACHE_ENV, CHUNK_SIZE
from mtgrpo.tasks.families import TaskFamily, TaskSpec, resolve_task
from mtgrpo.tasks.generation import GenerationPool, PoolClosedError
from mtgrpo.tasks.prompts import AnswerFormat
from mtgrpo.tasks.suite import (
    SPLIT_SEED_STRIDE,
    SUITES,
    GenerationError,
    TaskSuite,
    make_suite,
    measure_generation,
    split_seed,
)


@pytest.fixture(autouse=True)
def cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    return cache


# A toy family whose items are cheap and fully predictable: item i of seed s has the value
# s + i; its problem identity (content key) is the value modulo config["mod"]. Config keys
# "delay" (seconds per item), "hang" and "fail" (source indices that sleep forever / raise)
# exercise the pool. Module-level, so worker processes can import it by name.
def toy_item(dataset: str, config: Mapping[str, Any], seed: int, size: int, index: int) -> dict:
    if index in config.get("hang", ()):
        time.sleep(3600)
    if index in config.get("fail", ()):
        raise ValueError(f"no item at {index}")
    time.sleep(config.get("delay", 0.0))
    if config.get("chatty"):
        print(f"generating item {index}")  # must not corrupt the worker protocol
    value = seed + index
    residue = value % config.get("mod", 10**12)
    return {"question": f"v{value}", "answer": str(value), "metadata": {"residue": residue}}


def toy_question(item: Mapping[str, Any], answer_format: AnswerFormat) -> str:
    return f"{item['question']}; answer {answer_format.where}"


def toy_check(extracted: str, gold: str, metadata: Mapping[str, Any]) -> bool:
    return extracted == gold


def toy_key(metadata: Mapping[str, Any]) -> str:
    return str(metadata["residue"])


TOY = TaskFamily(
    name="toy",
    dataset="toy",
    generate=toy_item,
    question=toy_question,
    check=toy_check,
    content_key=toy_key,
)


def toy(**config: Any) -> TaskSpec:
    return TaskSpec(task_id="toy", family=TOY, level=None, config=config)


def _values(rows: list[dict]) -> list[int]:
    return [int(row["answer"]) for row in rows]


# ------------------------------------------------------------------------------- seeds


def test_split_seeds() -> None:
    assert split_seed(7, "train") == 7
    assert split_seed(7, "eval") == 7 + SPLIT_SEED_STRIDE
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 1000000000\).*absolute"):
        split_seed(-1, "train")
    with pytest.raises(ValueError, match=r"unknown split 'test'; valid splits: train, eval"):
        split_seed(0, "test")


def test_reasoning_gym_adjacent_seeds_overlap() -> None:
    # The reason for split seeds: reasoning-gym seeds item i with seed + i.
    seven = reasoning_gym.create_dataset("arc_1d", seed=7, size=3, min_size=10, max_size=10)
    eight = reasoning_gym.create_dataset("arc_1d", seed=8, size=3, min_size=10, max_size=10)
    assert seven[1]["question"] == eight[0]["question"]


@pytest.mark.parametrize("task", ["arc_1d:easy", "countdown:easy"])
def test_train_and_eval_share_no_prompt_for_adjacent_seeds(task: str) -> None:
    prompts = {}
    for seed in (7, 8):
        with TaskSuite([task], seed=seed, train_size=60, eval_size=30, workers=0) as suite:
            prompts[seed, "train"] = {row["prompt"] for row in suite.train.rows()}
            prompts[seed, "eval"] = {row["prompt"] for row in suite.eval.rows()}
    for train_seed in (7, 8):
        for eval_seed in (7, 8):
            assert not prompts[train_seed, "train"] & prompts[eval_seed, "eval"]
    # adjacent base seeds share training items (shifted by one), as reasoning-gym implies
    assert len(prompts[7, "train"] & prompts[8, "train"]) == 59


def test_eval_problems_are_removed_from_train_by_content() -> None:
    # mod 50: eval values are 1e9 + 0..4, residues 0..4 (1e9 = 0 mod 50). Train positions
    # 0..4 (values 0..4) repeat those problems and move to source indices 20..24.
    with TaskSuite([toy(mod=50)], train_size=20, eval_size=5, workers=0) as suite:
        assert [int(r["answer"]) % 50 for r in suite.eval.rows()] == [0, 1, 2, 3, 4]
        train = suite.train.task("toy")
        assert _values(train.rows()) == [20, 21, 22, 23, 24, *range(5, 20)]
        assert [(s.position, s.source_index) for s in train.stats.skipped] == [
            (p, p) for p in range(5)
        ]
        assert "duplicates a problem" in train.stats.skipped[0].reason


def test_validation_split_is_held_out_from_eval_and_train_by_content() -> None:
    # mod 50: eval residues 0..4; validation values 2e9 + 0..7 (2e9 = 0 mod 50) repeat eval's
    # 0..4 at positions 0..4, which move to source indices 8..12; training then leaves out
    # residues 0..12, so its positions 0..12 move to 20..32
    with TaskSuite([toy(mod=50)], train_size=20, eval_size=5, validation_size=8,
                   workers=0) as suite:
        assert suite.validation is suite.split("validation")
        validation = suite.validation.rows()
        assert _values(validation) == [2 * SPLIT_SEED_STRIDE + v
                                       for v in (8, 9, 10, 11, 12, 5, 6, 7)]
        assert {row["split"] for row in validation} == {"validation"}
        assert validation[0]["id"] == f"toy/validation/s{2 * SPLIT_SEED_STRIDE}/0"
        assert _values(suite.train.rows()) == [*range(20, 33), *range(13, 20)]


def test_without_a_validation_split_training_is_unchanged() -> None:
    with TaskSuite([toy(mod=50)], train_size=20, eval_size=5, workers=0) as suite:
        assert suite.validation is None
        with pytest.raises(ValueError, match=r"no validation split; set validation_size"):
            suite.split("validation")
        assert _values(suite.train.rows()) == [20, 21, 22, 23, 24, *range(5, 20)]
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match=r"validation_size must be a positive integer or "
                           r"0 \(no validation split\)"):
            TaskSuite([toy()], validation_size=bad)


def test_validation_split_of_keyless_families_is_apart_by_seed() -> None:
    with TaskSuite(["arc_1d:easy"], train_size=30, eval_size=10, validation_size=10,
                   workers=0, use_cache=False) as suite:
        prompts = {name: {row["prompt"] for row in suite.split(name).rows()}
                   for name in ("train", "eval", "validation")}
    assert len(prompts["validation"]) == 10
    assert not prompts["validation"] & (prompts["train"] | prompts["eval"])


def test_excluded_rows_are_removed_from_train() -> None:
    with TaskSuite(["countdown:easy"], train_size=4, eval_size=2, workers=0) as suite:
        first = suite.train.get(0)
    exclude = [{"task": "anything", "metadata": first["metadata"]}]
    with TaskSuite(
        ["countdown:easy"], train_size=4, eval_size=2, workers=0, exclude=exclude
    ) as suite:
        replaced = suite.train.get(0)
        assert json.loads(replaced["metadata"])["source_index"] == 4  # position 0 + size 4
        assert replaced["prompt"] != first["prompt"]
        assert suite.train.get(1) == suite.train.get(1)


# ------------------------------------------------------------------------ determinism


def test_same_seed_same_items_in_process_and_in_worker_processes() -> None:
    tasks = ["countdown:medium", "zebra_puzzles:easy", "arc_1d:hard"]
    with TaskSuite(tasks, seed=3, train_size=3, eval_size=2, workers=0, use_cache=False) as inline:
        expected = inline.train.rows() + inline.eval.rows()
    with TaskSuite(tasks, seed=3, train_size=3, eval_size=2, workers=2, use_cache=False) as pooled:
        assert pooled.train.rows() + pooled.eval.rows() == expected
    with TaskSuite(tasks, seed=4, train_size=3, eval_size=2, workers=0, use_cache=False) as other:
        assert other.train.rows()[0] != expected[0]


def rows_digest() -> str:
    tasks = ["countdown:medium", "zebra_puzzles:easy", "arc_1d:hard"]
    with TaskSuite(tasks, seed=3, train_size=3, eval_size=2, workers=0, use_cache=False) as suite:
        rows = suite.train.rows() + suite.eval.rows()
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def test_same_items_under_another_hash_seed() -> None:
    # String hashing is randomised per process; generation must not depend on it.
    script = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "import test_tasks_suite; print(test_tasks_suite.rows_digest())"
    )
    environment = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == rows_digest()


def test_unpicklable_generator_is_a_type_error() -> None:
    with GenerationPool(1) as pool:
        error = pool.submit(lambda: 1).exception(timeout=60)
    assert isinstance(error, TypeError)
    assert "module-level functions" in str(error)


# ------------------------------------------------------------------------------ cache


def test_second_build_reads_the_cache(cache_env: Path) -> None:
    size = CHUNK_SIZE + 6  # two chunks, the second one partial
    with TaskSuite(["arc_1d:easy"], train_size=size, eval_size=2, workers=0) as first:
        rows = first.train.rows()
        data = first.train.task("arc_1d:easy")
        assert (data.stats.generated, data.stats.loaded) == (size, 0)
    with TaskSuite(["arc_1d:easy"], train_size=size, eval_size=2, workers=0) as second:
        assert second.train.rows() == rows
        stats = second.train.task("arc_1d:easy").stats
        assert (stats.generated, stats.loaded) == (0, size)
    assert data.cache is not None
    assert data.cache.path.parent.parent == cache_env
    chunks = sorted(p.name for p in data.cache.path.glob("chunk-*"))
    assert chunks == ["chunk-000000000.jsonl", "chunk-000000064.jsonl"]
    assert not list(cache_env.rglob("*.tmp"))


def test_cache_is_keyed_by_level_seed_size_and_prompt_format_is_not(tmp_path: Path) -> None:
    def directory(**options: Any) -> Path:
        task = options.pop("task", "arc_1d:easy")
        with TaskSuite([task], eval_size=2, workers=0, cache_dir=str(tmp_path), **options) as suite:
            data = suite.train.task(suite.task_ids[0])
            data.rows()
            assert data.cache is not None
            return data.cache.path

    base = directory(train_size=3, seed=0)
    assert base.parent == tmp_path / "arc_1d"
    assert directory(train_size=3, seed=0, task="arc_1d:medium") != base
    assert directory(train_size=3, seed=1) != base
    assert directory(train_size=4, seed=0) != base
    assert directory(train_size=3, seed=0, prompt_format="chat") == base
    meta = json.loads((base / "meta.json").read_text())
    assert (meta["level"], meta["seed"], meta["size"]) == ("easy", 0, 3)


def test_corrupt_chunk_is_regenerated(cache_env: Path) -> None:
    with TaskSuite(["arc_1d:easy"], train_size=3, eval_size=1, workers=0) as suite:
        rows = suite.train.rows()
        path = suite.train.task("arc_1d:easy").cache.chunk_path(0)
    path.write_text('{"position": 0}\n')
    with TaskSuite(["arc_1d:easy"], train_size=3, eval_size=1, workers=0) as suite:
        assert suite.train.rows() == rows
        assert suite.train.task("arc_1d:easy").stats.generated == 3
    assert len(path.read_text().splitlines()) == 3


def test_use_cache_false_writes_nothing(cache_env: Path) -> None:
    with TaskSuite(["arc_1d:easy"], train_size=3, eval_size=1, workers=0, use_cache=False) as suite:
        suite.train.rows()
    assert not cache_env.exists()


# ---------------------------------------------------------------------- laziness, pool


def test_lazy_split_serves_items_before_the_rest_is_generated() -> None:
    # 40 items at 0.25 s on 2 workers need ~5 s; item 0 and (promoted) item 39 must not wait.
    with TaskSuite([toy(delay=0.25)], train_size=40, eval_size=1, workers=2) as suite:
        split = suite.train
        assert len(split) == 40  # known before any item exists
        assert split.ready_count == 0
        split.start()
        first = split.get(0)
        last = split.get(39)
        assert not split.done
        assert split.ready_count < 30
        assert (first["answer"], last["answer"]) == ("0", "39")


def test_timed_out_and_failing_items_are_replaced_deterministically() -> None:
    spec = toy(hang=[3], fail=[5], chatty=True)
    with TaskSuite([spec], train_size=8, eval_size=1, workers=2, item_timeout_s=1.5) as suite:
        rows = suite.train.rows()
        skipped = suite.train.task("toy").stats.skipped
    # position 3 -> source 3 + 8 = 11, position 5 -> source 13 (rule p + r * size)
    assert _values(rows) == [0, 1, 2, 11, 4, 13, 6, 7]
    reasons = {s.position: s.reason for s in skipped}
    assert "longer than 1.5 s" in reasons[3]
    assert "ValueError: no item at 5" in reasons[5]
    assert [json.loads(r["metadata"])["source_index"] for r in rows][3] == 11


def test_position_fails_when_every_source_index_is_rejected() -> None:
    with TaskSuite(
        [toy(fail=[1, 4])], train_size=3, eval_size=1, workers=0, max_retries=1
    ) as suite:
        assert suite.train.get(0)["answer"] == "0"
        with pytest.raises(
            GenerationError, match=r"toy \(train\) position 1: .*\[1, 4\].*no item at 4"
        ):
            suite.train.get(1)


def test_thousands_of_in_process_replacements_fill_a_position() -> None:
    # without workers an attempt settles inside submit: the retries must not nest on the stack
    # (chained, 2,000 of them raised RecursionError). Position 1 draws 1, 3, ..., 4001.
    for last in (4001, 4003):
        spec = toy(fail=list(range(1, last, 2)))
        with TaskSuite([spec], train_size=2, eval_size=1, workers=0, max_retries=2000,
                       use_cache=False) as suite:
            if last == 4001:  # accepted at the last index allowed
                assert suite.train.get(1)["answer"] == "4001"
                continue
            with pytest.raises(GenerationError, match=r"position 1: every allowed source index "
                               r"\[1, 3, \.\.\., 4001\] \(2001 in all\) was rejected"):
                suite.train.get(1)


def test_a_problem_space_too_small_for_the_splits_names_the_fix() -> None:
    """37 distinct problems (one animal, one of it) cannot fill a training split that must
    avoid a 30-problem evaluation split: the error says so instead of only "raise max_retries"."""
    tiny = {"family": "leg_counting", "name": "legs:1x1",
            "config": {"min_animals": 1, "max_animals": 1, "max_instances": 1}}  # fmt: skip
    fix = (r"legs:1x1 \(train\) position \d+: .*duplicates a problem.*too few distinct problems "
           r"for 40 beside the \d+ excluded: widen the config, lower train_size")
    with (TaskSuite([tiny], train_size=40, eval_size=30, workers=0, use_cache=False) as suite,
          pytest.raises(GenerationError, match=fix)):
        suite.train.rows()


def test_closed_suite_keeps_generated_items_and_refuses_new_ones() -> None:
    suite = TaskSuite([toy()], train_size=5, eval_size=1, workers=0, use_cache=False)
    row = suite.train.get(0)
    suite.close()
    assert suite.train.get(0) == row
    with pytest.raises(PoolClosedError, match="closed"):
        suite.train.get(1)


# ------------------------------------------------------------------- splits and suites


def test_split_concatenates_tasks_and_maps_prompts_to_tasks() -> None:
    with TaskSuite(
        ["arc_1d:easy", "countdown:easy"], train_size=3, eval_size=2, workers=0
    ) as suite:
        split = suite.train
        assert len(split) == 6
        assert split.prompt_tasks.tolist() == [0, 0, 0, 1, 1, 1]
        assert [row["task"] for row in split] == ["arc_1d:easy"] * 3 + ["countdown:easy"] * 3
        data, position = split.locate(4)
        assert (data.task_id, position) == ("countdown:easy", 1)
        row = split[4]
        assert row["id"] == "countdown:easy/train/s0/1"
        assert set(row) == {"id", "task", "prompt", "answer", "metadata", "split"}
        metadata = json.loads(row["metadata"])
        assert {
            "family",
            "level",
            "answer_format",
            "seed",
            "source_index",
            "numbers",
            "target",
        } <= set(metadata)
        assert suite.eval[0]["split"] == "eval"
        with pytest.raises(IndexError, match="out of range"):
            split.get(6)


def test_suite_argument_errors() -> None:
    with pytest.raises(ValueError, match=r"duplicate task ids \['arc_1d:easy'\]"):
        TaskSuite(["arc_1d:easy", "arc:easy"])
    with pytest.raises(ValueError, match="train_size must be a positive integer"):
        TaskSuite(["arc_1d:easy"], train_size=0)
    with pytest.raises(ValueError, match="needs 2000000000 source indices"):
        TaskSuite(["arc_1d:easy"], train_size=500_000_000, max_retries=3)
    with pytest.raises(ValueError, match="non-empty list"):
        TaskSuite("arc_1d:easy")
    with pytest.raises(ValueError, match="unknown answer format 'xml'"):
        TaskSuite(["arc_1d:easy"], answer_format="xml")


def test_named_suites() -> None:
    assert SUITES.get("mtgrpo3") == ("countdown:medium", "zebra_puzzles:medium", "arc_1d:medium")
    assert len(SUITES.get("mtgrpo9")) == 9
    assert {resolve_task(t).level for t in SUITES.get("mtgrpo9")} == {"easy", "medium", "hard"}
    with make_suite("mtgrpo9", workers=0) as suite:
        assert suite.task_ids[:3] == ["countdown:easy", "countdown:medium", "countdown:hard"]
        assert set(suite.reward_routing) == set(suite.task_ids)
        assert len(suite.reward_functions) == 3
    with make_suite("arc_1d:easy", workers=0) as suite:
        assert suite.task_ids == ["arc_1d:easy"]


def test_measure_generation_reports_a_rate() -> None:
    rate = measure_generation("arc_1d:easy", items=20)
    assert rate.items == 20
    assert rate.items_per_s > 0
