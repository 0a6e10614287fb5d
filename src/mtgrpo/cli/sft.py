"""``mtgrpo sft``: supervised warm start on gold answers (or on your own prompt/completion data).

A model that never answers correctly gives GRPO nothing to learn from (every group has zero
gradient). This command fine-tunes it on completions that put the gold answer in the format
the task's prompt asks for, then saves a checkpoint to start GRPO from:

    mtgrpo sft --model runs/tiny --tasks mtgrpo3 --num-examples 256 --output runs/warm
    mtgrpo sft --model runs/tiny --data pairs.jsonl --output runs/warm --max-steps 200 --lora \\
        --merge-lora

With ``--tasks``, match the prompt options (``--prompt-format``, ``--answer-format``,
``--think-prefix``, ``--task-seed``, ``--eval-size``) to the GRPO run, so that the warm start sees
the prompts GRPO will see and its training problems stay disjoint from GRPO's evaluation split.
``--data`` reads JSONL / JSON / parquet rows with ``prompt`` and ``completion`` columns (or
``messages`` ending with the assistant turn). The model is saved to ``OUTPUT/model``.

Exit status: 0 on success, 2 for invalid input (reported before training), 1 when training
diverges.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from pathlib import Path
from typing import Any

from mtgrpo.sft.config import ON_LONG_EXAMPLE, SFTConfig

# Short spellings of a few SFTConfig flags (the long, derived ones work too).
_ALIASES = {
    "num_train_epochs": ("--epochs",),
    "learning_rate": ("--lr",),
    "per_device_train_batch_size": ("--batch-size",),
    "gradient_accumulation_steps": ("--grad-accum",),
}
_CHOICES = {"on_long_example": ON_LONG_EXAMPLE}
_NOT_FLAGS = ("output_dir",)  # given as --output


def _optional(kind: type) -> Any:
    def parse(text: str) -> Any:
        # YAML's spellings of a null.
        return None if text.strip().lower() in ("none", "null") else kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its error ("invalid int value")
    return parse


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per SFTConfig field, help from the field; unset flags keep the field default."""
    group = parser.add_argument_group("training options (SFTConfig)")
    hints = typing.get_type_hints(SFTConfig)
    for field in dataclasses.fields(SFTConfig):
        if field.name in _NOT_FLAGS:
            continue
        flags = [f"--{field.name.replace('_', '-')}", *_ALIASES.get(field.name, ())]
        help_text = f"{field.metadata['help']} (default: {field.default})"
        # Int | None -> {int, NoneType}; a plain type stands for itself.
        kinds = set(typing.get_args(hints[field.name])) or {hints[field.name]}
        # SUPPRESS: an unset flag is absent from the namespace, so the dataclass default applies
        # (and "none" can still set an optional field to None).
        options: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS,
                                   "help": help_text}
        if bool in kinds:
            options["action"] = argparse.BooleanOptionalAction
        else:
            kind = int if int in kinds else float if float in kinds else str
            options["type"] = _optional(kind) if type(None) in kinds else kind
            options["choices"] = _CHOICES.get(field.name)
        group.add_argument(*flags, **options)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="PATH",
                        help="model directory, .gguf file or hub id to fine-tune")
    parser.add_argument("--tiny", action="store_true",
                        help="build the tiny local model at --model first if it is not there")
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="run directory: metrics.jsonl, model/ (and adapter/)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tasks", metavar="SUITE_OR_TASK_IDS",
                        help="a suite name (mtgrpo3, mtgrpo9) or comma-separated task ids")
    source.add_argument("--data", metavar="FILE",
                        help="JSONL / JSON / parquet rows with prompt and completion columns")

    tasks = parser.add_argument_group("--tasks: generated problems and their solutions")
    tasks.add_argument("--num-examples", type=int, default=256,
                       help="training problems per task (default: %(default)s)")
    tasks.add_argument("--task-seed", type=int, default=0,
                       help="seed of the task suite; use the GRPO run's (default: %(default)s)")
    # TaskSuite's eval_size default, as a default GRPO run's.
    tasks.add_argument("--eval-size", type=int, default=200,
                       help="the GRPO run's eval items per task; training problems are kept "
                            "disjoint from them (default: %(default)s)")
    tasks.add_argument("--prompt-format", default="plain", help="plain, chat or paper")
    tasks.add_argument("--answer-format", default="answer_tag", help="answer_tag or boxed")
    tasks.add_argument("--think-prefix", action="store_true",
                       help="prompts end with <think> (as in the GRPO run)")
    tasks.add_argument("--system-prompt", default=None, help="system message (chat formats)")
    tasks.add_argument("--template", default="think_answer",
                       help="completion template: think_answer, answer_only, or a format "
                            "string with {answer} (and {reasoning}, {gold})")
    tasks.add_argument("--reasoning", default="restate",
                       help="think-block text: restate (one line) or none")
    tasks.add_argument("--workers", type=int, default=None,
                       help="task generation processes (0: in this process)")

    data = parser.add_argument_group("--data: column names")
    data.add_argument("--prompt-column", default="prompt", help="the prompt column")
    data.add_argument("--completion-column", default="completion",
                      help="the completion column")
    data.add_argument("--messages-column", default="messages",
                      help="the chat column, used when a row has no prompt column (its last "
                      "turn, the assistant's, is the completion)")

    lora = parser.add_argument_group("LoRA")
    lora.add_argument("--lora", action="store_true", help="train a LoRA adapter")
    # 16 and 32: TRL 1.16 ModelConfig's lora_r and lora_alpha
    lora.add_argument("--lora-r", type=int, default=16, help="LoRA rank (default: %(default)s)")
    lora.add_argument("--lora-alpha", type=float, default=32,
                      help="LoRA alpha (default: %(default)s)")
    _add_config_flags(parser)


