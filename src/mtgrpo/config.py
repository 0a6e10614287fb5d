"""The configuration tree: :class:`TrainConfig` (training, nested by concern) plus the model,
data, task and reward sections of a run.

:class:`TrainConfig` holds thirteen sections (``output``, ``saving``, ``evaluation``,
``compute``, ``distributed``, ``optimization``, ``schedule``, ``batch``, ``rollout``,
``vllm``, ``loss``, ``advantage``, ``multitask``), and every option in them acts. It speaks
TRL's names wherever TRL has the same option (``learning_rate``, ``num_generations``,
``beta``, ``epsilon``, ``loss_type``, ...), and option names are unique across sections, so a
run file and the ``mtgrpo train --name value`` flags name them flat. Every field carries its
help text once, in ``metadata["help"]``: docs/configuration.md and the flags derive from it.

A YAML run file maps onto :class:`RunConfig`: the training options at the top level (flat, or
as sections), plus the sections ``model``, ``data``, ``tasks``, ``rewards``, ``peft``, ``sft``
and ``environments``. TRL's flat ``GRPOConfig``, with its units and its fields that have no
effect here, is :mod:`mtgrpo.compat`'s, which builds this tree.

Batch sizes (the part TRL users most often ask about):

* ``num_generations`` is ``G``, completions per prompt.
* ``per_device_train_batch_size`` counts **completions** (as in TRL): the rows of one forward
  and backward pass (a micro-batch) on one device.
* One training step generates one batch of ``prompts_per_step`` prompts (``B``), so ``B*G``
  completions, and then takes ``steps_per_generation`` optimizer steps on it (each on
  ``B*G / steps_per_generation`` completions), repeated ``num_iterations`` times (μ).
* ``prompts_per_step`` defaults to TRL's derivation:
  ``per_device_train_batch_size × gradient_accumulation_steps × world_size ×
  steps_per_generation / num_generations`` (in TRL's ``GRPOConfig`` units:
  ``per_device_train_batch_size × world_size × steps_per_generation / num_generations``).
  When it is given explicitly, the ``gradient_accumulation_steps`` needed to cover an
  optimizer step is derived instead.
* ``max_tokens_per_microbatch`` (optional) packs micro-batches by a token budget rather than a
  row count; the loss normaliser is always that of the whole optimizer step, so the gradient
  does not depend on how rows are split.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtgrpo._config_types import (
    build_section,
    check_option_types,
    checked_keywords,
    coerce_numbers,
    parse_bytes,
    refuse_unknown,
)
from mtgrpo._config_types import option as _help
from mtgrpo.algo.params import (
    SAMPLER_PARAMS,
    WEIGHTING_PARAMS,
    as_mapping,
    sampler_params,
    weighting_params,
)
from mtgrpo.algo.registry import (
    BACKENDS,
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    MALFORMED_TOOL_CALLS,
    NONE_HANDLING,
    ON_UNSCORABLE,
    TRACKERS,
    ImportanceSamplingLevel,
    MalformedToolCalls,
    NoneHandling,
    ScaleRewards,
    check_is_correction,
    check_optimizer_name,
    check_scheduler_name,
    resolve_aggregation,
    resolve_scale_rewards,
)
from mtgrpo.algo.sampling import SAMPLERS, ZERO_GRADIENT_FILTERS, check_sampler_params
from mtgrpo.algo.weighting import (
    IMPROVEMENT_REDUCTIONS,
    TASK_WEIGHTING_SIGNALS,
    WEIGHTINGS,
    ImprovementReduction,
    TaskWeightingSignal,
    check_weighting_params,
    reads_task_stats,
)
from mtgrpo.models import DTYPES, LoraSettings
from mtgrpo.sft.config import SFTConfig, WarmStartConfig
from mtgrpo.tasks.config import TasksConfig
from mtgrpo.tasks.episodes import EnvironmentsConfig

__all__ = [
    "FIELD_SECTION",
    "SECTIONS",
    "AdvantageConfig",
    "BatchConfig",
    "ComputeConfig",
    "DataConfig",
    "DistributedConfig",
    "EvaluationConfig",
    "FlatOptions",
    "LossConfig",
    "ModelConfig",
    "MultiTaskConfig",
    "OptimizationConfig",
    "OutputConfig",
    "RolloutConfig",
    "RunConfig",
    "SavingConfig",
    "ScheduleConfig",
    "TrainConfig",
    "VLLMConfig",
    "apply_overrides",
    "config_fields_help",
    "load_run_config",
    "native_config",
    "reference_markdown",
]

# Closed choices: a Literal type for the fields and readers, its values for the checks.
OnLongPrompt = typing.Literal["truncate", "error"]
Interval = typing.Literal["no", "steps", "epoch"]
SaveInterval = typing.Literal["no", "steps", "epoch", "best"]
HubStrategy = typing.Literal["end", "every_save", "checkpoint", "all_checkpoints"]
LogLevel = typing.Literal["passive", "debug", "info", "warning", "error", "critical"]
FsdpOption = typing.Literal["full_shard", "auto_wrap"]
SamplingOrder = typing.Literal["random", "sequential"]
TokensSeen = typing.Literal["no", "all"]
StepUnit = typing.Literal["training", "optimizer"]
VLLMMode = typing.Literal["colocate", "server"]
ImportanceSamplingMode = typing.Literal["token_truncate", "token_mask", "sequence_truncate",
                                        "sequence_mask"]
ON_LONG_PROMPT: tuple[str, ...] = typing.get_args(OnLongPrompt)
INTERVALS: tuple[str, ...] = typing.get_args(Interval)
SAVE_INTERVALS: tuple[str, ...] = typing.get_args(SaveInterval)
HUB_STRATEGIES: tuple[str, ...] = typing.get_args(HubStrategy)
LOG_LEVELS: tuple[str, ...] = typing.get_args(LogLevel)
FSDP_OPTIONS: tuple[str, ...] = typing.get_args(FsdpOption)
SAMPLING_ORDERS: tuple[str, ...] = typing.get_args(SamplingOrder)
TOKENS_SEEN: tuple[str, ...] = typing.get_args(TokensSeen)
"""The words of TRL's ``fsdp`` string mtgrpo acts on: ``full_shard`` (required) and
``auto_wrap`` (implied: the decoder layers are always sharded one by one)."""
DEFAULT_VALIDATION_STEPS = 10  # validation_steps when neither it nor eval_steps says


def _warn_about_loss_combinations(loss_type: str, level: str) -> None:
    """TRL's warnings about importance-sampling levels that do not fit the loss."""
    import logging

    log = logging.getLogger("mtgrpo.config")
    if loss_type == "luspo" and level != "sequence":
        log.warning("loss_type='luspo' is a sequence-level loss: set "
                    "importance_sampling_level='sequence' to follow the paper's setup")
    if loss_type == "vespo" and level != "token":
        log.warning("loss_type='vespo' computes sequence-level weights itself: leave "
                    "importance_sampling_level='token' (the default)")
    if level == "sequence" and loss_type in ("bnpo", "dr_grpo", "dapo", "cispo"):
        log.warning(
            "importance_sampling_level='sequence' with loss_type=%r: this loss sums per-token "
            "terms, which weights each sequence by its completion length instead of optimising "
            "the per-sequence objective; use loss_type='grpo' for GSPO", loss_type,
        )


@checked_keywords
@dataclass
class OutputConfig:
    """Where the run writes and what it logs: the run directory, metrics, trackers, completions."""

    # defaults: transformers' TrainingArguments' (TRL 1.16 keeps them) unless a comment says
    output_dir: str = _help("Run directory: metrics, checkpoints, report.", default="runs/mtgrpo")
    run_name: str | None = _help("Name shown by trackers (default: output_dir's name).",
                                 default=None)
    logging_strategy: Interval = _help("When to log: steps (every logging_steps), epoch or no "
                                  "(the last step is always logged).", default="steps")
    logging_steps: int | float = _help(
        # TRL's default is 10; 1 writes every step to metrics.jsonl (docs/coming-from-trl.md)
        "Log metrics every N training steps (a value below 1: that fraction of all steps).",
        default=1)
    logging_first_step: bool = _help("Also log the first step.", default=False)
    logging_nan_inf_filter: bool = _help(
        "Leave NaN and infinite step losses out of train_loss (TRL's option).", default=True)
    log_level: LogLevel = _help("Level of mtgrpo's and transformers' loggers on the main process: "
                           "passive (leave as configured), debug, info, warning, error, "
                           "critical.", default="passive")
    log_level_replica: LogLevel = _help("The same on the other processes.", default="warning")
    disable_tqdm: bool | None = _help("Hide the progress bar.", default=None)
    report_at_end: bool = _help(
        "When train() ends, the main process writes the report/ figures and prints the run "
        "summary (as mtgrpo train does); false: neither.", default=True)
    # TRL's "none", in the normalised form: __post_init__ drops "none" from the list
    report_to: str | list[str] = _help(
        "Trackers besides metrics.jsonl: any of tensorboard, wandb, trackio (or 'none').",
        default_factory=list)
    log_completions: bool = _help("Write sampled completions to completions.jsonl.",
                                  default=False)
    num_completions_to_print: int | None = _help(
        "With log_completions: print this many of the step's completions at each log (None: "
        "none are printed).", default=None)
    include_num_input_tokens_seen: TokensSeen | bool = _help(
        "Also log the count of prompt and completion tokens trained on "
        "(state.num_input_tokens_seen) as num_input_tokens_seen, the Trainer's name: no, all "
        "(or true). It is counted at every step and logged as num_tokens either way, as TRL "
        "does.", default="no")
    save_rollouts: bool = _help(
        "Write every group's rewards and advantages to rollouts.jsonl (the gradient-noise "
        "analysis reads it).", default=False)
    profile: bool = _help("Write a torch profiler trace of one training step.", default=False)
    log_entropy: bool = _help("Compute and log the policy's token entropy (costs a little).",
                              default=True)


