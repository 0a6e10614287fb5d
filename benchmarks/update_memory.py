"""Peak memory of one policy update, mtgrpo's ``GRPOTrainer`` against TRL 1.16's, over model sizes.

    nice python benchmarks/update_memory.py --out benchmarks/results/update_memory_cpu.md
    python benchmarks/update_memory.py --quick          # the tiny model only (what the test runs)
    python benchmarks/update_memory.py --models qwen2.5-0.5b --checkpointing on

Memory decides which model a user can train at all. This measures the update alone: the loss
forward and backward passes over every micro-batch and the optimizer step, on one fixed batch
of prompts and completions (random token ids, no generation), for both trainers at the same
settings. Every (model, trainer, gradient checkpointing) setting runs in a process of its own,
one after the other, so that nothing one leaves behind is counted for the next.

Each process builds the model (randomly initialised under one seed, on the CPU or the GPU when
one is visible), builds the trainer the step-time benchmark builds (``benchmarks/
step_time_vs_trl.py``: ``build_ours`` and ``build_trl``, both in float32 without autocast,
``beta = 0``, loss ``dapo``, AdamW as each trainer's default, the same micro-batch), then runs
``--warmup`` updates unmeasured (the optimizer's state is allocated by the first step, as it is
for every step of a run after the first) and one measured update:

* ours: ``trainer.updater.update(batch)`` on ``pad_policy_batch`` of the fixed rows, as the
  trainer's ``_update`` calls it (reference, old-policy and I_k passes where the run asks for
  them; none does here);
* TRL: ``trainer.compute_loss(model, micro_batch)`` and ``accelerator.backward`` on each
  micro-batch of the dict ``_generate_and_score_completions`` would have returned (the same
  rows, TRL's keys), then gradient clipping, ``optimizer.step()``, the scheduler and
  ``zero_grad`` as transformers' training loop runs them.

Figures (MiB = 2**20 bytes):

* *peak during the update*: the process's peak resident set size (``VmHWM``, reset through
  ``/proc/self/clear_refs`` right before the update) — what the machine must hold, including
  the parameters, the optimizer state and whatever the trainer keeps besides;
* *RSS at start*: the resident set size when the update starts; *above start*: the difference
  (gradients, activations, logits and the allocator's temporaries);
* *parameters*, *gradients*, *optimizer state*: exact tensor bytes (gradients: the trainable
  parameters', which the update allocates and frees);
* on CUDA, ``torch.cuda.max_memory_allocated`` during the update (torch's own figure; the CPU
  allocator keeps none).

Each child runs with ``MALLOC_MMAP_THRESHOLD_=131072``: glibc then maps every allocation of
128 KiB or more afresh and unmaps it when freed, so the resident size follows the live tensors
instead of the heap's high-water mark (freed memory kept by the allocator would otherwise hide
a later allocation, or count an earlier one). The update runs a little slower that way;
nothing here times it but the *update s* column, for the record.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from mtgrpo.algo.registry import Registry

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
# The step-time benchmark's workloads, model builder and trainer builders (the benchmarks
# directory is not a package).
import step_time_vs_trl as bench  # noqa: E402

__all__ = [
    "MODELS",
    "FixedBatch",
    "Measurement",
    "Setting",
    "SweepConfig",
    "fixed_batch",
    "main",
    "markdown_report",
    "measure",
    "run_isolated",
    "run_sweep",
]

TRAINERS = ("ours", "trl")
# Rows of a batch: 2 prompts x 4 completions, 32-token prompts, completions of 48..96 tokens,
# micro-batches of 4 rows: small enough for the 0.5 B model's update to take about a minute
# on a 2-core CPU with 24 GiB.
_BATCH = {"num_prompts": 2, "group_size": 4, "prompt_tokens": 32, "max_new_tokens": 96,
          "micro_batch": 4}

MODELS: Registry[bench.Workload] = Registry("update-memory model")
# The project's tiny model (mtgrpo tiny-model, mtgrpo.models.tiny): its default shape and the
# byte-level tokenizer's 259 tokens.
MODELS.add("tiny", bench.Workload(
    name="tiny", arch="llama", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
    intermediate_size=128, max_position_embeddings=512, vocab_size=None,
    tie_word_embeddings=False, bf16=False, needs_cuda=False, **_BATCH))
# SmolLM2-135M's shape, randomly initialised.
MODELS.add("smollm2-135m", bench.Workload(
    name="smollm2-135m", arch="llama", hidden_size=576, num_layers=30, num_heads=9,
    num_kv_heads=3, intermediate_size=1536, max_position_embeddings=8192, vocab_size=49_152,
    tie_word_embeddings=True, bf16=False, needs_cuda=False, **_BATCH))
# Qwen2.5-0.5B's shape, randomly initialised (the GPU check's model, in float32 here).
MODELS.add("qwen2.5-0.5b", bench.Workload(
    name="qwen2.5-0.5b", arch="qwen2", hidden_size=896, num_layers=24, num_heads=14,
    num_kv_heads=2, intermediate_size=4864, max_position_embeddings=32768, vocab_size=151_936,
    tie_word_embeddings=True, bf16=False, needs_cuda=False, **_BATCH))
# --quick: the tiny model on a smaller batch (seconds per setting).
_QUICK_BATCH = {"num_prompts": 2, "group_size": 2, "prompt_tokens": 8, "max_new_tokens": 8,
                "micro_batch": 2}


@dataclass(frozen=True)
class Setting:
    """One measured process: a model, a trainer and gradient checkpointing on or off."""

    model: str
    trainer: str
    gradient_checkpointing: bool
    warmup: int = 1
    seed: int = 0
    quick: bool = False

    def __post_init__(self) -> None:
        MODELS.get(self.model)  # names the valid models when it is not one
        if self.trainer not in TRAINERS:
            raise ValueError(f"trainer {self.trainer!r} is not one of {TRAINERS}")
        if self.warmup < 0:
            raise ValueError(f"warmup={self.warmup} must be >= 0 (updates before the measured one)")

    @property
    def workload(self) -> bench.Workload:
        workload = MODELS.get(self.model)
        return replace(workload, **_QUICK_BATCH) if self.quick else workload

    @property
    def label(self) -> str:
        return "grad ckpt on" if self.gradient_checkpointing else "grad ckpt off"


@dataclass
class Measurement:
    """What one process measured (MiB unless named otherwise; NaN where not measured)."""

    setting: Setting
    parameters: int  # model parameters (count)
    rows: int
    completion_tokens: int
    start_mib: float  # resident set size when the measured update starts
    peak_mib: float  # peak resident set size during the measured update
    first_peak_mib: float  # the same for the first update (the optimizer state being allocated)
    build_peak_mib: float  # peak resident set size while the model and trainer were built
    parameters_mib: float
    gradients_mib: float  # the trainable parameters' bytes: what the gradients take
    optimizer_mib: float
    cuda_peak_mib: float  # torch.cuda.max_memory_allocated during the update (NaN on CPU)
    seconds: float  # the measured update's wall time
    loss: float
    checkpointed_layers: int = 0  # decoder layers with gradient checkpointing on

    @property
    def above_start_mib(self) -> float:
        return self.peak_mib - self.start_mib


@dataclass(frozen=True)
class FixedBatch:
    """The rows both trainers train on: ``N = B*G`` rows, group by group."""

    prompt_ids: list[list[int]]  # [N][P], the G rows of a group share one prompt
    completion_ids: list[list[int]]  # [N][<= L]
    advantages: list[float]  # [N], zero mean within each group

    @property
    def completion_tokens(self) -> int:
        return sum(len(ids) for ids in self.completion_ids)


def fixed_batch(workload: bench.Workload, seed: int) -> FixedBatch:
    """Random byte-level tokens (ids below 256, valid in every vocabulary here): one
    ``prompt_tokens`` prompt per group, completions of ``max_new_tokens // 2`` to
    ``max_new_tokens`` tokens, advantages normal with each group's mean removed."""
    generator = torch.Generator().manual_seed(seed)
    w = workload
    prompts, completions, advantages = [], [], []
    for _ in range(w.num_prompts):
        prompt = torch.randint(0, 256, (w.prompt_tokens,), generator=generator).tolist()
        group = torch.randn(w.group_size, generator=generator, dtype=torch.float64)
        advantages += (group - group.mean()).tolist()
        for _ in range(w.group_size):
            length = int(torch.randint(w.max_new_tokens // 2, w.max_new_tokens + 1, (1,),
                                       generator=generator))
            prompts.append(list(prompt))
            completions.append(torch.randint(0, 256, (length,), generator=generator).tolist())
    return FixedBatch(prompts, completions, advantages)


