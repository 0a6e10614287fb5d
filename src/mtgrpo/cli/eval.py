"""``mtgrpo eval --model PATH_OR_NAME --tasks mtgrpo3 --num-samples 8 --temperature 1.0``

Evaluates a model per task: accuracy (mean over ``--num-samples`` samples per prompt), mean
reward, format rate, completion length; the worst task and the average; Δm% against a
baseline results file. Prompts come from a task suite (``--tasks``: a suite name such as
``mtgrpo3`` or task ids ``countdown:easy,arc_1d:easy``; ``--eval-size`` prompts per task,
the suite's held-out split), from a run file's or recipe's ``tasks`` section (``--config
smollm2-mtgrpo3-easy``: its tasks, formats, seed and held-out split, the same prompts the
trainer evaluates on), from the papers' released test sets (``--paper-test-sets DIR``
with ``--tasks``), or from a file with a task column (``--data FILE --rewards NAME,...``).
Writes ``results.json`` to ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="hub name, directory, adapter or .gguf")
    parser.add_argument("--tasks", help="suite name or comma-separated task ids")
    parser.add_argument("--config", help="a run file or built-in recipe (e.g. "
                        "smollm2-mtgrpo3-easy): evaluate on its tasks section, with its prompt "
                        "and answer formats, seed, eval size and completion length")
    parser.add_argument("--eval-size", type=int, help="prompts per task (default: 200, or the "
                        "config's eval_size)")
    parser.add_argument("--seed", type=int, help="suite seed (held-out split; default: 0, or "
                        "the config's)")
    parser.add_argument("--paper-test-sets", help="directory of the papers' released test sets")
    parser.add_argument("--data", help="JSONL/JSON/parquet/CSV file with prompt and task columns")
    parser.add_argument("--rewards", help="reward names or module:function, comma-separated "
                        "(required with --data; added to the task rewards with --tasks)")
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int,
                        help="default: 512, or the config's max_completion_length")
    parser.add_argument("--prompt-format", help="plain (default), chat or paper")
    parser.add_argument("--answer-format", help="answer_tag (default) or boxed")
    parser.add_argument("--baseline", help="results.json of a baseline model, for Δm%%")
    parser.add_argument("--backend", default="auto", help="generation backend (auto, hf, ...)")
    parser.add_argument("--out", default="runs/eval", help="output directory")


def _inputs(args: argparse.Namespace):
    """(rows, rewards, suite to close) from the command line."""
    extra = args.rewards.split(",") if args.rewards else None
    if args.data:
        if extra is None:
            raise ValueError("--data needs --rewards (reward names or module:function paths)")
        return args.data, extra, None
    if args.config:
        if args.tasks:
            raise ValueError("give --tasks or --config, not both")
        suite = _suite_from_config(args)
    elif args.tasks:
        from mtgrpo.tasks import SUITES, TaskSuite

        tasks = SUITES.get(args.tasks) if args.tasks in SUITES else args.tasks.split(",")
        suite = TaskSuite(tasks, seed=args.seed or 0, train_size=1, eval_size=args.eval_size or 200,
                          prompt_format=args.prompt_format or "plain",
                          answer_format=args.answer_format or "answer_tag")
    else:
        raise ValueError("give --tasks (a suite or task ids), --config (a run file with a tasks "
                         "section) or --data with --rewards")
    from mtgrpo.tasks import load_paper_test_sets

    routing = {task: list(fns) for task, fns in suite.reward_routing.items()}
    if extra:
        routing["*"] = extra
    if args.paper_test_sets:
        rows = load_paper_test_sets(args.paper_test_sets, tasks=suite.task_ids,
                                    per_task=args.eval_size or 200)
    else:
        rows = suite.eval.start()
    return rows, routing, suite


def _suite_from_config(args: argparse.Namespace):
    """The held-out split of a run file's ``tasks`` section; flags given override its values."""
    from mtgrpo.config import load_run_config
    from mtgrpo.recipes import recipe_path

    run = load_run_config(recipe_path(args.config), [])
    if run.tasks is None:
        raise ValueError(f"{args.config} has no tasks section; use --tasks or --data")
    flags = {key: value for key, value in (
        ("eval_size", args.eval_size), ("prompt_format", args.prompt_format),
        ("answer_format", args.answer_format), ("seed", args.seed)) if value is not None}
    if args.max_new_tokens is None:
        args.max_new_tokens = run.training.max_completion_length
    return run.tasks.build_suite(train_size=1, **flags)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from mtgrpo.evaluation import EvaluationResult, run_evaluation
    from mtgrpo.metrics import delta_m

    try:
        rows, rewards, suite = _inputs(args)
        baseline = EvaluationResult.load(args.baseline) if args.baseline else None
        try:
            result = run_evaluation(args.model, rows, rewards, num_samples=args.num_samples,
                                    temperature=args.temperature,
                                    max_new_tokens=args.max_new_tokens or 512,
                                    backend=args.backend)
        finally:
            if suite is not None:
                suite.close()
    except (ValueError, FileNotFoundError) as exc:
        print(f"mtgrpo eval: {exc}", file=sys.stderr)
        return 2
    if baseline is not None:
        accuracy = {t: r.accuracy for t, r in result.tasks.items()}
        change = delta_m(accuracy, {t: r.accuracy for t, r in baseline.tasks.items()})
        result.extra.update({"delta_m": change.value,
                             "delta_m_skipped_tasks": list(change.skipped_zero_baseline),
                             "delta_m_missing_tasks": list(change.missing),
                             "baseline": args.baseline})
    path = result.save(Path(args.out) / "results.json")
    _print(result)
    print(f"results: {path}")
    return 0


def _print(result) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="per-task evaluation")
    for column in ("task", "prompts", "accuracy", "mean reward", "format rate", "length"):
        table.add_column(column, justify="left" if column == "task" else "right")
    for name, r in result.tasks.items():
        marker = " (worst)" if name == result.worst_task else ""
        table.add_row(name + marker, str(r.prompts), f"{100 * r.accuracy:.1f}%",
                      f"{r.mean_reward:.3f}", f"{100 * r.format_rate:.1f}%",
                      f"{r.mean_length:.1f}")
    console = Console()
    console.print(table)
    line = (f"worst-task accuracy {100 * result.worst_accuracy:.1f}% ({result.worst_task}), "
            f"average {100 * result.average_accuracy:.1f}%")
    if "delta_m" in result.extra:
        value = result.extra["delta_m"]
        line += ", Δm% vs baseline " + ("— (no task to compare)" if value is None
                                         else f"{value:+.1f}")
    console.print(line)
