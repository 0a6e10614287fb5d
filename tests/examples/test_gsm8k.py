"""The GSM8K example: loader, final-number parsing, the format channel, the three-channel reward
suite of configs/gsm8k-math.yaml, and one training step of that config on the tiny model."""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from mtgrpo.algo.advantages import compute_advantages
from mtgrpo.config import load_run_config
from mtgrpo.recipes import recipe_path
from mtgrpo.rewards import math_reward
from mtgrpo.tasks import load_rows
from mtgrpo.tasks.gsm8k import (
    answer_format_reward,
    load_gsm8k,
    main,
    parse_gsm8k_answer,
    write_gsm8k,
)
from mtgrpo.tasks.prompts import PAPER_SYSTEM_PREAMBLE
from mtgrpo.trainer.run import run_training
from mtgrpo.trainer.setup import build_reward_suite
from tolerance import assert_close_f32

SAMPLE = Path(__file__).parent / "data" / "gsm8k_sample.jsonl"
# The final lines of the sample file's answers, as written there: "#### 22", "#### 1,250",
# "#### -4", "#### 5.5", "#### 60", "#### 150", "#### $135", "#### 1,900".
SAMPLE_ANSWERS = ["22", "1250", "-4", "5.5", "60", "150", "135", "1900"]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# ------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(("answer", "solution", "number"), [
    ("Add: 3 + 4 = <<3+4=7>>7.\n#### 7", "Add: 3 + 4 = 7.", "7"),
    ("#### 1,250", "", "1250"),              # thousands separators removed
    ("#### 12,345,678", "", "12345678"),
    ("It drops to <<3-7=-4>>-4.\n#### -4", "It drops to -4.", "-4"),
    ("#### $135", "", "135"),                 # a dollar sign is not part of the number
    ("#### -$3.50", "", "-3.50"),
    ("#### +7", "", "7"),
    ("####   42  \n", "", "42"),
    ("a #### b\n#### 9", "a #### b", "9"),    # the last '####' marks the final answer
])
def test_parse_gsm8k_answer(answer, solution, number):
    assert parse_gsm8k_answer(answer) == (solution, number)


@pytest.mark.parametrize(("answer", "match"), [
    ("The answer is 7.", "has no '#### <number>' line"),
    ("#### twelve", "is not one number"),
    ("#### 1,25", "is not one number"),       # a separator must be followed by three digits
    ("#### 3 apples", "is not one number"),
    ("#### 3/4", "is not one number"),
    (None, "must be text"),
])
def test_parse_gsm8k_answer_errors(answer, match):
    with pytest.raises(ValueError, match=match):
        parse_gsm8k_answer(answer)


def test_parsed_numbers_round_trip_through_the_math_and_format_rewards():
    # For random integers written in GSM8K's style (with separators), the parsed gold number
    # and a completion boxing the same text must score 1.0 on correctness and on format.
    rng = random.Random(0)
    numbers = [rng.randint(-50_000, 5_000_000) for _ in range(12)]
    golds = [parse_gsm8k_answer(f"#### {n:,}")[1] for n in numbers]
    assert golds == [str(n) for n in numbers]
    completions = [f"So the total is \\boxed{{{n:,}}}." for n in numbers]
    assert math_reward(None, completions, answer=golds) == [1.0] * len(numbers)
    assert answer_format_reward(None, completions, answer_format=["boxed"] * 12) == [1.0] * 12


# ------------------------------------------------------------------------------ loading


def test_load_sample_file_in_our_schema():
    rows = load_gsm8k(SAMPLE)
    assert [row["answer"] for row in rows] == SAMPLE_ANSWERS
    assert [row["id"] for row in rows] == [f"gsm8k/train/{i}" for i in range(8)]
    assert {row["task"] for row in rows} == {"gsm8k"}
    assert {row["split"] for row in rows} == {"train"}
    assert {row["answer_format"] for row in rows} == {"boxed"}
    first = rows[0]
    assert first["solution"] == ("The trays hold 6 * 12 = 72 muffins.\n"
                                 "After the morning she has 72 - 50 = 22 muffins left.")
    assert all("<<" not in row["solution"] and "####" not in row["solution"] for row in rows)
    assert first["prompt"] == [{
        "role": "user",
        "content": "A baker fills 6 trays with 12 muffins each. She sells 50 muffins in the "
                   "morning. How many muffins are left?\n\nSolve the problem step by step. "
                   "Write the final answer, a single number, in \\boxed{}.",
    }]
    # the rows are what the trainer loads: load_rows accepts them unchanged
    assert load_rows(rows) == rows


