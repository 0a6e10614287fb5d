"""The ``mtgrpo`` command line: thin sub-commands that parse arguments and call the library.

Each sub-command lives in its own module of this package and exposes
``add_arguments(parser)`` and ``run(args) -> int`` (the exit status). Options are written with
hyphens (``--num-samples``) and a run file's fields as in the file (``--max_steps``); either
spelling is accepted everywhere. Help shows each option's default. An exception that
escapes a command is printed as one line (its message) with exit status 1; ``--debug``
(before or after the command) lets it propagate with its traceback. A command module
imports nothing heavy at module level (torch, transformers, ...): those imports go
inside ``run``, so ``mtgrpo --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Sequence
from typing import Any

# command name -> (module, one-line help, aliases)
COMMANDS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "train": (
        "mtgrpo.cli.train",
        "multi-task GRPO from a YAML run file or a built-in recipe (default: quickstart)",
        (),
    ),
    "sft": (
        "mtgrpo.cli.sft",
        "supervised warm start on gold answers (or prompt/completion data) before GRPO",
        (),
    ),
    "eval": (
        "mtgrpo.cli.eval",
        "per-task accuracy, worst task, average and Δm% of a model on task suites or files",
        (),
    ),
    "analyze": (
        "mtgrpo.cli.analyze",
        "gradient-noise ('Theorem 3') check of multi-reward advantage estimators",
        ("thm3-check",),
    ),
    "report": (
        "mtgrpo.cli.report",
        "figures and summary of one run (per-task accuracy, worst task, weights, composition)",
        (),
    ),
    "compare": (
        "mtgrpo.cli.compare",
        "compare runs: worst-task / average accuracy, steps to threshold, Δm%, seeds",
        (),
    ),
    "vllm-serve": (
        "mtgrpo.cli.vllm_serve",
        "a vLLM generation server for trainers on other devices or machines (vllm_mode: server)",
        (),
    ),
    "tiny-model": (
        "mtgrpo.cli.tiny_model",
        "build the tiny local model (offline: Llama or Qwen2, byte-level tokenizer, ChatML)",
        (),
    ),
}


DEBUG_HELP = "on an error, show the full traceback (default: the error's message only)"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; each option's help ends with its default, unless the help
    already says it or there is none to say (no value, a switch that is off)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in text.lower() or default is None
                or default is False or default is argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def plain_text(doc: str) -> str:
    """A docstring as help text: reStructuredText's ``literal`` and :role:`target` marks
    dropped (``quickstart`` -> quickstart), the words kept."""
    # ":func:`~pkg.name`" -> "pkg.name": Sphinx's "~" goes too.
    doc = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc)
    return re.sub(r"``([^`]+)``", r"\1", doc)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mtgrpo",
        description="Multi-task, multi-reward GRPO post-training of language models.",
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    # Also accepted after the command; SUPPRESS keeps a sub-command from resetting it.
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text, aliases) in COMMANDS.items():
        # Cheap: command modules import nothing heavy at module level.
        module = importlib.import_module(module_name)
        command_parser = sub.add_parser(
            # argparse %-formats help: a literal % (Δm%) must be doubled.
            name, help=help_text.replace("%", "%%"), aliases=list(aliases),
            description=plain_text(module.__doc__ or ""),  # %-formatted only with %(prog)
            formatter_class=HelpFormatter, parents=[debug],
        )
        module.add_arguments(command_parser)
        command_parser.set_defaults(_module=module_name)
    return parser


def _command_index(argv: Sequence[str]) -> int | None:
    """Where the command name is in ``argv`` (after the global options), None without one."""
    for i, token in enumerate(argv):
        if not token.startswith("-"):
            return i
    return None


def normalize_argv(argv: Sequence[str], commands: Any = COMMANDS) -> list[str]:
    """Both spellings of an option, one meaning: a command's options to their hyphenated form
    (``--num_samples`` -> ``--num-samples``), ``train``'s run-file fields to the file's
    (``--max-steps`` -> ``--max_steps``); and ``train --field ...`` without a CONFIG runs the
    default one, as the usage says, rather than reading the field's value as the CONFIG."""
    out = list(argv)
    at = _command_index(out)
    if at is None:
        return out
    aliases = {alias: name for name, (_, _, names) in commands.items() for alias in names}
    command = aliases.get(out[at], out[at])
    if command == "train":
        from mtgrpo.cli import train

        return out[:at + 1] + train.normalize(out[at + 1:])
    for i in range(at + 1, len(out)):
        token = out[i]
        if token == "--":  # after "--" the arguments are values, left as written
            break
        if token.startswith("--"):
            name, sep, value = token[2:].partition("=")
            out[i] = f"--{name.replace('_', '-')}{sep}{value}"
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = normalize_argv(sys.argv[1:] if argv is None else argv)
    # The train command's run-file fields are unknown to argparse: they come back as extras.
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "train":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = extra  # `mtgrpo train CONFIG --field value ...`
    if args.command is None:
        parser.print_help()
        return 2  # argparse's exit status for a usage error
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args) or 0)
    except Exception as error:  # one clear line for the user; --debug shows where it came from
        if args.debug:
            raise
        print(f"mtgrpo {args.command}: {error}\n(add --debug to see the traceback)",
              file=sys.stderr)  # fmt: skip
        return 1


if __name__ == "__main__":
    sys.exit(main())
