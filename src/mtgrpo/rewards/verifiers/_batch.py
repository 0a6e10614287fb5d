"""Batch plumbing shared by the built-in reward functions: completion texts and columns.

Column problems are configuration errors (the dataset lacks a column, or a column has the
wrong length): they raise ``TypeError``/``ValueError`` before any scoring work, naming the
function, the rule and the fix. Model output never raises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mtgrpo.rewards.verifiers.answer import completion_text

__all__ = ["column", "completion_texts", "optional_column"]


def completion_texts(function: str, completions: Any) -> list[str]:
    """The text of every completion (strings or conversational message lists)."""
    # a lone str is a Sequence too, of characters, not of completions
    if isinstance(completions, (str, bytes)) or not isinstance(completions, Sequence):
        raise TypeError(
            f"{function}: completions must be a list (one completion per row), got "
            f"{type(completions).__name__}; pass the batch as a list"
        )
    return [completion_text(completion) for completion in completions]


def optional_column(
    function: str, columns: Mapping[str, Any], names: Sequence[str], rows: int
) -> list[Any] | None:
    """The first column of ``names`` present in ``columns``, checked to have ``rows`` values."""
    for name in names:
        # a column passed as None counts as absent: the next name is tried
        if name in columns and columns[name] is not None:
            values = columns[name]
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise TypeError(
                    f"{function}: column {name!r} must hold one value per completion (a list), "
                    f"got {type(values).__name__}"
                )
            if len(values) != rows:
                raise ValueError(
                    f"{function}: column {name!r} has {len(values)} values for {rows} "
                    "completions; a column must hold one value per completion"
                )
            return list(values)
    return None


def column(function: str, columns: Mapping[str, Any], names: Sequence[str], rows: int) -> list[Any]:
    """Like :func:`optional_column`, but a missing column is a ``TypeError`` naming the fix."""
    values = optional_column(function, columns, names, rows)
    if values is None:
        wanted = " or ".join(repr(name) for name in names)
        present = ", ".join(sorted(columns)) or "none"
        raise TypeError(
            f"{function} needs the dataset column {wanted} (one value per completion); "
            f"the columns passed were: {present}. Add the column to the dataset or route "
            "this reward only to the tasks that have it"
        )
    return values
