"""DeepSpeed ZeRO under ``accelerate launch --use_deepspeed`` with 2 CPU processes on gloo: the
same step as one process (ZeRO-3 and ZeRO-2), and a ZeRO-3 run killed with SIGKILL resumes from
its checkpoint (every process's partitions) exactly as the uninterrupted run went on; what
mtgrpo cannot run under DeepSpeed is refused before the model loads."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from test_trainer_distributed import SCRIPT as DISTRIBUTED_SCRIPT
from test_trainer_distributed import _accelerate_launch, _free_port, script_env
from trainer_helpers import assert_resumed_exactly, step_records

from mtgrpo import GRPOConfig
from mtgrpo.reporting import read_metrics
from mtgrpo.trainer import deepspeed as zero
from mtgrpo.trainer.checkpointing import Checkpointing
from tolerance import assert_close_f32

deepspeed = pytest.importorskip(
    "deepspeed", reason="DeepSpeed is not installed (scripts/setup-env.sh installs it)")

RESUME_SCRIPT = Path(__file__).with_name("resume_script.py")


def _deepspeed_launch(script: Path, stage: int, *argv: str) -> subprocess.CompletedProcess:
    """2 processes under ``accelerate launch --use_deepspeed`` (the first start compiles
    DeepSpeed's small communication helper, about a minute on 2 cores, cached after)."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--use_deepspeed",
               "--zero_stage", str(stage), "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(_free_port()), str(script), *argv]
    return subprocess.run(command, env=script_env(), capture_output=True, text=True,
                          timeout=600)


def _succeeded(done: subprocess.CompletedProcess) -> None:
    # each process's exception and abort, which the launcher's own report would push out of
    # the tail
    raised = [line for line in done.stderr.splitlines()
              if line.startswith("[rank") and ("Error" in line or "abort" in line.lower())]
    assert done.returncode == 0, "\n".join([*raised[-8:], done.stderr[-4000:]])


def _result(out: Path) -> dict:
    result = json.loads((out / "result.json").read_text())
    result["rollouts"] = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    return result


@pytest.fixture(scope="module")
def one_process(tiny_model_dir, tmp_path_factory) -> dict:
    """The step on one plain process, which every ZeRO stage must reproduce."""
    out = tmp_path_factory.mktemp("one")
    _accelerate_launch(DISTRIBUTED_SCRIPT, 1, str(tiny_model_dir), str(out))
    return _result(out)


@pytest.mark.parametrize("stage", [3, 2])
def test_a_zero_step_on_two_processes_matches_one_process(stage, one_process, tiny_model_dir,
                                                           tmp_path):
    done = _deepspeed_launch(DISTRIBUTED_SCRIPT, stage, str(tiny_model_dir), str(tmp_path))
    _succeeded(done)
    one, two = one_process, _result(tmp_path)
    assert (two["world"], two["zero_stage"]) == (2, stage)
    assert one["zero_stage"] is None
    # ZeRO-3 partitions every parameter: outside a forward a process holds an empty tensor
    assert two["head_numel"] == (0 if stage == 3 else one["head_numel"])
    assert one["head_numel"] > 0
    for a, b in zip(one["rollouts"], two["rollouts"], strict=True):  # sampler, rewards
        assert (a["prompt_id"], a["rewards"]) == (b["prompt_id"], b["rewards"])
        assert a["advantages"] == pytest.approx(b["advantages"], abs=1e-9)
    # task weights from the gathered statistics (float32 forwards over other splits)
    assert_close_f32(one["weights"], two["weights"], ulps=16)
    assert one["weights"] != pytest.approx([0.5, 0.5], abs=1e-3)  # the update did move them
    # the update through the engine: gradients averaged over processes, mtgrpo's normaliser
    # (not divided again by the engine's accumulation steps), the same clipping
    assert two["param_sum"] == pytest.approx(one["param_sum"], rel=1e-6)


# the whole model (no LoRA), a learning rate that changes every step
RESUME_OPTIONS = ("--whole", "--lr-scheduler", "linear")


def _resume_run(model: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return _deepspeed_launch(RESUME_SCRIPT, 3, str(model), str(out), *RESUME_OPTIONS, *extra)


def test_a_zero3_run_killed_with_sigkill_resumes_exactly(tiny_model_dir, tmp_path):
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    done = _resume_run(tiny_model_dir, full)
    _succeeded(done)
    # generation re-composes the gathered Llama modules (ZeRO's hooks removed meanwhile); the
    # update's log-probs go through the engine's forward, which gathers each module's weights
    run = read_metrics(full, split="run")[0]
    assert (run["generation/decode_path"], run["policy/logprob_path"]) == \
        ("llama_modules", "model_forward")
    # six steps (sampled completions, resampled batches, the task weights read back, a linear
    # schedule on the engine's optimizer, checkpoints) as the same two processes take them
    # replicated (DDP): each process samples its own stream (seed + rank), so one process
    # would draw other completions (test_a_zero_step_... compares it on scripted ones)
    _accelerate_launch(RESUME_SCRIPT, 2, str(tiny_model_dir), str(tmp_path / "ddp"),
                       *RESUME_OPTIONS)
    ddp, two = step_records(tmp_path / "ddp"), step_records(full)
    assert len({r["learning_rate"] for r in two}) == 6
    assert [r["learning_rate"] for r in two] == [r["learning_rate"] for r in ddp]
    assert [r["step"] for r in two] == [1, 2, 3, 4, 5, 6]
    _comparestep_records(ddp, two)
    killed = _resume_run(tiny_model_dir, crashed, "--kill-at", "6")
    assert killed.returncode != 0  # rank 0 killed itself; the launcher stopped rank 1
    assert f"Signals.{signal.SIGKILL.name}" in killed.stderr or "SIGKILL" in killed.stderr
    checkpoint = crashed / "checkpoint-4"
    assert checkpoint.is_dir()
    assert not (crashed / "checkpoint-6").exists()
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert (state["deepspeed_stage"], state["world_size"]) == (3, 2)
    # each process's partition of the optimizer state, in the engine's files; no optimizer.pt
    engine_files = {p.name for p in (checkpoint / zero.CHECKPOINT_FOLDER).iterdir()}
    assert {f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in (0, 1)} <= engine_files
    assert not (checkpoint / "optimizer.pt").exists()
    # the checkpoint's model is whole: it loads as any model
    config = json.loads((checkpoint / "model" / "config.json").read_text())
    saved = load_file(str(checkpoint / "model" / "model.safetensors"))
    assert saved["lm_head.weight"].shape == (config["vocab_size"], config["hidden_size"])

    resumed = _resume_run(tiny_model_dir, crashed, "--resume")
    _succeeded(resumed)
    assert_resumed_exactly(full, crashed)
    # the engine's state was restored, not rebuilt: it counts all 6 optimizer steps
    engine_state = torch.load(crashed / "checkpoint-6" / zero.CHECKPOINT_FOLDER
                              / "zero_pp_rank_0_mp_rank_00_model_states.pt", weights_only=False)
    assert engine_state["global_steps"] == 6


def _comparestep_records(ddp: list[dict], two: list[dict]) -> None:
    """The same records, numbers to float32 agreement (forwards over other splits of the
    batch, gradients reduced in another order)."""
    assert [r["step"] for r in two] == [r["step"] for r in ddp]
    for a, b in zip(ddp, two, strict=True):
        assert a.keys() == b.keys()
        numbers = [k for k, v in a.items() if isinstance(v, float | list)]
        assert {k: b[k] for k in a.keys() - numbers} == {k: a[k] for k in a.keys() - numbers}
        for key in numbers:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6, nan_ok=True), \
                (a["step"], key)


def test_zero3_mixes_the_reference_model_towards_the_whole_policy(tiny_model_dir, tmp_path):
    # sync_ref_model reads the policy's whole weights (gathered: ZeRO-3 holds partitions) and
    # moves the reference copy as one process does
    one, two = tmp_path / "one", tmp_path / "two"
    _accelerate_launch(DISTRIBUTED_SCRIPT, 1, str(tiny_model_dir), str(one), "--sync-ref")
    done = _deepspeed_launch(DISTRIBUTED_SCRIPT, 3, str(tiny_model_dir), str(two), "--sync-ref")
    _succeeded(done)
    first, second = _result(one), _result(two)
    assert second["zero_stage"] == 3
    assert first["ref_sum"] != pytest.approx(first["param_sum"], abs=1e-3)  # a real mix
    assert second["ref_sum"] == pytest.approx(first["ref_sum"], rel=1e-6)


def test_zero3_generates_with_the_hf_backend_as_ddp_does(tiny_model_dir, tmp_path):
    """transformers' generate on the gathered weights (no lockstep across processes: the
    processes generate different numbers of rows), then two updates through the engine."""
    hf = ("--backend", "hf", "--max-steps", "2")
    with ThreadPoolExecutor(2) as pool:  # independent runs, side by side
        zero3 = pool.submit(_resume_run, tiny_model_dir, tmp_path / "zero3", *hf)
        pool.submit(_accelerate_launch, RESUME_SCRIPT, 2, str(tiny_model_dir),
                    str(tmp_path / "ddp"), *RESUME_OPTIONS, *hf).result()
    done = zero3.result()
    _succeeded(done)
    assert read_metrics(tmp_path / "zero3", split="run")[0]["generation/backend"] == "hf"
    two = step_records(tmp_path / "zero3")
    assert [r["step"] for r in two] == [1, 2]
    _comparestep_records(step_records(tmp_path / "ddp"), two)


def _trainer(tmp_path: Path, **kwargs):
    """A trainer on a model that is not there: what is refused must be refused first."""
    from mtgrpo import GRPOTrainer

    options = {name: kwargs.pop(name) for name in ("peft_config", "optimizers") if name in kwargs}
    return GRPOTrainer(str(tmp_path / "no-model-here"), lambda completions, **_: [1.0] * len(
        completions), args=GRPOConfig(output_dir=str(tmp_path / "run"), report_at_end=False,
                                      **kwargs),
        train_dataset=[{"prompt": "a"}, {"prompt": "b"}], **options)


@pytest.mark.parametrize(("options", "message"), [
    ({"peft_config": {"r": 4}}, r"peft_config \(LoRA\) is not supported with DeepSpeed.*DDP"),
    ({"optimizers": (torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), None)},
     r"optimizers=\(optimizer, \.\.\.\) is not supported with DeepSpeed.*optimizers=None"),
    ({"fsdp": "full_shard"}, r"fsdp='full_shard' is not supported with DeepSpeed"),
    ({"use_vllm": True}, r"use_vllm=True is not supported with DeepSpeed.*'static' or 'hf'"),
    ({"max_memory_per_microbatch": "1GB"},
     r"max_memory_per_microbatch='1GB' is not supported.*max_tokens_per_microbatch"),
])
def test_what_deepspeed_cannot_run_is_refused_before_the_model_loads(options, message, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ValueError, match=message):
        _trainer(tmp_path, **options)


