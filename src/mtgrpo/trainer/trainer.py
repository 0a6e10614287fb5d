"""The multi-task GRPO training loop.

One training step, read top to bottom (:meth:`GRPOTrainer.training_step` shows the calls)::

    weights = weighting.weights                  # z over K tasks
    built = sampler.build(weights, B, rollouts)  # generate, score, estimate; filter; compose
    out = updater.update(policy batch)           # optimizer step(s) on built.groups; I_k
    weighting.update(TaskStats.from_rollouts(built.generated, ...))  # J_k, I_k, |A| per task
    log(metrics)

With ``task_weighting_signal: validation`` the weights read a held-out validation split
instead: it is evaluated every ``validation_steps`` steps (at the start of the step, step 0
included) and every update reads :meth:`mtgrpo.algo.weighting.ValidationSignal.task_stats`.

A reward's path to the loss: reward function -> ``RewardSuite.score`` (``[N, R]``, NaN = not
applicable) -> the rollout worker's ``estimate`` (``GRPOTrainer.estimate``, once per
scored group: advantages and the zero-gradient verdict) -> ``ScoredGroup.advantages`` ->
:func:`~mtgrpo.trainer.update.group_policy_batch` (numpy until here, float32 torch after) ->
``policy_loss``.

Everything algorithmic lives in :mod:`mtgrpo.algo`; this file wires it to a model, an
optimizer and ``accelerate``: the step, the batch it trains on and the loop. The rest of the
trainer is mixed in from one module per concern: construction
(:mod:`~mtgrpo.trainer.building`), evaluation (:mod:`~mtgrpo.trainer.evaluating`), checkpoints
and resume (:mod:`~mtgrpo.trainer.checkpointing`), the engine's samples checked against the
trainer (:mod:`~mtgrpo.trainer.generation_checks`), metrics records and rollout logs
(:mod:`~mtgrpo.trainer.records`), and what the loop does when its flow
(:mod:`~mtgrpo.trainer.flow`: when to log, evaluate, save and stop) says so: log records, best
model, hub (:mod:`~mtgrpo.trainer.outputs`). TRL's surface (callbacks, ``log``, TRL's
attribute names) is :class:`mtgrpo.compat.GRPOTrainer`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mtgrpo._progress import use_bar
from mtgrpo.algo.advantages import normalises_over_the_batch
from mtgrpo.algo.sampling import ScoredGroup
from mtgrpo.algo.weighting import TaskStats, improvement_by_task
from mtgrpo.config import FlatOptions, TrainConfig, native_config
from mtgrpo.models.precision import model_width, resolve_bf16
from mtgrpo.reporting import check_trackers_available
from mtgrpo.rollout import (
    SamplingParams,
    Shard,
)
from mtgrpo.rollout.agent import AgentRollouts, CustomRollouts
from mtgrpo.trainer import checkpoint as ckpt
from mtgrpo.trainer import hooks, sharding
from mtgrpo.trainer.agents import (
    WeightSync,
    agent_setup,
    generate_with_rollout_func,
    placeholder_rows,
    stop_token_ids,
)
from mtgrpo.trainer.building import (
    TrainerBuilding,
    _check_context_length,
    _configure_logging,
    _refuse_unsupported,
    _seed_everything,
)
from mtgrpo.trainer.checkpointing import Checkpointing, _set_aside_previous_run
from mtgrpo.trainer.evaluating import Evaluating
from mtgrpo.trainer.generation_checks import GenerationChecks
from mtgrpo.trainer.metrics import (
    NOTHING_LEARNED_STEPS,
    nothing_learned_message,
    trained_nothing,
)
from mtgrpo.trainer.outputs import RunOutputs
from mtgrpo.trainer.records import RunRecords
from mtgrpo.trainer.setup import (
    load_policy,
    training_rows,
)
from mtgrpo.trainer.stopping import StopRequests, TrainingInterrupted
from mtgrpo.trainer.update import batch_advantages, group_policy_batch

logger = logging.getLogger(__name__)

__all__ = ["GRPOTrainer"]




@contextlib.contextmanager
def _timed(seconds: dict[str, float], name: str) -> Iterator[None]:
    """Adds the block's wall time to ``seconds[name]``."""
    begin = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - begin


