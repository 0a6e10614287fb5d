"""vLLM as the generation engine, colocated (an in-process ``vllm.LLM``) or as a server
(``mtgrpo vllm-serve``), behind the :class:`~mtgrpo.rollout.base.GenerationBackend` contract.

:func:`backend_from_config` builds the one a run's TRL switches ask for (``use_vllm``,
``vllm_mode`` and the ``vllm_*`` fields). Importing this package imports no vLLM: the server
backend needs none in the trainer's environment; the colocated one imports it when built.
How weights sync, what the importance-sampling correction does and a two-machine example:
docs/engines.md.
"""

from __future__ import annotations

from typing import Any

from mtgrpo.rollout.vllm.errors import EngineUnreachableError, StaleEngineError, WeightPushError

__all__ = ["EngineUnreachableError", "StaleEngineError", "WeightPushError",
           "backend_from_config"]


def backend_from_config(args: Any, model: Any, tokenizer: Any) -> Any:
    """The vLLM backend ``args`` (a :class:`~mtgrpo.config.GRPOConfig` with ``use_vllm``)
    asks for, with the policy's weights pushed as version 0."""
    options: dict[str, Any] = {}  # TRL's generation options, as TRL hands them to vLLM
    if args.rollout.min_p is not None:
        options["min_p"] = args.rollout.min_p
    if args.rollout.repetition_penalty != 1.0:  # 1.0 is no penalty, vLLM's default
        options["repetition_penalty"] = args.rollout.repetition_penalty
    # last, as TRL 1.16 applies generation_kwargs over its own sampling fields
    options.update(args.rollout.generation_kwargs or {})
    common = {"structured_outputs_regex": args.vllm.vllm_structured_outputs_regex,
              "sampling_options": options}
    if args.vllm.vllm_mode == "server":
        from mtgrpo.rollout.vllm.client import VLLMServerBackend, server_url

        url = server_url(args.vllm.vllm_server_base_url, args.vllm.vllm_server_host,
                         args.vllm.vllm_server_port)
        return VLLMServerBackend(model, tokenizer, url=url, timeout=args.vllm.vllm_server_timeout,
                                 **common)
    from mtgrpo.rollout.vllm.colocate import VLLMColocateBackend, model_directory
    from mtgrpo.rollout.vllm.engine import EngineOptions

    if args.vllm.vllm_tensor_parallel_size > 1 and not _on_gpu():
        raise ValueError(
            f"vllm_tensor_parallel_size={args.vllm.vllm_tensor_parallel_size} splits the model "
            "over GPUs; on a CPU leave it at 1"
        )
    options = EngineOptions(
        model=model_directory(model), dtype=_dtype_name(model),
        max_model_len=args.vllm.vllm_max_model_length or _context(args),
        gpu_memory_utilization=args.vllm.vllm_gpu_memory_utilization,
        tensor_parallel_size=args.vllm.vllm_tensor_parallel_size,
        enable_sleep_mode=args.vllm.vllm_enable_sleep_mode, model_impl=args.vllm.vllm_model_impl,
        seed=args.schedule.seed, enforce_eager=not _on_gpu(),
        trust_remote_code=args.compute.trust_remote_code,
    )
    return VLLMColocateBackend(model, tokenizer, engine_options=options, **common)


def _on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _dtype_name(model: Any) -> str:
    """The engine's dtype: the policy's (float32 weights sample in float32, so the engine's
    log-probs are comparable with the trainer's)."""
    import torch

    dtype = next(model.parameters()).dtype
    # explicit: vLLM's "auto" runs a float32 checkpoint in float16
    return {torch.float32: "float32", torch.bfloat16: "bfloat16",
            torch.float16: "float16"}.get(dtype, "auto")


def _context(args: Any) -> int | None:
    if args.rollout.max_prompt_length is None:
        return None
    return int(args.rollout.max_prompt_length + args.rollout.max_completion_length)
