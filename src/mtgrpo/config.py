"""The configuration tree: :class:`GRPOConfig` (training) plus model, data and reward sections.

:class:`GRPOConfig` speaks TRL's ``GRPOConfig`` names wherever TRL has the same option
(``learning_rate``, ``num_generations``, ``beta``, ``epsilon``, ``loss_type``, ...) and adds the
multi-task options (task weighting, batch construction, zero-gradient filter, ...). Every field
carries its help text once, in ``metadata["help"]``: the README's reference table and the
``mtgrpo train --field value`` flags are derived from it.

A YAML run file maps one-to-one onto :class:`RunConfig`: the :class:`GRPOConfig` fields at the
top level, plus the sections ``model``, ``data``, ``tasks``, ``rewards`` and ``peft``.

Batch sizes (the part TRL users most often ask about):

* ``num_generations`` is ``G``, completions per prompt.
* ``per_device_train_batch_size`` counts **completions** (as in TRL): the rows of one forward
  and backward pass (a micro-batch) on one device.
* One training step generates one batch of ``prompts_per_step`` prompts (``B``), so ``B*G``
  completions, and then takes ``steps_per_generation`` optimizer steps on it (each on
  ``B*G / steps_per_generation`` completions), repeated ``num_iterations`` times (μ).
* ``prompts_per_step`` defaults to TRL's derivation:
  ``per_device_train_batch_size × gradient_accumulation_steps × world_size ×
  steps_per_generation / num_generations``. When it is given explicitly, the
  ``gradient_accumulation_steps`` needed to cover an optimizer step is derived instead.
* ``max_tokens_per_microbatch`` (optional) packs micro-batches by a token budget rather than a
  row count; the loss normaliser is always that of the whole optimizer step, so the gradient
  does not depend on how rows are split.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtgrpo._config_types import check_option_types

__all__ = [
    "DataConfig",
    "GRPOConfig",
    "ModelConfig",
    "RunConfig",
    "apply_overrides",
    "config_fields_help",
    "load_run_config",
    "reference_markdown",
]

LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo")
TRACKERS = ("tensorboard", "wandb", "trackio")
LR_SCHEDULERS = ("constant", "linear", "cosine")
ON_LONG_PROMPT = ("truncate", "error")


def _help(text: str, **kwargs: Any) -> Any:
    """A dataclass field whose help text is written once, in its metadata."""
    return field(metadata={"help": text}, **kwargs)


@dataclass
class GRPOConfig:
    """Training options (TRL names where TRL has the option; see the module docstring)."""

    # ------------------------------------------------------------------ output and logging
    output_dir: str = _help("Run directory: metrics, checkpoints, report.", default="runs/mtgrpo")
    run_name: str | None = _help("Name shown by trackers (default: output_dir's name).",
                                 default=None)
    logging_steps: int = _help("Log metrics every N training steps.", default=1)
    report_to: str | list[str] = _help(
        "Trackers besides metrics.jsonl: any of tensorboard, wandb, trackio (or 'none').",
        default_factory=list)
    log_completions: bool = _help("Write sampled completions to completions.jsonl.",
                                  default=False)
    save_rollouts: bool = _help(
        "Write every group's rewards and advantages to rollouts.jsonl (the gradient-noise "
        "analysis reads it).", default=False)
    save_steps: int = _help("Checkpoint every N training steps (0: only at the end).", default=50)
    save_total_limit: int | None = _help("Keep only the newest N checkpoints (None: all).",
                                         default=2)
    resume_from_checkpoint: str | bool | None = _help(
        "Checkpoint directory to resume from, or true for the newest in output_dir.",
        default=None)
    eval_steps: int = _help("Evaluate on the eval set every N steps (0: never).", default=0)
    eval_on_start: bool = _help("Also evaluate before the first step (when eval_steps > 0).",
                                default=True)
    num_generations_eval: int = _help("Samples per eval prompt (accuracy is their mean).",
                                      default=1)
    eval_temperature: float = _help("Sampling temperature for eval (0: greedy).", default=1.0)
    profile: bool = _help("Write a torch profiler trace of one training step.", default=False)
    log_entropy: bool = _help("Compute and log the policy's token entropy (costs a little).",
                              default=True)

    model_init_kwargs: dict[str, Any] = _help(
        "Loading options when the model is given by name: dtype, attn_implementation, "
        "trust_remote_code, revision, gguf_file (TRL's field).", default_factory=dict)

    # ------------------------------------------------------------------ optimisation
    learning_rate: float = _help("AdamW learning rate.", default=1e-6)
    weight_decay: float = _help("AdamW weight decay (not applied to biases and norms).",
                                default=0.0)
    adam_beta1: float = _help("AdamW beta1.", default=0.9)
    adam_beta2: float = _help("AdamW beta2.", default=0.999)
    adam_epsilon: float = _help("AdamW epsilon.", default=1e-8)
    max_grad_norm: float = _help("Gradient clipping norm (0: no clipping).", default=1.0)
    lr_scheduler_type: str = _help("constant, linear or cosine (after warm-up).",
                                   default="linear")
    warmup_steps: int = _help("Linear warm-up optimizer steps.", default=0)
    warmup_ratio: float = _help("Warm-up as a fraction of all optimizer steps (if > 0).",
                                default=0.0)
    max_steps: int = _help("Training steps (one generation batch each).", default=100)
    seed: int = _help("Seed for data order, sampling and initialisation.", default=42)
    bf16: bool = _help("bfloat16 autocast for forward passes.", default=False)
    gradient_checkpointing: bool = _help(
        "Recompute activations in the backward pass (less memory, more time). TRL defaults to "
        "true; we default to false because the CPU quickstart is compute-bound.", default=False)

    # ------------------------------------------------------------------ batch sizes
    num_generations: int = _help("G: completions per prompt.", default=8)
    prompts_per_step: int | None = _help(
        "B: prompts per training step (default: derived from the TRL batch fields).",
        default=None)
    per_device_train_batch_size: int = _help(
        "Completions per micro-batch on one device (TRL's meaning).", default=8)
    gradient_accumulation_steps: int = _help("Micro-batches per optimizer step.", default=1)
    steps_per_generation: int = _help("Optimizer steps taken on one generation batch.",
                                      default=1)
    num_iterations: int = _help("μ: passes over each generation batch.", default=1)
    max_tokens_per_microbatch: int | None = _help(
        "Pack micro-batches by this padded-token budget instead of a row count.", default=None)
    max_padding_fraction: float = _help(
        "Length bucketing: rows are grouped longest first and a new micro-batch starts when "
        "more than this fraction of the next row would be padding. 1.0 turns it off. Ignored "
        "when the update runs padding-free (padding_free).",
        default=0.25)
    padding_free: bool = _help(
        "Policy forwards without padding where the model allows it (Llama, Mistral, Qwen2, "
        "Qwen3 with sdpa or eager attention, no sliding window, no gradient checkpointing): "
        "each distinct prompt and every completion token run once, rows apart only in "
        "attention. Same log-probs and gradients; false: padded, length-bucketed micro-batches.",
        default=True)

    # ------------------------------------------------------------------ generation
    max_prompt_length: int | None = _help("Prompts longer than this many tokens are "
                                          "handled by on_long_prompt (None: no limit).",
                                          default=512)
    on_long_prompt: str = _help("truncate (keep the end, warn once) or error.",
                                default="truncate")
    max_completion_length: int = _help("Maximum new tokens per completion.", default=256)
    temperature: float = _help("Sampling temperature (also applied to training log-probs).",
                               default=1.0)
    top_p: float = _help("Nucleus sampling threshold.", default=1.0)
    top_k: int = _help("Top-k sampling (0: off).", default=0)
    generation_backend: str = _help("auto, hf (transformers generate) or a registered backend.",
                                    default="auto")
    generation_batch_size: int | None = _help(
        "Most sequences per generate call (None: all of a round at once).", default=None)
    mask_truncated_completions: bool = _help(
        "Leave completions cut at max_completion_length out of the loss.", default=False)

    # ------------------------------------------------------------------ loss
    loss_type: str = _help("grpo (sequence mean), dapo (token mean), dr_grpo, bnpo.",
                           default="dapo")
    beta: float = _help("KL coefficient (0: no reference model is used).", default=0.0)
    epsilon: float = _help("Lower clipping range ε_low.", default=0.2)
    epsilon_high: float | None = _help("Upper clipping range ε_high (None: epsilon).",
                                       default=None)

    # ------------------------------------------------------------------ rewards
    reward_weights: list[float] | None = _help("One weight per reward channel (default 1).",
                                               default=None)
    multi_objective_aggregation: str = _help(
        "sum_then_normalize (an), normalize_then_sum (na), gdpo, single.",
        default="sum_then_normalize")
    reward_aggregation_method: str | None = _help(
        "Alias of multi_objective_aggregation (TRL tutorials' name).", default=None)
    scale_rewards: str | bool = _help("group, batch or none (TRL's true/false accepted).",
                               default="group")
    none_handling: str = _help(
        "How a reward function's None enters the advantage: neutral or zero.", default="neutral")
    on_unscorable: str = _help(
        "A completion no reward applies to: raise, or zero_advantage (TRL's behaviour).",
        default="raise")
    advantage_epsilon: float = _help("δ added to stds when normalising.", default=1e-4)
    accuracy_threshold: float = _help("A completion is correct when its accuracy reward >= this.",
                                      default=1.0)
    accuracy_reward: str | None = _help(
        "Reward channel that defines accuracy (default: the first channel that applies).",
        default=None)

    # ------------------------------------------------------------------ multi-task
    task_column: str = _help("Dataset column that names each prompt's task.", default="task")
    task_weighting: str = _help("uniform, fixed, mt_grpo, worst_case, regularized or sec.",
                                default="uniform")
    task_weighting_params: dict[str, Any] = _help(
        "Parameters of the task weighting, e.g. {lam: 0.25, optimizer: adam}.",
        default_factory=dict)
    improvement_reduction: str = _help(
        "MT-GRPO's I_k over a task's samples: mean (paper text) or sum (released code, use "
        "with improvement_clip).", default="mean")
    batch_construction: str = _help("iid, dynamic (DAPO) or ratio_preserving (MT-GRPO).",
                                    default="iid")
    batch_construction_params: dict[str, Any] = _help(
        "Parameters of the batch construction, e.g. {oversample_factor: 3}.",
        default_factory=dict)
    zero_gradient_filter: str = _help("strict, lenient or none (dynamic / ratio_preserving).",
                                      default="strict")

    def __post_init__(self) -> None:
        check_option_types(self)
        self._merge_aliases()
        self._check_ranges()
        self._check_choices()
        self._check_batch_shape()

    # ------------------------------------------------------------------ validation
    def _merge_aliases(self) -> None:
        from mtgrpo.advantages import resolve_aggregation, resolve_scale_rewards

        default = "sum_then_normalize"
        if self.reward_aggregation_method is not None and (
            self.multi_objective_aggregation == default
        ):  # the alias given alone: it overrides the field's default
            self.multi_objective_aggregation = self.reward_aggregation_method
        self.multi_objective_aggregation = resolve_aggregation(
            multi_objective_aggregation=self.multi_objective_aggregation,
            reward_aggregation_method=self.reward_aggregation_method,
        )
        self.reward_aggregation_method = None
        self.scale_rewards = resolve_scale_rewards(self.scale_rewards)
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to]
        self.report_to = [t for t in self.report_to if t != "none"]
        if self.report_to == ["all"]:
            self.report_to = list(TRACKERS)

    def _check_ranges(self) -> None:
        positive = ("num_generations", "max_steps", "per_device_train_batch_size",
                    "gradient_accumulation_steps", "steps_per_generation", "num_iterations",
                    "max_completion_length", "logging_steps", "num_generations_eval")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        for name in ("save_steps", "eval_steps", "warmup_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if self.num_generations < 2:
            raise ValueError(
                f"num_generations={self.num_generations}: GRPO compares completions of the same "
                "prompt, so it needs at least 2; use num_generations >= 2"
            )
        checks = {
            "learning_rate": self.learning_rate >= 0,
            "temperature": self.temperature >= 0,
            "top_p": 0 < self.top_p <= 1,
            "top_k": self.top_k >= 0,
            "beta": self.beta >= 0,
            "epsilon": self.epsilon >= 0,
            "epsilon_high": self.epsilon_high is None or self.epsilon_high >= 0,
            "max_grad_norm": self.max_grad_norm >= 0,
            "warmup_ratio": 0 <= self.warmup_ratio < 1,
            "advantage_epsilon": self.advantage_epsilon >= 0,
            "eval_temperature": self.eval_temperature >= 0,
            "max_padding_fraction": 0 < self.max_padding_fraction <= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is out of range")
        if self.temperature == 0:
            raise ValueError(
                "temperature=0 (greedy) gives identical completions, so every group has zero "
                "gradient; use a temperature > 0 for training (eval_temperature may be 0)"
            )

    def _check_choices(self) -> None:
        from mtgrpo.sampling import SAMPLERS, ZERO_GRADIENT_FILTERS
        from mtgrpo.weighting import IMPROVEMENT_REDUCTIONS, WEIGHTINGS

        choices = {
            "loss_type": (self.loss_type, LOSS_TYPES),
            "lr_scheduler_type": (self.lr_scheduler_type, LR_SCHEDULERS),
            "on_long_prompt": (self.on_long_prompt, ON_LONG_PROMPT),
            "none_handling": (self.none_handling, ("neutral", "zero")),
            "on_unscorable": (self.on_unscorable, ("raise", "zero_advantage")),
            "improvement_reduction": (self.improvement_reduction, IMPROVEMENT_REDUCTIONS),
        }
        for name, (value, valid) in choices.items():
            if value not in valid:
                raise ValueError(f"{name}={value!r} is not one of: {', '.join(valid)}")
        for tracker in self.report_to:
            if tracker not in TRACKERS:
                raise ValueError(
                    f"report_to contains {tracker!r}; valid trackers: {', '.join(TRACKERS)} "
                    "(metrics.jsonl is always written)"
                )
        self.task_weighting = WEIGHTINGS.canonical(self.task_weighting)
        self.batch_construction = SAMPLERS.canonical(self.batch_construction)
        self.zero_gradient_filter = ZERO_GRADIENT_FILTERS.canonical(self.zero_gradient_filter)

    def _check_batch_shape(self) -> None:
        if self.prompts_per_step is not None:
            if self.prompts_per_step < 1:
                raise ValueError(f"prompts_per_step={self.prompts_per_step} must be >= 1")
            return
        completions = (self.per_device_train_batch_size * self.gradient_accumulation_steps
                       * self.steps_per_generation)
        if completions % self.num_generations:
            raise ValueError(
                f"per_device_train_batch_size × gradient_accumulation_steps × "
                f"steps_per_generation = {completions} completions is not a multiple of "
                f"num_generations={self.num_generations}; change one of them, or set "
                "prompts_per_step explicitly"
            )

    # ------------------------------------------------------------------ derived values
    def resolved_prompts_per_step(self, world_size: int = 1) -> int:
        """``B``: prompts per training step on all processes together."""
        if self.prompts_per_step is not None:
            return self.prompts_per_step
        completions = (self.per_device_train_batch_size * self.gradient_accumulation_steps
                       * self.steps_per_generation * world_size)
        return completions // self.num_generations

    def completions_per_optimizer_step(self, world_size: int = 1) -> int:
        total = self.resolved_prompts_per_step(world_size) * self.num_generations
        if total % self.steps_per_generation:
            raise ValueError(
                f"{total} completions per step cannot be split into steps_per_generation="
                f"{self.steps_per_generation} equal optimizer steps; adjust prompts_per_step"
            )
        return total // self.steps_per_generation

    @property
    def epsilon_low(self) -> float:
        return self.epsilon

    @property
    def resolved_epsilon_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def total_optimizer_steps(self) -> int:
        return self.max_steps * self.steps_per_generation * self.num_iterations

    def resolved_warmup_steps(self) -> int:
        if self.warmup_ratio > 0:
            return math.ceil(self.warmup_ratio * self.total_optimizer_steps())
        return self.warmup_steps

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
class RunConfig:
    """Everything a run needs: what ``mtgrpo train CONFIG.yaml`` reads."""

    training: GRPOConfig = field(default_factory=GRPOConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tasks: dict[str, Any] | None = None      # a task-suite spec for mtgrpo.tasks
    rewards: Any = None                      # names / "module:function" / routing table
    peft: dict[str, Any] | None = None       # LoRA settings (peft.LoraConfig fields)
    sft: dict[str, Any] | None = None        # optional supervised warm start before GRPO

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.training.to_dict())
        out["model"] = dataclasses.asdict(self.model)
        out["data"] = dataclasses.asdict(self.data)
        for name in ("tasks", "rewards", "peft", "sft"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


_SECTIONS = {"model": ModelConfig, "data": DataConfig}
_FREE_SECTIONS = ("tasks", "rewards", "peft", "sft")


def _unknown(keys: Sequence[str], valid: Sequence[str], where: str) -> None:
    if keys:
        import difflib

        hints = []
        for key in keys:
            close = difflib.get_close_matches(key, valid, n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(f"unknown {where} option(s): {', '.join(hints)}")


def _coerce(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """Numbers written as strings (YAML reads ``1e-5`` as a string) become numbers when the
    field is numeric; anything unparseable is left for validation to report."""
    hints = typing.get_type_hints(cls)
    out = dict(values)
    for name, value in values.items():
        if not isinstance(value, str) or name not in hints:
            continue
        kinds = set(typing.get_args(hints[name])) or {hints[name]}
        for kind in (int, float):
            if kind in kinds:
                try:
                    out[name] = kind(value)
                    break
                except ValueError:
                    continue
    return out


def _build(cls: type, values: Mapping[str, Any], where: str) -> Any:
    names = [f.name for f in dataclasses.fields(cls)]
    _unknown([k for k in values if k not in names], names, where)
    return cls(**_coerce(cls, values))


def run_config_from_dict(raw: Mapping[str, Any]) -> RunConfig:
    """Build a :class:`RunConfig` from a mapping shaped like the YAML file."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"a run config must be a mapping of options, got {type(raw).__name__}")
    training_names = {f.name for f in dataclasses.fields(GRPOConfig)}
    sections = {}
    for name, cls in _SECTIONS.items():
        value = raw.get(name) or {}
        if isinstance(value, str) and name == "model":
            value = {"name_or_path": value}
        sections[name] = _build(cls, value, name)
    training = {k: v for k, v in raw.items() if k in training_names}
    extra = [k for k in raw if k not in training_names and k not in _SECTIONS
             and k not in _FREE_SECTIONS]
    _unknown(extra, sorted(training_names | set(_SECTIONS) | set(_FREE_SECTIONS)), "config")
    return RunConfig(
        training=GRPOConfig(**_coerce(GRPOConfig, training)),
        model=sections["model"],
        data=sections["data"],
        **{name: raw.get(name) for name in _FREE_SECTIONS},
    )


