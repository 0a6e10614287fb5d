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
applicable) -> the rollout worker's ``estimate`` (:meth:`GRPOTrainer._estimate`, once per
scored group: advantages and the zero-gradient verdict) -> ``ScoredGroup.advantages`` ->
:func:`~mtgrpo.trainer.update.pad_policy_batch` -> ``policy_loss``.

Everything algorithmic lives in the pure modules; this file wires them to a model, an
optimizer and ``accelerate``. The transformers ``Trainer`` surface (``state``, callbacks,
``log``) is in :mod:`mtgrpo.trainer.hooks`, uploads in :mod:`mtgrpo.trainer.hub`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
import random
import signal
import time
from collections import defaultdict, deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mtgrpo._files import aside_path, write_atomically, write_text_atomically
from mtgrpo._progress import use_bar
from mtgrpo.algo.advantages import AdvantageResult, compute_advantages, normalises_over_the_batch
from mtgrpo.algo.engine_correction import (
    correction_figures,
    correction_metrics,
    importance_weights,
)
from mtgrpo.algo.metrics import logprob_mismatch, scalar_rewards
from mtgrpo.algo.sampling import ScoredGroup, make_sampler
from mtgrpo.algo.weighting import TaskStats, ValidationSignal, improvement_by_task, make_weighting
from mtgrpo.config import GRPOConfig
from mtgrpo.models.precision import model_width, resolve_bf16
from mtgrpo.policy import build_optimizer, build_scheduler
from mtgrpo.policy.logprobs import resolve_logprob_path
from mtgrpo.reporting import MetricsWriter, Trackers, check_trackers_available
from mtgrpo.rewards.accuracy import accuracy_channel_index
from mtgrpo.rollout import (
    GroupPayload,
    RolloutWorker,
    SamplingParams,
    Shard,
    backend_description,
)
from mtgrpo.rollout.agent import AgentRollouts, CustomRollouts
from mtgrpo.tasks.prompt_set import PromptSet, is_lazy_split
from mtgrpo.trainer import checkpoint as ckpt
from mtgrpo.trainer import hooks, sharding
from mtgrpo.trainer.agents import (
    WeightSync,
    agent_setup,
    generate_with_rollout_func,
    placeholder_rows,
    stop_token_ids,
)
from mtgrpo.trainer.hub import HubUploader, default_repo_id
from mtgrpo.trainer.identity import check_resumable, record_history, run_identity
from mtgrpo.trainer.metrics import (
    NOTHING_LEARNED_STEPS,
    channel_metrics,
    length_metrics,
    nothing_learned_message,
    task_metrics,
    trained_nothing,
)
from mtgrpo.trainer.setup import (
    TrainingData,
    build_backend,
    build_reward_suite,
    load_policy,
    reward_processing_list,
    training_rows,
    validation_rows,
)
from mtgrpo.trainer.stopping import StopRequests, TrainingInterrupted
from mtgrpo.trainer.surface import TrainerSurface
from mtgrpo.trainer.update import PolicyUpdater, engine_correction, pad_policy_batch

logger = logging.getLogger(__name__)

__all__ = ["GRPOTrainer"]


def _task_names(rows: Any) -> list[str]:
    if is_lazy_split(rows):
        return sorted(rows.task_ids)
    return sorted({str(row["task"]) for row in rows})


def _check_context_length(model: Any, args: GRPOConfig) -> None:
    """Prompt + completion must fit the model's positions.

    ``max_prompt_length`` left at its default (TRL 1.x scripts never set it) shrinks to what
    the completion leaves, with a notice. "Left at its default" is the value, not whether the
    keyword was passed: TRL's parser and ``dataclasses.replace`` pass every field. A value the
    user chose that does not fit stays an error naming the one that does: shrinking it would
    silently cut prompts they asked to keep. A completion that fills the context by itself is
    an error."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if limit is None:
        return
    completion = args.max_completion_length
    if completion >= limit:
        raise ValueError(
            f"max_completion_length={completion} leaves no room for a prompt in the model's "
            f"max_position_embeddings={limit}; set max_completion_length below {limit} "
            f"(e.g. {limit // 2})")
    budget, prompt = limit - completion, args.max_prompt_length
    if prompt is None or prompt <= budget:
        return
    default = next(f.default for f in dataclasses.fields(GRPOConfig)
                   if f.name == "max_prompt_length")
    if prompt != default:
        raise ValueError(
            f"max_prompt_length ({prompt}) + max_completion_length ({completion}) = "
            f"{prompt + completion} tokens exceeds the model's max_position_embeddings="
            f"{limit}; set max_prompt_length to at most {budget} (or leave it unset to fit "
            "automatically), or lower max_completion_length")
    args.max_prompt_length = budget
    # a notice, not a warning: nothing to act on, and a prompt that is cut at the new limit
    # gets the prompt set's own truncation warning
    logger.info("the model has %d positions: max_prompt_length lowered from its default %d to "
                "%d to leave room for max_completion_length=%d; set max_prompt_length to "
                "choose", limit, default, budget, completion)


_RUN_OUTPUTS = ("metrics.jsonl", "completions.jsonl", "rollouts.jsonl", "config.yaml")


def _set_aside_previous_run(output_dir: Path) -> Path | None:
    """A fresh run in a directory that holds an earlier run: move the earlier run's logs and
    checkpoints into ``previous-<time>/`` (nothing is deleted) so the new logs start clean."""
    old = [output_dir / name for name in _RUN_OUTPUTS if (output_dir / name).exists()]
    old += ckpt.list_checkpoints(output_dir)
    if not old:
        return None
    target = aside_path(output_dir, "previous")
    target.mkdir()
    for path in old:
        path.rename(target / path.name)
    logger.warning("%s held an earlier run; its logs and checkpoints were moved to %s "
                   "(use resume_from_checkpoint to continue it instead)", output_dir, target)
    return target


def _column_names(rows: Any, task_column: str) -> set[str]:
    """The columns reward functions receive: a dataset's, the keys of row dicts (the first
    thousand), or a task suite's row schema; always ``task``."""
    names = getattr(rows, "column_names", None)
    if names is None and isinstance(rows, list):
        names = {key for row in rows[:1000] if isinstance(row, Mapping) for key in row}
    if names is None:  # a task suite's lazy split: its fixed row schema
        names = {"id", "prompt", "answer", "metadata", "split"}
    return {*names, "task", task_column}


def _read(path: Path, load: Any) -> Any:
    """``load(path)``; a damaged file is an error naming it and the checkpoint to use instead
    (a missing one keeps its own message)."""
    try:
        return load(path)
    except FileNotFoundError:
        raise
    except Exception as error:
        if isinstance(error, ValueError) and "does not match the model" in str(error):
            raise
        raise ckpt.damaged_checkpoint(path, error) from error


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _refuse_unsupported(quantization_config: Any) -> None:
    """TRL arguments mtgrpo has no counterpart for: an error naming what to use instead."""
    refused = {
        "quantization_config": (quantization_config, "load the model quantized yourself and "
                                "pass the loaded model (or train a LoRA adapter on it)"),
    }
    for name, (value, alternative) in refused.items():
        if value:
            raise ValueError(f"{name} is not supported by mtgrpo: {alternative}")


def _configure_logging(args: GRPOConfig, is_main: bool) -> None:
    """TRL's log_level / log_level_replica for mtgrpo's and transformers' loggers."""
    level = args.log_level if is_main else args.log_level_replica
    if level == "passive":
        return
    import transformers

    numeric = getattr(logging, level.upper())
    logging.getLogger("mtgrpo").setLevel(numeric)
    transformers.logging.set_verbosity(numeric)


@contextlib.contextmanager
def _timed(seconds: dict[str, float], name: str) -> Iterator[None]:
    """Adds the block's wall time to ``seconds[name]``."""
    begin = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - begin


