"""``max_memory_per_microbatch``: micro-batches sized from a memory budget. The saved-tensor
count is exact on hand-built graphs; the activation cost measured on a tiny Llama predicts what
a micro-batch planned under the budget saves, and keeps it within the budget; the trainer turns
the budget into a token budget before the first step (a budget that holds no row fails there);
bad values are refused by the configuration."""

from __future__ import annotations

import pytest
import torch
import trainer_helpers as common
import transformers

from mtgrpo import GRPOConfig, GRPOTrainer
from mtgrpo.policy import activation_cost, sequence_logprobs
from mtgrpo.policy.memory_budget import saved_bytes

VOCAB = 97


def test_saved_bytes_counts_each_saved_storage_once_and_leaves_out_weights():
    x = torch.randn(5, 7, requires_grad=True)
    assert saved_bytes(lambda: torch.exp(x), set()) == 5 * 7 * 4  # exp saves its result
    linear = torch.nn.Linear(7, 3)
    weights = {p.untyped_storage().data_ptr() for p in linear.parameters()}
    # a linear layer saves its input and its weight; the weight is held anyway
    assert saved_bytes(lambda: linear(x), weights) == 5 * 7 * 4
    y = torch.randn(5, 7, requires_grad=True)
    assert saved_bytes(lambda: x * y, set()) == 2 * 5 * 7 * 4  # both factors, once each
    assert saved_bytes(lambda: x * x, set()) == 5 * 7 * 4  # one storage saved twice
    with torch.no_grad():
        assert saved_bytes(lambda: torch.exp(x), set()) == 0


def tiny_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")).train()


def forward_on(model, rows: int, width: int):
    ids = torch.randint(VOCAB, (rows, width), generator=torch.Generator().manual_seed(rows))
    return sequence_logprobs(model, ids, torch.ones_like(ids), width // 2, temperature=1.0,
                             chunk_size=16)


def test_the_measured_cost_keeps_a_planned_micro_batch_within_the_budget():
    model = tiny_llama()
    width = 24
    cost = activation_cost(model, lambda tokens: forward_on(model, 1, tokens),
                           (width // 2, width), head_chunk=16, vocab=VOCAB)
    assert cost.per_token > 0
    weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    budget = int(cost.fixed + 6.5 * width * cost.per_token)
    tokens = cost.tokens_within(budget, width=width, name="budget")
    rows = tokens // width
    assert rows == 6  # 6.5 rows' worth of tokens: six whole rows of the longest width
    measured = saved_bytes(lambda: forward_on(model, rows, width), weights)
    assert cost.fixed + measured <= budget
    # the measurement is a prediction, not a bound picked loosely: a micro-batch of the
    # planned size saves what the slope says, to within 10 %
    assert measured == pytest.approx(rows * width * cost.per_token, rel=0.1)


def test_a_budget_below_one_row_names_what_a_row_needs():
    model = tiny_llama()
    cost = activation_cost(model, lambda tokens: forward_on(model, 1, tokens), (8, 16),
                           head_chunk=16, vocab=VOCAB)
    with pytest.raises(ValueError, match=r"max_memory_per_microbatch=0 MiB does not hold one "
                                         r"row of 16 tokens.*gradient_checkpointing"):
        cost.tokens_within(1024, width=16, name="max_memory_per_microbatch")


def _plans(trainer) -> list[int]:
    sizes: list[int] = []
    plan = trainer.updater._plan

    def recording(batch, rows):
        out = plan(batch, rows)
        sizes.append(len(out))
        return out

    trainer.updater._plan = recording
    return sizes


def test_the_trainer_sizes_micro_batches_from_the_budget(tiny_model_dir, tmp_path):
    def trainer(**budget):
        return GRPOTrainer(str(tiny_model_dir), [common.alpha_reward, common.beta_reward],
                           args=common.args(tmp_path / str(len(budget)), max_steps=1, **budget),
                           train_dataset=common.rows())

    rows_per_micro_batch = trainer()
    assert rows_per_micro_batch.updater.token_budget is None  # TRL's fixed row count
    small = trainer(max_memory_per_microbatch="6MiB")
    assert small.updater.token_budget > 0
    counts = _plans(small)
    small.train()
    # the budget holds a few rows of the tiny model's activations, not the whole batch
    assert max(counts) > 1
    width = small.args.max_prompt_length + small.args.max_completion_length
    assert small.updater.token_budget >= width  # at least one row of the longest width
    with pytest.raises(ValueError, match="does not hold one row"):
        trainer(max_memory_per_microbatch="1KiB")


@pytest.mark.parametrize(("value", "error", "message"), [
    ("2 gigs", ValueError, "is not a size"), (-1, ValueError, "positive number of bytes"),
    ("0GiB", ValueError, "more than 0 bytes"),
    (True, TypeError, "True .bool. is not a string or an integer"),
])
def test_bad_budgets_are_refused_by_the_configuration(value, error, message, tmp_path):
    with pytest.raises(error, match=message):
        GRPOConfig(output_dir=str(tmp_path), max_memory_per_microbatch=value)


def test_a_memory_budget_and_a_token_budget_together_are_refused(tmp_path):
    with pytest.raises(ValueError, match="set one of them"):
        GRPOConfig(output_dir=str(tmp_path), max_memory_per_microbatch="1GiB",
                   max_tokens_per_microbatch=4096)
    with pytest.raises(ValueError, match="fsdp='full_shard' is not supported yet"):
        GRPOConfig(output_dir=str(tmp_path), max_memory_per_microbatch="1GiB",
                   fsdp="full_shard")
