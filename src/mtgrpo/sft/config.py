"""``SFTConfig``: the options of a supervised warm start, with TRL's ``SFTConfig`` names.

Defaults follow TRL 1.16's ``SFTConfig`` where TRL has the option (``learning_rate=2e-5``,
``num_train_epochs=3``, ``per_device_train_batch_size=8``, ``max_length=1024``,
``logging_steps=10``, ``lr_scheduler_type="linear"``, ``completion_only_loss=True`` for
prompt-completion data), except ``bf16`` (None: auto, bfloat16 where the hardware has it;
TRL: true unless fp16) and ``max_steps`` (``None`` rather than TRL's ``-1``: "train for
``num_train_epochs``"). Every field carries its help text
once, in ``metadata["help"]``; ``mtgrpo sft`` derives its flags from it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mtgrpo._config_types import (
    build_section,
    check_option_types,
    coerce_numbers,
    option,
    refuse_unknown,
)
from mtgrpo.algo.registry import SCHEDULERS

__all__ = ["ON_LONG_EXAMPLE", "SFTConfig", "WarmStartConfig"]

# What to do with an example longer than max_length (prompt + completion + EOS).
ON_LONG_EXAMPLE = ("truncate", "drop", "error")


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass
class SFTConfig:
    """Options of :func:`mtgrpo.sft.sft_train` (see the module docstring for the defaults)."""

    output_dir: str = field(
        default="runs/sft",
        metadata={"help": "Run directory: metrics.jsonl, model/ (and adapter/ when merged)."})
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Replace an earlier SFT run in output_dir instead of refusing."})
    # TRL 1.16 SFTConfig's defaults from here on where TRL has the field (module docstring)
    learning_rate: float = field(default=2e-5, metadata={"help": "AdamW learning rate."})
    num_train_epochs: float = field(
        default=3.0, metadata={"help": "Passes over the training examples (may be fractional)."})
    max_steps: int | None = field(
        default=None,
        metadata={"help": "Optimizer steps; overrides num_train_epochs when given."})
    per_device_train_batch_size: int = field(
        default=8, metadata={"help": "Examples per micro-batch (one forward and backward)."})
    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Micro-batches per optimizer step."})
    max_tokens_per_microbatch: int | None = field(
        default=None,
        metadata={"help": "Pack each optimizer step's examples into micro-batches by this "
                          "padded-token budget (length-sorted) instead of by row count."})
    max_prompt_length: int | None = field(
        default=None,
        metadata={"help": "Prompts longer than this keep their last tokens, as GRPO's "
                          "max_prompt_length does (set it to the GRPO run's); None: no limit."})
    max_length: int | None = field(
        default=1024,  # TRL 1.16 SFTConfig's max_length
        metadata={"help": "Longest example in tokens (prompt + completion + EOS); None: no "
                          "limit."})
    on_long_example: str = field(
        default="truncate",  # TRL's truncation_mode="keep_start"
        metadata={"help": "An example over max_length: truncate (keep its first max_length "
                          "tokens, TRL's keep_start), drop, or error."})
    lr_scheduler_type: str = field(
        default="linear", metadata={"help": "constant, linear or cosine (after warm-up)."})
    warmup_ratio: float = field(
        default=0.0, metadata={"help": "Linear warm-up as a fraction of the optimizer steps."})
    weight_decay: float = field(
        default=0.0, metadata={"help": "AdamW weight decay (not applied to biases and norms)."})
    max_grad_norm: float = field(
        # transformers' TrainingArguments default; 0 turns clipping off there too.
        default=1.0, metadata={"help": "Gradient clipping norm (0: no clipping)."})
    seed: int = field(
        # transformers' TrainingArguments default.
        default=42, metadata={"help": "Seed of the data order, the eval split and LoRA init."})
    logging_steps: int = field(
        # TRL 1.16 SFTConfig's logging_steps
        default=10, metadata={"help": "Write a metrics.jsonl record every N optimizer steps."})
    bf16: bool | None = field(
        default=None, metadata={"help": "bfloat16 autocast for the forward passes; None (auto): "
                                        "where the hardware multiplies bfloat16 natively (a GPU "
                                        "that supports it, a CPU with amx_bf16, avx512_bf16 or "
                                        "Arm bf16 for a model at least 256 wide); false: "
                                        "float32."})
    completion_only_loss: bool = field(
        default=True,
        metadata={"help": "Loss on completion tokens (+EOS) only; false: on the prompt too."})
    eval_fraction: float = field(
        default=0.0,
        metadata={"help": "Fraction of the examples held out to measure the eval loss (0: none)."})
    eval_steps: int = field(
        default=0,
        metadata={"help": "Eval-loss every N optimizer steps (0: at the end only)."})
    merge_lora: bool = field(
        default=False,
        metadata={"help": "With LoRA: save the base model with the adapter merged into model/ "
                          "(what GRPO loads) and the adapter into adapter/."})

    def __post_init__(self) -> None:
        self._check_integers()
        self._check_ranges()
        self.lr_scheduler_type = SCHEDULERS.canonical(self.lr_scheduler_type)
        if self.on_long_example not in ON_LONG_EXAMPLE:
            raise ValueError(
                f"on_long_example={self.on_long_example!r} is not one of: "
                f"{', '.join(ON_LONG_EXAMPLE)}"
            )
        if not isinstance(self.output_dir, str) or not self.output_dir.strip():
            raise ValueError(f"output_dir must be a non-empty path, got {self.output_dir!r}")

    def _check_integers(self) -> None:
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps",
                     "logging_steps"):
            value = getattr(self, name)
            if not _positive_int(value):
                raise ValueError(f"{name}={value!r} must be a positive integer")
        for name in ("max_steps", "max_prompt_length", "max_length", "max_tokens_per_microbatch"):
            value = getattr(self, name)
            if value is not None and not _positive_int(value):
                raise ValueError(
                    f"{name}={value!r} must be a positive integer or None (no limit)"
                )
        if isinstance(self.eval_steps, bool) or not isinstance(self.eval_steps, int) \
                or self.eval_steps < 0:
            raise ValueError(f"eval_steps={self.eval_steps!r} must be an integer >= 0")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r} must be an integer")

    def _check_ranges(self) -> None:
        checks = {
            "learning_rate": (self.learning_rate > 0, "> 0"),
            "num_train_epochs": (self.num_train_epochs > 0, "> 0 (or set max_steps)"),
            "warmup_ratio": (0 <= self.warmup_ratio <= 1, "in [0, 1]"),
            "weight_decay": (self.weight_decay >= 0, ">= 0"),
            "max_grad_norm": (self.max_grad_norm >= 0, ">= 0 (0: no clipping)"),
            "eval_fraction": (0 <= self.eval_fraction < 1, "in [0, 1)"),
        }
        for name, (ok, rule) in checks.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not math.isfinite(value) or not ok:
                raise ValueError(f"{name}={value!r} must be a finite number {rule}")

    @property
    def examples_per_step(self) -> int:
        """Training examples per optimizer step (batch size x accumulation)."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    def total_steps(self, num_train_examples: int) -> int:
        """Optimizer steps of the run: ``max_steps``, else ``ceil(epochs x steps per epoch)``.

        An epoch is ``ceil(num_train_examples / examples_per_step)`` steps (its last step
        takes the remainder, as the HF ``Trainer``'s data loader does without ``drop_last``).
        """
        if self.max_steps is not None:
            return self.max_steps
        steps_per_epoch = math.ceil(num_train_examples / self.examples_per_step)
        # At least one step, however small the fraction of an epoch.
        return max(1, math.ceil(self.num_train_epochs * steps_per_epoch))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> SFTConfig:
        """Build from a mapping (e.g. a run file's ``sft`` section); unknown keys are refused
        with the closest valid name, and numbers written as strings (YAML's ``1e-5``) are read
        as numbers."""
        if not isinstance(values, Mapping):
            raise ValueError(
                f"an SFT config must be a mapping of options, got {type(values).__name__}"
            )
        return build_section(cls, values, "sft")


