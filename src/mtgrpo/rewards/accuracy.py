"""Which completions count as correct: the accuracy rule behind J_k, worst-task accuracy and
the strict zero-gradient filter.

A completion is correct when its *accuracy channel* is at least ``threshold`` (1.0 by default:
the papers' rewards give 1.0 for a correct answer and 0.1 for a wrong but well formatted one).
The accuracy channel is the one the user names or, by default, the first channel that applies
to the row (in channel order): put the correctness reward first when a task has several.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["accuracy_channel_index", "accuracy_values", "correct_completions"]


def accuracy_channel_index(channel_names: Sequence[str], name: str | None) -> int | None:
    """Index of the named accuracy channel (``None`` keeps the first-applicable rule)."""
    if name is None:
        return None
    if name not in channel_names:
        raise ValueError(
            f"accuracy_reward={name!r} is not a reward channel; the channels are "
            f"{list(channel_names)}"
        )
    return list(channel_names).index(name)


def accuracy_values(values: Tensor, channel: int | None = None) -> Tensor:
    """``[N]`` the accuracy reward of each row of ``values [N, R]`` (NaN where none applies).

    With ``channel=None`` each row uses its first applicable channel.
    """
    if channel is not None:
        return values[:, channel]
    applicable = ~values.isnan()  # [N, R]
    # int8: torch's argmax does not take bool
    first = applicable.to(torch.int8).argmax(dim=1)  # [N] first True (0 if none)
    return values.gather(1, first.unsqueeze(1)).squeeze(1)


def correct_completions(values: Tensor, threshold: float = 1.0, channel: int | None = None
                        ) -> Tensor:
    """``[N]`` bool from reward channels ``values [N, R]`` (NaN = not applicable).

    A row whose accuracy reward (:func:`accuracy_values`) is at least ``threshold`` is
    correct; a row with no applicable channel (or whose named channel is NaN) is not.
    """
    return torch.nan_to_num(accuracy_values(values, channel), nan=-torch.inf) >= threshold
