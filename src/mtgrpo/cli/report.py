"""``mtgrpo report RUN_DIR``: the figures and the summary of one training run.

Reads ``RUN_DIR/metrics.jsonl`` (and ``config.yaml`` when present), writes the run's figures
(per-task accuracy with worst and average, task weights, batch composition, zero-gradient
and filter rates) to ``--out`` (default ``RUN_DIR/report``), and prints a summary: final and
best per-task accuracy, the worst task, the average, steps to worst-task thresholds, timing.

Exit status: 0 on success, 2 on bad input (no ``metrics.jsonl`` in RUN_DIR, an empty log,
an unknown ``--split``, a split the run did not log, malformed ``--thresholds``).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mtgrpo.reporting.compare import RunHistory

__all__ = ["add_arguments", "run"]

DEFAULT_SMOOTHING = 0.6
DEFAULT_THRESHOLDS = "0.3,0.4,0.5"  # ALGORITHMS.md §6: steps to 30/40/50 % worst-task accuracy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the command's options on ``parser``."""
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="a run directory written by `mtgrpo train` (holds metrics.jsonl)")
    parser.add_argument("--out", metavar="DIR", help="where the PNG figures go "
                        "(default RUN_DIR/report)")
    parser.add_argument("--split", metavar="eval|train",
                        help="split of the accuracy numbers (default: eval when the run has "
                        "per-task eval accuracy, else train)")
    parser.add_argument("--thresholds", default=DEFAULT_THRESHOLDS, metavar="T1,T2,...",
                        help=f"worst-task accuracy thresholds, fractions (default "
                        f"{DEFAULT_THRESHOLDS})")
    parser.add_argument("--smoothing", type=float, default=DEFAULT_SMOOTHING, metavar="S",
                        help="EMA smoothing of train curves in [0, 1), raw points stay visible "
                        f"(default {DEFAULT_SMOOTHING}; 0: none)")
    parser.add_argument("--no-plots", action="store_true", help="print the summary only")


def run(args: argparse.Namespace) -> int:
    """Write the figures and print the summary; 0 on success, 2 on bad input."""
    from rich.console import Console
    from rich.markup import escape

    from mtgrpo.reporting.compare import (
        load_run,
        parse_thresholds,
        run_report,
        summarize_run,
        summarize_tasks,
    )
    from mtgrpo.reporting.plots import ema, plot_run_figures

    try:
        thresholds = parse_thresholds(args.thresholds)
        ema([], args.smoothing)  # checks the range before any work
        history = load_run(args.run_dir)
        split = args.split or history.primary_split()
        _check_split_logged(history, split, args.run_dir)
        summary = summarize_run(history, split=split, thresholds=thresholds)
    except (ValueError, OSError) as error:
        print(f"mtgrpo report: error: {error}", file=sys.stderr)
        return 2
    console = Console()
    console.print(run_report(summary, summarize_tasks(history, split)))
    if history.ignored_records:
        console.print(f"[yellow]ignored {history.ignored_records} record(s) without an integer "
                      "'step' and a 'train'/'eval' 'split'[/]")
    if not args.no_plots:
        result = plot_run_figures(history, args.out, smoothing=args.smoothing)
        console.print("wrote " + ", ".join(str(path) for path in result.written))
        for reason in result.skipped:
            console.print(f"[dim]left out {escape(reason)}[/]", highlight=False)
    return 0


def _check_split_logged(history: RunHistory, split: str, run_dir: str) -> None:
    from mtgrpo.reporting.compare import SPLITS

    if split not in SPLITS:
        raise ValueError(f"unknown --split {split!r}; use one of: {', '.join(SPLITS)}")
    if split not in history.splits:
        other = [s for s in history.splits if s != split]
        raise ValueError(
            f"{run_dir!r} has no {split} records"
            + (f"; report on --split {other[0]} instead" if other else "")
        )
