"""``mtgrpo sft``: flags derived from SFTConfig, runs on --data and --tasks, exit statuses."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mtgrpo.cli import sft
from mtgrpo.models import load_model
from mtgrpo.reporting import read_metrics
from mtgrpo.tasks import CACHE_ENV


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mtgrpo sft")
    sft.add_arguments(parser)
    return parser.parse_args(argv)


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_unset_flags_keep_the_config_defaults_and_set_ones_override():
    args = _parse(["--model", "m", "--data", "d.jsonl", "--output", "o", "--lr", "1e-3",
                   "--epochs", "0.5", "--max-length", "none", "--no-completion-only-loss",
                   "--batch-size", "2", "--lr-scheduler-type", "cosine"])
    config = sft._config(args)
    assert (config.output_dir, config.learning_rate, config.num_train_epochs, config.max_length,
            config.completion_only_loss, config.per_device_train_batch_size,
            config.lr_scheduler_type) == ("o", 1e-3, 0.5, None, False, 2, "cosine")
    defaults = sft._config(_parse(["--model", "m", "--data", "d", "--output", "o"]))
    assert defaults == type(config)(output_dir="o")


def test_data_file_run_trains_and_saves(tiny_model_dir, tmp_path, capsys):
    data = _write_jsonl(tmp_path / "pairs.jsonl", [
        {"prompt": "Q: 1+1?\nA:", "completion": " 2"},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
    ])
    out = tmp_path / "run"
    argv = ["--model", str(tiny_model_dir), "--data", str(data), "--output", str(out),
            "--max-steps", "3", "--lr", "1e-3", "--logging-steps", "1"]
    assert sft.run(_parse(argv)) == 0
    printed = capsys.readouterr().out
    assert "trained on 2 examples for 3 steps" in printed
    assert f"saved to {out / 'model'}" in printed
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    load_model(out / "model")  # a regular checkpoint GRPO can start from


def test_tasks_run_with_lora_and_merge(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    out = tmp_path / "run"
    argv = ["--model", str(tiny_model_dir), "--tasks", "countdown:easy,zebra_puzzles:easy",
            "--num-examples", "2", "--eval-size", "4", "--workers", "0", "--output", str(out),
            "--max-steps", "1", "--lora", "--lora-r", "2", "--merge-lora",
            "--max-prompt-length", "256"]  # plain prompts are ~520 tokens, the model has 512
    assert sft.run(_parse(argv)) == 0
    assert "trained on 4 examples for 1 steps" in capsys.readouterr().out
    assert (out / "model" / "config.json").is_file()
    assert (out / "adapter" / "adapter_config.json").is_file()


@pytest.mark.parametrize(
    ("rows", "extra", "match"),
    [
        pytest.param([{"question": "x", "answer": "y"}], [], "needs 'prompt' and 'completion'",
                     id="columns"),
        pytest.param([{"prompt": "x", "completion": "y", "split": "test"}], [], "test data",
                     id="test-split"),
        pytest.param([{"prompt": "x", "completion": "y"}], ["--warmup-ratio", "2"],
                     r"warmup_ratio=2.0 must be a finite number in \[0, 1\]", id="config"),
        pytest.param([{"prompt": "x", "completion": "y"}], ["--merge-lora"],
                     "merge_lora=True but the model has no LoRA", id="merge"),
    ],
)
def test_invalid_input_exits_2_with_the_rule(tiny_model_dir, tmp_path, capsys, rows, extra,
                                             match):
    data = _write_jsonl(tmp_path / "d.jsonl", rows)
    argv = ["--model", str(tiny_model_dir), "--data", str(data), "--output",
            str(tmp_path / "run"), "--max-steps", "1", *extra]
    assert sft.run(_parse(argv)) == 2
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert last_line.startswith("mtgrpo sft: error: ")
    assert re.search(match, last_line)


def test_missing_files_exit_2(tmp_path, capsys):
    argv = ["--model", str(tmp_path / "no-model"), "--data", str(tmp_path / "none.jsonl"),
            "--output", str(tmp_path / "run")]
    assert sft.run(_parse(argv)) == 2
    assert "is not a file; pass a .jsonl, .json or .parquet file" in capsys.readouterr().err
    data = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "x", "completion": "y"}])
    argv[3] = str(data)
    assert sft.run(_parse(argv)) == 2
    assert "does not exist" in capsys.readouterr().err


def test_tiny_flag_builds_the_model_first(tmp_path, capsys):
    data = tmp_path / "d.json"
    data.write_text(json.dumps([{"prompt": "x", "completion": "y"}]), encoding="utf-8")
    model = tmp_path / "tiny"
    argv = ["--model", str(model), "--tiny", "--data", str(data), "--output",
            str(tmp_path / "run"), "--max-steps", "1"]
    assert sft.run(_parse(argv)) == 0
    assert (model / "config.json").is_file()


def test_data_and_tasks_are_exclusive_and_one_is_required():
    with pytest.raises(SystemExit):
        _parse(["--model", "m", "--output", "o"])
    with pytest.raises(SystemExit):
        _parse(["--model", "m", "--output", "o", "--data", "d", "--tasks", "mtgrpo3"])


def test_module_import_stays_light():
    code = ("import sys, mtgrpo.cli.sft; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60)
    assert result.stdout.strip() == "[]"


def test_divergence_exits_1(tiny_model_dir, tmp_path, capsys):
    # Adam moves every weight by about lr on its first step: lr = 1e30 overflows the logits,
    # so the second step's loss is NaN.
    data = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "bcd"}])
    argv = ["--model", str(tiny_model_dir), "--data", str(data), "--output",
            str(tmp_path / "run"), "--max-steps", "4", "--lr", "1e30"]
    assert sft.run(_parse(argv)) == 1
    assert "training diverged: the loss is nan at step 2" in capsys.readouterr().err
    assert not (tmp_path / "run" / "model").exists()
