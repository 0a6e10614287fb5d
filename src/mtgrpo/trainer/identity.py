"""What makes a step mean what it means, compared between a checkpoint and the run resuming it.

A resumed run must be the run that wrote the checkpoint: the same group size and batch
shape, loss, advantage estimator, task weighting and batch construction, generation
lengths and temperature, tasks, reward channels and model. A difference is refused with
every difference listed, or accepted, field by field, through ``resume_allow_changes``
(``[field, ...]`` or ``["all"]``); an accepted change is recorded in the run's
``config_history.jsonl`` with the step it took effect at, so nothing claims the new setting
for the steps before it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["IDENTITY_FIELDS", "changes", "check_resumable", "record_history", "run_identity"]

IDENTITY_FIELDS = (
    "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
    "steps_per_generation", "num_iterations", "generation_batch_size", "prompts_per_step",
    "max_prompt_length", "max_completion_length", "temperature", "top_p", "top_k",
    "loss_type", "beta", "epsilon", "epsilon_high", "delta", "importance_sampling_level",
    "scale_rewards", "multi_objective_aggregation", "none_handling", "reward_weights",
    "advantage_epsilon", "advantage_std_ddof", "mask_truncated_completions",
    "top_entropy_quantile", "task_weighting", "task_weighting_params", "batch_construction",
    "batch_construction_params", "zero_gradient_filter", "learning_rate", "lr_scheduler_type",
    "task_weighting_signal", "validation_steps", "num_generations_validation",
)  # fmt: skip
"""Training arguments that change what a step computes (read where the config has them)."""


def _plain(value: Any) -> Any:
    """JSON-comparable form (tuples as lists, numbers as they are)."""
    return json.loads(json.dumps(value, default=str))


def run_identity(args: Any, *, tasks: Sequence[str], channels: Sequence[str],
                 model: str) -> dict[str, Any]:  # fmt: skip
    """The settings a checkpoint records and a resume compares."""
    identity = {name: _plain(getattr(args, name)) for name in IDENTITY_FIELDS
                if hasattr(args, name)}  # fmt: skip
    identity.update(tasks=list(tasks), reward_channels=list(channels), model=model)
    return identity


def changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{field: (checkpoint's value, this run's)}`` for the fields both record that differ."""
    # a field only one side records (added since the checkpoint was written) is no difference
    return {name: (saved[name], now[name]) for name in now
            if name in saved and saved[name] != now[name]}  # fmt: skip


def check_resumable(checkpoint: Path, saved: Mapping[str, Any] | None,
                    now: Mapping[str, Any], allowed: Sequence[str] | None) -> dict[str, Any]:
    """The accepted differences, or a ``ValueError`` listing the refused ones and the fix.
    A checkpoint that recorded no identity (written before this check existed) passes."""
    if not saved:
        return {}
    found = changes(saved, now)
    allowed_set = set(allowed or ())
    refused = {k: v for k, v in found.items() if "all" not in allowed_set and k not in allowed_set}
    if refused:
        listed = "; ".join(f"{name}: {before!r} in the checkpoint, {after!r} now"
                           for name, (before, after) in refused.items())  # fmt: skip
        names = ", ".join(refused)
        raise ValueError(
            f"{checkpoint} was written by a different run ({listed}). Resume with the "
            f"checkpoint's settings, or accept the change with resume_allow_changes: [{names}] "
            "(it is recorded in config_history.jsonl from this step on)"
        )
    return found


def record_history(output_dir: Path, step: int, config: Mapping[str, Any],
                   accepted: Mapping[str, tuple[Any, Any]]) -> None:  # fmt: skip
    """Append this ``train()`` call's configuration, and the changes it accepted, to
    ``config_history.jsonl``."""
    entry = {
        "from_step": step,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "changes": {k: {"checkpoint": a, "now": b} for k, (a, b) in accepted.items()},
        "config": _plain(dict(config)),
    }
    with (output_dir / "config_history.jsonl").open("a", encoding="utf-8") as file:
        file.write(json.dumps(entry) + "\n")
