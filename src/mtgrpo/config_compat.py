"""TRL 1.16 / transformers ``TrainingArguments`` fields that mtgrpo accepts but does not act on.

TRL's ``GRPOConfig`` extends transformers' ``TrainingArguments`` (191 fields in TRL 1.16 with
transformers 5). A config written for TRL must construct unchanged, so every one of those
fields exists on :class:`~mtgrpo.config.GRPOConfig`. The fields mtgrpo implements are
declared there, with their help text. The rest are declared here, in two kinds:

* **no effect** (:func:`_inert`): the option steers a part of the HF ``Trainer`` that mtgrpo
  does not have (its ``DataLoader``, its prediction loop, vLLM while ``use_vllm`` is off).
  Any value is accepted; a value other than the default is named once in a warning, so it
  is never silently believed to act.
* **refused** (:func:`_refused`): the option asks for something mtgrpo cannot do
  (``use_liger_kernel=True``, DeepSpeed given as a training argument).

The vLLM fields (``use_vllm`` and ``vllm_*``) act as in TRL (:func:`_vllm`): they choose and
set up the vLLM generation engine (:mod:`mtgrpo.rollout.vllm`, docs/engines.md) and are
checked by :func:`check_vllm_fields`.
  The default is accepted; anything else is a ``ValueError`` that names what to use instead.

:class:`TRLCompatibleFields` is the base class of :class:`~mtgrpo.config.GRPOConfig`;
:func:`check_compatibility_fields` is called from its ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("mtgrpo.config")

__all__ = ["TRLCompatibleFields", "check_compatibility_fields", "check_vllm_fields",
           "compatibility_rows"]

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


def _vllm(what: str, default: Any = None) -> Any:
    return field(default=default, metadata={"help": what, "effect": "vllm"})


@dataclass
class TRLCompatibleFields:
    """The TRL / transformers fields that construct but do not act (see the module docstring)."""

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
        "DeepSpeed: mtgrpo's update runs the backward passes and the optimizer step itself, "
        "which a DeepSpeed engine owns; shard the model with fsdp='full_shard' (FSDP2, "
        "docs/distributed.md) or train replicated (DDP)")
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
        "no effect: DeepSpeed ZeRO-3 generation is not supported", True)
    pad_to_multiple_of: int | str | None = _inert(
        "no effect: the update is padding-free (or length-bucketed), so padding never enters "
        "the loss", "auto")
    log_multimodal: bool = _inert("no effect: mtgrpo trains text models", True)
    log_unique_prompts: bool = _inert(
        "no effect: completions.jsonl keeps every completion", False)

    # ---------------------------------------------------------------- vLLM (act as in TRL)
    use_vllm: bool = _vllm(
        "Generate with vLLM (vllm_mode: colocate, an in-process engine; server, a `mtgrpo "
        "vllm-serve` server); the policy's weights are pushed into it after every optimizer "
        "step and after a resume (docs/engines.md).", False)
    vllm_mode: str = _vllm(
        "colocate (an in-process vllm.LLM beside the trainer) or server (a `mtgrpo "
        "vllm-serve MODEL` server, on this machine or another).", "colocate")
    vllm_model_impl: str = _vllm(
        "Colocate: vLLM's model implementation (auto, vllm or transformers).", "vllm")
    vllm_enable_sleep_mode: bool = _vllm(
        "Colocate, GPU only: free the engine's weights and KV cache between generations "
        "(refused on a CPU).", False)
    vllm_structured_outputs_regex: str | None = _vllm(
        "A regular expression every completion must match (vLLM's structured outputs).")
    vllm_server_base_url: str | None = _vllm(
        "Server: its URL (e.g. http://10.0.0.2:8000); overrides host and port.")
    vllm_server_host: str = _vllm(
        "Server: its host when no base URL is given (0.0.0.0: this machine).", "0.0.0.0")
    vllm_server_port: int = _vllm("Server: its port when no base URL is given.", 8000)
    vllm_server_timeout: float = _vllm(
        "Server: seconds to wait for it to come up, and for any one request, before the run "
        "stops with an error naming the server.", 240.0)
    vllm_group_port: int = _inert(
        "no effect: weights reach the server as a shared-memory file or over HTTP, not "
        "through an NCCL group", 51216)
    vllm_gpu_memory_utilization: float = _vllm(
        "Colocate: vLLM's fraction of GPU memory; on a CPU, the fraction of host memory "
        "given to its KV cache.", 0.3)
    vllm_max_model_length: int | None = _vllm(
        "Colocate: the engine's context (None: max_prompt_length + max_completion_length).")
    vllm_tensor_parallel_size: int = _vllm(
        "Colocate: GPUs the engine splits the model over (1 on a CPU).", 1)
    vllm_importance_sampling_correction: bool = _vllm(
        "Weight each token's policy loss by the ratio of the trainer's and the engine's "
        "log-probs of the sampled tokens, bounded by the mode (TRL's; logged as "
        "sampling/importance_sampling_ratio/* and sampling/sampling_logp_difference/*).", True)
    vllm_importance_sampling_mode: str = _vllm(
        "token_truncate, token_mask, sequence_truncate or sequence_mask: a ratio per token "
        "or per completion, clamped to or masked outside [clip_min, clip_max].",
        "sequence_mask")
    vllm_importance_sampling_clip_max: float | None = _vllm(
        "Upper bound of the correction's ratio (None: none).", 3.0)
    vllm_importance_sampling_clip_min: float | None = _vllm(
        "Lower bound of the correction's ratio (None: none).")
    vllm_importance_sampling_cap: float | None = _vllm(
        "Deprecated in TRL: sets vllm_importance_sampling_clip_max (with a warning).")


def _compat_fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(TRLCompatibleFields))


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _is_default(value: Any, default: Any) -> bool:
    if value is None or default is None:
        return value is default
    try:
        return bool(value == default)
    except Exception:  # an object without a meaningful == is not the default
        return False


def check_compatibility_fields(config: Any) -> None:
    """Refuse the refused fields when set, warn once about the no-effect fields that are set.

    The vLLM fields act (:func:`check_vllm_fields` checks them).
    """
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
    check_vllm_fields(config)
    if inert:
        logger.warning(
            "these options are accepted for TRL compatibility but have no effect in mtgrpo: "
            "%s (see docs/coming-from-trl.md)", ", ".join(inert),
        )


def check_vllm_fields(config: Any) -> None:
    """TRL's vLLM switches, checked when the config is built (before any model or engine)."""
    if config.vllm_importance_sampling_cap is not None:
        logger.warning("vllm_importance_sampling_cap is deprecated (as in TRL); it sets "
                       "vllm_importance_sampling_clip_max=%s", config.vllm_importance_sampling_cap)
        config.vllm_importance_sampling_clip_max = config.vllm_importance_sampling_cap
        config.vllm_importance_sampling_cap = None
    if not config.use_vllm:
        return
    if config.vllm_mode not in ("colocate", "server"):
        raise ValueError(f"vllm_mode must be 'colocate' or 'server', got {config.vllm_mode!r}")
    if config.generation_backend != "auto":
        raise ValueError(
            f"use_vllm=True generates with vLLM, but generation_backend="
            f"{config.generation_backend!r} asks for another engine; set only one of them"
        )
    if config.vllm_importance_sampling_correction:
        from mtgrpo.algo.registry import check_is_correction

        check_is_correction(config.vllm_importance_sampling_mode,
                            config.vllm_importance_sampling_clip_min,
                            config.vllm_importance_sampling_clip_max)
        if config.generation_logprobs is False:
            raise ValueError(
                "vllm_importance_sampling_correction needs the engine's log-probs, and "
                "generation_logprobs=False turns them off; remove one of the two settings"
            )
        if config.loss_type == "vespo":
            raise ValueError(
                "loss_type='vespo' with vllm_importance_sampling_correction is not supported "
                "(TRL folds the ratio into VESPO's weights); set "
                "vllm_importance_sampling_correction=False or another loss_type"
            )
    if config.vllm_server_timeout is None or not config.vllm_server_timeout > 0:
        raise ValueError(
            f"vllm_server_timeout={config.vllm_server_timeout!r} must be a number of seconds > 0"
        )


def compatibility_rows() -> list[tuple[str, str, str, str]]:
    """``(name, default, effect, reason)`` of every field declared here, for the reference."""
    return [(f.name, repr(_default(f)), f.metadata["effect"], f.metadata["help"])
            for f in _compat_fields()]
