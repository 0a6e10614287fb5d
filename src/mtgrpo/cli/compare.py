"""``mtgrpo compare RUN_DIR [RUN_DIR ...]``: runs side by side, and methods over seeds.

Prints a table per run (final and best worst-task and average accuracy, steps to worst-task
thresholds, Δm% against ``--baseline``, seconds per step, prompts generated per informative
group) and the final accuracy per task; with ``--group-by-prefix`` also one row per method,
mean ± std [min–max] over its seeds (``grpo-seed1``, ``grpo-seed2`` -> ``grpo``). Writes
``comparison.json``, ``comparison.md`` and the comparison figures to ``--out``.

Exit status: 0 on success, 2 on bad input (a directory without ``metrics.jsonl``, runs that
share no task, an unknown ``--split``, a run without records of that split, labels that do not
match the runs, malformed ``--thresholds``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mtgrpo.reporting.compare import ComparisonTable, SeedAggregateTable

__all__ = ["add_arguments", "run"]

DEFAULT_OUT = "runs/compare"
DEFAULT_THRESHOLDS = "0.3,0.4,0.5"  # ALGORITHMS.md §6: steps to 30/40/50 % worst-task accuracy
DEFAULT_SMOOTHING = 0.6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the command's options on ``parser``."""
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="run directories written by `mtgrpo train` (each holds "
                        "metrics.jsonl)")
    parser.add_argument("--baseline", metavar="RUN_DIR",
                        # "%%": argparse %-formats help strings
                        help="run that Δm%% is measured against: one of the RUN_DIRs (path or "
                        "label) or another run directory, added as the first row")
    parser.add_argument("--labels", metavar="A,B,...",
                        help="one label per RUN_DIR, comma-separated (default: directory names)")
    parser.add_argument("--group-by-prefix", action="store_true",
                        help="also aggregate runs of one method over seeds: a label's method is "
                        "the label without a trailing seed suffix (-seed1, _seed2, -s3)")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--split", default="eval", metavar="eval|train",
                        help="split of the accuracy numbers (default eval)")
    parser.add_argument("--thresholds", default=DEFAULT_THRESHOLDS, metavar="T1,T2,...",
                        help=f"worst-task accuracy thresholds, fractions (default "
                        f"{DEFAULT_THRESHOLDS})")
    parser.add_argument("--smoothing", type=float, default=DEFAULT_SMOOTHING, metavar="S",
                        help="EMA smoothing of curves with --split train, in [0, 1) "
                        f"(default {DEFAULT_SMOOTHING})")
    parser.add_argument("--no-plots", action="store_true", help="write the tables only")


def run(args: argparse.Namespace) -> int:
    """Compare the runs and write the outputs; 0 on success, 2 on bad input."""
    from rich.console import Console
    from rich.markup import escape

    from mtgrpo.reporting.compare import aggregate_seeds, compare_runs, parse_thresholds
    from mtgrpo.reporting.plots import ema, plot_comparison

    try:
        thresholds = parse_thresholds(args.thresholds)
        ema([], args.smoothing)  # checks the range before any work
        labels = _labels(args.labels, len(args.run_dirs))
        table = compare_runs(args.run_dirs, baseline=args.baseline, thresholds=thresholds,
                             split=args.split, labels=labels)
    # A missing or unreadable run directory is bad input too (exit 2)
    except (ValueError, OSError) as error:
        print(f"mtgrpo compare: error: {error}", file=sys.stderr)
        return 2
    aggregate = aggregate_seeds(table, group_by="prefix") if args.group_by_prefix else None
    console = Console()
    console.print(table.to_rich())
    if aggregate is not None:
        console.print(aggregate.to_rich())
    written = _write_tables(Path(args.out), table, aggregate)
    if not args.no_plots:
        result = plot_comparison(table, args.out, aggregate=aggregate, smoothing=args.smoothing)
        written += result.written
        for reason in result.skipped:
            console.print(f"[dim]left out {escape(reason)}[/]", highlight=False)
    console.print("wrote " + ", ".join(str(path) for path in written))
    return 0


def _labels(text: str | None, count: int) -> list[str] | None:
    if text is None:
        return None
    labels = [part.strip() for part in text.split(",")]
    if len(labels) != count or not all(labels):
        raise ValueError(
            f"--labels needs {count} non-empty comma-separated labels, one per RUN_DIR, "
            f"got {text!r}"
        )
    return labels


def _write_tables(
    out: Path, table: ComparisonTable, aggregate: SeedAggregateTable | None
) -> list[Path]:
    """``comparison.json`` (runs, and methods when aggregated) and ``comparison.md``."""
    out.mkdir(parents=True, exist_ok=True)
    record = json.loads(table.to_json())
    markdown = "## Runs\n\n" + table.to_markdown()
    if aggregate is not None:
        record["methods"] = json.loads(aggregate.to_json())["methods"]
        markdown += "\n## Methods over seeds\n\n" + aggregate.to_markdown()
    json_path, markdown_path = out / "comparison.json", out / "comparison.md"
    # Strict JSON: NaN is not JSON, and other parsers refuse it.
    json_path.write_text(json.dumps(record, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    markdown_path.write_text(markdown, encoding="utf-8")
    return [json_path, markdown_path]
