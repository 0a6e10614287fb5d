"""``mtgrpo vllm-serve MODEL``: a vLLM generation server that trainers on other devices or
machines connect to (``use_vllm: true``, ``vllm_mode: server``, ``vllm_server_base_url``).

It answers health checks, generates with per-request sampling parameters and log-probs,
takes weight updates (a safetensors blob over HTTP, or a shared-memory file from a trainer on
the same machine) and resets its prefix cache; every generation reports the weights version
it used, so a trainer notices a restarted server. The protocol (``mtgrpo-vllm/1``) and a
two-machine example are in docs/engines.md. It binds 127.0.0.1 unless ``--host`` says
otherwise: whoever reaches the port can replace the weights.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL",
                        help="model directory (or a hub name where the hub is reachable)")
    # Loopback by default: whoever reaches the port can replace the weights (module docstring).
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default: %(default)s; 0.0.0.0 for other machines)")
    parser.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    parser.add_argument("--dtype", default="auto",
                        help="weights' dtype in the engine: auto, float32, bfloat16, float16 "
                             "(default: %(default)s; float32 to compare log-probs with a "
                             "float32 trainer)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="longest prompt + completion in tokens (default: the model's)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="fraction of GPU memory for vLLM (default 0.9); on a CPU the "
                             "fraction of host memory for the KV cache (default 0.05)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="GPUs to split the model over (default: %(default)s)")
    parser.add_argument("--model-impl", default="auto",
                        help="auto, vllm or transformers (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="engine seed (default: 0)")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="most sequences decoded at once (default: vLLM's)")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="no CUDA graphs (always eager on a CPU)")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                        default=None, help="vLLM's prefix caching (default: vLLM's)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="run the model repository's own code")


def run(args: argparse.Namespace) -> int:
    import torch

    from mtgrpo.rollout.vllm.engine import EngineOptions
    from mtgrpo.rollout.vllm.server import serve

    gpu = torch.cuda.is_available()
    utilization = args.gpu_memory_utilization
    if utilization is None:
        # 0.9 is vLLM's own default; on a CPU the fraction is of host memory.
        utilization = 0.9 if gpu else 0.05
    if not 0 < args.port < 65536:
        raise ValueError(f"--port {args.port} is not a port number (1-65535)")
    options = EngineOptions(
        model=args.model, dtype=args.dtype, max_model_len=args.max_model_len,
        gpu_memory_utilization=utilization, tensor_parallel_size=args.tensor_parallel_size,
        model_impl=args.model_impl, seed=args.seed, max_num_seqs=args.max_num_seqs,
        # CUDA graphs need a GPU.
        enforce_eager=args.enforce_eager or not gpu, trust_remote_code=args.trust_remote_code,
        enable_prefix_caching=args.enable_prefix_caching,
    )
    serve(options, host=args.host, port=args.port)
    return 0
