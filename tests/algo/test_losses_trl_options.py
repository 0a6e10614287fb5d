"""TRL 1.16's loss types and options: hand-derived values, and TRL's own loss code on the same
tensors (``GRPOTrainer._compute_loss`` run through the namespace of ``trl_compute_loss``)."""

from __future__ import annotations

import math

import pytest
import torch
from loss_helpers import LN2, hand_example, trl_compute_loss

from mtgrpo.algo.losses import LossOptions
from mtgrpo.algo.token_weights import (
    AdaptiveEntropy,
    entropy_threshold,
    gamma_weights,
    high_entropy_mask,
    off_policy_mask,
)
from mtgrpo.policy import LossNormalizer, policy_loss
from tolerance import f32_atol


def _hand(loss_type: str, beta: float = 0.0, epsilon_high: float = 0.28, **options):
    example = hand_example()
    return policy_loss(
        example["logps"], example["advantages"], example["completion_mask"],
        old_logps=example["old_logps"], ref_logps=example["ref_logps"], loss_type=loss_type,
        epsilon_low=0.2, epsilon_high=epsilon_high, beta=beta,
        normalizer=LossNormalizer.for_batch(example["completion_mask"], max_completion_length=4),
        options=LossOptions(**options),
    )  # fmt: skip


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# The hand example (tests/algo/test_losses.py): row 0 A = +1, logps (-1, -2, -0.5),
# ratios (1.5, 1.1, 1.0); row 1 A = -2, logps (-1.5, -0.7), ratios (0.5, 0.9); its third
# token (ratio 2.0) is padding.


def test_cispo_clips_the_detached_importance_weight() -> None:
    # L = -min(rho, cap) A logp. Cap 5: row 0: 1.5, 2.2, 0.5; row 1: -1.5, -1.26 (sum 1.44).
    assert float(_hand("cispo", epsilon_high=5.0).loss) == pytest.approx(1.44 / 5, abs=1e-12)
    # Cap 1.2: row 0's first weight 1.5 -> 1.2, so its term is 1.2: sum 1.14.
    out = _hand("cispo", epsilon_high=1.2)
    assert float(out.loss) == pytest.approx(1.14 / 5, abs=1e-12)
    assert float(out.clip_high_fraction) == pytest.approx(1 / 5)  # rho 1.5 > 1.2, A > 0


def test_sapo_soft_gate_with_its_two_temperatures() -> None:
    # L = -sigmoid(tau (rho - 1)) 4 / tau A; tau = 1 for A > 0, 1.05 otherwise; sequence mean.
    row0 = [-_sigmoid(r - 1) * 4 for r in (1.5, 1.1, 1.0)]
    row1 = [_sigmoid(1.05 * (r - 1)) * 4 / 1.05 * 2 for r in (0.5, 0.9)]
    expected = (sum(row0) / 3 + sum(row1) / 2) / 2
    assert float(_hand("sapo").loss) == pytest.approx(expected, abs=1e-12)
    # By hand: row 0 -4 (0.6224593 + 0.5249792 + 0.5) / 3 = -2.1965847, row 1
    # 8 / 1.05 (0.3716843 + 0.4737744) / 2 = 3.2207950; their mean 0.5121052 (7 digits).
    assert expected == pytest.approx(0.5121037, abs=5e-6)
    hotter = _hand("sapo", sapo_temperature_neg=2.0)
    row1_hot = [_sigmoid(2.0 * (r - 1)) * 4 / 2.0 * 2 for r in (0.5, 0.9)]
    assert float(hotter.loss) == pytest.approx((sum(row0) / 3 + sum(row1_hot) / 2) / 2)


def test_gspo_uses_one_ratio_per_sequence() -> None:
    # rho_0 = (1.5 * 1.1 * 1.0)^(1/3) = 1.18155 (inside the clip range): L = -1.18155 per token.
    # rho_1 = (0.5 * 0.9)^(1/2) = 0.67082 < 0.8 with A = -2: L = -min(-1.34164, -1.6) = 1.6.
    rho0, rho1 = 1.65 ** (1 / 3), 0.45**0.5
    out = _hand("grpo", importance_sampling_level="sequence")
    assert float(out.loss) == pytest.approx((-rho0 + 1.6) / 2, abs=1e-12)
    # With one ratio per sequence, TRL counts clipped sequences: row 1 of 2.
    assert float(out.clip_low_fraction) == pytest.approx(1 / 2)
    assert rho1 < 0.8


