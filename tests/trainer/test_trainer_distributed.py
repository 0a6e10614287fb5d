"""`accelerate launch --num_processes 2` on CPU (gloo) agrees with one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tolerance import assert_close_f32

SCRIPT = Path(__file__).with_name("distributed_script.py")


def _launch(model: Path, out: Path, processes: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(SCRIPT.parent), OMP_NUM_THREADS="1")
    # accelerate's multi-process launcher is torchrun ("--multi_gpu"); without a GPU the
    # trainer's Accelerator(cpu=True) joins a gloo process group.
    launcher = "--multi_gpu" if processes > 1 else "--cpu"
    command = [sys.executable, "-m", "accelerate.commands.launch", launcher,
               "--num_processes", str(processes), "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(29_500 + processes), str(SCRIPT), str(model), str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    result["rollouts"] = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    return result


def test_two_processes_match_one_process(tiny_model_dir, tmp_path):
    one = _launch(tiny_model_dir, tmp_path / "one", 1)
    two = _launch(tiny_model_dir, tmp_path / "two", 2)
    assert (one["world"], two["world"]) == (1, 2)
    # the same groups, rewards and first-step advantages on every rank
    assert len(one["rollouts"]) == len(two["rollouts"]) > 0
    for a, b in zip(one["rollouts"], two["rollouts"], strict=True):
        assert (a["prompt_id"], a["rewards"]) == (b["prompt_id"], b["rewards"])
        assert a["advantages"] == pytest.approx(b["advantages"], abs=1e-9)
    # the same task weights after the first update (they use the gathered I_k and J_k); I_k
    # comes from float32 forward passes over differently split batches, hence float32 agreement
    # (tests/tolerance.py: 16 ulps of 1 is 2e-6, a ten-thousandth of the 0.02 that the update
    # moves them by here, so a rank's statistics left out of the gather would show)
    assert_close_f32(one["weights"], two["weights"], ulps=16)
    assert one["weights"] != pytest.approx([0.5, 0.5], abs=1e-3)  # the update did move them
    # the same update: DDP averages gradients, the loss normaliser is the whole batch's
    assert two["param_sum"] == pytest.approx(one["param_sum"], rel=1e-6)
