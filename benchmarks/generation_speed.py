"""Generation speed: the "hf" backend (transformers ``generate``) against the "static" backend.

    python benchmarks/generation_speed.py                          # CPU: tiny, llama-10m
    .venv-vllm/bin/python benchmarks/generation_speed.py --backend vllm   # + vLLM, colocated
    python benchmarks/generation_speed.py --models llama-10m --rows 64 --new-tokens 128
    python benchmarks/generation_speed.py --prompts 16 --num-samples 8 --prompt-tokens 110
    python benchmarks/generation_speed.py --device cuda            # adds qwen2.5-0.5b-shape (bf16)
    python benchmarks/generation_speed.py --models smollm2-135m-shape --lora 16 --prompts 9 \
        --num-samples 8 --prompt-tokens 80 --new-tokens 32 --threads 2   # the smollm2-cpu step

Every model is built in memory from a config under ``torch.manual_seed(--seed)`` (random
weights, nothing downloaded); each backend gets the same model object and the same rows:
``--prompts`` (alias ``--rows``) prompts of ``--prompt-tokens`` random token ids (``--ragged``:
lengths spread over ``[prompt_tokens / 2, prompt_tokens]``, to include left padding), each
sampled ``--num-samples`` times (``G``, the GRPO group: ``generate(prompts, params, G)``), at
temperature 1 with ``top_p = 1``, ``top_k = 0`` (``--greedy`` for argmax).

``--lora R`` wraps the model in LoRA adapters of rank ``R`` on every projection (peft, the
trainer's defaults otherwise), their ``B`` factors drawn at random so that the adapters change
the output, as during training. On the CPU the static backend also runs as ``static-modules``:
``transpose_weights=False``, so the decode step calls the projection modules (LoRA layers
unmerged) and the whole LM head, where ``static`` multiplies by transposed weight copies with the
adapters merged and by the float32 head in row blocks
(:meth:`mtgrpo.fast.static_decoders.LlamaModulesDecoder.transposed_weights`).

With ``G > 1`` the static backend also runs as ``static-per-row``: the same backend handed the
``prompts x G`` rows as separate prompts (each prompt repeated ``G`` times, ``num_samples=1``),
so every row is prefilled, as the backend did before it prefilled each prompt once per
sub-batch and shared the KV cache. ``static`` over ``static-per-row`` is the gain of that
sharing alone (same decode loop, same rows in the same order).

Stopping: by default the only stop id is ``vocab_size`` (no token has it), so every row runs to
``--new-tokens`` and both backends do exactly the same amount of work, rows x new tokens; pass
``--stop-at-eos`` to stop at the config's EOS id instead (then lengths differ between runs).

Timing: one warm-up call per backend (lazy initialisation; for "static" on CUDA this is where
the decode step is captured as a CUDA graph, once per shape), then ``--repeats`` rounds in
which the backends run one after the other (so load from other processes falls on both), each
call timed with ``time.perf_counter`` around ``generate`` (``torch.cuda.synchronize`` on both
sides on CUDA; the outputs are Python lists, so the work is finished anyway). Reported: the
median wall time, the median CPU time of this process (on a shared machine it is the steadier
number), tokens per second (generated tokens / median wall time), and each backend's speed-up
over "hf". On CUDA the static backend also runs with ``use_cuda_graph=False``
("static-eager") to show what the graph capture itself buys.

``--backend vllm`` adds vLLM beside them (the colocated backend: an in-process ``vllm.LLM``
on the same weights, saved to a temporary directory, float32 or the model's dtype; run it
with the vLLM environment's Python, ``.venv-vllm``). Its start-up and the weight push are not
timed, its warm-up call is; on a CPU it runs eagerly, on CUDA with its CUDA graphs. Models
vLLM's CPU attention cannot run (head size 16: "tiny") are skipped with a note; "tiny-vllm"
is the tiny model with 64-wide heads.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from mtgrpo.algo.registry import Registry
from mtgrpo.rollout import SamplingParams, StaticCacheBackend, make_backend


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only model's configuration, built with random weights."""

    arch: str  # "llama" or "qwen2"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    tie_word_embeddings: bool = False
    bf16: bool = False
    needs_cuda: bool = False
    on_request: bool = False  # run only when named in --models (slow on a CPU)

    def build(self, seed: int, device: torch.device) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

        config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config}[self.arch]
        config = config_class(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=4096,
            tie_word_embeddings=self.tie_word_embeddings,
            eos_token_id=self.vocab_size - 1,
            pad_token_id=0,
            bos_token_id=None,
        )
        dtype = torch.bfloat16 if self.bf16 else torch.float32
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        return model.to(device).eval().requires_grad_(False)


