"""Which completions count as correct: the accuracy rule behind J_k, worst-task accuracy and
the strict zero-gradient filter.

A completion is correct when its *accuracy channel* is at least ``threshold`` (1.0 by default:
the papers' rewards give 1.0 for a correct answer and 0.1 for a wrong but well formatted one).
The accuracy channel is the one the user names or, by default, the first channel that applies
to the row (in channel order): put the correctness reward first when a task has several.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

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


def accuracy_values(values: np.ndarray, channel: int | None = None) -> np.ndarray:
    """``[N]`` the accuracy reward of each row of ``values [N, R]`` (NaN where none applies).

    With ``channel=None`` each row uses its first applicable channel.
    """
    values = np.asarray(values, dtype=np.float64)
    if channel is not None:
        return values[:, channel]
    first = (~np.isnan(values)).argmax(axis=1)  # [N] first applicable channel (0 if none)
    return np.take_along_axis(values, first[:, None], axis=1)[:, 0]


def correct_completions(values: np.ndarray, threshold: float = 1.0, channel: int | None = None
                        ) -> np.ndarray:
    """``[N]`` bool from reward channels ``values [N, R]`` (NaN = not applicable).

    A row whose accuracy reward (:func:`accuracy_values`) is at least ``threshold`` is
    correct; a row with no applicable channel (or whose named channel is NaN) is not.
    """
    return np.nan_to_num(accuracy_values(values, channel), nan=-np.inf) >= threshold
