"""One policy update on a scored batch: reference and old log-probs, mini- and micro-batches.

Orchestration only: log-probabilities, losses, normalisers and micro-batch plans come from
:mod:`mtgrpo.policy`. Under data parallelism every process trains on its own rows; loss
normalisers are the whole batch's (summed over processes, divided by the number of processes,
because DDP averages gradients), so the gradient does not depend on how rows are split.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mtgrpo._config_types import parse_bytes
from mtgrpo.algo.engine_correction import EngineCorrection, importance_weights
from mtgrpo.algo.losses import LossOptions, loss_value_needs_logps
from mtgrpo.algo.sampling import ScoredGroup
from mtgrpo.algo.token_weights import AdaptiveEntropy, entropy_threshold, high_entropy_mask
from mtgrpo.config import TrainConfig
from mtgrpo.policy import (
    LossNormalizer,
    LossOutput,
    PolicyBatch,
    activation_cost,
    clip_gradients,
    per_sequence_objective,
    plan_micro_batches,
    policy_loss,
    resolve_logprob_path,
    sequence_logprobs,
)
from mtgrpo.rollout.worker import Estimate

__all__ = ["PolicyUpdater", "UpdateOutput", "batch_advantages", "engine_correction",
           "group_policy_batch", "loss_options", "pad_policy_batch"]


def engine_correction(args: TrainConfig) -> EngineCorrection | None:
    """The engine's importance correction the run asks for (TRL's ``use_vllm`` and
    ``vllm_importance_sampling_*``), or None."""
    if not (args.vllm.use_vllm and args.vllm.vllm_importance_sampling_correction):
        return None
    return EngineCorrection(args.vllm.vllm_importance_sampling_mode,
                            args.vllm.vllm_importance_sampling_clip_min,
                            args.vllm.vllm_importance_sampling_clip_max)


def loss_options(args: TrainConfig, entropy_coef: float = 0.0) -> LossOptions:
    """TRL's loss options of ``args`` (the entropy coefficient is the controller's)."""
    return LossOptions(
        importance_sampling_level=args.loss.importance_sampling_level, delta=args.loss.delta,
        sapo_temperature_pos=args.loss.sapo_temperature_pos,
        sapo_temperature_neg=args.loss.sapo_temperature_neg, vespo_k_pos=args.loss.vespo_k_pos,
        vespo_lambda_pos=args.loss.vespo_lambda_pos, vespo_k_neg=args.loss.vespo_k_neg,
        vespo_lambda_neg=args.loss.vespo_lambda_neg,
        use_bias_correction_kl=args.loss.use_bias_correction_kl,
        off_policy_threshold=args.loss.off_policy_mask_threshold, entropy_coef=entropy_coef,
    )

logger = logging.getLogger(__name__)

# a token budget no micro-batch reaches: without max_tokens_per_microbatch only max_rows cuts
_UNBOUNDED_TOKENS = 1 << 62


def batch_advantages(groups: Sequence[ScoredGroup], estimate: Estimate | None = None
                     ) -> np.ndarray:
    """``[len(groups) * G]`` float64: the advantages the update trains on, each group's own
    (the rollout worker computed them when it scored the group), or ``estimate`` run again over
    these groups when given: a batch-level estimator (``scale_rewards="batch"``, ``gdpo``)
    normalises over the trained batch, which exists only once the sampler has chosen it."""
    if estimate is not None:
        rewards = np.concatenate([g.rewards for g in groups])  # [B*G, R]
        return estimate(rewards, groups[0].group_size).advantages
    return np.concatenate([g.advantages for g in groups])


def group_policy_batch(groups: Sequence[ScoredGroup], advantages: np.ndarray, local: list[int],
                       pad_token_id: int, *, has_rows: bool = True,
                       mask_truncated: bool = False, device: torch.device | None = None,
                       sampling_logps: Callable[[list[Any]], list[list[float]] | None]
                       | None = None) -> PolicyBatch:
    """The groups ``local`` (indices into ``groups``; ``advantages [len(groups) * G]``) as one
    padded :class:`PolicyBatch`. ``has_rows=False``: a padding batch every row of which is
    masked out (a process without a group of its own still joins the collectives);
    ``mask_truncated``: TRL's ``mask_truncated_completions``; ``sampling_logps(payloads)``: the
    engine's log-probs of the rows, for its importance correction."""
    g = groups[0].group_size
    payloads = [groups[i].payload for i in local]
    # a padding group's rows all weigh 0: it runs the forwards and collectives, trains nothing
    weight = [has_rows] * (len(local) * g)
    if mask_truncated:
        # TRL 1.16 zeroes a truncated row's completion_mask (loss and attention alike)
        finished = [f for p in payloads for f in p.finished]
        weight = [w and f for w, f in zip(weight, finished, strict=True)]
    return pad_policy_batch(
        [ids for p in payloads for ids in p.row_prompt_ids],
        [c for p in payloads for c in p.completion_ids],
        np.concatenate([advantages[i * g:(i + 1) * g] for i in local]), pad_token_id,
        completion_weight=weight, device=device,
        sampling_logps=None if sampling_logps is None else sampling_logps(payloads),
        tool_masks=[m for p in payloads for m in (p.tool_mask or [None] * g)],
    )


