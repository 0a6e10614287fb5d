"""The errors of the vLLM backends (importable without vLLM)."""

from __future__ import annotations

__all__ = ["EngineUnreachableError", "StaleEngineError", "WeightPushError"]


class StaleEngineError(RuntimeError):
    """The engine's weights are not the version the trainer pushed last."""


class EngineUnreachableError(ConnectionError):
    """The vLLM server did not answer within its timeout."""


class WeightPushError(RuntimeError):
    """A weight push was refused or failed on the server."""
