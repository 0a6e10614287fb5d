"""Run outputs: the metrics log, trackers, plots and run comparisons.

``metrics.jsonl`` is the record of a run (see ``docs/architecture.md`` for the keys). It is
append-only and flushed line by line, so a crash loses at most the line being written; on
resume, lines newer than the checkpoint are moved to a side file rather than deleted.
"""

from mtgrpo.reporting.compare import (
    ComparisonTable,
    RunSummary,
    aggregate_seeds,
    compare_runs,
    load_run,
    summarize_run,
)
from mtgrpo.reporting.metrics import MetricsWriter, read_metrics
from mtgrpo.reporting.plots import plot_comparison, plot_run
from mtgrpo.reporting.trackers import Trackers, check_trackers_available

__all__ = [
    "ComparisonTable",
    "MetricsWriter",
    "RunSummary",
    "Trackers",
    "aggregate_seeds",
    "check_trackers_available",
    "compare_runs",
    "load_run",
    "plot_comparison",
    "plot_run",
    "read_metrics",
    "summarize_run",
]
