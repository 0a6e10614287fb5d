import json
import math

import pytest

from mtgrpo.reporting import MetricsWriter, check_trackers_available, read_metrics


def test_writer_appends_flushes_and_nulls_nan(tmp_path):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path)
    writer.write({"step": 1, "split": "train", "loss": 0.5, "kl": math.nan})
    # flushed per line: readable before close
    assert json.loads(path.read_text().splitlines()[0]) == {
        "step": 1, "split": "train", "loss": 0.5, "kl": None,
    }
    writer.write({"step": 2, "split": "eval", "tasks/a:b/accuracy": 1.0})
    writer.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert [r["step"] for r in read_metrics(path, split="eval")] == [2]


def test_rewind_moves_later_lines_aside_and_keeps_them(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "split": "train"}) for s in (1, 2, 3, 4)]
    path.write_text("\n".join(lines) + '\n{"step": 5, "spl')  # last line cut by a crash
    side = MetricsWriter.rewind(path, step=2)
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    moved = side.read_text().splitlines()
    assert [json.loads(x)["step"] for x in moved[:2]] == [3, 4]
    assert moved[2] == '{"step": 5, "spl'
    assert MetricsWriter.rewind(path, step=2) is None  # nothing newer: nothing moved


def test_read_metrics_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics log"):
        read_metrics(tmp_path / "nope")


def test_missing_tracker_package_is_a_clear_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install wandb"):
        check_trackers_available(["wandb"])
    with pytest.raises(ValueError, match="unknown tracker 'mlflow'"):
        check_trackers_available(["mlflow"])