def _accelerator(config: dict) -> SimpleNamespace:
    plugin = SimpleNamespace(deepspeed_config=config, zero3_init_flag=True)
    return SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin), num_processes=2)


@pytest.mark.parametrize(("config", "message"), [
    ({"zero_optimization": {"stage": 1}}, r"ZeRO stage 1 is not supported.*--zero_stage 3"),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}},
     r"offload_optimizer.device='cpu' is not supported.*'none'"),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}},
     r"offload_param.device='nvme' is not supported"),
    ({"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW"}},
     r"'optimizer' section is not supported.*optim"),
    ({"zero_optimization": {"stage": 2}, "scheduler": {"type": "WarmupLR"}},
     r"'scheduler' section is not supported.*lr_scheduler_type"),
    ({"zero_optimization": {"stage": 3}, "gradient_accumulation_steps": 4},
     r"gradient_accumulation_steps=4 differs from mtgrpo's 1.*'auto'"),
    ({"zero_optimization": {"stage": 3}, "gradient_clipping": 0.5},
     r"gradient_clipping=0.5 differs from mtgrpo's 1.0.*max_grad_norm"),
])
def test_deepspeed_configurations_mtgrpo_cannot_run_are_refused(config, message, tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path)).to_native()
    with pytest.raises(ValueError, match=message):
        zero.configure(_accelerator(config), args)


