"""The static backend prefills each prompt once per sub-batch and shares its KV cache with the
prompt's ``G`` rows: the same completions as the "hf" backend (which prefills every row), the
prefill work counted at the model's embedding, the sub-batch plan against a plain loop, and
log-probs, compaction and the graph path with ``num_samples > 1``."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import logprob_helpers
import mtgrpo.fast.static as static_module
from mtgrpo.fast.static import length_buckets
from mtgrpo.models import load_model
from mtgrpo.rollout import HFGenerateBackend, SamplingParams, StaticCacheBackend
from tolerance import assert_close_f32

PAD = 256  # the tiny tokenizer's pad id (<|endoftext|>)
# Ragged prompts (lengths 5, 12, 2, 4), so a sub-batch needs left padding; sorted by length
# they come in the order 2, 3, 0, 1.
PROMPTS = [[71, 100, 107, 107, 110], [257, 116, 114, 100, 113, 11, 1, 3, 9, 11, 80, 12],
           [42, 17], [12, 11, 12, 28]]  # fmt: skip
ARCHS = ["tiny_model_dir", "tiny_qwen2_model_dir"]
PATHS = ["llama_modules", "model_forward"]


def _model(path: Path, **options: object) -> torch.nn.Module:
    return load_model(path, for_training=False, **options)


def _greedy(max_new_tokens: int, **options: object) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, greedy=True, **options)


def _left_padded(prompts: list[list[int]]) -> torch.Tensor:
    width = max(map(len, prompts))
    return torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])


# -- agreement with the "hf" backend -----------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("decode_path", PATHS)
@pytest.mark.parametrize("max_batch_size", [None, 6, 2])
def test_greedy_with_num_samples_equals_hf(
    arch: str, decode_path: str, max_batch_size: int | None, request: pytest.FixtureRequest
) -> None:
    # None: one sub-batch of 4 prompts x 3 rows; 6: two prompts per sub-batch; 2: G = 3 > 2,
    # so groups are split across sub-batches.
    model = _model(request.getfixturevalue(arch))
    params = _greedy(20)
    expected = HFGenerateBackend(model).generate(PROMPTS, params, num_samples=3)
    backend = StaticCacheBackend(model, max_batch_size=max_batch_size, decode_path=decode_path)
    out = backend.generate(PROMPTS, params, num_samples=3)
    assert out.prompt_ids == [p for p in PROMPTS for _ in range(3)]
    assert (out.completion_ids, out.finished) == (expected.completion_ids, expected.finished)


@pytest.mark.parametrize("decode_path", PATHS)
def test_greedy_with_num_samples_equals_hf_with_lora(
    tiny_model_dir: Path, decode_path: str
) -> None:
    policy = logprob_helpers.active_lora(_model(tiny_model_dir))
    params = _greedy(16)
    backend = StaticCacheBackend(policy, decode_path=decode_path)
    got = backend.generate(PROMPTS, params, num_samples=4).completion_ids
    assert got == HFGenerateBackend(policy).generate(PROMPTS, params, num_samples=4).completion_ids
    with policy.disable_adapter():  # the adapter changed the output, so it really applied
        assert backend.generate(PROMPTS, params, num_samples=4).completion_ids != got


# -- prefill work, counted at the embedding ----------------------------------------------------


def _prefill_inputs(
    backend: StaticCacheBackend, monkeypatch: pytest.MonkeyPatch
) -> list[torch.Tensor]:
    """Record the ids the model's input embedding receives during prefills (a forward hook on
    the embedding; the decoder's ``prefill`` marks when a prefill is running)."""
    seen: list[torch.Tensor] = []
    prefilling = [0]
    decoder = backend.engine._decoder

    def marked(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def prefill(*args: object) -> torch.Tensor:
            prefilling[0] += 1
            try:
                return original(*args)
            finally:
                prefilling[0] -= 1
        return prefill

    def hook(_module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        if prefilling[0]:
            seen.append(inputs[0].clone())

    for name in ("prefill", "prefill_shared"):
        monkeypatch.setattr(decoder, name, marked(getattr(decoder, name)))
    backend.engine._lm.get_input_embeddings().register_forward_pre_hook(hook)
    return seen


# Expected prefill inputs, by hand from the rule (prompts sorted by length: 2, 3, 0, 1):
# G = 3 in one sub-batch: the 4 prompts once each (4 x 12 = 48 positions, not 12 x 12 = 144);
# max_batch_size 6: whole groups, 2 prompts per sub-batch: (2, 3) then (0, 1);
# max_batch_size 2 < G: rows 2,2 | 2,3 | 3,3 | 0,0 | 0,1 | 1,1, every prompt in two sub-batches;
# G = 1: every row its own prompt, all 4 in one prefill.
PREFILL_CASES = [
    (3, None, [[2, 3, 0, 1]]),
    (3, 6, [[2, 3], [0, 1]]),
    (3, 2, [[2], [2, 3], [3], [0], [0, 1], [1]]),
    (1, None, [[2, 3, 0, 1]]),
]


@pytest.mark.parametrize("decode_path", PATHS)
@pytest.mark.parametrize(("num_samples", "max_batch_size", "prefilled"), PREFILL_CASES)
def test_each_prompt_is_prefilled_once_per_sub_batch(
    tiny_model_dir: Path,
    decode_path: str,
    num_samples: int,
    max_batch_size: int | None,
    prefilled: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _model(tiny_model_dir)
    backend = StaticCacheBackend(model, max_batch_size=max_batch_size, decode_path=decode_path)
    seen = _prefill_inputs(backend, monkeypatch)
    out = backend.generate(PROMPTS, SamplingParams(max_new_tokens=5, seed=0), num_samples)
    assert len(out) == 4 * num_samples
    if decode_path == "model_forward":  # the model's forward: the prompts left-padded
        expected = [_left_padded([PROMPTS[p] for p in group]) for group in prefilled]
        assert [ids.tolist() for ids in seen] == [ids.tolist() for ids in expected]
    else:  # padding-free: one packed row of each prompt's tokens (they share no prefix)
        assert [ids.shape[0] for ids in seen] == [1] * len(prefilled)
        assert [sorted(ids.flatten().tolist()) for ids in seen] == [
            sorted(t for p in group for t in PROMPTS[p]) for group in prefilled]


@pytest.mark.parametrize(("decode_path", "expected"), [
    # the model's forward: 16 rows of width 25 with G = 8; fed as 128 separate prompts
    # (num_samples=1), 128 rows of width 25
    ("model_forward", [16 * 25, 128 * 25]),
    # padding-free: each distinct prompt's 10..25 tokens once, either way (repeated prompts
    # are found in the rows)
    ("llama_modules", [sum(range(10, 26))] * 2),
])
def test_prefill_positions_fall_by_the_group_size(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, decode_path: str,
    expected: list[int],
) -> None:
    # 16 prompts of 10..25 tokens, G = 8, one sub-batch.
    generator = random.Random(0)
    prompts = [[generator.randrange(3, 250) for _ in range(10 + i)] for i in range(16)]
    params = SamplingParams(max_new_tokens=3, seed=1)
    counts = []
    for rows, group in ((prompts, 8), ([p for p in prompts for _ in range(8)], 1)):
        backend = StaticCacheBackend(_model(tiny_model_dir), decode_path=decode_path)
        seen = _prefill_inputs(backend, monkeypatch)
        backend.generate(rows, params, num_samples=group)
        counts.append(sum(ids.numel() for ids in seen))
    assert counts == expected


# -- the sub-batch plan --------------------------------------------------------------------------


def _plan_by_loop(lengths: list[int], max_batch_size: int | None, group: int) -> list[list[int]]:
    """Plain loop: walk the prompts by length (ties by index) and their rows in order, and open
    a new sub-batch when the current one is full, or, when a whole group fits in a sub-batch,
    before a group that would not fit whole."""
    capacity = max_batch_size or len(lengths) * group
    batches: list[list[int]] = [[]]
    for prompt in sorted(range(len(lengths)), key=lambda b: (lengths[b], b)):
        for sample in range(group):
            full = len(batches[-1]) == capacity
            splits_group = sample == 0 and group <= capacity
            if full or (splits_group and len(batches[-1]) + group > capacity):
                batches.append([])
            batches[-1].append(prompt * group + sample)
    return batches


def test_length_buckets_keep_groups_whole_by_hand() -> None:
    lengths = [5, 12, 1, 4]  # sorted: prompts 2, 3, 0, 1
    assert length_buckets(lengths, None, 2) == [[4, 5, 6, 7, 0, 1, 2, 3]]
    # max_batch_size 5, G = 2: 5 rounded down to 4, two whole groups per sub-batch
    assert length_buckets(lengths, 5, 2) == [[4, 5, 6, 7], [0, 1, 2, 3]]
    # max_batch_size 3 < G = 4: cut every 3 rows, groups split
    assert length_buckets([2, 1], 3, 4) == [[4, 5, 6], [7, 0, 1], [2, 3]]


def test_length_buckets_equal_the_plain_loop_on_random_shapes() -> None:
    generator = random.Random(0)
    for _ in range(300):
        prompts, group = generator.randint(1, 9), generator.randint(1, 6)
        lengths = [generator.randint(1, 5) for _ in range(prompts)]
        max_batch_size = generator.choice([None, *range(1, 14)])
        plan = length_buckets(lengths, max_batch_size, group)
        assert plan == _plan_by_loop(lengths, max_batch_size, group)
        assert sorted(row for batch in plan for row in batch) == list(range(prompts * group))
        if max_batch_size is not None and group <= max_batch_size:
            kept_whole = max_batch_size - max_batch_size % group
            assert len(plan) == math.ceil(prompts * group / kept_whole)


# -- log-probs, compaction and the graph path with groups ---------------------------------------


@pytest.mark.parametrize("max_batch_size", [None, 6])
def test_logprobs_of_shared_prefills_equal_sequence_logprobs(
    tiny_qwen2_model_dir: Path, max_batch_size: int | None
) -> None:
    model = _model(tiny_qwen2_model_dir)
    temperature = 0.8
    params = SamplingParams(max_new_tokens=10, temperature=temperature, seed=2,
                            return_logprobs=True)  # fmt: skip
    out = StaticCacheBackend(model, max_batch_size=max_batch_size).generate(
        PROMPTS, params, num_samples=3
    )
    assert out.logprobs is not None
    expected = logprob_helpers.trainer_layout_logprobs(model, out, PAD, temperature)
    # KV-cached decoding from a shared prefill against one full forward: float32 rounding
    # through every layer (tests/tolerance.py); a row decoded against another group's prompt
    # or at the wrong position is off by more than 1e-2
    for row, logprobs in enumerate(out.logprobs):
        got = torch.tensor(logprobs, dtype=torch.float32)
        assert_close_f32(got, expected[row, : len(logprobs)], ulps=64)
    # the rows of a group were sampled independently from their shared prefill
    assert len({tuple(c) for c in out.completion_ids[:3]}) > 1


def test_seeded_groups_are_reproducible(tiny_model_dir: Path) -> None:
    backend = StaticCacheBackend(_model(tiny_model_dir), max_batch_size=6)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=9)
    first = backend.generate(PROMPTS, params, num_samples=3)
    assert backend.generate(PROMPTS, params, num_samples=3).completion_ids == first.completion_ids


@pytest.mark.parametrize("decode_path", PATHS)
def test_compaction_with_groups_keeps_the_results(tiny_model_dir: Path, decode_path: str) -> None:
    model = _model(tiny_model_dir)
    free = StaticCacheBackend(model).generate(PROMPTS, _greedy(16)).completion_ids
    stops = (free[2][3], free[0][6])  # end some groups early, so finished rows are dropped
    params = _greedy(16, stop_token_ids=stops, return_logprobs=True)
    options = {"decode_path": decode_path}
    reference = StaticCacheBackend(model, compact_below=0, **options).generate(PROMPTS, params, 2)
    out = StaticCacheBackend(model, **options).generate(PROMPTS, params, num_samples=2)
    assert min(out.completion_lengths) < 16 == max(out.completion_lengths)
    assert (out.completion_ids, out.finished) == (reference.completion_ids, reference.finished)
    # the same kernels on fewer rows (matmuls of another height may round another way)
    for got, want in zip(out.logprobs or [], reference.logprobs or [], strict=True):
        assert_close_f32(torch.tensor(got), torch.tensor(want), ulps=32)


class _StandInCapture:
    """Replaces ``capture_step`` on the CPU: runs the warm-up steps for real and returns the
    eager step as the "graph" (see test_static_backend.py)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, step: Callable[[], None], *, warmup_steps: int) -> Callable[[], None]:
        self.calls += 1
        for _ in range(warmup_steps):
            step()
        return step


@pytest.mark.parametrize("decode_path", PATHS)
def test_graph_path_decodes_all_rows_of_shared_prefills(
    tiny_model_dir: Path, decode_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture = _StandInCapture()
    monkeypatch.setattr(static_module, "_GRAPH_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(static_module, "capture_step", capture)
    model = _model(tiny_model_dir)
    params = _greedy(12)
    # 4 prompts x 3 rows = 12 rows in a 16-row bucket: 4 bucket-padding rows copy prompt 0
    backend = StaticCacheBackend(model, decode_path=decode_path)
    out = backend.generate(PROMPTS, params, num_samples=3)
    assert [slot.buffers.done.shape[0] for slot in backend.engine._slots.values()] == [16]
    expected = HFGenerateBackend(model).generate(PROMPTS, params, num_samples=3)
    assert out.completion_ids == expected.completion_ids
    assert backend.generate(PROMPTS, params, num_samples=3).completion_ids == out.completion_ids
    assert capture.calls == 1  # the decode step still runs on all 16 rows: one shape, one graph