def _config(args: argparse.Namespace) -> SFTConfig:
    given = {field.name: getattr(args, field.name) for field in dataclasses.fields(SFTConfig)
             if field.name not in _NOT_FLAGS and hasattr(args, field.name)}
    return SFTConfig(output_dir=args.output, **given)


def _read_data(path: str) -> list[dict[str, Any]]:
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"--data {path!r} is not a file; pass a .jsonl, .json or .parquet file")
    suffix = file.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        rows = []
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{file}:{number} is not a JSON object ({error})") from error
        return rows
    if suffix == ".json":
        rows = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(rows, list):
            raise ValueError(f"{file} must hold a JSON list of rows, got {type(rows).__name__}")
        return rows
    if suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        return pq.read_table(file).to_pylist()
    raise ValueError(f"--data {path!r}: unsupported file type {suffix!r}; use .jsonl, .json or "
                     ".parquet")


def _task_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from mtgrpo.sft import solutions_from_rows
    from mtgrpo.tasks import make_suite

    if args.num_examples < 1:
        raise ValueError(f"--num-examples {args.num_examples} must be at least 1")
    names = [name.strip() for name in args.tasks.split(",") if name.strip()]
    # A single name may be a suite name (make_suite)
    tasks = names[0] if len(names) == 1 else names
    options = {"train_size": args.num_examples, "eval_size": args.eval_size,
               "seed": args.task_seed, "prompt_format": args.prompt_format,
               "answer_format": args.answer_format, "think_prefix": args.think_prefix,
               "system_prompt": args.system_prompt, "workers": args.workers}
    with make_suite(tasks, **options) as suite:
        # The training split leaves out the eval split's problems (content-keyed families)
        rows = suite.train.rows()
    return solutions_from_rows(rows, args.template, reasoning=args.reasoning)


def _prepare(args: argparse.Namespace) -> tuple[SFTConfig, list[dict[str, Any]], Any, str]:
    """Everything that can fail on user input, before any weights are read."""
    from mtgrpo.models import ensure_tiny_model
    from mtgrpo.sft.train import earlier_run_files

    config = _config(args)
    taken = earlier_run_files(config.output_dir)
    if taken and not config.overwrite_output_dir:  # said in the flags the user types
        raise ValueError(f"--output {config.output_dir} already holds an SFT run "
                         f"({', '.join(taken)}); pass another --output, or add "
                         "--overwrite-output-dir to replace it")
    rows = _task_rows(args) if args.tasks else _read_data(args.data)
    peft = {"r": args.lora_r, "lora_alpha": args.lora_alpha} if args.lora else None
    model = str(ensure_tiny_model(args.model)) if args.tiny else args.model
    return config, rows, peft, model


def run(args: argparse.Namespace) -> int:
    """Fine-tune and save; 2 for invalid input, 1 if the loss diverges (message on stderr)."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        config, rows, peft, model = _prepare(args)
        from mtgrpo.sft import sft_train

        result = sft_train(model, None, rows, config, peft,
                           prompt_column=args.prompt_column,
                           completion_column=args.completion_column,
                           messages_column=args.messages_column)
    except (ValueError, TypeError, OSError, ImportError) as error:
        print(f"mtgrpo sft: error: {error}", file=sys.stderr)
        return 2
    except FloatingPointError as error:  # sft_train raises it when the loss turns non-finite
        print(f"mtgrpo sft: training diverged: {error}", file=sys.stderr)
        return 1
    evaluation = "" if result.eval_loss is None else f", eval loss {result.eval_loss:.4f}"
    print(f"trained on {result.num_train_examples} examples for {result.steps} steps "
          f"({result.seconds:.1f} s): loss {result.losses[0]:.4f} -> {result.final_loss:.4f}"
          f"{evaluation}")
    print(f"saved to {result.model_dir}" + (
        f" (adapter: {result.adapter_dir})" if result.adapter_dir is not None else ""))
    return 0