# ---------------------------------------------------------------------------------- memory
def _status_mib(key: str) -> float:
    return bench._proc_status_kib(key) / 1024


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
        handle.write("5")  # VmHWM := VmRSS


def _tensor_mib(tensors: Any) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def _optimizer_mib(optimizer: Any) -> float:
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the optimizer
    return _tensor_mib(v for state in inner.state.values() for v in state.values()
                       if isinstance(v, torch.Tensor))


# ---------------------------------------------------------------------------------- updates
class OursUpdate:
    """Our trainer's update on the fixed batch, as ``GRPOTrainer._update`` calls it."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, rows: list[dict[str, str]],
                 config: bench.BenchConfig, output_dir: Path, checkpointing: bool) -> None:
        self.trainer = bench.build_ours(model, tokenizer, rows, config, output_dir, bf16=False,
                                        gradient_checkpointing=checkpointing)
        self.model = self.trainer.unwrapped
        self.optimizer = self.trainer.optimizer

    def __call__(self, batch: FixedBatch) -> float:
        from mtgrpo.trainer.update import pad_policy_batch

        trainer = self.trainer
        policy = pad_policy_batch(
            batch.prompt_ids, batch.completion_ids,
            torch.tensor(batch.advantages, dtype=torch.float32), trainer.tokenizer.pad_token_id,
            device=trainer.accelerator.device)
        out = trainer.updater.update(policy, measure_after=trainer.needs_improvement,
                                     keep_old_logps=trainer.sampling_params.return_logprobs)
        return out.metrics["loss"]


class TRLUpdate:
    """TRL's update on the fixed batch: its loss on each micro-batch, then the optimizer step
    as transformers' training loop takes it (clipping, step, scheduler, zero_grad)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, rows: list[dict[str, str]],
                 config: bench.BenchConfig, output_dir: Path, checkpointing: bool) -> None:
        device = bench.bench_device(config)
        timer = bench.TRLStepTimer(bench.TrainerResult("trl", ""), bench.MemoryProbe(device),
                                   device, block=1)
        self.trainer = bench.build_trl(model, tokenizer, rows, config, output_dir,
                                       defaults=False, timer=timer,
                                       gradient_checkpointing=checkpointing)
        self.trainer.create_optimizer_and_scheduler(num_training_steps=config.steps)
        args = self.trainer.args
        if args.gradient_checkpointing:  # transformers turns it on in train(), not __init__
            kwargs = dict(args.gradient_checkpointing_kwargs or {})
            self.trainer.model.activation_checkpointing_enable(
                activation_checkpointing_kwargs=kwargs or None)
        # transformers' loop sets it per optimizer step; TRL's dapo normaliser reads it
        self.trainer.current_gradient_accumulation_steps = config.gradient_accumulation_steps
        self.micro_batch = config.workload.micro_batch
        self.model = self.trainer.model
        self.optimizer = self.trainer.optimizer

    def inputs(self, batch: FixedBatch) -> dict[str, torch.Tensor]:
        """The dict ``_generate_and_score_completions`` returns for these rows (no old or
        reference log-probs: one optimizer step per generation batch and ``beta = 0``)."""
        from mtgrpo.trainer.update import pad_policy_batch

        device = self.trainer.accelerator.device
        policy = pad_policy_batch(batch.prompt_ids, batch.completion_ids,
                                  torch.tensor(batch.advantages, dtype=torch.float32),
                                  self.trainer.processing_class.pad_token_id, device=device)
        return {
            "prompt_ids": policy.prompt_ids, "prompt_mask": policy.prompt_mask,
            "completion_ids": policy.completion_ids, "completion_mask": policy.completion_mask,
            "advantages": policy.advantages,
            "num_items_in_batch": policy.completion_mask.sum().to(device),
        }

    def __call__(self, batch: FixedBatch) -> float:
        trainer, inputs = self.trainer, self.inputs(batch)
        trainer.model.train()
        rows = inputs["advantages"].shape[0]
        total = 0.0
        for start in range(0, rows, self.micro_batch):
            part = {k: v if k == "num_items_in_batch" else v[start:start + self.micro_batch]
                    for k, v in inputs.items()}
            loss = trainer.compute_loss(trainer.model, part)
            trainer.accelerator.backward(loss)
            total += float(loss.detach())
        if trainer.args.max_grad_norm:
            trainer.accelerator.clip_grad_norm_(trainer.model.parameters(),
                                                trainer.args.max_grad_norm)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return total