@checked_keywords
@dataclass
class SavingConfig:
    """Checkpoints, resuming, the best model and uploads to the Hugging Face Hub."""

    # defaults: transformers' TrainingArguments' unless a comment says
    save_strategy: SaveInterval = _help(
        "When to checkpoint: steps (every save_steps, and at the end), epoch, best (when "
        "metric_for_best_model improves) or no (never).", default="steps")
    save_steps: int | float = _help(
        # transformers' default is 500; 50 keeps a short run resumable (docs/coming-from-trl.md)
        "Checkpoint every N training steps (0: only at the end; below 1: that fraction of all "
        "steps).", default=50)
    # transformers' None keeps every checkpoint; 2 with save_steps=50 (docs/coming-from-trl.md)
    save_total_limit: int | None = _help("Keep only the newest N checkpoints (None or <= 0: all).",
                                         default=2)
    save_only_model: bool = _help(
        "Checkpoints hold the model only (no optimizer, scheduler, sampler or RNG state): "
        "smaller, but a run cannot resume from them.", default=False)
    resume_from_checkpoint: str | bool | None = _help(
        "Checkpoint directory to resume from, or true for the newest in output_dir.",
        default=None)
    resume_allow_changes: list[str] | None = _help(
        "Settings a resume may change from the checkpoint's (e.g. [learning_rate], or [all]); "
        "any other difference is refused. Accepted changes are recorded in "
        "config_history.jsonl.", default=None)
    load_best_model_at_end: bool = _help(
        "After training, load the checkpoint with the best metric_for_best_model.",
        default=False)
    metric_for_best_model: str | None = _help(
        "Eval metric that ranks checkpoints (e.g. accuracy/worst, loss; an eval_ prefix is "
        "accepted).", default=None)
    greater_is_better: bool | None = _help(
        "Whether a larger metric_for_best_model is better (default: true, except for names "
        "ending in loss).", default=None)
    push_to_hub: bool = _help(
        "Upload the trained model (or adapter) and tokenizer to the Hugging Face Hub "
        "(hub_strategy decides when).", default=False)
    hub_model_id: str | None = _help(
        "Hub repository, 'user/name' (default: output_dir's name under the token's user).",
        default=None)
    hub_token: str | None = _help("Hub token (default: HF_TOKEN or the saved login).",
                                  default=None)
    hub_private_repo: bool | None = _help(
        "Create the repository private (None: the Hub's default for the account).",
        default=None)
    hub_strategy: HubStrategy = _help(
        "end (the final model), every_save (the model at every checkpoint and at the end), "
        "checkpoint (also the newest checkpoint as last-checkpoint/) or all_checkpoints "
        "(every checkpoint in its own folder).", default="every_save")
    hub_revision: str | None = _help("Branch of the repository to upload to.", default=None)


@checked_keywords
@dataclass
class EvaluationConfig:
    """When the held-out prompts are evaluated, and how they are sampled."""

    eval_strategy: Interval | None = _help(
        "When to evaluate: steps (every eval_steps, and at the end), epoch or no (default: "
        "steps when eval_steps > 0, else no).", default=None)
    eval_steps: int | float | None = _help(
        "Evaluate every N steps (0: never; None with eval_strategy=steps: logging_steps; "
        "below 1: that fraction of all steps).", default=None)
    eval_delay: float = _help("Evaluate only from this step (or epoch, with "
                              "eval_strategy=epoch) on.", default=0)
    # transformers' default is False (docs/coming-from-trl.md lists the difference)
    eval_on_start: bool = _help("Also evaluate before the first step (when evaluating).",
                                default=True)
    num_generations_eval: int | None = _help(
        # TRL's None samples G per prompt; one sample already measures per-task accuracy
        "Samples per eval prompt (accuracy is their mean; None: num_generations, as TRL).",
        default=1)
    eval_temperature: float = _help("Sampling temperature for eval (0: greedy).", default=1.0)


@checked_keywords
@dataclass
class ComputeConfig:
    """How the policy is loaded and computed: precision, device, gradient checkpointing, dropout."""

    # defaults: TRL 1.16's GRPOConfig's unless a comment or the help says
    model_init_kwargs: dict[str, Any] = _help(
        "Loading options when the model is given by name: dtype, attn_implementation, "
        "trust_remote_code, revision, gguf_file (TRL's field).", default_factory=dict)
    trust_remote_code: bool = _help(
        "Allow model code from the hub for the policy, its tokenizer and reward models named "
        "by hub id.", default=False)
    disable_dropout: bool = _help("Set every dropout probability of the policy (and the "
                                  "reference) to 0.", default=False)
    cast_lm_head_to_fp32: bool = _help(
        "Keep the output head in float32 and feed it float32 hidden states (for bfloat16 or "
        "float16 models); a tied head is untied first.", default=False)
    gradient_checkpointing: bool = _help(
        "Recompute activations in the backward pass (less memory, more time). TRL defaults to "
        "true; we default to false because the CPU quickstart is compute-bound.", default=False)
    gradient_checkpointing_kwargs: dict[str, Any] | None = _help(
        "Options of gradient_checkpointing_enable (default {use_reentrant: false}).",
        default=None)
    bf16: bool | None = _help(
        "bfloat16 where the hardware multiplies it natively: autocast for the update's forward "
        "passes and, for float32 weights, generation from a bfloat16 copy of the policy (static "
        "backend). None (auto): on a GPU that supports it, or a CPU with amx_bf16, avx512_bf16 "
        "or Arm bf16 for a model at least 256 wide (hidden_size; narrower ones run faster in "
        "float32) (TRL: true unless fp16); false: never (float32 throughout).", default=None)
    fp16: bool = _help("float16 autocast for forward passes (a GPU feature).", default=False)
    tf32: bool | None = _help("Allow TF32 matrix products on Ampere or newer GPUs (None: "
                              "leave torch's setting).", default=None)
    use_cpu: bool = _help("Train on the CPU even when a GPU is present.", default=False)
    torch_empty_cache_steps: int | None = _help(
        "Empty the CUDA cache every N training steps (None: never).", default=None)


@checked_keywords
@dataclass
class DistributedConfig:
    """Several processes: DDP's options, fully sharded training (FSDP2), the process group."""

    # defaults: transformers' TrainingArguments'
    ddp_find_unused_parameters: bool | None = _help(
        "DDP's find_unused_parameters (None: DDP's default).", default=None)
    ddp_bucket_cap_mb: int | None = _help("DDP's bucket_cap_mb.", default=None)
    ddp_broadcast_buffers: bool | None = _help("DDP's broadcast_buffers.", default=None)
    ddp_static_graph: bool | None = _help("DDP's static_graph.", default=None)
    ddp_backend: str | None = _help("Process-group backend (nccl, gloo, ...).", default=None)
    fsdp: str | list[str] | None = _help(
        "full_shard: fully sharded training (FSDP2) across the launched processes, each decoder "
        "layer sharded, checkpoints resumable (docs/distributed.md); other FSDP options go "
        "through accelerate's config file.", default=None)
    ddp_timeout: int = _help("Process-group timeout in seconds.", default=1800)


@checked_keywords
@dataclass
class OptimizationConfig:
    """The optimizer and its learning-rate schedule."""

    # defaults: TRL 1.16's GRPOConfig's (transformers' TrainingArguments' where TRL keeps them)
    learning_rate: float = _help("Peak learning rate.", default=1e-6)  # TRL's; transformers': 5e-5
    optim: str = _help(
        "Optimizer, by transformers' name (adamw_torch_fused, adamw_torch, adafactor, sgd, "
        "adamw_8bit, ...); adamw_torch_fused (TRL's default on torch >= 2.8: AdamW in one fused "
        "kernel) and adamw_torch (the same update, unfused) use the Trainer's parameter groups "
        "(no weight decay on biases and norms).", default="adamw_torch_fused")
    optim_args: str | None = _help("Extra optimizer options, 'key=value,key=value' (as "
                                   "transformers).", default=None)
    weight_decay: float = _help("AdamW weight decay (not applied to biases and norms).",
                                default=0.0)
    adam_beta1: float = _help("AdamW beta1.", default=0.9)
    adam_beta2: float = _help("AdamW beta2.", default=0.999)
    adam_epsilon: float = _help("AdamW epsilon.", default=1e-8)
    max_grad_norm: float = _help("Gradient clipping norm (0: no clipping).", default=1.0)
    lr_scheduler_type: str = _help(
        "Learning-rate schedule after the warm-up: constant, linear, cosine, or any other "
        "transformers schedule name (cosine_with_restarts, polynomial, ...).", default="linear")
    lr_scheduler_kwargs: dict[str, Any] | None = _help(
        "Extra options of the schedule (e.g. {num_cycles: 2}).", default=None)
    warmup_steps: int | float = _help(
        "Linear warm-up optimizer steps (a value below 1: that fraction of all steps).",
        default=0)
    warmup_ratio: float | None = _help(
        "Warm-up as a fraction of all optimizer steps (if > 0; None, TRL's default on older "
        "transformers: 0).", default=0.0)


@checked_keywords
@dataclass
class ScheduleConfig:
    """How long the run trains, in what unit it counts, and the seeds and order of its prompts."""

    # defaults: TRL 1.16's GRPOConfig's for the fields it has (step_unit is mtgrpo's)
    max_steps: int = _help(
        "Training steps, one generation batch each (-1: derived from num_train_epochs and "
        "the dataset's size).", default=-1)
    num_train_epochs: float = _help(
        "Passes over the training prompts when max_steps is -1: a step uses prompts_per_step "
        "prompts, so an epoch is len(dataset) // prompts_per_step steps (at least 1).",
        default=3.0)
    step_unit: StepUnit = _help(
        "What max_steps, logging_steps, eval_steps and save_steps count: training (steps, one "
        "generation batch each) or optimizer (optimizer steps, TRL's unit; when max_steps ends "
        "inside a generation batch, the last batch takes only the optimizer steps left).",
        default="training")
    seed: int = _help("Seed for data order, sampling and initialisation.", default=42)
    data_seed: int | None = _help("Seed of the prompt order alone (default: seed).",
                                  default=None)
    full_determinism: bool = _help(
        "Deterministic kernels (torch.use_deterministic_algorithms); slower.", default=False)
    shuffle_dataset: bool = _help(
        "Visit each task's prompts in a seeded shuffled order, reshuffled every epoch "
        "(false: dataset order).", default=True)
    train_sampling_strategy: SamplingOrder = _help(
        "random (as shuffle_dataset) or sequential (dataset order, whatever shuffle_dataset "
        "says); transformers' name.", default="random")