def test_luspo_weights_each_sequence_by_its_length() -> None:
    # sum over the five kept tokens / N rows: 0.07 / 2 with the KL term of the hand example.
    assert float(_hand("luspo", beta=0.1).loss) == pytest.approx(0.07 / 2, abs=1e-12)


def test_vespo_gamma_weights() -> None:
    # phi(w) = exp(lambda + k ln w - lambda w): row 0 (k 2, lambda 3) w = 1.65; row 1 (k 3,
    # lambda 2) w = 0.45. L = -phi A logp, token mean over 5.
    phi0 = math.exp(3 + 2 * math.log(1.65) - 3 * 1.65)
    phi1 = math.exp(2 + 3 * math.log(0.45) - 2 * 0.45)
    total = phi0 * (1 + 2 + 0.5) + 2 * phi1 * (-1.5 - 0.7)
    assert float(_hand("vespo").loss) == pytest.approx(total / 5, abs=1e-12)
    example = hand_example()
    weights = gamma_weights(example["advantages"], example["logps"] - example["old_logps"],
                            example["completion_mask"])
    torch.testing.assert_close(weights, torch.tensor([phi0, phi1], dtype=torch.float64))
    assert float(gamma_weights(torch.ones(1), torch.zeros(1, 3), torch.ones(1, 3))) == 1.0


def test_two_sided_clipping_caps_the_ratio_for_negative_advantages() -> None:
    logps = torch.tensor([[-1.0]], dtype=torch.float64)
    old = logps - math.log(3.0)  # rho = 3
    args = {"old_logps": old, "epsilon_high": 0.28}
    plain = policy_loss(logps, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 1), **args)
    capped = policy_loss(logps, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 1),
                         options=LossOptions(delta=2.0), **args)
    assert float(plain.loss) == pytest.approx(3.0)  # -min(-3, -1.28)
    assert float(capped.loss) == pytest.approx(2.0)  # -min(-2, -1.28)


def test_bias_corrected_kl_is_weighted_by_the_ratio() -> None:
    # The KL terms sit at row 0 t1 (rho 1.1) and row 1 t0 (rho 0.5): 0.1 (1 - ln 2) 1.1 and
    # 0.1 (ln 2 - 0.5) 0.5, plus the surrogate sum 0.02.
    expected = 0.02 + 0.1 * ((1 - LN2) * 1.1 + (LN2 - 0.5) * 0.5)
    out = _hand("dapo", beta=0.1, use_bias_correction_kl=True)
    assert float(out.loss) == pytest.approx(expected / 5, abs=1e-12)


def test_off_policy_mask_drops_negative_advantage_rows_that_drifted() -> None:
    example = hand_example()
    # Row 1 (A < 0): mean KL = mean(ln 2, -ln 0.9) = 0.39925 > 0.3: dropped; row 0 (A > 0) kept.
    keep = off_policy_mask(example["advantages"], example["logps"], example["old_logps"],
                           example["completion_mask"], 0.3)
    assert keep.tolist() == [True, False]
    assert off_policy_mask(example["advantages"], example["logps"], example["old_logps"],
                           example["completion_mask"], 0.4).tolist() == [True, True]
    out = _hand("dapo", off_policy_threshold=0.3)
    assert float(out.loss) == pytest.approx((-1.28 - 1.1 - 1.0) / 5, abs=1e-12)


def test_high_entropy_mask_keeps_the_top_quantile() -> None:
    # TRL's example: 10 real tokens; top 20 % = the two highest real entropies (0.9, 1.0).
    entropies = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    threshold = entropy_threshold(entropies[mask.bool()], 0.8)
    keep = high_entropy_mask(entropies, mask, threshold)
    assert keep.long().tolist() == [[0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0]]
    assert not high_entropy_mask(entropies, mask, None).any()
    assert entropy_threshold(torch.zeros(0), 0.5) is None