def measure(setting: Setting) -> Measurement:
    """Build the setting's model and trainer in this process and measure its update (see the
    module docstring). Meant to run in a process of its own (:func:`run_isolated`)."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    from mtgrpo.models import build_tiny_tokenizer

    w = setting.workload
    config = bench.BenchConfig(workload=w, steps=max(2, setting.warmup + 1), seed=setting.seed)
    device = bench.bench_device(config)
    tokenizer = build_tiny_tokenizer(model_max_length=w.max_position_embeddings)
    model = bench.build_model(w, tokenizer, setting.seed).to(device)
    rows = bench.make_rows(tokenizer, 4 * w.num_prompts, w.prompt_tokens, setting.seed)
    batch = fixed_batch(w, setting.seed)
    update_type = OursUpdate if setting.trainer == "ours" else TRLUpdate
    with tempfile.TemporaryDirectory(prefix="bench-update-memory-") as tmp:
        update = update_type(model, tokenizer, rows, config, Path(tmp),
                             setting.gradient_checkpointing)
        build_peak = _status_mib("VmHWM")
        peaks, loss, seconds, start = [], math.nan, math.nan, math.nan
        for _ in range(setting.warmup + 1):
            bench._sync(device)
            start = _status_mib("VmRSS")
            _reset_peak()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            begin = time.perf_counter()
            loss = update(batch)
            bench._sync(device)
            seconds = time.perf_counter() - begin
            peaks.append(_status_mib("VmHWM"))
        trainable = [p for p in update.model.parameters() if p.requires_grad]
        return Measurement(
            setting=setting, parameters=sum(p.numel() for p in update.model.parameters()),
            rows=len(batch.advantages), completion_tokens=batch.completion_tokens,
            start_mib=start, peak_mib=peaks[-1], first_peak_mib=peaks[0],
            build_peak_mib=build_peak, parameters_mib=_tensor_mib(update.model.parameters()),
            gradients_mib=_tensor_mib(trainable), optimizer_mib=_optimizer_mib(update.optimizer),
            cuda_peak_mib=(torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda"
                           else math.nan),
            seconds=seconds, loss=loss,
            checkpointed_layers=sum(getattr(m, "gradient_checkpointing", False) is True
                                    for m in update.model.modules()
                                    if type(m).__name__.endswith("DecoderLayer")),
        )


def run_isolated(setting: Setting, *, nice: int = 0) -> Measurement:
    """:func:`measure` in a child process (``MALLOC_MMAP_THRESHOLD_=131072``, see the module
    docstring), which prints its result as one JSON line."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    command = [sys.executable, str(Path(__file__).resolve()), "--child",
               json.dumps(dataclasses.asdict(setting))]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False,
                          preexec_fn=(lambda: os.nice(nice)) if nice else None)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the {setting} process failed (exit {done.returncode}):\n"
                           f"{done.stderr[-4000:]}")
    fields = json.loads(lines[-1])
    fields["setting"] = Setting(**fields["setting"])
    return Measurement(**fields)


