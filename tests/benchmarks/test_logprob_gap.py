"""``benchmarks/bf16_logprob_gap.py`` end to end on the tiny model: the float32 run's gap is the
kernel floor, the bf16 run's is clearly larger, and the report shows both."""

from __future__ import annotations

import math

import torch

from script_loader import load_script

bench = load_script("benchmarks/bf16_logprob_gap.py")


def test_the_bf16_gap_is_measured_against_the_float32_floor(tiny_model_dir, capsys) -> None:
    results = bench.main(["--model", str(tiny_model_dir), "--steps", "1", "--prompts", "2",
                          "--group", "2", "--new-tokens", "4", "--no-lora"])
    [bf16], [fp32] = results["bf16"], results["float32"]
    # float32 both sides: the same sums in other kernels, a few float32 ulps of log-probs of
    # magnitude up to log(vocab) (the tiny model's 259 tokens: 5.6)
    floor = 64 * torch.finfo(torch.float32).eps * math.log(259)
    assert fp32["generation/logprob_mismatch_max"] < floor
    # bfloat16 keeps 8 bits (eps 2^-7): its gap is far above the float32 floor
    assert bf16["generation/logprob_mismatch_mean"] > 10 * fp32["generation/logprob_mismatch_mean"]
    assert bf16["generation/logprob_mismatch_max"] > floor
    assert bf16["generation/kl_k3"] >= 0
    text = capsys.readouterr().out
    assert "| bf16 | mean |" in text
    assert "| float32 | 1 |" in text
