"""Benchmark of the gradient-noise analysis at its default size.

Times, separately, drawing the synthetic rewards and running :func:`mtgrpo.analysis.analyze`
on the ``mtgrpo analyze`` default: 40 prompts × 200 seeds × m = 8 × R = 3 (64 000
completions). Each is run once to warm up (first-call costs of torch and numpy), then
``repeats`` times; the median is the headline. Target: well under a second each.

    .venv/bin/python benchmarks/bench_analysis.py           # 11 repeats
    .venv/bin/python benchmarks/bench_analysis.py --quick   # 3 repeats
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from mtgrpo.analysis import analyze, correlation_matrix, synthetic_rewards

SHAPE = (40, 200, 8, 3)  # [P, S, m, R]
WEIGHTS = (1.0, 1.0, 0.5)
RHO = 0.5


def _time(fn: Callable[[], Any], repeats: int) -> list[float]:
    fn()  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return seconds


def _row(name: str, seconds: list[float], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "shape": list(SHAPE),
        "repeats": len(seconds),
        "median_s": statistics.median(seconds),
        "min_s": min(seconds),
        "max_s": max(seconds),
        **extra,
    }


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Time synthetic generation and the analysis; one dict per timed step."""
    repeats = 3 if quick else 11
    num_prompts, num_seeds, group_size, num_channels = SHAPE
    correlation = correlation_matrix(RHO, num_channels)

    def generate() -> Any:
        return synthetic_rewards(correlation, num_prompts=num_prompts, num_seeds=num_seeds,
                                 group_size=group_size, seed=0).rewards

    rewards = generate()
    generation = _time(generate, repeats)
    analysis = _time(lambda: analyze(rewards, WEIGHTS, seed=0), repeats)
    ratio = analyze(rewards, WEIGHTS, seed=0).summary.na.ratio
    return [
        _row("synthetic_rewards", generation),
        _row("analyze", analysis, na_ratio=ratio),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats instead of 11")
    rows = run(quick=parser.parse_args().quick)
    for row in rows:
        extra = f"  NA ratio {row['na_ratio']:.3f}" if "na_ratio" in row else ""
        print(f"{row['name']:<18} {'x'.join(map(str, row['shape']))}  median "
              f"{1000 * row['median_s']:7.1f} ms  (min {1000 * row['min_s']:.1f}, max "
              f"{1000 * row['max_s']:.1f}, {row['repeats']} runs){extra}")


if __name__ == "__main__":
    main()