def _parse_scalar(text: str) -> Any:
    import yaml

    return yaml.safe_load(text)


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``--field value`` / ``--section.field value`` / ``--field=value`` overrides.

    Values are parsed as YAML scalars (``--beta 0.04``, ``--report_to '[tensorboard]'``).
    """
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
        key = key.replace("-", "_")
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


def load_run_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML run file (or start from defaults when ``path`` is None) and apply overrides."""
    import yaml

    raw: dict[str, Any] = {}
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"config file {str(file)!r} does not exist")
        loaded = yaml.safe_load(file.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{file}: a run config must be a mapping of options")
        raw = loaded
    if isinstance(raw.get("model"), str):
        raw["model"] = {"name_or_path": raw["model"]}
    return run_config_from_dict(apply_overrides(raw, overrides))


def config_fields_help(cls: type = GRPOConfig) -> list[tuple[str, str, str, str]]:
    """``(name, type, default, help)`` for every field: the source of the README's reference."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "required"
        type_name = str(hints[f.name]).replace("typing.", "")
        rows.append((f.name, type_name, default, f.metadata.get("help", "")))
    return rows


def reference_markdown() -> str:
    """The README's configuration reference: one table per section, from the field metadata."""
    sections = [("Training (top level of a run file; `GRPOConfig`)", GRPOConfig),
                ("`model:`", ModelConfig), ("`data:`", DataConfig)]
    lines: list[str] = []
    for title, cls in sections:
        lines += [f"#### {title}", "", "| option | default | meaning |", "|---|---|---|"]
        for name, _, default, text in config_fields_help(cls):
            lines.append(f"| `{name}` | `{default}` | {text} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
