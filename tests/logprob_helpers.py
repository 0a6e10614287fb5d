"""What the forward-equivalence tests compare: log-probs, entropies and every gradient."""

from __future__ import annotations

import torch

from mtgrpo.policy import sequence_logprobs


def scores_and_grads(model, input_ids, mask, completion_length: int, **options):
    """``(logps, entropy, {name: grad})`` of one ``sequence_logprobs`` call at temperature 0.7,
    backpropagated from a fixed weighting of the log-probs plus the entropies."""
    model.zero_grad()
    out = sequence_logprobs(model, input_ids, mask, completion_length, temperature=0.7,
                            compute_entropy=True, **options)
    weights = torch.linspace(-1.0, 2.0, out.logps.numel()).view_as(out.logps)
    ((out.logps * weights).sum() + out.entropy.sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out.logps.detach(), out.entropy.detach(), grads
