"""The GRPO loss family: clipped surrogate, k3 KL penalty, and the token aggregations.

Notation: ``n`` rows of one micro-batch, ``N`` rows of the whole batch (all micro-batches of
one optimizer step), ``L`` completion tokens, ``m[j, t]`` the completion mask.

Per token ``t`` of completion ``j`` (ALGORITHMS.md section 3; TRL 1.16
``GRPOTrainer._compute_loss``)::

    rho_jt = exp(logp_jt - old_logp_jt)
    L_jt   = -min(rho_jt A_j, clip(rho_jt, 1 - eps_low, 1 + eps_high) A_j) + beta KL_jt
    KL_jt  = exp(ref_jt - logp_jt) - (ref_jt - logp_jt) - 1          (the k3 estimator)

With one policy update per generation batch (mu = 1) and no ``old_logps``, ``old =
logp.detach()``: rho = 1 in value but its gradient is that of ``logp``, so no extra forward is
needed (TRL does the same).

The ratio ``rho`` is per token (``importance_sampling_level="token"``) or, for GSPO
(``"sequence"``), one per completion: ``rho_j = exp(mean_t m (logp - old))``. Per loss type
(:class:`LossOptions` holds the options; TRL 1.16's ``_compute_loss`` is the source):

- ``grpo``, ``dapo``, ``dr_grpo``, ``bnpo``, ``luspo``: the clipped surrogate above; with
  ``delta`` (two-sided clipping) the unclipped ratio is first capped at ``delta``;
- ``cispo`` (MiniMax-M1): ``L = -sg(min(rho, eps_high)) A logp`` (the importance weight is
  clipped and detached, ``eps_high`` is its cap);
- ``sapo`` (SAPO): ``L = -sigmoid(tau (rho - 1)) (4 / tau) A``, ``tau`` = the positive or
  negative temperature by the sign of ``A``;
- ``vespo`` (VESPO): ``L = -phi(w) A logp`` with the detached gamma weight of
  :func:`~mtgrpo.algo.token_weights.gamma_weights`.

Then, in TRL's order: completions dropped by the off-policy mask and tokens outside the
high-entropy mask get ``L = 0``; the KL term is added (multiplied by ``rho`` with
``use_bias_correction_kl``); the tokens are aggregated; the entropy bonus
``entropy_coef * H`` is subtracted, ``H`` the mean entropy of the micro-batch's trained tokens
divided by the number of micro-batches (TRL's definition).

Aggregations (``loss_type``, TRL's names; aliases from ALGORITHMS.md), written with the
*whole-batch* sizes of :class:`LossNormalizer`, so the micro-batch losses of one optimizer step
sum to the full-batch loss and their accumulated gradients equal the full-batch gradient:

- ``"grpo"`` (``sequence_mean``): ``sum_j [sum_t m L / sum_t m] / N``;
- ``"dapo"`` (``token_mean``, TRL's default): ``sum_jt m L / sum_jt m`` over the whole batch;
- ``"dr_grpo"``: ``sum_jt m L / (N * max_completion_length)``;
- ``"bnpo"``: TRL's local token mean, ``[sum_jt m L / sum_jt m]_micro-batch /
  num_micro_batches``. It is the only one that depends on how the batch is split (as in
  TRL); with one micro-batch it equals ``"dapo"``;
- ``"sapo"``: the sequence mean of ``"grpo"``; ``"cispo"``, ``"vespo"``: the token mean of
  ``"dapo"``; ``"luspo"``: ``sum_jt m L / N`` (each sequence weighted by its length).

Departures from TRL: TRL divides ``grpo`` / ``dr_grpo`` by the gradient-accumulation steps and
the *local* row count, which equals ours only when every micro-batch has the same number of
rows; the length-bucketed micro-batches of :mod:`mtgrpo.policy.micro_batches` do not, hence
whole-batch normalisers. Masked positions are excluded with ``torch.where`` rather than a
product, so a non-finite value at a padded position cannot leak into the loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mtgrpo.algo.registry import IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES, Registry
from mtgrpo.algo.token_weights import gamma_weights, off_policy_mask

__all__ = [
    "LOSS_TYPES",
    "SURROGATES",
    "LossNormalizer",
    "LossOptions",
    "LossOutput",
    "combine_loss_outputs",
    "loss_value_needs_logps",
    "per_sequence_objective",
    "policy_loss",
]


@dataclass(frozen=True)
class LossNormalizer:
    """Whole-batch sizes that every micro-batch loss is divided by.

    ``num_sequences`` and ``num_tokens`` count the rows and the completion tokens of all
    micro-batches of one optimizer step (under data parallelism: of this rank's share, since
    gradients are averaged across ranks). ``max_completion_length`` is Dr. GRPO's constant
    (the configured generation limit, not the batch's width); ``num_micro_batches`` is used by
    ``"bnpo"`` only.
    """

    num_sequences: float
    num_tokens: float
    max_completion_length: int | None = None
    num_micro_batches: int = 1

    def __post_init__(self) -> None:
        # under data parallelism the count is the batch's divided by the processes, which
        # may be a fraction (one group of 2 rows over 4 processes: 0.5)
        if not self.num_sequences > 0:
            raise ValueError(f"num_sequences must be > 0, got {self.num_sequences}")
        if self.num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {self.num_tokens}")
        if self.max_completion_length is not None and self.max_completion_length < 1:
            raise ValueError(
                f"max_completion_length must be >= 1 or None, got {self.max_completion_length}"
            )
        if self.num_micro_batches < 1:
            raise ValueError(f"num_micro_batches must be >= 1, got {self.num_micro_batches}")

    @classmethod
    def for_batch(
        cls,
        completion_mask: Tensor,
        *,
        max_completion_length: int | None = None,
        num_micro_batches: int = 1,
    ) -> LossNormalizer:
        """Normaliser of the whole batch from its completion mask ``[N, L]``."""
        if completion_mask.dim() != 2:
            raise ValueError(
                f"completion_mask must be [N, L], got shape {tuple(completion_mask.shape)}"
            )
        return cls(
            num_sequences=completion_mask.shape[0],
            num_tokens=int(completion_mask.bool().sum().item()),
            max_completion_length=max_completion_length,
            num_micro_batches=num_micro_batches,
        )


@dataclass(frozen=True)
class LossOutput:
    """Result of :func:`policy_loss` for one micro-batch.

    ``loss`` is this micro-batch's share of the batch loss (call ``backward`` on it); every
    other field is detached. Fractions and means are over this micro-batch's completion
    tokens; ``num_tokens`` lets :func:`combine_loss_outputs` weight them.
    """

    loss: Tensor  # [] differentiable
    per_sequence_loss: Tensor  # [n] token mean of L_jt per completion (KL term included)
    # [n] token mean over each completion of minus the per-token policy term of the loss in
    # use (delta clipping, GSPO's sequence ratio, the cispo/sapo/vespo surrogates included),
    # before the token and off-policy masks, the engine's importance weight and the KL term;
    # the J_j of per_sequence_objective() only for the plain clipped token-level surrogate
    per_sequence_objective: Tensor
    num_tokens: Tensor  # [] completion tokens of this micro-batch
    clip_low_fraction: Tensor  # [] tokens with rho < 1 - eps_low and A < 0
    clip_high_fraction: Tensor  # [] tokens with rho > 1 + eps_high and A > 0
    clip_region_fraction: Tensor  # [] either of the two
    mean_ratio: Tensor  # [] token mean of rho
    mean_kl: Tensor | None  # [] token mean of KL_jt, None without ref_logps
    policy_loss: Tensor | None = None  # [] the loss without the entropy bonus
    trained_entropy: Tensor | None = None  # [2] sum and count of the trained tokens' entropy


# An aggregation maps masked per-token losses [n, L], the mask [n, L] (bool) and the
# whole-batch normaliser to this micro-batch's scalar share of the loss.
LossAggregation = Callable[[Tensor, Tensor, LossNormalizer], Tensor]

# LOSS_TYPES (mtgrpo.algo.registry) declares the names, so a configuration validates them
# without torch.


@LOSS_TYPES.register("grpo", aliases=("sequence_mean",))
def _sequence_mean(per_token_loss: Tensor, mask: Tensor, normalizer: LossNormalizer) -> Tensor:
    lengths = mask.sum(-1).clamp(min=1)  # [n]; an empty completion divides by 1 (TRL)
    # Original GRPO: each completion's token mean, then the mean over the whole batch's N rows
    # (TRL's .mean() over the local rows, which differs when micro-batches differ in size).
    return (per_token_loss.sum(-1) / lengths).sum() / normalizer.num_sequences


@LOSS_TYPES.register("dapo", aliases=("token_mean",))
def _token_mean(per_token_loss: Tensor, mask: Tensor, normalizer: LossNormalizer) -> Tensor:
    # DAPO's token-level mean, so a long completion weighs by its tokens; the whole batch's
    # count plays TRL's num_items_in_batch.
    # max(·, 1): a batch without completion tokens gives 0, not 0/0 (TRL clamps at 1 too).
    return per_token_loss.sum() / max(normalizer.num_tokens, 1)


@LOSS_TYPES.register("dr_grpo")
def _constant_length(per_token_loss: Tensor, mask: Tensor, normalizer: LossNormalizer) -> Tensor:
    if normalizer.max_completion_length is None:
        raise ValueError(
            "loss_type='dr_grpo' divides by the constant max_completion_length; pass "
            "LossNormalizer(..., max_completion_length=<generation limit>)"
        )
    # Dr. GRPO: a constant denominator, so no completion is scaled by its own length.
    # TRL 1.16's dr_grpo: loss.sum() / (B * max_completion_length), B = whole batch here
    return per_token_loss.sum() / (normalizer.num_sequences * normalizer.max_completion_length)


@LOSS_TYPES.register("bnpo")
def _local_token_mean(per_token_loss: Tensor, mask: Tensor, normalizer: LossNormalizer) -> Tensor:
    # TRL 1.16's bnpo: the micro-batch's own token count over the accumulation steps, kept
    # split-dependent on purpose so the numbers match TRL's.
    return per_token_loss.sum() / mask.sum().clamp(min=1) / normalizer.num_micro_batches


# TRL 1.16's _compute_loss aggregates cispo and vespo as dapo, and sapo as grpo.
LOSS_TYPES.add("cispo", _token_mean)
LOSS_TYPES.add("vespo", _token_mean)
LOSS_TYPES.add("sapo", _sequence_mean)


@LOSS_TYPES.register("luspo")
def _length_weighted(per_token_loss: Tensor, mask: Tensor, normalizer: LossNormalizer) -> Tensor:
    # TRL's luspo: summed over tokens, averaged over sequences.
    # Already masked by policy_loss, as TRL's (per_token_loss * mask).sum(-1).mean().
    return per_token_loss.sum() / normalizer.num_sequences


@dataclass(frozen=True)
class LossOptions:
    """TRL 1.16's options of the policy loss beyond clipping and the KL coefficient.

    ``importance_sampling_level``: ``"token"`` or ``"sequence"`` (GSPO). ``delta``: two-sided
    clipping cap of the unclipped ratio (None: off). ``sapo_temperature_pos/neg``: SAPO's gate
    temperatures. ``vespo_*``: VESPO's gamma shapes and rates. ``use_bias_correction_kl``:
    multiply the KL by ``rho``. ``off_policy_threshold``: the off-policy sequence mask's KL
    threshold (None: off). ``entropy_coef``: the entropy bonus coefficient applied (0: off).
    """

    # TRL 1.16's GRPOConfig defaults, except use_bias_correction_kl (below).
    importance_sampling_level: str = "token"
    delta: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    # TRL 1.16 defaults to True; ours is ALGORITHMS.md §3's plain k3 penalty (acts only with
    # beta != 0).
    use_bias_correction_kl: bool = False
    off_policy_threshold: float | None = None
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise ValueError(
                f"importance_sampling_level={self.importance_sampling_level!r} must be 'token' "
                "or 'sequence'"
            )
        if min(self.sapo_temperature_pos, self.sapo_temperature_neg) <= 0:
            raise ValueError("sapo temperatures must be > 0")


@dataclass(frozen=True)
class _Surrogate:
    """Inputs of a per-token objective (shapes ``[n, L]``; ``ratio`` may be ``[n, 1]``)."""

    logps: Tensor
    log_ratio: Tensor
    ratio: Tensor
    advantages: Tensor  # [n, 1]
    mask: Tensor
    epsilon_low: float
    epsilon_high: float
    options: LossOptions


# A surrogate maps its inputs to (per-token loss before masks and KL, the ratio the clip
# statistics use, or None when the loss type reports none).
Surrogate = Callable[[_Surrogate], tuple[Tensor, Tensor | None]]
SURROGATES: Registry[Surrogate] = Registry("policy objective")


@SURROGATES.register("clip")
def _clipped(x: _Surrogate) -> tuple[Tensor, Tensor | None]:
    # Decoupled ε_low / ε_high: DAPO's clip-higher (MT-GRPO's recipes use 0.2 / 0.28).
    clipped = torch.clamp(x.ratio, 1 - x.epsilon_low, 1 + x.epsilon_high)
    # INTELLECT-2's two-sided clipping (TRL's delta): for A < 0 the min would otherwise take
    # the unbounded ratio. The clip statistics read this capped ratio, as TRL's do.
    ratio = x.ratio if x.options.delta is None else torch.clamp(x.ratio, max=x.options.delta)
    return -torch.min(ratio * x.advantages, clipped * x.advantages), ratio


@SURROGATES.register("cispo")
def _cispo(x: _Surrogate) -> tuple[Tensor, Tensor | None]:
    # CISPO (MiniMax-M1): clip and detach the IS weight so every token keeps a gradient through
    # logp; TRL reuses epsilon_high as the cap (ScaleRL recommends 5.0).
    weight = torch.clamp(x.ratio, max=x.epsilon_high).detach()
    return -weight * x.advantages * x.logps, None


@SURROGATES.register("sapo")
def _sapo(x: _Surrogate) -> tuple[Tensor, Tensor | None]:
    pos, neg = (torch.tensor(t, dtype=x.ratio.dtype, device=x.ratio.device)
                for t in (x.options.sapo_temperature_pos, x.options.sapo_temperature_neg))
    tau = torch.where(x.advantages > 0, pos, neg)  # A = 0 takes the negative temperature (TRL)
    # SAPO's soft gate in place of the hard clip; 4 / τ makes its slope 1 at ρ = 1.
    return -torch.sigmoid(tau * (x.ratio - 1)) * 4 / tau * x.advantages, None


@SURROGATES.register("vespo")
def _vespo(x: _Surrogate) -> tuple[Tensor, Tensor | None]:
    o = x.options
    phi = gamma_weights(x.advantages[:, 0], x.log_ratio, x.mask, k_pos=o.vespo_k_pos,
                        lambda_pos=o.vespo_lambda_pos, k_neg=o.vespo_k_neg,
                        lambda_neg=o.vespo_lambda_neg).unsqueeze(-1)  # [n, 1]
    return -phi * x.advantages * x.logps, None


_SURROGATE_OF = {"cispo": "cispo", "sapo": "sapo", "vespo": "vespo"}
# Surrogates whose value at ratio 1 is a function of the advantages alone (a new surrogate is
# presumed to need the log-probabilities until it is added here, with the test's check).
_LOGP_FREE_SURROGATES = frozenset({"clip", "sapo"})


def loss_value_needs_logps(loss_type: str, beta: float = 0.0) -> bool:
    """Whether the *value* of :func:`policy_loss` on the policy's own samples (``old_logps``
    = ``logps`` detached, ratio exactly 1, no entropy bonus) depends on the log-probabilities.

    At ratio 1 the clipped surrogate is ``-A`` (``min(1, delta) A`` with two-sided clipping)
    and SAPO's gate ``-sigmoid(0) (4 / tau) A`` whatever ``logp`` is (``logp - logp.detach()``
    is exactly 0 for a finite ``logp``), and the off-policy mask sees a divergence of 0; the
    value then needs only the advantages and the mask, so an evaluation loss can be computed
    without a forward pass (which would also have turned a non-finite ``logp`` into a NaN
    loss). It does need them with a KL term (``beta != 0``: ``ref - logp``) and for CISPO and
    VESPO, whose per-token loss is ``-w A logp``.
    """
    surrogate = _SURROGATE_OF.get(LOSS_TYPES.canonical(loss_type), "clip")
    return beta != 0.0 or surrogate not in _LOGP_FREE_SURROGATES


def policy_loss(
    logps: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    *,
    old_logps: Tensor | None = None,
    ref_logps: Tensor | None = None,
    loss_type: str = "dapo",
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    normalizer: LossNormalizer | None = None,
    options: LossOptions | None = None,
    entropy: Tensor | None = None,
    token_mask: Tensor | None = None,
    sampling_logps: Tensor | None = None,
    token_weight: Tensor | None = None,
) -> LossOutput:
    """The GRPO loss family, aggregated by ``loss_type`` (see the module docstring).

    ``logps, old_logps, ref_logps, completion_mask: [n, L]``; ``advantages: [n]``. Defaults are
    TRL 1.16's (``loss_type="dapo"``, ``epsilon=0.2``, ``epsilon_high=None`` meaning
    ``epsilon_low``, ``beta=0``). ``beta = 0`` needs no ``ref_logps``; when they are given
    anyway, the KL is still reported in ``mean_kl``. ``normalizer=None`` treats this
    micro-batch as the whole batch. ``options``: :class:`LossOptions` (TRL's defaults but
    ``use_bias_correction_kl=False``).
    ``entropy [n, L]``: the policy's token entropy, with its graph when the entropy bonus is
    on. ``token_mask [n, L]``: the tokens to train on (the high-entropy mask; None: all).
    ``sampling_logps``: the policy that sampled the completions, for the off-policy mask
    (default ``old_logps``, else ``logps`` detached). ``token_weight [n, L]`` or ``[n, 1]``:
    multiplies each trained token's policy term before the KL penalty is added (the
    engine's importance-sampling correction, :mod:`mtgrpo.algo.engine_correction`).
    """
    aggregate = LOSS_TYPES.get(loss_type)
    loss_type = LOSS_TYPES.canonical(loss_type)
    options = options or LossOptions()
    eps_high = epsilon_low if epsilon_high is None else epsilon_high  # TRL: None is symmetric
    _check_loss_inputs(logps, advantages, completion_mask, old_logps, ref_logps)
    _check_coefficients(epsilon_low, eps_high, beta, ref_logps)
    mask = completion_mask.bool()  # [n, L]
    if normalizer is None:
        normalizer = LossNormalizer.for_batch(mask, max_completion_length=None)
    # μ = 1: π_old = π_θ in value, so ρ = 1 but its gradient is ∇logp; no old-policy forward.
    old = logps.detach() if old_logps is None else old_logps
    log_ratio = logps - old  # [n, L]
    if options.importance_sampling_level == "sequence":
        # GSPO: the length-normalised sequence log-ratio (geometric mean of the token ratios).
        kept = torch.where(mask, log_ratio, torch.zeros_like(log_ratio))
        # TRL 1.16 _compute_loss's "sequence" level; clamp: an empty row has log-weight 0, ratio 1
        log_weights = (kept.sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1)  # [n, 1]
    else:
        log_weights = log_ratio
    ratio = torch.exp(log_weights)  # TRL's coef_1
    adv = advantages.to(ratio.dtype).unsqueeze(-1)  # [n, 1]
    inputs = _Surrogate(logps, log_ratio, ratio, adv, mask, epsilon_low, eps_high, options)
    per_token_loss, clip_ratio = SURROGATES.get(_SURROGATE_OF.get(loss_type, "clip"))(inputs)
    # A sequence-level loss [n, 1] is broadcast to the tokens, as TRL's product with the mask
    # does, so luspo and the token aggregations weigh it by length.
    per_token_loss = raw_loss = per_token_loss.expand_as(logps)
    trained = mask if token_mask is None else mask & token_mask.bool()
    if options.off_policy_threshold is not None:
        # TRL prefers the engine's log-probs: they also see the train / inference mismatch.
        sampler = old if sampling_logps is None else sampling_logps
        keep = off_policy_mask(advantages, logps, sampler, mask, options.off_policy_threshold)
        trained = trained & keep.unsqueeze(-1)
    # TRL multiplies by off_policy_mask and entropy_mask here; where() also drops a NaN.
    per_token_loss = torch.where(trained, per_token_loss, torch.zeros_like(per_token_loss))
    if token_weight is not None:
        # After the masks and before the KL: where TRL's _compute_loss applies the engine's
        # importance_sampling_ratio.
        per_token_loss = per_token_loss * token_weight.detach().to(per_token_loss.dtype)
    # ALGORITHMS.md §3's k3 estimator; computed at beta = 0 too when given, for mean_kl.
    kl = None if ref_logps is None else _k3_kl(logps, ref_logps)  # [n, L]
    if kl is not None and options.use_bias_correction_kl:
        kl = kl * ratio  # DeepSeek-V3.2: the unbiased reverse-KL gradient
    if beta != 0.0 and kl is not None:
        # On every completion token, also those the masks dropped from the policy term (TRL).
        per_token_loss = per_token_loss + beta * kl
    # where, not TRL's product with the mask: a NaN at a padded position stays out.
    per_token_loss = torch.where(mask, per_token_loss, torch.zeros_like(per_token_loss))
    loss = aggregate(per_token_loss, mask, normalizer)
    policy_part, trained_entropy = loss, None
    if entropy is not None:
        # Measured even at coefficient 0: the adaptive controller reads the trained tokens' entropy.
        trained_entropy, bonus = _entropy_bonus(entropy, trained, normalizer)
        if options.entropy_coef != 0.0:
            loss = loss - options.entropy_coef * bonus
    with torch.no_grad():
        stats = _token_stats(ratio, clip_ratio, loss_type, advantages, kl, mask, epsilon_low,
                             eps_high)
        lengths = mask.sum(-1).clamp(min=1)  # an empty completion gives 0, not 0/0
        return LossOutput(
            loss=loss,
            # The released MT-GRPO code's I_k: minus the change of this, summed over a task.
            per_sequence_loss=per_token_loss.sum(-1) / lengths,
            per_sequence_objective=_masked_row_mean(-raw_loss, mask),
            policy_loss=policy_part.detach(),
            trained_entropy=trained_entropy,
            **stats,
        )


def _entropy_bonus(entropy: Tensor, trained: Tensor,
                   normalizer: LossNormalizer) -> tuple[Tensor, Tensor]:
    """``[sum, count]`` of the trained tokens' entropy (detached) and the bonus ``H``: their
    mean over this micro-batch divided by the number of micro-batches (TRL's definition)."""
    # Over the tokens the policy term trains (TRL's effective_mask), so both act on the same ones.
    values = torch.where(trained, entropy.float(), torch.zeros((), device=entropy.device))
    total, count = values.sum(), trained.sum().to(torch.float32)
    # Scaled for accumulation only, never by the loss type's normaliser: L = L_policy − coef · H.
    bonus = total / count.clamp(min=1) / normalizer.num_micro_batches
    # Sum and count, not a mean: the controller needs the step's token mean over every
    # micro-batch and rank, as TRL's _entropy_window_stats pools them.
    return torch.stack([total.detach(), count]), bonus


def per_sequence_objective(
    logps: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    *,
    old_logps: Tensor | None = None,
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
) -> Tensor:
    """GRPO objective of each completion: ``J_j = mean_t min(rho A_j, clip(rho) A_j)``.

    ``[n, L]`` inputs and ``advantages [n]`` -> ``[n]``: the token mean over completion ``j``
    of the clipped surrogate, without the KL term (0 for a completion without tokens).
    MT-GRPO's improvement signal for task ``k`` (ALGORITHMS.md section 4) is
    ``I_k = sum_{j in k} J_j(theta_{t+1}) - sum_{j in k} J_j(theta_t)`` on the same samples:

    - before the update, ``old_logps`` are the current log-probabilities, so rho = 1 and
      ``J_j = A_j``: no forward is needed;
    - after the optimizer step, score the same batch again (no grad) and call this with
      those log-probabilities and ``old_logps`` = the ones the update was computed with.

    The token mean (not the batch aggregation of ``loss_type``) makes ``J_j`` independent of
    the batch a sample was in; the released MT-GRPO code uses minus the summed per-sequence
    loss, which equals ``-J_j + beta * KL_j`` (:attr:`LossOutput.per_sequence_loss`).
    """
    eps_high = epsilon_low if epsilon_high is None else epsilon_high
    _check_loss_inputs(logps, advantages, completion_mask, old_logps, None)
    _check_coefficients(epsilon_low, eps_high, 0.0, None)
    _, surrogate = _clipped_surrogate(logps, old_logps, advantages, epsilon_low, eps_high)
    # Always the clipped surrogate: IWU's I_k is defined on the GRPO objective (ALGORITHMS §4).
    return _masked_row_mean(surrogate, completion_mask.bool())


def combine_loss_outputs(
    outputs: Sequence[LossOutput], rows: Sequence[Sequence[int]], num_rows: int
) -> LossOutput:
    """Merge the micro-batch results of one batch into batch-level statistics.

    ``rows[i]`` are the batch rows of micro-batch ``i`` (as planned by
    :func:`~mtgrpo.policy.micro_batches.plan_micro_batches`); per-sequence values are put back
    in batch order ``[num_rows]``, fractions and means are weighted by token counts, and
    ``loss`` is the (detached) sum of the micro-batch losses, i.e. the full-batch loss.
    """
    if len(outputs) != len(rows) or not outputs:
        raise ValueError(
            f"need one row list per loss output and at least one of each; got {len(outputs)} "
            f"outputs and {len(rows)} row lists"
        )
    seen = sorted(r for part in rows for r in part)
    if seen != list(range(num_rows)):
        raise ValueError(
            f"the row lists must cover rows 0..{num_rows - 1} exactly once; got {len(seen)} "
            "entries; pass the micro-batches planned for this batch"
        )
    first = outputs[0]
    per_seq_loss = first.per_sequence_loss.new_zeros(num_rows)
    per_seq_obj = first.per_sequence_objective.new_zeros(num_rows)
    for part, part_rows in zip(outputs, rows, strict=True):
        index = torch.as_tensor(list(part_rows), dtype=torch.long, device=per_seq_loss.device)
        per_seq_loss[index] = part.per_sequence_loss
        per_seq_obj[index] = part.per_sequence_objective
    tokens = torch.stack([part.num_tokens for part in outputs])  # [num_micro_batches]
    total = tokens.sum()

    # Token-weighted, so the result is the whole batch's token mean, not a mean of means.
    def weighted(values: list[Tensor]) -> Tensor:
        return (torch.stack(values) * tokens).sum() / total.clamp(min=1)

    kls = [part.mean_kl for part in outputs if part.mean_kl is not None]
    return LossOutput(
        # Each micro-batch loss is a share of the batch loss (LossNormalizer): they add up.
        loss=torch.stack([part.loss.detach() for part in outputs]).sum(),
        per_sequence_loss=per_seq_loss,
        per_sequence_objective=per_seq_obj,
        num_tokens=total,
        clip_low_fraction=weighted([part.clip_low_fraction for part in outputs]),
        clip_high_fraction=weighted([part.clip_high_fraction for part in outputs]),
        clip_region_fraction=weighted([part.clip_region_fraction for part in outputs]),
        mean_ratio=weighted([part.mean_ratio for part in outputs]),
        # A KL from only some micro-batches would misstate the batch's; report none then.
        mean_kl=weighted(kls) if len(kls) == len(outputs) else None,
    )


def _clipped_surrogate(
    logps: Tensor,
    old_logps: Tensor | None,
    advantages: Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> tuple[Tensor, Tensor]:
    """``rho [n, L]`` and ``min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A) [n, L]``."""
    old = logps.detach() if old_logps is None else old_logps
    # ALGORITHMS.md §3: rho = pi_theta / pi_old per token, then the clipped surrogate.
    ratio = torch.exp(logps - old)  # [n, L]
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    adv = advantages.to(ratio.dtype).unsqueeze(-1)  # [n, 1]
    return ratio, torch.min(ratio * adv, clipped * adv)


def _k3_kl(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """``KL_t = pi_ref/pi - log(pi_ref/pi) - 1``, non-negative, unbiased for KL(pi || pi_ref)."""
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1  # TRL 1.16's per_token_kl, term for term


def _masked_row_mean(values: Tensor, mask: Tensor) -> Tensor:
    kept = torch.where(mask, values, torch.zeros_like(values))
    # clamp: a completion without tokens gives 0, not 0/0 (TRL's clamp(min=1.0))
    return kept.sum(-1) / mask.sum(-1).clamp(min=1)


def _token_stats(
    ratio: Tensor,
    clip_ratio: Tensor | None,
    loss_type: str,
    advantages: Tensor,
    kl: Tensor | None,
    mask: Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> dict[str, Tensor | None]:
    """Clip fractions, mean ratio and mean KL over masked tokens (TRL's definitions).

    The clipped-surrogate losses count ``rho < 1 - eps_low, A < 0`` (low) and
    ``rho > 1 + eps_high, A > 0`` (high); ``cispo`` counts its capped weights
    (``rho > eps_high, A > 0``) as high; ``sapo`` and ``vespo`` clip nothing. With one ratio per
    sequence (``[n, 1]``) the ratio statistics are means over sequences, as in TRL.
    """
    adv = advantages.unsqueeze(-1)  # [n, 1]
    # GSPO's [n, 1] ratio: statistics over sequences, as TRL's global_masked_mean for x [B, 1].
    per_sequence = ratio.shape[-1] == 1 and mask.shape[-1] != 1
    if clip_ratio is not None:
        # Only the side where clipping removes the gradient counts (TRL's is_low/high_clipped).
        low = (clip_ratio < 1 - epsilon_low) & (adv < 0)
        high = (clip_ratio > 1 + epsilon_high) & (adv > 0)
    elif loss_type == "cispo":
        low = torch.zeros_like(mask)  # CISPO caps its weight from above only
        high = (ratio > epsilon_high) & (adv > 0)
    else:
        low = high = torch.zeros_like(ratio, dtype=torch.bool)
    num_tokens = mask.sum().to(torch.float32)

    def token_mean(values: Tensor) -> Tensor:
        kept = torch.where(mask, values.to(torch.float32), torch.zeros((), device=mask.device))
        # clamp: a micro-batch without completion tokens reports 0, not 0/0
        return kept.sum() / num_tokens.clamp(min=1)

    def ratio_mean(values: Tensor) -> Tensor:
        # float(): boolean clip masks cannot be averaged as they are
        return values.float().mean() if per_sequence else token_mean(values)

    return {
        "num_tokens": num_tokens,
        "clip_low_fraction": ratio_mean(low),
        "clip_high_fraction": ratio_mean(high),
        "clip_region_fraction": ratio_mean(low | high),
        "mean_ratio": ratio_mean(ratio),
        "mean_kl": None if kl is None else token_mean(kl),
    }


def _check_loss_inputs(
    logps: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    old_logps: Tensor | None,
    ref_logps: Tensor | None,
) -> None:
    if logps.dim() != 2:
        raise ValueError(f"logps must be [n, L], got shape {tuple(logps.shape)}")
    shape = tuple(logps.shape)
    named = {"completion_mask": completion_mask, "old_logps": old_logps, "ref_logps": ref_logps}
    for name, tensor in named.items():
        if tensor is not None and tuple(tensor.shape) != shape:
            raise ValueError(
                f"{name} must have the shape of logps {shape}, got {tuple(tensor.shape)}"
            )
    if tuple(advantages.shape) != shape[:1]:
        raise ValueError(
            f"advantages must be [n] = [{shape[0]}] (one per completion), "
            f"got {tuple(advantages.shape)}"
        )


def _check_coefficients(
    epsilon_low: float, epsilon_high: float, beta: float, ref_logps: Tensor | None
) -> None:
    # eps_low = 1 would make the clip floor 1 - eps = 0, a ratio bound that clips nothing
    if not 0 <= epsilon_low < 1:
        raise ValueError(f"epsilon_low must be in [0, 1) (ratio floor 1 - eps), got {epsilon_low}")
    if not epsilon_high >= 0:  # `not >= 0`: NaN is refused too
        raise ValueError(f"epsilon_high must be >= 0, got {epsilon_high}")
    if not beta >= 0:  # NaN is refused too
        raise ValueError(f"beta (KL coefficient) must be >= 0, got {beta}")
    if beta > 0 and ref_logps is None:
        raise ValueError(
            f"beta={beta} > 0 needs ref_logps (the reference policy's log-probabilities); "
            "pass them or set beta=0"
        )
