"""Supervised fine-tuning on (prompt, completion) data: a warm (or cold) start before GRPO.

A model that never produces a correct, well-formatted answer gets reward 0 on every completion,
so every GRPO group has zero gradient and training cannot start. A short supervised pass on
gold answers written in the expected format gives it a foothold::

    from mtgrpo.sft import SFTConfig, sft_train, solutions_from_rows
    from mtgrpo.tasks import make_suite

    with make_suite("mtgrpo3", train_size=200) as suite:
        rows = solutions_from_rows(suite.train.rows())       # prompt + completion columns
    result = sft_train("path/to/model", None, rows, SFTConfig(output_dir="runs/warm"))
    # result.model_dir is a save_pretrained checkpoint GRPO starts from

Modules: :mod:`~mtgrpo.sft.config` (:class:`SFTConfig`; :class:`WarmStartConfig`, a run file's
``sft:`` section), :mod:`~mtgrpo.sft.solutions`
(:func:`solutions_from_rows`: task rows to completions), :mod:`~mtgrpo.sft.data` (pairs,
token ids, batches in the GRPO layout), :mod:`~mtgrpo.sft.train` (:func:`sft_train`, the loss).

Importing this package imports neither torch nor transformers; the training names are loaded
on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from mtgrpo.sft.config import SFTConfig, WarmStartConfig

__all__ = [
    "REASONINGS",
    "SOLUTION_TEMPLATES",
    "SFTConfig",
    "SFTResult",
    "WarmStartConfig",
    "completion_cross_entropy",
    "sft_train",
    "solutions_from_rows",
]

_LAZY = {
    "REASONINGS": "mtgrpo.sft.solutions",
    "SOLUTION_TEMPLATES": "mtgrpo.sft.solutions",
    "solutions_from_rows": "mtgrpo.sft.solutions",
    "SFTResult": "mtgrpo.sft.train",
    "completion_cross_entropy": "mtgrpo.sft.train",
    "sft_train": "mtgrpo.sft.train",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mtgrpo.sft' has no attribute {name!r}")
