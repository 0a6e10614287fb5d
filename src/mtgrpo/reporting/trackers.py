"""Experiment trackers (TensorBoard, Weights & Biases, Trackio), all optional extras."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mtgrpo.algo.registry import TRACKERS

__all__ = ["TRACKERS", "Trackers", "check_trackers_available"]

# tracker name -> (module that must be importable, pip extra): the same name, by construction
_REQUIREMENTS = {name: (name, name) for name in TRACKERS}


def check_trackers_available(names: Sequence[str]) -> None:
    """Fail early, with the install command, when a requested tracker is not installed."""
    for name in names:
        if name not in _REQUIREMENTS:
            raise ValueError(
                f"unknown tracker {name!r}; valid trackers: {', '.join(sorted(_REQUIREMENTS))}"
            )
        module, extra = _REQUIREMENTS[name]
        if importlib.util.find_spec(module) is None:
            raise ImportError(
                f"report_to includes {name!r} but the {module!r} package is not installed; "
                f"install it with `pip install {module}` (or `pip install 'mtgrpo[{extra}]'`), "
                f"or remove {name!r} from report_to"
            )


def _numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        # bools are ints; NaN != NaN drops NaN
        if isinstance(value, bool) or (isinstance(value, int | float) and value == value):
            out[key] = float(value)
    return out


class Trackers:
    """Fans one metrics dict out to every requested tracker (prefixing keys by split)."""

    def __init__(self, names: Sequence[str], run_dir: str | Path, run_name: str,
                 config: Mapping[str, Any]) -> None:
        check_trackers_available(names)
        self._names = list(names)
        if "tensorboard" in names:
            # Optional extras: imported only when asked for.
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))
        if "wandb" in names:
            import wandb

            self._wandb = wandb.init(name=run_name, config=dict(config), dir=str(run_dir),
                                     # A second run in one process (a sweep) starts a new W&B run.
                                     reinit=True)
        if "trackio" in names:
            import trackio

            self._trackio = trackio
            trackio.init(project="mtgrpo", name=run_name, config=dict(config))

    def log(self, metrics: Mapping[str, Any], step: int, split: str = "train") -> None:
        # Step is the x axis, not a metric.
        values = {f"{split}/{k}": v for k, v in _numeric(metrics).items() if k != "step"}
        if "tensorboard" in self._names:
            for key, value in values.items():
                self._tensorboard.add_scalar(key, value, step)
            # SummaryWriter writes its queue only every 120 s (flush_secs) or 10 events otherwise
            self._tensorboard.flush()
        if "wandb" in self._names:
            self._wandb.log(values, step=step)
        if "trackio" in self._names:
            self._trackio.log(values, step=step)

    def close(self) -> None:
        if "tensorboard" in self._names:
            self._tensorboard.close()
        if "wandb" in self._names:
            self._wandb.finish()
        if "trackio" in self._names:
            self._trackio.finish()