# ---------------------------------------------------------------------------------- the sweep
@dataclass(frozen=True)
class SweepConfig:
    """The settings to measure: every model x gradient checkpointing x trainer."""

    models: tuple[str, ...]
    checkpointing: tuple[bool, ...] = (False, True)
    trainers: tuple[str, ...] = TRAINERS
    warmup: int = 1
    seed: int = 0
    quick: bool = False
    command: str = ""

    def settings(self) -> list[Setting]:
        return [Setting(model, trainer, ckpt, self.warmup, self.seed, self.quick)
                for model in self.models for ckpt in self.checkpointing
                for trainer in self.trainers]


def run_sweep(config: SweepConfig, *, nice: int = 0) -> list[Measurement]:
    """Every setting in a process of its own, one at a time."""
    results = []
    for setting in config.settings():
        print(f"measuring {setting.model}, {setting.trainer}, {setting.label} ...",
              file=sys.stderr, flush=True)
        results.append(run_isolated(setting, nice=nice))
    return results


def machine() -> dict[str, str]:
    """The CPU (model name and its bf16 / AMX flags), the GPU if any, versions."""
    import accelerate
    import peft
    import transformers
    import trl

    from mtgrpo import __version__

    name, flags, memory = platform.processor() or platform.machine(), set(), "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as handle:
        text = handle.read()
        found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
        name = found.group(1) if found else name
        found = re.search(r"^flags\s*:\s*(.+)$", text, re.MULTILINE)
        flags = set(found.group(1).split()) if found else set()
    with contextlib.suppress(OSError):
        memory = f"{_meminfo_gib():.1f} GiB"
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    info = {
        "cpu": name,
        "cpu flags": ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in wanted),
        "cores": str(os.cpu_count()), "memory": memory,
        "torch threads": str(torch.get_num_threads()),
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "trl": trl.__version__,
        "peft": peft.__version__, "accelerate": accelerate.__version__, "mtgrpo": __version__,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _meminfo_gib() -> float:
    with open("/proc/meminfo", encoding="ascii") as handle:
        found = re.search(r"^MemTotal:\s+(\d+) kB", handle.read(), re.MULTILINE)
    if found is None:
        raise OSError("/proc/meminfo has no MemTotal")
    return int(found.group(1)) / 2**20