def test_prompt_and_answer_formats_and_options():
    plain = load_gsm8k(SAMPLE, "test", prompt_format="plain", answer_format="answer_tag",
                       task="math:gsm8k", limit=3)
    assert len(plain) == 3
    assert [row["id"] for row in plain] == ["math:gsm8k/test/0", "math:gsm8k/test/1",
                                            "math:gsm8k/test/2"]
    prompt = plain[1]["prompt"]
    assert isinstance(prompt, str)
    assert prompt.startswith(PAPER_SYSTEM_PREAMBLE)
    assert "in <answer> </answer> tags." in prompt
    assert prompt.endswith("Assistant: Let me solve this step by step.")
    assert {row["answer_format"] for row in plain} == {"answer_tag"}
    assert {row["split"] for row in plain} == {"test"}
    chat = load_gsm8k(SAMPLE, system_prompt="You are a careful tutor.", limit=1)
    assert [m["role"] for m in chat[0]["prompt"]] == ["system", "user"]
    assert load_gsm8k(SAMPLE, answer_format="box", limit=1)[0]["answer_format"] == "boxed"


def test_parquet_and_directory_sources(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    raw = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    parquet = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(raw), parquet)
    assert [r["answer"] for r in load_gsm8k(parquet)] == SAMPLE_ANSWERS
    # the hub snapshot layout: <dir>/main/<split>-*.parquet
    (tmp_path / "snapshot" / "main").mkdir(parents=True)
    shutil.copy(parquet, tmp_path / "snapshot" / "main" / parquet.name)
    _write_jsonl(tmp_path / "snapshot" / "main" / "test.jsonl", raw[:2])
    assert [r["answer"] for r in load_gsm8k(tmp_path / "snapshot")] == SAMPLE_ANSWERS
    assert [r["answer"] for r in load_gsm8k(tmp_path / "snapshot", "test")] == ["22", "1250"]
    with pytest.raises(ValueError, match="no 'validation' files"):
        load_gsm8k(tmp_path / "snapshot", "validation")


def test_missing_file_and_bad_options(tmp_path):
    with pytest.raises(ValueError, match="no such file or directory"):
        load_gsm8k(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="no such file or directory"):
        load_gsm8k("./data/gsm8k")
    with pytest.raises(ValueError, match="no such file or directory"):
        load_gsm8k(tmp_path / "gsm8k")  # a Path is never a hub name
    with pytest.raises(ValueError, match="unknown answer format 'latex'"):
        load_gsm8k(SAMPLE, answer_format="latex")
    with pytest.raises(ValueError, match="unknown prompt format"):
        load_gsm8k(SAMPLE, prompt_format="markdown")
    with pytest.raises(ValueError, match="limit=0 must be a positive integer"):
        load_gsm8k(SAMPLE, limit=0)
    with pytest.raises(ValueError, match="task='' must be a non-empty"):
        load_gsm8k(SAMPLE, task="")


def test_wrong_layout_names_the_row_and_the_fix(tmp_path):
    ours = _write_jsonl(tmp_path / "ours.jsonl", [{"prompt": "2+2?", "task": "math"}])
    with pytest.raises(ValueError, match=r"row 0 is not in GSM8K's layout.*load_rows"):
        load_gsm8k(ours)
    bad = _write_jsonl(tmp_path / "bad.jsonl", [
        {"question": "Two plus two?", "answer": "2 + 2 = 4\n#### 4"},
        {"question": "Three plus three?", "answer": "The answer is 6."},
    ])
    with pytest.raises(ValueError, match=r"bad\.jsonl: row 1: GSM8K answer .* has no '####"):
        load_gsm8k(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="holds no GSM8K problems"):
        load_gsm8k(empty)


