"""The static backend on a CUDA device, with the decode step captured as a CUDA graph: the same
tokens as eager decoding and as the "hf" backend, log-probs equal to the trainer's, seeded
reproducibility, and one capture per shape. Skipped without CUDA (marker ``gpu``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import logprob_helpers
from mtgrpo.fast.static_graph import CapturedStep
from mtgrpo.models import apply_lora, load_model
from mtgrpo.rollout import HFGenerateBackend, SamplingParams, StaticCacheBackend

pytestmark = pytest.mark.gpu

PROMPTS = [[71, 100, 107, 107, 110], [257, 116, 114, 100, 113, 11, 1, 3, 9, 11, 80, 12], [42],
           [12, 11, 12, 28]]  # fmt: skip
PAD = 256


def _cuda_model(path: Path, **options: object) -> torch.nn.Module:
    return load_model(path, for_training=False, device="cuda", **options)


def _captured(backend: StaticCacheBackend) -> list[CapturedStep]:
    return [
        program.graph
        for slot in backend.engine._slots.values()
        for program in slot.programs.values()
        if program.graph is not None
    ]


@pytest.mark.parametrize("decode_path", ["llama_modules", "model_forward"])
@pytest.mark.parametrize("num_samples", [1, 3])  # 3: each prompt's prefill shared by 3 rows
def test_graph_decoding_equals_eager_and_hf(
    tiny_model_dir: Path, decode_path: str, num_samples: int
) -> None:
    model = _cuda_model(tiny_model_dir)
    params = SamplingParams(max_new_tokens=24, greedy=True)
    graphed = StaticCacheBackend(model, decode_path=decode_path)
    out = graphed.generate(PROMPTS, params, num_samples)
    assert len(_captured(graphed)) == 1
    eager = StaticCacheBackend(model, decode_path=decode_path, use_cuda_graph=False,
                               compact_below=0).generate(PROMPTS, params, num_samples)  # fmt: skip
    hf = HFGenerateBackend(model).generate(PROMPTS, params, num_samples)
    assert out.completion_ids == eager.completion_ids == hf.completion_ids
    assert out.finished == hf.finished
    assert graphed.generate(PROMPTS, params, num_samples).completion_ids == out.completion_ids
    assert len(_captured(graphed)) == 1  # replayed, not captured again


def test_graph_sampling_is_reproducible_and_logprobs_match_the_trainer(
    tiny_qwen2_model_dir: Path,
) -> None:
    model = _cuda_model(tiny_qwen2_model_dir)
    temperature = 0.8
    params = SamplingParams(max_new_tokens=16, temperature=temperature, top_p=0.95, seed=5,
                            return_logprobs=True)  # fmt: skip
    backend = StaticCacheBackend(model)
    first = backend.generate(PROMPTS, params, num_samples=4)
    second = backend.generate(PROMPTS, params, num_samples=4)
    assert first.completion_ids == second.completion_ids
    assert first.logprobs == second.logprobs
    sampled = backend.generate(
        PROMPTS, SamplingParams(max_new_tokens=16, temperature=temperature, seed=5,
                                return_logprobs=True), num_samples=2
    )  # fmt: skip
    assert sampled.logprobs is not None
    expected = logprob_helpers.trainer_layout_logprobs(model, sampled, PAD, temperature,
                                                       device="cuda")
    for row, logprobs in enumerate(sampled.logprobs):
        torch.testing.assert_close(
            torch.tensor(logprobs), expected[row, : len(logprobs)], rtol=0, atol=1e-4
        )


def test_graphs_follow_lora_weights_updated_in_place(tiny_model_dir: Path) -> None:
    policy = apply_lora(_cuda_model(tiny_model_dir))
    params = SamplingParams(max_new_tokens=12, greedy=True)
    backend = StaticCacheBackend(policy)
    before = backend.generate(PROMPTS, params).completion_ids
    with torch.no_grad():  # an optimizer step: in place, the recorded graph stays valid
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5, generator=torch.Generator("cuda").manual_seed(0))
    backend.update_weights(policy, version=1)
    after = backend.generate(PROMPTS, params)
    assert after.completion_ids != before
    expected = HFGenerateBackend(policy).generate(PROMPTS, params)
    assert after.completion_ids == expected.completion_ids
    assert len(_captured(backend)) == 1


def test_bfloat16_graph_decoding_equals_eager(tiny_qwen2_model_dir: Path) -> None:
    model = _cuda_model(tiny_qwen2_model_dir, dtype="bfloat16")
    params = SamplingParams(max_new_tokens=32, greedy=True, return_logprobs=True)
    graphed = StaticCacheBackend(model).generate(PROMPTS, params, num_samples=3)
    eager = StaticCacheBackend(
        model, use_cuda_graph=False, row_bucket=8, length_bucket=64, compact_below=0
    ).generate(PROMPTS, params, num_samples=3)
    # the same kernels on the same shapes: identical tokens and log-probs
    assert (graphed.completion_ids, graphed.logprobs) == (eager.completion_ids, eager.logprobs)