@checked_keywords
@dataclass
class BatchConfig:
    """Batch shape: completions per prompt, prompts per step, micro-batches and packing."""

    # defaults: TRL 1.16's GRPOConfig's for the fields TRL has
    num_generations: int = _help("G: completions per prompt.", default=8)
    prompts_per_step: int | None = _help(
        "B: prompts per training step (default: derived from the TRL batch fields).",
        default=None)
    per_device_train_batch_size: int = _help(
        "Completions per micro-batch on one device (TRL's meaning).", default=8)
    gradient_accumulation_steps: int = _help("Micro-batches per optimizer step.", default=1)
    steps_per_generation: int | None = _help(
        "Optimizer steps taken on one generation batch (None: 1). Python's GRPOConfig counts "
        "micro-batches here, as TRL (None: gradient_accumulation_steps).",
        default=None)
    num_iterations: int = _help("μ: passes over each generation batch.", default=1)
    max_tokens_per_microbatch: int | None = _help(
        "Pack micro-batches by this padded-token budget instead of a row count.", default=None)
    max_memory_per_microbatch: str | int | None = _help(
        "Pack micro-batches by a memory budget instead ('4GiB', '512MiB' or bytes): what one "
        "micro-batch may add above the weights, gradients and optimizer state. The bytes per "
        "token are measured once, before training, from what the policy's forward saves for "
        "the backward pass (gradient checkpointing, LoRA, padding-free and autocast "
        "included).", default=None)
    # bucketed: 1.9 CPU-s vs 3.0 padded, 64 rows of 10-128 tokens (docs/fast_generation.md)
    max_padding_fraction: float = _help(
        "Length bucketing: rows are grouped longest first and a new micro-batch starts when "
        "more than this fraction of the next row would be padding. 1.0 turns it off. Ignored "
        "when the update runs padding-free (padding_free).",
        default=0.25)
    padding_free: bool = _help(
        "Policy forwards without padding where the model allows it (Llama, Mistral, Qwen2, "
        "Qwen3 with sdpa or eager attention, no sliding window; gradient checkpointing applies): "
        "each distinct prompt and every completion token run once, rows apart only in "
        "attention. Same log-probs and gradients; false: padded, length-bucketed micro-batches.",
        default=True)


@checked_keywords
@dataclass
class RolloutConfig:
    """Generation: prompt and completion lengths, sampling, the generation backend, the tool
    loop."""

    max_prompt_length: int | None = _help("Prompts longer than this many tokens are "
                                          "handled by on_long_prompt (None: no limit).",
                                          default=512)
    on_long_prompt: OnLongPrompt = _help("truncate (keep the end, warn once) or error.",
                                default="truncate")
    # TRL's default is 512; 256 is CPU-friendly (docs/coming-from-trl.md)
    max_completion_length: int = _help("Maximum new tokens per completion.", default=256)
    # from here on: TRL 1.16's defaults wherever GRPOConfig has the field
    temperature: float = _help("Sampling temperature (also applied to training log-probs).",
                               default=1.0)
    top_p: float = _help("Nucleus sampling threshold.", default=1.0)
    top_k: int = _help("Top-k sampling (0: off).", default=0)
    generation_backend: str = _help("auto, hf (transformers generate) or a registered backend.",
                                    default="auto")
    generation_batch_size: int | None = _help(
        "Most sequences per generate call (None: all of a round at once).", default=None)
    generation_logprobs: bool | None = _help(
        "Ask the generation backend for each sampled token's log-probability and log how far "
        "it is from the trainer's (generation/logprob_mismatch_mean, _max, generation/kl_k3). "
        "None: only from a backend that computes them at no cost (static; an engine with "
        "cheap_logprobs = True); true: from any (hf then keeps every step's scores); false: "
        "never.", default=None)
    task_generation: dict[str, dict[str, Any]] | None = _help(
        "Per-task generation settings, {task: {max_completion_length: N}}: that task's "
        "completions stop at N tokens (at most max_completion_length); other tasks use the "
        "run's settings. Every backend honours it (vLLM receives it in its sampling "
        "parameters).", default=None)
    mask_truncated_completions: bool = _help(
        "Leave completions cut at max_completion_length out of the loss.", default=False)
    min_p: float | None = _help(
        "Min-p sampling: drop tokens below min_p × the top token's probability (None: off; "
        "generation uses transformers generate).", default=None)
    repetition_penalty: float = _help(
        "Repetition penalty of generation (1.0: off; other values use transformers "
        "generate). The training log-probs do not apply it, as in TRL.", default=1.0)
    generation_kwargs: dict[str, Any] | None = _help(
        "Extra transformers GenerationConfig options for training and eval generation "
        "(they override the fields above; generation then uses transformers generate).",
        default=None)
    cache_implementation: str | None = _help(
        "KV-cache implementation for transformers generate (e.g. static; None: its default).",
        default=None)
    chat_template_kwargs: dict[str, Any] | None = _help(
        "Extra variables of the chat template (e.g. {enable_thinking: false}).", default=None)
    max_tool_calling_iterations: int | None = _help(
        "With tools or an environment_factory: the most rounds of tool calls in one rollout "
        "(training and evaluation); a rollout still calling tools after them ends with those "
        "calls unanswered. null: until no rollout calls a tool or the completion budget is "
        "spent.", default=None)
    tool_call_timeout: float = _help(
        "With tools or an environment_factory: seconds one tool call may take; a call past "
        "it is answered with a timed-out message and the rollout goes on.", default=60.0)
    malformed_tool_calls: MalformedToolCalls = _help(
        "With tools or an environment_factory: a malformed call (not JSON, no name) ends the "
        "rollout (end, TRL's rule) or is answered with the parse error, which the model reads "
        "and which counts as a failed call (reply).", default="end")


@checked_keywords
@dataclass
class VLLMConfig:
    """The vLLM generation engine (TRL's use_vllm and vllm_* options; docs/engines.md)."""

    # defaults: TRL 1.16's GRPOConfig's, so TRL's vllm_* settings carry over unchanged
    use_vllm: bool = _help(
        "Generate with vLLM (vllm_mode: colocate, an in-process engine; server, a `mtgrpo "
        "vllm-serve` server); the policy's weights are pushed into it after every optimizer "
        "step and after a resume (docs/engines.md).", default=False)
    vllm_mode: VLLMMode = _help(
        "colocate (an in-process vllm.LLM beside the trainer) or server (a `mtgrpo vllm-serve "
        "MODEL` server, on this machine or another).", default="colocate")
    vllm_model_impl: str = _help(
        "Colocate: vLLM's model implementation (auto, vllm or transformers).", default="vllm")
    vllm_enable_sleep_mode: bool = _help(
        "Colocate, GPU only: free the engine's weights and KV cache between generations "
        "(refused on a CPU).", default=False)
    vllm_structured_outputs_regex: str | None = _help(
        "A regular expression every completion must match (vLLM's structured outputs).",
        default=None)
    vllm_server_base_url: str | None = _help(
        "Server: its URL (e.g. http://10.0.0.2:8000); overrides host and port.", default=None)
    vllm_server_host: str = _help(
        "Server: its host when no base URL is given (0.0.0.0: this machine).", default="0.0.0.0")
    vllm_server_port: int = _help(
        "Server: its port when no base URL is given.", default=8000)
    vllm_server_timeout: float = _help(
        "Server: seconds to wait for it to come up, and for any one request, before the run "
        "stops with an error naming the server.", default=240.0)
    vllm_gpu_memory_utilization: float = _help(
        "Colocate: vLLM's fraction of GPU memory; on a CPU, the fraction of host memory given "
        "to its KV cache.", default=0.3)
    vllm_max_model_length: int | None = _help(
        "Colocate: the engine's context (None: max_prompt_length + max_completion_length).",
        default=None)
    vllm_tensor_parallel_size: int = _help(
        "Colocate: GPUs the engine splits the model over (1 on a CPU).", default=1)
    vllm_importance_sampling_correction: bool = _help(
        "Weight each token's policy loss by the ratio of the trainer's and the engine's "
        "log-probs of the sampled tokens, bounded by the mode (TRL's; logged as "
        "sampling/importance_sampling_ratio/* and sampling/sampling_logp_difference/*).",
        default=True)
    vllm_importance_sampling_mode: ImportanceSamplingMode = _help(
        "token_truncate, token_mask, sequence_truncate or sequence_mask: a ratio per token or "
        "per completion, clamped to or masked outside [clip_min, clip_max].",
        default="sequence_mask")
    vllm_importance_sampling_clip_max: float | None = _help(
        "Upper bound of the correction's ratio (None: none).", default=3.0)
    vllm_importance_sampling_clip_min: float | None = _help(
        "Lower bound of the correction's ratio (None: none).", default=None)


@checked_keywords
@dataclass
class LossConfig:
    """The GRPO loss family: clipping, KL, entropy, the reference model."""

    # defaults: TRL 1.16's GRPOConfig's, except use_bias_correction_kl (docs/coming-from-trl.md)
    loss_type: str = _help(
        "grpo (sequence mean), dapo (token mean), dr_grpo (constant length), bnpo, cispo "
        "(clipped importance weights), sapo (soft gate), luspo (length-weighted sequences), "
        "vespo (gamma-shaped sequence weights).", default="dapo")
    importance_sampling_level: ImportanceSamplingLevel = _help(
        "token (a ratio per token) or sequence (GSPO: one ratio per completion, the "
        "geometric mean of its token ratios).", default="token")
    beta: float = _help("KL coefficient (0: no reference model is used).", default=0.0)
    use_bias_correction_kl: bool = _help(
        "Weight the k3 KL by the importance ratio (DeepSeek-V3.2); TRL's default is true.",
        default=False)
    epsilon: float = _help("Lower clipping range ε_low.", default=0.2)
    epsilon_high: float | None = _help(
        "Upper clipping range ε_high (None: epsilon); with cispo, the cap of the importance "
        "weight.", default=None)
    delta: float | None = _help(
        "Two-sided clipping: the unclipped ratio is also capped at delta (> 1 + epsilon_high; "
        "None: off).", default=None)
    sapo_temperature_pos: float = _help("sapo: gate temperature for positive advantages.",
                                        default=1.0)
    sapo_temperature_neg: float = _help("sapo: gate temperature for other advantages.",
                                        default=1.05)
    vespo_k_pos: float = _help("vespo: shape k of the weight for advantages >= 0.",
                               default=2.0)
    vespo_lambda_pos: float = _help("vespo: rate λ of the weight for advantages >= 0.",
                                    default=3.0)
    vespo_k_neg: float = _help("vespo: shape k of the weight for negative advantages.",
                               default=3.0)
    vespo_lambda_neg: float = _help("vespo: rate λ of the weight for negative advantages.",
                                    default=2.0)
    off_policy_mask_threshold: float | None = _help(
        "Drop completions with a negative advantage whose mean token KL from the policy "
        "that sampled them exceeds this (DeepSeek-V3.2; None: off).", default=None)
    top_entropy_quantile: float = _help(
        "Train only on the tokens in this top fraction of entropy across the batch (1.0: "
        "all tokens).", default=1.0)
    entropy_coef: float = _help(
        "Entropy bonus: the loss is L_policy - entropy_coef × (mean token entropy).",
        default=0.0)
    use_adaptive_entropy: bool = _help(
        "Adapt entropy_coef every optimizer step: up by entropy_coef_delta while the entropy "
        "is at or below entropy_target (the bonus applies only then), down otherwise.",
        default=False)
    entropy_coef_min: float = _help("Lower bound of the adaptive entropy_coef.", default=0.0)
    entropy_coef_max: float = _help("Upper bound of the adaptive entropy_coef.", default=1.0)
    entropy_coef_delta: float = _help("Step of the adaptive entropy_coef.", default=0.005)
    entropy_target: float = _help("Entropy (nats per token) the adaptive controller holds.",
                                  default=0.2)
    sync_ref_model: bool = _help(
        "Move the reference model towards the policy every ref_model_sync_steps steps: "
        "ref = α·policy + (1 − α)·ref (TR-DPO). Needs beta > 0 and a separate reference "
        "(not LoRA).", default=False)
    ref_model_mixup_alpha: float = _help("α of sync_ref_model.", default=0.6)
    ref_model_sync_steps: int = _help("Steps between reference updates (sync_ref_model).",
                                      default=512)


