"""How :class:`~mtgrpo.trainer.GRPOTrainer` is put together: every check that can fail runs
before a model loads, then the rewards, the accelerator, the prompts, the task weighting, the
sampler and estimator, the optimizer and the generation backend, and the loop's ``state`` and
flow (:mod:`~mtgrpo.trainer.flow`) are built in that order."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import random
from collections import defaultdict, deque
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from mtgrpo.algo.advantages import compute_advantages
from mtgrpo.algo.sampling import make_sampler
from mtgrpo.algo.weighting import ValidationSignal, make_weighting
from mtgrpo.config import RolloutConfig, TrainConfig
from mtgrpo.models.precision import resolve_bf16
from mtgrpo.policy import build_optimizer, build_scheduler
from mtgrpo.reporting import MetricsWriter, Trackers
from mtgrpo.rewards.accuracy import accuracy_channel_index
from mtgrpo.rollout import (
    RolloutWorker,
    SamplingParams,
    Shard,
)
from mtgrpo.tasks.prompt_set import PromptSet, is_lazy_split
from mtgrpo.trainer import deepspeed as zero
from mtgrpo.trainer import hooks, sharding
from mtgrpo.trainer.flow import Flow
from mtgrpo.trainer.hub import HubUploader
from mtgrpo.trainer.setup import (
    TrainingData,
    build_backend,
    build_reward_suite,
    reward_processing_list,
    validation_rows,
)
from mtgrpo.trainer.update import PolicyUpdater

logger = logging.getLogger("mtgrpo.trainer.trainer")  # the trainer's logger


class TrainerBuilding:
    """Mixed into :class:`~mtgrpo.trainer.GRPOTrainer` (see the module docstring)."""

    def _check_iterable(self, data: TrainingData) -> None:
        """A streaming train dataset (read into memory here) has no length to size a run by."""
        if data.iterable and self.config.schedule.max_steps < 1:
            raise ValueError(
                "an iterable (streaming) train_dataset has no length, so max_steps=-1 "
                "(num_train_epochs) cannot size the run; set max_steps"
            )

    def _build_rewards(self, reward_funcs: Any, processing_classes: Any,
                       data: TrainingData, reward_weights: Any) -> None:
        args = self.config
        resolved, self.reward_processing_classes = reward_processing_list(
            reward_funcs, processing_classes, args.compute.trust_remote_code)
        self.on_unscorable = args.advantage.on_unscorable
        if self.on_unscorable == "auto":
            # single-task data without a task column: TRL's behaviour (advantage 0, a warning)
            self.on_unscorable = "warn" if data.single_task else "raise"
        # the environments' channels add weights the config lacks
        weighted = copy.copy(args)
        weighted.advantage = dataclasses.replace(args.advantage, reward_weights=reward_weights)
        self.rewards = build_reward_suite(resolved, weighted, on_unscorable=self.on_unscorable)
        self.reward_funcs = self.rewards.functions
        self.reward_func_names = [str(rf.name) for rf in self.rewards.functions]
        self.reward_weights = torch.as_tensor(np.asarray(self.rewards.reward_weights),
                                              dtype=torch.float32)
        # The advantage estimator with the run's settings bound: a pure function of
        # (rewards [N, R], G) the rollout worker calls once per round of scored groups, and the
        # update again only for a batch-level estimator (trainer.update.batch_advantages).
        self.estimate = functools.partial(
            compute_advantages, reward_weights=self.rewards.reward_weights,
            aggregation=args.advantage.multi_objective_aggregation,
            scale_rewards=args.advantage.scale_rewards,
            gates=self.rewards.gates, none_handling=args.advantage.none_handling,
            on_unscorable=self.on_unscorable, ddof=args.advantage.advantage_std_ddof,
            eps=args.advantage.advantage_epsilon)
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
            self.rewards.check_columns(_column_names(data.train, args.multitask.task_column),
                                       extras=("trainer_state", "log_extra", "log_metric",
                                               *environments))
        self.accuracy_channel = accuracy_channel_index(self.rewards.channel_names,
                                                       args.advantage.accuracy_reward)

    def _build_accelerator(self, peft_config: Any = None,
                           optimizers: tuple[Any, Any] | None = None) -> None:
        from accelerate import Accelerator

        args = self.config
        use_deepspeed = zero.launched()
        if use_deepspeed:  # before the model loads
            zero.check_before_loading(args, peft=peft_config is not None,
                                      optimizer=(optimizers or (None, None))[0])
        self._on_cpu = args.compute.use_cpu or not torch.cuda.is_available()
        # bf16 on the CPU is our own autocast, decided once the model is loaded: accelerate
        # keeps one mixed-precision setting per process, which another trainer (a benchmark's
        # TRL) would change under us
        self._cpu_bf16 = False
        self.bf16, self.bf16_reason = False, "decided once the model is loaded"
        gpu_bf16 = False
        if not self._on_cpu:
            self.bf16, self.bf16_reason = resolve_bf16(args.compute.bf16, "cuda")
            gpu_bf16 = self.bf16
        precision = "bf16" if gpu_bf16 else "fp16" if args.compute.fp16 else "no"
        if args.compute.tf32 is not None and torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = args.compute.tf32
            torch.backends.cudnn.allow_tf32 = args.compute.tf32
        _release_accelerator_state(precision)
        # DeepSpeed on CPUs: accelerate ignores DeepSpeed with cpu=True, and without gloo named
        # leaves each process alone (measured with accelerate 1.15); its device is still the CPU
        backend = "gloo" if use_deepspeed and self._on_cpu else None
        self.accelerator = Accelerator(
            cpu=self._on_cpu and not use_deepspeed, mixed_precision=precision,
            kwargs_handlers=_ddp_kwargs(args, backend),
        )
        if self.accelerator.distributed_type.value == "FSDP" and not args.fully_sharded:
            # accelerate's plugin would wrap the model in prepare(), where mtgrpo's generation
            # gathers, filler passes and sharded checkpoints do not follow it
            raise ValueError(
                "accelerate was launched with its FSDP configuration, which mtgrpo does not "
                "shard with: set fsdp: full_shard (mtgrpo shards the model with FSDP2 itself, "
                "and its checkpoints resume exactly) and launch without accelerate's FSDP "
                "config (accelerate launch --multi_gpu ...)")
        self.zero: zero.ZeroEngine | None = None  # the DeepSpeed engine, once prepared
        if zero.launched(self.accelerator):
            zero.configure(self.accelerator, args)
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes
        self.prompts_per_step = args.resolved_prompts_per_step(self.world)

    def _build_prompts(self, data: TrainingData) -> None:
        args = self.config
        options = {"max_prompt_length": args.rollout.max_prompt_length,
                   "on_long_prompt": args.rollout.on_long_prompt,
                   "chat_template_kwargs": args.rollout.chat_template_kwargs}
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
        args = self.config
        self.weighting = make_weighting(
            args.multitask.task_weighting, len(self.task_names), task_names=self.task_names,
            **args.multitask.task_weighting_params,
        )
        self.reads_improvement = "improvement" in getattr(self.weighting, "REQUIRES", ())
        # the held-out signal when the weights read it (None: the training batch's)
        self.validation: ValidationSignal | None = None
        self._validation_rows = None
        if args.multitask.task_weighting_signal == "validation":
            self._validation_rows = validation_rows(validation_dataset, args.multitask.task_column,
                                                    self.task_names)
            self.validation = ValidationSignal(len(self.task_names))
        # I_k measured across the update: only when the weights read it from the batch
        self.needs_improvement = self.reads_improvement and self.validation is None

    def _build_algorithms(self) -> None:
        args = self.config
        self.sampler = make_sampler(
            args.multitask.batch_construction, self.train_prompts.prompt_tasks,
            len(self.task_names),
            # transformers' rule: data_seed seeds the data order, falling back to seed
            seed=args.schedule.seed if args.schedule.data_seed is None else args.schedule.data_seed,
            zero_gradient_filter=args.multitask.zero_gradient_filter,
            shuffle=args.schedule.shuffle_dataset
            and args.schedule.train_sampling_strategy == "random",
            **args.multitask.batch_construction_params,
        )

    def _build_optimisation(self, generation_backend: Any, optimizers: tuple[Any, Any]) -> None:
        args = self.config
        self.ref_model = None
        # copied before sharding and accelerate.prepare: a whole model, not shards or a wrapper
        if args.loss.beta > 0 and not self.is_peft:
            # the initial policy, frozen, as TRL's reference (LoRA: the adapter-disabled model)
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        optimizer, scheduler = optimizers if optimizers is not None else (None, None)
        self.sharded = args.fully_sharded
        if self.sharded:
            self._check_sharding(optimizer)
            sharding.shard_model(self.model)  # before the optimizer: it holds the shards
        optimization = args.optimization
        if optimizer is None:
            optimizer = build_optimizer(
                self.model, optimization.learning_rate, weight_decay=optimization.weight_decay,
                betas=(optimization.adam_beta1, optimization.adam_beta2),
                eps=optimization.adam_epsilon,
                optim=optimization.optim, optim_args=optimization.optim_args,
            )
        self.scheduler = scheduler or build_scheduler(
            optimizer, args.optimization.lr_scheduler_type,
            # stepped once per optimizer step (PolicyUpdater), so both count those
            total_steps=self.max_optimizer_steps,
            warmup_steps=args.resolved_warmup_steps(self.max_steps),
            scheduler_kwargs=args.optimization.lr_scheduler_kwargs,
        )
        self.lr_scheduler = self.scheduler
        if self.sharded:  # sharded already: accelerate would wrap it in DDP
            self.optimizer = self.accelerator.prepare(optimizer)
        else:
            # DeepSpeed: the model becomes the engine, the optimizer its ZeRO wrapper (whose
            # param groups are those the scheduler sets the learning rate of)
            self.model, self.optimizer = self.accelerator.prepare(self.model, optimizer)
        if zero.launched(self.accelerator):
            self.zero = zero.ZeroEngine(self.model)
        if self.ref_model is not None:
            # no gradients, so no DDP wrapper: only placed (TRL prepares it in evaluation mode)
            self.ref_model.to(self.accelerator.device)
        self.unwrapped = self.accelerator.unwrap_model(self.model)
        # sharded: the engine is built on, and runs with, every shard gathered (a first gather
        # inside the engine's inference mode would leave FSDP buffers no update may write)
        with self._gathered():
            self.backend = build_backend(generation_backend, self.unwrapped, self.tokenizer,
                                         args, generation_dtype=self._generation_dtype())
        if self.sharded or self.zero is not None:
            self.backend = sharding.ShardedGeneration(self.backend, self._gathered)
        self._warned_no_engine_logprobs = False
        self.sampling_params = SamplingParams(
            max_new_tokens=args.rollout.max_completion_length, temperature=args.rollout.temperature,
            top_p=args.rollout.top_p, top_k=args.rollout.top_k,
            return_logprobs=self._wants_generation_logprobs(),
        )
        reference = None
        if args.loss.beta > 0 and self.is_peft:
            from mtgrpo.models import reference_mode

            def reference() -> contextlib.AbstractContextManager[Any]:
                return reference_mode(self.unwrapped)

        self.updater = PolicyUpdater(
            args, self.model, self.optimizer, self.scheduler, self.accelerator,
            reference_model=self.ref_model, reference=reference,
            entropy_mask=self.get_high_entropy_mask, autocast=self._autocast,
            # ZeRO gathers parameters in the forwards and reduces gradients in the backwards
            sharded=self.sharded or self.zero is not None, engine=self.zero,
        )

    def _check_sharding(self, optimizer: Any) -> None:
        """What ``fsdp='full_shard'`` cannot be combined with, before anything is sharded."""
        if self.accelerator.distributed_type.value == "FSDP":
            raise ValueError(
                "fsdp='full_shard' and accelerate's FSDP configuration both shard the model; "
                "keep one (drop fsdp, or launch without the accelerate FSDP config)")
        if self.is_peft:
            raise ValueError("fsdp='full_shard' with a LoRA adapter is not supported yet: an "
                             "adapter is small enough to train replicated; drop fsdp (DDP) or "
                             "peft_config")
        if optimizer is not None:
            raise ValueError("fsdp='full_shard' with optimizers=(optimizer, ...): the optimizer "
                             "must be built over the sharded parameters; pass optimizers=None "
                             "(and optim / optim_args) or drop fsdp")

    def _make_flow(self) -> Flow:
        """When the loop logs, evaluates and saves (:mod:`mtgrpo.trainer.flow`); the TRL
        surface's flow also tells transformers callbacks (:mod:`mtgrpo.compat.trainer`)."""
        return Flow(self.config)

    @staticmethod
    def _state_class() -> type:
        """The class of ``self.state`` (TRL's surface: transformers' ``TrainerState``)."""
        return hooks.RunState

    def _build_loop_state(self) -> None:
        """The loop's state and flow, completion logs and reward-function hooks."""
        args = self.config
        # in optimizer steps: the flow compares them with state.global_step
        intervals = {name: args.optimizer_interval(value, self.max_steps) for name, value in (
            ("logging", args.output.logging_steps), ("eval", args.evaluation.eval_steps),
            ("save", args.saving.save_steps))}
        self.state = hooks.new_state(
            self.max_optimizer_steps, self.steps_per_epoch * args.optimizer_steps_per_step(),
            args.schedule.num_train_epochs, intervals, args.batch.per_device_train_batch_size,
            self.accelerator.is_main_process, self._state_class())
        self.flow = self._make_flow()
        self.log_window = hooks.LogWindow()
        self.aux_loss_enabled = False  # TRL's; no MoE router loss is added
        self.num_generations = args.batch.num_generations
        # TRL's completion logs hold one generation batch (deques of generation_batch_size)
        size = self.prompts_per_step * args.batch.num_generations
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
            args.batch.num_generations, self.tokenizer,
            accuracy_threshold=args.advantage.accuracy_threshold,
            accuracy_channel=self.accuracy_channel, shard=shard, extra=self._reward_extras(),
            # an engine reporting another weights version than the step is stale: the worker stops
            estimate=self.estimate, expected_version=lambda: self.step,
            task_params=self._task_sampling_params(), agent=self._agent_runner,
        )


