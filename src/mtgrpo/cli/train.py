"""``mtgrpo train [CONFIG] [--field value ...]``: multi-task GRPO from a YAML run file.

CONFIG is a YAML file or the name of a built-in recipe (``quickstart``,
``smollm2-mtgrpo3-easy``, ``paper-exp1-qwen2.5-3b``, ...); without it the quickstart runs.
Every option of the file can be overridden on the command line: ``--learning_rate 1e-5``,
``--model.dtype bfloat16``, ``--task_weighting_params.lam 0.5`` (values are read as YAML).
The resolved config is written to the run directory as ``config.yaml``.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", default="quickstart",
                        help="YAML run file or built-in recipe name (default: quickstart)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config and exit")


def run(args: argparse.Namespace) -> int:
    import yaml

    from mtgrpo.config import load_run_config
    from mtgrpo.recipes import recipe_path

    overrides = list(getattr(args, "overrides", []))
    try:
        run_config = load_run_config(recipe_path(args.config), overrides)
    except (ValueError, TypeError, FileNotFoundError) as exc:  # the run file or its options
        print(f"mtgrpo train: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(yaml.safe_dump(run_config.to_dict(), sort_keys=False))
        return 0
    _configure_logging()
    from mtgrpo.trainer.run import run_training

    run_training(run_config)
    _print_summary(run_config.training.output_dir)
    return 0


def _configure_logging() -> None:
    import logging

    from rich.logging import RichHandler

    logging.basicConfig(level=logging.INFO, format="%(message)s", datefmt="[%X]",
                        handlers=[RichHandler(show_path=False)])
    for noisy in ("httpx", "urllib3", "filelock", "datasets", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _print_summary(run_dir: str) -> None:
    from rich.console import Console

    from mtgrpo.reporting.compare import load_run, run_report, summarize_run, summarize_tasks

    history = load_run(run_dir)
    Console().print(run_report(summarize_run(history), summarize_tasks(history)))
    print(f"run directory: {run_dir}  (metrics.jsonl, checkpoints, report/)")
