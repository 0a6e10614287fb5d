"""Items per second of task generation and of scoring, per task.

    python benchmarks/bench_tasks.py                     # the 12 paper tasks + the quickstart's
    python benchmarks/bench_tasks.py --tasks countdown:easy,arc_1d:medium --seconds 5

Generation: :func:`mtgrpo.tasks.measure_generation` (one process, no cache), as many items as
fit in about ``--seconds`` (at least ``--min-items``), after a first item that pays for imports.
Scoring: the task suite's own reward function on completions that hold the gold answer, then on
completions that hold a wrong one (the answer with its last character changed), in batches of
64 as the trainer calls it; items/s over both. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from mtgrpo.tasks import TaskSuite, measure_generation
from mtgrpo.tasks.families import LEVELS

PAPER_TASKS = [f"{family}:{level}" for family in ("countdown", "zebra_puzzles", "arc_1d")
               for level in LEVELS]
QUICKSTART_TASKS: list[dict] = [
    {"family": "basic_arithmetic", "name": "addition",
     "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                "operators": ["+"]}},
    {"family": "countdown", "name": "countdown:3x9",
     "config": {"min_numbers": 3, "max_numbers": 3, "min_value": 1, "max_value": 9,
                "min_target": 1, "max_target": 200}},
]


def generation_rate(task: object, seconds: float, min_items: int) -> tuple[int, float]:
    measure_generation(task, items=1)  # imports and the dataset's first construction
    estimate = max(measure_generation(task, items=2).seconds / 2, 1e-4)
    items = max(min_items, min(2000, int(seconds / estimate)))
    rate = measure_generation(task, items=items)
    return rate.items, rate.items_per_s


def _wrong(answer: str) -> str:
    if not answer:
        return "0"
    last = answer[-1]
    return answer[:-1] + ("1" if last != "1" else "2")


def scoring_rate(task: object, rows: int) -> float:
    with TaskSuite([task], seed=0, train_size=rows, eval_size=1, workers=0,
                   use_cache=False) as suite:
        data = suite.train.start().rows()
        reward = suite.reward_routing[suite.task_ids[0]][0]
        completions = [f"<answer>{row['answer']}</answer>" for row in data]
        completions += [f"<answer>{_wrong(row['answer'])}</answer>" for row in data]
        columns = {key: [row[key] for row in data] * 2 for key in data[0] if key != "prompt"}
        prompts = [row["prompt"] for row in data] * 2
        start = time.perf_counter()
        scores: list[float | None] = []
        for lo in range(0, len(completions), 64):
            part = slice(lo, lo + 64)
            scores += reward(prompts=prompts[part], completions=completions[part],
                             **{key: values[part] for key, values in columns.items()})
        seconds = time.perf_counter() - start
    right = sum(1 for s in scores[: len(data)] if s == 1.0)
    if right != len(data):
        raise AssertionError(f"{task}: only {right} of {len(data)} gold answers scored 1.0")
    return len(completions) / seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", help="comma-separated task ids (default: the paper's 12 "
                        "tasks and the quickstart's own)")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="generation time to aim for per task")
    parser.add_argument("--min-items", type=int, default=3)
    parser.add_argument("--score-rows", type=int, default=64,
                        help="rows per task for the scoring rate (each scored right and wrong)")
    args = parser.parse_args(argv)
    tasks: list[object] = (args.tasks.split(",") if args.tasks
                           else [*PAPER_TASKS, *QUICKSTART_TASKS])
    print("| task | generated items | generation items/s | scoring items/s |")
    print("| --- | ---: | ---: | ---: |")
    for task in tasks:
        name = task["name"] if isinstance(task, dict) else task
        items, gen_rate = generation_rate(task, args.seconds, args.min_items)
        rows = max(min(args.score_rows, items), 2)
        print(f"| {name} | {items} | {gen_rate:,.1f} | {scoring_rate(task, rows):,.0f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
