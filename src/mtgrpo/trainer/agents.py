"""TRL's ``tools=``, ``environment_factory=`` and ``rollout_func=`` for the trainer: the data,
rewards and rollouts of a run whose policy calls tools, or whose rollouts the user writes.

* Each environment is a task: with ``{name: factory}`` and a dataset without a task column,
  a row's task is its ``environment``, so task weighting adapts to each environment.
* An environment that owns its data (no ``train_dataset``) gets placeholder rows of empty chat
  prompts, one generation round's worth, cycled for ``max_steps`` steps (TRL's rule);
  ``reset()`` writes each prompt.
* An environment's ``get_reward()`` is a reward channel named after its class, weight 1, after
  the user's reward functions (TRL's rule).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mtgrpo.config import TrainConfig
from mtgrpo.rollout import GenerationBackend
from mtgrpo.rollout.agent import AgentRollouts, Environments, ToolLoop, check_rollout_output
from mtgrpo.rollout.agent.runner import EMPTY_PROMPT, ENVIRONMENT_COLUMN
from mtgrpo.tasks import is_conversational, is_lazy_split
from mtgrpo.trainer.setup import TrainingData

__all__ = ["AgentSetup", "WeightSync", "agent_setup", "generate_with_rollout_func",
           "placeholder_rows", "stop_token_ids"]


@dataclass
class AgentSetup:
    """The tools of a run: standalone ``tools`` and ``environments`` (or None)."""

    tools: list[Callable[..., Any]]
    environments: Environments | None

    @property
    def all_tools(self) -> list[Callable[..., Any]]:
        """Every tool a rollout may be offered (TRL's ``trainer.tools``)."""
        if self.environments is None:
            return list(self.tools)
        return self.environments.all_tools()

    def reward_functions(self) -> list[Callable[..., list[float | None]]]:
        """The ``get_reward`` channels of the environments (one per class)."""
        if self.environments is None:
            return []
        return [self.environments.reward_function(c) for c in self.environments.reward_classes]

    def with_rewards(self, reward_funcs: Any, reward_weights: Sequence[float] | None,
                     processing_classes: Any) -> tuple[Any, list[float] | None, Any]:
        """The user's reward functions, their weights and tokenizers, with the environments'
        channels appended (weight 1, no tokenizer)."""
        extra = self.reward_functions()
        if not extra:
            return reward_funcs, None if reward_weights is None else list(reward_weights), \
                processing_classes
        if reward_funcs is None:
            return extra, None, None
        if isinstance(reward_funcs, Mapping):
            if reward_weights is not None:
                raise ValueError(
                    "reward_weights with a routing table and environments that own their "
                    "reward: give the weights in the table (RewardFunction(fn, weights=...))")
            # under "*", the routing table's every-task key: an environment's reward applies
            # to whichever task its rollouts belong to
            table = dict(reward_funcs)
            shared = table.get("*", [])
            table["*"] = [*(shared if isinstance(shared, list | tuple) else [shared]), *extra]
            return table, None, processing_classes
        functions = list(reward_funcs) if isinstance(reward_funcs, list | tuple) \
            else [reward_funcs]
        weights = None if reward_weights is None else [*reward_weights, *[1.0] * len(extra)]
        if isinstance(processing_classes, list | tuple):
            processing_classes = [*processing_classes, *[None] * len(extra)]
        elif processing_classes is not None:
            processing_classes = [processing_classes, *[None] * len(extra)]
        return [*functions, *extra], weights, processing_classes

    def training_data(self, data: TrainingData) -> TrainingData:
        """Rows without a prompt get an empty chat prompt (the environment writes it); with
        several environments and no task column, each environment is a task."""
        if self.environments is None or is_lazy_split(data.train):
            return data
        by_environment = self.environments.multiple and data.single_task

        def fill(rows: Any) -> Any:
            if is_lazy_split(rows):
                return rows
            filled = []
            for row in rows:
                row = dict(row)
                row.setdefault("prompt", [dict(m) for m in EMPTY_PROMPT])
                if by_environment and row.get(ENVIRONMENT_COLUMN) is not None:
                    row["task"] = str(row[ENVIRONMENT_COLUMN])
                filled.append(row)
            return filled

        evals = {name: fill(rows) for name, rows in data.evals.items()}
        return TrainingData(fill(data.train), evals, data.single_task and not by_environment,
                            data.iterable)

    def rollouts(self, backend: GenerationBackend, tokenizer: Any, args: TrainConfig,
                 max_context: int | None, task_column_added: bool) -> AgentRollouts:
        """The rollouts of the run (``task_column_added``: the ``task`` key is the trainer's,
        not the user's, so ``reset`` does not receive it)."""
        loop = ToolLoop(backend, tokenizer,
                        max_completion_length=args.rollout.max_completion_length,
                        max_iterations=args.rollout.max_tool_calling_iterations,
                        timeout=args.rollout.tool_call_timeout,
                        malformed=args.rollout.malformed_tool_calls,
                        max_context=max_context,
                        chat_template_kwargs=args.rollout.chat_template_kwargs)
        return AgentRollouts(loop, self.tools, self.environments,
                             hidden_columns=("task",) if task_column_added else ())


def agent_setup(tools: Sequence[Callable[..., Any]] | None,
                environment_factory: Any) -> AgentSetup | None:
    """The run's tools, or None when it has neither tools nor environments."""
    if not tools and environment_factory is None:
        return None
    tools = list(tools or [])
    environments = None if environment_factory is None else Environments(environment_factory,
                                                                         tools)
    return AgentSetup(tools, environments)


def placeholder_rows(setup: AgentSetup | None, args: TrainConfig) -> list[dict[str, Any]]:
    """Rows for a run whose environment owns the data (no ``train_dataset``)."""
    if setup is None or setup.environments is None:
        raise ValueError("`train_dataset` is required: a Dataset, a list of dicts or a path "
                         "(or an environment_factory whose environment writes the prompts)")
    if setup.environments.multiple:
        raise ValueError(
            "A `dict` `environment_factory` (multiple environments) requires a `train_dataset` "
            "with an `environment` column to route each example to its environment. Provide a "
            "dataset, or pass a single environment factory.")
    if args.schedule.max_steps <= 0:
        raise ValueError(
            "When training without a `train_dataset` (the environment owns the data and returns "
            "the prompt from `reset()`), `max_steps` must be set to a positive value to define "
            "the training length. Set it via `GRPOConfig(max_steps=...)`.")
    # TRL's count: one generation round's worth of prompts (generation_batch_size //
    # num_generations), so that an epoch is one training step. On one process (the world is
    # not known yet); more processes only make a round larger, which still makes one epoch
    # one step, as prompts_per_step below per_device_train_batch_size // num_generations does.
    groups = args.resolved_prompts_per_step(1)
    return [{"prompt": [dict(m) for m in EMPTY_PROMPT]} for _ in range(groups)]


class WeightSync:
    """TRL's ``trainer.vllm_generation.sync_weights()``: hand the policy's current weights to
    the generation engine (mtgrpo also does it after every optimizer step)."""

    def __init__(self, push: Callable[[], None]) -> None:
        self._push = push

    def sync_weights(self) -> None:
        self._push()


def generate_with_rollout_func(trainer: Any, prompts: list[Any]) -> tuple[Any, ...]:
    """TRL's ``GRPOTrainer._generate`` on its ``rollout_func`` path: the engine's weights
    brought up to the trainer's step (``use_vllm``), then ``rollout_func(prompts, trainer)``,
    checked, and its completions decoded. Returns TRL's tuple ``(prompt_ids, completion_ids,
    tool_mask, completions, logprobs, extra_fields, images, tool_images)``; ``tool_mask`` is
    the function's ``env_mask``."""
    # as TRL's _generate: the engine loads new weights once per optimizer step, not per call
    if trainer.use_vllm and trainer.state.global_step != trainer._last_loaded_step:
        trainer.vllm_generation.sync_weights()
        trainer._last_loaded_step = trainer.state.global_step
    result = check_rollout_output(trainer.rollout_func(prompts, trainer))
    # decoded without special tokens, as TRL hands completions to the reward functions
    texts = trainer.processing_class.batch_decode(result.completion_ids,
                                                  skip_special_tokens=True)
    completions = [[{"role": "assistant", "content": text}] if is_conversational(prompt)
                   else text for prompt, text in zip(prompts, texts, strict=True)]
    return (result.prompt_ids, result.completion_ids, result.env_mask, completions,
            result.logprobs, result.extra_fields, None, [])


def stop_token_ids(backend: Any, tokenizer: Any) -> list[int]:
    """The ids that end a completion: the backend's EOS ids, the tokenizer's EOS and pad."""
    ids = [*getattr(backend, "eos_token_ids", ()), tokenizer.eos_token_id, tokenizer.pad_token_id]
    return [int(i) for i in dict.fromkeys(ids) if i is not None]
