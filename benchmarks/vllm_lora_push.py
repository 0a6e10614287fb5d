"""LoRA into vLLM: merged weights pushed in place (what the backends do) against the adapter
loaded as a vLLM LoRA request, per training step, side by side on one model.

    .venv-vllm/bin/python benchmarks/vllm_lora_push.py                  # SmolLM2-135M's shape
    .venv-vllm/bin/python benchmarks/vllm_lora_push.py --width 128 --layers 2 --vocab 259

Both ways start from the same random base model (saved to a temporary directory) wrapped in
LoRA adapters of rank ``--rank`` on every projection with random ``B`` factors. Per step the
adapters change (``B`` drawn again), then:

* merged: ``update_weights(policy, step)`` of the colocated backend (merge, vLLM's in-place
  reload of every base weight, unmerge), then one generation;
* adapter: ``save_pretrained`` of the adapter to a new directory, then one generation with a
  new ``LoRARequest`` (vLLM loads the adapter on that call) on an engine started with
  ``enable_lora``.

Timed: the push (merged) or the save (adapter) and the generation after it, each step, median
over ``--steps`` steps after one warm-up step. The generation of ``--rows`` rows x
``--new-tokens`` tokens is part of both, because an adapter costs at generation time (the LoRA
matrix products) what a merged model does not.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def _model(args: argparse.Namespace, directory: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.width,
                         num_hidden_layers=args.layers, num_attention_heads=args.width // 64,
                         num_key_value_heads=max(args.width // 192, 1),
                         intermediate_size=args.width * 8 // 3, max_position_embeddings=1024,
                         tie_word_embeddings=True, eos_token_id=args.vocab - 1, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(directory)
    return model


def _lora(model: torch.nn.Module, rank: int) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                     "gate_proj", "up_proj", "down_proj"]))


def _new_adapters(policy: torch.nn.Module, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=576)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=49_152)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)

    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm
    from vllm.lora.request import LoRARequest

    from mtgrpo.rollout import SamplingParams
    from mtgrpo.rollout.vllm.colocate import VLLMColocateBackend
    from mtgrpo.rollout.vllm.engine import EngineOptions

    directory = tempfile.mkdtemp(prefix="mtgrpo-lora-bench-")
    policy = _lora(_model(args, directory), args.rank)
    prompts = [[1 + (7 * i + j) % (args.vocab - 2) for j in range(32)] for i in range(args.rows)]
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    options = EngineOptions(model=directory, dtype="float32", max_model_len=128,
                            gpu_memory_utilization=0.02, enforce_eager=True,
                            skip_tokenizer_init=True, max_num_seqs=args.rows)
    print(f"vLLM {vllm.__version__}, torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads; width {args.width}, {args.layers} layers, vocabulary {args.vocab}, LoRA "
          f"rank {args.rank} on every projection; {args.rows} rows x {args.new_tokens} tokens")

    merged = VLLMColocateBackend(policy, engine_options=options, eos_token_ids=[args.vocab - 1],
                                 sampling_options={"ignore_eos": True})
    timings: dict[str, list[tuple[float, float]]] = {"merged": [], "adapter": []}
    for step in range(args.steps + 1):
        _new_adapters(policy, step)
        begin = time.perf_counter()
        merged.update_weights(policy, step + 1)
        pushed = time.perf_counter()
        merged.generate(prompts, params, 1)
        if step:
            timings["merged"].append((pushed - begin, time.perf_counter() - pushed))

    from mtgrpo.rollout.vllm.engine import shutdown_engines

    shutdown_engines()
    engine = vllm.LLM(**{**options.llm_kwargs(), "enable_lora": True, "max_lora_rank": args.rank,
                         "max_loras": 1})
    sampling = vllm.SamplingParams(max_tokens=args.new_tokens, temperature=1.0, seed=0,
                                   ignore_eos=True)
    for step in range(args.steps + 1):
        _new_adapters(policy, step)
        begin = time.perf_counter()
        path = tempfile.mkdtemp(prefix=f"adapter-{step}-", dir=directory)
        policy.save_pretrained(path)
        saved = time.perf_counter()
        engine.generate([{"prompt_token_ids": p} for p in prompts], sampling, use_tqdm=False,
                        lora_request=LoRARequest(f"step-{step}", step + 1, path))
        if step:
            timings["adapter"].append((saved - begin, time.perf_counter() - saved))

    print(f"\n  {'way':<9} {'push s':>8} {'generate s':>11} {'step s':>8}")
    total = {}
    for way, rows in timings.items():
        push = statistics.median(r[0] for r in rows)
        generate = statistics.median(r[1] for r in rows)
        total[way] = push + generate
        print(f"  {way:<9} {push:8.3f} {generate:11.3f} {push + generate:8.3f}")
    print(f"\n  merged / adapter step time: {total['merged'] / total['adapter']:.2f}")


if __name__ == "__main__":
    main()
