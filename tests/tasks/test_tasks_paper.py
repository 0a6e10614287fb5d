"""The papers' released test sets: loading, task mapping, scoring with our verifiers, guard."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mtgrpo.tasks.families import countdown_key
from mtgrpo.tasks.paper import (
    PAPER_TASK_IDS,
    ensure_trainable,
    is_paper_test_source,
    load_paper_test_sets,
    paper_task_id,
)
from mtgrpo.tasks.rewards import task_reward
from mtgrpo.tasks.suite import TaskSuite
from paper_release import PAPER_DIR, needs_paper_data


def _raw(data_source: str, content: str, truth: dict, index: int) -> dict:
    return {
        "data_source": data_source,
        "prompt": [{"content": content, "role": "user"}],
        "ability": "math",
        "reward_model": {"ground_truth": truth, "style": "rule"},
        "extra_info": {"difficulty": 1, "index": index, "question": content, "split": "test"},
    }


@pytest.fixture
def small_release(tmp_path: Path) -> Path:
    """Two tiny files in the released (verl) layout."""
    countdown = [
        _raw(
            "countdown-easy-test",
            "numbers [8, 73, 96] -> 841",
            {"numbers": "8,73,96", "target": 841},
            0,
        ),
        _raw(
            "countdown-hard-test",
            "numbers [1, 2, 3, 4, 5] -> 120",
            {"numbers": "1,2,3,4,5", "target": 120},
            1,
        ),
    ]
    zebra = [_raw("zebra-medium-test", "who?", {"target": "alice"}, 2)]
    pq.write_table(pa.Table.from_pylist(countdown), tmp_path / "test_countdown.parquet")
    pq.write_table(pa.Table.from_pylist(zebra), tmp_path / "test_zebra.parquet")
    return tmp_path


def _score(row: dict, completion: str) -> float | None:
    family = json.loads(row["metadata"])["family"]
    reward = task_reward(family)  # default <answer> tags; the rows say "boxed"
    return reward(
        [row["prompt"]],
        [completion],
        answer=[row["answer"]],
        metadata=[row["metadata"]],
        task=[row["task"]],
    )[0]


def test_data_sources_map_to_task_ids() -> None:
    assert paper_task_id("countdown-medium-test") == "countdown:medium"
    assert paper_task_id("zebra-very_hard-test") == "zebra_puzzles:very_hard"
    assert paper_task_id("arc-easy-test") == "arc_1d:easy"
    assert len(PAPER_TASK_IDS) == 12
    with pytest.raises(ValueError, match="unknown paper data_source 'arc-expert-test'"):
        paper_task_id("arc-expert-test")


def test_small_release_converts_to_our_rows(small_release: Path) -> None:
    rows = load_paper_test_sets(small_release)
    assert [row["task"] for row in rows] == [
        "countdown:easy",
        "countdown:hard",
        "zebra_puzzles:medium",
    ]
    first = rows[0]
    assert set(first) == {"id", "task", "prompt", "answer", "metadata", "split"}
    assert first["id"] == "paper-test/countdown-easy-test/0"
    assert first["split"] == "test"
    assert first["prompt"] == [{"role": "user", "content": "numbers [8, 73, 96] -> 841"}]
    metadata = json.loads(first["metadata"])
    assert (metadata["numbers"], metadata["target"], metadata["answer_format"]) == (
        [8, 73, 96],
        841,
        "boxed",
    )
    assert metadata["origin"] == "mtgrpo-paper-test"
    # the files hold no countdown solution: one is found, and our verifier accepts it
    assert _score(first, f"\\boxed{{{first['answer']}}}") == 1.0
    assert _score(rows[1], f"\\boxed{{{rows[1]['answer']}}}") == 1.0
    assert _score(rows[2], "\\boxed{Alice}") == 1.0
    assert _score(rows[2], "\\boxed{Bob}") == 0.1
    assert _score(rows[2], "<answer>alice</answer>") == 0.0  # these rows want \boxed{}


def test_task_filter_per_task_and_errors(small_release: Path) -> None:
    assert [r["task"] for r in load_paper_test_sets(small_release, tasks=["zebra:medium"])] == [
        "zebra_puzzles:medium"
    ]
    assert len(load_paper_test_sets(small_release, per_task=1)) == 3
    # the error names the levels the files do hold, not only those asked for and found
    with pytest.raises(ValueError, match=r"tasks \['arc_1d:easy'\] not found under .*; the "
                       r"files there hold \['countdown:easy', 'countdown:hard', "
                       r"'zebra_puzzles:medium'\]: name one of those"):
        load_paper_test_sets(small_release, tasks=["arc_1d:easy", "countdown:easy"])
    with pytest.raises(ValueError, match="not a task of the papers' test sets"):
        load_paper_test_sets(small_release, tasks=["countdown:extreme"])
    with pytest.raises(ValueError, match="per_task must be a positive integer"):
        load_paper_test_sets(small_release, per_task=0)
    with pytest.raises(ValueError, match="no parquet files"):
        load_paper_test_sets(small_release / "missing")


@needs_paper_data
def test_released_sets_map_all_twelve_sources_and_score_one_on_ground_truth() -> None:
    rows = load_paper_test_sets(PAPER_DIR)
    assert Counter(row["task"] for row in rows) == dict.fromkeys(PAPER_TASK_IDS, 200)
    assert all(row["answer"] for row in rows)
    for row in rows:
        assert _score(row, f"Let me think.\n\\boxed{{{row['answer']}}}") == 1.0, row["id"]
    assert all(row["split"] == "test" and is_paper_test_source(row) for row in rows)


@needs_paper_data
def test_released_prompts_are_kept_verbatim() -> None:
    row = load_paper_test_sets(PAPER_DIR, tasks=["zebra:easy"], per_task=1)[0]
    raw = pq.read_table(PAPER_DIR / "test_zebra.parquet").slice(0, 1).to_pylist()[0]
    assert row["prompt"] == [{"role": m["role"], "content": m["content"]} for m in raw["prompt"]]
    assert row["prompt"][0]["content"].startswith("A conversation between User and Assistant.")


@needs_paper_data
def test_training_split_can_exclude_the_released_problems() -> None:
    paper = load_paper_test_sets(PAPER_DIR, tasks=["countdown:easy"])
    keys = {countdown_key(json.loads(row["metadata"])) for row in paper}
    with TaskSuite(
        ["countdown:easy"], train_size=40, eval_size=5, workers=0, use_cache=False, exclude=paper
    ) as suite:
        data = suite.train.task("countdown:easy")
        assert data.exclude_keys >= keys
        train_keys = {countdown_key(json.loads(row["metadata"])) for row in data.rows()}
    assert not train_keys & keys


def test_is_paper_test_source() -> None:
    assert is_paper_test_source("countdown-hard-test")
    assert not is_paper_test_source("countdown-hard-train")
    assert is_paper_test_source({"data_source": "arc-easy-test"})
    assert is_paper_test_source({"metadata": json.dumps({"origin": "mtgrpo-paper-test"})})
    assert not is_paper_test_source({"metadata": "{}", "task": "countdown:easy"})
    with pytest.raises(TypeError, match="data_source string or a row mapping"):
        is_paper_test_source(3)  # type: ignore[arg-type]


def test_ensure_trainable_refuses_test_rows(small_release: Path) -> None:
    ensure_trainable([{"id": "a", "task": "t", "split": "train", "metadata": "{}"}])
    paper = load_paper_test_sets(small_release)
    with pytest.raises(
        ValueError,
        match=r"row 0 \(id 'paper-test/countdown-easy-test/0'.*must not be used for training",
    ):
        ensure_trainable(paper)
    with pytest.raises(ValueError, match="row 1"):
        ensure_trainable([{"split": "train"}, {"split": "test"}])
