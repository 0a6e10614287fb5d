"""A length reward that peaks at a target length.

Shape (triangular, bounded): with length ``l``, target ``T`` and tolerance ``w``,

    r(l) = max(0, 1 - |l - T| / w)

so ``r(T) = 1``, the reward falls linearly on both sides and reaches 0 at ``T +- w``. It is
the "length" channel of seed 003's math reward (correctness / length / format), written as a
function of distance to a target rather than of raw length, so it neither rewards rambling
nor truncation. Lengths count characters of the completion text (``unit="chars"``) or
completion tokens (``unit="tokens"``, from ``completion_ids``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from mtgrpo.algo.registry import Registry
from mtgrpo.rewards.guard import score_each
from mtgrpo.rewards.verifiers._batch import completion_texts

__all__ = ["LENGTH_UNITS", "length_reward"]

LENGTH_UNITS: Registry[str] = Registry("length unit")
LENGTH_UNITS.add("chars", "characters of the completion text", aliases=("characters",))
LENGTH_UNITS.add("tokens", "completion tokens (len of completion_ids)")


def length_reward(
    target_length: float, tolerance: float | None = None, unit: str = "chars"
) -> Callable[..., list[float | None]]:
    """Build a reward ``max(0, 1 - |length - target_length| / tolerance)``; range [0, 1].

    ``tolerance`` defaults to ``target_length`` (the reward falls to 0 at twice the target,
    and at length 0).

    ``unit`` is ``"chars"`` (text of the completion, conversational completions included) or
    ``"tokens"`` (needs ``completion_ids``; the trainer always passes them). The returned
    function is named ``length_reward``.

    >>> reward = length_reward(target_length=10, tolerance=5)
    >>> reward(None, ["x" * 10, "x" * 12, "x" * 20])
    [1.0, 0.6, 0.0]
    """
    unit = LENGTH_UNITS.canonical(unit)
    if tolerance is None:
        tolerance = target_length
    for name, value in (("target_length", target_length), ("tolerance", tolerance)):
        # bool is an int: target_length=True is a config mistake, not 1
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"length_reward: {name} must be a number, got {value!r}")
        # tolerance divides below; an infinite target would score every completion 0
        if not (math.isfinite(value) and value > 0):
            raise ValueError(
                f"length_reward: {name} must be a positive finite number, got {value!r}"
            )

    def score(length: int) -> float:
        # r(l) = max(0, 1 - |l - T| / w), the module docstring's triangle
        return max(0.0, 1.0 - abs(length - target_length) / tolerance)

    # named like the factory: the reward's column and metrics take its __name__ (TRL's rule)
    def length_reward(
        prompts: Sequence[Any] | None,
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        texts = completion_texts("length_reward", completions)
        if unit == "chars":
            return score_each("length_reward", texts, lambda text: score(len(text)))
        # a configuration error, raised before scoring, not a 0 per sample
        if completion_ids is None or len(completion_ids) != len(texts):
            got = "none" if completion_ids is None else f"{len(completion_ids)} rows"
            raise ValueError(
                f"length_reward(unit='tokens') needs completion_ids for the {len(texts)} "
                f"completions, got {got}; pass completion_ids or use unit='chars'"
            )
        return score_each("length_reward", completion_ids, lambda ids: score(len(ids)))

    return length_reward
