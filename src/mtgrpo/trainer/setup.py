"""Turning what a user passes into the objects the loop needs (cheap checks first)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtgrpo.config import RewardsConfig, TrainConfig, check_model_init_kwargs
from mtgrpo.fast import enable_activation_checkpointing
from mtgrpo.rewards import RewardSuite
from mtgrpo.rewards.registry import resolve_reward, resolve_rewards
from mtgrpo.tasks.prompt_set import is_lazy_split

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_TASK",
    "TrainingData",
    "build_backend",
    "build_reward_suite",
    "load_policy",
    "reward_processing_list",
    "training_rows",
    "validation_rows",
]


DEFAULT_TASK = "default"
"""The task of every row of a dataset without a task column (TRL-style single-task data)."""


@dataclass
class TrainingData:
    """What the trainer trains and evaluates on.

    ``train``: rows (dicts with a ``task`` key) or a task suite's lazy split. ``evals``: eval
    rows by set name (``None``: the one unnamed set; empty: no evaluation). ``single_task``:
    the training data had no task column, so every row is task ``default``. ``iterable``: a
    streaming dataset was given (read into memory; it has no length before that).
    """

    train: Any
    evals: dict[str | None, Any]
    single_task: bool
    iterable: bool


def _is_iterable_dataset(source: Any) -> bool:
    try:
        from datasets import IterableDataset
    except ImportError:  # pragma: no cover - datasets is a core dependency
        return False
    return isinstance(source, IterableDataset)


def _is_dataset_object(value: Any) -> bool:
    """A dataset (``datasets``), a task suite's split, or a list of row dicts."""
    if isinstance(value, list):
        return bool(value) and all(isinstance(row, Mapping) for row in value)
    return type(value).__module__.startswith("datasets.") or is_lazy_split(value)


def _eval_sets(evaluation: Any) -> dict[str | None, Any]:
    """TRL's eval_dataset forms: one dataset, or named ones (a dict of datasets or of row
    lists, a ``DatasetDict``): ``{name: source}``, ``None`` naming the single unnamed set."""
    if evaluation is None:
        return {}
    if isinstance(evaluation, Mapping) and evaluation and all(
            _is_dataset_object(v) for v in evaluation.values()):
        return {str(name): source for name, source in evaluation.items()}
    return {None: evaluation}


def training_rows(train: Any, evaluation: Any, task_column: str) -> TrainingData:
    """Train and eval rows as lists of dicts with a ``task`` key; test data refused for training.

    A dataset without the task column (no row has it, and ``task_column`` is the default
    ``task``) is single-task data: every row gets task ``default``, so TRL datasets train
    unchanged with the per-task machinery intact."""
    from mtgrpo.tasks import ensure_trainable, load_rows

    # only the default column may be missing (TRL data); a task_column the user named must exist
    default = DEFAULT_TASK if task_column == "task" else None

    def rows_of(source: Any) -> Any:
        if is_lazy_split(source):
            return source
        return load_rows(source, task_column=task_column, default_task=default)

    train_rows = rows_of(train)
    if is_lazy_split(train_rows):
        if getattr(train_rows, "name", None) == "test":
            raise ValueError("a test split cannot be used for training; pass it as eval data")
        single = False
    else:
        ensure_trainable(train_rows)
        single = all(row["task"] == DEFAULT_TASK for row in train_rows)
    evals = {name: rows_of(source) for name, source in _eval_sets(evaluation).items()}
    return TrainingData(train_rows, evals, single, _is_iterable_dataset(train))


def validation_rows(source: Any, task_column: str, task_names: Sequence[str]) -> Any:
    """The rows the task weights read with ``task_weighting_signal: validation``: a task
    suite's validation split (``suite.validation``) or anything ``train_dataset`` may be,
    holding every training task and no other. Checked before any model loads."""
    from mtgrpo.tasks import load_rows

    if source is None:
        raise ValueError(
            "task_weighting_signal='validation' weights the tasks by their accuracy on a "
            "held-out validation split, but this run has none. Fix: set tasks.validation_size "
            "in the run file (e.g. 50 problems per task), or pass "
            "GRPOTrainer(..., validation_dataset=rows) (e.g. a task suite's suite.validation), "
            "or use task_weighting_signal='train'")
    rows = source if is_lazy_split(source) else load_rows(
        source, task_column=task_column,
        default_task=DEFAULT_TASK if task_column == "task" else None)
    found = set(rows.task_ids) if is_lazy_split(rows) else {str(row["task"]) for row in rows}
    missing, unknown = sorted(set(task_names) - found), sorted(found - set(task_names))
    if missing or unknown:
        raise ValueError(
            f"the validation split must hold the training tasks {list(task_names)} and no "
            f"other; it lacks {missing} and has {unknown} besides. A task without validation "
            "problems would keep its weight unread; give every training task some")
    return rows