def test_entropy_bonus_subtracts_the_mean_entropy_with_its_gradient() -> None:
    example = hand_example()
    entropy = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 9.0]], dtype=torch.float64,
                           requires_grad=True)
    out = policy_loss(
        example["logps"], example["advantages"], example["completion_mask"],
        old_logps=example["old_logps"], epsilon_high=0.28, entropy=entropy,
        options=LossOptions(entropy_coef=0.5),
    )  # fmt: skip
    # H = mean of the five real tokens = 15 / 5 = 3; policy loss (-1.28-1.1-1+1.6+1.8)/5.
    policy = (-1.28 - 1.1 - 1.0 + 1.6 + 1.8) / 5
    assert float(out.policy_loss) == pytest.approx(policy, abs=1e-12)
    assert float(out.loss.detach()) == pytest.approx(policy - 0.5 * 3.0, abs=1e-12)
    out.loss.backward()
    expected = torch.tensor([[-0.1] * 3, [-0.1, -0.1, 0.0]], dtype=torch.float64)  # -0.5 / 5
    torch.testing.assert_close(entropy.grad, expected)
    assert out.trained_entropy.tolist() == [15.0, 5.0]


def test_adaptive_entropy_controller() -> None:
    control = AdaptiveEntropy(coef=0.01, adaptive=True, target=1.0, delta=0.005, maximum=0.02)
    assert control.enabled
    assert control.applied == 0.0
    control.update(0.5)  # below the target: the bonus applies and grows
    assert control.coef == pytest.approx(0.015)
    assert control.applied == pytest.approx(0.015)
    control.update(0.7)
    control.update(0.9)
    assert control.coef == pytest.approx(0.02)  # capped at the maximum
    control.update(2.0)  # above: no bonus, the coefficient shrinks
    assert control.applied == 0.0
    assert control.coef == pytest.approx(0.015)
    fixed = AdaptiveEntropy(coef=0.1)
    fixed.update(5.0)
    assert fixed.applied == 0.1
    assert not AdaptiveEntropy(coef=0.0).enabled


# --- TRL 1.16's own code on the same tensors --------------------------------------------------

CASES = {
    "cispo": ({"loss_type": "cispo", "eps_high": 1.3}, {}, {}),
    "sapo": ({"loss_type": "sapo"}, {}, {}),
    "sapo_temperatures": ({"loss_type": "sapo"},
                          {"sapo_temperature_pos": 0.7, "sapo_temperature_neg": 1.6},
                          {"sapo_temperature_pos": 0.7, "sapo_temperature_neg": 1.6}),
    "luspo_sequence": ({"loss_type": "luspo"}, {"importance_sampling_level": "sequence"},
                       {"importance_sampling_level": "sequence"}),
    "vespo": ({"loss_type": "vespo"}, {}, {}),
    "gspo": ({"loss_type": "grpo"}, {"importance_sampling_level": "sequence"},
             {"importance_sampling_level": "sequence"}),
    "gspo_dapo": ({"loss_type": "dapo"}, {"importance_sampling_level": "sequence"},
                  {"importance_sampling_level": "sequence"}),
    "delta": ({"loss_type": "dapo"}, {"delta": 1.5}, {"delta": 1.5}),
    "bias_corrected_kl": ({"loss_type": "bnpo", "beta": 0.04},
                          {"use_bias_correction_kl": True}, {"use_bias_correction_kl": True}),
    "off_policy_mask": ({"loss_type": "dapo"}, {"off_policy_threshold": 0.05},
                        {"off_policy_mask_threshold": 0.05}),
    "entropy_bonus": ({"loss_type": "dr_grpo"}, {"entropy_coef": 0.3}, {"entropy_coef": 0.3}),
    "top_entropy": ({"loss_type": "grpo"}, {}, {"top_entropy_quantile": 0.4}),
    "top_entropy_with_bonus": ({"loss_type": "dapo"}, {"entropy_coef": 0.2},
                               {"top_entropy_quantile": 0.3, "entropy_coef": 0.2}),
}


