"""load_rows: files (JSONL, JSON, parquet, CSV), datasets objects and lists into list[dict]."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mtgrpo.tasks.data import load_rows

ROWS = [
    {"prompt": "2+2?", "task": "math", "answer": "4"},
    {"prompt": "def add", "task": "code", "answer": ""},
    {"prompt": "3*4?", "task": "math", "answer": "12"},
]


def _write(path: Path, rows: list[dict]) -> Path:
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif suffix == ".csv":
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".csv"])
def test_files_load_to_the_same_rows(tmp_path: Path, suffix: str) -> None:
    path = _write(tmp_path / f"data{suffix}", ROWS)
    assert load_rows(path) == ROWS
    assert load_rows(str(path)) == ROWS


def test_list_dataset_and_dataset_dict() -> None:
    assert load_rows(ROWS) == ROWS
    assert load_rows(ROWS) is not ROWS
    dataset = datasets.Dataset.from_list(ROWS)
    assert load_rows(dataset) == ROWS
    both = datasets.DatasetDict({"train": dataset, "test": dataset.select([0])})
    assert load_rows(both, split="test") == ROWS[:1]
    with pytest.raises(ValueError, match=r"has splits \['train', 'test'\]; pass split="):
        load_rows(both)
    with pytest.raises(ValueError, match=r"no split 'dev'; available splits: \['train', 'test'\]"):
        load_rows(both, split="dev")


def test_json_mapping_of_splits_and_of_columns(tmp_path: Path) -> None:
    splits = tmp_path / "splits.json"
    splits.write_text(json.dumps({"train": ROWS[:2], "eval": ROWS[2:]}))
    assert load_rows(splits, split="eval") == ROWS[2:]
    columns = {key: [row[key] for row in ROWS] for key in ROWS[0]}
    assert load_rows(columns) == ROWS


def test_split_filters_rows_by_their_split_column() -> None:
    rows = [{**row, "split": "train" if i else "test"} for i, row in enumerate(ROWS)]
    assert [r["prompt"] for r in load_rows(rows, split="train")] == ["def add", "3*4?"]
    with pytest.raises(ValueError, match="lack"):
        load_rows(ROWS, split="train")


def test_task_column_is_renamed_to_task() -> None:
    rows = [{"prompt": "p", "kind": "math"}]
    assert load_rows(rows, task_column="kind") == [{"prompt": "p", "task": "math"}]


def test_missing_task_column_names_the_columns_and_the_fix() -> None:
    with pytest.raises(
        ValueError,
        match=r"no task column 'task'; columns present: \['answer', 'prompt'\].*task_column=",
    ):
        load_rows([{"prompt": "p", "answer": "a"}])


def test_papers_raw_rows_get_a_hint() -> None:
    with pytest.raises(ValueError, match="load_paper_test_sets"):
        load_rows([{"data_source": "countdown-easy-test", "prompt": []}])


def test_bad_inputs(tmp_path: Path) -> None:
    text = tmp_path / "rows.txt"
    text.write_text("task: a\n")
    with pytest.raises(ValueError, match="task id must be a non-empty string"):
        load_rows([{"task": ""}])
    with pytest.raises(ValueError, match="no such file"):
        load_rows("/nonexistent/rows.jsonl")
    with pytest.raises(ValueError, match=r"unsupported file type '\.txt'"):
        load_rows(text)
    with pytest.raises(TypeError, match="every row must be a mapping"):
        load_rows([["task", "x"]])
    with pytest.raises(ValueError, match="no rows"):
        load_rows([])


def test_bad_jsonl_line_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task": "a"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2 is not valid JSON"):
        load_rows(path)