def test_hub_path_offline_says_to_pass_a_local_file(tmp_path, monkeypatch):
    # conftest sets HF_HUB_OFFLINE / HF_DATASETS_OFFLINE; an empty cache cannot serve it
    with pytest.raises(ValueError, match=r"cannot load 'openai/gsm8k'.*pass a local file"):
        load_gsm8k("openai/gsm8k", cache_dir=tmp_path / "hf-cache")

    import datasets

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(ValueError, match="ConnectionError: Couldn't reach") as info:
        load_gsm8k(split="test")
    assert isinstance(info.value.__cause__, ConnectionError)


# ------------------------------------------------------------------------------ format channel


@pytest.mark.parametrize(("completion", "answer_format", "expected"), [
    ("so the answer is \\boxed{72}", "boxed", 1.0),
    ("\\boxed{1,250}", "boxed", 1.0),
    ("\\boxed{$3.50}", "boxed", 1.0),
    ("\\boxed{ -4 }", "boxed", 1.0),
    ("\\boxed{x = 72}", "boxed", 0.5),            # the container holds more than a number
    ("\\boxed{\\frac{1}{2}}", "boxed", 0.5),
    ("\\boxed{" + "7" * 1001 + "}", "boxed", 0.5),  # over 1,000 characters is not a number
    ("the answer is 72", "boxed", 0.0),
    ("\\boxed{72", "boxed", 0.0),                 # unclosed
    ("<answer>72</answer>", "boxed", 0.0),        # the other container
    ("<answer> 72 </answer>", "answer_tag", 1.0),
    ("<answer>seventy-two</answer>", "answer_tag", 0.5),
    ("\\boxed{72}", "answer_tag", 0.0),
    ("\\boxed{x} and finally \\boxed{5}", "boxed", 1.0),  # the last container counts
    ("\\boxed{5} and finally \\boxed{x}", "boxed", 0.5),
])
def test_answer_format_reward_values(completion, answer_format, expected):
    assert answer_format_reward(None, [completion], answer_format=[answer_format]) == [expected]


def test_answer_format_reward_rows_and_errors():
    conversational = [{"role": "assistant", "content": "\\boxed{9}"}]
    assert answer_format_reward(
        None, [conversational, "\\boxed{9}"], answer_format=["boxed", None]
    ) == [1.0, None]
    with pytest.raises(TypeError, match="needs the dataset column 'answer_format'"):
        answer_format_reward(None, ["\\boxed{1}"], answer=["1"])
    with pytest.raises(ValueError, match="2 answer_format values for 1 completions"):
        answer_format_reward(None, ["\\boxed{1}"], answer_format=["boxed", "boxed"])
    with pytest.raises(ValueError, match="unknown answer format 'latex'"):
        answer_format_reward(None, ["\\boxed{1}"], answer_format=["latex"])


def test_answer_format_reward_is_bounded_on_hostile_text():
    hostile = ["\\boxed{" * 200_000, "{" * 1_000_000, "<answer>" * 100_000 + "</answer>",
               "\\boxed{" + "9," * 400_000 + "}", "x" * 2_000_000]
    start = time.perf_counter()
    scores = answer_format_reward(None, hostile, answer_format=["boxed", "boxed", "answer_tag",
                                                                "boxed", "boxed"])
    assert time.perf_counter() - start < 2.0  # linear scans of ~6 MB; far below on any machine
    assert scores == [0.0, 0.0, 0.5, 0.0, 0.0]


# ------------------------------------------------------------------------------ the config


def test_config_reward_suite_scores_three_channels_and_advantages():
    run = load_run_config(recipe_path("gsm8k-math"))
    suite = build_reward_suite(run.rewards, run.training)
    assert suite.channel_names == ["math_reward", "answer_format_reward", "length_reward"]
    np.testing.assert_array_equal(suite.reward_weights, [1.0, 0.5, 0.25])
    row = load_gsm8k(SAMPLE, limit=1)[0]  # answer "22"
    completions = ["\\boxed{22}", "\\boxed{23}", "The answer is 22", "no idea"]
    lengths = [200, 300, 100, 400]  # tokens; length reward max(0, 1 - |l - 200| / 200)
    columns = {key: [value] * 4 for key, value in row.items() if key != "prompt"}
    scores = suite.score([row["prompt"]] * 4, completions, [[1] * n for n in lengths], columns,
                         ["gsm8k"] * 4)
    expected = torch.tensor([[1.0, 1.0, 1.0],   # right, boxed number, on target
                             [0.0, 1.0, 0.5],   # wrong, boxed number, 100 tokens over
                             [1.0, 0.0, 0.5],   # right (last number), no box, 100 under
                             [0.0, 0.0, 0.0]],  # wrong, no box, 200 over
                            dtype=torch.float64)
    torch.testing.assert_close(torch.from_numpy(scores.values), expected, rtol=0, atol=0)
    # sum_then_normalize: s = w·r = [1.75, 0.625, 1.125, 0]; A = (s - mean) / (std_ddof1 + 1e-4)
    result = compute_advantages(scores.values, 4, reward_weights=suite.reward_weights,
                                aggregation=run.training.advantage.multi_objective_aggregation)
    s = np.array([1.75, 0.625, 1.125, 0.0])
    want = (s - s.mean()) / (s.std(ddof=1) + 1e-4)
    # the estimator (here on the suite's float64 scores) against the float64 formula, bounded
    # by a few float32 roundings of values near 1.2, the precision the loss reads them at
    # (another weight or std changes them by more than 1e-2)
    assert_close_f32(result.advantages, want.tolist(), ulps=8)