def test_the_deepspeed_configuration_takes_mtgrpo_values(tmp_path):
    """``auto`` entries (accelerate's defaults) become mtgrpo's micro-batch size, one
    accumulation step (the boundary is set per micro-batch) and max_grad_norm; the model is
    loaded whole (no zero.Init)."""
    args = GRPOConfig(output_dir=str(tmp_path), max_grad_norm=0.7,
                      per_device_train_batch_size=4).to_native()
    accelerator = _accelerator({"zero_optimization": {"stage": 3}, "train_batch_size": "auto",
                                "train_micro_batch_size_per_gpu": "auto",
                                "gradient_accumulation_steps": 1})
    zero.configure(accelerator, args)
    plugin = accelerator.state.deepspeed_plugin
    assert {key: plugin.deepspeed_config[key] for key in (
        "train_micro_batch_size_per_gpu", "train_batch_size", "gradient_accumulation_steps",
        "gradient_clipping")} == {"train_micro_batch_size_per_gpu": 4, "train_batch_size": 8,
                                  "gradient_accumulation_steps": 1, "gradient_clipping": 0.7}
    assert plugin.zero3_init_flag is False


@pytest.mark.parametrize(("saved", "current", "message"), [
    (3, None, "written by a run with DeepSpeed ZeRO-3 and this run is without DeepSpeed"),
    (None, 3, "written by a run without DeepSpeed and this run is with DeepSpeed ZeRO-3"),
    (2, 3, "with DeepSpeed ZeRO-2 and this run is with DeepSpeed ZeRO-3: resume it with "
           "DeepSpeed ZeRO-2"),
])
def test_a_checkpoint_resumes_only_with_the_layout_that_wrote_it(saved, current, message):
    trainer = SimpleNamespace(zero=None if current is None else SimpleNamespace(stage=current))
    state = {} if saved is None else {"deepspeed_stage": saved}
    with pytest.raises(ValueError, match=message):
        Checkpointing._check_layout(trainer, Path("checkpoint-4"), state)
    Checkpointing._check_layout(trainer, Path("checkpoint-4"),
                                {} if current is None else {"deepspeed_stage": current})
