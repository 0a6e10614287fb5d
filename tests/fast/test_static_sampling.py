"""Device-side sampling of the static backend: the warper chain equals transformers' bit for bit
and a plain-loop nucleus/top-k reference, both draws (inverse CDF on the CPU, Gumbel-max elsewhere)
have the right distribution, and filtered tokens are never drawn."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from mtgrpo.fast.static_sampling import (
    SamplingRule,
    draw_tokens,
    gumbel_max_draw,
    inverse_cdf_draw,
    warp_logits,
)
from mtgrpo.rollout import SamplingParams
from tolerance import assert_close_f32


def _hf_chain(scores: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The processors ``generate`` builds for these options, in its order (each only when it
    changes something, min_tokens_to_keep = 1)."""
    dummy_ids = torch.zeros((scores.shape[0], 1), dtype=torch.long)
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(dummy_ids, scores)
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(dummy_ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(dummy_ids, scores)
    return scores


def _loop_reference(row: list[float], temperature: float, top_k: int, top_p: float) -> set[int]:
    """Tokens kept, by hand: top-k by value (ties with the k-th kept), then the nucleus: most
    probable first, keep a token while the probability mass before it is < top_p."""
    scaled = [x / temperature for x in row]
    kept = set(range(len(row)))
    if top_k > 0:
        kth = sorted(scaled, reverse=True)[min(top_k, len(row)) - 1]
        kept = {v for v in kept if scaled[v] >= kth}
    if top_p < 1.0:
        peak = max(scaled[v] for v in kept)
        weights = {v: math.exp(scaled[v] - peak) for v in kept}
        total = sum(weights.values())
        nucleus, mass_before = set(), 0.0
        for v in sorted(kept, key=lambda v: -weights[v]):
            if mass_before >= top_p:
                break
            nucleus.add(v)
            mass_before += weights[v] / total
        kept = nucleus
    return kept


OPTIONS = [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (0.8, 0, 0.6), (0.5, 20, 0.9),
           (2.0, 300, 0.95)]  # fmt: skip


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), OPTIONS)
def test_warp_logits_equals_the_transformers_warper_chain(
    temperature: float, top_k: int, top_p: float
) -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn((6, 259), generator=generator) * 3  # [n, V]
    ours = warp_logits(logits.clone(), temperature=temperature, top_k=top_k, top_p=top_p)
    assert torch.equal(ours, _hf_chain(logits.clone(), temperature, top_k, top_p))


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), OPTIONS)
def test_warp_logits_keeps_what_a_plain_loop_keeps(
    temperature: float, top_k: int, top_p: float
) -> None:
    generator = torch.Generator().manual_seed(1)
    for rows, vocab in ((3, 7), (5, 40), (2, 259)):
        logits = torch.randn((rows, vocab), generator=generator, dtype=torch.float64) * 2
        warped = warp_logits(logits.float(), temperature=temperature, top_k=top_k, top_p=top_p)
        for row in range(rows):
            kept = set(torch.nonzero(warped[row] > -math.inf).flatten().tolist())
            assert kept == _loop_reference(logits[row].float().tolist(), temperature, top_k, top_p)
            # kept tokens carry logits / T unchanged
            index = sorted(kept)
            torch.testing.assert_close(
                warped[row, index], logits[row, index].float() / temperature, rtol=0, atol=0
            )


def test_draw_tokens_follows_the_distribution_and_never_draws_a_banned_token() -> None:
    # softmax of these scores: [0.5, 0.25, 0.125, 0.125, 0] (token 4 banned).
    scores = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125, 0.0]))
    n = 40000
    torch.manual_seed(0)
    sampled = draw_tokens(scores.expand(n, -1).clone())  # on the CPU: the inverse CDF
    counts = Counter(sampled.tokens.tolist())
    assert counts[4] == 0
    observed = [counts[v] for v in range(4)]
    assert chisquare(observed, [n * p for p in (0.5, 0.25, 0.125, 0.125)]).pvalue > 1e-3
    # log_softmax of log-probs returns them up to a few roundings (values down to -2.1)
    assert_close_f32(sampled.logprobs, scores[sampled.tokens], ulps=8)


