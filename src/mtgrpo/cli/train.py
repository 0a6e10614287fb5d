"""``mtgrpo train [CONFIG] [--field value ...]``: multi-task GRPO from a YAML run file.

CONFIG is a YAML file or the name of a built-in recipe (quickstart, smollm2-mtgrpo3-easy,
paper-exp1-qwen2.5-3b, ...); without it the quickstart runs (``mtgrpo train --max_steps 10``
is the quickstart with 10 steps). Every option of the file can be overridden on the command
line: ``--learning_rate 1e-5``, ``--model.dtype bfloat16``, ``--task_weighting_params.lam 0.5``
(values are read as YAML; ``--max-steps`` works as well as ``--max_steps``). The resolved
config is written to the run directory as ``config.yaml``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

DEFAULT_CONFIG = "quickstart"
# the command's own switches; every other --name is a run-file field
_OWN = ("--print-config", "--debug", "--help", "-h")
# the fields shown in --help (all of them: --print-config, or docs/configuration.md)
MOST_USED = ("output_dir", "max_steps", "learning_rate", "num_generations", "prompts_per_step",
             "max_completion_length", "temperature", "loss_type", "beta", "task_weighting",
             "batch_construction", "eval_steps", "save_steps", "logging_steps", "seed",
             "report_to", "resume_from_checkpoint")


def normalize(rest: Sequence[str]) -> list[str]:
    """The arguments after ``train``: the default CONFIG put in when the first argument other
    than the command's own switches is an option; own switches hyphenated (``--print_config``),
    fields spelled as in the file (``--max-steps`` -> ``--max_steps``)."""
    out = []
    for token in rest:
        name, sep, value = token.partition("=")
        if token.startswith("--") and name.replace("_", "-") in _OWN:
            out.append(name.replace("_", "-") + sep + value)
        elif token.startswith("--"):
            out.append("--" + name[2:].replace("-", "_") + sep + value)
        else:
            out.append(token)
    first = next((i for i, token in enumerate(out) if token not in _OWN), len(out))
    # An option first: no CONFIG given, so the quickstart runs (module docstring)
    if first == len(out) or out[first].startswith("-"):
        out.insert(first, DEFAULT_CONFIG)
    return out


def _fields_epilog() -> str:
    """The run file's sections and its most used fields, with their help and default."""
    import dataclasses
    import textwrap

    from mtgrpo.config import RunConfig, TrainConfig, config_fields_help

    rows = {name: (default, text) for name, _, default, text in config_fields_help(TrainConfig)}
    sections = [f.name for f in dataclasses.fields(RunConfig) if f.name != "training"]
    wrap = textwrap.TextWrapper(width=78, subsequent_indent="      ",
                                break_on_hyphens=False).wrap
    lines = [*textwrap.wrap(
        "run-file fields: any field of the file can be given as --field value (values read "
        "as YAML), a section's as --section.field value (e.g. --model.dtype bfloat16, "
        "--sft.max_steps 100).", width=78, break_on_hyphens=False),
        *wrap(f"  sections: {', '.join(sections)}"),
        *wrap(f"  all {len(rows)} training fields with their values: mtgrpo train [CONFIG] "
              "--print-config; their help: docs/configuration.md"),
        "most used fields:"]
    for name in MOST_USED:
        default, text = rows[name]
        said = "" if "default" in text.lower() else f" (default: {default})"
        lines.extend(wrap(f"  --{name}  {text}{said}"))
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG, metavar="CONFIG",
                        help=f"YAML run file or built-in recipe name (default: "
                        f"{DEFAULT_CONFIG})")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config (every field, overrides applied) and "
                        "exit")
    # argparse cannot show the free-form --field overrides itself.
    parser.usage = "%(prog)s [-h] [--debug] [--print-config] [CONFIG] [--field value ...]"
    parser.epilog = _fields_epilog()


def run(args: argparse.Namespace) -> int:
    import yaml

    from mtgrpo.compat import load_run_config
    from mtgrpo.recipes import recipe_path

    overrides = list(getattr(args, "overrides", []))
    try:
        run_config = load_run_config(recipe_path(args.config), overrides)
    except (ValueError, TypeError, FileNotFoundError) as exc:  # the run file or its options
        print(f"mtgrpo train: {exc}", file=sys.stderr)
        return 2  # argparse's exit status for a usage error
    if args.print_config:
        # The run file's own field order.
        print(yaml.safe_dump(run_config.to_dict(), sort_keys=False))
        return 0
    _configure_logging()
    from mtgrpo.trainer.run import run_training

    run_training(run_config)  # ends with the summary and report/ (report_at_end)
    return 0


def _configure_logging() -> None:
    import logging

    from rich.logging import RichHandler

    logging.basicConfig(level=logging.INFO, format="%(message)s", datefmt="[%X]",
                        handlers=[RichHandler(show_path=False)])
    # Their per-request INFO lines would bury the training log.
    for noisy in ("httpx", "urllib3", "filelock", "datasets", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