MODELS: Registry[ModelShape] = Registry("benchmark model")
# mtgrpo's tiny model (mtgrpo.models.build_tiny_model defaults): about 0.1 M parameters.
MODELS.add("tiny", ModelShape("llama", 259, 64, 2, 4, 2, 128))
# The tiny model with 64-wide heads (width 128, 2 heads over 1): the shape the vLLM tests use.
MODELS.add("tiny-vllm", ModelShape("llama", 259, 128, 2, 2, 1, 128))
# The shape of the trainer benchmark's "cpu-tiny" workload (benchmarks/step_time_vs_trl.py):
# width 256, 4 layers, the tiny tokenizer's 259 tokens; about 3 M parameters.
MODELS.add("cpu-tiny-workload", ModelShape("llama", 259, 256, 4, 8, 4, 688))
# About 10 M parameters: 8 layers of width 256 over an 8k vocabulary.
MODELS.add("llama-10m", ModelShape("llama", 8192, 256, 8, 8, 4, 688))
# SmolLM2-135M's shape (the smollm2-cpu recipe's model): 30 layers of width 576, 9 heads over 3
# key/value heads, a tied 49,152-token vocabulary; float32. Run only when named.
MODELS.add(
    "smollm2-135m-shape",
    ModelShape("llama", 49_152, 576, 30, 9, 3, 1536, tie_word_embeddings=True, on_request=True),
)  # fmt: skip
# Qwen2.5-0.5B's shape (vocabulary, width, depth, heads, tied embeddings), bf16, CUDA only:
# the workload of docs/fast_generation.md (64 rows x 256 new tokens from 48-token prompts).
MODELS.add(
    "qwen2.5-0.5b-shape",
    ModelShape("qwen2", 151_936, 896, 24, 14, 2, 4864, tie_word_embeddings=True, bf16=True,
               needs_cuda=True),
)  # fmt: skip


@dataclass
class Timing:
    backend: str
    wall_s: float
    cpu_s: float
    tokens: int