def test_gsm8k_config_trains_one_step_on_the_tiny_model(tmp_path, tiny_model_dir):
    train = _write_jsonl(tmp_path / "data" / "train.jsonl", load_gsm8k(SAMPLE))
    run = load_run_config(recipe_path("gsm8k-math"), [
        "--model.name_or_path", str(tiny_model_dir), "--bf16", "false",
        "--data.train", str(train), "--data.eval", "null", "--output_dir", str(tmp_path / "run"),
        "--max_steps", "1", "--num_generations", "2", "--prompts_per_step", "2",
        "--per_device_train_batch_size", "4", "--max_prompt_length", "128",
        "--max_completion_length", "8", "--save_steps", "0", "--eval_steps", "0",
    ])
    assert (run.peft.r, run.peft.lora_alpha) == (16, 32)
    metrics = run_training(run)
    assert np.isfinite(metrics["loss"])
    for channel in ("math_reward", "answer_format_reward", "length_reward"):
        assert f"rewards/{channel}/mean" in metrics
    assert metrics["tasks/gsm8k/groups_generated"] == 2
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["split"] == "run"  # how the run computes, then the steps
    record = json.loads(lines[1])
    assert record["step"] == 1
    assert record["split"] == "train"


# ------------------------------------------------------------------------------ data files


def test_write_gsm8k_and_its_command(tmp_path, capsys):
    source = tmp_path / "raw"
    source.mkdir()
    shutil.copy(SAMPLE, source / "train.jsonl")
    shutil.copy(SAMPLE, source / "test.jsonl")
    written = write_gsm8k(tmp_path / "out", source, eval_limit=2, answer_format="answer_tag")
    train, test = load_rows(written["train"]), load_rows(written["test"])
    assert [r["answer"] for r in train] == SAMPLE_ANSWERS
    assert [r["split"] for r in test] == ["test", "test"]
    assert {r["answer_format"] for r in train + test} == {"answer_tag"}

    assert main([str(tmp_path / "cli"), "--source", str(source), "--eval-limit", "0"]) == 0
    assert "train: " in capsys.readouterr().out
    assert len(load_rows(tmp_path / "cli" / "test.jsonl")) == len(SAMPLE_ANSWERS)
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path / "x"), "--source", str(tmp_path / "nowhere.jsonl")])
    assert info.value.code == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_data_loader_reads_the_raw_layout_without_a_preparation_step(tmp_path, tiny_model_dir):
    """`data.loader` calls load_gsm8k on data.train directly (the raw GSM8K layout)."""
    run = load_run_config(recipe_path("gsm8k-math"), [
        "--model.name_or_path", str(tiny_model_dir), "--bf16", "false",
        "--data.loader", "mtgrpo.tasks.gsm8k:load_gsm8k", "--data.train", str(SAMPLE),
        "--data.eval", "null", "--output_dir", str(tmp_path / "run"),
        "--max_steps", "1", "--num_generations", "2", "--prompts_per_step", "2",
        "--per_device_train_batch_size", "4", "--max_prompt_length", "128",
        "--max_completion_length", "8", "--save_steps", "0", "--eval_steps", "0",
    ])
    metrics = run_training(run)
    assert metrics["tasks/gsm8k/groups_generated"] == 2