@pytest.mark.parametrize("draw", [inverse_cdf_draw, gumbel_max_draw])
def test_each_draw_follows_a_long_tailed_distribution(draw) -> None:
    # 300 tokens: three carry 0.9 of the mass, the rest share 0.1 (the tail a real vocabulary
    # has); 50 banned. Counts of the three and of the tail as one bin match their mass.
    probs = torch.full((300,), 0.1 / 247, dtype=torch.float64)
    probs[:3] = torch.tensor([0.5, 0.3, 0.1], dtype=torch.float64)
    probs[250:] = 0.0
    logprobs = torch.log(probs).float().log_softmax(-1)  # [V]
    n = 60000
    torch.manual_seed(1)
    tokens = draw(logprobs.expand(n, -1).clone())
    assert tokens.dtype == torch.int64
    assert tokens.shape == (n,)
    assert int((tokens >= 250).sum()) == 0
    observed = [int((tokens == v).sum()) for v in range(3)] + [int((tokens >= 3).sum())]
    assert chisquare(observed, [n * p for p in (0.5, 0.3, 0.1, 0.1)]).pvalue > 1e-3


def test_inverse_cdf_picks_the_interval_that_holds_the_uniform_draw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Cumulative sums of [0.5, 0.25, 0.125, 0.125, 0]: [0.5, 0.75, 0.875, 1, 1] (up to the
    # float32 log-probs' rounding, so the draws stay 1e-4 off the boundaries). Token v owns
    # [c[v-1], c[v]); the banned last token owns an empty interval. A draw of 1.0 (past
    # torch.rand's [0, 1) range, the worst rounding of u * total) still lands on token 3.
    uniforms = [0.0, 0.4999, 0.5001, 0.7499, 0.7501, 0.8749, 0.8751, 0.999999, 1.0]
    monkeypatch.setattr(
        torch, "rand",
        lambda shape, **kw: torch.tensor(uniforms, dtype=torch.float64).reshape(shape),
    )  # fmt: skip
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125, 0.0])
    logprobs = torch.log(probs).expand(len(uniforms), -1).clone()
    assert inverse_cdf_draw(logprobs).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 3]
    # banned tokens first: a draw of 0 skips their empty intervals
    first_banned = torch.log(torch.tensor([0.0, 0.0, 0.75, 0.25])).expand(len(uniforms), -1)
    assert inverse_cdf_draw(first_banned.clone()).tolist() == [2, 2, 2, 2, 3, 3, 3, 3, 3]


def test_inverse_cdf_draws_are_reproducible_under_a_seed() -> None:
    logprobs = torch.randn((16, 1000), generator=torch.Generator().manual_seed(2)).log_softmax(-1)
    torch.manual_seed(5)
    first = inverse_cdf_draw(logprobs)
    torch.manual_seed(5)
    assert torch.equal(first, inverse_cdf_draw(logprobs))


def test_zero_exponential_draws_cannot_pick_a_filtered_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # If every Exp(1) draw were 0, log(0) = -inf would turn the banned tokens' -inf into NaN
    # and argmax would return a NaN position; the clamp keeps banned tokens at -inf.
    monkeypatch.setattr(torch.Tensor, "exponential_", lambda self, *a, **k: self.zero_())
    scores = torch.tensor([[-math.inf, 0.3, -math.inf, 0.1], [2.0, -math.inf, -math.inf, 1.0]])
    assert gumbel_max_draw(torch.log_softmax(scores, -1)).tolist() == [1, 0]


def test_greedy_rule_is_argmax_with_unwarped_logprobs() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 3.5]], dtype=torch.bfloat16)
    rule = SamplingRule.from_params(
        SamplingParams(max_new_tokens=1, temperature=0, top_k=1, return_logprobs=True)
    )
    assert rule == SamplingRule(greedy=True, with_logprobs=True)  # temperature 0 means greedy
    sampled = rule(logits)
    assert sampled.tokens.tolist() == [1, 2]
    expected = torch.log_softmax(logits.float(), -1)[[0, 1], [1, 2]]  # T ignored when greedy
    assert sampled.logprobs.dtype == torch.float32
    torch.testing.assert_close(sampled.logprobs, expected, rtol=0, atol=0)
    quiet = SamplingRule.from_params(SamplingParams(max_new_tokens=1, greedy=True))(logits)
    assert quiet.logprobs.tolist() == [0.0, 0.0]


def test_sampling_rule_keeps_the_options_that_shape_a_step() -> None:
    params = SamplingParams(max_new_tokens=9, temperature=0.6, top_p=0.8, top_k=7, seed=3,
                            stop_token_ids=(5,))  # fmt: skip
    rule = SamplingRule.from_params(params)
    assert rule == SamplingRule(greedy=False, temperature=0.6, top_k=7, top_p=0.8)
    assert hash(rule) == hash(SamplingRule.from_params(params))
