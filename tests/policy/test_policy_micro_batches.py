"""Micro-batch planning and slicing; accumulated gradients through a real model."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from mtgrpo.policy import (
    LossNormalizer,
    PolicyBatch,
    plan_micro_batches,
    policy_loss,
    sequence_logprobs,
)
from tolerance import assert_close_f32


def padded_width(lengths: list, rows: list[int]) -> int:
    if isinstance(lengths[0], int):
        return max(lengths[row] for row in rows)
    return max(lengths[row][0] for row in rows) + max(lengths[row][1] for row in rows)


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=0, max_size=30),
    budget=st.integers(1, 120),
    max_rows=st.one_of(st.none(), st.integers(1, 6)),
)
def test_plan_is_a_partition_within_budget(
    lengths: list[int], budget: int, max_rows: int | None
) -> None:
    plan = plan_micro_batches(lengths, budget, max_rows)
    assert sorted(row for rows in plan for row in rows) == list(range(len(lengths)))
    for rows in plan:
        assert rows == sorted(rows)
        if max_rows is not None:
            assert len(rows) <= max_rows
        # Over budget only as a lone row that is itself longer than the budget.
        if len(rows) * padded_width(lengths, rows) > budget:
            assert len(rows) == 1
            assert lengths[rows[0]] > budget
    assert plan == plan_micro_batches(list(lengths), budget, max_rows)  # deterministic


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 20), st.integers(0, 20)), min_size=1, max_size=25),
    budget=st.integers(1, 150),
)
def test_two_part_lengths_budget_the_trimmed_width(
    lengths: list[tuple[int, int]], budget: int
) -> None:
    plan = plan_micro_batches(lengths, budget)
    assert sorted(row for rows in plan for row in rows) == list(range(len(lengths)))
    for rows in plan:
        if len(rows) * padded_width(lengths, rows) > budget:
            assert len(rows) == 1


def test_hand_plan_sorts_by_length_and_packs_greedily() -> None:
    # Longest first: 9 (alone: 2 x 9 > 16), then 5, 5, 4 -> 3 x 5 = 15 <= 16, adding 2
    # would give 4 x 5 = 20 > 16; then 2, 1 -> 2 x 2 = 4.
    lengths = [5, 9, 2, 5, 1, 4]
    assert plan_micro_batches(lengths, 16) == [[1], [0, 3, 5], [2, 4]]
    # A row longer than the whole budget gets a micro-batch of its own.
    assert plan_micro_batches([3, 50, 3], 10) == [[1], [0, 2]]
    # max_rows caps the rows even when the budget would allow more.
    assert plan_micro_batches([1, 1, 1, 1, 1], 100, max_rows=2) == [[0, 1], [2, 3], [4]]
    assert plan_micro_batches([], 10) == []


def test_two_part_widths_add_the_longest_prompt_and_the_longest_completion() -> None:
    # Totals 10 and 10, but together the padded width is max(8, 2) + max(2, 8) = 16:
    # 2 x 16 = 32 > 24, so they must not share a micro-batch although 2 x 10 = 20 would fit.
    assert plan_micro_batches([[8, 2], [2, 8]], 24) == [[0], [1]]
    assert plan_micro_batches([[8, 2], [7, 3]], 24) == [[0, 1]]  # width 8 + 3 = 11, 22 <= 24


def test_max_padding_buckets_rows_of_similar_length() -> None:
    lengths = [100, 90, 80, 70, 60, 50, 40, 10]
    # off (1.0): one micro-batch of 8 rows, 8 x 100 = 800 padded tokens for 500 real ones
    assert plan_micro_batches(lengths, 10_000) == [list(range(8))]
    # 0.25: a row joins while its own tokens fill >= 75 % of the width:
    # 100, 90, 80 | 70, 60 (60 >= 52.5) | 50, 40 | 10 (10 < 30)
    plan = plan_micro_batches(lengths, 10_000, max_padding=0.25)
    assert plan == [[0, 1, 2], [3, 4], [5, 6], [7]]
    assert sum(len(rows) * padded_width(lengths, rows) for rows in plan) == 300 + 140 + 100 + 10
    # the padding bound works with the row cap and on [N, 2] widths (prompt + completion)
    assert plan_micro_batches([8, 8, 8, 7], 100, max_rows=2, max_padding=0.25) == [[0, 1], [2, 3]]
    assert plan_micro_batches([[4, 6], [1, 9], [4, 2]], 100, max_padding=0.25) == [[0, 1], [2]]


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    max_padding=st.floats(0.05, 1.0),
)
def test_max_padding_bounds_every_rows_padding(lengths: list[int], max_padding: float) -> None:
    plan = plan_micro_batches(lengths, 10**6, max_padding=max_padding)
    assert sorted(row for rows in plan for row in rows) == list(range(len(lengths)))
    for rows in plan:
        width = padded_width(lengths, rows)
        assert all(lengths[row] >= (1 - max_padding) * width for row in rows)
    # never more tokens computed than without bucketing
    assert sum(len(rows) * padded_width(lengths, rows) for rows in plan) <= len(lengths) * max(
        lengths)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (([1, 2], 10, None, 0.0), ValueError, r"max_padding must be a fraction in \(0, 1\]"),
        (([1, 2], 10, None, 1.5), ValueError, "max_padding must be a fraction"),
        (([1, 2], 0), ValueError, "max_tokens_per_micro_batch must be a positive int"),
        (([1, 2], 10, 0), ValueError, "max_rows must be a positive int or None"),
        (([1, -2], 10), ValueError, "lengths must be >= 0"),
        (([1.5, 2.0], 10), TypeError, "lengths must be integers"),
        (([[1, 2, 3]], 10), ValueError, r"lengths must be \[N\] .* or \[N, 2\]"),
    ],
)
def test_plan_input_errors(args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        plan_micro_batches(*args)


def make_batch() -> PolicyBatch:
    """Three rows, prompts padded on the left to 4, completions on the right to 5."""
    prompt_mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]])
    completion_mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    return PolicyBatch(
        prompt_ids=torch.arange(12).reshape(3, 4) * prompt_mask,
        prompt_mask=prompt_mask,
        completion_ids=torch.arange(100, 115).reshape(3, 5),
        completion_mask=completion_mask,
        advantages=torch.tensor([0.5, -1.0, 2.0]),
        old_logps=-torch.arange(15, dtype=torch.float32).reshape(3, 5),
    )


def test_policy_batch_lengths_and_concatenation() -> None:
    batch = make_batch()
    torch.testing.assert_close(batch.lengths(), torch.tensor([[2, 2], [4, 5], [1, 1]]))
    assert batch.input_ids.shape == (3, 9)
    assert batch.attention_mask[2].tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 0]
    assert batch.completion_length == 5


def test_select_trims_columns_that_are_padding_for_every_selected_row() -> None:
    batch = make_batch()
    part = batch.select([2, 0])
    # Prompts: longest of rows 2 and 0 is 2 tokens -> keep the last 2 prompt columns.
    assert part.prompt_ids.tolist() == [[0, 11], [2, 3]]
    assert part.prompt_mask.tolist() == [[0, 1], [1, 1]]
    # Completions: longest is 2 tokens -> keep the first 2 completion columns.
    assert part.completion_ids.tolist() == [[110, 111], [100, 101]]
    assert part.completion_mask.tolist() == [[1, 0], [1, 1]]
    assert part.old_logps is not None
    assert part.old_logps.tolist() == [[-10.0, -11.0], [-0.0, -1.0]]
    assert part.ref_logps is None
    assert part.advantages.tolist() == [2.0, 0.5]
    # The full-width row keeps everything.
    assert batch.select([1]).input_ids.shape == (1, 9)


def test_select_keeps_one_completion_column_when_all_are_padding() -> None:
    batch = make_batch()
    empty = PolicyBatch(
        prompt_ids=batch.prompt_ids,
        prompt_mask=batch.prompt_mask,
        completion_ids=batch.completion_ids,
        completion_mask=torch.zeros_like(batch.completion_mask),
        advantages=batch.advantages,
    )
    assert empty.select([0, 2]).completion_ids.shape == (2, 1)


def test_policy_batch_errors() -> None:
    batch = make_batch()
    with pytest.raises(ValueError, match="prompts must be left-padded"):
        PolicyBatch(
            prompt_ids=batch.prompt_ids,
            prompt_mask=batch.prompt_mask.flip(1),
            completion_ids=batch.completion_ids,
            completion_mask=batch.completion_mask,
            advantages=batch.advantages,
        )
    with pytest.raises(ValueError, match=r"advantages must be \[N\] = \[3\]"):
        PolicyBatch(
            prompt_ids=batch.prompt_ids,
            prompt_mask=batch.prompt_mask,
            completion_ids=batch.completion_ids,
            completion_mask=batch.completion_mask,
            advantages=torch.zeros(2),
        )
    with pytest.raises(ValueError, match=r"old_logps must be \[N, L\] = \[3, 5\]"):
        PolicyBatch(
            prompt_ids=batch.prompt_ids,
            prompt_mask=batch.prompt_mask,
            completion_ids=batch.completion_ids,
            completion_mask=batch.completion_mask,
            advantages=batch.advantages,
            old_logps=torch.zeros(3, 4),
        )
    with pytest.raises(ValueError, match=r"row indices must be in \[0, 2\]"):
        batch.select([0, 3])
    with pytest.raises(ValueError, match="needs at least one row"):
        batch.select([])


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_trimmed_micro_batches_reproduce_the_full_batch_gradient_of_a_model(
    loss_type: str,
) -> None:
    """End to end: score each trimmed micro-batch with the model, accumulate, compare."""
    torch.manual_seed(51)
    config = LlamaConfig(
        vocab_size=120, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(52)
    rows, prompt_width, width = 6, 5, 7
    prompt_lengths = torch.tensor([5, 2, 3, 1, 4, 2])
    completion_lengths = torch.tensor([7, 1, 4, 6, 2, 3])
    prompt_mask = (torch.arange(prompt_width).flip(0) < prompt_lengths[:, None]).long()
    completion_mask = (torch.arange(width) < completion_lengths[:, None]).long()
    batch = PolicyBatch(
        prompt_ids=torch.randint(1, 120, (rows, prompt_width), generator=generator) * prompt_mask,
        prompt_mask=prompt_mask,
        completion_ids=torch.randint(1, 120, (rows, width), generator=generator) * completion_mask,
        completion_mask=completion_mask,
        advantages=torch.randn(rows, generator=generator),
    )
    normalizer = LossNormalizer.for_batch(batch.completion_mask, max_completion_length=8)

    def loss_of(part: PolicyBatch) -> torch.Tensor:
        out = sequence_logprobs(
            model, part.input_ids, part.attention_mask, part.completion_length,
            temperature=0.9, chunk_size=4,
        )  # fmt: skip
        return policy_loss(
            out.logps, part.advantages, part.completion_mask,
            loss_type=loss_type, normalizer=normalizer,
        ).loss  # fmt: skip

    model.zero_grad()
    full_loss = loss_of(batch)
    full_loss.backward()
    full_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    plan = plan_micro_batches(batch.lengths(), max_tokens_per_micro_batch=20)
    assert len(plan) >= 3
    accumulated = 0.0
    for rows_of_part in plan:
        part_loss = loss_of(batch.select(rows_of_part))
        part_loss.backward()
        accumulated += float(part_loss.detach())
    # Float32 rounding only (tests/tolerance.py): trimmed micro-batches run other matmul and
    # attention shapes, and the loss and each gradient are summed in another order. A micro-
    # batch normalised by its own token count, or a row scored twice, changes the loss by more
    # than 1e-2 and whole gradient rows by a multiple of their size.
    assert_close_f32(accumulated, float(full_loss.detach()), ulps=16)
    for name, param in model.named_parameters():
        assert_close_f32(param.grad, full_grads[name], ulps=64, msg=name)
