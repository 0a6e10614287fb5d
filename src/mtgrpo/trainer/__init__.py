"""The training loop (orchestration only): :class:`GRPOTrainer`."""

from mtgrpo.trainer.trainer import GRPOTrainer

__all__ = ["GRPOTrainer"]
