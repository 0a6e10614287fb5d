"""Training runs under `accelerate launch` whose engine reports log-probs (scripted_backend's
OffsetLogprobBackend); every process writes, per step, the generation/* metrics it logged and
what its engine generated, to rank<r>.json in the output directory.

    python mismatch_script.py MODEL OUT CASE    CASE: offsets | edge_cases
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import trainer_helpers

from mtgrpo import GRPOTrainer

# run name -> (generation backend, config overrides)
RUNS = {
    # uneven shares: 3 groups over 2 processes; the first sample of every group is truncated
    # and left out of the loss
    "offsets": ("scripted_backend:OffsetLogprobBackend",
                {"prompts_per_step": 3, "max_steps": 2, "mask_truncated_completions": True}),
    # one group: process 1 generates nothing and trains a fully masked padding group
    "padding_rank": ("scripted_backend:OffsetLogprobBackend",
                     {"prompts_per_step": 1, "max_steps": 1}),
    # process 1's engine returns no log-probs: it generates 1 of the 3 groups, so whichever
    # process trains that group, the other trains only groups that have them
    "rank1_without_logprobs": ("scripted_backend:rank1_without_logprobs",
                               {"prompts_per_step": 3, "max_steps": 2}),
}
CASES = {"offsets": ["offsets"], "edge_cases": ["padding_rank", "rank1_without_logprobs"]}


class RecordingTrainer(GRPOTrainer):
    """Keeps each step's generation/* metrics and its engine's generate calls."""

    def training_step(self) -> dict[str, Any]:
        calls = len(self.backend.calls)
        metrics = super().training_step()
        self.records.append({
            "metrics": {k: v for k, v in metrics.items() if k.startswith("generation/")},
            "calls": self.backend.calls[calls:],
        })
        return metrics


def run(model: str, out: Path, name: str) -> dict[str, Any]:
    backend, overrides = RUNS[name]
    args = trainer_helpers.args(out / name, **overrides)
    trainer = RecordingTrainer(model, [trainer_helpers.alpha_reward, trainer_helpers.beta_reward],
                               args=args, train_dataset=trainer_helpers.rows(),
                               generation_backend=backend)
    trainer.records = []
    trainer.train()
    return {"world": trainer.world, "records": trainer.records}


def main() -> None:
    model, out, case = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    results = {name: run(model, out, name) for name in CASES[case]}
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    torch.distributed.destroy_process_group() if torch.distributed.is_initialized() else None


if __name__ == "__main__":
    trainer_helpers.run_and_leave(main)