@checked_keywords
@dataclass
class AdvantageConfig:
    """From rewards to advantages: channel weights, aggregation, scaling, unscorable
    completions, accuracy."""

    # TRL 1.16's defaults for reward_weights, multi_objective_aggregation and scale_rewards
    reward_weights: list[float] | None = _help("One weight per reward channel (default 1).",
                                               default=None)
    multi_objective_aggregation: str = _help(
        "sum_then_normalize (an), normalize_then_sum (na), gdpo, single.",
        default="sum_then_normalize")
    scale_rewards: ScaleRewards | bool = _help("group, batch or none (TRL's true/false accepted).",
                               default="group")
    none_handling: NoneHandling = _help(
        "How a reward function's None enters the advantage: neutral or zero.", default="neutral")
    on_unscorable: str = _help(
        "A completion no reward applies to: raise, warn (TRL's behaviour and warning: "
        "advantage 0), zero_advantage (the same, silently); auto: raise when the dataset "
        "has a task column, warn for single-task data without one.", default="auto")
    reward_timeout: float | None = _help(
        "Seconds one call of a reward function may take (a function's own timeout wins); a "
        "call past it does not apply to its completions and is counted in "
        "rewards/<name>/timeouts. null: no limit.", default=60.0)
    # TRL's GRPOTrainer divides by std + 1e-4
    advantage_epsilon: float = _help("δ added to stds when normalising.", default=1e-4)
    advantage_std_ddof: int = _help(
        "Degrees of freedom of the stds: 1 (unbiased; TRL) or 0 (population; "
        "multireward-grpo).", default=1)
    accuracy_threshold: float = _help("A completion is correct when its accuracy reward >= this.",
                                      default=1.0)
    accuracy_reward: str | None = _help(
        "Reward channel that defines accuracy (default: the first channel that applies).",
        default=None)


@checked_keywords
@dataclass
class MultiTaskConfig:
    """The multi-task method: task weighting, its signal, and batch construction."""

    task_column: str = _help("Dataset column that names each prompt's task.", default="task")
    task_weighting: str = _help("uniform, fixed, mt_grpo, worst_case, regularized or sec.",
                                default="uniform")
    task_weighting_params: dict[str, Any] = _help(
        "Parameters of the task weighting, e.g. {lam: 0.25, optimizer: adam}; from Python also "
        "their typed form (mtgrpo.algo.params, e.g. MTGRPOParams(lam=0.25)), kept as the "
        "mapping.", default_factory=dict)
    improvement_reduction: ImprovementReduction = _help(
        "MT-GRPO's I_k over a task's samples: mean (paper text) or sum (released code, use "
        "with improvement_clip).", default="mean")
    task_weighting_signal: TaskWeightingSignal = _help(
        "What the task weights read: train (the training batch's accuracy, as the papers) or "
        "validation (held-out accuracy on the task suite's validation split, evaluated every "
        "validation_steps steps; J_k its last value, I_k its change per step; needs "
        "tasks.validation_size > 0). For mt_grpo, worst_case, regularized and sec.",
        default="train")
    validation_steps: int | float | None = _help(
        "With task_weighting_signal=validation: evaluate the validation split every N steps, "
        "step 0 included (below 1: that fraction of all steps; None: eval_steps when "
        "evaluating by steps, else 10). The weights update every step from the last result.",
        default=None)
    num_generations_validation: int | None = _help(
        "Samples per validation prompt, at eval_temperature (None: num_generations; sec needs "
        "2 or more).", default=None)
    batch_construction: str = _help("iid, dynamic (DAPO) or ratio_preserving (MT-GRPO).",
                                    default="iid")
    batch_construction_params: dict[str, Any] = _help(
        "Parameters of the batch construction, e.g. {oversample_factor: 3}; from Python also "
        "their typed form (e.g. RatioPreservingParams(oversample_factor=3)).",
        default_factory=dict)
    zero_gradient_filter: str = _help("strict, lenient or none (dynamic / ratio_preserving).",
                                      default="strict")

    def weighting_params(self) -> Any:
        """``task_weighting_params`` typed for ``task_weighting`` (``MTGRPOParams``, ...; a
        dict for a strategy a user registered)."""
        return weighting_params(self.task_weighting, self.task_weighting_params)

    def sampler_params(self) -> Any:
        """``batch_construction_params`` typed for ``batch_construction``."""
        return sampler_params(self.batch_construction, self.batch_construction_params)


SECTIONS: dict[str, type] = {
    "output": OutputConfig,
    "saving": SavingConfig,
    "evaluation": EvaluationConfig,
    "compute": ComputeConfig,
    "distributed": DistributedConfig,
    "optimization": OptimizationConfig,
    "schedule": ScheduleConfig,
    "batch": BatchConfig,
    "rollout": RolloutConfig,
    "vllm": VLLMConfig,
    "loss": LossConfig,
    "advantage": AdvantageConfig,
    "multitask": MultiTaskConfig,
}
"""The sections of :class:`TrainConfig`, by attribute name, in the order of the reference."""

FIELD_SECTION: dict[str, str] = {f.name: section for section, cls in SECTIONS.items()
                                 for f in dataclasses.fields(cls)}
"""Every option's section: option names are unique across sections, so a run file (and the
CLI's ``--name value``) may name them flat."""