def reward_processing_list(
    reward_funcs: Any, processing_classes: Any, trust_remote_code: bool = False
) -> tuple[Any, list[Any]]:
    """TRL's ``reward_processing_classes``: one tokenizer per reward function (used by reward
    models, ignored by functions). Returns the reward functions with the reward models
    resolved (loaded with their tokenizer) and the tokenizer of each (``None`` for a
    function)."""
    if isinstance(reward_funcs, RewardsConfig):
        reward_funcs = reward_funcs.to_value()
    if isinstance(reward_funcs, Mapping):
        if processing_classes is not None:
            raise ValueError(
                "reward_processing_classes applies to a list of reward functions; in a routing "
                "table give a reward model its tokenizer with RewardModel(model, tokenizer)"
            )
        return resolve_rewards(reward_funcs, trust_remote_code=trust_remote_code), []
    functions = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    if processing_classes is None:
        classes: Sequence[Any] = [None] * len(functions)
    elif isinstance(processing_classes, list | tuple):
        classes = list(processing_classes)
    else:
        classes = [processing_classes]
    if len(classes) != len(functions):
        raise ValueError(
            f"The number of reward processing classes ({len(classes)}) must match the number "
            f"of reward functions ({len(functions)}); give one per function (None for a "
            "function that is not a reward model)"
        )
    resolved = [resolve_reward(f, tokenizer=c, trust_remote_code=trust_remote_code)
                for f, c in zip(functions, classes, strict=True)]
    tokenizers = [getattr(r, "tokenizer", None) if _is_reward_model(r) else c
                  for r, c in zip(resolved, classes, strict=True)]
    if isinstance(reward_funcs, list | tuple):
        return resolved, tokenizers
    return resolved[0], tokenizers


def _is_reward_model(obj: Any) -> bool:
    from mtgrpo.rewards.models import RewardModel

    return isinstance(obj, RewardModel)


def build_reward_suite(reward_funcs: Any, args: TrainConfig,
                       on_unscorable: str | None = None) -> RewardSuite:
    """The reward suite from functions, names, import paths, reward models or a routing table.

    ``on_unscorable`` overrides ``args.advantage.on_unscorable`` (the trainer resolves ``auto``)."""
    if isinstance(reward_funcs, RewardSuite):
        return reward_funcs
    if isinstance(reward_funcs, RewardsConfig):
        reward_funcs = reward_funcs.to_value()
    if reward_funcs is None or (isinstance(reward_funcs, list | tuple | Mapping)
                                and not reward_funcs):
        raise ValueError(
            "reward_funcs is empty; give at least one reward function, a routing table "
            "{task: [functions]}, or a reward model"
        )
    policy = on_unscorable or args.advantage.on_unscorable
    return RewardSuite.from_user(
        resolve_rewards(reward_funcs, trust_remote_code=args.compute.trust_remote_code),
        reward_weights=args.advantage.reward_weights,
        on_unscorable="raise" if policy == "auto" else policy,
        timeout=args.advantage.reward_timeout,
    )


def _model_spec(model: Any, init: Mapping[str, Any]) -> Any:
    gguf_file = init.get("gguf_file")
    if gguf_file is not None and isinstance(model, str | Path):
        return {"path": str(model), "gguf_file": gguf_file}
    return model