def pad_policy_batch(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    advantages: np.ndarray | Tensor,
    pad_token_id: int,
    *,
    completion_weight: list[bool] | None = None,
    device: torch.device | None = None,
    sampling_logps: list[list[float]] | None = None,
    tool_masks: list[list[int] | None] | None = None,
) -> PolicyBatch:
    """Left-pad prompts and right-pad completions into a :class:`PolicyBatch` (TRL's layout).

    ``completion_weight[i] = False`` masks row ``i`` out of the loss entirely (a truncated
    completion under ``mask_truncated_completions``, or a padding row). ``tool_masks[i]``:
    row ``i``'s tool mask (1 = a model token; None: every token is the model's).
    ``advantages [n]``: the rewards' path is numpy up to here, where it becomes float32 torch.
    """
    n = len(prompt_ids)
    p = max(len(ids) for ids in prompt_ids)
    # sequence_logprobs scores at least one completion column, even when every row is empty
    length = max(max((len(ids) for ids in completion_ids), default=1), 1)
    prompt = torch.full((n, p), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, p), dtype=torch.long)
    completion = torch.full((n, length), pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros((n, length), dtype=torch.long)
    for i, (pr, co) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        # left-padded, as TRL: every prompt ends where its completion starts
        prompt[i, p - len(pr):] = torch.tensor(pr, dtype=torch.long)
        prompt_mask[i, p - len(pr):] = 1
        if co:
            completion[i, : len(co)] = torch.tensor(co, dtype=torch.long)
            completion_mask[i, : len(co)] = 1
    if completion_weight is not None:
        # [n, 1]: broadcast over the columns, so a dropped row has no token left at all
        keep = torch.tensor(completion_weight, dtype=torch.long).unsqueeze(1)
        completion_mask = completion_mask * keep
    engine = None
    if sampling_logps is not None:
        engine = torch.zeros((n, length), dtype=torch.float32)
        for i, row in enumerate(sampling_logps):
            engine[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
        engine = engine.to(device)
    tools = None
    if tool_masks is not None and any(m is not None for m in tool_masks):
        # 1 by default: a row without a tool mask is every token the model's own
        tools = torch.ones((n, length), dtype=torch.long)
        for i, row in enumerate(tool_masks):
            if row is not None:
                tools[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        tools = tools.to(device)
    return PolicyBatch(
        prompt_ids=prompt.to(device), prompt_mask=prompt_mask.to(device),
        completion_ids=completion.to(device), completion_mask=completion_mask.to(device),
        advantages=torch.as_tensor(advantages).to(device=device, dtype=torch.float32),
        sampling_logps=engine,
        tool_mask=tools,
    )


@dataclass
class UpdateOutput:
    """What one update measured (``n`` = this process's rows)."""

    metrics: dict[str, float]
    objective_before: np.ndarray  # [n] per-sequence GRPO objective at θ_t (= the advantages)
    objective_after: np.ndarray | None = None  # [n] the same after the update, if measured
    old_logps: Tensor | None = None  # [n, L] the rows' log-probs at θ_t, if kept
    optimizer_steps: int = 0
    losses: list[LossOutput] = field(default_factory=list)


class PolicyUpdater:
    """Runs ``num_iterations`` × ``updates_per_generation()`` optimizer steps on a batch.

    ``reference`` is a context manager factory whose block computes log-probs under the
    reference policy (the adapter disabled under LoRA, or ``None`` when ``beta == 0``);
    ``reference_model`` is the module to score under it. ``autocast``: the mixed-precision
    context of the forward passes (default: the accelerator's). ``entropy`` is the entropy-bonus
    coefficient (constant or adaptive, updated once per optimizer step); ``entropy_mask`` maps
    a micro-batch's entropies and mask to the tokens to train on (``top_entropy_quantile``;
    the trainer's ``get_high_entropy_mask``, which gathers across processes).
    """

    def __init__(
        self,
        args: TrainConfig,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        accelerator: Any,
        *,
        reference_model: torch.nn.Module | None = None,
        reference: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        logprob_chunk_size: int = 512,
        entropy_mask: Callable[[Tensor, Tensor, float], Tensor] | None = None,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        sharded: bool = False,
        engine: Any = None,
    ) -> None:
        self.config = args
        # DeepSpeed (mtgrpo.trainer.deepspeed.ZeroEngine): its engine runs backward and step
        self.engine = engine
        # a sharded model gathers its shards in every forward and scatters gradients in every
        # backward: every process must run as many micro-batches as the others
        self.sharded = sharded and accelerator.num_processes > 1
        self.autocast = autocast or accelerator.autocast
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        # the rate the last optimizer step used (read before the scheduler's step), logged
        self.used_learning_rate = float("nan")
        self.accelerator = accelerator
        self.reference_model = reference_model
        self.reference = reference or contextlib.nullcontext
        self.chunk_size = logprob_chunk_size
        self.entropy = AdaptiveEntropy(
            coef=args.loss.entropy_coef, adaptive=args.loss.use_adaptive_entropy,
            target=args.loss.entropy_target, delta=args.loss.entropy_coef_delta,
            minimum=args.loss.entropy_coef_min, maximum=args.loss.entropy_coef_max,
        )
        self.entropy_mask = entropy_mask or _local_entropy_mask
        # the planned tokens of a micro-batch: a row count when None (TRL's micro-batches)
        self.token_budget = args.batch.max_tokens_per_microbatch
        if args.batch.max_memory_per_microbatch is not None:
            self.token_budget = self._tokens_within_memory()

    @property
    def _needs_entropy(self) -> bool:
        args = self.config
        return (args.output.log_entropy or self.entropy.enabled
                or args.loss.top_entropy_quantile < 1.0)

    def _tokens_within_memory(self) -> int:
        """``max_memory_per_microbatch`` as a token budget: the policy's activation cost
        measured on two synthetic rows (half and all of the longest row a run allows), before
        the first step, so a budget too small for one row fails before any generation."""
        args = self.config
        model = self.accelerator.unwrap_model(self.model)
        rollout = args.rollout
        width = (rollout.max_prompt_length or rollout.max_completion_length) \
            + rollout.max_completion_length
        vocab = model.get_output_embeddings().weight.shape[0]
        device = next(model.parameters()).device

        def forward(tokens: int) -> Any:
            ids = torch.randint(vocab, (1, tokens), device=device)
            row = SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids),
                                  completion_length=max(1, tokens // 2))
            # autograd saves tensors only with grad on: what the measurement counts
            with torch.enable_grad():
                return self._logps(model, row, entropy=self._needs_entropy)

        # two lengths 0 < short < long for the two-point fit, each of at least one prompt and
        # one completion token
        cost = activation_cost(model, forward, (max(2, width // 2), max(3, width)),
                               head_chunk=self.chunk_size, vocab=vocab)
        budget = parse_bytes(args.batch.max_memory_per_microbatch, "max_memory_per_microbatch")
        tokens = cost.tokens_within(budget, width=width, name="max_memory_per_microbatch")
        logger.info("micro-batches of up to %d tokens: max_memory_per_microbatch=%s at %.1f KiB "
                    "per token saved for the backward pass and %.0f MiB fixed", tokens,
                    args.batch.max_memory_per_microbatch, cost.per_token / 2**10,
                    cost.fixed / 2**20)
        return tokens

    # ------------------------------------------------------------------ scoring
    def _plan(self, batch: PolicyBatch, rows: list[int]) -> list[list[int]]:
        lengths = batch.lengths()[rows]
        budget = self.token_budget
        # A padding-free forward computes no padding: length buckets would only split rows
        # (and their shared prompts) across more micro-batches.
        packed = self.config.batch.padding_free and resolve_logprob_path(self.model).packed
        plan = plan_micro_batches(
            lengths, budget or _UNBOUNDED_TOKENS,
            # no token budget: TRL's micro-batches, a fixed row count
            max_rows=None if budget else self.config.batch.per_device_train_batch_size,
            max_padding=1.0 if packed else self.config.batch.max_padding_fraction,
        )
        plan = [[rows[i] for i in micro] for micro in plan]
        if self.accelerator.num_processes == 1:
            return plan
        if self.sharded or self._gathers_entropy:
            # a collective in every micro-batch (the shards' gathers, the entropy quantile's):
            # filler passes (empty row lists) up to the longest plan of any process
            plan += [[] for _ in range(self._max_over_processes(len(plan)) - len(plan))]
        elif not plan:
            # no rows in this optimizer step's part: one filler pass, whose backward joins the
            # gradient all-reduce the other processes' last micro-batch starts
            plan = [[]]
        return plan

    @property
    def _gathers_entropy(self) -> bool:
        """The high-entropy token mask's quantile is taken over every process's tokens, one
        gather per micro-batch (TRL's top_entropy_quantile)."""
        return self.config.loss.top_entropy_quantile < 1.0 and self.accelerator.num_processes > 1

    @staticmethod
    def _filler(batch: PolicyBatch) -> PolicyBatch:
        """The micro-batch of a filler pass: one row (a process's batch always has one),
        forwarded so that the collectives of a sharded model happen, and contributing nothing
        (its loss is multiplied by 0)."""
        return batch.select([0])

    def _logps(self, model: torch.nn.Module, part: PolicyBatch, entropy: bool = False):
        with self.autocast():
            return sequence_logprobs(
                model, part.input_ids, part.attention_mask, part.completion_length,
                temperature=self.config.rollout.temperature, chunk_size=self.chunk_size,
                compute_entropy=entropy, pack=self.config.batch.padding_free,
                # a graph through the entropy only for the entropy bonus of the loss
                entropy_grad=self.entropy.enabled,
            )

    @torch.no_grad()
    def score(self, batch: PolicyBatch, model: torch.nn.Module | None = None) -> Tensor:
        """``[N, L]`` log-probs of every row under ``model`` (default: the policy), no grad."""
        model = model or self.model
        out = torch.zeros(batch.completion_ids.shape, dtype=torch.float32,
                          device=batch.completion_ids.device)
        for rows in self._plan(batch, list(range(batch.num_rows))):
            if not rows:  # a filler pass of a sharded model
                self._logps(model, self._filler(batch))
                continue
            part = batch.select(rows)
            logps = self._logps(model, part).logps
            # select() dropped the micro-batch's trailing padding columns: write back only those
            # it kept; the rest stay 0, the log-prob of a padded position
            out[rows, : part.completion_length] = logps.float()
        return out

    def _with_logps(self, batch: PolicyBatch, need_old: bool) -> PolicyBatch:
        ref = None
        # TRL 1.16: no reference forward at beta = 0, where the KL term is not computed
        if self.config.loss.beta > 0:
            with self.reference():
                ref = self.score(batch, self.reference_model or self.model)
        old = self.score(batch) if need_old else None
        return replace(batch, old_logps=old, ref_logps=ref)

    # ------------------------------------------------------------------ the update
    def _normalizer(self, batch: PolicyBatch, rows: list[int], micro_batches: int,
                    has_rows: bool = True):
        # a collective every process runs: the normalisers are the whole batch's; a padding
        # batch's rows (has_rows False: a process without a group of its own) are no sequences
        # of the batch, so they do not dilute the per-sequence mean of grpo, dr_grpo and sapo
        local = torch.tensor([len(rows) if has_rows else 0, int(batch.loss_mask[rows].sum())],
                             dtype=torch.float64)
        world = self.accelerator.num_processes
        total = self.accelerator.reduce(local.to(self.accelerator.device), "sum").cpu()
        return LossNormalizer(
            # divided by the process count: DDP averages the gradients over processes
            num_sequences=max(float(total[0]) / world, 1e-12),
            num_tokens=float(total[1]) / world,
            max_completion_length=self.config.rollout.max_completion_length,
            # a step whose part is empty on this process computes no loss with it
            num_micro_batches=max(micro_batches, 1),
        )

    def _optimizer_step(self, batch: PolicyBatch, rows: list[int], outputs: list[LossOutput],
                        logps_at_start: Tensor | None, entropies: list[Tensor],
                        has_rows: bool = True) -> float:
        plan = self._plan(batch, rows)
        # filler passes are not micro-batches: bnpo divides by the real ones' count
        normalizer = self._normalizer(batch, rows, sum(1 for micro in plan if micro), has_rows)
        options = loss_options(self.config, self.entropy.applied)
        first = len(outputs)
        for i, micro in enumerate(plan):
            # the step's last micro-batch: DDP all-reduces there only (earlier ones accumulate
            # under no_sync); DeepSpeed's accumulation boundary
            sync = i == len(plan) - 1
            # a filler pass too: under DDP only the last micro-batch's backward all-reduces,
            # whichever process has rows in it
            context = contextlib.nullcontext() if sync or self.engine is not None \
                else self.accelerator.no_sync(self.model)
            if not micro:  # a filler pass of a sharded model: gathers and scatters, adds 0
                with context:
                    scored = self._logps(self.model, self._filler(batch))
                    if self._gathers_entropy:  # joins the quantile's gather with no tokens
                        empty = torch.zeros(1, 1, device=scored.logps.device)
                        self.entropy_mask(empty, empty,
                                          1 - self.config.loss.top_entropy_quantile)
                    # a real backward with a zero loss: the shards' reduce-scatter runs on
                    # every process
                    self._backward(scored.logps.sum() * 0.0, sync)
                continue
            part = batch.select(micro)
            with context:
                scored = self._logps(self.model, part, entropy=self._needs_entropy)
                out = self._loss(scored, part, normalizer, options)
                self._backward(out.loss, sync)
            outputs.append(out)
            if scored.entropy is not None:
                mask = part.loss_mask.bool()
                entropies.append(scored.entropy.detach()[mask].float())
            if logps_at_start is not None:
                logps_at_start[micro, : part.completion_length] = scored.logps.detach().float()
        # the logged rate is the one this step used, read before the scheduler moves on
        # (transformers 5.24's _inner_training_loop reads it before lr_scheduler.step())
        self.used_learning_rate = float(self.scheduler.get_last_lr()[0])
        grad_norm = self._step()
        # transformers' order: the optimizer, then the scheduler, once per optimizer step
        self.scheduler.step()
        if self.entropy.enabled:
            self.entropy.update(self._trained_entropy(outputs[first:]))
        return float(grad_norm)

    def _backward(self, loss: Tensor, last: bool) -> None:
        """One micro-batch's backward (``last``: the optimizer step's last micro-batch)."""
        if self.engine is not None:
            self.engine.backward(loss, last)
        else:
            self.accelerator.backward(loss)

    def _step(self) -> float:
        """Clip the gradients to ``max_grad_norm`` and take the optimizer step (a DeepSpeed
        engine clips to its ``gradient_clipping``, the same value); their norm before
        clipping."""
        if self.engine is not None:
            return self.engine.step()  # the engine zeroes the gradients itself
        # max_grad_norm 0 measures without clipping, as transformers' `max_grad_norm > 0` test
        max_norm = self.config.optimization.max_grad_norm or None
        # FSDP's gradient norm must be reduced over the shards (clip_gradients' docstring)
        if self.accelerator.distributed_type.value == "FSDP":
            grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm)
        else:
            grad_norm = clip_gradients(self.model, max_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # frees the gradients' memory
        return float(grad_norm)

    def _loss(self, scored: Any, part: PolicyBatch, normalizer: LossNormalizer,
              options: LossOptions) -> LossOutput:
        args, mask = self.config, part.loss_mask
        entropy = scored.entropy
        token_mask = None
        if args.loss.top_entropy_quantile < 1.0:
            token_mask = self.entropy_mask(entropy.detach(), mask,
                                           1 - args.loss.top_entropy_quantile)
        return policy_loss(
            scored.logps, part.advantages, mask, old_logps=part.old_logps,
            ref_logps=part.ref_logps, loss_type=args.loss.loss_type, epsilon_low=args.loss.epsilon,
            epsilon_high=args.resolved_epsilon_high, beta=args.loss.beta, normalizer=normalizer,
            options=options, entropy=entropy if self.entropy.enabled else None,
            token_mask=token_mask, token_weight=self._engine_weights(scored, part),
        )

    def _engine_weights(self, scored: Any, part: PolicyBatch) -> Tensor | None:
        """The engine's importance-correction weights of a micro-batch (vLLM's
        ``vllm_importance_sampling_correction``): from the log-probs at θ_t (the old ones, or
        this forward's, which are θ_t's with one optimizer step per batch) and the engine's."""
        correction = engine_correction(self.config)
        if correction is None or part.sampling_logps is None:
            return None
        at_start = part.old_logps if part.old_logps is not None else scored.logps.detach()
        return importance_weights(at_start.float(), part.sampling_logps, part.loss_mask,
                                  correction)

    def _trained_entropy(self, outputs: list[LossOutput]) -> float:
        """Token mean of the trained tokens' entropy over one optimizer step, all processes."""
        # [2]; a process whose part of the step was empty joins the reduce with zeros
        stats = (torch.stack([o.trained_entropy for o in outputs]).sum(0).double() if outputs
                 else torch.zeros(2, dtype=torch.float64))
        total = self.accelerator.reduce(stats.to(self.accelerator.device), "sum").cpu()
        # no trained token on any process: 0 rather than NaN
        return float(total[0] / total[1].clamp(min=1))

    def _max_over_processes(self, value: int) -> int:
        """The largest of every process's ``value`` (one gather, a collective; ``value`` itself
        on one process)."""
        if self.accelerator.num_processes == 1:
            return value
        count = torch.tensor([value], device=self.accelerator.device)
        return int(self.accelerator.gather(count).max())

    def _mini_batches(self, num_rows: int, largest: int) -> list[list[int]]:
        return mini_batch_parts(num_rows, self.config.updates_per_generation(), largest)

    def update(self, batch: PolicyBatch, measure_after: bool = False,
               keep_old_logps: bool = False, max_steps: int | None = None,
               has_rows: bool = True) -> UpdateOutput:
        """Train on ``batch``; optionally re-score it afterwards for MT-GRPO's ``I_k``.
        ``keep_old_logps``: return the rows' log-probs at θ_t (``UpdateOutput.old_logps``: the
        old log-probs of several updates, else those of the one update's forward pass, at no
        extra cost). ``max_steps``: take at most this many optimizer steps (the run's last
        batch, when TRL's ``max_steps`` ends inside it). ``has_rows=False``: ``batch`` is a
        padding batch (:func:`group_policy_batch`), whose rows count in no normaliser."""
        # as TRL: one optimizer step per batch needs no old log-probs (the ratio starts at 1)
        multi = self.config.batch.num_iterations > 1 or self.config.updates_per_generation() > 1
        batch = self._with_logps(batch, need_old=multi)
        capture = None
        if (measure_after or keep_old_logps) and not multi:
            capture = torch.zeros(batch.completion_ids.shape, dtype=torch.float32,
                                  device=batch.completion_ids.device)
        outputs: list[LossOutput] = []
        entropies: list[Tensor] = []
        grad_norms = []
        self.model.train()
        # TRL's order: every mini-batch of the batch, then the whole pass again (num_iterations)
        largest = self._max_over_processes(batch.num_rows)  # the most rows any process holds
        steps = [rows for _ in range(self.config.batch.num_iterations)
                 for rows in self._mini_batches(batch.num_rows, largest)]
        for rows in steps[:max_steps]:
            # Without old log-probs there is exactly one optimizer step, whose forward
            # pass scores every row at θ_t: keep those log-probs for the I_k measurement.
            grad_norms.append(self._optimizer_step(batch, rows, outputs, capture, entropies,
                                                   has_rows))
        result = UpdateOutput(
            metrics=self._metrics(outputs, entropies, grad_norms),
            # at θ_t the ratio is 1, so each row's objective is its advantage
            # (0 for a row with no loss token, e.g. a truncated row under
            # mask_truncated_completions: per_sequence_objective gives it 0 after the update too)
            objective_before=torch.where(
                batch.loss_mask.bool().any(dim=-1), batch.advantages.detach(), 0.0,
            ).cpu().numpy().astype(np.float64),
            optimizer_steps=len(grad_norms),
            losses=outputs,
        )
        at_start = batch.old_logps if multi else capture
        if keep_old_logps:
            result.old_logps = at_start
        if measure_after:
            result.objective_after = self._objective_after(batch, at_start)
        return result

    def _objective_after(self, batch: PolicyBatch, logps_at_start: Tensor) -> np.ndarray:
        # no dropout: the re-score measures the update's change to the weights alone
        self.model.eval()
        after = self.score(batch)
        self.model.train()
        objective = per_sequence_objective(
            after, batch.advantages, batch.loss_mask, old_logps=logps_at_start,
            epsilon_low=self.config.loss.epsilon, epsilon_high=self.config.resolved_epsilon_high,
        )
        return objective.cpu().numpy().astype(np.float64)

    def _metrics(self, outputs: list[LossOutput], entropies: list[Tensor],
                 grad_norms: list[float]) -> dict[str, float]:
        """The step's figures over every process's rows (one all-reduce; transformers gathers
        the loss and TRL its metrics across processes): the loss is the mean of the processes'
        shares (DDP's gradient mean), the fractions, KL and entropy are token-weighted."""
        steps = max(len(grad_norms), 1)
        tokens = torch.stack([o.num_tokens.double() for o in outputs])  # [M] per micro-batch

        def token_sum(values: list[Tensor]) -> Tensor:
            return (torch.stack([v.double() for v in values]) * tokens).sum()

        # every entry on the device the losses are on: torch.stack refuses mixed devices
        device = outputs[0].loss.device
        zero = torch.zeros((), dtype=torch.float64, device=device)
        trained = torch.cat(entropies).double().to(device) if entropies else \
            torch.zeros(0, dtype=torch.float64, device=device)
        kl = outputs[0].mean_kl is not None
        # [loss, policy loss, tokens, clip low, high, region (token sums), kl, entropy sum, count]
        local = torch.stack([
            torch.stack([o.loss.detach().double() for o in outputs]).sum(),
            torch.stack([torch.as_tensor(o.policy_loss, device=device).detach().double()
                         for o in outputs]).sum() if self.entropy.enabled else zero,
            tokens.sum(),
            token_sum([o.clip_low_fraction for o in outputs]),
            token_sum([o.clip_high_fraction for o in outputs]),
            token_sum([o.clip_region_fraction for o in outputs]),
            token_sum([o.mean_kl for o in outputs]) if kl else zero,
            trained.sum(),
            torch.tensor(float(trained.numel()), dtype=torch.float64, device=device),
        ]).cpu()
        world = self.accelerator.num_processes
        if world > 1:  # a collective every process runs: update() is called on each
            local = self.accelerator.reduce(local.to(self.accelerator.device), "sum").cpu()
        (loss, policy_loss_sum, token_count, low, high, region, kl_sum, entropy_sum,
         entropy_count) = local.tolist()  # one device read
        per_token = max(token_count, 1.0)
        metrics = {
            # each micro-batch's loss is its share of its optimizer step's (whole-batch
            # normalisers, divided by the processes as DDP averages): summed over micro-batches
            # and processes, the processes' mean, then the mean over the optimizer steps
            "loss": loss / world / steps,
            "clip_ratio/low": low / per_token,
            "clip_ratio/high": high / per_token,
            "clip_ratio/region": region / per_token,
            "grad_norm": float(np.mean(grad_norms)) if grad_norms else float("nan"),
            "learning_rate": self.used_learning_rate,  # the last optimizer step's
        }
        if kl:
            metrics["kl"] = kl_sum / per_token
        if entropies:
            metrics["entropy"] = entropy_sum / max(entropy_count, 1.0)
        if self.entropy.enabled:
            metrics["policy_loss"] = policy_loss_sum / world / steps
            metrics["entropy_coef"] = self.entropy.coef
        return metrics

    @torch.no_grad()
    def evaluation_loss(self, batch: PolicyBatch, has_rows: bool = True) -> float:
        """The loss on an evaluation batch at the current policy (ratio 1, no update).

        Where that value does not depend on the log-probabilities
        (:func:`~mtgrpo.algo.losses.loss_value_needs_logps`: ``beta = 0`` and a loss type
        without a ``logp`` factor, which covers TRL's default ``dapo``), no forward pass runs:
        the same :func:`policy_loss` is evaluated on zero log-probabilities, the same number
        as after a forward (ratio exactly 1 either way) for none of its cost (on a CPU about
        half of an evaluation's time, the other half being generation)."""
        forward = loss_value_needs_logps(self.config.loss.loss_type, self.config.loss.beta)
        if forward:
            batch = self._with_logps(batch, need_old=False)
        plan = self._plan(batch, list(range(batch.num_rows)))
        normalizer = self._normalizer(batch, list(range(batch.num_rows)),
                                      sum(1 for rows in plan if rows), has_rows)
        total = 0.0
        for rows in plan:
            if not rows:  # a filler pass of a sharded model
                if forward:
                    self._logps(self.model, self._filler(batch))
                continue
            part = batch.select(rows)
            logps = (self._logps(self.model, part, entropy=False).logps if forward
                     else torch.zeros(part.completion_mask.shape, dtype=torch.float32,
                                      device=part.completion_mask.device))
            total += float(policy_loss(
                logps, part.advantages, part.loss_mask, ref_logps=part.ref_logps,
                loss_type=self.config.loss.loss_type, epsilon_low=self.config.loss.epsilon,
                epsilon_high=self.config.resolved_epsilon_high, beta=self.config.loss.beta,
                normalizer=normalizer, options=loss_options(self.config),
            ).loss)
        world = self.accelerator.num_processes
        if world > 1:  # the processes' mean: each share's normaliser is the batch's / world
            total = float(self.accelerator.reduce(
                torch.tensor(total, dtype=torch.float64, device=self.accelerator.device),
                "sum")) / world
        return total


def mini_batch_parts(num_rows: int, parts: int, largest: int) -> list[list[int]]:
    """The rows of each optimizer step of a batch: ``num_rows`` split into ``parts``
    contiguous parts in batch order (TRL 1.16 shuffles the rows first, with
    ``shuffle_sequence_dict``). A part left empty (fewer rows than parts) is dropped where it
    is empty on every process (``largest``: the most rows a process holds; array_split empties
    the same trailing parts of any smaller count) and kept where another process has rows in
    it: every process takes that optimizer step (gradients all-reduced, the normaliser a
    collective), an empty part as a filler pass."""
    split = np.array_split(np.arange(num_rows), parts)
    return [part.tolist() for index, part in enumerate(split) if len(part) or index < largest]


def _local_entropy_mask(entropies: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """The high-entropy mask over this process's tokens (the trainer passes a gathering one)."""
    return high_entropy_mask(entropies, mask, entropy_threshold(entropies[mask.bool()], quantile))
