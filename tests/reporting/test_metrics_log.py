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


def test_rewind_reads_the_log_from_its_end(tmp_path):
    path = tmp_path / "completions.jsonl"
    path.write_bytes(b"")
    assert MetricsWriter.rewind(path, step=0) is None  # an empty log
    records = [json.dumps({"step": s, "completion": "x" * 100}) for s in range(1, 2001)]
    path.write_text("\n".join(records))  # no newline after the last line
    assert MetricsWriter.rewind(path, step=2000) is None  # every line stays, byte for byte
    assert path.read_text() == "\n".join(records)
    side = MetricsWriter.rewind(path, step=1500)
    assert [r["step"] for r in read_metrics(path)][-1] == 1500
    assert path.read_text().endswith("\n")
    assert [json.loads(x)["step"] for x in side.read_text().splitlines()] == list(
        range(1501, 2001))
    path.write_text(records[0] + "\n[1, 2]\n\n")  # JSON that is no record moves too
    side = MetricsWriter.rewind(path, step=0)  # step 0: the first line moves as well
    assert path.read_bytes() == b""
    assert side.read_text().splitlines()[:2] == [records[0], "[1, 2]"]


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