def load_policy(model: Any, processing_class: Any, peft_config: Any, args: TrainConfig):
    """``(model, tokenizer, is_peft)``: the policy ready for training (LoRA applied if asked)."""
    from mtgrpo.models import apply_lora, load_model, load_tokenizer

    init = dict(args.compute.model_init_kwargs)
    check_model_init_kwargs(init)  # again: the run file's model section is merged in after
    spec = _model_spec(model, init)
    remote = bool(init.get("trust_remote_code", args.compute.trust_remote_code))
    loaded = load_model(
        spec, dtype=init.get("dtype", init.get("torch_dtype")), for_training=True,
        trust_remote_code=remote, revision=init.get("revision"),
        attn_implementation=init.get("attn_implementation"),
    )
    tokenizer = load_tokenizer(processing_class if processing_class is not None else (
        loaded if not isinstance(spec, str | Path | Mapping) else spec
    ), trust_remote_code=remote)
    is_peft = _is_peft(loaded)
    if args.compute.cast_lm_head_to_fp32:
        cast_lm_head_to_fp32(loaded)
    if peft_config is not None:
        loaded = apply_lora(loaded, peft_config)
        is_peft = True
    # after the adapters are added, so LoRA's own dropout is off too (TRL 1.16 disables dropout
    # after get_peft_model), and before the trainer copies the reference model, which inherits it
    if args.compute.disable_dropout:
        disable_dropout(loaded)
    if args.compute.gradient_checkpointing:
        enable_activation_checkpointing(
            # by default non-reentrant, as PyTorch recommends and TRL sets
            loaded, args.compute.gradient_checkpointing_kwargs or {"use_reentrant": False})
        # as TRL's GRPOTrainer: PEFT under checkpointing needs input gradients (transformers#42489)
        if is_peft:
            loaded.enable_input_require_grads()
    return loaded, tokenizer, is_peft


def disable_dropout(model: Any) -> None:
    """Set every ``nn.Dropout``'s probability to 0 (TRL's ``disable_dropout``)."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def cast_lm_head_to_fp32(model: Any) -> None:
    """Keep the output head in float32 and feed it float32 hidden states (TRL's option).

    A head tied to the input embeddings is untied first (the embeddings keep the model's
    dtype); the head's output is float32, as TRL's.
    """
    import torch

    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"cast_lm_head_to_fp32: {type(model).__name__} has no output head")
    if head.weight is model.get_input_embeddings().weight:
        # untied first: only the head goes to float32, the input embedding keeps its dtype
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
        if hasattr(model.config, "tie_word_embeddings"):
            model.config.tie_word_embeddings = False
    head.float()
    # the float32 head receives hidden states in the model's dtype: cast them on the way in
    head.register_forward_pre_hook(
        lambda module, inputs: tuple(x.float() if torch.is_tensor(x) else x for x in inputs))


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a core dependency
        return False
    return isinstance(model, PeftModel)


def build_backend(backend: Any, model: Any, tokenizer: Any, args: TrainConfig,
                  generation_dtype: Any = None) -> Any:
    """The generation backend (:func:`mtgrpo.rollout.build_backend`) with ``args``' options:
    ``backend`` as given, else ``args.rollout.generation_backend``. ``generation_dtype``: the static
    backend generates in this dtype (from a copy of the weights) when it differs from the
    model's; other backends ignore it."""
    from mtgrpo.rollout import build_backend as select

    if args.vllm.use_vllm and backend is None:
        from mtgrpo.rollout.vllm import backend_from_config

        return backend_from_config(args, model, tokenizer)
    return select(
        args.rollout.generation_backend if backend is None else backend, model, tokenizer,
        max_batch_size=args.rollout.generation_batch_size,
        generation_options=generation_options(args),
        requires_generate=needs_generate(args), generation_dtype=generation_dtype,
    )


def generation_options(args: TrainConfig) -> dict[str, Any]:
    """TRL's generation options beyond temperature, top-p and top-k, for transformers
    ``generate``: ``min_p``, ``repetition_penalty``, ``cache_implementation``, then
    ``generation_kwargs`` (which override them, as in TRL)."""
    options: dict[str, Any] = {}
    if args.rollout.min_p is not None:
        options["min_p"] = args.rollout.min_p
    # 1.0 is no penalty in transformers: only another value is passed (and needs generate)
    if args.rollout.repetition_penalty != 1.0:
        options["repetition_penalty"] = args.rollout.repetition_penalty
    if args.rollout.cache_implementation is not None:
        options["cache_implementation"] = args.rollout.cache_implementation
    options.update(args.rollout.generation_kwargs or {})
    return options


def needs_generate(args: TrainConfig) -> str | None:
    """Why generation must use transformers ``generate`` (options only it implements)."""
    options = [name for name, on in (
        ("min_p", args.rollout.min_p is not None),
        ("repetition_penalty", args.rollout.repetition_penalty != 1.0),
        ("generation_kwargs", bool(args.rollout.generation_kwargs)),
        ("cache_implementation", args.rollout.cache_implementation is not None)) if on]
    return ", ".join(options) or None