# Options of the warm start that are not SFTConfig's: where its examples come from.
_WARM_START_OWN = ("num_examples", "template", "reasoning", "lora", "seed_offset", "reuse")
# SFTConfig fields the run sets itself: it trains the warm start in a shared cache directory
# that <output_dir>/sft links to.
_SET_BY_THE_RUN = ("output_dir", "overwrite_output_dir")


@dataclass
class WarmStartConfig:
    """The ``sft:`` section of a run file: a supervised warm start on the task suite's gold
    answers before GRPO (see ``mtgrpo sft``).

    Its own options say which examples it trains on; every other key is an option of
    :class:`SFTConfig` (``learning_rate``, ``max_steps``, ...), checked when the configuration
    is built. Its seed defaults to the run's. The result is trained once per content (the base
    model's files, the settings that choose its problems, its own settings) into
    ``<task cache root>/warm-start/<key>/``, which ``<output_dir>/sft`` links to, and reused by
    every later run with the same content, whatever its ``output_dir``; ``reuse: false`` trains
    a new one (see :mod:`mtgrpo.trainer.warm_start`).
    """

    num_examples: int = option("Solved problems per task.", default=256)
    template: str = option("How a gold answer becomes a completion: think_answer, answer_only "
                           "or a format string with {answer} (and {reasoning}, {gold}).",
                           default="think_answer")
    reasoning: str = option("The reasoning the think_answer template writes (see mtgrpo sft).",
                            default="restate")
    lora: dict[str, Any] | None = option(
        "Train a LoRA adapter (peft options, as the peft section) and merge it (None: full "
        "fine-tuning).", default=None)
    seed_offset: int = option(
        "The warm start's problems are drawn with the task seed plus this, leaving out every "
        "problem of GRPO's training and evaluation splits.", default=1_000_003)
    reuse: bool = option(
        "Reuse a finished warm start with the same content (base model files, problem and "
        "training settings) from the shared cache; false: train a new one and replace it.",
        default=True)
    training: dict[str, Any] = option(
        "SFTConfig options (written at the section's top level in a run file): "
        "learning_rate, max_steps, per_device_train_batch_size, ...", default_factory=dict)

    def __post_init__(self) -> None:
        check_option_types(self, "sft")
        from mtgrpo.models import LoraSettings
        from mtgrpo.sft.solutions import REASONINGS, solution_template

        if isinstance(self.num_examples, bool) or self.num_examples < 1:
            raise ValueError(f"sft.num_examples={self.num_examples!r} must be a positive "
                             "integer (solved problems per task)")
        solution_template(self.template)
        REASONINGS.canonical(self.reasoning)
        if self.lora is not None:
            LoraSettings.from_dict(self.lora)
        fixed = [k for k in self.training if k in _SET_BY_THE_RUN]
        if fixed:
            raise ValueError(f"sft.{fixed[0]} is set by the run (the warm start is written to "
                             "a shared cache directory that <output_dir>/sft links to); "
                             "remove it")
        self.sft_config("<output_dir>/sft", seed=0)  # the SFT options' own checks

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> WarmStartConfig:
        """From a run file's flat ``sft:`` section."""
        if not isinstance(values, Mapping):
            raise ValueError(f"the sft section must be a mapping of options, got "
                             f"{type(values).__name__} {values!r:.80}")
        sft_fields = [f.name for f in dataclasses.fields(SFTConfig)]
        valid = [*_WARM_START_OWN, *sft_fields]
        refuse_unknown([k for k in values if k not in valid], valid, "sft")
        own = coerce_numbers(cls, {k: v for k, v in values.items() if k in _WARM_START_OWN})
        return cls(**own, training={k: v for k, v in values.items() if k in sft_fields})

    def sft_config(self, output_dir: str, seed: int) -> SFTConfig:
        """The :class:`SFTConfig` of the warm start (``seed``: the run's, unless the section
        sets one); merging the LoRA adapter when ``lora`` is set."""
        # GRPO loads model/: the adapter merged into it.
        merge = {"merge_lora": True} if self.lora is not None else {}
        # The run owns this cache directory: a retrained warm start replaces it.
        return SFTConfig.from_dict({"output_dir": output_dir, "overwrite_output_dir": True,
                                    "seed": seed, **self.training, **merge})

    def to_dict(self) -> dict[str, Any]:
        """The flat mapping a run file holds."""
        own = {name: getattr(self, name) for name in _WARM_START_OWN}
        return {**own, **self.training}
