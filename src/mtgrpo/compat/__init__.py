"""TRL at the edge: code written for TRL 1.16 runs on mtgrpo through this package.

* :class:`GRPOConfig`: TRL's flat configuration (every TRL 1.16 field; the ones that do not
  act here listed in :mod:`mtgrpo.compat.trl_fields`), mapped onto the native
  :class:`mtgrpo.config.TrainConfig` (:mod:`mtgrpo.compat.config`);
* :class:`GRPOTrainer`: the trainer taking a ``GRPOConfig`` (TRL's default when none is
  given), with TRL's checks for streaming datasets (:mod:`mtgrpo.compat.trainer`);
* :class:`ModelConfig` and :func:`get_peft_config`: TRL's model arguments
  (:mod:`mtgrpo.compat.model_args`);
* :func:`load_run_config`: run files with TRL's fields and ``step_counts: trl``.

Only the facade (``from mtgrpo import GRPOConfig, GRPOTrainer``) and the command line import
this package; the rest of mtgrpo reads the native configuration. ``GRPOTrainer`` (which
imports torch) is imported on first use.
"""

from __future__ import annotations

from typing import Any

from mtgrpo.compat.config import GRPOConfig, load_run_config, training_from_flat
from mtgrpo.compat.model_args import ModelConfig, get_peft_config

__all__ = ["GRPOConfig", "GRPOTrainer", "ModelConfig", "get_peft_config", "load_run_config",
           "reference_markdown", "training_from_flat"]


def __getattr__(name: str) -> Any:
    if name == "GRPOTrainer":
        from mtgrpo.compat.trainer import GRPOTrainer

        return GRPOTrainer
    if name == "reference_markdown":
        from mtgrpo.compat.reference import reference_markdown

        return reference_markdown
    raise AttributeError(f"module 'mtgrpo.compat' has no attribute {name!r}")
