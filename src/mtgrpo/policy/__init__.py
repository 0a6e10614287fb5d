"""The policy room: log-probabilities, the GRPO loss family, micro-batching, optimizer helpers.

One update of the policy on a scored batch, read top to bottom::

    batch = PolicyBatch(prompt_ids, prompt_mask, completion_ids, completion_mask, advantages)
    normalizer = LossNormalizer.for_batch(batch.completion_mask, max_completion_length=L_max)
    plan = plan_micro_batches(batch.lengths(), max_tokens_per_micro_batch=8192)
    for rows in plan:
        part = batch.select(rows)              # padding columns of these rows trimmed
        scored = sequence_logprobs(model, part.input_ids, part.attention_mask,
                                   part.completion_length, temperature=temperature)
        out = policy_loss(scored.logps, part.advantages, part.completion_mask,
                          old_logps=part.old_logps, ref_logps=part.ref_logps,
                          loss_type="dapo", normalizer=normalizer)
        out.loss.backward()                    # accumulated gradients = full-batch gradient
    grad_norm = clip_gradients(model, max_norm=1.0)
    optimizer.step(); scheduler.step(); optimizer.zero_grad()

Formulas and sources are in each module's docstring (ALGORITHMS.md section 3, TRL 1.16).
"""

from mtgrpo.algo.losses import (
    LOSS_TYPES,
    LossNormalizer,
    LossOutput,
    combine_loss_outputs,
    per_sequence_objective,
    policy_loss,
)
from mtgrpo.fast import plan_micro_batches
from mtgrpo.policy.logprobs import (
    DEFAULT_CHUNK_SIZE,
    LOGIT_TRANSFORM_FIELDS,
    LogprobOutput,
    LogprobPath,
    LogprobRoute,
    entropy_from_logits,
    position_ids_from_attention_mask,
    resolve_logprob_path,
    selective_log_softmax,
    sequence_logprobs,
)
from mtgrpo.policy.memory_budget import ActivationCost, activation_cost
from mtgrpo.policy.micro_batches import PolicyBatch
from mtgrpo.policy.optim import (
    SCHEDULERS,
    build_optimizer,
    build_scheduler,
    clip_gradients,
    no_decay_parameter_names,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "LOGIT_TRANSFORM_FIELDS",
    "LOSS_TYPES",
    "SCHEDULERS",
    "ActivationCost",
    "LogprobOutput",
    "LogprobPath",
    "LogprobRoute",
    "LossNormalizer",
    "LossOutput",
    "PolicyBatch",
    "activation_cost",
    "build_optimizer",
    "build_scheduler",
    "clip_gradients",
    "combine_loss_outputs",
    "entropy_from_logits",
    "no_decay_parameter_names",
    "per_sequence_objective",
    "plan_micro_batches",
    "policy_loss",
    "position_ids_from_attention_mask",
    "resolve_logprob_path",
    "selective_log_softmax",
    "sequence_logprobs",
]