def _trl_args(options: dict) -> tuple[dict, dict]:
    args_names = {"delta", "use_bias_correction_kl", "sapo_temperature_pos",
                  "sapo_temperature_neg"}
    args = {k: v for k, v in options.items() if k in args_names}
    trainer = {k: v for k, v in options.items() if k not in args_names}
    return args, trainer


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_trl_compute_loss_for_its_options(case: str) -> None:
    common, ours, theirs = CASES[case]
    generator = torch.Generator().manual_seed(47)
    logps = -torch.rand(6, 9, generator=generator) * 3
    old = logps + 0.3 * torch.randn(6, 9, generator=generator)
    ref = logps + 0.3 * torch.randn(6, 9, generator=generator)
    entropies = torch.rand(6, 9, generator=generator) * 4
    advantages = torch.randn(6, generator=generator)
    mask = (torch.arange(9) < torch.tensor([9, 3, 7, 1, 9, 5])[:, None]).long()
    loss_type, beta = common["loss_type"], common.get("beta", 0.0)
    eps_high = common.get("eps_high", 0.28)
    trl_args, trl_trainer = _trl_args(theirs)
    expected, metrics = trl_compute_loss(
        logps, old, ref if beta else None, advantages, mask, loss_type=loss_type,
        eps_low=0.2, eps_high=eps_high, beta=beta, max_len=12, entropies=entropies,
        args=trl_args, **trl_trainer,
    )  # fmt: skip
    quantile = theirs.get("top_entropy_quantile", 1.0)
    token_mask = None
    if quantile < 1.0:
        threshold = entropy_threshold(entropies[mask.bool()], 1 - quantile)
        token_mask = high_entropy_mask(entropies, mask, threshold)
    out = policy_loss(
        logps, advantages, mask, old_logps=old, ref_logps=ref if beta else None,
        loss_type=loss_type, epsilon_low=0.2, epsilon_high=eps_high, beta=beta,
        normalizer=LossNormalizer.for_batch(mask, max_completion_length=12),
        options=LossOptions(**ours), entropy=entropies, token_mask=token_mask,
    )  # fmt: skip
    # float32 on both sides, values of magnitude ~1, a loss summed over at most 54 terms in
    # another order (and, for GSPO, a mean of log-ratios inside an exp): 16 ulps.
    tolerance = f32_atol(expected, ulps=16)
    assert float(out.loss) == pytest.approx(float(expected), abs=tolerance)
    if "entropy_coef" in ours:
        assert float(out.policy_loss) == pytest.approx(metrics["policy_loss"][0], abs=tolerance)
    if "clip_ratio/region_mean" in metrics:
        assert float(out.clip_region_fraction) == pytest.approx(
            metrics["clip_ratio/region_mean"][0], abs=tolerance)
    if loss_type == "cispo":
        assert float(out.clip_high_fraction) == pytest.approx(metrics["cispo_clip_ratio"][0])
        assert metrics["cispo_clip_ratio"][0] > 0  # the example exercises the cap


def test_the_options_change_the_loss() -> None:
    """Each case above is a real test of its option: without it, the loss differs."""
    generator = torch.Generator().manual_seed(47)
    logps = -torch.rand(6, 9, generator=generator) * 3
    old = logps + 0.6 * torch.randn(6, 9, generator=generator)
    advantages = torch.randn(6, generator=generator)
    mask = (torch.arange(9) < torch.tensor([9, 3, 7, 1, 9, 5])[:, None]).long()
    base = float(policy_loss(logps, advantages, mask, old_logps=old).loss)
    for options in ({"delta": 1.5}, {"off_policy_threshold": 0.05},
                    {"importance_sampling_level": "sequence"}):
        changed = float(policy_loss(logps, advantages, mask, old_logps=old,
                                    options=LossOptions(**options)).loss)
        assert abs(changed - base) > 1e-4, options