class GRPOTrainer(TrainerBuilding, Checkpointing, Evaluating, GenerationChecks, RunRecords,
                  RunOutputs):
    """Multi-task GRPO on the native configuration, with TRL's arguments by name. TRL's own
    surface (callbacks, TRL's positional order and attribute names, ``log``) is
    :class:`mtgrpo.compat.GRPOTrainer`'s, what ``from mtgrpo import GRPOTrainer`` gives.

    Args:
        model: a hub name, a local path (directory or ``.gguf`` file), a mapping
            ``{"path": ..., "gguf_file": ...}``, or a loaded causal LM.
        reward_funcs: a reward function, a list of them, a routing table
            ``{task: [functions]}`` (``"*"`` = every task), reward models (a hub id, a path or
            a loaded sequence-classification model), registered names
            (``"countdown_reward"``) or a run file's section
            (:class:`~mtgrpo.config.RewardsConfig`).
        args: the native :class:`~mtgrpo.config.TrainConfig`, or an object that builds one
            (``to_native()``: TRL's flat :class:`mtgrpo.compat.GRPOConfig`).
        train_dataset: a ``datasets.Dataset`` (or ``IterableDataset``), a list of dicts, or a
            path (JSONL, JSON, parquet, CSV) with a prompt column; its task column
            (``task_column``) names each row's task, and without one every row is task
            ``default`` (single-task training, as TRL).
        eval_dataset: same forms, or named sets (a dict of datasets, a ``DatasetDict``):
            evaluated by ``args.evaluation.eval_strategy``.
        processing_class: the tokenizer (default: loaded from ``model``).
        reward_processing_classes: TRL's: one tokenizer per reward function (a reward model
            uses its own; functions ignore theirs).
        optimizers: ``(optimizer, scheduler)`` to use instead of building them (either may
            be None).
        peft_config: a ``peft.LoraConfig`` or a dict of its fields; trains a LoRA adapter and
            uses the adapter-disabled model as the reference policy.
        generation_backend: a backend object implementing
            :class:`mtgrpo.rollout.GenerationBackend` (overrides ``generation_backend``).
        run_config: the resolved run configuration to write as ``config.yaml`` (the CLI passes
            the whole YAML tree; by default the training arguments are written).
        validation_dataset: held-out rows of every training task (a task suite's
            ``suite.validation``, or any form ``train_dataset`` takes) that the task weights
            read with ``task_weighting_signal='validation'``; unused otherwise.

    TRL's ``tools`` (sync or async callables) and ``environment_factory`` (a factory or
    ``{name: factory}``; each environment is a task unless the data has a task column) train
    a policy that calls tools over several turns (:mod:`mtgrpo.rollout.agent`,
    :mod:`mtgrpo.trainer.agents`); ``rollout_func(prompts, trainer)`` generates the rollouts
    itself (TRL's contract, :mod:`mtgrpo.rollout.agent.custom`); ``quantization_config`` is
    refused with the alternative.
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: TrainConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        *,
        optimizers: tuple[Any, Any] = (None, None),
        peft_config: Any = None,
        generation_backend: Any = None,
        run_config: Mapping[str, Any] | None = None,
        validation_dataset: Any = None,
        quantization_config: Any = None,
        tools: Any = None,
        rollout_func: Any = None,
        environment_factory: Any = None,
    ) -> None:
        _refuse_unsupported(quantization_config)
        # ``args`` as given (TRL's flat GRPOConfig, or the native tree) is the transformers
        # surface's; every decision below reads the native tree
        self.args = args if args is not None else TrainConfig()
        self.config = args = native_config(self.args)
        # transformers' flat names over the native tree: TRL's callbacks and the run's
        # identity (what resume compares) read them
        self.callback_args = FlatOptions(args) if self.args is args else self.args
        ckpt.check_output_dir(args.output.output_dir)  # before any model loads
        self._agent = agent_setup(tools, environment_factory)
        if rollout_func is not None and self._agent is not None:
            raise ValueError("rollout_func generates whole rollouts, tool calls included; pass "
                             "it or tools / environment_factory, not both")
        self.tools = [] if self._agent is None else self._agent.all_tools  # TRL's
        self.rollout_func = rollout_func
        # TRL's, for rollout_func: the engine's weights are the trainer's at step 0
        self.use_vllm, self._last_loaded_step = args.vllm.use_vllm, 0
        self.vllm_generation = WeightSync(self._push_weights)
        if train_dataset is None:
            train_dataset = placeholder_rows(self._agent, args)  # the environment owns the data
        reward_weights = args.advantage.reward_weights
        if self._agent is not None:  # environments' get_reward channels come last, weight 1
            reward_funcs, reward_weights, reward_processing_classes = self._agent.with_rewards(
                reward_funcs, reward_weights, reward_processing_classes)
        if reward_funcs is None:
            raise ValueError(
                "No reward source provided: pass reward_funcs (a function, a list of them, "
                "a routing table {task: [functions]}, a reward model or a registered name)"
            )
        check_trackers_available(args.output.report_to)
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        data = training_rows(train_dataset, eval_dataset, args.multitask.task_column)
        self._task_column_added = data.single_task  # then `task` is not passed to reset()
        if self._agent is not None:
            data = self._agent.training_data(data)  # each environment a task
        self._check_iterable(data)
        self._build_rewards(reward_funcs, reward_processing_classes, data, reward_weights)
        # its settings (and the validation split it may read) checked before any model loads
        self._build_weighting(validation_dataset)
        self.run_config = dict(run_config) if run_config is not None else None
        self._build_accelerator(peft_config, optimizers)
        _configure_logging(args, self.accelerator.is_main_process)
        _seed_everything(args.schedule.seed)  # same initialisation (e.g. LoRA) on every process
        # transformers' full_determinism: seeded again, deterministic torch and cuDNN kernels
        if args.schedule.full_determinism:
            from transformers import enable_full_determinism

            enable_full_determinism(args.schedule.seed)
        self.model, self.tokenizer, self.is_peft = load_policy(
            model, processing_class, peft_config, args
        )
        self.processing_class = self.tokenizer
        if self._on_cpu:  # auto on a CPU also asks the model's width, so it is decided here
            self.bf16, self.bf16_reason = resolve_bf16(args.compute.bf16, "cpu",
                                                       model_width(self.model))
            self._cpu_bf16 = self.bf16
        _check_context_length(self.model, args)
        if self.args is not args:  # the length the run uses, also on the object given
            self.args.max_prompt_length = args.rollout.max_prompt_length
        self._build_prompts(data)
        self._build_algorithms()
        self._build_optimisation(generation_backend, optimizers)
        self._build_loop_state()
        self.step = 0
        self._accepted_changes: dict[str, Any] = {}  # settings a resume was allowed to change
        self._answer_warnings: set[tuple[str, str]] = set()  # (task, kind) already logged
        self._warned_idle = False  # the nothing-learned warning is given once per trainer
        self._bar_is_live = False  # set by the loop: a live bar shows each step, not a log line
        self.output_dir = Path(args.output.output_dir)
        _seed_everything(args.schedule.seed + self.rank)  # distinct sampling streams per process

    # ------------------------------------------------------------------ generation
    def _gathered(self) -> contextlib.AbstractContextManager[None]:
        """A sharded model's whole weights for a generation phase (:mod:`.sharding`; DeepSpeed
        ZeRO-3's: :mod:`.deepspeed`)."""
        if self.zero is not None:
            return self.zero.gathered()
        return sharding.unsharded(self.unwrapped) if self.sharded else contextlib.nullcontext()

    def _agent_rollouts(self) -> AgentRollouts | CustomRollouts | None:
        """The multi-turn tool loop over the run's backend, or ``rollout_func`` (None
        without either)."""
        if self.rollout_func is not None:
            return CustomRollouts(self._generate,
                                  stop_token_ids(self.backend, self.tokenizer))
        if self._agent is None:
            return None
        limit = getattr(getattr(self.unwrapped, "config", None), "max_position_embeddings", None)
        return self._agent.rollouts(self.backend, self.tokenizer, self.config, limit,
                                    self._task_column_added)

    def _generate(self, prompts: list[Any]) -> tuple[Any, ...]:
        """TRL's, for ``rollout_func``: its rollouts of ``prompts`` (each prompt of the batch
        ``G`` times) as TRL's tuple (:func:`mtgrpo.trainer.agents.generate_with_rollout_func`)."""
        return generate_with_rollout_func(self, prompts)

    @property
    def environments(self) -> list[Any] | None:
        """TRL's: the environment of each rollout of the last batch generated."""
        agent = self._agent_runner
        return None if agent is None else agent.last_environments

    @property
    def _env_tools(self) -> dict[Any, list[Any]]:
        environments = None if self._agent is None else self._agent.environments
        return {} if environments is None else environments.tools

    @property
    def _environment_pool(self) -> dict[Any, list[Any]]:
        environments = None if self._agent is None else self._agent.environments
        return {} if environments is None else environments.pool

    def _task_sampling_params(self) -> dict[int, SamplingParams]:
        """Each task's sampling parameters where ``task_generation`` overrides them (task ids
        of the training prompts; a task not named samples with the run's)."""
        overrides = self.config.rollout.task_generation or {}
        unknown = sorted(set(overrides) - set(self.task_names))
        if unknown:
            raise ValueError(
                f"task_generation names tasks {unknown} that the training data does not have; "
                f"its tasks: {self.task_names}"
            )
        return {self.task_names.index(task): dataclasses.replace(
            self.sampling_params, max_new_tokens=int(fields["max_completion_length"]))
            for task, fields in overrides.items()}

    def _reward_extras(self) -> dict[str, Any]:
        """TRL's extra keyword arguments of every reward call."""
        return {"trainer_state": self.state, "log_extra": self._log_completion_extra,
                "log_metric": self._log_metric}

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forward passes' mixed precision: bf16 autocast of our own on the CPU, else the
        accelerator's (bf16 or fp16 on a GPU, none in float32)."""
        if self._cpu_bf16:
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return self.accelerator.autocast()

    def _push_weights(self) -> None:
        """Hand the backend the policy's current weights and their version (the steps done), so
        an engine with its own copy of the weights samples the next batch from them."""
        self.backend.update_weights(self.unwrapped, self.step)

    def _gather_objects(self, local: list[Any]) -> list[Any]:
        from accelerate.utils import gather_object

        return gather_object(local)

    @property
    def is_main_process(self) -> bool:
        return self.accelerator.is_main_process

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor,
                              threshold: float) -> torch.Tensor:
        """TRL's high-entropy mask: tokens whose entropy is at least the ``threshold``
        quantile of the non-padding entropies of every process."""
        from mtgrpo.algo.token_weights import entropy_threshold, high_entropy_mask

        local = entropies[mask.bool()].float()
        sentinel = -1e9  # entropies are >= 0, so the padding value cannot collide
        # gather needs the same length on every process: pad, gather, then drop the padding
        padded = self.accelerator.pad_across_processes(local, dim=0, pad_index=sentinel)
        gathered = self.accelerator.gather(padded)
        gathered = gathered[gathered != sentinel]
        return high_entropy_mask(entropies, mask, entropy_threshold(gathered, threshold))

    # ------------------------------------------------------------------ one step
    def _local_groups(self, groups: list[ScoredGroup]) -> tuple[list[int], bool]:
        """This process's share of whole groups (indices), and whether it has any; a process
        without one takes group 0 as a fully masked padding group, so that collective
        operations stay in step."""
        # contiguous shares in rank order, as the rollout worker splits its prompts
        start, stop = Shard(self.rank, self.world).bounds(len(groups))
        local = list(range(start, stop))
        return (local, True) if local else ([0], False)

    def _policy_batch(self, groups: list[ScoredGroup]) -> tuple[np.ndarray, Any, np.ndarray,
                                                                bool]:
        """The advantages of ``groups`` ``[B*G]`` (:func:`batch_advantages`), this process's
        share of the groups as a policy batch, its rows' task ids, and whether it has rows."""
        args = self.config
        again = normalises_over_the_batch(args.advantage.multi_objective_aggregation,
                                          args.advantage.scale_rewards)
        advantages = batch_advantages(groups, self.estimate if again else None)
        local, has_rows = self._local_groups(groups)
        batch = group_policy_batch(
            groups, advantages, local, self.tokenizer.pad_token_id, has_rows=has_rows,
            mask_truncated=args.rollout.mask_truncated_completions,
            device=self.accelerator.device, sampling_logps=self._engine_logps)
        # [n]: the task of each of this process's rows, in the batch's row order
        tasks = np.repeat([groups[i].task for i in local], groups[0].group_size)
        return advantages, batch, tasks, has_rows

    def _improvement(self, tasks: np.ndarray, before: np.ndarray, after: np.ndarray,
                     has_rows: bool) -> np.ndarray:
        local = list(zip(tasks.tolist(), before.tolist(), after.tolist(), strict=True)) \
            if has_rows else []
        # every process joins the gather, with rows or without: it is a collective
        rows = self._gather_objects(local) if self.world > 1 else local
        k = len(self.task_names)
        if not rows:
            return np.full(k, math.nan)
        # ALGORITHMS.md §4: I_k = J_GRPO,k(θ_{t+1}) − J_GRPO,k(θ_t) on the same samples
        t, b, a = (np.array(col) for col in zip(*rows, strict=True))
        return improvement_by_task(t, b, a, k, self.config.multitask.improvement_reduction)

    def _update(self, groups: list[ScoredGroup], generated: int,
                metrics: dict[str, Any]) -> np.ndarray | None:
        """The policy update on the batch's groups (``generated``: completions generated this
        step, for the completion logs); MT-GRPO's improvement if it needs it."""
        if not groups:
            logger.warning("step %d: no informative group was generated; update skipped",
                           self.step + 1)
            metrics["update_skipped"] = 1.0
            # nothing was trained, so no change was measured (NaN: MT-GRPO's I_k is unknown)
            return np.full(len(self.task_names), math.nan) if self.needs_improvement else None
        advantages, batch, tasks, has_rows = self._policy_batch(groups)  # advantages [B*G]
        out = self.updater.update(batch, measure_after=self.needs_improvement,
                                  keep_old_logps=self.sampling_params.return_logprobs,
                                  # fewer when TRL's max_steps ends inside this batch
                                  max_steps=self.max_optimizer_steps - self.state.global_step,
                                  has_rows=has_rows)
        metrics.update(out.metrics)
        if out.old_logps is not None:
            metrics.update(self._generation_mismatch(groups, batch, out.old_logps))
            metrics.update(self._correction_metrics(batch, out.old_logps))
        # Prompt and completion tokens trained on, over every process (TRL counts them at
        # every step and logs the total as num_tokens, whatever include_num_input_tokens_seen)
        seen = int(batch.prompt_mask.sum() + batch.completion_mask.sum()) if has_rows else 0
        self.state.num_input_tokens_seen += sum(self._gather_objects([seen])) \
            if self.world > 1 else seen
        self._log_batch_rollouts(groups, advantages, generated)
        if not self.needs_improvement:
            return None
        return self._improvement(tasks, out.objective_before, out.objective_after, has_rows)

    def training_step(self) -> dict[str, Any]:
        """Build a batch, update the policy, then the task weights; return the step's metrics.

        The calls (every advantage is computed once, by the rollout worker as its group is
        scored; :func:`~mtgrpo.trainer.update.batch_advantages` says when the trained batch
        needs another pass)::

            weights = self.weighting.weights                                   # z [K]
            built = self.sampler.build(weights, B, self.rollouts)              # SampledBatch
            advantages = batch_advantages(built.groups)                        # [B*G]
            out = self.updater.update(group_policy_batch(..., advantages), ...)  # (_update)
            self.weighting.update(TaskStats.from_rollouts(rows of built.generated, ...))
            self._push_weights()    # backend.update_weights(policy, self.step): generation follows
        """
        seconds = {"begin": time.perf_counter()}
        # at the step's start, on the policy before this update; the weighting update reads it
        validated = self._validate_if_due()  # {} unless the weights read the validation split
        weights = self.weighting.weights  # [K]
        self.rollouts.reset()
        self._pending_extra = {}
        with self._gathered():  # sharded: every process gathers, prompts or not
            built = self.sampler.build(weights, self.prompts_per_step, self.rollouts)
        generated = built.generated
        update: dict[str, Any] = {}
        with _timed(seconds, "update"):
            improvement = self._update(built.groups, sum(g.group_size for g in generated), update)
        with _timed(seconds, "weighting"):
            # every generated group, filtered ones included: ALGORITHMS.md §4 measures J_k
            # before filtering
            advantages = np.concatenate([g.advantages for g in generated])  # [N]
            stats = self._weighting_stats(generated, advantages, improvement)
            self.weighting.update(stats)
        if self.validation is not None:  # the I_k the weights read, for the metrics
            improvement = stats.improvement if self.reads_improvement else None
        self.step += 1
        # after the count: the engine's weight version is the number of steps done
        self._push_weights()
        metrics = self._step_metrics(built, weights, improvement, {**update, **validated},
                                     seconds)
        self._remember_completions(generated, advantages)
        if self.config.output.save_rollouts and self.is_main_process:
            self._save_rollouts(generated, advantages)
        return metrics

    def _weighting_stats(self, generated: list[ScoredGroup], advantages: np.ndarray,
                         improvement: np.ndarray | None) -> TaskStats:
        """What the weights read this step: the training batch's rollouts (``J_k``, ``|A|``;
        ``improvement [K]``, the ``I_k`` measured across the update), or the last evaluation
        of the validation split (``task_weighting_signal: validation``)."""
        if self.validation is not None:
            stats = self.validation.task_stats()
            assert stats is not None, "the validation split is evaluated at the first step"
            return stats
        return self._group_stats(generated, advantages, improvement)

    def _group_stats(self, groups: list[ScoredGroup], advantages: np.ndarray,
                     improvement: np.ndarray | None = None) -> TaskStats:
        """:class:`TaskStats` of scored groups (``advantages [N]``, the groups' rows in
        order)."""
        row_tasks = np.concatenate([np.full(g.group_size, g.task) for g in groups])  # [N]
        return TaskStats.from_rollouts(
            row_tasks, np.concatenate([g.correct for g in groups]), len(self.task_names),
            abs_advantages=np.abs(advantages), improvement=improvement)

    # ------------------------------------------------------------------ the loop
    def train(self, resume_from_checkpoint: str | bool | None = None,
              **_: Any) -> hooks.TrainOutput:
        """Train for ``max_steps`` steps (or ``num_train_epochs`` epochs); returns the last
        step's metrics (with transformers' ``TrainOutput`` fields).

        ``resume_from_checkpoint`` (TRL's argument, default ``args.saving.resume_from_checkpoint``):
        a checkpoint directory, or True for the newest in ``output_dir``.
        """
        args = self.config
        target = resume_from_checkpoint if resume_from_checkpoint is not None \
            else args.saving.resume_from_checkpoint
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if self.is_main_process:  # what a save interrupted by a kill left behind
            # only the main process writes checkpoints, so only it cleans up after them
            ckpt.remove_stale_temporaries(self.output_dir)
        if target:
            self._resume(target)
            self._push_weights()  # the checkpoint's weights, at its step
        elif self.is_main_process:
            _set_aside_previous_run(self.output_dir)
        self._open_outputs()
        start, first_step = time.time(), self.step
        self._idle_steps = self._idle_streak = 0  # steps that trained nothing (all, in a row)
        last: dict[str, Any] = {}
        try:
            self.flow.train_begin(self.state)
            last = self._loop()
        finally:
            self._close_outputs()
        # this train() call's steps only: a resumed run's summary covers its own part
        summary = hooks.train_summary(start, self.step - first_step, self.prompts_per_step,
                                      args.batch.num_generations, self.log_window.run_losses)
        self._record({**hooks.with_trl_names(last), **summary})
        self.flow.train_end(self.state)
        # after on_train_end here; transformers loads the best checkpoint just before it
        if args.saving.load_best_model_at_end and self.state.best_model_checkpoint:
            self._load_best_model()
        if args.saving.push_to_hub:  # every process: a sharded model is gathered first
            self.push_to_hub(commit_message="End of training")
        steps = self.step - first_step
        if steps and self._idle_steps == steps and self.is_main_process:
            logger.warning("%s", nothing_learned_message(
                f"all {steps} steps of this run", last, args.rollout.temperature,
                args.batch.num_generations))
        if args.output.report_at_end and self.is_main_process:
            self._report_at_end()
        return hooks.TrainOutput(last, self.state.global_step, summary["train_loss"], summary)

    def _loop(self) -> dict[str, Any]:
        """The training steps, with the flow's events between them."""
        from mtgrpo.trainer.progress import TrainingProgress

        args, flow, last = self.config, self.flow, {}
        shown = self.is_main_process and not args.output.disable_tqdm
        self._bar_is_live = shown and use_bar()
        with TrainingProgress(self.max_steps, self.step, enabled=shown) as bar, \
                StopRequests() as stop:
            if self.eval_sets and args.evaluation.eval_on_start and self.step == 0 \
                    and args.evaluation.eval_strategy != "no":
                self.evaluate()
            while self.step < self.max_steps and not self.control.should_training_stop:
                # an epoch is steps_per_epoch training steps; a resume inside one starts no epoch
                if self.step % self.steps_per_epoch == 0:
                    flow.epoch_begin(self.state)
                # once per training step: it resets the switches, which the step_end of any
                # optimizer step of the batch may then set for _log_save_evaluate
                flow.step_begin(self.state)
                # `profile` traces only the first step of each train() call
                last = self._profiled_step() if args.output.profile and not last \
                    else self.training_step()
                # fractional, as transformers' state.epoch; eval_delay's epoch test reads it
                self.state.epoch = self.step / self.steps_per_epoch
                self.log_window.add_step(last, args.output.logging_nan_inf_filter)
                self._watch_learning(last)
                self._after_step()
                # the flow (and TRL's callbacks) see each optimizer step of the batch, as in
                # TRL's loop
                while self.state.global_step < self._optimizer_steps_after(self.step):
                    self.state.global_step += 1
                    flow.step_end(self.state)
                if self.step % self.steps_per_epoch == 0:
                    flow.epoch_end(self.state)
                self._log_save_evaluate(last)
                bar.advance(self.step, last)
                # every process stops at the same step: one leaving alone would hang the collectives
                if self._agreed(stop.requested is not None):
                    self._stop_on_signal(stop.requested or signal.SIGTERM)
        return last

    def _optimizer_steps_after(self, step: int) -> int:
        """``state.global_step`` once ``step`` training steps are done (TRL's count)."""
        # capped: with step_unit 'optimizer' the last batch stops at max_steps
        return min(step * self.config.optimizer_steps_per_step(), self.max_optimizer_steps)

    def _watch_learning(self, metrics: Mapping[str, Any]) -> None:
        """Warn once, on the main process, when :data:`NOTHING_LEARNED_STEPS` steps in a row
        trained nothing; a shorter run is judged as a whole when it ends (:meth:`train`)."""
        idle = trained_nothing(metrics)
        self._idle_steps += idle
        self._idle_streak = self._idle_streak + 1 if idle else 0
        if self._idle_streak == NOTHING_LEARNED_STEPS and self.step < self.max_steps \
                and self.is_main_process and not self._warned_idle:
            self._warned_idle = True
            logger.warning("%s", nothing_learned_message(
                f"the last {NOTHING_LEARNED_STEPS} steps", metrics, self.config.rollout.temperature,
                self.config.batch.num_generations))

    def _agreed(self, local: bool) -> bool:
        """True on every process when any process has it true (one small collective)."""
        return any(self._gather_objects([local])) if self.world > 1 else local

    def _stop_on_signal(self, signum: int) -> None:
        """After a SIGTERM/SIGINT: a checkpoint of the step just finished, then a
        :class:`~mtgrpo.trainer.stopping.TrainingInterrupted` that says how to resume."""
        checkpoint = self.output_dir / f"checkpoint-{self.state.global_step}"
        # the flow may have saved this very step already
        if self.step > 0 and not (checkpoint / "trainer_state.json").is_file():
            self.save_checkpoint()
        name = signal.Signals(signum).name
        where = str(checkpoint) if checkpoint.exists() else None
        message = (f"{name}: training stopped after step {self.step} of {self.max_steps}; "
                   + (f"the checkpoint {where} resumes it: run the same command with "
                      "--resume_from_checkpoint true (resume_from_checkpoint=True in Python)"
                      if where else "no step had finished, so there is nothing to resume"))
        if self.is_main_process:
            logger.warning("%s", message)
        raise TrainingInterrupted(signum, where, message)

