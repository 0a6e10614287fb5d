"""Read real rollouts into the analysis's ``[P, S, m, R]`` reward array, and write ``.npz``.

Two formats:

``rollouts.jsonl`` (written by the trainer)
    One JSON object per line, one line per group (one prompt's ``G`` completions at one
    step)::

        {"step": 12, "prompt_id": "countdown-17", "task": "countdown",
         "channels": ["correct", "format", "length"],
         "rewards": [[1.0, 1.0, 0.4], [0.0, null, 0.7], ...],     # [G][R], null = n/a
         "advantages": [0.8, -1.1, ...]}                          # [G], not used here

    Only ``prompt_id``, ``channels`` and ``rewards`` are read (``task`` is kept for the
    record). Every line must name the same channels in the same order. Groups are
    collected per prompt (``prompt_id`` compared as a string) in file order; each group of
    a prompt is one "seed". Groups of the same prompt logged at different steps come from
    different policies, so treating them as independent draws of one distribution is an
    approximation that holds while the policy moves slowly.

    Selection: the group size ``m`` is the one asked for, or else the most common group
    size in the file (ties: the larger); groups of other sizes are skipped. Prompts with
    fewer than ``min_seeds`` groups of size ``m`` are dropped. ``S`` is the smallest group
    count among the prompts kept, and every prompt keeps its first ``S`` groups (earliest
    steps), so the array is rectangular and no prompt is weighted by how often it was
    drawn.

``.npz``
    An array ``rewards`` of shape ``[P, S, m, R]`` (NaN = not applicable), and optionally
    ``weights [R]``, ``channels [R]`` (strings) and ``prompt_ids [P]`` (strings); see
    :func:`save_rollouts_npz`.

Not-applicable entries (``null`` / NaN) stay NaN in the returned array; the analysis reads
them with the ``"neutral"`` rule of :mod:`mtgrpo.algo.advantages`: the entry's z-score is 0 and
the group statistics use the applicable entries only, so a channel that is ``None`` for a
whole group has z = 0 and contributes neither advantage nor correlation, and a completion
with no applicable channel gets advantage 0.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mtgrpo.algo.registry import Registry

__all__ = [
    "ROLLOUT_FORMATS",
    "RolloutRewards",
    "load_rollouts",
    "load_rollouts_jsonl",
    "load_rollouts_npz",
    "save_rollouts_npz",
]


@dataclass(frozen=True, eq=False)
class RolloutRewards:
    """Rewards of real rollouts arranged for the analysis, and what was left out."""

    rewards: np.ndarray  # [P, S, m, R], NaN = not applicable
    channels: tuple[str, ...]  # [R]
    prompt_ids: tuple[str, ...]  # [P]
    weights: np.ndarray | None = None  # [R], when the file carries them
    tasks: tuple[str | None, ...] | None = None  # [P], from rollouts.jsonl
    skipped_groups: int = 0  # groups whose size is not m
    dropped_prompts: int = 0  # prompts with fewer than min_seeds groups of size m
    truncated_groups: int = 0  # groups beyond the first S of their prompt

    @property
    def shape(self) -> tuple[int, int, int, int]:
        num_prompts, num_seeds, group_size, num_channels = self.rewards.shape
        return num_prompts, num_seeds, group_size, num_channels


Loader = Callable[..., RolloutRewards]
ROLLOUT_FORMATS: Registry[Loader] = Registry("rollouts format")


def load_rollouts(
    path: str | Path, *, min_seeds: int = 2, group_size: int | None = None
) -> RolloutRewards:
    """Load ``rollouts.jsonl`` or an ``.npz`` file, chosen by the file suffix."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(
            f"rollouts file {str(file)!r} does not exist; pass the trainer's rollouts.jsonl "
            "or an .npz file with a 'rewards' array of shape [P, S, m, R]"
        )
    suffix = file.suffix.lstrip(".")
    if suffix not in ROLLOUT_FORMATS:
        raise ValueError(
            f"cannot tell the format of {str(file)!r} from its suffix {file.suffix!r}; "
            f"valid suffixes: {', '.join('.' + name for name in ROLLOUT_FORMATS.names())}"
        )
    return ROLLOUT_FORMATS.get(suffix)(file, min_seeds=min_seeds, group_size=group_size)