def _task_names(rows: Any) -> list[str]:
    if is_lazy_split(rows):
        return sorted(rows.task_ids)
    # sorted: the same task ids (weight indices) on every process and after a resume
    return sorted({str(row["task"]) for row in rows})


def _check_context_length(model: Any, args: TrainConfig) -> None:
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
    completion = args.rollout.max_completion_length
    if completion >= limit:
        raise ValueError(
            f"max_completion_length={completion} leaves no room for a prompt in the model's "
            f"max_position_embeddings={limit}; set max_completion_length below {limit} "
            f"(e.g. {limit // 2})")
    budget, prompt = limit - completion, args.rollout.max_prompt_length
    if prompt is None or prompt <= budget:
        return
    default = next(f.default for f in dataclasses.fields(RolloutConfig)
                   if f.name == "max_prompt_length")
    if prompt != default:
        raise ValueError(
            f"max_prompt_length ({prompt}) + max_completion_length ({completion}) = "
            f"{prompt + completion} tokens exceeds the model's max_position_embeddings="
            f"{limit}; set max_prompt_length to at most {budget} (or leave it unset to fit "
            "automatically), or lower max_completion_length")
    args.rollout.max_prompt_length = budget
    # a notice, not a warning: nothing to act on, and a prompt that is cut at the new limit
    # gets the prompt set's own truncation warning
    logger.info("the model has %d positions: max_prompt_length lowered from its default %d to "
                "%d to leave room for max_completion_length=%d; set max_prompt_length to "
                "choose", limit, default, budget, completion)


