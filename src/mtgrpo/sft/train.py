"""The SFT loop: token-mean cross-entropy on completion tokens, AdamW, atomic saves.

Loss of one optimizer step over its examples ``E`` (each with target tokens ``T_e``: the
completion and its EOS, or every token after the first without ``completion_only_loss``)::

    L = - (1 / Σ_e |T_e|) Σ_e Σ_{t ∈ T_e} log p_θ(y_t | y_<t)

the token mean over the whole step (TRL's ``SFTTrainer`` with the HF ``Trainer``'s
``num_items_in_batch`` normalisation, transformers ≥ 4.46), so neither the micro-batch split
nor the padding changes the gradient. Log-probabilities come from
:func:`mtgrpo.policy.sequence_logprobs` on the GRPO layout (see :mod:`mtgrpo.sft.data`):
the same positions as in a rollout, and no float32 ``[N, L, V]`` logits tensor.

Each step takes ``per_device_train_batch_size × gradient_accumulation_steps`` examples in a
seeded random order (a new permutation per epoch; an epoch's last step takes the remainder) and
packs them into length-sorted micro-batches (:func:`mtgrpo.policy.plan_micro_batches`), by row
count or by ``max_tokens_per_microbatch``. Optimizer, schedule and clipping are the policy
room's (:func:`~mtgrpo.policy.build_optimizer`, :func:`~mtgrpo.policy.build_scheduler`,
:func:`~mtgrpo.policy.clip_gradients`). Single process; no resume (a warm start is short).

Output directory: ``metrics.jsonl`` (one record per ``logging_steps``, ``split`` ``"train"``
or ``"eval"``), ``sft_config.json`` (the resolved options), ``model/`` (``save_pretrained`` of
the model and tokenizer: the LoRA adapter with LoRA, the merged full model with
``merge_lora``) and, with ``merge_lora``, ``adapter/``. Each directory is written to a
temporary sibling and renamed into place, so a crash never leaves half a model.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from mtgrpo._files import write_atomically
from mtgrpo._progress import progress
from mtgrpo.models.precision import model_width, resolve_bf16
from mtgrpo.policy import (
    build_optimizer,
    build_scheduler,
    clip_gradients,
    plan_micro_batches,
    sequence_logprobs,
)
from mtgrpo.reporting import MetricsWriter
from mtgrpo.sft.config import SFTConfig
from mtgrpo.sft.data import (
    SFTBatch,
    SFTExample,
    collate_examples,
    encode_examples,
    example_lengths,
    prompt_completion_pairs,
)

logger = logging.getLogger(__name__)

__all__ = [
    "SFTResult",
    "accumulate_step_gradients",
    "completion_cross_entropy",
    "sft_train",
    "step_schedule",
]


@dataclass
class SFTResult:
    """What :func:`sft_train` did and where it saved the model.

    ``model`` is the trained model in eval mode (with ``merge_lora``, the merged base model);
    ``model_dir`` loads with ``from_pretrained`` (``AutoPeftModelForCausalLM`` for an adapter,
    ``mtgrpo.models.load_model`` for a full or merged model).
    """

    model: Any
    output_dir: Path
    model_dir: Path
    adapter_dir: Path | None
    steps: int
    losses: list[float]  # [steps] token-mean cross-entropy of each optimizer step
    eval_loss: float | None
    num_train_examples: int
    num_eval_examples: int
    trained_tokens: int  # loss tokens over all steps
    seconds: float

    @property
    def final_loss(self) -> float:
        return self.losses[-1]


@dataclass
class _StepStats:
    loss_sum: float  # summed cross-entropy (nats) over the step's target tokens
    target_tokens: int
    tokens: int  # non-padding tokens forwarded
    grad_norm: float
    learning_rate: float
    seconds: float


@dataclass
class _Window:
    """Steps since the last train record."""

    steps: list[_StepStats] = field(default_factory=list)

    def record(self, step: int, epoch: float) -> dict[str, Any]:
        targets = sum(s.target_tokens for s in self.steps)
        seconds = sum(s.seconds for s in self.steps)
        last = self.steps[-1]
        return {
            "step": step,
            "split": "train",
            "loss": sum(s.loss_sum for s in self.steps) / targets,
            "learning_rate": last.learning_rate,
            "grad_norm": last.grad_norm,
            "epoch": epoch,
            "tokens/trained": targets,
            "throughput/tokens_per_second": sum(s.tokens for s in self.steps) / seconds,
            "time/step": seconds / len(self.steps),
        }


def completion_cross_entropy(model: nn.Module, batch: SFTBatch) -> Tensor:
    """Summed cross-entropy (nats, float32 scalar) of ``batch``'s target tokens.

    ``-Σ_{n,t} target_mask[n, t] · log p_θ(input_ids[n, P + t] | input_ids[n, :P + t])``; divide
    by the step's target-token count for the token-mean loss.
    """
    scored = sequence_logprobs(
        # The model's own distribution: SFT scores unscaled logits.
        model, batch.input_ids, batch.attention_mask, batch.target_length, temperature=1.0
    )
    return -(scored.logps * batch.target_mask).sum()  # logps: [N, L]


def _micro_batches(examples: Sequence[SFTExample], config: SFTConfig) -> list[list[int]]:
    budget = config.max_tokens_per_microbatch
    return plan_micro_batches(
        example_lengths(examples, config.completion_only_loss),
        # No token budget: micro-batches are capped by row count instead.
        budget if budget is not None else sys.maxsize,
        max_rows=None if budget is not None else config.per_device_train_batch_size,
    )


def accumulate_step_gradients(
    model: nn.Module, examples: Sequence[SFTExample], config: SFTConfig, pad_token_id: int,
    device: torch.device,
) -> tuple[float, int, int]:
    """Backward passes of one optimizer step over ``examples``, micro-batch by micro-batch.

    Adds ``∇L`` (the step's token-mean loss, module docstring) to the parameters' ``.grad``;
    returns ``(summed cross-entropy, target tokens, non-padding tokens forwarded)``.
    """
    step_targets = sum(target for _, target in example_lengths(examples,
                                                               config.completion_only_loss))
    loss_sum, tokens = 0.0, 0
    for rows in _micro_batches(examples, config):
        batch = collate_examples(
            [examples[i] for i in rows], pad_token_id=pad_token_id,
            completion_only_loss=config.completion_only_loss, device=device,
        )
        with torch.autocast(device.type, dtype=torch.bfloat16,
                            enabled=resolve_bf16(config.bf16, device.type,
                                                 model_width(model))[0]):
            summed = completion_cross_entropy(model, batch)
        # Normalised by the whole step's target tokens: accumulated gradients = token mean.
        (summed / step_targets).backward()
        loss_sum += float(summed.detach())
        tokens += batch.num_tokens
    return loss_sum, step_targets, tokens


def _optimizer_step(
    model: nn.Module, examples: Sequence[SFTExample], config: SFTConfig,
    optimizer: torch.optim.Optimizer, scheduler: Any, pad_token_id: int, device: torch.device,
) -> _StepStats:
    start = time.perf_counter()
    loss_sum, targets, tokens = accumulate_step_gradients(model, examples, config, pad_token_id,
                                                          device)
    # 0 turns clipping off; clip_gradients then only measures the norm.
    grad_norm = clip_gradients(model, config.max_grad_norm or None)
    # The rate this step uses, read before scheduler.step() advances it.
    learning_rate = float(scheduler.get_last_lr()[0])
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return _StepStats(loss_sum, targets, tokens, float(grad_norm), learning_rate,
                      time.perf_counter() - start)


@torch.no_grad()
def _eval_loss(
    model: nn.Module, examples: Sequence[SFTExample], config: SFTConfig, pad_token_id: int,
    device: torch.device,
) -> float:
    """Token-mean cross-entropy over the held-out examples (model in eval mode meanwhile)."""
    model.eval()
    loss_sum, targets = 0.0, 0
    for rows in _micro_batches(examples, config):
        batch = collate_examples(
            [examples[i] for i in rows], pad_token_id=pad_token_id,
            completion_only_loss=config.completion_only_loss, device=device,
        )
        with torch.autocast(device.type, dtype=torch.bfloat16,
                            enabled=resolve_bf16(config.bf16, device.type,
                                                 model_width(model))[0]):
            loss_sum += float(completion_cross_entropy(model, batch))
        targets += batch.num_target_tokens
    model.train()
    return loss_sum / targets


def step_schedule(
    num_examples: int, examples_per_step: int, total_steps: int, seed: int
) -> Iterator[list[int]]:
    """Example indices of each optimizer step: a seeded permutation per epoch, cut into
    ``examples_per_step`` chunks (the last chunk of an epoch is the remainder), for
    ``total_steps`` steps."""
    step, epoch = 0, 0
    while True:
        # Each epoch's order from (seed, epoch) alone.
        order = np.random.default_rng([seed, epoch]).permutation(num_examples)
        for start in range(0, num_examples, examples_per_step):
            if step == total_steps:
                return
            yield order[start:start + examples_per_step].tolist()
            step += 1
        epoch += 1


def _hold_out(
    examples: list[SFTExample], fraction: float, seed: int
) -> tuple[list[SFTExample], list[SFTExample]]:
    if fraction == 0:
        return examples, []
    # A nonzero fraction holds out at least one example.
    count = max(1, round(fraction * len(examples)))
    if count >= len(examples):
        raise ValueError(
            f"eval_fraction={fraction} of {len(examples)} example(s) leaves none to train on; "
            "lower eval_fraction or add examples"
        )
    # [seed, 2**20]: a stream apart from the epoch orders, which use [seed, epoch]
    order = np.random.default_rng([seed, 1 << 20]).permutation(len(examples)).tolist()
    held = set(order[:count])
    train = [e for i, e in enumerate(examples) if i not in held]
    return train, [examples[i] for i in sorted(held)]  # held-out examples in their input order


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)  # numpy's legacy seed must fit in 32 bits
    torch.manual_seed(seed)


def earlier_run_files(output_dir: str | PathLike) -> list[str]:
    """What of an earlier SFT run ``output_dir`` holds (``metrics.jsonl``, ``model``,
    ``adapter``): a new run refuses to mix with them unless told to replace them."""
    out = Path(output_dir)
    return [name for name in ("metrics.jsonl", "model", "adapter") if (out / name).exists()]


def _prepare_output_dir(config: SFTConfig) -> Path:
    out = Path(config.output_dir)
    taken = earlier_run_files(out)
    if taken and not config.overwrite_output_dir:
        raise ValueError(
            f"output_dir {str(out)!r} already holds an SFT run ({', '.join(taken)}); pass a new "
            "output_dir, or set overwrite_output_dir=True (mtgrpo sft: --overwrite-output-dir) "
            "to replace it"
        )
    for name in taken:  # overwrite_output_dir: nothing of the earlier run may mix in
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return out


def _prepare_model(model: Any, tokenizer: Any, peft_config: Any, seed: int) -> tuple[Any, Any]:
    """Load a model spec if needed, attach LoRA (seeded), and put the model in train mode."""
    from mtgrpo.models import apply_lora, load_model, load_tokenizer

    loaded = model if isinstance(model, nn.Module) else load_model(model, for_training=True)
    tokenizer = load_tokenizer(tokenizer if tokenizer is not None else (
        model if isinstance(model, str | PathLike | Mapping) else loaded
    ))
    _seed_everything(seed)  # before apply_lora, so the adapter's random init is seeded too
    if peft_config is not None:
        loaded = apply_lora(loaded, peft_config)
    loaded.train()
    return loaded, tokenizer


def _check_positions(model: nn.Module, examples: Sequence[SFTExample]) -> None:
    """Refuse examples longer than the model's positions, as the GRPO trainer refuses such
    lengths: the tail would sit at positions the model never saw."""
    config = getattr(model, "config", None)
    limit = getattr(config, "max_position_embeddings", None) if config is not None else None
    if not isinstance(limit, int):
        return
    lengths = [len(e.prompt_ids) + len(e.completion_ids) for e in examples]
    longer = sum(length > limit for length in lengths)
    if longer:
        raise ValueError(
            f"{longer} of {len(examples)} examples (longest {max(lengths)} tokens) are longer "
            f"than the model's max_position_embeddings={limit}; set max_prompt_length to the "
            f"GRPO run's (prompts keep their last tokens), max_length <= {limit} (cuts "
            "completions), or use a shorter prompt format"
        )


def _is_peft(model: Any) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def _save(model: Any, tokenizer: Any, out: Path, merge_lora: bool) -> tuple[Any, Path, Path | None]:
    """Save atomically; returns the model (merged when asked), ``model/`` and ``adapter/``."""

    def writer(target: Any) -> Any:
        def write(tmp: Path) -> None:
            # Safetensors: loading the checkpoint never unpickles.
            target.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)

        return write

    adapter_dir = None
    if merge_lora:
        # Before merging: merge_and_unload leaves no adapter to save.
        adapter_dir = write_atomically(out / "adapter", writer(model))
        model = model.merge_and_unload()
    return model, write_atomically(out / "model", writer(model)), adapter_dir


def _write_options(out: Path, config: SFTConfig, model: Any) -> None:
    options: dict[str, Any] = {"sft": config.to_dict()}
    if _is_peft(model):
        options["lora"] = model.peft_config["default"].to_dict()
    text = json.dumps(options, indent=2, sort_keys=True,
                      # Peft stores target_modules as a set: written as a sorted list.
                      default=lambda o: sorted(o) if isinstance(o, set | frozenset) else str(o))
    (out / "sft_config.json").write_text(text + "\n", encoding="utf-8")


def sft_train(
    model: Any,
    tokenizer: Any,
    rows: Iterable[Mapping[str, Any]],
    config: SFTConfig | None = None,
    peft_config: Any = None,
    *,
    prompt_column: str = "prompt",
    completion_column: str = "completion",
    messages_column: str = "messages",
) -> SFTResult:
    """Supervised fine-tuning of ``model`` on (prompt, completion) rows; see the module docstring.

    ``model``: a loaded causal LM (trained in place) or a spec :func:`mtgrpo.models.load_model`
    reads (path, hub id, GGUF file). ``tokenizer``: a tokenizer, or ``None`` to load the model's.
    ``rows``: prompt-completion rows or ``messages`` rows (:mod:`mtgrpo.sft.data`); task rows
    with gold answers go through :func:`mtgrpo.sft.solutions_from_rows` first. ``peft_config``:
    a ``peft.LoraConfig`` or a mapping of its fields to train a LoRA adapter
    (:func:`mtgrpo.models.apply_lora`); a model that already has one trains it as it is.

    Input errors (columns, test rows, output directory, ``merge_lora`` without LoRA, examples
    longer than the model's positions) are raised before any training; a non-finite loss raises
    ``FloatingPointError`` and saves nothing.
    """
    config = config if config is not None else SFTConfig()
    pairs = prompt_completion_pairs(rows, prompt_column=prompt_column,
                                    completion_column=completion_column,
                                    messages_column=messages_column)
    if config.merge_lora and peft_config is None and not _is_peft(model):
        raise ValueError(
            "merge_lora=True but the model has no LoRA adapter; pass peft_config (--lora) or "
            "drop merge_lora"
        )
    out = _prepare_output_dir(config)
    model, tokenizer = _prepare_model(model, tokenizer, peft_config, config.seed)
    encoded = encode_examples(pairs, tokenizer, max_length=config.max_length,
                              on_long_example=config.on_long_example,
                              max_prompt_length=config.max_prompt_length)
    _check_positions(model, encoded.examples)
    train, held_out = _hold_out(encoded.examples, config.eval_fraction, config.seed)
    _write_options(out, config, model)
    start = time.perf_counter()
    losses, eval_loss = _train_loop(model, tokenizer, train, held_out, config, out)
    model.eval()
    model, model_dir, adapter_dir = _save(model, tokenizer, out, config.merge_lora)
    return SFTResult(
        model=model, output_dir=out, model_dir=model_dir, adapter_dir=adapter_dir,
        steps=len(losses), losses=[loss for loss, _ in losses], eval_loss=eval_loss,
        num_train_examples=len(train), num_eval_examples=len(held_out),
        trained_tokens=sum(tokens for _, tokens in losses),
        seconds=time.perf_counter() - start,
    )


def _train_loop(
    model: nn.Module, tokenizer: Any, train: list[SFTExample], held_out: list[SFTExample],
    config: SFTConfig, out: Path,
) -> tuple[list[tuple[float, int]], float | None]:
    """Run every optimizer step; returns ``(loss, target tokens)`` per step and the last
    eval loss."""
    device = next(model.parameters()).device
    # No pad token (many causal LMs): pad with EOS, masked out anyway.
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
        else tokenizer.eos_token_id
    total = config.total_steps(len(train))
    optimizer = build_optimizer(model, config.learning_rate, config.weight_decay)
    scheduler = build_scheduler(optimizer, config.lr_scheduler_type, total_steps=total,
                                warmup_ratio=config.warmup_ratio)
    steps: list[tuple[float, int]] = []
    eval_loss, window, seen = None, _Window(), 0
    # a bar with the loss and ETA (plain lines in a log); the logger keeps its logging_steps
    with MetricsWriter(out / "metrics.jsonl") as writer, progress("warm start", total) as bar:
        schedule = step_schedule(len(train), config.examples_per_step, total, config.seed)
        for step, indices in enumerate(schedule, start=1):
            stats = _optimizer_step(model, [train[i] for i in indices], config, optimizer,
                                    scheduler, pad_token_id, device)
            if not math.isfinite(stats.loss_sum):
                raise FloatingPointError(
                    f"the loss is {stats.loss_sum} at step {step}; lower learning_rate, or turn "
                    "off bf16 if the model overflows in bfloat16"
                )
            steps.append((stats.loss_sum / stats.target_tokens, stats.target_tokens))
            window.steps.append(stats)
            seen += len(indices)
            bar.update(step, status=f"loss {steps[-1][0]:.4f}  lr {stats.learning_rate:.3g}")
            if step % config.logging_steps == 0 or step == total:  # the last step always logs
                record = window.record(step, seen / len(train))
                writer.write(record)
                logger.info("step %d/%d  loss %.4f  lr %.3g", step, total, record["loss"],
                            record["learning_rate"])
                window = _Window()
            if held_out and (step == total or (config.eval_steps and
                                               step % config.eval_steps == 0)):
                eval_loss = _eval_loss(model, held_out, config, pad_token_id, device)
                writer.write({"step": step, "split": "eval", "loss": eval_loss})
                logger.info("step %d/%d  eval loss %.4f", step, total, eval_loss)
    return steps, eval_loss