def _prompts(args: argparse.Namespace, vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(args.seed)
    prompts = []
    for _ in range(args.prompts):
        low = max(args.prompt_tokens // 2, 1) if args.ragged else args.prompt_tokens
        length = int(torch.randint(low, args.prompt_tokens + 1, (1,), generator=generator))
        prompts.append(torch.randint(1, vocab_size - 1, (length,), generator=generator).tolist())
    return prompts


@dataclass(frozen=True)
class Contender:
    """A backend and how it is called: ``per_row`` hands it every row as its own prompt."""

    backend: Any
    per_row: bool = False

    def generate(self, prompts: list[list[int]], params: SamplingParams, group: int) -> Any:
        if self.per_row:
            rows = [prompt for prompt in prompts for _ in range(group)]  # [B*G]
            return self.backend.generate(rows, params, num_samples=1)
        return self.backend.generate(prompts, params, num_samples=group)


def _contenders(
    model: torch.nn.Module, args: argparse.Namespace, stop: int
) -> dict[str, Contender]:
    options = {"max_batch_size": args.max_batch_size, "eos_token_ids": [stop]}
    static = StaticCacheBackend(model, **options)
    contenders = {
        "hf": Contender(make_backend("hf", model, None, **options)),
        "static": Contender(static),
    }
    if next(model.parameters()).device.type == "cpu":
        contenders["static-modules"] = Contender(
            StaticCacheBackend(model, transpose_weights=False, **options)
        )
    if args.num_samples > 1:
        contenders["static-per-row"] = Contender(static, per_row=True)
    if next(model.parameters()).device.type == "cuda":
        eager = StaticCacheBackend(model, use_cuda_graph=False, **options)
        contenders["static-eager"] = Contender(eager)
    if "vllm" in args.backend:
        vllm = _vllm_backend(model, args, stop)
        if vllm is not None:
            contenders["vllm"] = Contender(vllm)
    return contenders


def _vllm_backend(model: torch.nn.Module, args: argparse.Namespace, stop: int) -> Any:
    """The colocated vLLM backend on ``model``'s weights, or None (with a note) where vLLM's
    attention cannot run the model here."""
    import tempfile

    from mtgrpo.rollout.vllm.colocate import VLLMColocateBackend
    from mtgrpo.rollout.vllm.engine import EngineOptions, check_model_servable

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    directory = tempfile.mkdtemp(prefix="mtgrpo-bench-vllm-")
    base.config.save_pretrained(directory)
    options = EngineOptions(
        model=directory, dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        max_model_len=args.prompt_tokens + args.new_tokens + 8, gpu_memory_utilization=0.05
        if next(model.parameters()).device.type == "cpu" else 0.5,
        enforce_eager=next(model.parameters()).device.type == "cpu", skip_tokenizer_init=True,
        max_num_seqs=max(args.prompts * args.num_samples, 1))
    try:
        check_model_servable(options)
    except ValueError as error:
        print(f"  (vllm skipped: {error})")
        return None
    from safetensors.torch import save_file

    state = {n: t.detach().cpu().contiguous() for n, t in base.state_dict().items()}
    if base.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, f"{directory}/model.safetensors")
    # rows run to --new-tokens as for the other backends (vLLM would stop at the config's EOS)
    extra = {} if args.stop_at_eos else {"ignore_eos": True}
    return VLLMColocateBackend(model, engine_options=options, eos_token_ids=[stop],
                               sampling_options=extra)


def _with_lora(model: torch.nn.Module, rank: int, seed: int) -> torch.nn.Module:
    """``model`` wrapped in LoRA adapters of rank ``rank`` (the trainer's other defaults), with
    random ``B`` factors (peft initialises them to zero, which would change nothing)."""
    from mtgrpo.models.lora import apply_lora

    policy = apply_lora(model, {"r": rank, "lora_alpha": 2 * rank})
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param_name, param in policy.named_parameters():
            if "lora_B" in param_name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    return policy.eval()


def _timed(call: Callable[[], Any], device: torch.device) -> tuple[float, float, Any]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    result = call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def bench_model(name: str, args: argparse.Namespace, device: torch.device) -> list[Timing]:
    """Warm up each backend, then time ``--repeats`` interleaved rounds; medians per backend."""
    shape = MODELS.get(name)
    model = shape.build(args.seed, device)
    if args.lora:
        model = _with_lora(model, args.lora, args.seed)
    stop = shape.vocab_size - 1 if args.stop_at_eos else shape.vocab_size
    prompts = _prompts(args, shape.vocab_size)
    params = SamplingParams(max_new_tokens=args.new_tokens, greedy=args.greedy, seed=args.seed)
    contenders = _contenders(model, args, stop)
    for contender in contenders.values():
        contender.generate(prompts, params, args.num_samples)
    samples: dict[str, list[tuple[float, float, int]]] = {key: [] for key in contenders}
    for _ in range(args.repeats):
        for key, contender in contenders.items():
            call = partial(contender.generate, prompts, params, args.num_samples)
            wall, cpu, out = _timed(call, device)
            samples[key].append((wall, cpu, sum(out.completion_lengths)))
    return [
        Timing(key, statistics.median(s[0] for s in runs), statistics.median(s[1] for s in runs),
               int(statistics.median(s[2] for s in runs)))
        for key, runs in samples.items()
    ]


def report(name: str, timings: list[Timing], args: argparse.Namespace) -> None:
    hf = next(t for t in timings if t.backend == "hf")
    print(f"\n{name}{f' + LoRA r {args.lora}' if args.lora else ''}: {args.prompts} prompts x "
          f"{args.num_samples} samples x {args.new_tokens} new tokens, prompts of "
          f"{'<= ' if args.ragged else ''}{args.prompt_tokens} tokens")
    print(f"  {'backend':<14} {'wall s':>8} {'cpu s':>8} {'tokens':>7} {'tokens/s':>10} "
          f"{'speed-up':>9}")  # fmt: skip
    for t in timings:
        print(f"  {t.backend:<14} {t.wall_s:8.3f} {t.cpu_s:8.3f} {t.tokens:7d} "
              f"{t.tokens / t.wall_s:10.0f} {hf.wall_s / t.wall_s:8.2f}x")  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=None,
                        help=f"comma-separated, from: {', '.join(MODELS.names())} (default: all "
                        "that the device runs)")  # fmt: skip
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--prompts", "--rows", dest="prompts", type=int, default=64,
                        help="prompts per generate call")  # fmt: skip
    parser.add_argument("--num-samples", type=int, default=1,
                        help="completions per prompt (G): the call generates prompts x G rows")
    parser.add_argument("--new-tokens", type=int, default=64, help="max_new_tokens")
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--ragged", action="store_true", help="vary prompt lengths")
    parser.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    parser.add_argument("--stop-at-eos", action="store_true",
                        help="stop at the config's EOS id instead of running every row to "
                        "--new-tokens")  # fmt: skip
    parser.add_argument("--max-batch-size", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lora", type=int, default=0,
                        help="LoRA rank on every projection, random B (default: 0, none)")
    parser.add_argument("--backend", default="", help="vllm: also time the colocated vLLM "
                        "backend (needs vLLM: run with .venv-vllm/bin/python)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    names = args.models.split(",") if args.models else [
        n for n in MODELS.names()
        if (device.type == "cuda" or not MODELS.get(n).needs_cuda) and not MODELS.get(n).on_request
    ]
    for name in names:
        if MODELS.get(name).needs_cuda and device.type != "cuda":
            raise SystemExit(f"model {name!r} runs on CUDA only; pass --device cuda")
    if "vllm" in args.backend:
        import vllm

        print(f"vLLM {vllm.__version__}")
    print(f"torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else
             f", {torch.get_num_threads()} CPU threads"))  # fmt: skip
    for name in names:
        report(name, bench_model(name, args, device), args)


if __name__ == "__main__":
    main()
