"""Next-token sampling on the device, without a host synchronisation: the sampling half of the
static backend's decode step (:mod:`mtgrpo.fast.static`).

Notation: ``n`` rows decoded together, ``V`` vocabulary size.

The distribution is the one :class:`~mtgrpo.rollout.base.SamplingParams` documents and the "hf"
backend draws from: transformers' ``TemperatureLogitsWarper`` -> ``TopKLogitsWarper`` ->
``TopPLogitsWarper`` chain (``transformers/generation/logits_process.py``, 5.23) applied to the
next-token logits copied to float32, each warper present only when it changes something
(temperature != 1, top_k > 0, top_p < 1), then ``softmax``. :func:`warp_logits` performs the
same tensor operations in the same order, so it is equal to that chain bit for bit.

One departure, on purpose: ``generate`` draws with ``torch.multinomial(softmax(scores), 1)``;
we draw in one of two exact ways, chosen by the device (:func:`draw_tokens`):

* on accelerators, the Gumbel-max ("exponential race") trick, ``argmax_v(log p_v - log E_v)``
  with ``E_v ~ Exp(1)`` i.i.d., which picks token ``v`` with probability exactly ``p_v`` (the
  minimum of independent ``E_v / p_v`` is attained at ``v`` with probability ``p_v / sum p``).
  It is made of plain elementwise ops and an argmax: no data-dependent control flow and no host
  read, so it can be captured in a CUDA graph; it draws from the default generator, which CUDA
  graphs replay safely (each replay advances the generator's offset).
* on the CPU, the inverse of the cumulative distribution: one uniform draw ``u`` per row,
  scaled to the row's total mass, and the first token whose cumulative probability (float64)
  exceeds it. ``V`` exponential draws per row cost more than the decode step's LM head on a
  CPU (torch's ``exponential_`` takes ~20 ns per number: 82 ms for a ``[72, 49152]`` step on a
  2-core AMD EPYC, where this draw takes ~11 ms in all); one uniform per row costs nothing.
  A token of probability 0 spans an empty interval and is never drawn; float64 sums keep every
  token's interval within ``V * 2^-53`` of its probability.

Same distribution, different random stream: a seed reproduces this backend's samples on the
same kind of device, not ``generate``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

__all__ = [
    "SampledTokens",
    "SamplingRule",
    "SamplingSettings",
    "draw_tokens",
    "gumbel_max_draw",
    "inverse_cdf_draw",
    "warp_logits",
]

# The smallest Exp(1) draw we allow: exponential_ may return exactly 0 (float32 uniform
# draws hit 0 with probability 2^-24 per element, i.e. many times per step over a 150k
# vocabulary), and -log(0) = +inf would make the argmax pick that element even where the
# token is filtered out (-inf + inf = NaN). Clamping changes the distribution by at most
# the probability of such a draw.
_MIN_EXPONENTIAL = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class SampledTokens:
    """One token per row and its log-probability under the distribution it was drawn from."""

    tokens: Tensor  # [n] int64
    logprobs: Tensor  # [n] float32 (zeros when the rule does not compute them)


class SamplingSettings(Protocol):
    """What a sampling rule is read from: :class:`mtgrpo.rollout.SamplingParams` (the
    generation contract's request) has these attributes."""

    @property
    def is_greedy(self) -> bool: ...

    temperature: float
    top_k: int
    top_p: float
    return_logprobs: bool


@dataclass(frozen=True)
class SamplingRule:
    """The part of :class:`SamplingParams` that shapes one decode step (hashable: a CUDA graph
    is captured per rule).

    ``greedy``: argmax of the float32 logits (temperature, top-k and top-p ignored, as with
    ``generate(do_sample=False)``). ``with_logprobs``: also return the log-probability of the
    chosen token (sampling computes it anyway; greedy decoding skips the ``[n, V]``
    log-softmax unless asked).
    """

    greedy: bool
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    with_logprobs: bool = False

    @classmethod
    def from_params(cls, params: SamplingSettings) -> SamplingRule:
        if params.is_greedy:
            return cls(greedy=True, with_logprobs=params.return_logprobs)
        return cls(
            greedy=False,
            temperature=float(params.temperature),
            top_k=params.top_k,
            top_p=float(params.top_p),
            with_logprobs=params.return_logprobs,
        )

    def __call__(self, logits: Tensor) -> SampledTokens:
        """Draw one token per row from next-token ``logits: [n, V]`` (any float dtype)."""
        scores = logits.float()  # [n, V]: generate copies the logits to float32 first
        if self.greedy:
            tokens = scores.argmax(-1)  # [n]
            if not self.with_logprobs:
                # greedy without log-probs skips the [n, V] log-softmax (SampledTokens: zeros then)
                return SampledTokens(tokens, torch.zeros_like(scores[:, 0]))
            logprobs = torch.log_softmax(scores, dim=-1)
            return SampledTokens(tokens, logprobs.gather(-1, tokens[:, None])[:, 0])
        return draw_tokens(
            warp_logits(scores, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
        )


def warp_logits(scores: Tensor, *, temperature: float, top_k: int, top_p: float) -> Tensor:
    """Temperature, then top-k, then top-p, as transformers' warpers do; ``[n, V]`` -> ``[n, V]``.

    ``scores / T``; with ``k = min(max(top_k, 1), V)``, tokens scoring below the k-th largest
    score get ``-inf`` (ties with the k-th are kept); nucleus: sort ascending, drop the tokens
    whose cumulative probability (from the least likely up) is ``<= 1 - top_p``, always keeping
    the most likely token. ``scores`` must be float32 (the caller's copy; it is not modified).
    """
    # each warper only where it changes something, as generate builds its chain
    if temperature != 1.0:
        scores = scores / temperature
    if top_k > 0:
        # TopKLogitsWarper's own clamp of k to the vocabulary
        k = min(top_k, scores.shape[-1])
        kth = torch.topk(scores, k)[0][..., -1, None]  # [n, 1]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if top_p < 1.0:
        sorted_scores, sorted_index = torch.sort(scores, descending=False)  # [n, V]
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        # TopPLogitsWarper's comparison, so the same tokens survive, bit for bit
        sorted_remove = cumulative <= (1 - top_p)
        sorted_remove[..., -1:] = False  # keep at least the most likely token
        remove = sorted_remove.scatter(1, sorted_index, sorted_remove)
        scores = scores.masked_fill(remove, -float("inf"))
    return scores


def draw_tokens(scores: Tensor) -> SampledTokens:
    """Sample one token per row from ``softmax(scores)`` (``[n, V]`` float32, ``-inf`` = banned).

    By inverse CDF on the CPU, by Gumbel-max elsewhere (module docstring), from the default
    generator. Returns the tokens and their log-probabilities ``log_softmax(scores)[token]``.
    """
    logprobs = torch.log_softmax(scores, dim=-1)  # [n, V]
    if logprobs.device.type == "cpu":
        # V exponential draws per row cost more than the CPU step's LM head (module docstring)
        tokens = inverse_cdf_draw(logprobs)
    else:
        tokens = gumbel_max_draw(logprobs)
    return SampledTokens(tokens, logprobs.gather(-1, tokens[:, None])[:, 0])


def gumbel_max_draw(logprobs: Tensor) -> Tensor:
    """``argmax_v(logprobs_v - log E_v)``, ``E_v ~ Exp(1)``: ``[n, V]`` -> ``[n]`` token ids."""
    noise = torch.empty_like(logprobs).exponential_().clamp_min_(_MIN_EXPONENTIAL)
    return (logprobs - noise.log()).argmax(-1)


def inverse_cdf_draw(logprobs: Tensor) -> Tensor:
    """The token whose cumulative-probability interval holds a uniform draw: ``[n, V]`` ->
    ``[n]``.

    ``c = cumsum(exp(logprobs))`` in float64, ``u = U[0, 1) * c[V-1]`` (kept strictly below
    ``c[V-1]``), token ``= min{v : c[v] > u}``: token ``v`` is drawn with probability
    ``exp(logprobs_v) / sum exp(logprobs)``, and never when that is 0.
    """
    # float64 keeps every token's interval within V * 2^-53 of its probability
    cumulative = logprobs.double().exp_().cumsum_(-1)  # [n, V]
    total = cumulative[:, -1:]  # [n, 1]
    uniform = torch.rand(total.shape, dtype=torch.float64, device=total.device)
    # u * total can round up to total itself; the largest double below it keeps u inside.
    below = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cumulative, below, right=True)[:, 0]