class GRPOTrainer(TrainerSurface):
    """Multi-task GRPO with TRL's ``GRPOTrainer`` interface.

    Args:
        model: a hub name, a local path (directory or ``.gguf`` file), a mapping
            ``{"path": ..., "gguf_file": ...}``, or a loaded causal LM.
        reward_funcs: a reward function, a list of them, a routing table
            ``{task: [functions]}`` (``"*"`` = every task), reward models (a hub id, a path or
            a loaded sequence-classification model), registered names
            (``"countdown_reward"``) or a run file's section
            (:class:`~mtgrpo.config.RewardsConfig`).
        args: :class:`~mtgrpo.config.GRPOConfig`.
        train_dataset: a ``datasets.Dataset`` (or ``IterableDataset``), a list of dicts, or a
            path (JSONL, JSON, parquet, CSV) with a prompt column; its task column
            (``args.task_column``) names each row's task, and without one every row is task
            ``default`` (single-task training, as TRL).
        eval_dataset: same forms, or named sets (a dict of datasets, a ``DatasetDict``):
            evaluated by ``args.eval_strategy``.
        processing_class: the tokenizer (default: loaded from ``model``).
        reward_processing_classes: TRL's: one tokenizer per reward function (a reward model
            uses its own; functions ignore theirs).
        callbacks: transformers ``TrainerCallback`` objects or classes.
        optimizers: ``(optimizer, scheduler)`` to use instead of building them (either may
            be None).
        peft_config: a ``peft.LoraConfig`` or a dict of its fields; trains a LoRA adapter and
            uses the adapter-disabled model as the reference policy.
        generation_backend: a backend object implementing
            :class:`mtgrpo.rollout.GenerationBackend` (overrides ``args.generation_backend``).
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
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        callbacks: list[Any] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        peft_config: Any = None,
        *,
        generation_backend: Any = None,
        run_config: Mapping[str, Any] | None = None,
        validation_dataset: Any = None,
        quantization_config: Any = None,
        tools: Any = None,
        rollout_func: Any = None,
        environment_factory: Any = None,
    ) -> None:
        _refuse_unsupported(quantization_config)
        self.args = args = args if args is not None else GRPOConfig()
        ckpt.check_output_dir(args.output_dir)  # before any model loads
        self._agent = agent_setup(tools, environment_factory)
        if rollout_func is not None and self._agent is not None:
            raise ValueError("rollout_func generates whole rollouts, tool calls included; pass "
                             "it or tools / environment_factory, not both")
        self.tools = [] if self._agent is None else self._agent.all_tools  # TRL's
        self.rollout_func = rollout_func
        # TRL's, for rollout_func: the engine's weights are the trainer's at step 0
        self.use_vllm, self._last_loaded_step = args.use_vllm, 0
        self.vllm_generation = WeightSync(self._push_weights)
        if train_dataset is None:
            train_dataset = placeholder_rows(self._agent, args)  # the environment owns the data
        reward_weights = args.reward_weights
        if self._agent is not None:  # environments' get_reward channels come last, weight 1
            reward_funcs, reward_weights, reward_processing_classes = self._agent.with_rewards(
                reward_funcs, reward_weights, reward_processing_classes)
        if reward_funcs is None:
            raise ValueError(
                "No reward source provided: pass reward_funcs (a function, a list of them, "
                "a routing table {task: [functions]}, a reward model or a registered name)"
            )
        check_trackers_available(args.report_to)
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        data = training_rows(train_dataset, eval_dataset, args.task_column)
        self._task_column_added = data.single_task  # then `task` is not passed to reset()
        if self._agent is not None:
            data = self._agent.training_data(data)  # each environment a task
        self._check_iterable(data)
        self._build_rewards(reward_funcs, reward_processing_classes, data, reward_weights)
        # its settings (and the validation split it may read) checked before any model loads
        self._build_weighting(validation_dataset)
        self.run_config = dict(run_config) if run_config is not None else None
        self._build_accelerator()
        _configure_logging(args, self.accelerator.is_main_process)
        _seed_everything(args.seed)  # same initialisation (e.g. LoRA) on every process
        if args.full_determinism:
            from transformers import enable_full_determinism

            enable_full_determinism(args.seed)
        self.model, self.tokenizer, self.is_peft = load_policy(
            model, processing_class, peft_config, args
        )
        self.processing_class = self.tokenizer
        if self._on_cpu:  # auto on a CPU also asks the model's width, so it is decided here
            self.bf16, self.bf16_reason = resolve_bf16(args.bf16, "cpu", model_width(self.model))
            self._cpu_bf16 = self.bf16
        _check_context_length(self.model, args)
        self._build_prompts(data)
        self._build_algorithms()
        self._build_optimisation(generation_backend, optimizers)
        self._build_trainer_surface(callbacks)
        self.step = 0
        self._accepted_changes: dict[str, Any] = {}  # settings a resume was allowed to change
        self._answer_warnings: set[tuple[str, str]] = set()  # (task, kind) already logged
        self._warned_idle = False  # the nothing-learned warning is given once per trainer
        self._bar_is_live = False  # set by the loop: a live bar shows each step, not a log line
        self.output_dir = Path(args.output_dir)
        _seed_everything(args.seed + self.rank)  # distinct sampling streams per process

    # ------------------------------------------------------------------ construction
    def _check_iterable(self, data: TrainingData) -> None:
        """TRL's rules for streaming datasets (they are read into memory here)."""
        args = self.args
        iterable_eval = self.eval_dataset is not None and any(
            type(v).__name__ == "IterableDataset" for v in (
                self.eval_dataset.values() if isinstance(self.eval_dataset, Mapping)
                else [self.eval_dataset]))
        if data.iterable or iterable_eval:
            if args.accelerator_settings().dispatch_batches:
                raise ValueError(
                    "Iterable datasets require `dispatch_batches=False`, but it is set to "
                    "`True` in `accelerator_config`; set it to False"
                )
            args.accelerator_settings().dispatch_batches = False
        if data.iterable:
            if args.max_steps < 1:
                raise ValueError(
                    "an iterable (streaming) train_dataset has no length, so max_steps=-1 "
                    "(num_train_epochs) cannot size the run; set max_steps"
                )
            args.dataloader_num_workers = 0

    def _build_rewards(self, reward_funcs: Any, processing_classes: Any,
                       data: TrainingData, reward_weights: Any) -> None:
        args = self.args
        resolved, self.reward_processing_classes = reward_processing_list(
            reward_funcs, processing_classes, args.trust_remote_code)
        self.on_unscorable = args.on_unscorable
        if self.on_unscorable == "auto":
            self.on_unscorable = "warn" if data.single_task else "raise"
        weighted = copy.copy(args)  # the environments' channels add weights the config lacks
        weighted.reward_weights = reward_weights
        self.rewards = build_reward_suite(resolved, weighted, on_unscorable=self.on_unscorable)
        self.reward_funcs = self.rewards.functions
        self.reward_func_names = [str(rf.name) for rf in self.rewards.functions]
        self.reward_weights = torch.as_tensor(np.asarray(self.rewards.reward_weights),
                                              dtype=torch.float32)
        self.task_names = _task_names(data.train)
        self.rewards.validate_tasks(self.task_names)
        every_task = set(self.task_names)
        for rows in data.evals.values():
            self.rewards.validate_tasks(_task_names(rows))
            every_task |= set(_task_names(rows))
        self.rewards.check_routes_have_rows(every_task)
        environments = () if self._agent is None or self._agent.environments is None \
            else ("environments",)
        if self.rollout_func is None:  # rollout_func's fields are known once it has run
            self.rewards.check_columns(_column_names(data.train, args.task_column),
                                       extras=("trainer_state", "log_extra", "log_metric",
                                               *environments))
        self.accuracy_channel = accuracy_channel_index(self.rewards.channel_names,
                                                       args.accuracy_reward)

    def _build_accelerator(self) -> None:
        from accelerate import Accelerator

        args = self.args
        self._on_cpu = args.use_cpu or not torch.cuda.is_available()
        # bf16 on the CPU is our own autocast, decided once the model is loaded: accelerate
        # keeps one mixed-precision setting per process, which another trainer (a benchmark's
        # TRL) would change under us
        self._cpu_bf16 = False
        self.bf16, self.bf16_reason = False, "decided once the model is loaded"
        gpu_bf16 = False
        if not self._on_cpu:
            self.bf16, self.bf16_reason = resolve_bf16(args.bf16, "cuda")
            gpu_bf16 = self.bf16
        precision = "bf16" if gpu_bf16 else "fp16" if args.fp16 else "no"
        if args.tf32 is not None and torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = args.tf32
            torch.backends.cudnn.allow_tf32 = args.tf32
        _release_accelerator_state(precision)
        self.accelerator = Accelerator(
            cpu=self._on_cpu, mixed_precision=precision,
            kwargs_handlers=_ddp_kwargs(args),
        )
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes
        self.prompts_per_step = args.resolved_prompts_per_step(self.world)

    def _build_prompts(self, data: TrainingData) -> None:
        args = self.args
        options = {"max_prompt_length": args.max_prompt_length,
                   "on_long_prompt": args.on_long_prompt,
                   "chat_template_kwargs": args.chat_template_kwargs}
        self.train_prompts = PromptSet(data.train, self.tokenizer, task_names=self.task_names,
                                       **options)
        self.train_prompts.tokenize_all()
        self.eval_sets: dict[str | None, PromptSet] = {}
        for name, rows in data.evals.items():
            self.eval_sets[name] = PromptSet(rows, self.tokenizer, **options)
            self.eval_sets[name].tokenize_all()
        self.eval_prompts = self.eval_sets.get(None) if len(self.eval_sets) == 1 else None
        self.validation_prompts: PromptSet | None = None
        if self._validation_rows is not None:  # in the training task order, as the weights
            self.validation_prompts = PromptSet(self._validation_rows, self.tokenizer,
                                                task_names=self.task_names, **options)
            self.validation_prompts.tokenize_all()
        self.steps_per_epoch = args.steps_per_epoch(len(self.train_prompts), self.world)
        self.max_steps = args.training_steps(len(self.train_prompts), self.world)
        self.max_optimizer_steps = args.total_optimizer_steps(self.max_steps)  # state.max_steps
        self.validation_every = args.resolved_validation_steps(self.max_steps)

    def _build_weighting(self, validation_dataset: Any) -> None:
        args = self.args
        self.weighting = make_weighting(
            args.task_weighting, len(self.task_names), task_names=self.task_names,
            **args.task_weighting_params,
        )
        self.reads_improvement = "improvement" in getattr(self.weighting, "REQUIRES", ())
        # the held-out signal when the weights read it (None: the training batch's)
        self.validation: ValidationSignal | None = None
        self._validation_rows = None
        if args.task_weighting_signal == "validation":
            self._validation_rows = validation_rows(validation_dataset, args.task_column,
                                                    self.task_names)
            self.validation = ValidationSignal(len(self.task_names))
        # I_k measured across the update: only when the weights read it from the batch
        self.needs_improvement = self.reads_improvement and self.validation is None

    def _build_algorithms(self) -> None:
        args = self.args
        self.sampler = make_sampler(
            args.batch_construction, self.train_prompts.prompt_tasks, len(self.task_names),
            seed=args.seed if args.data_seed is None else args.data_seed,
            zero_gradient_filter=args.zero_gradient_filter,
            shuffle=args.shuffle_dataset and args.train_sampling_strategy == "random",
            **args.batch_construction_params,
        )

    def _build_optimisation(self, generation_backend: Any, optimizers: tuple[Any, Any]) -> None:
        args = self.args
        self.ref_model = None
        if args.beta > 0 and not self.is_peft:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        optimizer, scheduler = optimizers if optimizers is not None else (None, None)
        self.sharded = args.fully_sharded
        if self.sharded:
            self._check_sharding(optimizer)
            sharding.shard_model(self.model)  # before the optimizer: it holds the shards
        if optimizer is None:
            optimizer = build_optimizer(
                self.model, args.learning_rate, weight_decay=args.weight_decay,
                betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon,
                optim=args.optim, optim_args=args.optim_args,
            )
        self.scheduler = scheduler or build_scheduler(
            optimizer, args.lr_scheduler_type,
            total_steps=self.max_optimizer_steps,
            warmup_steps=args.resolved_warmup_steps(self.max_steps),
            scheduler_kwargs=args.lr_scheduler_kwargs,
        )
        self.lr_scheduler = self.scheduler
        if self.sharded:  # sharded already: accelerate would wrap it in DDP
            self.optimizer = self.accelerator.prepare(optimizer)
        else:
            self.model, self.optimizer = self.accelerator.prepare(self.model, optimizer)
        if self.ref_model is not None:
            self.ref_model.to(self.accelerator.device)
        self.unwrapped = self.accelerator.unwrap_model(self.model)
        # sharded: the engine is built on, and runs with, every shard gathered (a first gather
        # inside the engine's inference mode would leave FSDP buffers no update may write)
        with self._gathered():
            self.backend = build_backend(generation_backend, self.unwrapped, self.tokenizer,
                                         args, generation_dtype=self._generation_dtype())
        if self.sharded:
            self.backend = sharding.ShardedGeneration(self.backend, self.unwrapped)
        self._warned_no_engine_logprobs = False
        self.sampling_params = SamplingParams(
            max_new_tokens=args.max_completion_length, temperature=args.temperature,
            top_p=args.top_p, top_k=args.top_k, return_logprobs=self._wants_generation_logprobs(),
        )
        reference = None
        if args.beta > 0 and self.is_peft:
            from mtgrpo.models import reference_mode

            def reference() -> contextlib.AbstractContextManager[Any]:
                return reference_mode(self.unwrapped)

        self.updater = PolicyUpdater(
            args, self.model, self.optimizer, self.scheduler, self.accelerator,
            reference_model=self.ref_model, reference=reference,
            entropy_mask=self.get_high_entropy_mask, autocast=self._autocast,
            sharded=self.sharded,
        )

    def _gathered(self) -> contextlib.AbstractContextManager[None]:
        """A sharded model's whole weights for a generation phase (:mod:`.sharding`)."""
        return sharding.unsharded(self.unwrapped) if self.sharded else contextlib.nullcontext()

    def _check_sharding(self, optimizer: Any) -> None:
        """What ``fsdp='full_shard'`` cannot be combined with, before anything is sharded."""
        if self.accelerator.distributed_type.value in ("FSDP", "DEEPSPEED"):
            raise ValueError(
                f"fsdp='full_shard' and accelerate's {self.accelerator.distributed_type.value} "
                "configuration both shard the model; keep one (drop fsdp, or launch without "
                "the accelerate FSDP / DeepSpeed config)")
        if self.is_peft:
            raise ValueError("fsdp='full_shard' with a LoRA adapter is not supported yet: an "
                             "adapter is small enough to train replicated; drop fsdp (DDP) or "
                             "peft_config")
        if optimizer is not None:
            raise ValueError("fsdp='full_shard' with optimizers=(optimizer, ...): the optimizer "
                             "must be built over the sharded parameters; pass optimizers=None "
                             "(and optim / optim_args) or drop fsdp")

    def _build_trainer_surface(self, callbacks: list[Any] | None) -> None:
        """TRL's state, callbacks, completion logs and reward-function hooks."""
        from transformers import TrainerControl
        from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

        args = self.args
        intervals = {name: args.optimizer_interval(value, self.max_steps) for name, value in (
            ("logging", args.logging_steps), ("eval", args.eval_steps),
            ("save", args.save_steps))}
        self.state = hooks.new_state(
            self.max_optimizer_steps, self.steps_per_epoch * args.optimizer_steps_per_step(),
            args.num_train_epochs, intervals, args.per_device_train_batch_size,
            self.accelerator.is_main_process)
        self.control = TrainerControl()
        self.callback_handler = CallbackHandler(
            [DefaultFlowCallback, *(callbacks or [])], self.unwrapped, self.tokenizer,
            self.optimizer, self.scheduler)
        self.log_window = hooks.LogWindow()
        self.aux_loss_enabled = False
        self.num_generations = args.num_generations
        size = self.prompts_per_step * args.num_generations
        self._logs: dict[str, Any] = {
            "prompt": deque(maxlen=size), "completion": deque(maxlen=size),
            "rewards": defaultdict(lambda: deque(maxlen=size)),
            "advantages": deque(maxlen=size),
            "extra": defaultdict(lambda: deque(maxlen=size)),
        }
        self._hub: HubUploader | None = None
        self._writer: MetricsWriter | None = None
        self._trackers: Trackers | None = None
        self._pending_extra: dict[str, list[Any]] = {}
        self._improved = False  # the last evaluation improved metric_for_best_model
        shard = Shard(self.rank, self.world, gather=self._gather_objects)
        self._agent_runner = self._agent_rollouts()  # training and evaluation share it
        self.rollouts = RolloutWorker(
            self.train_prompts, self.backend, self.rewards, self.sampling_params,
            args.num_generations, self.tokenizer, accuracy_threshold=args.accuracy_threshold,
            accuracy_channel=self.accuracy_channel, shard=shard, extra=self._reward_extras(),
            estimate=self._estimate, expected_version=lambda: self.step,
            task_params=self._task_sampling_params(), agent=self._agent_runner,
        )

    def _agent_rollouts(self) -> AgentRollouts | CustomRollouts | None:
        """The multi-turn tool loop over the run's backend, or ``rollout_func`` (None
        without either)."""
        if self.rollout_func is not None:
            return CustomRollouts(self._generate,
                                  stop_token_ids(self.backend, self.tokenizer))
        if self._agent is None:
            return None
        limit = getattr(getattr(self.unwrapped, "config", None), "max_position_embeddings", None)
        return self._agent.rollouts(self.backend, self.tokenizer, self.args, limit,
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
        overrides = self.args.task_generation or {}
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

    def _generation_dtype(self) -> torch.dtype | None:
        """bfloat16 when bf16 is on and the policy's weights are float32 (the static backend
        then generates from a bfloat16 copy); None: the policy's own dtype."""
        from mtgrpo.fast import hooked_modules

        weights = next(self.unwrapped.parameters()).dtype
        if not self.bf16 or weights != torch.float32:
            return None
        hooked = hooked_modules(self.unwrapped)
        if hooked:
            logger.info("generating in float32 from the policy itself: its modules %s have "
                        "forward hooks, which a bfloat16 copy would not compute alike", hooked[:3])
            return None
        return torch.bfloat16

    def _wants_generation_logprobs(self) -> bool:
        """Whether to ask the backend for its own token log-probabilities (compared with the
        trainer's, ``generation/logprob_mismatch_*``): ``generation_logprobs`` when set, else
        whether the backend says they cost it nothing (``cheap_logprobs``: the static backend
        computes them while sampling; transformers ``generate`` would keep every step's scores)."""
        wanted = self.args.generation_logprobs
        return bool(getattr(self.backend, "cheap_logprobs", False)) if wanted is None else wanted

    def _push_weights(self) -> None:
        """Hand the backend the policy's current weights and their version (the steps done), so
        an engine with its own copy of the weights samples the next batch from them."""
        self.backend.update_weights(self.unwrapped, self.step)

    def _generation_mismatch(self, groups: list[ScoredGroup], completion_mask: torch.Tensor,
                             old_logps: torch.Tensor) -> dict[str, float]:
        """``generation/logprob_mismatch_mean``, ``_max`` and ``generation/kl_k3``
        (:func:`mtgrpo.algo.metrics.logprob_mismatch`) over the trained completion tokens of every
        process, pooled token by token (not a mean of per-process means, nor a local max): the
        backend's log-probs of its samples against the trainer's at θ_t (``old_logps`` /
        ``completion_mask``: ``[n, L]``, this process's rows).

        Every process takes part in the gather, whatever it holds, so that the collective
        operations stay in step: one without trained rows sends no tokens, and one whose
        trained completions lack the backend's log-probs says so. The metrics are then ``{}`` on
        every process, as on one process, where they are logged only when every trained
        completion has them (a mismatch over some backends' tokens only would measure another
        quantity on N processes than on one)."""
        local = self._engine_and_trainer_logps(groups, completion_mask, old_logps)
        pairs = self._gather_objects([local]) if self.world > 1 else [local]
        if any(pair is None for pair in pairs):
            self._warn_no_engine_logprobs()
            return {}
        return logprob_mismatch(np.concatenate([p[0] for p in pairs]),
                                np.concatenate([p[1] for p in pairs]))

    def _warn_no_engine_logprobs(self) -> None:
        """Say once why ``generation/logprob_mismatch_*`` is missing when the user asked for it
        (``generation_logprobs: true``) and the backend returned no log-probabilities."""
        if not self.args.generation_logprobs or self._warned_no_engine_logprobs:
            return
        self._warned_no_engine_logprobs = True
        if not self.is_main_process:
            return
        logger.warning(
            "generation_logprobs is true, but the generation backend (%s) returned no "
            "log-probabilities for some trained completions, so generation/logprob_mismatch_* "
            "and generation/kl_k3 are not logged; have its generate() fill "
            "GenerationOutput.logprobs when SamplingParams.return_logprobs is set, or set "
            "generation_logprobs: false", type(self.backend).__name__)

    def _engine_and_trainer_logps(self, groups: list[ScoredGroup], completion_mask: torch.Tensor,
                                  old_logps: torch.Tensor
                                  ) -> tuple[np.ndarray, np.ndarray] | None:
        """This process's trained tokens as ``([M] backend log-probs, [M] trainer log-probs)``
        (``M = 0`` on a process that holds only the padding group), or None when a trained
        completion has no backend log-probs."""
        local, has_rows = self._local_groups(groups)
        if not has_rows:
            nothing = np.zeros(0, dtype=np.float32)
            return nothing, nothing
        rows = [row for i in local for row in (groups[i].payload.logprobs or [None])]
        if any(row is None for row in rows):
            return None
        assert len(rows) == old_logps.shape[0], (len(rows), tuple(old_logps.shape))
        engine = torch.zeros_like(old_logps, device="cpu")  # [n, L]
        for i, row in enumerate(rows):
            engine[i, : len(row)] = torch.tensor(row, dtype=engine.dtype)
        mask = completion_mask.bool().cpu()  # [n, L]: the tokens the update trained on
        return engine[mask].numpy(), old_logps.detach().cpu()[mask].numpy()

    def _gather_objects(self, local: list[Any]) -> list[Any]:
        from accelerate.utils import gather_object

        return gather_object(local)

    @property
    def is_main_process(self) -> bool:
        return self.accelerator.is_main_process

    # ------------------------------------------------------------------ TRL's hooks
    @staticmethod
    def get_off_policy_mask(advantages: torch.Tensor, per_token_logps: torch.Tensor,
                            sampling_per_token_logps: torch.Tensor, mask: torch.Tensor,
                            off_policy_threshold: float) -> torch.Tensor:
        """TRL's off-policy sequence mask, ``[B, 1]`` (1.0 keep, 0.0 drop): see
        :func:`mtgrpo.algo.token_weights.off_policy_mask`."""
        from mtgrpo.algo.token_weights import off_policy_mask

        keep = off_policy_mask(advantages.reshape(-1), per_token_logps, sampling_per_token_logps,
                               mask, off_policy_threshold)
        return keep.unsqueeze(-1).to(mask.dtype)

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor,
                              threshold: float) -> torch.Tensor:
        """TRL's high-entropy mask: tokens whose entropy is at least the ``threshold``
        quantile of the non-padding entropies of every process."""
        from mtgrpo.algo.token_weights import entropy_threshold, high_entropy_mask

        local = entropies[mask.bool()].float()
        sentinel = -1e9  # entropies are >= 0, so the padding value cannot collide
        padded = self.accelerator.pad_across_processes(local, dim=0, pad_index=sentinel)
        gathered = self.accelerator.gather(padded)
        gathered = gathered[gathered != sentinel]
        return high_entropy_mask(entropies, mask, entropy_threshold(gathered, threshold))

    # ------------------------------------------------------------------ one step
    def _estimate(self, rewards: np.ndarray, group_size: int) -> AdvantageResult:
        """The advantage estimator with the run's settings (the rollout worker calls it once per
        round of scored groups): ``rewards [N, R]`` -> advantages ``[N]`` and every group's
        zero-gradient verdict."""
        args = self.args
        return compute_advantages(
            torch.from_numpy(rewards), group_size, reward_weights=self.rewards.reward_weights,
            aggregation=args.multi_objective_aggregation, scale_rewards=args.scale_rewards,
            gates=self.rewards.gates, none_handling=args.none_handling,
            on_unscorable=self.on_unscorable, ddof=args.advantage_std_ddof,
            eps=args.advantage_epsilon,
        )

    def _batch_advantages(self, groups: list[ScoredGroup], group_size: int) -> torch.Tensor:
        """``[len(groups) * G]``: the advantages the update trains on, each group's own (computed
        when it was scored), except that a batch-level estimator (``scale_rewards="batch"``,
        ``gdpo``) runs again because it normalises over the trained batch, which exists only
        once the sampler has chosen it."""
        args = self.args
        if normalises_over_the_batch(args.multi_objective_aggregation, args.scale_rewards):
            return self._estimate(np.concatenate([g.rewards for g in groups]),
                                  group_size).advantages
        return torch.from_numpy(np.concatenate([g.advantages for g in groups]))

    def _local_groups(self, groups: list[ScoredGroup]) -> tuple[list[int], bool]:
        """This process's share of whole groups (indices), and whether it has any; a process
        without one takes group 0 as a fully masked padding group, so that collective
        operations stay in step."""
        start, stop = Shard(self.rank, self.world).bounds(len(groups))
        local = list(range(start, stop))
        return (local, True) if local else ([0], False)

    def _local_policy_batch(self, groups: list[ScoredGroup], advantages: torch.Tensor,
                            group_size: int | None = None):
        """This process's share of whole groups as a padded policy batch, and its task ids."""
        g = group_size or self.args.num_generations
        local, has_rows = self._local_groups(groups)
        weight = [has_rows] * (len(local) * g)
        payloads: list[GroupPayload] = [groups[i].payload for i in local]
        if self.args.mask_truncated_completions:
            finished = [f for p in payloads for f in p.finished]
            weight = [w and f for w, f in zip(weight, finished, strict=True)]
        rows = torch.cat([advantages[i * g:(i + 1) * g] for i in local])
        batch = pad_policy_batch(
            [ids for p in payloads for ids in p.row_prompt_ids],
            [c for p in payloads for c in p.completion_ids], rows,
            self.tokenizer.pad_token_id, completion_weight=weight,
            device=self.accelerator.device, sampling_logps=self._engine_logps(payloads),
            tool_masks=[m for p in payloads for m in (p.tool_mask or [None] * g)],
        )
        tasks = np.repeat([groups[i].task for i in local], g)
        return batch, tasks, has_rows

    def _engine_logps(self, payloads: list[GroupPayload]) -> list[list[float]] | None:
        """The engine's log-probs of the rows, for its importance correction (vLLM), or None
        when the correction is off. Every row must have them: the engine returns them."""
        if engine_correction(self.args) is None:
            return None
        rows = [row for p in payloads for row in (p.logprobs or [None] * len(p.completion_ids))]
        if any(row is None for row in rows):
            raise RuntimeError(
                f"vllm_importance_sampling_correction needs the engine's log-probs, and the "
                f"generation backend ({type(self.backend).__name__}) returned none"
            )
        return rows

    def _correction_metrics(self, batch: Any, at_start: torch.Tensor) -> dict[str, float]:
        """TRL's ``sampling/*`` figures of the engine's importance correction, pooled over the
        trained tokens (or completions) of every process."""
        correction = engine_correction(self.args)
        if correction is None or batch.sampling_logps is None:
            return {}
        mask = batch.completion_mask
        weights = importance_weights(at_start.float(), batch.sampling_logps, mask, correction)
        local = correction_figures(at_start.float(), batch.sampling_logps, mask, weights,
                                   correction)
        pairs = self._gather_objects([local]) if self.world > 1 else [local]
        return correction_metrics(np.concatenate([p[0] for p in pairs]),
                                  np.concatenate([p[1] for p in pairs]))

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

    def _update(self, groups: list[ScoredGroup], generated: int,
                metrics: dict[str, Any]) -> np.ndarray | None:
        """The policy update on the batch's groups (``generated``: completions generated this
        step, for the completion logs); MT-GRPO's improvement if it needs it."""
        if not groups:
            logger.warning("step %d: no informative group was generated; update skipped",
                           self.step + 1)
            metrics["update_skipped"] = 1.0
            # nothing was trained, so no change was measured
            return np.full(len(self.task_names), math.nan) if self.needs_improvement else None
        advantages = self._batch_advantages(groups, self.args.num_generations)  # [B*G]
        batch, tasks, has_rows = self._local_policy_batch(groups, advantages)
        out = self.updater.update(batch, measure_after=self.needs_improvement,
                                  keep_old_logps=self.sampling_params.return_logprobs,
                                  # fewer when TRL's max_steps ends inside this batch
                                  max_steps=self.max_optimizer_steps - self.state.global_step)
        metrics.update(out.metrics)
        if out.old_logps is not None:
            metrics.update(self._generation_mismatch(groups, batch.completion_mask, out.old_logps))
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
        scored; :meth:`_batch_advantages` says when the trained batch needs another pass)::

            weights = self.weighting.weights                                   # z [K]
            built = self.sampler.build(weights, B, self.rollouts)              # SampledBatch
            advantages = self._batch_advantages(built.groups, G)               # [B*G]
            out = self.updater.update(pad_policy_batch(..., advantages), ...)  # (in _update)
            self.weighting.update(TaskStats.from_rollouts(rows of built.generated, ...))
            self._push_weights()    # backend.update_weights(policy, self.step): generation follows
        """
        seconds = {"begin": time.perf_counter()}
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
            advantages = np.concatenate([g.advantages for g in generated])  # [N]
            stats = self._weighting_stats(generated, advantages, improvement)
            self.weighting.update(stats)
        if self.validation is not None:  # the I_k the weights read, for the metrics
            improvement = stats.improvement if self.reads_improvement else None
        self.step += 1
        self._push_weights()
        metrics = self._step_metrics(built, weights, improvement, {**update, **validated},
                                     seconds)
        self._remember_completions(generated, advantages)
        if self.args.save_rollouts and self.is_main_process:
            self._save_rollouts(generated, advantages)
        return metrics

    def _step_metrics(self, built: Any, weights: np.ndarray, improvement: np.ndarray | None,
                      metrics: dict[str, Any], seconds: dict[str, float]) -> dict[str, Any]:
        """A training step's record: ``metrics`` (the update's and the validation's) plus the
        weighting's diagnostics, per-task and per-channel statistics, rollout and tool counts,
        tokens seen and the timings (``seconds``: the step's start, update and weighting)."""
        generated, report = built.generated, built.report
        diagnostics = getattr(self.weighting, "diagnostics", None)  # a registered duck type
        if diagnostics is not None:  # may have none
            metrics.update(diagnostics())  # e.g. MT-GRPO's improvement share
        values = np.concatenate([g.rewards for g in generated])  # [N, R]
        scalar = scalar_rewards(values, np.asarray(self.rewards.reward_weights))  # [N]
        metrics.update(task_metrics(self.task_names, generated, scalar, weights, report,
                                    improvement))
        errors = [g.payload.reward_errors for g in generated]
        errors = np.concatenate(errors) if generated and all(e is not None for e in errors) \
            else None
        metrics.update(channel_metrics(self.rewards.channel_names, values, scalar, errors))
        metrics.update(self.rewards.pop_timeouts())
        metrics.update(self._rollout_metrics(generated, report))
        metrics.update(self.rollouts.tool_metrics())
        metrics["frac_reward_zero_std"] = float(np.mean([g.zero_gradient for g in generated]))
        metrics.update(self.log_window.step_custom())
        metrics["num_tokens"] = float(self.state.num_input_tokens_seen)
        if self.args.include_num_input_tokens_seen == "all":  # the Trainer's name for it
            metrics["num_input_tokens_seen"] = metrics["num_tokens"]
        metrics.update({
            "time/generate": self.rollouts.seconds["generate"],
            "time/score": self.rollouts.seconds["score"],
            "time/update": seconds["update"], "time/weighting": seconds["weighting"],
            "time/step": time.perf_counter() - seconds["begin"],
            "throughput/tokens_per_second": self.rollouts.tokens_generated
            / max(self.rollouts.seconds["generate"], 1e-9),
        })
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

    def _validate_if_due(self) -> dict[str, Any]:
        """With ``task_weighting_signal: validation``: evaluate the validation split when it is
        due (step 0, then every ``validation_steps`` steps; at once when a resumed run holds no
        result) and hand the result to the weights' :class:`ValidationSignal`. Returns the
        held-out accuracies the weights read (``validation/<task>/accuracy``, the step they
        were measured at as ``weighting/validation_step``, and ``time/validation`` when the
        split was evaluated now); ``{}`` when the weights read the training batch."""
        if self.validation is None or self.validation_prompts is None:
            return {}
        last, out = self.validation.last_step, {}
        if last is None or (self.step % self.validation_every == 0 and last < self.step):
            begin = time.perf_counter()
            self.unwrapped.eval()
            try:
                result = self._sample_held_out(self.validation_prompts,
                                               self.args.resolved_num_generations_validation)
            finally:
                self.unwrapped.train()
            groups = result.groups
            self.validation.observe(self.step, self._group_stats(
                groups, np.concatenate([g.advantages for g in groups])))
            out["time/validation"] = time.perf_counter() - begin
        stats = self.validation.task_stats()
        assert stats is not None
        for k, name in enumerate(self.task_names):
            out[f"validation/{name}/accuracy"] = float(stats.accuracy[k])
        out["weighting/validation_step"] = self.validation.last_step
        return out

    def _rollout_metrics(self, generated: list[ScoredGroup], report: Any) -> dict[str, Any]:
        lengths = np.array([n for g in generated for n in g.payload.model_token_counts])
        finished = np.array([f for g in generated for f in g.payload.finished], dtype=bool)
        out = length_metrics(lengths, finished)
        if finished.any():  # TRL's lengths of the completions that ended with a stop token
            ended = lengths[finished]
            out.update({"completions/mean_terminated_length": float(ended.mean()),
                        "completions/min_terminated_length": float(ended.min()),
                        "completions/max_terminated_length": float(ended.max())})
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

    def _remember_completions(self, generated: list[ScoredGroup],
                              advantages: np.ndarray) -> None:
        """TRL's ``trainer._logs``: the step's prompts, completions, rewards, advantages."""
        logs = self._logs
        for group in generated:
            for j, completion in enumerate(group.payload.completions):
                logs["prompt"].append(self.train_prompts.prompt(group.prompt_id))
                logs["completion"].append(completion)
                for r, name in enumerate(self.rewards.channel_names):
                    logs["rewards"][name].append(float(group.rewards[j, r]))
        logs["advantages"].extend(advantages.tolist())

    def _save_rollouts(self, generated: list[ScoredGroup], advantages: np.ndarray) -> None:
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

    def _log_batch_rollouts(self, groups: list[ScoredGroup], advantages: torch.Tensor,
                            generated: int) -> None:
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
        for column, values in self._pending_extra.items():
            if len(values) == generated == len(records):  # one value per completion
                for record, value in zip(records, values, strict=True):
                    record[column] = value
        self._jsonl("completions.jsonl", records)

    def _print_completions(self) -> None:
        """TRL's ``num_completions_to_print``: a table of the newest completions."""
        count = self.args.num_completions_to_print
        if not (self.args.log_completions and count and self.is_main_process):
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"completions at step {self.step}", show_lines=True)
        for column in ("prompt", "completion", "advantage"):
            table.add_column(column)
        rows = list(zip(self._logs["prompt"], self._logs["completion"],
                        self._logs["advantages"], strict=False))[-count:]
        for prompt, completion, advantage in rows:
            table.add_row(str(prompt), str(completion), f"{advantage:.2f}")
        Console().print(table)

    # ------------------------------------------------------------------ evaluation
    def _eval_params(self) -> SamplingParams:
        args = self.args
        return SamplingParams(
            max_new_tokens=args.max_completion_length, temperature=args.eval_temperature,
            top_p=args.top_p if args.eval_temperature > 0 else 1.0,
            top_k=args.top_k if args.eval_temperature > 0 else 0,
        )

    def _sample_held_out(self, prompts: PromptSet, num_samples: int) -> Any:
        """``num_samples`` completions of every prompt of ``prompts`` at the evaluation's
        sampling settings, scored, with their advantages
        (:class:`~mtgrpo.evaluation.EvaluationResult`; the same on every process)."""
        from mtgrpo.evaluation import evaluate_prompts

        with self._gathered():  # sharded: every process gathers, prompts or not
            return evaluate_prompts(
                prompts, self.backend, self.rewards, self._eval_params(), num_samples,
                self.tokenizer, accuracy_threshold=self.args.accuracy_threshold,
                accuracy_channel=self.accuracy_channel,
                shard=Shard(self.rank, self.world, gather=self._gather_objects),
                extra=self._reward_extras(), estimate=self._estimate,
                agent=self._agent_runner,
            )

    def _evaluate_set(self, prompts: PromptSet) -> dict[str, Any]:
        """Per-task accuracy (``num_generations_eval`` samples per prompt) and TRL's ``loss``:
        the GRPO loss of the evaluation completions at the current policy. ``time/eval``: the
        seconds of the whole evaluation, the loss included."""
        begin = time.perf_counter()
        g = self.args.num_generations_eval
        self.unwrapped.eval()
        try:
            result = self._sample_held_out(prompts, g)
            metrics = result.metrics()
            self._warn_answers(result)
            if result.groups:
                advantages = self._batch_advantages(result.groups, g)  # [N]
                batch, _, _ = self._local_policy_batch(result.groups, advantages, g)
                metrics["loss"] = self.updater.evaluation_loss(batch)
                values = np.concatenate([group.rewards for group in result.groups])  # [N, R]
                scalar = scalar_rewards(values, np.asarray(self.rewards.reward_weights))
                metrics.update(channel_metrics(self.rewards.channel_names, values, scalar))
        finally:
            self.unwrapped.train()
        metrics["time/eval"] = time.perf_counter() - begin
        return metrics

    def _warn_answers(self, result: Any) -> None:
        """Log once per task and kind when an evaluation's answers show a task learned without
        solving it (:func:`mtgrpo.evaluation.answer_warnings`; its figures are in the metrics
        as ``tasks/<task>/top_answer_share`` and ``tasks/<task>/constant_baseline``)."""
        from mtgrpo.evaluation import answer_warnings

        for task, kind, message in answer_warnings(result):
            if (task, kind) not in self._answer_warnings and self.rank == 0:
                logger.warning("step %d: %s", self.step, message)
            self._answer_warnings.add((task, kind))

    def _eval_prompt_sets(self, eval_dataset: Any) -> dict[str | None, PromptSet]:
        if eval_dataset is None:
            return self.eval_sets
        data = training_rows(self.train_dataset, eval_dataset, self.args.task_column)
        sets = {}
        for name, rows in data.evals.items():
            sets[name] = PromptSet(rows, self.tokenizer,
                                   max_prompt_length=self.args.max_prompt_length,
                                   on_long_prompt=self.args.on_long_prompt,
                                   chat_template_kwargs=self.args.chat_template_kwargs)
            self.rewards.validate_tasks(sets[name].task_names)
        return sets

    def evaluate(self, eval_dataset: Any = None, ignore_keys: Any = None,
                 metric_key_prefix: str = "eval") -> dict[str, Any]:
        """Evaluate on ``eval_dataset`` (default: the trainer's); returns the metrics with
        transformers' prefixes (``eval_loss``, ``eval_accuracy/worst``; a named set
        ``data1`` gives ``eval_data1_loss``), logs them and calls ``on_evaluate``."""
        sets = self._eval_prompt_sets(eval_dataset)
        if not sets:
            raise ValueError("evaluate() needs an eval_dataset (here or in the constructor)")
        out: dict[str, Any] = {}
        for name, prompts in sets.items():
            metrics = self._evaluate_set(prompts)
            self._write(metrics, "eval" if name is None else f"eval/{name}")
            prefix = metric_key_prefix if name is None else f"{metric_key_prefix}_{name}"
            out.update({f"{prefix}_{key}": value for key, value in metrics.items()})
        self._record(out)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control,
                                                         metrics=out)
        return out

    # ------------------------------------------------------------------ checkpoints
    def _trainer_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "world_size": self.world,
            "task_names": self.task_names,
            "weighting": self.weighting.state_dict(),
            **({"validation": self.validation.state_dict()} if self.validation else {}),
            "sampler": self.sampler.state_dict(),
            "entropy": self.updater.entropy.state_dict(),
            "hf_state": dataclasses.asdict(self.state),
            "identity": self._identity(),
            **({"sharded": True} if self.sharded else {}),
        }

    def _identity(self) -> dict[str, Any]:
        """What this run's steps mean (:mod:`mtgrpo.trainer.identity`)."""
        config = getattr(self.unwrapped, "config", None)
        parameters = sum(p.numel() for p in self.unwrapped.parameters())
        model = f"{getattr(config, 'model_type', type(self.unwrapped).__name__)}, " \
                f"{parameters} parameters"
        return run_identity(self.args, tasks=self.task_names, channels=self.rewards.channel_names,
                            model=model)  # fmt: skip

    def save_checkpoint(self) -> Path | None:
        """Write ``checkpoint-<step>`` atomically (main process) and rotate old ones.

        With ``save_only_model`` only the model is written (no resuming from it)."""
        rng_states = self._gather_objects([ckpt.rng_state()]) if self.world > 1 \
            else [ckpt.rng_state()]
        final = self.output_dir / f"checkpoint-{self.state.global_step}"
        # sharded: the whole state, gathered on the main process by every process
        weights = sharding.full_model_state(self.unwrapped) if self.sharded else None
        optimizer_state = sharding.full_optimizer_state(self.unwrapped, self.optimizer) \
            if self.sharded and not self.args.save_only_model else None
        if self.is_main_process:
            def write(tmp: Path) -> None:
                self._write_model(tmp / "model", weights)
                if not self.args.save_only_model:
                    ckpt.save_trainable(self.unwrapped, tmp / "trainable.safetensors", weights)
                    torch.save(self.optimizer.state_dict() if optimizer_state is None
                               else optimizer_state, tmp / "optimizer.pt")
                    torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
                    for rank, state in enumerate(rng_states):
                        torch.save(state, tmp / f"rng_state_{rank}.pt")
                (tmp / "trainer_state.json").write_text(json.dumps(self._trainer_state()))

            if self.state.best_global_step == self.state.global_step:
                self.state.best_model_checkpoint = str(final)
            previous = ckpt.latest_checkpoint(self.output_dir)
            try:
                write_atomically(final, write)
            except (OSError, RuntimeError) as error:  # torch reports a full disk as RuntimeError
                raise ckpt.save_failure(final, error, previous) from error
            best = self.state.best_model_checkpoint
            ckpt.rotate_checkpoints(self.output_dir, self.args.save_total_limit,
                                    keep=Path(best) if best else None)
            if self._hub is not None:
                self._hub.on_save(self.args.hub_strategy, final / "model", final,
                                  self.state.global_step)
        self.accelerator.wait_for_everyone()
        self.control = self.callback_handler.on_save(self.args, self.state, self.control)
        return final if self.is_main_process else None

    def save_model(self, directory: str | Path | None = None) -> None:
        """The model (or LoRA adapter) and tokenizer in ``save_pretrained`` format (default
        directory: ``output_dir``, as transformers). A sharded model is gathered first (every
        process must call it) and written by the main process."""
        weights = sharding.full_model_state(self.unwrapped) if self.sharded else None
        if self.sharded and not self.is_main_process:
            return
        self._write_model(Path(directory if directory is not None else self.args.output_dir),
                          weights)

    def _write_model(self, directory: Path, weights: dict[str, torch.Tensor] | None) -> None:
        """``save_pretrained`` of the model (``weights``: its gathered state when sharded) and
        of the tokenizer."""
        self.unwrapped.save_pretrained(directory, safe_serialization=True, state_dict=weights)
        self.tokenizer.save_pretrained(directory)

    def _resume(self, target: str | bool) -> None:
        checkpoint = ckpt.latest_checkpoint(self.output_dir) if target is True else Path(target)
        if checkpoint is None or not (checkpoint / "trainer_state.json").is_file():
            raise FileNotFoundError(
                f"no checkpoint to resume from ({target!r} in {self.output_dir}); train from "
                "scratch by leaving resume_from_checkpoint unset"
            )
        state = _read(checkpoint / "trainer_state.json",
                      lambda p: ckpt.read_trainer_state(p.parent))
        if not (checkpoint / "trainable.safetensors").is_file():
            raise ValueError(f"{checkpoint} was written with save_only_model=True and holds no "
                             "optimizer or sampler state; it cannot be resumed from")
        if state["world_size"] != self.world or state["task_names"] != self.task_names:
            raise ValueError(
                f"{checkpoint} was written by {state['world_size']} process(es) for tasks "
                f"{state['task_names']}; resume with the same processes and tasks"
            )
        self._accepted_changes = check_resumable(checkpoint, state.get("identity"),
                                                 self._identity(),
                                                 self.args.resume_allow_changes)  # fmt: skip
        if bool(state.get("sharded", False)) != self.sharded:
            raise ValueError(
                f"{checkpoint} was written by a {'sharded' if state.get('sharded') else 'plain'}"
                f" run (fsdp={'full_shard' if state.get('sharded') else 'unset'}); resume with "
                "the same fsdp setting")
        if self.sharded:
            self._load_sharded(checkpoint)
        else:
            _read(checkpoint / "trainable.safetensors",
                  lambda p: ckpt.load_trainable(self.unwrapped, p))
            saved = _read(checkpoint / "optimizer.pt",
                          lambda p: torch.load(p, weights_only=False))
            _read(checkpoint / "optimizer.pt", lambda _: self.optimizer.load_state_dict(saved))
        saved = _read(checkpoint / "scheduler.pt", lambda p: torch.load(p, weights_only=False))
        _read(checkpoint / "scheduler.pt", lambda _: self.scheduler.load_state_dict(saved))
        self.weighting.load_state_dict(state["weighting"])
        if self.validation is not None and "validation" in state:  # else: evaluated at once
            self.validation.load_state_dict(state["validation"])
        self.sampler.load_state_dict(state["sampler"])
        if "entropy" in state:
            self.updater.entropy.load_state_dict(state["entropy"])
        if "hf_state" in state:
            self._restore_state(state["hf_state"])
        self.step = int(state["step"])
        self.state.global_step = self._optimizer_steps_after(self.step)
        _read(checkpoint / f"rng_state_{self.rank}.pt",
              lambda p: ckpt.load_rng_state(p.parent, self.rank))
        if self.is_main_process:
            MetricsWriter.rewind(self.output_dir / "metrics.jsonl", self.step)
        logger.info("resumed from %s at step %d", checkpoint, self.step)

    def _load_sharded(self, checkpoint: Path) -> None:
        """The checkpoint's whole model and optimizer state, read by the main process and
        handed to every process's shards."""
        weights: dict[str, Any] = {}
        optimizer_state: dict[str, Any] = {}
        if self.is_main_process:
            weights = _read(checkpoint / "trainable.safetensors",
                            lambda p: ckpt.read_checked_trainable(self.unwrapped, p))
            optimizer_state = _read(checkpoint / "optimizer.pt",
                                    lambda p: torch.load(p, weights_only=False))
        sharding.load_full_state(self.unwrapped, self.optimizer, weights, optimizer_state)

    def _restore_state(self, saved: Mapping[str, Any]) -> None:
        """The checkpoint's TrainerState (log history, best metric), kept in this object so
        reward functions holding ``trainer_state`` see the same one."""
        for name, value in saved.items():
            if hasattr(self.state, name):
                setattr(self.state, name, value)
        self.state.max_steps = self.max_optimizer_steps

    # ------------------------------------------------------------------ logging
    def _write_config(self) -> None:
        import yaml

        config = self.run_config if self.run_config is not None \
            else self.args.run_file_dict()
        # atomically: another process (a grid planning its runs) may read it meanwhile
        write_text_atomically(self.output_dir / "config.yaml",
                              yaml.safe_dump(config, sort_keys=False))

    def _write(self, metrics: Mapping[str, Any], split: str) -> None:
        """One record of metrics.jsonl and the trackers (main process, during train())."""
        if self._writer is None:
            return
        self._writer.write({"step": self.step, "split": split, **metrics})
        if self._trackers is not None:
            self._trackers.log(metrics, self.step, split)

    # ------------------------------------------------------------------ the loop
    def train(self, resume_from_checkpoint: str | bool | None = None,
              **_: Any) -> hooks.TrainOutput:
        """Train for ``max_steps`` steps (or ``num_train_epochs`` epochs); returns the last
        step's metrics (with transformers' ``TrainOutput`` fields).

        ``resume_from_checkpoint`` (TRL's argument, default ``args.resume_from_checkpoint``):
        a checkpoint directory, or True for the newest in ``output_dir``.
        """
        args = self.args
        target = resume_from_checkpoint if resume_from_checkpoint is not None \
            else args.resume_from_checkpoint
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if self.is_main_process:  # what a save interrupted by a kill left behind
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
            self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
            last = self._loop()
        finally:
            self._close_outputs()
        summary = hooks.train_summary(start, self.step - first_step, self.prompts_per_step,
                                      args.num_generations, self.log_window.run_losses)
        self._record({**hooks.with_trl_names(last), **summary})
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        if args.load_best_model_at_end and self.state.best_model_checkpoint:
            self._load_best_model()
        if args.push_to_hub:  # every process: a sharded model is gathered first
            self.push_to_hub(commit_message="End of training")
        steps = self.step - first_step
        if steps and self._idle_steps == steps and self.is_main_process:
            logger.warning("%s", nothing_learned_message(
                f"all {steps} steps of this run", last, args.temperature, args.num_generations))
        if args.report_at_end and self.is_main_process:
            self._report_at_end()
        return hooks.TrainOutput(last, self.state.global_step, summary["train_loss"], summary)

    def _report_at_end(self) -> None:
        """What ``mtgrpo train`` shows when a run ends, for every ``train()``: the ``report/``
        figures (a run too short to plot gets a warning instead) and the run summary."""
        from rich.console import Console

        from mtgrpo.reporting import plot_run
        from mtgrpo.reporting.compare import load_run, run_report, summarize_run, summarize_tasks

        # the training is done and saved: a report that cannot be made is a warning, not a
        # failed train()
        try:
            written = plot_run(self.output_dir, self.output_dir / "report")
            logger.info("report figures: %s", ", ".join(str(p) for p in written))
        except (ValueError, FileNotFoundError) as exc:
            logger.warning("no report figures: %s", exc)
        try:
            history = load_run(self.output_dir)
            Console().print(run_report(summarize_run(history), summarize_tasks(history)))
        except (ValueError, FileNotFoundError) as exc:
            logger.warning("no run summary: %s", exc)
        print(f"run directory: {self.output_dir}  (metrics.jsonl, checkpoints, report/)")

    def _open_outputs(self) -> None:
        args = self.args
        self._writer = self._trackers = None
        if not self.is_main_process:
            return
        self._write_config()
        config = self.run_config
        if config is None:  # a Python run: its counting, so the file loads back as it ran
            counts = self.args.step_counts
            config = {**({"step_counts": counts} if counts != "training" else {}),
                      **self.args.to_dict()}
        record_history(self.output_dir, self.step, config, self._accepted_changes)
        self._writer = MetricsWriter(self.output_dir / "metrics.jsonl")
        self._writer.write(self.run_record())
        if args.report_to:
            self._trackers = Trackers(args.report_to, self.output_dir,
                                      args.run_name or self.output_dir.name, args.to_dict())
        if args.push_to_hub:
            self._hub = HubUploader(
                default_repo_id(args.output_dir, args.hub_model_id), token=args.hub_token,
                private=args.hub_private_repo, revision=args.hub_revision)

    def _close_outputs(self) -> None:
        for output in (self._writer, self._trackers):
            if output is not None:
                output.close()
        self._writer = self._trackers = None

    def _loop(self) -> dict[str, Any]:
        """The training steps, with the callbacks' events between them."""
        from mtgrpo.trainer.progress import TrainingProgress

        args, handler, last = self.args, self.callback_handler, {}
        shown = self.is_main_process and not args.disable_tqdm
        self._bar_is_live = shown and use_bar()
        with TrainingProgress(self.max_steps, self.step, enabled=shown) as bar, \
                StopRequests() as stop:
            if self.eval_sets and args.eval_on_start and self.step == 0 \
                    and args.eval_strategy != "no":
                self.evaluate()
            while self.step < self.max_steps and not self.control.should_training_stop:
                if self.step % self.steps_per_epoch == 0:
                    self.control = handler.on_epoch_begin(args, self.state, self.control)
                self.control = handler.on_step_begin(args, self.state, self.control)
                last = self._profiled_step() if args.profile and not last \
                    else self.training_step()
                self.state.epoch = self.step / self.steps_per_epoch
                self.log_window.add_step(last, args.logging_nan_inf_filter)
                self._watch_learning(last)
                self._after_step()
                # the callbacks see each optimizer step of the batch, as in TRL's loop
                while self.state.global_step < self._optimizer_steps_after(self.step):
                    self.state.global_step += 1
                    self.control = handler.on_step_end(args, self.state, self.control)
                if self.step % self.steps_per_epoch == 0:
                    self.control = handler.on_epoch_end(args, self.state, self.control)
                self._log_save_evaluate(last)
                bar.advance(self.step, last)
                if self._agreed(stop.requested is not None):
                    self._stop_on_signal(stop.requested or signal.SIGTERM)
        return last

    def _optimizer_steps_after(self, step: int) -> int:
        """``state.global_step`` once ``step`` training steps are done (TRL's count)."""
        return min(step * self.args.optimizer_steps_per_step(), self.max_optimizer_steps)

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
                f"the last {NOTHING_LEARNED_STEPS} steps", metrics, self.args.temperature,
                self.args.num_generations))

    def _agreed(self, local: bool) -> bool:
        """True on every process when any process has it true (one small collective)."""
        return any(self._gather_objects([local])) if self.world > 1 else local

    def _stop_on_signal(self, signum: int) -> None:
        """After a SIGTERM/SIGINT: a checkpoint of the step just finished, then a
        :class:`~mtgrpo.trainer.stopping.TrainingInterrupted` that says how to resume."""
        checkpoint = self.output_dir / f"checkpoint-{self.state.global_step}"
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

    def run_record(self) -> dict[str, Any]:
        """How this run computes, the ``split: "run"`` record at the head of each ``train()``
        call in ``metrics.jsonl``: the generation backend (and the static backend's decode
        path), whether the update's forward is padding-free, and the versions of torch,
        transformers and mtgrpo. Also logged at INFO."""
        import transformers

        from mtgrpo._version import __version__

        route = resolve_logprob_path(self.unwrapped)
        record = {
            "step": self.step, "split": "run", **backend_description(self.backend),
            "policy/logprob_path": route.path,
            "policy/padding_free": bool(self.args.padding_free and route.packed),
            "weighting/signal": self.args.task_weighting_signal,
            "precision/bf16": self.bf16, "precision/bf16_reason": self.bf16_reason,
            "generation/dtype": str(getattr(self.backend, "dtype", None) or
                                    next(self.unwrapped.parameters()).dtype).removeprefix("torch."),
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


def _release_accelerator_state(precision: str) -> None:
    """accelerate keeps one ``AcceleratorState`` per process and refuses a second trainer with
    another precision; forget it then (the process group, ``PartialState``, is kept)."""
    from accelerate.state import AcceleratorState

    if AcceleratorState._shared_state and str(
            AcceleratorState._shared_state.get("_mixed_precision", precision)) != precision:
        AcceleratorState._reset_state(reset_partial_state=False)


def _ddp_kwargs(args: GRPOConfig) -> list[Any]:
    """accelerate kwargs handlers for TRL's ddp_* options (only those that are set)."""
    import datetime

    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

    handlers: list[Any] = []
    ddp = {name: getattr(args, f"ddp_{name}") for name in (
        "find_unused_parameters", "bucket_cap_mb", "broadcast_buffers", "static_graph")}
    ddp = {k: v for k, v in ddp.items() if v is not None}
    if ddp:
        handlers.append(DistributedDataParallelKwargs(**ddp))
    if args.ddp_backend is not None or args.ddp_timeout != 1800:
        handlers.append(InitProcessGroupKwargs(
            backend=args.ddp_backend, timeout=datetime.timedelta(seconds=args.ddp_timeout)))
    return handlers
