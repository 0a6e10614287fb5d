"""mtgrpo: multi-task, multi-reward GRPO post-training of language models.

``from mtgrpo import GRPOConfig, GRPOTrainer`` is the TRL-shaped entry point (with TRL's
``ModelConfig`` and ``get_peft_config`` for scripts that use them); ``TrainConfig`` is the
same options counted in mtgrpo's training steps (one generation batch each), as run files
are. The method (``mtgrpo.algo``: advantages, task weighting, sampling, losses), the rewards
(``mtgrpo.rewards``) and the analysis (``mtgrpo.analysis``) are importable
without loading any model code; ``GRPOTrainer`` is imported on first use.
"""

from __future__ import annotations

from typing import Any

from mtgrpo._version import __version__
from mtgrpo.config import GRPOConfig, TrainConfig

__all__ = ["GRPOConfig", "GRPOTrainer", "ModelConfig", "TrainConfig", "__version__",
           "get_peft_config"]


def __getattr__(name: str) -> Any:
    if name == "GRPOTrainer":
        from mtgrpo.trainer import GRPOTrainer

        return GRPOTrainer
    if name in ("ModelConfig", "get_peft_config"):
        from mtgrpo import model_args

        return getattr(model_args, name)
    raise AttributeError(f"module 'mtgrpo' has no attribute {name!r}")
