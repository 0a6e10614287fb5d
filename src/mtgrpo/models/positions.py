"""Position ids of padded rows, as transformers ``generate`` derives them: shared by generation
(:mod:`mtgrpo.rollout.static`) and the policy's log-probabilities (:mod:`mtgrpo.policy`), so
both see every token at the position it was sampled at."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["position_ids_from_attention_mask"]


def position_ids_from_attention_mask(attention_mask: Tensor) -> Tensor:
    """Position ids for (left- or right-) padded rows, as ``generate`` derives them.

    ``position_t = (number of attended tokens up to and including t) - 1``, and 0 at padded
    positions (``GenerationMixin._prepare_position_ids_for_generation`` in transformers 5).
    A left-padded prompt therefore starts at position 0 whatever its padding, and completion
    tokens continue from the last prompt position, as they did while being generated.
    """
    mask = attention_mask.long()  # [N, T]
    # left padding: the first real token is position 0, as in generate
    positions = mask.cumsum(-1) - 1
    # pad positions are masked out anyway; 0 keeps them in range
    return positions.masked_fill(mask == 0, 0)
