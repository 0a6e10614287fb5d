"""Fully sharded training (``fsdp="full_shard"``, FSDP2) with 2 CPU processes on gloo: the same
step as one process, and a run killed with SIGKILL resumes from its sharded checkpoint exactly
as the uninterrupted run went on."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_trainer_distributed import SCRIPT as DISTRIBUTED_SCRIPT
from test_trainer_distributed import _accelerate_launch, _free_port, script_env
from trainer_helpers import assert_resumed_exactly

from mtgrpo import GRPOConfig, GRPOTrainer
from mtgrpo.reporting import read_metrics
from tolerance import assert_close_f32

RESUME_SCRIPT = Path(__file__).with_name("resume_script.py")


def _launch(model: Path, out: Path, processes: int, *extra: str) -> dict:
    _accelerate_launch(DISTRIBUTED_SCRIPT, processes, str(model), str(out), *extra)
    result = json.loads((out / "result.json").read_text())
    result["rollouts"] = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    return result


def test_a_sharded_step_on_two_processes_matches_one_process(tiny_model_dir, tmp_path):
    one = _launch(tiny_model_dir, tmp_path / "one", 1)
    two = _launch(tiny_model_dir, tmp_path / "two", 2, "--fsdp")
    assert (two["world"], two["sharded"], two["sharded_head"]) == (2, True, "DTensor")
    assert (one["sharded"], one["sharded_head"]) == (False, "Parameter")
    for a, b in zip(one["rollouts"], two["rollouts"], strict=True):  # sampler, rewards
        assert (a["prompt_id"], a["rewards"]) == (b["prompt_id"], b["rewards"])
        assert a["advantages"] == pytest.approx(b["advantages"], abs=1e-9)
    # task weights from the gathered statistics (float32 forwards over other splits)
    assert_close_f32(one["weights"], two["weights"], ulps=16)
    # the update: gradients reduce-scattered over the shards, the same normaliser
    assert two["param_sum"] == pytest.approx(one["param_sum"], rel=1e-6)


def _resume_run(model: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = script_env()
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
               "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
               "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
               str(RESUME_SCRIPT), str(model), str(out), "--fsdp", *extra]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def test_a_sharded_run_killed_with_sigkill_resumes_exactly(tiny_model_dir, tmp_path):
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    done = _resume_run(tiny_model_dir, full)
    assert done.returncode == 0, done.stderr[-3000:]
    # generation re-composes the gathered Llama modules (FSDP2's classes count as the model's
    # own); the update's log-probs go through the sharded model's forward
    run = read_metrics(full, split="run")[0]
    assert (run["generation/decode_path"], run["policy/logprob_path"]) == \
        ("llama_modules", "model_forward")
    killed = _resume_run(tiny_model_dir, crashed, "--kill-at", "6")
    assert killed.returncode != 0  # rank 0 killed itself; the launcher stopped rank 1
    assert f"Signals.{signal.SIGKILL.name}" in killed.stderr or "SIGKILL" in killed.stderr
    assert (crashed / "checkpoint-4").is_dir()
    assert not (crashed / "checkpoint-6").exists()
    state = json.loads((crashed / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["sharded"] is True
    assert state["world_size"] == 2
    # the checkpoint's model is whole: it loads as any model
    config = json.loads((crashed / "checkpoint-4" / "model" / "config.json").read_text())
    saved = load_file(str(crashed / "checkpoint-4" / "model" / "model.safetensors"))
    assert saved["lm_head.weight"].shape == (config["vocab_size"], config["hidden_size"])

    resumed = _resume_run(tiny_model_dir, crashed, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_resumed_exactly(full, crashed)
    # the optimizer's state was restored too, not rebuilt: its step counts all 6 updates
    optimizer = torch.load(crashed / "checkpoint-6" / "optimizer.pt", weights_only=False)
    steps = {float(s["step"]) for s in optimizer["state"].values()}
    assert steps == {6.0}


@pytest.mark.parametrize(("value", "message"), [
    ("shard_grad_op", "accelerate's config file"),
    ("full_shard offload", "offload"),
    (["auto_wrap"], "full_shard"),
])
def test_fsdp_options_mtgrpo_does_not_implement_are_refused(value, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(output_dir=str(tmp_path), fsdp=value)


def test_fsdp_is_refused_with_vllm(tmp_path):
    with pytest.raises(ValueError, match="use_vllm"):
        GRPOConfig(output_dir=str(tmp_path), fsdp="full_shard", use_vllm=True)


def test_fsdp_accepts_trl_spellings(tmp_path):
    for value in ("full_shard", "full_shard auto_wrap", ["full_shard", "auto_wrap"]):
        assert GRPOConfig(output_dir=str(tmp_path), fsdp=value).fully_sharded
    assert not GRPOConfig(output_dir=str(tmp_path)).fully_sharded


def test_accelerates_own_fsdp_launch_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    monkeypatch.setattr(Accelerator, "distributed_type",
                        property(lambda self: DistributedType.FSDP))
    loaded = []
    monkeypatch.setattr("mtgrpo.trainer.trainer.load_policy",
                        lambda *a, **k: loaded.append(a) or (_ for _ in ()).throw(AssertionError))
    with pytest.raises(ValueError, match=r"set fsdp: full_shard .* launch without "
                                         r"accelerate's FSDP config"):
        GRPOTrainer("any/model", [lambda completions, **kw: [0.0] * len(completions)],
                    args=GRPOConfig(output_dir=str(tmp_path), report_to=[]),
                    train_dataset=[{"prompt": "a"}, {"prompt": "b"}])
    assert loaded == []  # refused before any model loads

