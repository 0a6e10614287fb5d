"""What the forward-equivalence tests compare: log-probs, entropies and every gradient."""

from __future__ import annotations

import torch

from mtgrpo.models import apply_lora
from mtgrpo.policy import sequence_logprobs


def active_lora(model, seed: int = 0, init_seed: int | None = None):
    """``model`` with a LoRA adapter that changes its output: the zero-initialised B matrices
    drawn from N(0, 0.5²) with ``seed``. ``init_seed`` seeds torch before the adapter is made
    (its A matrices); None leaves torch's generator as it is."""
    if init_seed is not None:
        torch.manual_seed(init_seed)
    policy = apply_lora(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:  # zero-initialised: make the adapter do something
                param.normal_(std=0.5, generator=generator)
    return policy


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


def two_groups(vocab: int, prompt: int, completion: int, lengths: tuple[int, int, int, int],
               seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` in TRL's layout: two prompts of ``prompt`` tokens (the
    second with 2 left pads) of two rows each, completions of ``lengths`` tokens right-padded
    to ``completion``, token ids drawn with ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, vocab, (2, prompt), generator=generator)
    prompt_mask = torch.ones(2, prompt, dtype=torch.long)
    prompt_mask[1, :2] = 0
    of_row = torch.tensor([0, 0, 1, 1])
    completions = torch.randint(1, vocab, (4, completion), generator=generator)
    completion_mask = (torch.arange(completion) < torch.tensor(lengths)[:, None]).long()
    input_ids = torch.cat([prompts[of_row] * prompt_mask[of_row], completions * completion_mask], 1)
    return input_ids, torch.cat([prompt_mask[of_row], completion_mask], 1)


def trainer_layout_logprobs(model, output, pad: int, temperature: float,
                            device: str | torch.device = "cpu") -> torch.Tensor:
    """``[N, L]`` ``sequence_logprobs`` of a generation backend's ``output`` rows in the
    trainer's layout (left-padded prompts, then right-padded completions), on the CPU: what
    the backend's own log-probs are compared with."""
    width, length = max(map(len, output.prompt_ids)), max(output.completion_lengths)
    input_ids = torch.full((len(output), width + length), pad, device=device)
    attention_mask = torch.zeros_like(input_ids)
    pairs = zip(output.prompt_ids, output.completion_ids, strict=True)
    for row, (prompt, completion) in enumerate(pairs):
        span = slice(width - len(prompt), width + len(completion))
        input_ids[row, span] = torch.tensor(prompt + completion, device=device)
        attention_mask[row, span] = 1
    with torch.no_grad():
        return sequence_logprobs(model, input_ids, attention_mask, length,
                                 temperature=temperature).logps.cpu()
