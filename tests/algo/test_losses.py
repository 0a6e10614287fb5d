"""The GRPO loss family: hand-derived values, a plain-loop reference, accumulation invariance."""

from __future__ import annotations

import math

import pytest
import torch
from loss_helpers import LN2, hand_example, trl_compute_loss

from mtgrpo.algo.losses import LossOptions, loss_value_needs_logps
from mtgrpo.policy import (
    LOSS_TYPES,
    LossNormalizer,
    PolicyBatch,
    combine_loss_outputs,
    per_sequence_objective,
    plan_micro_batches,
    policy_loss,
)
from tolerance import assert_close_f32

# Per-token losses L = -min(rho A, clip(rho, 0.8, 1.28) A) + 0.1 KL, KL = e^d - d - 1:
#   row 0: t0 -min(1.5, 1.28) + 0            = -1.28
#          t1 -1.1 + 0.1 (2 - ln 2 - 1)       = -1.1 + 0.1 (1 - ln 2)   = -1.0693147
#          t2 -1.0 + 0                        = -1.0
#   row 1: t0 -min(-1.0, -1.6) + 0.1 (1/2 + ln 2 - 1) = 1.6 + 0.1 (ln 2 - 0.5) = 1.6193147
#          t1 -min(-1.8, -1.8) + 0            = 1.8
# Total over the five kept tokens: (-1.28 - 1.1 - 1.0 + 1.6 + 1.8) + 0.1 ((1 - ln 2) +
# (ln 2 - 0.5)) = 0.02 + 0.05 = 0.07; the masked token (KL e^5 - 6) must not count.
ROW0 = [-1.28, -1.1 + 0.1 * (1 - LN2), -1.0]
ROW1 = [1.6 + 0.1 * (LN2 - 0.5), 1.8]
ROW0_MEAN = sum(ROW0) / 3  # -1.1164382
ROW1_MEAN = sum(ROW1) / 2  # 1.7096574
HAND_LOSSES = {
    "grpo": (ROW0_MEAN + ROW1_MEAN) / 2,  # mean of sequence means = 0.2966096
    "dapo": 0.07 / 5,  # token mean over 5 kept tokens = 0.014
    "dr_grpo": 0.07 / (2 * 4),  # sum / (N * max_completion_length 4) = 0.00875
    "bnpo": 0.07 / 5,  # one micro-batch: the local token mean
}


@pytest.mark.parametrize("loss_type", sorted(HAND_LOSSES))
def test_hand_derived_loss_and_statistics(loss_type: str) -> None:
    example = hand_example()
    normalizer = LossNormalizer.for_batch(example["completion_mask"], max_completion_length=4)
    out = policy_loss(
        example["logps"], example["advantages"], example["completion_mask"],
        old_logps=example["old_logps"], ref_logps=example["ref_logps"], loss_type=loss_type,
        epsilon_low=0.2, epsilon_high=0.28, beta=0.1, normalizer=normalizer,
    )  # fmt: skip
    assert float(out.loss) == pytest.approx(HAND_LOSSES[loss_type], abs=1e-12)
    torch.testing.assert_close(
        out.per_sequence_loss, torch.tensor([ROW0_MEAN, ROW1_MEAN], dtype=torch.float64)
    )
    # J_j = token mean of the clipped surrogate: (1.28 + 1.1 + 1.0) / 3 and (-1.6 - 1.8) / 2.
    torch.testing.assert_close(
        out.per_sequence_objective, torch.tensor([3.38 / 3, -1.7], dtype=torch.float64)
    )
    # Clipped: row 1 t0 (rho 0.5 < 0.8, A < 0) low; row 0 t0 (rho 1.5 > 1.28, A > 0) high.
    assert float(out.clip_low_fraction) == pytest.approx(1 / 5)
    assert float(out.clip_high_fraction) == pytest.approx(1 / 5)
    assert float(out.clip_region_fraction) == pytest.approx(2 / 5)
    assert float(out.mean_ratio) == pytest.approx((1.5 + 1.1 + 1.0 + 0.5 + 0.9) / 5)
    assert float(out.mean_kl) == pytest.approx(((1 - LN2) + (LN2 - 0.5)) / 5)  # 0.1
    assert float(out.num_tokens) == 5
    assert not out.per_sequence_loss.requires_grad


