"""Length-bucketed micro-batches and the padded batch they are cut from.

A GRPO batch mixes short and long completions; splitting it in batch order makes every
micro-batch as wide as its longest row. :func:`~mtgrpo.fast.buckets.plan_micro_batches` sorts
rows by length and
packs them greedily under a padded-token budget (``rows x padded width``), and
:meth:`PolicyBatch.select` cuts a micro-batch out of the padded batch, dropping the columns that
are padding for all of its rows, so padding is neither stored nor computed.

Layout (TRL's): prompts are left-padded ``[N, P]``, completions right-padded ``[N, L]``, and the
model sees ``cat([prompt, completion], 1)``. The padded width of a set of rows is therefore
``max prompt length + max completion length``, which is what the planner budgets when it is
given ``[N, 2]`` lengths.

The loss normalisers must be those of the whole batch (see
:class:`~mtgrpo.algo.losses.LossNormalizer`), which is what makes the order and size of the
micro-batches irrelevant to the accumulated gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["PolicyBatch"]


@dataclass(frozen=True)
class PolicyBatch:
    """The padded tensors the policy loss needs, in TRL's layout.

    Rows are completions (``N = B*G``, group by group). Prompts are left-padded, so every
    row's last prompt column is a real token (the state that predicts the first completion
    token); completions are right-padded. ``old_logps`` are needed only with more than one
    update per generation batch, ``ref_logps`` only with a KL penalty.

    ``tool_mask`` (multi-turn rollouts, TRL's ``tool_mask``): 1 where the model sampled the
    completion token, 0 where a tool's reply put it there. Such tokens are attended to
    (``completion_mask`` is the attention) but carry no loss and no log-probability:
    the loss reads :attr:`loss_mask`.
    """

    prompt_ids: Tensor  # [N, P]
    prompt_mask: Tensor  # [N, P]
    completion_ids: Tensor  # [N, L]
    completion_mask: Tensor  # [N, L]
    advantages: Tensor  # [N]
    old_logps: Tensor | None = None  # [N, L]
    ref_logps: Tensor | None = None  # [N, L]
    sampling_logps: Tensor | None = None  # [N, L] the engine's, for its importance correction
    tool_mask: Tensor | None = None  # [N, L] 1 = sampled by the model, 0 = a tool's reply

    def __post_init__(self) -> None:
        _check_policy_batch(self)

    @property
    def num_rows(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def completion_length(self) -> int:
        """``L``, the number of completion columns (what ``sequence_logprobs`` scores)."""
        return self.completion_ids.shape[1]

    @property
    def loss_mask(self) -> Tensor:  # [N, L]
        """The completion tokens the loss trains on: the model's own, not the tools' replies."""
        if self.tool_mask is None:
            return self.completion_mask
        return self.completion_mask * self.tool_mask.to(self.completion_mask.dtype)

    @property
    def input_ids(self) -> Tensor:  # [N, P + L]
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:  # [N, P + L]
        return torch.cat([self.prompt_mask, self.completion_mask.to(self.prompt_mask.dtype)], 1)

    def lengths(self) -> Tensor:
        """``[N, 2]``: prompt span (from its first token) and completion span (to its last).

        For left-padded prompts and right-padded completions these are the token counts;
        they are the input :func:`~mtgrpo.fast.buckets.plan_micro_batches` budgets.
        """
        spans = [_prompt_spans(self.prompt_mask), _completion_spans(self.completion_mask)]
        return torch.stack(spans, dim=1)

    def select(self, rows: Sequence[int]) -> PolicyBatch:
        """The rows ``rows`` (in that order), without columns that are padding for all of them.

        Leading prompt columns and trailing completion columns that no selected row uses are
        dropped; at least one completion column is kept so the result stays scoreable.
        """
        if len(rows) == 0:
            raise ValueError("a micro-batch needs at least one row; got an empty row list")
        rows = [int(row) for row in rows]  # checked on the host: no device read
        if min(rows) < 0 or max(rows) >= self.num_rows:
            raise ValueError(
                f"row indices must be in [0, {self.num_rows - 1}], got {min(rows)}..{max(rows)}"
            )
        index = torch.as_tensor(rows, dtype=torch.long, device=self.prompt_ids.device)
        prompt_mask = self.prompt_mask[index]
        completion_mask = self.completion_mask[index]
        prompt_width = int(_prompt_spans(prompt_mask).max())
        # at least one completion column, so rows with empty completions stay scoreable
        completion_width = max(int(_completion_spans(completion_mask).max()), 1)
        # prompts are left-padded (TRL's layout): the unused columns are the leading ones
        prompt_cols = slice(self.prompt_ids.shape[1] - prompt_width, None)
        completion_cols = slice(0, completion_width)

        def completion_part(tensor: Tensor | None) -> Tensor | None:
            return None if tensor is None else tensor[index][:, completion_cols]

        return PolicyBatch(
            prompt_ids=self.prompt_ids[index][:, prompt_cols],
            prompt_mask=prompt_mask[:, prompt_cols],
            completion_ids=self.completion_ids[index][:, completion_cols],
            completion_mask=completion_mask[:, completion_cols],
            advantages=self.advantages[index],
            old_logps=completion_part(self.old_logps),
            ref_logps=completion_part(self.ref_logps),
            sampling_logps=completion_part(self.sampling_logps),
            tool_mask=completion_part(self.tool_mask),
        )


def _prompt_spans(prompt_mask: Tensor) -> Tensor:
    """Columns from each row's first prompt token to the end ``[N]``.

    Every row has a prompt token (checked by ``PolicyBatch``), so ``argmax`` (the first
    maximal entry) finds the first one.
    """
    # through uint8: torch's argmax does not take bool input
    first = prompt_mask.bool().to(torch.uint8).argmax(1)  # [N]
    return prompt_mask.shape[1] - first


def _completion_spans(completion_mask: Tensor) -> Tensor:
    """Columns up to and including each row's last completion token ``[N]`` (0 if none)."""
    present = completion_mask.bool()
    positions = torch.arange(1, present.shape[1] + 1, device=present.device)
    return torch.where(present, positions, torch.zeros_like(positions)).amax(1)


def _check_policy_batch(batch: PolicyBatch) -> None:
    rows = batch.prompt_ids.shape[0]
    if batch.prompt_ids.dim() != 2 or batch.prompt_mask.shape != batch.prompt_ids.shape:
        raise ValueError(
            f"prompt_ids and prompt_mask must both be [N, P]; got {tuple(batch.prompt_ids.shape)} "
            f"and {tuple(batch.prompt_mask.shape)}"
        )
    completion_shape = (rows, batch.completion_ids.shape[-1])
    named = {
        "completion_ids": batch.completion_ids,
        "completion_mask": batch.completion_mask,
        "old_logps": batch.old_logps,
        "ref_logps": batch.ref_logps,
        "tool_mask": batch.tool_mask,
    }
    for name, tensor in named.items():
        if tensor is not None and (tensor.dim() != 2 or tuple(tensor.shape) != completion_shape):
            raise ValueError(
                f"{name} must be [N, L] = {list(completion_shape)} (N from prompt_ids), "
                f"got {tuple(tensor.shape)}"
            )
    if tuple(batch.advantages.shape) != (rows,):
        raise ValueError(f"advantages must be [N] = [{rows}], got {tuple(batch.advantages.shape)}")
    if batch.prompt_ids.shape[1] == 0 or not bool(batch.prompt_mask[:, -1].bool().all()):
        raise ValueError(
            "prompts must be left-padded with at least one token: the last prompt column must be "
            "a real token in every row (prompt_mask[:, -1] == 1); pad prompts on the left"
        )