@ROLLOUT_FORMATS.register("jsonl", aliases=("json",))
def load_rollouts_jsonl(
    path: str | Path, *, min_seeds: int = 2, group_size: int | None = None
) -> RolloutRewards:
    """Read the trainer's ``rollouts.jsonl`` (format and selection rules: module docstring)."""
    _check_min_seeds(min_seeds)
    channels: tuple[str, ...] | None = None
    groups: dict[str, list[np.ndarray]] = {}  # prompt id -> its groups, each [G, R]
    tasks: dict[str, str | None] = {}
    for line_number, record in _records(Path(path)):
        record_channels = _record_channels(record, line_number)
        if channels is None:
            channels = record_channels
        elif record_channels != channels:
            raise ValueError(
                f"line {line_number} of {path} has channels {list(record_channels)} but earlier "
                f"lines have {list(channels)}; every group must name the same channels in order"
            )
        prompt_id = str(record["prompt_id"])  # as a string: 17 and "17" are one prompt
        groups.setdefault(prompt_id, []).append(_group_rewards(record, len(channels), line_number))
        tasks.setdefault(prompt_id, record.get("task"))  # the first line's, for the record
    if channels is None:
        raise ValueError(f"{path} holds no rollouts (no JSON lines)")
    return _arrange(groups, tasks, channels, min_seeds, group_size, str(path))


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue  # a blank or trailing line is no record
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                message = f"line {line_number} of {path} is not valid JSON: {error}"
                raise ValueError(message) from None
            if not isinstance(record, dict):
                raise ValueError(f"line {line_number} of {path} is not a JSON object")
            missing = [key for key in ("prompt_id", "channels", "rewards") if key not in record]
            if missing:
                raise ValueError(
                    f"line {line_number} of {path} lacks {missing}; each line is one group with "
                    "'prompt_id', 'channels' [R] and 'rewards' [G][R]"
                )
            yield line_number, record


def _record_channels(record: dict[str, Any], line_number: int) -> tuple[str, ...]:
    channels = record["channels"]
    if not isinstance(channels, list) or not channels:
        raise ValueError(
            f"line {line_number}: 'channels' must be a non-empty list of names, got {channels!r}"
        )
    return tuple(str(name) for name in channels)


def _group_rewards(record: dict[str, Any], num_channels: int, line_number: int) -> np.ndarray:
    """``rewards [G][R]`` with ``null`` -> NaN, checked. # [G, R]"""
    rows = record["rewards"]
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"line {line_number}: 'rewards' must be a non-empty list [G][R]")
    values: list[list[float]] = []
    for row in rows:
        if not isinstance(row, list) or len(row) != num_channels:
            raise ValueError(
                f"line {line_number}: every rewards row must list {num_channels} values (one per "
                f"channel, null = not applicable), got {row!r}"
            )
        # JSON true / false load as bool, which Python counts as int: refuse them.
        if any(v is not None and (isinstance(v, bool) or not isinstance(v, int | float))
               for v in row):
            raise ValueError(f"line {line_number}: rewards must be numbers or null, got {row!r}")
        values.append([np.nan if v is None else float(v) for v in row])
    group = np.asarray(values, dtype=np.float64)
    if np.isinf(group).any():
        raise ValueError(f"line {line_number}: rewards must be finite, got {rows!r}")
    return group


def _arrange(
    groups: dict[str, list[np.ndarray]],
    tasks: dict[str, str | None],
    channels: tuple[str, ...],
    min_seeds: int,
    group_size: int | None,
    source: str,
) -> RolloutRewards:
    sizes = Counter(len(group) for prompt_groups in groups.values() for group in prompt_groups)
    if group_size is None:
        group_size = max(sizes, key=lambda size: (sizes[size], size))  # ties: the larger size
    elif group_size not in sizes:
        raise ValueError(
            f"no group of size {group_size} in {source}; group sizes found: {dict(sizes)}"
        )
    # Skipped, not padded: a group's z-scores and Ĉ depend on its size m.
    sized = {pid: [g for g in gs if len(g) == group_size] for pid, gs in groups.items()}
    kept = {pid: gs for pid, gs in sized.items() if len(gs) >= min_seeds}
    if not kept:
        most = max(len(gs) for gs in sized.values())
        raise ValueError(
            f"no prompt in {source} has at least {min_seeds} groups of size {group_size} (the "
            f"most any prompt has is {most}); lower min_seeds (--min-seeds) or log more steps"
        )
    # Rectangular, and no prompt weighted by how often it was drawn.
    num_seeds = min(len(gs) for gs in kept.values())
    rewards = np.stack([np.stack(gs[:num_seeds]) for gs in kept.values()])  # [P, S, m, R]
    return RolloutRewards(
        rewards=rewards,
        channels=channels,
        prompt_ids=tuple(kept),
        tasks=tuple(tasks[pid] for pid in kept),
        skipped_groups=sum(sizes.values()) - sizes[group_size],
        dropped_prompts=len(groups) - len(kept),
        truncated_groups=sum(len(gs) - num_seeds for gs in kept.values()),
    )


