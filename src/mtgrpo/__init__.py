"""mtgrpo: multi-task, multi-reward GRPO post-training of language models.

``from mtgrpo import GRPOConfig, GRPOTrainer`` is the TRL-shaped entry point (with TRL's
``ModelConfig`` and ``get_peft_config`` for scripts that use them; :mod:`mtgrpo.compat`).
``TrainConfig`` is the native configuration, nested by concern (``config.loss.beta``), that
run files and the trainer read. The method (``mtgrpo.algo``: advantages, task weighting,
sampling, losses), the rewards (``mtgrpo.rewards``) and the analysis (``mtgrpo.analysis``)
are importable without loading any model code; ``GRPOTrainer`` is imported on first use.
"""

from __future__ import annotations

from typing import Any

from mtgrpo._version import __version__
from mtgrpo.compat import GRPOConfig, ModelConfig, get_peft_config, load_run_config
from mtgrpo.config import TrainConfig

__all__ = ["GRPOConfig", "GRPOTrainer", "ModelConfig", "TrainConfig", "__version__",
           "get_peft_config", "load_run_config"]


def __getattr__(name: str) -> Any:
    if name == "GRPOTrainer":
        from mtgrpo.compat.trainer import GRPOTrainer

        return GRPOTrainer
    raise AttributeError(f"module 'mtgrpo' has no attribute {name!r}")
