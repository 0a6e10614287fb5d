"""TRL 1.16 / transformers ``TrainingArguments`` fields that mtgrpo accepts but does not act on.

TRL's ``GRPOConfig`` extends transformers' ``TrainingArguments`` (191 fields in TRL 1.16 with
transformers 5). A config written for TRL must construct unchanged, so every one of those
fields exists on :class:`~mtgrpo.compat.GRPOConfig`. The fields mtgrpo implements are the
native :class:`~mtgrpo.config.TrainConfig`'s, declared there with their help text. The rest
are declared here, in three kinds:

* **no effect** (:func:`_inert`): the option steers a part of the HF ``Trainer`` that mtgrpo
  does not have (its ``DataLoader``, its prediction loop). Any value is accepted; a value
  other than the default is named once in a warning, so it is never silently believed to act.
* **refused** (:func:`_refused`): the option asks for something mtgrpo cannot do
  (``use_liger_kernel=True``, DeepSpeed given as a training argument). The default is
  accepted; anything else is a ``ValueError`` that names what to use instead.
* **alias** (:func:`_alias`): another name TRL users know for a native option; it sets that
  option.

:class:`TRLCompatibleFields` is the base class of :class:`~mtgrpo.compat.GRPOConfig`;
:func:`check_compatibility_fields` is called from its ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("mtgrpo.config")

__all__ = ["OLDER_TRANSFORMERS_FIELDS", "TRLCompatibleFields", "check_compatibility_fields",
           "compatibility_rows"]

OLDER_TRANSFORMERS_FIELDS = ("logging_dir",)
"""Fields of TRL 1.16's GRPOConfig on the transformers releases mtgrpo admits that are older
than the locked one (5.4 has ``logging_dir``; 5.24 dropped it); accepted the same way."""

_NO_DATALOADER = "no effect: prompts are drawn by mtgrpo's task-balanced sampler, not a DataLoader"
_NO_PREDICTION_LOOP = ("no effect: evaluation generates, scores and reports per-task accuracy "
                       "and the GRPO loss itself (no HF prediction loop)")
_LAUNCHER = ("configure it through the accelerate launcher (`accelerate launch --config_file "
             "...`); mtgrpo runs under accelerate and follows its distributed type")
_GENERATION = ("generation runs with generation_backend='static' (the fast default) or 'hf' "
               "(transformers generate), or with vLLM (use_vllm); an external engine plugs in "
               "through "
               "mtgrpo.rollout.GenerationBackend")


def _inert(reason: str, default: Any = None) -> Any:
    return field(default=default, metadata={"help": reason, "effect": "none"})


def _refused(alternative: str, default: Any = None) -> Any:
    return field(default=default, metadata={"help": alternative, "effect": "refused"})


def _alias(what: str, default: Any = None) -> Any:
    return field(default=default, metadata={"help": what, "effect": "alias"})


@dataclass
class TRLCompatibleFields:
    """The TRL / transformers fields that construct but do not act (see the module docstring)."""

    # every default is TRL 1.16's: a TRL config that leaves a field alone passes without a warning
    # ---------------------------------------------------------------- refused unless default
    use_liger_kernel: bool = _refused(
        "mtgrpo never materialises full logits (log-probabilities are computed in chunks "
        "through the head), which is the memory Liger's fused loss saves; leave it off", False)
    liger_kernel_config: dict[str, bool] | None = _refused(
        "only read with use_liger_kernel, which mtgrpo refuses; remove it")
    use_transformers_continuous_batching: bool = _refused(
        f"not available; {_GENERATION}", False)
    transformers_continuous_batching_config: dict[str, Any] | str | None = _refused(
        f"not available; {_GENERATION}")
    use_transformers_paged: bool = _refused(f"not available; {_GENERATION}", False)
    torch_compile: bool = _refused(
        "torch.compile is not applied (the padding-free update changes shapes every step); "
        "leave it off", False)
    torch_compile_backend: str | None = _refused("only read with torch_compile; remove it")
    torch_compile_mode: str | None = _refused("only read with torch_compile; remove it")
    deepspeed: dict[str, Any] | str | None = _refused(
        "DeepSpeed ZeRO is set by the launcher: accelerate launch --use_deepspeed "
        "--zero_stage 3 (or --deepspeed_config_file ds_config.json) train.py, see "
        "docs/distributed.md")
    fsdp_config: dict[str, Any] | str | None = _refused(
        f"FSDP options: fsdp='full_shard' shards every decoder layer; for others {_LAUNCHER}")
    parallelism_config: Any = _refused(f"parallelism: {_LAUNCHER}")
    activation_checkpointing: bool | None = _refused(
        "use gradient_checkpointing (and gradient_checkpointing_kwargs)")
    activation_checkpointing_kwargs: dict[str, Any] | str | None = _refused(
        "use gradient_checkpointing_kwargs")
    auto_find_batch_size: bool = _refused(
        "bound memory with max_tokens_per_microbatch (micro-batches packed by a token budget) "
        "or per_device_train_batch_size", False)
    neftune_noise_alpha: float | None = _refused(
        "NEFTune is a supervised fine-tuning technique and is not applied in GRPO; remove it")
    log_completions_hub_repo: str | None = _refused(
        "completions are written to completions.jsonl in output_dir (log_completions=True); "
        "upload that file yourself")

    # ---------------------------------------------------------------- accepted, no effect
    optim_target_modules: str | list[str] | None = _inert(
        "no effect: optimizers that target modules (GaLore, APOLLO) are not supported")
    average_tokens_across_devices: bool = _inert(
        "no effect: loss normalisers are always those of the whole batch across processes",
        True)
    label_smoothing_factor: float = _inert("no effect: GRPO has no labels", 0.0)
    bf16_full_eval: bool = _inert("no effect: evaluation runs in the training precision", False)
    fp16_full_eval: bool = _inert("no effect: evaluation runs in the training precision", False)
    use_cache: bool = _inert(
        "no effect: generation always uses a KV cache, the update never does", False)
    log_on_each_node: bool = _inert("no effect: only the main process logs", True)
    project: str = _inert("no effect: the tracker project is the tracker's default",
                          "huggingface")
    trackio_space_id: str | None = _inert("no effect: trackio runs locally")
    trackio_bucket_id: str | None = _inert("no effect: trackio runs locally")
    trackio_static_space_id: str | None = _inert("no effect: trackio runs locally")
    per_device_eval_batch_size: int = _inert(
        "no effect: evaluation generates a round of prompts at once "
        "(generation_batch_size bounds a generate call)", 8)
    prediction_loss_only: bool = _inert(_NO_PREDICTION_LOOP, False)
    eval_do_concat_batches: bool = _inert(_NO_PREDICTION_LOOP, True)
    eval_use_gather_object: bool = _inert(_NO_PREDICTION_LOOP, False)
    eval_accumulation_steps: int | None = _inert(_NO_PREDICTION_LOOP)
    include_for_metrics: list[str] = field(default_factory=list, metadata={
        "help": _NO_PREDICTION_LOOP, "effect": "none"})
    batch_eval_metrics: bool = _inert(_NO_PREDICTION_LOOP, False)
    save_on_each_node: bool = _inert("no effect: the main process writes checkpoints", False)
    enable_jit_checkpoint: bool = _inert(
        "no effect: checkpoints are written atomically every save_steps (a killed run "
        "resumes from the newest)", False)
    ignore_data_skip: bool = _inert(
        "no effect: resuming restores the sampler's state exactly, nothing is skipped", False)
    restore_callback_states_from_checkpoint: bool = _inert(
        "no effect: callback states are not stored in checkpoints", False)
    accelerator_config: Any = _inert(
        "no effect besides TRL's dispatch_batches check for iterable datasets (kept as a "
        "transformers AcceleratorConfig)")
    dataloader_drop_last: bool = _inert(_NO_DATALOADER, False)
    dataloader_num_workers: int = _inert(_NO_DATALOADER, 0)
    dataloader_pin_memory: bool = _inert(_NO_DATALOADER, True)
    dataloader_persistent_workers: bool = _inert(_NO_DATALOADER, False)
    dataloader_prefetch_factor: int | None = _inert(_NO_DATALOADER)
    dataloader_multiprocessing_context: str | None = _inert(_NO_DATALOADER)
    dataloader_in_order: bool = _inert(_NO_DATALOADER, True)
    remove_unused_columns: bool | None = _inert(
        "no effect: every dataset column reaches the reward functions (TRL's False)", False)
    label_names: list[str] | None = _inert("no effect: GRPO has no labels")
    length_column_name: str = _inert(_NO_DATALOADER, "length")
    debug: str | list[str] = _inert("no effect: transformers' debug modes are not wired", "")
    skip_memory_metrics: bool = _inert("no effect: memory metrics are not collected", True)
    do_train: bool = _inert("no effect (read by example scripts only, as in transformers)",
                            False)
    do_eval: bool = _inert("no effect (read by example scripts only, as in transformers)",
                           False)
    do_predict: bool = _inert("no effect (read by example scripts only, as in transformers)",
                              False)
    local_rank: int = _inert("no effect: the rank comes from the accelerate launcher", -1)
    router_aux_loss_coef: float | None = _inert(
        "no effect: the mixture-of-experts router's auxiliary loss is not added to the loss")
    ds3_gather_for_generation: bool = _inert(
        "no effect: under DeepSpeed ZeRO-3 generation always runs on the whole weights, gathered "
        "on every process (as with True)", True)
    pad_to_multiple_of: int | str | None = _inert(
        "no effect: the update is padding-free (or length-bucketed), so padding never enters "
        "the loss", "auto")
    hub_always_push: bool = _inert(
        "no effect: uploads here are synchronous, so every save uploads either way", False)
    logging_dir: str | None = _inert(
        "no effect: trackers write under output_dir (a field of transformers before 5.x)")
    log_multimodal: bool = _inert("no effect: mtgrpo trains text models", True)
    log_unique_prompts: bool = _inert(
        "no effect: completions.jsonl keeps every completion", False)

    vllm_group_port: int = _inert(
        "no effect: weights reach the server as a shared-memory file or over HTTP, not "
        "through an NCCL group", 51216)

    # ---------------------------------------------------------------- other names, acting
    reward_aggregation_method: str | None = _alias(
        "the name TRL's tutorials use for multi_objective_aggregation; sets it")
    vllm_importance_sampling_cap: float | None = _alias(
        "deprecated in TRL: sets vllm_importance_sampling_clip_max (with a warning)")


def _compat_fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(TRLCompatibleFields))


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _is_default(value: Any, default: Any) -> bool:
    # by identity: == against None may answer elementwise (an array) or be overridden
    if value is None or default is None:
        return value is default
    try:
        return bool(value == default)
    except Exception:  # an object without a meaningful == is not the default
        return False


def check_compatibility_fields(config: Any) -> None:
    """Refuse the refused fields when set, warn once about the no-effect fields that are set
    (the aliases are applied by :class:`~mtgrpo.compat.GRPOConfig`)."""
    inert = []
    for f in _compat_fields():
        value = getattr(config, f.name)
        default = _default(f)
        if _is_default(value, default):
            continue
        if f.metadata["effect"] == "refused":
            raise ValueError(
                f"{f.name}={value!r} is not supported by mtgrpo: {f.metadata['help']}"
            )
        if f.metadata["effect"] == "none":
            inert.append(f.name)
    if inert:
        logger.warning(
            "these options are accepted for TRL compatibility but have no effect in mtgrpo: "
            "%s (see docs/coming-from-trl.md)", ", ".join(inert),
        )


def compatibility_rows() -> list[tuple[str, str, str, str]]:
    """``(name, default, effect, reason)`` of every field declared here, for the reference."""
    return [(f.name, repr(_default(f)), f.metadata["effect"], f.metadata["help"])
            for f in _compat_fields()]
