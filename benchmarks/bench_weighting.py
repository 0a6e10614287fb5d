"""Cost of one ``update`` of every task-weighting strategy, from 1 to 10,000 tasks.

Each strategy is warmed up, then ``update`` is timed call by call with
``time.perf_counter_ns`` on a fixed pool of pre-built :class:`TaskStats` (about 30 % of the
tasks absent, with NaN or inf in their fields, so the absent-task paths are exercised). The
table gives the median and the 90th percentile in microseconds.

    python benchmarks/bench_weighting.py            # K = 1, 10, 100, 1,000, 10,000
    python benchmarks/bench_weighting.py --quick    # K = 1, 10, 100, fewer repetitions

Other scripts call :func:`run`, which returns one dict per (strategy, K).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mtgrpo.algo.weighting import WEIGHTINGS, TaskStats, WeightingStrategy, make_weighting

FULL_SIZES = (1, 10, 100, 1_000, 10_000)
QUICK_SIZES = (1, 10, 100)
_POOL = 64


def _strategy(name: str, num_tasks: int) -> WeightingStrategy:
    if name == "fixed":
        return make_weighting(name, num_tasks, weights=np.arange(1.0, num_tasks + 1.0))
    return make_weighting(name, num_tasks)


def _stats_pool(num_tasks: int, seed: int = 0) -> list[TaskStats]:
    rng = np.random.default_rng(seed)
    pool = []
    for _ in range(_POOL):
        count = rng.integers(1, 9, size=num_tasks) * (rng.random(num_tasks) >= 0.3)
        absent = count == 0
        reward = np.where(absent, np.nan, rng.random(num_tasks))
        improvement = np.where(absent, np.inf, rng.normal(0.0, 0.05, num_tasks))
        mean_abs = np.where(absent, np.nan, rng.random(num_tasks))
        pool.append(TaskStats(reward, count, improvement, mean_abs))
    return pool


def time_updates(strategy: WeightingStrategy, pool: list[TaskStats], repeats: int) -> np.ndarray:
    """Nanoseconds of each of ``repeats`` ``update`` calls, after a warm-up of 10 % of them."""
    for i in range(max(repeats // 10, 10)):
        strategy.update(pool[i % len(pool)])
    timings = np.empty(repeats, dtype=np.int64)  # [repeats]
    clock, update = time.perf_counter_ns, strategy.update
    for i in range(repeats):
        stats = pool[i % len(pool)]
        start = clock()
        update(stats)
        timings[i] = clock() - start
    return timings


def run(quick: bool = False, sizes: tuple[int, ...] | None = None) -> list[dict]:
    """Time every registered strategy; one row per (strategy, K).

    Row keys: ``strategy``, ``num_tasks``, ``repeats``, ``median_us``, ``p90_us``.
    """
    sizes = sizes or (QUICK_SIZES if quick else FULL_SIZES)
    rows = []
    for num_tasks in sizes:
        pool = _stats_pool(num_tasks)
        repeats = 200 if quick else (2_000 if num_tasks <= 1_000 else 500)
        for name in WEIGHTINGS.names():
            timings = time_updates(_strategy(name, num_tasks), pool, repeats) / 1_000.0
            rows.append(
                {
                    "strategy": name,
                    "num_tasks": num_tasks,
                    "repeats": repeats,
                    "median_us": float(np.median(timings)),
                    "p90_us": float(np.percentile(timings, 90)),
                }
            )
    return rows


def format_table(rows: list[dict]) -> str:
    """Strategies as rows, K as columns: ``median (p90)`` in microseconds."""
    sizes = sorted({row["num_tasks"] for row in rows})
    names = sorted({row["strategy"] for row in rows})
    cell = {
        (r["strategy"], r["num_tasks"]): f"{r['median_us']:.1f} ({r['p90_us']:.1f})" for r in rows
    }
    width = max(14, *(len(c) for c in cell.values()))
    header = f"{'strategy':<12}" + "".join(f"{'K=' + format(k, ','):>{width + 2}}" for k in sizes)
    lines = [header, "-" * len(header)]
    for name in names:
        lines.append(f"{name:<12}" + "".join(f"{cell[name, k]:>{width + 2}}" for k in sizes))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="K up to 100, 200 repetitions")
    parser.add_argument(
        "--sizes", type=int, nargs="+", help="numbers of tasks to time (default 1 ... 10,000)"
    )
    args = parser.parse_args()
    rows = run(quick=args.quick, sizes=tuple(args.sizes) if args.sizes else None)
    print("median (p90) microseconds per update()")
    print(format_table(rows))


if __name__ == "__main__":
    main()
