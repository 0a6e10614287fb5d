"""The multi-task GRPO training loop.

One training step, read top to bottom (:meth:`GRPOTrainer.training_step`)::

    weights = weighting.weights                           # z over K tasks
    batch   = sampler.build(weights, B, rollouts)         # generate + score, filter, compose
    adv     = compute_advantages(batch rewards, G, ...)   # [B*G]
    out     = updater.update(policy batch)                # optimizer step(s); I_k if needed
    weighting.update(TaskStats.from_rollouts(...))        # J_k, I_k, |A| per task
    log(metrics)

Everything algorithmic lives in the pure modules; this file wires them to a model, an
optimizer and ``accelerate``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mtgrpo.advantages import compute_advantages
from mtgrpo.config import GRPOConfig
from mtgrpo.policy import build_optimizer, build_scheduler
from mtgrpo.policy.logprobs import resolve_logprob_path
from mtgrpo.reporting import MetricsWriter, Trackers, check_trackers_available
from mtgrpo.rewards.accuracy import accuracy_channel_index
from mtgrpo.rollout import SamplingParams, backend_description
from mtgrpo.sampling import ScoredGroup, make_sampler
from mtgrpo.trainer import checkpoint as ckpt
from mtgrpo.trainer.data import PromptSet, is_lazy_split
from mtgrpo.trainer.metrics import channel_metrics, length_metrics, task_metrics
from mtgrpo.trainer.rollouts import GroupPayload, RolloutWorker, Shard
from mtgrpo.trainer.setup import (
    build_backend,
    build_reward_suite,
    load_policy,
    training_rows,
)
from mtgrpo.trainer.update import PolicyUpdater, pad_policy_batch
from mtgrpo.weighting import TaskStats, improvement_by_task, make_weighting

logger = logging.getLogger(__name__)

__all__ = ["GRPOTrainer"]


def _task_names(rows: Any) -> list[str]:
    if is_lazy_split(rows):
        return sorted(rows.task_ids)
    return sorted({str(row["task"]) for row in rows})


def _check_context_length(model: Any, args: GRPOConfig) -> None:
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if limit is None or args.max_prompt_length is None:
        return
    needed = args.max_prompt_length + args.max_completion_length
    if needed > limit:
        raise ValueError(
            f"max_prompt_length ({args.max_prompt_length}) + max_completion_length "
            f"({args.max_completion_length}) = {needed} tokens exceeds the model's "
            f"max_position_embeddings={limit}; lower one of them"
        )


_RUN_OUTPUTS = ("metrics.jsonl", "completions.jsonl", "rollouts.jsonl", "config.yaml")


def _set_aside_previous_run(output_dir: Path) -> Path | None:
    """A fresh run in a directory that holds an earlier run: move the earlier run's logs and
    checkpoints into ``previous-<time>/`` (nothing is deleted) so the new logs start clean."""
    old = [output_dir / name for name in _RUN_OUTPUTS if (output_dir / name).exists()]
    old += ckpt.list_checkpoints(output_dir)
    if not old:
        return None
    stamp = time.strftime("previous-%Y%m%d-%H%M%S")
    target, number = output_dir / stamp, 1
    while target.exists():
        target, number = output_dir / f"{stamp}-{number}", number + 1
    target.mkdir()
    for path in old:
        path.rename(target / path.name)
    logger.warning("%s held an earlier run; its logs and checkpoints were moved to %s "
                   "(use resume_from_checkpoint to continue it instead)", output_dir, target)
    return target


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class GRPOTrainer:
    """Multi-task GRPO with TRL's ``GRPOTrainer`` interface.

    Args:
        model: a hub name, a local path (directory or ``.gguf`` file), a mapping
            ``{"path": ..., "gguf_file": ...}``, or a loaded causal LM.
        reward_funcs: a reward function, a list of them, a routing table
            ``{task: [functions]}`` (``"*"`` = every task), reward models (a path or a loaded
            sequence-classification model) or registered names (``"countdown_reward"``).
        args: :class:`~mtgrpo.config.GRPOConfig`.
        train_dataset: a ``datasets.Dataset``, a list of dicts, or a path (JSONL, JSON,
            parquet, CSV) with a prompt column and a task column (``args.task_column``).
        eval_dataset: same forms; evaluated every ``args.eval_steps`` steps.
        processing_class: the tokenizer (default: loaded from ``model``).
        peft_config: a ``peft.LoraConfig`` or a dict of its fields; trains a LoRA adapter and
            uses the adapter-disabled model as the reference policy.
        generation_backend: a backend object implementing
            :class:`mtgrpo.rollout.GenerationBackend` (overrides ``args.generation_backend``).
        run_config: the resolved run configuration to write as ``config.yaml`` (the CLI passes
            the whole YAML tree; by default the training arguments are written).
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        peft_config: Any = None,
        *,
        generation_backend: Any = None,
        run_config: Mapping[str, Any] | None = None,
    ) -> None:
        from accelerate import Accelerator

        self.args = args = args if args is not None else GRPOConfig()
        if train_dataset is None:
            raise ValueError("train_dataset is required: a Dataset, a list of dicts or a path")
        check_trackers_available(args.report_to)
        train_rows, eval_rows = training_rows(train_dataset, eval_dataset, args.task_column)
        self.rewards = build_reward_suite(reward_funcs, args)
        task_names = _task_names(train_rows)
        self.rewards.validate_tasks(task_names)
        if eval_rows is not None:
            self.rewards.validate_tasks(_task_names(eval_rows))
        self.accuracy_channel = accuracy_channel_index(self.rewards.channel_names,
                                                       args.accuracy_reward)
        self.run_config = dict(run_config) if run_config is not None else None

        self.accelerator = Accelerator(
            cpu=not torch.cuda.is_available(), mixed_precision="bf16" if args.bf16 else "no"
        )
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes
        self.prompts_per_step = args.resolved_prompts_per_step(self.world)
        _seed_everything(args.seed)  # same initialisation (e.g. LoRA) on every process
        self.model, self.tokenizer, self.is_peft = load_policy(
            model, processing_class, peft_config, args
        )
        _check_context_length(self.model, args)
        self.train_prompts = PromptSet(
            train_rows, self.tokenizer, max_prompt_length=args.max_prompt_length,
            on_long_prompt=args.on_long_prompt, task_names=task_names,
        )
        self.train_prompts.tokenize_all()
        self.eval_prompts = None
        if eval_rows is not None:
            self.eval_prompts = PromptSet(
                eval_rows, self.tokenizer, max_prompt_length=args.max_prompt_length,
                on_long_prompt=args.on_long_prompt,
            )
            self.eval_prompts.tokenize_all()
        self.task_names = task_names
        self._build_algorithms()
        self._build_optimisation(generation_backend)
        self.step = 0
        self.output_dir = Path(args.output_dir)
        _seed_everything(args.seed + self.rank)  # distinct sampling streams per process

    # ------------------------------------------------------------------ construction
    def _build_algorithms(self) -> None:
        args = self.args
        self.weighting = make_weighting(
            args.task_weighting, len(self.task_names), task_names=self.task_names,
            **args.task_weighting_params,
        )
        self.sampler = make_sampler(
            args.batch_construction, self.train_prompts.prompt_tasks, len(self.task_names),
            seed=args.seed, zero_gradient_filter=args.zero_gradient_filter,
            **args.batch_construction_params,
        )
        self.needs_improvement = "improvement" in getattr(self.weighting, "REQUIRES", ())

    def _build_optimisation(self, generation_backend: Any) -> None:
        args = self.args
        reference_model = None
        if args.beta > 0 and not self.is_peft:
            reference_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        optimizer = build_optimizer(
            self.model, args.learning_rate, weight_decay=args.weight_decay,
            betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon,
        )
        self.scheduler = build_scheduler(
            optimizer, args.lr_scheduler_type, total_steps=args.total_optimizer_steps(),
            warmup_steps=args.resolved_warmup_steps(),
        )
        self.model, self.optimizer = self.accelerator.prepare(self.model, optimizer)
        if reference_model is not None:
            reference_model.to(self.accelerator.device)
        self.unwrapped = self.accelerator.unwrap_model(self.model)
        self.backend = build_backend(generation_backend, self.unwrapped, self.tokenizer, args)
        self.sampling_params = SamplingParams(
            max_new_tokens=args.max_completion_length, temperature=args.temperature,
            top_p=args.top_p, top_k=args.top_k,
        )
        reference = None
        if args.beta > 0 and self.is_peft:
            from mtgrpo.models import reference_mode

            def reference() -> contextlib.AbstractContextManager[Any]:
                return reference_mode(self.unwrapped)

        self.updater = PolicyUpdater(
            args, self.model, self.optimizer, self.scheduler, self.accelerator,
            reference_model=reference_model, reference=reference,
        )
        shard = Shard(self.rank, self.world, gather=self._gather_objects)
        self.rollouts = RolloutWorker(
            self.train_prompts, self.backend, self.rewards, self.sampling_params,
            args.num_generations, self.tokenizer, accuracy_threshold=args.accuracy_threshold,
            accuracy_channel=self.accuracy_channel, shard=shard,
        )

    def _gather_objects(self, local: list[Any]) -> list[Any]:
        from accelerate.utils import gather_object

        return gather_object(local)

    @property
    def is_main_process(self) -> bool:
        return self.accelerator.is_main_process

    # ------------------------------------------------------------------ one step
    def _advantages(self, groups: list[ScoredGroup]):
        args = self.args
        values = np.concatenate([g.rewards for g in groups])  # [N, R]
        return compute_advantages(
            torch.from_numpy(values), args.num_generations,
            reward_weights=self.rewards.reward_weights,
            aggregation=args.multi_objective_aggregation, scale_rewards=args.scale_rewards,
            gates=self.rewards.gates, none_handling=args.none_handling,
            on_unscorable=args.on_unscorable, eps=args.advantage_epsilon,
        )

    def _local_policy_batch(self, groups: list[ScoredGroup], advantages: torch.Tensor):
        """This process's share of whole groups as a padded policy batch, and its task ids."""
        g = self.args.num_generations
        start, stop = Shard(self.rank, self.world).bounds(len(groups))
        local = list(range(start, stop))
        has_rows = bool(local)
        weight = [True] * (len(local) * g)
        if not has_rows:  # keep collective operations in step: one fully masked padding group
            local, weight = [0], [False] * g
        payloads: list[GroupPayload] = [groups[i].payload for i in local]
        if self.args.mask_truncated_completions:
            finished = [f for p in payloads for f in p.finished]
            weight = [w and f for w, f in zip(weight, finished, strict=True)]
        rows = torch.cat([advantages[i * g:(i + 1) * g] for i in local])
        batch = pad_policy_batch(
            [p.prompt_ids for p in payloads for _ in range(g)],
            [c for p in payloads for c in p.completion_ids], rows,
            self.tokenizer.pad_token_id, completion_weight=weight,
            device=self.accelerator.device,
        )
        tasks = np.repeat([groups[i].task for i in local], g)
        return batch, tasks, has_rows

    def _improvement(self, tasks: np.ndarray, before: np.ndarray, after: np.ndarray,
                     has_rows: bool) -> np.ndarray:
        local = list(zip(tasks.tolist(), before.tolist(), after.tolist(), strict=True)) \
            if has_rows else []
        rows = self._gather_objects(local) if self.world > 1 else local
        k = len(self.task_names)
        if not rows:
            return np.full(k, math.nan)
        t, b, a = (np.array(col) for col in zip(*rows, strict=True))
        return improvement_by_task(t, b, a, k, self.args.improvement_reduction)

    def training_step(self) -> dict[str, Any]:
        """Build a batch, update the policy and the task weights; return the step's metrics."""
        args, begin = self.args, time.perf_counter()
        weights = self.weighting.weights
        self.rollouts.reset()
        groups, report = self.sampler.build(weights, self.prompts_per_step, self.rollouts)
        generated = self.rollouts.generated
        all_adv = self._advantages(generated)
        metrics: dict[str, Any] = {}
        update_begin = time.perf_counter()
        improvement = None
        if groups:
            adv = self._advantages(groups)
            batch, tasks, has_rows = self._local_policy_batch(groups, adv.advantages)
            out = self.updater.update(batch, measure_after=self.needs_improvement)
            metrics.update(out.metrics)
            if self.needs_improvement:
                improvement = self._improvement(tasks, out.objective_before,
                                                out.objective_after, has_rows)
            self._log_batch_rollouts(groups, adv.advantages)
        else:
            logger.warning("step %d: no informative group was generated; update skipped",
                           self.step + 1)
            metrics["update_skipped"] = 1.0
            if self.needs_improvement:  # nothing was trained, so no change was measured
                improvement = np.full(len(self.task_names), math.nan)
        update_seconds = time.perf_counter() - update_begin
        weighting_begin = time.perf_counter()
        row_tasks = np.concatenate([np.full(g.group_size, g.task) for g in generated])
        stats = TaskStats.from_rollouts(
            row_tasks, np.concatenate([g.correct for g in generated]), len(self.task_names),
            abs_advantages=all_adv.advantages.abs().numpy(), improvement=improvement,
        )
        self.weighting.update(stats)
        weighting_seconds = time.perf_counter() - weighting_begin
        self.step += 1
        values = np.concatenate([g.rewards for g in generated])
        scalar = all_adv.scalar_rewards.numpy()
        metrics.update(task_metrics(self.task_names, generated, scalar,
                                    all_adv.zero_gradient.numpy(), weights, report, improvement))
        errors = [g.payload.reward_errors for g in generated]
        errors = np.concatenate(errors) if generated and all(e is not None for e in errors) \
            else None
        metrics.update(channel_metrics(self.rewards.channel_names, values, scalar, errors))
        metrics.update(self._rollout_metrics(generated, report))
        step_seconds = time.perf_counter() - begin
        metrics.update({
            "time/generate": self.rollouts.seconds["generate"],
            "time/score": self.rollouts.seconds["score"],
            "time/update": update_seconds, "time/weighting": weighting_seconds,
            "time/step": step_seconds,
            "throughput/tokens_per_second": self.rollouts.tokens_generated
            / max(self.rollouts.seconds["generate"], 1e-9),
        })
        if args.save_rollouts and self.is_main_process:
            self._save_rollouts(generated, all_adv.advantages)
        return metrics

    def _rollout_metrics(self, generated: list[ScoredGroup], report: Any) -> dict[str, Any]:
        lengths = np.array([len(c) for g in generated for c in g.payload.completion_ids])
        finished = np.array([f for g in generated for f in g.payload.finished], dtype=bool)
        out = length_metrics(lengths, finished)
        out.update({
            "sampling/rounds": report.rounds,
            "sampling/prompts_generated": report.prompts_generated,
            "sampling/prompts_per_informative_group": report.prompts_per_informative_group,
            "sampling/batch_groups": report.batch_size,
        })
        return out

    # ------------------------------------------------------------------ outputs
    def _jsonl(self, name: str, records: list[dict[str, Any]]) -> None:
        path = self.output_dir / name
        with path.open("a", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")

    def _save_rollouts(self, generated: list[ScoredGroup], advantages: torch.Tensor) -> None:
        g = self.args.num_generations
        records = []
        for i, group in enumerate(generated):
            rewards = [[None if math.isnan(v) else v for v in row]
                       for row in group.rewards.tolist()]
            records.append({
                "step": self.step, "prompt_id": group.prompt_id,
                "task": self.task_names[group.task], "channels": self.rewards.channel_names,
                "rewards": rewards, "advantages": advantages[i * g:(i + 1) * g].tolist(),
            })
        self._jsonl("rollouts.jsonl", records)

    def _log_batch_rollouts(self, groups: list[ScoredGroup], advantages: torch.Tensor) -> None:
        if not (self.args.log_completions and self.is_main_process):
            return
        g, records = self.args.num_generations, []
        for i, group in enumerate(groups):
            for j, completion in enumerate(group.payload.completions):
                records.append({
                    "step": self.step + 1, "prompt_id": group.prompt_id,
                    "task": self.task_names[group.task],
                    "completion": completion if isinstance(completion, str)
                    else completion[-1]["content"],
                    "rewards": [None if math.isnan(v) else v for v in group.rewards[j].tolist()],
                    "advantage": float(advantages[i * g + j]),
                })
        self._jsonl("completions.jsonl", records)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, Any]:
        """Per-task accuracy on ``eval_dataset`` (``num_generations_eval`` samples per prompt)."""
        from mtgrpo.evaluation import evaluate_prompts

        if self.eval_prompts is None:
            raise ValueError("evaluate() needs an eval_dataset")
        args = self.args
        params = SamplingParams(
            max_new_tokens=args.max_completion_length, temperature=args.eval_temperature,
            top_p=args.top_p if args.eval_temperature > 0 else 1.0,
            top_k=args.top_k if args.eval_temperature > 0 else 0,
        )
        self.unwrapped.eval()
        try:
            result = evaluate_prompts(
                self.eval_prompts, self.backend, self.rewards, params, args.num_generations_eval,
                self.tokenizer, accuracy_threshold=args.accuracy_threshold,
                accuracy_channel=self.accuracy_channel,
                shard=Shard(self.rank, self.world, gather=self._gather_objects),
            )
        finally:
            self.unwrapped.train()
        return result.metrics()

    # ------------------------------------------------------------------ checkpoints
    def _trainer_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "world_size": self.world,
            "task_names": self.task_names,
            "weighting": self.weighting.state_dict(),
            "sampler": self.sampler.state_dict(),
        }

    def save_checkpoint(self) -> Path | None:
        """Write ``checkpoint-<step>`` atomically (main process) and rotate old ones."""
        rng_states = self._gather_objects([ckpt.rng_state()]) if self.world > 1 \
            else [ckpt.rng_state()]
        final = self.output_dir / f"checkpoint-{self.step}"
        if self.is_main_process:
            def write(tmp: Path) -> None:
                self.save_model(tmp / "model")
                ckpt.save_trainable(self.unwrapped, tmp / "trainable.safetensors")
                torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
                torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
                for rank, state in enumerate(rng_states):
                    torch.save(state, tmp / f"rng_state_{rank}.pt")
                (tmp / "trainer_state.json").write_text(json.dumps(self._trainer_state()))

            ckpt.write_atomically(final, write)
            ckpt.rotate_checkpoints(self.output_dir, self.args.save_total_limit)
        self.accelerator.wait_for_everyone()
        return final if self.is_main_process else None

    def save_model(self, directory: str | Path) -> None:
        """The model (or LoRA adapter) and tokenizer in ``save_pretrained`` format."""
        directory = Path(directory)
        self.unwrapped.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)

    def push_to_hub(self, repo_id: str, *, private: bool = True,
                    commit_message: str = "Upload model trained with mtgrpo") -> None:
        """Upload the model (or the LoRA adapter) and tokenizer to the Hugging Face Hub.

        Needs network access and a token (``huggingface-cli login`` or ``HF_TOKEN``); only the
        main process uploads.
        """
        if not self.is_main_process:
            return
        self.unwrapped.push_to_hub(repo_id, private=private, commit_message=commit_message)
        self.tokenizer.push_to_hub(repo_id, private=private, commit_message=commit_message)

    def _resume(self, target: str | bool) -> None:
        checkpoint = ckpt.latest_checkpoint(self.output_dir) if target is True else Path(target)
        if checkpoint is None or not (checkpoint / "trainer_state.json").is_file():
            raise FileNotFoundError(
                f"no checkpoint to resume from ({target!r} in {self.output_dir}); train from "
                "scratch by leaving resume_from_checkpoint unset"
            )
        state = ckpt.read_trainer_state(checkpoint)
        if state["world_size"] != self.world or state["task_names"] != self.task_names:
            raise ValueError(
                f"{checkpoint} was written by {state['world_size']} process(es) for tasks "
                f"{state['task_names']}; resume with the same processes and tasks"
            )
        ckpt.load_trainable(self.unwrapped, checkpoint / "trainable.safetensors")
        self.optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt",
                                                  weights_only=False))
        self.scheduler.load_state_dict(torch.load(checkpoint / "scheduler.pt",
                                                  weights_only=False))
        self.weighting.load_state_dict(state["weighting"])
        self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["step"])
        ckpt.load_rng_state(checkpoint, self.rank)
        if self.is_main_process:
            MetricsWriter.rewind(self.output_dir / "metrics.jsonl", self.step)
        logger.info("resumed from %s at step %d", checkpoint, self.step)

    # ------------------------------------------------------------------ the loop
    def _write_config(self) -> None:
        import yaml

        config = self.run_config if self.run_config is not None else self.args.to_dict()
        (self.output_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def _log(self, writer: MetricsWriter | None, trackers: Trackers | None,
             metrics: Mapping[str, Any], split: str) -> None:
        if writer is None:
            return
        writer.write({"step": self.step, "split": split, **metrics})
        if trackers is not None:
            trackers.log(metrics, self.step, split)

    def train(self) -> dict[str, Any]:
        """Run ``max_steps`` training steps; returns the last train (and eval) metrics."""
        from mtgrpo.trainer.progress import TrainingProgress

        args = self.args
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if self.is_main_process:  # what a save interrupted by a kill left behind
            ckpt.remove_stale_temporaries(self.output_dir)
        if args.resume_from_checkpoint:
            self._resume(args.resume_from_checkpoint)
        elif self.is_main_process:
            _set_aside_previous_run(self.output_dir)
        writer = trackers = None
        if self.is_main_process:
            self._write_config()
            writer = MetricsWriter(self.output_dir / "metrics.jsonl")
            writer.write(self.run_record())
            if args.report_to:
                trackers = Trackers(args.report_to, self.output_dir,
                                    args.run_name or self.output_dir.name, self.args.to_dict())
        last: dict[str, Any] = {}
        evaluating = args.eval_steps > 0 and self.eval_prompts is not None
        try:
            with TrainingProgress(args.max_steps, self.step, enabled=self.is_main_process) as bar:
                if evaluating and args.eval_on_start and self.step == 0:
                    self._log(writer, trackers, self.evaluate(), "eval")
                while self.step < args.max_steps:
                    last = self._profiled_step() if args.profile and not last \
                        else self.training_step()
                    if self.step % args.logging_steps == 0 or self.step == args.max_steps:
                        self._log(writer, trackers, last, "train")
                    if evaluating and (self.step % args.eval_steps == 0
                                       or self.step == args.max_steps):
                        self._log(writer, trackers, self.evaluate(), "eval")
                    if args.save_steps and self.step % args.save_steps == 0:
                        self.save_checkpoint()
                    bar.advance(self.step, last)
            if not args.save_steps or self.step % args.save_steps:
                self.save_checkpoint()
        finally:
            if writer is not None:
                writer.close()
            if trackers is not None:
                trackers.close()
        return last

    def run_record(self) -> dict[str, Any]:
        """How this run computes, the ``split: "run"`` record at the head of each ``train()``
        call in ``metrics.jsonl``: the generation backend (and the static backend's decode
        path), whether the update's forward is padding-free, and the versions of torch,
        transformers and mtgrpo. Also logged at INFO."""
        import transformers

        from mtgrpo import __version__

        route = resolve_logprob_path(self.unwrapped)
        record = {
            "step": self.step, "split": "run", **backend_description(self.backend),
            "policy/logprob_path": route.path,
            "policy/padding_free": bool(self.args.padding_free and route.packed),
            "versions/torch": torch.__version__,
            "versions/transformers": transformers.__version__,
            "versions/mtgrpo": __version__,
        }  # fmt: skip
        logger.info("run: %s", ", ".join(f"{k}={v}" for k, v in record.items()
                                           if k not in ("step", "split")))
        return record

    def _profiled_step(self) -> dict[str, Any]:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities, record_shapes=True) as prof:
            metrics = self.training_step()
        if self.is_main_process:
            trace = self.output_dir / f"profile-step{self.step}.json"
            prof.export_chrome_trace(str(trace))
            logger.info("profiler trace of step %d written to %s", self.step, trace)
        return metrics