def test_hand_derived_gradient_of_the_token_mean_loss() -> None:
    # d L / d logp: clipped tokens carry no surrogate gradient; an unclipped one gives
    # -rho A; the k3 term gives beta (1 - e^d) with d = ref - logp. Token mean divides by 5.
    #   row 0: t0 clipped, d=0 -> 0;  t1 -1.1 + 0.1 (1 - 2) = -1.2;  t2 -1.0
    #   row 1: t0 clipped, 0.1 (1 - 1/2) = 0.05;  t1 -(0.9)(-2) = 1.8;  t2 masked -> 0
    example = hand_example()
    logps = example.pop("logps").requires_grad_(True)
    out = policy_loss(logps, loss_type="dapo", epsilon_high=0.28, beta=0.1, **_rest(example))
    out.loss.backward()
    expected = torch.tensor([[0.0, -1.2, -1.0], [0.05, 1.8, 0.0]], dtype=torch.float64) / 5
    torch.testing.assert_close(logps.grad, expected, rtol=0, atol=1e-12)


def _rest(example: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {
        "advantages": example["advantages"],
        "completion_mask": example["completion_mask"],
        "old_logps": example["old_logps"],
        "ref_logps": example["ref_logps"],
    }


def test_on_policy_ratio_is_one_with_the_policy_gradient() -> None:
    # No old_logps: rho = exp(logp - logp.detach()) = 1, d rho / d logp = 1, so the
    # gradient of the token-mean loss is -A_j / num_tokens at every kept token.
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    advantages = torch.tensor([0.5, -1.5])
    mask = torch.tensor([[1, 1], [1, 0]])
    out = policy_loss(logps, advantages, mask)
    assert float(out.loss.detach()) == pytest.approx(-(0.5 + 0.5 - 1.5) / 3)
    assert float(out.mean_ratio) == 1.0
    assert out.mean_kl is None
    out.loss.backward()
    expected = torch.tensor([[-0.5, -0.5], [1.5, 0.0]]) / 3
    # -A / 3 in float32, rounded in another order (a wrong normaliser is off by a third or more)
    assert_close_f32(logps.grad, expected, ulps=4)


def loop_reference(
    logps: list[list[float]],
    old: list[list[float]],
    ref: list[list[float]],
    advantages: list[float],
    mask: list[list[int]],
    *,
    loss_type: str,
    eps_low: float,
    eps_high: float,
    beta: float,
    max_len: int,
) -> float:
    """The loss, one token at a time in plain Python."""
    per_row: list[list[float]] = []
    for j, row in enumerate(logps):
        kept = []
        for t, logp in enumerate(row):
            if not mask[j][t]:
                continue
            ratio = math.exp(logp - old[j][t])
            clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
            surrogate = min(ratio * advantages[j], clipped * advantages[j])
            delta = ref[j][t] - logp
            kept.append(-surrogate + beta * (math.exp(delta) - delta - 1))
        per_row.append(kept)
    total = sum(sum(row) for row in per_row)
    tokens = sum(len(row) for row in per_row)
    if loss_type == "grpo":
        return sum(sum(row) / max(len(row), 1) for row in per_row) / len(per_row)
    if loss_type in ("dapo", "bnpo"):
        return total / max(tokens, 1)
    assert loss_type == "dr_grpo"
    return total / (len(per_row) * max_len)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo"])
def test_vectorised_loss_matches_the_loop_on_random_shapes(loss_type: str) -> None:
    generator = torch.Generator().manual_seed(21)
    for rows, length in [(1, 1), (3, 7), (8, 4), (5, 12)]:
        logps = -torch.rand(rows, length, generator=generator, dtype=torch.float64) * 4
        old = logps + 0.4 * torch.randn(rows, length, generator=generator, dtype=torch.float64)
        ref = logps + 0.4 * torch.randn(rows, length, generator=generator, dtype=torch.float64)
        advantages = torch.randn(rows, generator=generator, dtype=torch.float64)
        lengths = torch.randint(0, length + 1, (rows,), generator=generator)
        mask = (torch.arange(length) < lengths[:, None]).long()
        out = policy_loss(
            logps, advantages, mask, old_logps=old, ref_logps=ref, loss_type=loss_type,
            epsilon_low=0.2, epsilon_high=0.28, beta=0.04,
            normalizer=LossNormalizer.for_batch(mask, max_completion_length=length + 3),
        )  # fmt: skip
        expected = loop_reference(
            logps.tolist(), old.tolist(), ref.tolist(), advantages.tolist(), mask.tolist(),
            loss_type=loss_type, eps_low=0.2, eps_high=0.28, beta=0.04, max_len=length + 3,
        )  # fmt: skip
        assert float(out.loss) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_beta_zero_needs_no_reference_and_matches_a_zero_kl_reference() -> None:
    example = hand_example()
    without = policy_loss(
        example["logps"], example["advantages"], example["completion_mask"],
        old_logps=example["old_logps"], epsilon_high=0.28,
    )  # fmt: skip
    with_ref = policy_loss(beta=0.0, epsilon_high=0.28, logps=example["logps"], **_rest(example))
    assert float(without.loss) == pytest.approx(float(with_ref.loss), abs=1e-15)
    assert float(without.loss) == pytest.approx((-1.28 - 1.1 - 1.0 + 1.6 + 1.8) / 5)
    assert without.mean_kl is None
    assert float(with_ref.mean_kl) == pytest.approx(0.1)  # reported although beta = 0


# --- TRL 1.16 parity --------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_matches_trl_compute_loss(loss_type: str, beta: float) -> None:
    generator = torch.Generator().manual_seed(31)
    logps = -torch.rand(6, 9, generator=generator) * 3
    old = logps + 0.3 * torch.randn(6, 9, generator=generator)
    ref = logps + 0.3 * torch.randn(6, 9, generator=generator)
    advantages = torch.randn(6, generator=generator)
    mask = (torch.arange(9) < torch.tensor([9, 3, 7, 1, 9, 5])[:, None]).long()
    expected, metrics = trl_compute_loss(
        logps, old, ref if beta else None, advantages, mask,
        loss_type=loss_type, eps_low=0.2, eps_high=0.28, beta=beta, max_len=12,
    )  # fmt: skip
    out = policy_loss(
        logps, advantages, mask, old_logps=old, ref_logps=ref if beta else None,
        loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.28, beta=beta,
        normalizer=LossNormalizer.for_batch(mask, max_completion_length=12),
    )  # fmt: skip
    # Two float32 implementations (ours masks and sums in another order than TRL's) over 54
    # tokens of O(1) terms: a few roundings each. A wrong clip bound, normaliser or KL term
    # moves the loss by more than 1e-3.
    assert_close_f32(float(out.loss), float(expected), ulps=16)
    assert float(out.clip_low_fraction) == pytest.approx(metrics["clip_ratio/low_mean"][0])
    assert float(out.clip_high_fraction) == pytest.approx(metrics["clip_ratio/high_mean"][0])
    assert float(out.clip_region_fraction) == pytest.approx(metrics["clip_ratio/region_mean"][0])
    assert metrics["clip_ratio/region_mean"][0] > 0  # the example exercises clipping
    if beta:
        assert_close_f32(float(out.mean_kl), metrics["kl"][0], ulps=16)


# --- micro-batching and gradient accumulation -----------------------------------------------


def random_policy_batch(seed: int, rows: int = 9, width: int = 8) -> PolicyBatch:
    generator = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(1, 5, (rows,), generator=generator)
    completion_lengths = torch.randint(0, width + 1, (rows,), generator=generator)
    completion_lengths[0] = width  # the batch's width is reached by some row
    prompt_mask = (torch.arange(4).flip(0) < prompt_lengths[:, None]).long()
    completion_mask = (torch.arange(width) < completion_lengths[:, None]).long()
    logps = -torch.rand(rows, width, generator=generator, dtype=torch.float64) * 3
    return PolicyBatch(
        prompt_ids=torch.randint(0, 50, (rows, 4), generator=generator) * prompt_mask,
        prompt_mask=prompt_mask,
        completion_ids=torch.randint(0, 50, (rows, width), generator=generator),
        completion_mask=completion_mask,
        advantages=torch.randn(rows, generator=generator, dtype=torch.float64),
        old_logps=logps + 0.3 * torch.randn(rows, width, generator=generator, dtype=torch.float64),
        ref_logps=logps + 0.3 * torch.randn(rows, width, generator=generator, dtype=torch.float64),
    )


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_micro_batch_losses_sum_to_the_full_batch_loss_and_gradient(loss_type: str) -> None:
    batch = random_policy_batch(seed=41)
    params = -torch.rand(batch.completion_mask.shape, dtype=torch.float64) * 3
    normalizer = LossNormalizer.for_batch(batch.completion_mask, max_completion_length=10)
    options = {"loss_type": loss_type, "epsilon_high": 0.28, "beta": 0.04, "normalizer": normalizer}

    full_logps = params.clone().requires_grad_(True)
    full = policy_loss(
        full_logps, batch.advantages, batch.completion_mask,
        old_logps=batch.old_logps, ref_logps=batch.ref_logps, **options,
    )  # fmt: skip
    full.loss.backward()

    plan = plan_micro_batches(batch.lengths(), max_tokens_per_micro_batch=24)
    assert len(plan) > 2  # the split is real
    accumulated = params.clone().requires_grad_(True)
    total, parts = 0.0, []
    for rows in plan:
        part = batch.select(rows)
        part_logps = accumulated[rows][:, : part.completion_length]  # trimmed like the batch
        out = policy_loss(
            part_logps, part.advantages, part.completion_mask,
            old_logps=part.old_logps, ref_logps=part.ref_logps, **options,
        )  # fmt: skip
        out.loss.backward()
        total += float(out.loss.detach())
        parts.append(out)
    assert total == pytest.approx(float(full.loss.detach()), rel=1e-12)
    torch.testing.assert_close(accumulated.grad, full_logps.grad, rtol=0, atol=1e-14)
    merged = combine_loss_outputs(parts, plan, batch.num_rows)
    torch.testing.assert_close(merged.per_sequence_loss, full.per_sequence_loss)
    torch.testing.assert_close(merged.per_sequence_objective, full.per_sequence_objective)
    for field in ("clip_low_fraction", "clip_high_fraction", "mean_ratio", "mean_kl", "loss"):
        assert float(getattr(merged, field)) == pytest.approx(float(getattr(full, field).detach()))


def test_bnpo_is_the_mean_of_micro_batch_token_means() -> None:
    # TRL's bnpo normalises by the local token count: with micro-batches of 2 and 6 tokens
    # it is (mean_1 + mean_2) / 2, not the batch token mean (that is dapo).
    logps = torch.zeros(2, 6, dtype=torch.float64)
    advantages = torch.tensor([1.0, 3.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    normalizer = LossNormalizer(num_sequences=2, num_tokens=8, num_micro_batches=2)
    losses = [
        float(policy_loss(logps[[j]], advantages[[j]], mask[[j]], loss_type=loss_type,
                          normalizer=normalizer).loss)
        for j in range(2)
        for loss_type in ("bnpo", "dapo")
    ]  # fmt: skip
    bnpo_total, dapo_total = losses[0] + losses[2], losses[1] + losses[3]
    assert bnpo_total == pytest.approx((-1.0 - 3.0) / 2)  # (mean -1 + mean -3) / 2
    assert dapo_total == pytest.approx((-1.0 * 2 - 3.0 * 6) / 8)  # -2.5


def test_per_sequence_objective_before_and_after_an_update() -> None:
    # Before the update rho = 1, so J_j = A_j; after it, rho = exp(new - old) per token.
    old = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    advantages = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    before = per_sequence_objective(old, advantages, mask)
    torch.testing.assert_close(before, advantages)
    new = old + torch.log(torch.tensor([[1.1, 1.5, 9.0], [0.7, 1.0, 1.2]]))
    after = per_sequence_objective(new, advantages, mask, old_logps=old, epsilon_high=0.28)
    # row 0 (A=2): min(2.2, 2.2)=2.2, min(3.0, 2.56)=2.56; mean 2.38 (third token masked)
    # row 1 (A=-1): min(-0.7, -0.8)=-0.8, -1.0, min(-1.2, -1.2)=-1.2; mean -1.0
    torch.testing.assert_close(after, torch.tensor([2.38, -1.0]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beta": 0.1}, r"beta=0.1 > 0 needs ref_logps"),
        ({"loss_type": "ppo"}, r"unknown loss type 'ppo'; valid names: bnpo, cispo, dapo, dr_grpo"),
        ({"loss_type": "dr_grpo"}, "divides by the constant max_completion_length"),
        ({"epsilon_low": 1.0}, r"epsilon_low must be in \[0, 1\)"),
        ({"beta": -1.0}, "beta .* must be >= 0"),
        ({"old_logps": torch.zeros(2, 4)}, r"old_logps must have the shape of logps \(2, 3\)"),
        ({"advantages": torch.zeros(2, 1)}, r"advantages must be \[n\] = \[2\]"),
    ],
)
def test_policy_loss_input_errors(kwargs: dict, message: str) -> None:
    arguments = {
        "logps": torch.zeros(2, 3),
        "advantages": torch.zeros(2),
        "completion_mask": torch.ones(2, 3),
    }
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        policy_loss(**arguments)


def test_loss_type_aliases_follow_the_algorithm_reference() -> None:
    assert LOSS_TYPES.canonical("token_mean") == "dapo"
    assert LOSS_TYPES.canonical("sequence_mean") == "grpo"


def test_normalizer_validation_and_combine_errors() -> None:
    with pytest.raises(ValueError, match="num_sequences must be > 0"):
        LossNormalizer(num_sequences=0, num_tokens=3)
    assert LossNormalizer(num_sequences=0.5, num_tokens=3).num_sequences == 0.5  # a DP share
    out = policy_loss(torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"must cover rows 0\.\.2 exactly once"):
        combine_loss_outputs([out], [[0, 1]], num_rows=3)


# At ratio 1 (old = logp detached) the value of every clipped and SAPO loss is a function of
# the advantages and the mask alone: with A = (1, -2) and rows of 3 and 2 tokens the clipped
# surrogate is -A per token, so "dapo" = (3 * -1 + 2 * 2) / 5 = 0.2 whatever logp is.
@pytest.mark.parametrize("loss_type", sorted(LOSS_TYPES.names()))
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("options", [
    {}, {"importance_sampling_level": "sequence"}, {"delta": 1.5}, {"delta": 0.5},
    {"off_policy_threshold": 0.1}, {"off_policy_threshold": -0.1},
    {"use_bias_correction_kl": True}, {"sapo_temperature_pos": 2.0, "entropy_coef": 0.3},
], ids=["token", "sequence", "delta", "delta_below_1", "off_policy", "off_policy_negative",
        "bias_corrected_kl", "sapo_temperature_entropy"])
def test_loss_value_at_ratio_one_needs_logps_only_where_declared(loss_type, beta, options):
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    advantages = torch.tensor([1.0, -2.0])
    ref = -torch.rand(2, 3) * 3
    normalizer = LossNormalizer.for_batch(mask.bool(), max_completion_length=4)

    def value(logps):
        return float(policy_loss(logps, advantages, mask, ref_logps=ref, loss_type=loss_type,
                                 beta=beta, normalizer=normalizer,
                                 options=LossOptions(**options)).loss)

    at_zero, at_random = value(torch.zeros(2, 3)), value(-torch.rand(2, 3) * 5 - 0.1)
    if loss_value_needs_logps(loss_type, beta):
        assert at_zero != at_random  # the shortcut would change the number
    else:
        assert at_zero == at_random  # exactly: the evaluation loss may skip the forward
    if loss_type == "dapo" and beta == 0.0 and options in ({}, {"delta": 1.5}):
        assert at_zero == pytest.approx(0.2, rel=1e-6)
    if loss_type == "dapo" and beta == 0.0 and options == {"off_policy_threshold": -0.1}:
        assert at_zero == pytest.approx(-0.6, rel=1e-6)  # the A < 0 row dropped: -3 / 5


def test_loss_value_needs_logps_for_kl_cispo_and_vespo_only():
    assert not loss_value_needs_logps("dapo")
    assert not loss_value_needs_logps("token_mean")  # an alias resolves to its loss
    assert not loss_value_needs_logps("sapo")
    assert loss_value_needs_logps("dapo", beta=0.04)
    assert loss_value_needs_logps("cispo")
    assert loss_value_needs_logps("vespo")