@dataclass
class TrainConfig:
    """Training options, nested by concern, every one acting: ``config.loss.beta``,
    ``config.batch.num_generations``, ``config.multitask.task_weighting``.

    Build it nested (``TrainConfig(loss=LossConfig(beta=0.04))``) or from flat names, as a run
    file writes them (:meth:`from_flat`: ``TrainConfig.from_flat({"beta": 0.04})``). Every
    check, those that span sections included, runs when it is built, before any model loads.

    A **step** is one generation batch and its update; ``schedule.step_unit`` says whether
    ``max_steps`` and the logging, evaluation and saving intervals count those steps
    (``training``) or optimizer steps (``optimizer``, TRL's unit).
    ``batch.steps_per_generation`` counts the optimizer steps taken on each generation batch
    (``num_iterations`` times). The transformers surface (``trainer.state.global_step``,
    ``log_history``, checkpoint names) counts optimizer steps, as in TRL.

    TRL's flat ``GRPOConfig`` (every TRL 1.16 field, its units) is
    :class:`mtgrpo.compat.GRPOConfig`, which builds this tree.
    """

    output: OutputConfig = field(default_factory=OutputConfig)
    saving: SavingConfig = field(default_factory=SavingConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    optimization: OptimizationConfig = field(default_factory=OptimizationConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    multitask: MultiTaskConfig = field(default_factory=MultiTaskConfig)

    # ------------------------------------------------------------------ flat names
    @classmethod
    def from_flat(cls, values: Mapping[str, Any]) -> TrainConfig:
        """The tree from flat option names (a run file's top level, ``--name value``) and/or
        whole sections (``{"loss": {"beta": 0.04}}``); unknown names are refused with the
        closest valid ones."""
        names = list(FIELD_SECTION)
        refuse_unknown([key for key in values if key not in FIELD_SECTION and key not in SECTIONS],
                       sorted([*names, *SECTIONS]), "config")
        grouped: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
        for key, value in values.items():
            if key in SECTIONS:
                if not isinstance(value, Mapping):
                    raise ValueError(f"{key} must be a mapping of its options, got {value!r}")
                grouped[key].update(value)
            else:
                grouped[FIELD_SECTION[key]][key] = value
        built = {}
        for section, options in grouped.items():
            kind = SECTIONS[section]
            # an option under another section's name: names are unique across sections
            refuse_unknown([k for k in options if FIELD_SECTION.get(k) != section],
                           [f.name for f in dataclasses.fields(kind)], section)
            built[section] = kind(**coerce_numbers(kind, options))
        return cls(**built)

    def to_flat(self) -> dict[str, Any]:
        """Every option by its flat name (what a run file's top level holds)."""
        return {name: self.get(name) for name in FIELD_SECTION}

    def get(self, name: str) -> Any:
        """The option ``name`` (a flat name) from its section."""
        return getattr(getattr(self, FIELD_SECTION[name]), name)

    def set(self, name: str, value: Any) -> None:
        setattr(getattr(self, FIELD_SECTION[name]), name, value)

    def __post_init__(self) -> None:
        for section, kind in SECTIONS.items():
            value = getattr(self, section)
            if isinstance(value, Mapping):  # a section written as a mapping, as in a run file
                setattr(self, section, build_section(kind, value, section))
            elif not isinstance(value, kind):
                raise TypeError(f"{section} must be a {kind.__name__} (or a mapping of its "
                                f"options), got {type(value).__name__}")
        # first: the type checks below see plain values, not enums or JSON text
        self._normalise_values()
        for section in SECTIONS:
            check_option_types(getattr(self, section))
        self._merge_aliases()
        self._check_ranges()
        self._check_task_generation()
        self._check_loss_options()
        self._check_choices()
        self._check_batch_shape()
        self._check_memory_budget()
        self._check_schedule()
        self._check_weighting_signal()
        self._check_vllm()
        self._check_fsdp()

    # ------------------------------------------------------------------ validation
    def _normalise_values(self) -> None:
        """TRL and transformers hand enums (``SchedulerType.COSINE``) and JSON strings for dict
        fields (the CLI's ``--lr_scheduler_kwargs '{...}'``); store plain values."""
        import enum
        import json

        for name in FIELD_SECTION:
            value = self.get(name)
            if isinstance(value, enum.Enum):
                self.set(name, value.value)
        for name in ("lr_scheduler_kwargs", "gradient_checkpointing_kwargs", "generation_kwargs",
                     "chat_template_kwargs", "model_init_kwargs"):
            value = self.get(name)
            if isinstance(value, str):
                try:
                    self.set(name, json.loads(value))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{name}={value!r} is not a JSON object: {exc}") from None
            if self.get(name) is None and name == "model_init_kwargs":
                self.compute.model_init_kwargs = {}
        multitask = self.multitask
        for name, typed in (("task_weighting_params", weighting_params),
                            ("batch_construction_params", sampler_params)):
            value = getattr(multitask, name)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):  # not the class
                choice = multitask.task_weighting if name == "task_weighting_params" \
                    else multitask.batch_construction
                setattr(multitask, name, as_mapping(typed(choice, value)))  # kept as run files
        # TRL's default, gradient_accumulation_steps micro-batches, is one optimizer step
        if self.batch.steps_per_generation is None:
            self.batch.steps_per_generation = 1
        if self.optimization.warmup_ratio is None:  # transformers before 5.x: unset
            self.optimization.warmup_ratio = 0.0
        if self.output.output_dir is None:
            self.output.output_dir = "trainer_output"  # TRL's (transformers') default
        if self.compute.bf16 is None and self.compute.fp16:
            self.compute.bf16 = False  # fp16 asked for: auto never adds bf16
        if self.evaluation.num_generations_eval is None:
            self.evaluation.num_generations_eval = self.batch.num_generations  # TRL's None
        compute = self.compute
        if compute.trust_remote_code:
            # as TRL's setdefault: a trust_remote_code in model_init_kwargs wins
            compute.model_init_kwargs = {"trust_remote_code": True, **compute.model_init_kwargs}
        seen = self.output.include_num_input_tokens_seen
        # transformers maps a bool onto its words: True to 'all', False to 'no'
        if isinstance(seen, bool):
            self.output.include_num_input_tokens_seen = "all" if seen else "no"

    @property
    def fully_sharded(self) -> bool:
        """``fsdp`` asks for mtgrpo's fully sharded training (:mod:`mtgrpo.trainer.sharding`)."""
        return bool(self._fsdp_words())

    def _fsdp_words(self) -> list[str]:
        value = self.distributed.fsdp
        words = value.split() if isinstance(value, str) else list(value or [])
        return [str(word) for word in words]

    def _check_fsdp(self) -> None:
        words = self._fsdp_words()
        if not words:
            return
        unknown = [word for word in words if word not in FSDP_OPTIONS]
        if unknown or "full_shard" not in words:
            raise ValueError(
                f"fsdp={self.distributed.fsdp!r}: mtgrpo shards with fsdp='full_shard' (FSDP2, "
                f"every decoder layer; 'auto_wrap' may be added); {', '.join(unknown) or 'it'} is "
                "not supported here. For shard_grad_op, hybrid_shard or offload, use accelerate's "
                "config file (accelerate launch --config_file) and leave fsdp unset")
        if self.vllm.use_vllm:
            raise ValueError("fsdp='full_shard' with use_vllm: the vLLM engine takes whole "
                             "weights from an unsharded model; use generation_backend static "
                             "or hf with fsdp, or vLLM without it")

    def _check_vllm(self) -> None:
        """TRL's vLLM switches, checked before any model or engine loads."""
        vllm = self.vllm
        if not vllm.use_vllm:
            return
        if vllm.vllm_mode not in typing.get_args(VLLMMode):
            raise ValueError(f"vllm_mode must be 'colocate' or 'server', got {vllm.vllm_mode!r}")
        if self.rollout.generation_backend != "auto":
            raise ValueError(
                f"use_vllm=True generates with vLLM, but generation_backend="
                f"{self.rollout.generation_backend!r} asks for another engine; set only one of "
                "them")
        if vllm.vllm_importance_sampling_correction:
            check_is_correction(vllm.vllm_importance_sampling_mode,
                                vllm.vllm_importance_sampling_clip_min,
                                vllm.vllm_importance_sampling_clip_max)
            if self.rollout.generation_logprobs is False:
                raise ValueError(
                    "vllm_importance_sampling_correction needs the engine's log-probs, and "
                    "generation_logprobs=False turns them off; remove one of the two settings")
            if self.loss.loss_type == "vespo":
                raise ValueError(
                    "loss_type='vespo' with vllm_importance_sampling_correction is not "
                    "supported (TRL folds the ratio into VESPO's weights); set "
                    "vllm_importance_sampling_correction=False or another loss_type")
        timeout = vllm.vllm_server_timeout
        if timeout is None or not timeout > 0:
            raise ValueError(f"vllm_server_timeout={timeout!r} must be a number of seconds > 0")

    def _merge_aliases(self) -> None:
        self.advantage.multi_objective_aggregation = resolve_aggregation(
            multi_objective_aggregation=self.advantage.multi_objective_aggregation)
        self.advantage.scale_rewards = resolve_scale_rewards(self.advantage.scale_rewards)
        if self.output.report_to is None:
            self.output.report_to = []
        if isinstance(self.output.report_to, str):
            self.output.report_to = [self.output.report_to]
        # transformers' words: 'none' for no tracker, 'all' for every one
        self.output.report_to = [t for t in self.output.report_to if t != "none"]
        if self.output.report_to == ["all"]:
            self.output.report_to = list(TRACKERS)
        if self.evaluation.eval_strategy is None:
            self.evaluation.eval_strategy = "steps" if self.evaluation.eval_steps else "no"
        if self.evaluation.eval_strategy == "steps" and self.evaluation.eval_steps is None:
            self.evaluation.eval_steps = self.output.logging_steps  # TRL's default

    def _check_ranges(self) -> None:
        positive = ("num_generations", "per_device_train_batch_size",
                    "gradient_accumulation_steps", "steps_per_generation", "num_iterations",
                    "max_completion_length", "num_generations_eval", "ref_model_sync_steps")
        for name in positive:
            value = self.get(name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        prompt = self.rollout.max_prompt_length
        if prompt is not None and (isinstance(prompt, bool) or not isinstance(prompt, int)
                                   or prompt < 1):
            raise ValueError(
                f"max_prompt_length={prompt!r} must be a positive integer (the most prompt tokens "
                "kept), or null to keep whole prompts"
            )
        timeout = self.advantage.reward_timeout
        number = isinstance(timeout, int | float) and not isinstance(timeout, bool)
        if timeout is not None and not (number and timeout > 0):
            raise ValueError(f"reward_timeout={timeout!r} must be a positive number of seconds, "
                             "or null for no limit")  # fmt: skip
        self._check_tool_loop()
        max_steps = self.schedule.max_steps
        if not isinstance(max_steps, int) or (max_steps < 1 and max_steps != -1):
            raise ValueError(
                f"max_steps={max_steps!r} must be a positive integer, or -1 to train for "
                "num_train_epochs"
            )
        for name in ("logging_steps", "save_steps", "eval_steps", "warmup_steps", "eval_delay"):
            value = self.get(name)
            if value is not None and not value >= 0:  # NaN fails too
                raise ValueError(f"{name}={value} must be >= 0")
        if not self.output.logging_steps > 0:
            raise ValueError(f"logging_steps={self.output.logging_steps} must be > 0")
        if self.evaluation.eval_strategy == "steps" and not self.evaluation.eval_steps:
            raise ValueError(
                f"eval_strategy='steps' needs eval_steps > 0, got "
                f"{self.evaluation.eval_steps!r}; set eval_steps or eval_strategy='no'"
            )
        if self.batch.num_generations < 2:
            raise ValueError(
                f"num_generations={self.batch.num_generations}: GRPO compares completions of the "
                "same prompt, so it needs at least 2; use num_generations >= 2"
            )
        checks = {
            "learning_rate": self.optimization.learning_rate >= 0,
            "temperature": self.rollout.temperature >= 0,
            "top_p": 0 < self.rollout.top_p <= 1,
            "top_k": self.rollout.top_k >= 0,
            "min_p": self.rollout.min_p is None or 0 <= self.rollout.min_p <= 1,
            "repetition_penalty": self.rollout.repetition_penalty > 0,
            "beta": self.loss.beta >= 0,
            "epsilon": self.loss.epsilon >= 0,
            "epsilon_high": self.loss.epsilon_high is None or self.loss.epsilon_high >= 0,
            "max_grad_norm": self.optimization.max_grad_norm >= 0,
            "warmup_ratio": 0 <= self.optimization.warmup_ratio < 1,
            "advantage_epsilon": self.advantage.advantage_epsilon >= 0,
            "advantage_std_ddof": self.advantage.advantage_std_ddof in (0, 1),
            "eval_temperature": self.evaluation.eval_temperature >= 0,
            "max_padding_fraction": 0 < self.batch.max_padding_fraction <= 1,
            "num_train_epochs": self.schedule.num_train_epochs > 0,
            "ref_model_mixup_alpha": 0 <= self.loss.ref_model_mixup_alpha <= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}={self.get(name)!r} is out of range")
        if self.rollout.temperature == 0:
            raise ValueError(
                "temperature=0 (greedy) gives identical completions, so every group has zero "
                "gradient; use a temperature > 0 for training (eval_temperature may be 0)"
            )

    def _check_tool_loop(self) -> None:
        rounds = self.rollout.max_tool_calling_iterations
        if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int)
                                   or rounds < 0):
            raise ValueError(
                f"max_tool_calling_iterations={rounds!r} must be an integer >= 0 (the most "
                "rounds of tool calls per rollout), or null for no limit")
        timeout = self.rollout.tool_call_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(
                f"tool_call_timeout={timeout!r} must be a positive number of seconds (how long "
                "one tool call may take); use e.g. tool_call_timeout=60")
        if self.rollout.malformed_tool_calls not in MALFORMED_TOOL_CALLS:
            raise ValueError(
                f"malformed_tool_calls={self.rollout.malformed_tool_calls!r} must be one of "
                f"{', '.join(MALFORMED_TOOL_CALLS)}: end stops the rollout, reply answers the "
                "call with its parse error")

    def _check_task_generation(self) -> None:
        """``task_generation``: {task: {max_completion_length: N}}, 1 <= N <= the run's."""
        if self.rollout.task_generation is None:
            return
        if not isinstance(self.rollout.task_generation, dict):
            raise ValueError(
                "task_generation must map task names to settings, got "
                f"{self.rollout.task_generation!r}"
            )
        for task, fields in self.rollout.task_generation.items():
            if not isinstance(fields, dict) or set(fields) != {"max_completion_length"}:
                raise ValueError(
                    f"task_generation[{task!r}]={fields!r}: the per-task setting is "
                    "max_completion_length (sampling temperature and nucleus stay the run's, "
                    "because the update's log-probs use them)"
                )
            value = fields["max_completion_length"]
            if isinstance(value, bool) or not isinstance(value, int) or \
                    not 1 <= value <= self.rollout.max_completion_length:
                raise ValueError(
                    f"task_generation[{task!r}].max_completion_length={value!r} must be an int "
                    f"in [1, max_completion_length={self.rollout.max_completion_length}]"
                )

    def _check_loss_options(self) -> None:
        if self.loss.delta is not None and self.loss.delta <= 1 + self.resolved_epsilon_high:
            raise ValueError(
                f"delta={self.loss.delta} must exceed 1 + epsilon_high = "
                f"{1 + self.resolved_epsilon_high}, or two-sided clipping clips every ratio; "
                "raise delta or leave it None"
            )
        if not 0 <= self.loss.top_entropy_quantile <= 1:
            raise ValueError(
                f"top_entropy_quantile={self.loss.top_entropy_quantile} must be in [0, 1] (1.0 "
                "trains on every token, 0.0 on the highest-entropy one)"
            )
        if not self.loss.entropy_coef_min <= self.loss.entropy_coef_max:
            raise ValueError(
                f"entropy_coef_min={self.loss.entropy_coef_min} exceeds entropy_coef_max="
                f"{self.loss.entropy_coef_max}"
            )
        if min(self.loss.sapo_temperature_pos, self.loss.sapo_temperature_neg) <= 0:
            raise ValueError("sapo temperatures must be > 0, got "
                             f"{self.loss.sapo_temperature_pos} and "
                             f"{self.loss.sapo_temperature_neg}")
        if self.loss.sync_ref_model and self.loss.beta == 0:
            raise ValueError(
                "sync_ref_model=True updates the reference model, which exists only with a KL "
                "term; set beta > 0 or sync_ref_model=False"
            )
        _warn_about_loss_combinations(self.loss.loss_type, self.loss.importance_sampling_level)

    def _check_choices(self) -> None:
        choices = {
            "loss_type": (self.loss.loss_type, LOSS_TYPES.names()),
            "on_long_prompt": (self.rollout.on_long_prompt, ON_LONG_PROMPT),
            "none_handling": (self.advantage.none_handling, NONE_HANDLING),
            "on_unscorable": (self.advantage.on_unscorable, ("auto", *ON_UNSCORABLE.names())),
            "improvement_reduction": (self.multitask.improvement_reduction, IMPROVEMENT_REDUCTIONS),
            "task_weighting_signal": (self.multitask.task_weighting_signal, TASK_WEIGHTING_SIGNALS),
            "logging_strategy": (self.output.logging_strategy, INTERVALS),
            "eval_strategy": (self.evaluation.eval_strategy, INTERVALS),
            "save_strategy": (self.saving.save_strategy, SAVE_INTERVALS),
            "hub_strategy": (self.saving.hub_strategy, HUB_STRATEGIES),
            "importance_sampling_level": (self.loss.importance_sampling_level,
                                          IMPORTANCE_SAMPLING_LEVELS),
            "log_level": (self.output.log_level, LOG_LEVELS),
            "log_level_replica": (self.output.log_level_replica, LOG_LEVELS),
            "include_num_input_tokens_seen": (self.output.include_num_input_tokens_seen,
                                              TOKENS_SEEN),
            "train_sampling_strategy": (self.schedule.train_sampling_strategy, SAMPLING_ORDERS),
        }
        for name, (value, valid) in choices.items():
            if value not in valid:
                raise ValueError(f"{name}={value!r} is not one of: {', '.join(valid)}")
        for tracker in self.output.report_to:
            if tracker not in TRACKERS:
                raise ValueError(
                    f"report_to contains {tracker!r}; valid trackers: {', '.join(TRACKERS)} "
                    "(metrics.jsonl is always written)"
                )
        check_scheduler_name(self.optimization.lr_scheduler_type)
        check_optimizer_name(self.optimization.optim)
        if self.rollout.generation_backend != "auto" and ":" not in self.rollout.generation_backend:
            # an object or an import path is the trainer's to resolve
            BACKENDS.canonical(self.rollout.generation_backend)
        check_model_init_kwargs(self.compute.model_init_kwargs)
        if self.saving.save_strategy == "best" and self.saving.metric_for_best_model is None:
            raise ValueError("save_strategy='best' needs metric_for_best_model (e.g. "
                             "'accuracy/worst')")
        if self.saving.load_best_model_at_end and self.saving.metric_for_best_model is None:
            self.saving.metric_for_best_model = "loss"  # transformers' default
        multitask = self.multitask
        multitask.task_weighting = WEIGHTINGS.canonical(multitask.task_weighting)
        multitask.batch_construction = SAMPLERS.canonical(multitask.batch_construction)
        multitask.zero_gradient_filter = ZERO_GRADIENT_FILTERS.canonical(
            multitask.zero_gradient_filter)
        check_weighting_params(multitask.task_weighting, multitask.task_weighting_params)
        check_sampler_params(multitask.batch_construction, multitask.batch_construction_params)

    def _check_memory_budget(self) -> None:
        if self.batch.max_memory_per_microbatch is None:
            return
        parse_bytes(self.batch.max_memory_per_microbatch, "max_memory_per_microbatch")
        if self.batch.max_tokens_per_microbatch is not None:
            raise ValueError(
                f"max_memory_per_microbatch={self.batch.max_memory_per_microbatch!r} and "
                f"max_tokens_per_microbatch={self.batch.max_tokens_per_microbatch} both size the "
                "micro-batches; set one of them")
        if self.distributed.fsdp:
            raise ValueError(
                "max_memory_per_microbatch with fsdp='full_shard' is not supported yet (the "
                "measuring forward would gather the shards outside a step); size the "
                "micro-batches with max_tokens_per_microbatch or per_device_train_batch_size")

    def _check_batch_shape(self) -> None:
        if self.batch.prompts_per_step is not None:
            if self.batch.prompts_per_step < 1:
                raise ValueError(f"prompts_per_step={self.batch.prompts_per_step} must be >= 1")
            return
        batch = self.batch
        completions = (batch.per_device_train_batch_size * batch.gradient_accumulation_steps
                       * self.updates_per_generation())
        if completions < self.batch.num_generations:
            import logging

            logging.getLogger("mtgrpo.config").warning(
                "per_device_train_batch_size × gradient_accumulation_steps × "
                "steps_per_generation = %d completions is less than one group of "
                "num_generations=%d: each step trains on one prompt's %d completions, in "
                "micro-batches of %d", completions, batch.num_generations, batch.num_generations,
                batch.per_device_train_batch_size)
            return
        # TRL refuses it too: a generation batch must hold whole groups
        if completions % self.batch.num_generations:
            raise ValueError(
                f"per_device_train_batch_size × gradient_accumulation_steps × "
                f"steps_per_generation = {completions} completions is not a multiple of "
                f"num_generations={self.batch.num_generations}; change one of them, or set "
                "prompts_per_step explicitly"
            )

    def _check_weighting_signal(self) -> None:
        """``task_weighting_signal: validation`` needs weights that move, a positive interval
        and, for sec, groups to read ``|A|`` from (the split itself: :class:`RunConfig`, or
        the trainer's ``validation_dataset``)."""
        samples = self.multitask.num_generations_validation
        if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int)
                                    or samples < 1):
            raise ValueError(f"num_generations_validation={samples!r} must be a positive "
                             "integer, or null for num_generations")
        steps = self.multitask.validation_steps
        if steps is not None and (isinstance(steps, bool) or not steps > 0
                                  or (steps >= 1 and steps != int(steps))):
            raise ValueError(f"validation_steps={steps!r} must be a whole number of steps >= 1 "
                             "or a fraction of the run below 1 (null: eval_steps)")
        if self.multitask.task_weighting_signal != "validation":
            return
        if not reads_task_stats(self.multitask.task_weighting):
            raise ValueError(
                f"task_weighting_signal='validation' moves the task weights with held-out "
                f"accuracy, but task_weighting={self.multitask.task_weighting!r} never moves "
                "them; use mt_grpo, worst_case, regularized or sec, or task_weighting_signal: "
                "train")
        if self.multitask.task_weighting == "sec" and self.resolved_num_generations_validation < 2:
            raise ValueError(
                f"sec reads the mean |A| of each task's validation groups, which is 0 with "
                f"num_generations_validation={self.resolved_num_generations_validation}; set "
                "it to 2 or more (null: num_generations)")

    def resolved_validation_steps(self, training_steps: int) -> int:
        """How often, in steps, the validation split is evaluated (``validation_steps``; None:
        ``eval_steps`` when evaluating by steps, else :data:`DEFAULT_VALIDATION_STEPS`)."""
        value = self.multitask.validation_steps
        if value is None:
            evaluation = self.evaluation
            value = evaluation.eval_steps \
                if evaluation.eval_strategy == "steps" and evaluation.eval_steps \
                else DEFAULT_VALIDATION_STEPS
        return max(self.interval(value, training_steps), 1)

    @property
    def resolved_num_generations_validation(self) -> int:
        """Samples per validation prompt (``num_generations_validation``, else
        ``num_generations``)."""
        return self.multitask.num_generations_validation or self.batch.num_generations

    def _check_schedule(self) -> None:
        warmup_steps, warmup_ratio = self.optimization.warmup_steps, self.optimization.warmup_ratio
        if warmup_steps >= 1 and warmup_steps != int(warmup_steps):
            raise ValueError(f"warmup_steps={warmup_steps} must be an integer of steps "
                             "or a fraction below 1")
        if warmup_ratio > 0 and warmup_steps > 0:
            raise ValueError(
                f"give warmup_steps ({warmup_steps}) or warmup_ratio ({warmup_ratio}), not both"
            )

    # ------------------------------------------------------------------ derived values
    def updates_per_generation(self) -> int:
        """Optimizer steps taken on one generation batch in each of its ``num_iterations``
        passes (``steps_per_generation``; TRL's ``GRPOConfig`` counts micro-batches there)."""
        return self.batch.steps_per_generation

    def optimizer_steps_per_step(self) -> int:
        """Optimizer steps per training step (generation batch), all passes together."""
        return self.updates_per_generation() * self.batch.num_iterations

    def resolved_prompts_per_step(self, world_size: int = 1) -> int:
        """``B``: prompts per training step on all processes together."""
        if self.batch.prompts_per_step is not None:
            return self.batch.prompts_per_step
        batch = self.batch
        completions = (batch.per_device_train_batch_size * batch.gradient_accumulation_steps
                       * self.updates_per_generation() * world_size)
        return max(1, completions // self.batch.num_generations)  # at least one group

    def completions_per_optimizer_step(self, world_size: int = 1) -> int:
        total = self.resolved_prompts_per_step(world_size) * self.batch.num_generations
        updates = self.updates_per_generation()
        if total % updates:
            raise ValueError(
                f"{total} completions per step cannot be split into {updates} equal "
                "optimizer steps (steps_per_generation); adjust prompts_per_step"
            )
        return total // updates

    @property
    def epsilon_low(self) -> float:
        return self.loss.epsilon

    @property
    def resolved_epsilon_high(self) -> float:
        return self.loss.epsilon if self.loss.epsilon_high is None else self.loss.epsilon_high

    def steps_per_epoch(self, num_prompts: int, world_size: int = 1) -> int:
        """Training steps in one pass over ``num_prompts`` prompts (TRL drops the last
        incomplete batch; at least one step)."""
        return max(1, num_prompts // self.resolved_prompts_per_step(world_size))

    def training_steps(self, num_prompts: int | None = None, world_size: int = 1) -> int:
        """Training steps (generation batches) of the run: ``max_steps`` (with
        ``step_unit: optimizer``, enough batches for that many optimizer steps), or
        ``num_train_epochs`` epochs."""
        max_steps = self.schedule.max_steps
        if max_steps > 0:
            if self.schedule.step_unit == "optimizer":
                # enough batches; the last one stops at max_steps (total_optimizer_steps)
                return math.ceil(max_steps / self.optimizer_steps_per_step())
            return max_steps
        if num_prompts is None:
            raise ValueError(
                "max_steps=-1 trains for num_train_epochs epochs, which needs the dataset's "
                "size; this dataset has none (an iterable dataset): set max_steps"
            )
        epochs = self.schedule.num_train_epochs
        # a fractional epoch rounds up, as transformers' max_steps
        return math.ceil(epochs * self.steps_per_epoch(num_prompts, world_size))

    def total_optimizer_steps(self, training_steps: int | None = None) -> int:
        """Optimizer steps of a run of ``training_steps`` steps (TRL's ``max_steps``)."""
        if self.schedule.step_unit == "optimizer" and self.schedule.max_steps > 0:
            return self.schedule.max_steps  # the last batch takes only the steps left
        steps = self.training_steps() if training_steps is None else training_steps
        return steps * self.optimizer_steps_per_step()

    def resolved_warmup_steps(self, training_steps: int | None = None) -> int:
        total = self.total_optimizer_steps(training_steps)
        if self.optimization.warmup_ratio > 0:
            # rounded up, as transformers' get_warmup_steps
            return math.ceil(self.optimization.warmup_ratio * total)
        # transformers 5: warmup_steps below 1 is a fraction of the run
        if 0 < self.optimization.warmup_steps < 1:
            return math.ceil(self.optimization.warmup_steps * total)
        return int(self.optimization.warmup_steps)

    def interval(self, value: int | float | None, training_steps: int) -> int:
        """A logging / eval / save interval in steps (a value below 1 is a fraction of the
        run, rounded up, as transformers does)."""
        if not value:
            return 0
        if value < 1:
            return math.ceil(value * training_steps)
        return int(value)

    def optimizer_interval(self, value: int | float | None, training_steps: int) -> int:
        """A logging / eval / save interval in optimizer steps (``trainer.state``'s unit,
        which transformers' ``DefaultFlowCallback`` compares with ``global_step``)."""
        if self.schedule.step_unit == "optimizer":
            return self.interval(value, self.total_optimizer_steps(training_steps))
        return self.interval(value, training_steps) * self.optimizer_steps_per_step()

    def to_dict(self) -> dict[str, Any]:
        """Every option by its flat name: a run file's top level, which
        :meth:`from_flat` reads back."""
        return self.to_flat()

    # transformers' callbacks (wandb, tensorboard, ...) read the arguments through these
    # transformers' rule: TensorBoard's hparams take bool, int, float and str only
    def to_sanitized_dict(self) -> dict[str, Any]:
        return {k: v if isinstance(v, (bool, int, float, str)) else str(v)
                for k, v in self.to_dict().items()}

    def to_json_string(self) -> str:
        import json

        return json.dumps(self.to_dict(), indent=2, default=str)  # a dtype, a path: as text


def native_config(args: Any) -> TrainConfig:
    """``args`` itself when it is a :class:`TrainConfig`, else the tree it builds
    (``args.to_native()``: TRL's flat ``GRPOConfig``, :mod:`mtgrpo.compat`)."""
    if isinstance(args, TrainConfig):
        return args
    to_native = getattr(args, "to_native", None)
    if to_native is None:
        raise TypeError(f"args must be a TrainConfig or a GRPOConfig, got {type(args).__name__}")
    return to_native()


class FlatOptions:
    """A live view of a :class:`TrainConfig` by flat option names (``view.logging_steps``), for
    code written against transformers' ``TrainingArguments``: its callbacks read the
    arguments so (``DefaultFlowCallback`` reads ``args.logging_strategy``, ...)."""

    def __init__(self, config: TrainConfig) -> None:
        # past __setattr__ below, which takes option names only
        object.__setattr__(self, "_config", config)

    def __getattr__(self, name: str) -> Any:
        # self._config would call __getattr__ again while _config is unset (copy, unpickling)
        config = object.__getattribute__(self, "_config")
        return config.get(name) if name in FIELD_SECTION else getattr(config, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in FIELD_SECTION:
            raise AttributeError(f"{name!r} is not an option of TrainConfig")
        self._config.set(name, value)


# torch_dtype: transformers' deprecated name for dtype, still accepted
_MODEL_INIT_KWARGS = ("dtype", "torch_dtype", "attn_implementation", "trust_remote_code",
                      "revision", "gguf_file")


def check_model_init_kwargs(kwargs: Mapping[str, Any]) -> None:
    """``model_init_kwargs`` holds only the loading options mtgrpo passes on."""
    unknown = sorted(set(kwargs) - set(_MODEL_INIT_KWARGS))
    if unknown:
        raise ValueError(
            f"model_init_kwargs has unknown option(s) {unknown}; use dtype, "
            "attn_implementation, trust_remote_code, revision or gguf_file"
        )


@dataclass
class ModelConfig:
    """Which model to train and how to load it."""

    name_or_path: str = _help("Hub name, local directory, or path to a .gguf file.",
                              default="")
    gguf_file: str | None = _help("GGUF file name inside name_or_path.", default=None)
    dtype: str = _help("auto, float32, bfloat16 or float16.", default="auto")
    trust_remote_code: bool = _help("Allow model code from the hub.", default=False)
    attn_implementation: str | None = _help("e.g. sdpa, eager, flash_attention_2.",
                                            default=None)
    revision: str | None = _help("Hub revision.", default=None)
    tiny: bool = _help("Build (once, cached) the tiny local model at name_or_path.",
                       default=False)
    tiny_options: dict[str, Any] | None = _help(
        "Shape of the tiny model (hidden_size, num_layers, ...; see mtgrpo tiny-model).",
        default=None)

    def __post_init__(self) -> None:
        check_option_types(self, "model")
        DTYPES.canonical(self.dtype)


@dataclass
class DataConfig:
    """Where prompts come from: files / datasets, or a built-in task suite."""

    train: str | None = _help("Training data: a JSONL/JSON/parquet/CSV file or a hub dataset.",
                              default=None)
    eval: str | None = _help("Evaluation data, same forms as train.", default=None)
    split: str = _help("Split of a hub dataset.", default="train")
    eval_split: str | None = _help("Split of a hub eval dataset.", default=None)
    prompt_column: str = _help("Column with the prompt (text or chat messages).",
                               default="prompt")
    loader: str | None = _help(
        "Import path of a loader called as loader(source, split=..., **loader_options) for "
        "train and eval (e.g. mtgrpo.tasks.gsm8k:load_gsm8k).", default=None)
    loader_options: dict[str, Any] = _help("Keyword options of the loader.",
                                           default_factory=dict)

    def __post_init__(self) -> None:
        check_option_types(self, "data")


@dataclass
class RewardsConfig:
    """The ``rewards:`` section: reward functions for every task (a list in the run file) or
    routed to tasks (a mapping ``{task: [entries]}``, where ``"*"`` means every task).

    An entry is a registered name (``math_reward``, ``format_reward``, ...), an import path
    ``package.module:function``, ``{name: ..., <option>: ...}`` for a function with options,
    ``{reward_model: org/name}``, or a reward model's hub id or directory. Names are checked
    when the configuration is built; functions are imported before the model loads.
    """

    every_task: list[Any] = _help(
        "Entries that score every task: the run file's list (or its '*' key).",
        default_factory=list)
    by_task: dict[str, list[Any]] = _help(
        "Entries routed to the tasks named: the run file's mapping {task: [entries]}.",
        default_factory=dict)

    def __post_init__(self) -> None:
        check_option_types(self, "rewards")
        from mtgrpo.rewards.registry import check_reward_entry  # the names: imports torch

        for entry in [*self.every_task, *(e for fns in self.by_task.values() for e in fns)]:
            check_reward_entry(entry)

    @classmethod
    def from_value(cls, value: Any) -> RewardsConfig:
        """From the run file's form: one entry, a list of them, or a routing mapping."""
        if isinstance(value, Mapping):
            routed = {str(task): list(fns) if isinstance(fns, list | tuple) else [fns]
                      for task, fns in value.items()}
            return cls(every_task=routed.pop("*", []), by_task=routed)
        return cls(every_task=list(value) if isinstance(value, list | tuple) else [value])

    def to_value(self) -> list[Any] | dict[str, list[Any]]:
        """The run file's form (what :class:`~mtgrpo.trainer.GRPOTrainer` takes as
        ``reward_funcs``): the list, or the routing mapping."""
        if not self.by_task:
            return list(self.every_task)
        everywhere = {"*": list(self.every_task)} if self.every_task else {}
        return {**{task: list(fns) for task, fns in self.by_task.items()}, **everywhere}


@dataclass
class RunConfig:
    """Everything a run needs: what ``mtgrpo train CONFIG.yaml`` reads."""

    training: TrainConfig = field(default_factory=TrainConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tasks: TasksConfig | None = None  # a task suite (mtgrpo.tasks)
    rewards: RewardsConfig | None = None  # reward functions, for every task or routed
    peft: LoraSettings | None = None  # a LoRA adapter
    sft: WarmStartConfig | None = None  # a supervised warm start before GRPO
    environments: EnvironmentsConfig | None = None  # tool environments, each one a task

    def __post_init__(self) -> None:
        if self.environments is not None and (self.tasks is not None
                                              or self.data.train is not None):
            other = "a tasks section" if self.tasks is not None else "data.train"
            raise ValueError(
                f"this run has an environments section and {other}: a run trains on "
                "environments (their episodes) or on tasks / data, not both. Fix: drop one, "
                "or write your rows with an environment column to a file for data.train and "
                "pass environment_factory from Python")
        if self.training.multitask.task_weighting_signal == "validation" and (
                self.tasks is None or not self.tasks.validation_size):
            where = "this run has no tasks section" if self.tasks is None \
                else "tasks.validation_size is 0"
            raise ValueError(
                "task_weighting_signal='validation' weights the tasks by held-out accuracy on "
                f"the task suite's validation split, but {where}. Fix: set "
                "tasks.validation_size (e.g. 50 problems per task), or task_weighting_signal: "
                "train")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = self.training.to_dict()
        out["model"] = dataclasses.asdict(self.model)
        out["data"] = dataclasses.asdict(self.data)
        if self.tasks is not None:
            out["tasks"] = self.tasks.to_dict()
        if self.rewards is not None:
            out["rewards"] = self.rewards.to_value()
        if self.peft is not None:
            out["peft"] = self.peft.to_dict()
        if self.sft is not None:
            out["sft"] = self.sft.to_dict()
        if self.environments is not None:
            out["environments"] = self.environments.to_dict()
        return out


# Section name -> how a run file's value becomes the section object.
_SECTIONS: dict[str, Any] = {
    "model": lambda value: build_section(
        ModelConfig, {"name_or_path": value} if isinstance(value, str) else value, "model"),
    "data": lambda value: build_section(DataConfig, value, "data"),
    "tasks": lambda value: build_section(TasksConfig, value, "tasks"),
    "rewards": RewardsConfig.from_value,
    "peft": LoraSettings.from_dict,
    "sft": WarmStartConfig.from_dict,
    "environments": EnvironmentsConfig.from_dict,
}


def run_config_from_dict(
        raw: Mapping[str, Any],
        training: Callable[[Mapping[str, Any]], TrainConfig] = TrainConfig.from_flat,
) -> RunConfig:
    """Build a :class:`RunConfig` from a mapping shaped like the YAML file; every section is
    validated here, before anything loads.

    ``training`` builds the training options from the keys that are not sections (default:
    :meth:`TrainConfig.from_flat`; :func:`mtgrpo.compat.load_run_config` passes the reader that
    also takes TRL's fields and ``step_counts: trl``)."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"a run config must be a mapping of options, got {type(raw).__name__}")
    options = training({k: v for k, v in raw.items() if k not in _SECTIONS})
    sections = {name: build(raw[name]) for name, build in _SECTIONS.items()
                if raw.get(name) is not None}  # a null section (`peft:` left empty) is none
    sections.setdefault("model", ModelConfig())
    sections.setdefault("data", DataConfig())
    return RunConfig(training=options, **sections)


def _parse_scalar(text: str) -> Any:
    import yaml

    # safe_load: a value on the command line cannot build Python objects
    return yaml.safe_load(text)


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``--field value`` / ``--section.field value`` / ``--field=value`` overrides.

    Values are parsed as YAML scalars (``--beta 0.04``, ``--report_to '[tensorboard]'``).
    """
    # sections copied: the caller's mapping stays as it was
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    items = list(overrides)
    i = 0
    while i < len(items):
        token = items[i]
        if not token.startswith("--"):
            raise ValueError(f"expected an option like --learning_rate, got {token!r}")
        key, sep, value = token[2:].partition("=")
        if not sep:
            if i + 1 >= len(items):
                raise ValueError(f"option {token} needs a value")
            value = items[i + 1]
            i += 1
        i += 1
        key = key.replace("-", "_")  # --learning-rate too, as HfArgumentParser
        target = out
        *parents, leaf = key.split(".")
        for parent in parents:
            if target.get(parent) is None:  # an absent or null section
                target[parent] = {}
            target = target[parent]
            if not isinstance(target, dict):
                raise ValueError(f"cannot set {key}: {parent!r} is not a section")
        target[leaf] = _parse_scalar(value)
    return out


def load_run_config(
        path: str | Path | None, overrides: Sequence[str] = (),
        training: Callable[[Mapping[str, Any]], TrainConfig] = TrainConfig.from_flat,
) -> RunConfig:
    """Read a YAML run file (or start from defaults when ``path`` is None) and apply overrides;
    ``training`` as in :func:`run_config_from_dict`."""
    import yaml

    raw: dict[str, Any] = {}
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"config file {str(file)!r} does not exist")
        try:
            # safe_load: a run file cannot construct Python objects
            loaded = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError as error:
            raise ValueError(f"{file} is not UTF-8 text (byte {error.start}): save the run "
                             "file as UTF-8") from None  # fmt: skip
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            # PyYAML's marks count lines and columns from 0
            where = f"{file}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(file)
            problem = getattr(error, "problem", None) or str(error)
            raise ValueError(f"{where}: not valid YAML ({problem}); fix the run file there") \
                from None
        if not isinstance(loaded, dict):
            raise ValueError(f"{file}: a run config must be a mapping of options")
        raw = loaded
    if isinstance(raw.get("model"), str):
        raw["model"] = {"name_or_path": raw["model"]}
    return run_config_from_dict(apply_overrides(raw, overrides), training)


def config_fields_help(cls: type = TrainConfig,
                       own_only: bool = False) -> list[tuple[str, str, str, str]]:
    """``(name, type, default, help)`` for every field: the source of docs/configuration.md
    and the CLI's flags. For :class:`TrainConfig`, every option of its sections, by flat name.

    ``own_only`` leaves out the fields a dataclass base class declares (for TRL's
    ``GRPOConfig``, the fields of :mod:`mtgrpo.compat` that do not act)."""
    if cls is TrainConfig:
        return [row for kind in SECTIONS.values() for row in config_fields_help(kind)]
    hints = typing.get_type_hints(cls)
    inherited = set()
    if own_only:
        for base in cls.__mro__[1:]:
            if dataclasses.is_dataclass(base):
                inherited |= {f.name for f in dataclasses.fields(base)}
    rows = []
    for f in dataclasses.fields(cls):
        if f.name in inherited or not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "required"
        type_name = str(hints[f.name]).replace("typing.", "")
        rows.append((f.name, type_name, default, f.metadata.get("help", "")))
    return rows


def _first_paragraph(cls: type) -> str:
    """The first paragraph of a class docstring, on one line."""
    return " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())


def _table(lines: list[str], title: str, cls: type, note: str = "") -> None:
    lines += [f"#### {title}", ""] + ([note, ""] if note else [])
    lines += ["| option | default | meaning |", "|---|---|---|"]
    for name, _, default, text in config_fields_help(cls, own_only=True):
        lines.append(f"| `{name}` | `{default}` | {text} |")
    lines.append("")


def _params_table(lines: list[str]) -> None:
    """The typed parameters of each built-in task weighting and batch construction."""
    lines += ["#### `task_weighting_params` and `batch_construction_params` (`mtgrpo.algo.params`)",
              "", "A mapping in a run file; from Python also the strategy's typed parameters. "
              "Either is checked by the strategy's own rules, and a bad value's error names the "
              "allowed range (docs/concepts.md says what each strategy does).", "",
              "| option | strategy | typed parameters | parameters (default) |",
              "|---|---|---|---|"]
    for option, classes in (("task_weighting_params", WEIGHTING_PARAMS),
                            ("batch_construction_params", SAMPLER_PARAMS)):
        for name, kind in classes.items():
            fields = ", ".join(
                f"`{f.name}` " + ("(required)" if f.default is dataclasses.MISSING
                                  else f"({f.default!r})")
                for f in dataclasses.fields(kind)) or "none"
            lines.append(f"| `{option}` | `{name}` | `{kind.__name__}` | {fields} |")
    lines.append("")


def reference_markdown() -> str:
    """docs/configuration.md: one table per section, from the field metadata."""
    lines: list[str] = []
    for section, kind in SECTIONS.items():
        _table(lines, f"Training: `{section}` (`{kind.__name__}`)", kind, _first_paragraph(kind))
    _params_table(lines)
    sections = [
        ("`model:`", ModelConfig, ""), ("`data:`", DataConfig, ""),
        ("`tasks:` (`mtgrpo.tasks.TasksConfig`)", TasksConfig, ""),
        ("`environments:` (`mtgrpo.tasks.episodes.EnvironmentsConfig`; docs/agents.md)",
         EnvironmentsConfig, "Tool environments instead of tasks, each one a task; a run has "
         "this section or `tasks` / `data.train`."),
        ("`rewards:` (`RewardsConfig`)", RewardsConfig, _first_paragraph(RewardsConfig)),
        ("`peft:` (`mtgrpo.models.LoraSettings`)", LoraSettings, ""),
        ("`sft:` (`mtgrpo.sft.WarmStartConfig`)", WarmStartConfig,
         _first_paragraph(WarmStartConfig)),
        ("`sft:` training options (`mtgrpo.sft.SFTConfig`, also `mtgrpo sft`'s flags)",
         SFTConfig, "The warm start sets `output_dir` (`<output_dir>/sft`) and "
         "`overwrite_output_dir` itself."),
    ]
    for title, cls, note in sections:
        _table(lines, title, cls, note)
    return "\n".join(lines).rstrip() + "\n"