@ROLLOUT_FORMATS.register("npz")
def load_rollouts_npz(
    path: str | Path, *, min_seeds: int = 2, group_size: int | None = None
) -> RolloutRewards:
    """Read an ``.npz`` file written by :func:`save_rollouts_npz` (or by hand, same keys)."""
    _check_min_seeds(min_seeds)
    with np.load(Path(path), allow_pickle=False) as data:  # a file from elsewhere runs no code
        if "rewards" not in data:
            raise ValueError(
                f"{path} has no array 'rewards' (it has {sorted(data.files)}); save the rewards "
                "[P, S, m, R] under the key 'rewards'"
            )
        # Read inside the `with`: the arrays load lazily from the archive it closes.
        rewards = np.asarray(data["rewards"], dtype=np.float64)
        extras = {key: data[key] for key in ("weights", "channels", "prompt_ids") if key in data}
    _check_reward_array(rewards, str(path))
    num_prompts, num_seeds, size, num_channels = rewards.shape
    if group_size is not None and group_size != size:
        raise ValueError(f"{path} holds groups of size {size}, not the requested {group_size}")
    if num_seeds < min_seeds:
        raise ValueError(f"{path} holds {num_seeds} seeds per prompt, fewer than {min_seeds}")
    channels = extras.get("channels", [f"r{i}" for i in range(num_channels)])
    prompt_ids = extras.get("prompt_ids", [f"p{i}" for i in range(num_prompts)])
    weights = extras.get("weights")
    _check_lengths(str(path), num_channels, num_prompts, weights, channels, prompt_ids)
    return RolloutRewards(
        rewards=rewards,
        channels=tuple(str(c) for c in channels),
        prompt_ids=tuple(str(p) for p in prompt_ids),
        weights=None if weights is None else np.asarray(weights, dtype=np.float64),
    )


def save_rollouts_npz(
    path: str | Path,
    rewards: np.ndarray,
    *,
    weights: Sequence[float] | np.ndarray | None = None,
    channels: Sequence[str] | None = None,
    prompt_ids: Sequence[str] | None = None,
) -> Path:
    """Write rewards ``[P, S, m, R]`` (and optional metadata) as a compressed ``.npz``."""
    array = np.asarray(rewards, dtype=np.float64)
    file = Path(path)
    _check_reward_array(array, str(file))
    num_prompts, _, _, num_channels = array.shape
    _check_lengths(str(file), num_channels, num_prompts, weights, channels, prompt_ids)
    extras: dict[str, np.ndarray] = {}
    if weights is not None:
        extras["weights"] = np.asarray(weights, dtype=np.float64)
    # Unicode arrays, not objects: load_rollouts_npz reads them back with allow_pickle=False.
    if channels is not None:
        extras["channels"] = np.asarray([str(c) for c in channels])
    if prompt_ids is not None:
        extras["prompt_ids"] = np.asarray([str(p) for p in prompt_ids])
    file.parent.mkdir(parents=True, exist_ok=True)
    with file.open("wb") as handle:  # a handle keeps numpy from appending a second ".npz"
        np.savez_compressed(handle, rewards=array, **extras)
    return file


def _check_min_seeds(min_seeds: int) -> None:
    if not isinstance(min_seeds, int) or min_seeds < 2:
        raise ValueError(
            f"min_seeds must be an integer >= 2 (a variance over seeds needs two), "
            f"got {min_seeds!r}"
        )


def _check_reward_array(rewards: np.ndarray, source: str) -> None:
    if rewards.ndim != 4:
        raise ValueError(
            f"rewards in {source} must have shape [P, S, m, R] (prompts, seeds, group size, "
            f"channels), got {rewards.shape}"
        )
    if np.isinf(rewards).any():  # inf would turn its group's statistics into NaN
        raise ValueError(f"rewards in {source} contain ±inf; use NaN for not applicable")


def _check_lengths(
    source: str,
    num_channels: int,
    num_prompts: int,
    weights: Sequence[float] | np.ndarray | None,
    channels: Sequence[str] | np.ndarray | None,
    prompt_ids: Sequence[str] | np.ndarray | None,
) -> None:
    for name, value, expected in (
        ("weights", weights, num_channels),
        ("channels", channels, num_channels),
        ("prompt_ids", prompt_ids, num_prompts),
    ):
        if value is not None and len(value) != expected:
            raise ValueError(
                f"{name} in {source} has {len(value)} entries but the rewards have {expected}; "
                f"give one entry per {'prompt' if name == 'prompt_ids' else 'channel'}"
            )