# ---------------------------------------------------------------------------------- output
def _ratio(ours: float, trl: float) -> str:
    return f"{ours / trl:.2f}" if trl > 0 and not math.isnan(ours) else "-"


def markdown_report(config: SweepConfig, results: Sequence[Measurement],
                    info: dict[str, str]) -> str:
    """The command, the machine, the workloads, the summary table (ours against TRL per model
    and setting: peak resident memory during the update) and every figure per process."""
    by_key = {(r.setting.model, r.setting.gradient_checkpointing, r.setting.trainer): r
              for r in results}
    lines = [
        "# Peak memory of one policy update: mtgrpo against TRL 1.16",
        "",
        f"Command: `{config.command}`",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()),
        "",
        "Each row is one process: model built, trainer built, "
        f"{config.warmup} warm-up update(s), then the measured update on the same fixed batch "
        "(float32, no autocast, `beta = 0`, loss `dapo`, each trainer's default AdamW; "
        "`MALLOC_MMAP_THRESHOLD_=131072`). MiB = 2^20 bytes.",
        "",
        "## Workloads",
        "",
        "| model | parameters | layers | hidden | vocabulary | rows | prompt tokens | "
        "completion tokens (total) | rows per micro-batch |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    seen = set()
    for r in results:
        w = r.setting.workload
        if w.name in seen:
            continue
        seen.add(w.name)
        vocab = w.vocab_size or 259
        lines.append(f"| {w.name} | {r.parameters / 1e6:.1f} M | {w.num_layers} | "
                     f"{w.hidden_size} | {vocab} | {r.rows} | {w.prompt_tokens} | "
                     f"{r.completion_tokens} | {w.micro_batch} |")
    lines += [
        "",
        "## Peak resident memory during the update",
        "",
        "| model | setting | ours MiB | TRL MiB | ratio (ours / TRL) |",
        "|---|---|---:|---:|---:|",
    ]
    for model in config.models:
        for ckpt in config.checkpointing:
            ours, trl = by_key.get((model, ckpt, "ours")), by_key.get((model, ckpt, "trl"))
            label = "grad ckpt on" if ckpt else "grad ckpt off"
            ours_mib = ours.peak_mib if ours else math.nan
            trl_mib = trl.peak_mib if trl else math.nan
            lines.append(f"| {model} | {label} | {ours_mib:.0f} | {trl_mib:.0f} | "
                         f"{_ratio(ours_mib, trl_mib)} |")
    lines += [
        "",
        "## Every figure",
        "",
        "*start*: resident at the update's start; *peak*: peak resident during it; *above "
        "start*: the difference; *params*, *grads*, *optimizer*: exact tensor bytes; *first "
        "update*: the peak of the first (warm-up) update, which allocates the optimizer "
        "state; *build*: the peak while the model and trainer were built; *CUDA*: "
        "`max_memory_allocated` during the update (GPU only); *ckpt layers*: decoder layers "
        "with gradient checkpointing on.",
        "",
        "| model | setting | trainer | start | peak | above start | params | grads | "
        "optimizer | first update | build | CUDA | update s | loss | ckpt layers |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        s = r.setting
        cuda = "-" if math.isnan(r.cuda_peak_mib) else f"{r.cuda_peak_mib:.0f}"
        lines.append(
            f"| {s.model} | {s.label} | {s.trainer} | {r.start_mib:.0f} | {r.peak_mib:.0f} | "
            f"{r.above_start_mib:.0f} | {r.parameters_mib:.0f} | {r.gradients_mib:.0f} | "
            f"{r.optimizer_mib:.0f} | {r.first_peak_mib:.0f} | {r.build_peak_mib:.0f} | "
            f"{cuda} | {r.seconds:.3g} | {r.loss:.4g} | {r.checkpointed_layers} |")
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Peak memory of one update, mtgrpo vs TRL, each setting in its own process.")
    parser.add_argument("--models", default=",".join(MODELS.names()),
                        help=f"comma-separated, from: {', '.join(MODELS.names())}")
    parser.add_argument("--quick", action="store_true",
                        help="the tiny model only, on a smaller batch (seconds per setting)")
    parser.add_argument("--checkpointing", default="off,on",
                        help="gradient checkpointing settings to measure: off, on or off,on")
    parser.add_argument("--trainers", default=",".join(TRAINERS), help="ours, trl or both")
    parser.add_argument("--warmup", type=int, default=1,
                        help="updates before the measured one (the first allocates the "
                        "optimizer state)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nice", type=int, default=0, help="niceness of the child processes")
    parser.add_argument("--out", type=Path, default=None, help="write the report to this file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser


def config_from_args(argv: Sequence[str]) -> tuple[SweepConfig, Any]:
    options = _parser().parse_args(list(argv))
    models = ("tiny",) if options.quick else tuple(
        m.strip() for m in options.models.split(",") if m.strip())
    for model in models:
        MODELS.get(model)
    choices = {"off": False, "on": True}
    ckpt = tuple(options.checkpointing.split(","))
    if not ckpt or any(c not in choices for c in ckpt):
        raise ValueError(f"--checkpointing {options.checkpointing!r}: use off, on or off,on")
    trainers = tuple(options.trainers.split(","))
    if not trainers or any(t not in TRAINERS for t in trainers):
        raise ValueError(f"--trainers {options.trainers!r}: use a subset of {TRAINERS}")
    config = SweepConfig(
        models=models, checkpointing=tuple(choices[c] for c in ckpt), trainers=trainers,
        warmup=options.warmup, seed=options.seed, quick=options.quick,
        command=shlex.join(["python", "benchmarks/update_memory.py", *argv]),
    )
    return config, options


def main(argv: Sequence[str] | None = None) -> str:
    """Measure every setting, print the Markdown report (and write it to ``--out``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    config, options = config_from_args(argv)
    if options.child is not None:
        result = measure(Setting(**json.loads(options.child)))
        print(json.dumps(dataclasses.asdict(result)))
        return ""
    text = markdown_report(config, run_sweep(config, nice=options.nice), machine())
    print(text)
    if options.out is not None:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(text, encoding="utf-8")
    return text


if __name__ == "__main__":
    main()