def _column_names(rows: Any, task_column: str) -> set[str]:
    """The columns reward functions receive: a dataset's, the keys of row dicts (the first
    thousand), or a task suite's row schema; always ``task``."""
    names = getattr(rows, "column_names", None)
    if names is None and isinstance(rows, list):
        names = {key for row in rows[:1000] if isinstance(row, Mapping) for key in row}
    if names is None:  # a task suite's lazy split: its fixed row schema
        names = {"id", "prompt", "answer", "metadata", "split"}
    return {*names, "task", task_column}


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    # NumPy's legacy seed must fit in 32 bits
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


def _configure_logging(args: TrainConfig, is_main: bool) -> None:
    """TRL's log_level / log_level_replica for mtgrpo's and transformers' loggers."""
    level = args.output.log_level if is_main else args.output.log_level_replica
    if level == "passive":
        return
    import transformers

    numeric = getattr(logging, level.upper())
    logging.getLogger("mtgrpo").setLevel(numeric)
    transformers.logging.set_verbosity(numeric)


def _release_accelerator_state(precision: str) -> None:
    """accelerate keeps one ``AcceleratorState`` per process and refuses a second trainer with
    another precision; forget it then (the process group, ``PartialState``, is kept)."""
    from accelerate.state import AcceleratorState

    if AcceleratorState._shared_state and str(
            AcceleratorState._shared_state.get("_mixed_precision", precision)) != precision:
        AcceleratorState._reset_state(reset_partial_state=False)


def _ddp_kwargs(args: TrainConfig, backend: str | None = None) -> list[Any]:
    """accelerate kwargs handlers for TRL's ddp_* options (only those that are set);
    ``backend``: the process group's when ``ddp_backend`` is unset."""
    import datetime

    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

    handlers: list[Any] = []
    ddp = {name: getattr(args.distributed, f"ddp_{name}") for name in (
        "find_unused_parameters", "bucket_cap_mb", "broadcast_buffers", "static_graph")}
    ddp = {k: v for k, v in ddp.items() if v is not None}
    if ddp:
        handlers.append(DistributedDataParallelKwargs(**ddp))
    # 1800 s is TrainingArguments' default ddp_timeout: only another value needs the handler
    backend = args.distributed.ddp_backend or backend
    if backend is not None or args.distributed.ddp_timeout != 1800:
        handlers.append(InitProcessGroupKwargs(
            backend=backend,
            timeout=datetime.timedelta(seconds=args.distributed.ddp_timeout)))
    return handlers
