"""mtgrpo: multi-task, multi-reward GRPO post-training of language models.

``from mtgrpo import GRPOConfig, GRPOTrainer`` is the TRL-shaped entry point. The algorithm
core (``mtgrpo.advantages``, ``mtgrpo.weighting``, ``mtgrpo.sampling``, ``mtgrpo.rewards``,
``mtgrpo.analysis``) is importable without loading any model code; ``GRPOTrainer`` is imported
on first use.
"""

from __future__ import annotations

from typing import Any

from mtgrpo.config import GRPOConfig

__version__ = "0.1.0"

__all__ = ["GRPOConfig", "GRPOTrainer", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "GRPOTrainer":
        from mtgrpo.trainer import GRPOTrainer

        return GRPOTrainer
    raise AttributeError(f"module 'mtgrpo' has no attribute {name!r}")
