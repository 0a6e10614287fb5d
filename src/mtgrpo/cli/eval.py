"""``mtgrpo eval --model PATH_OR_NAME --tasks mtgrpo3 --num-samples 8 --temperature 1.0``

Evaluates a model per task: accuracy (mean over ``--num-samples`` samples per prompt), mean
reward, format rate, completion length; the worst task and the average; Δm% against a
baseline results file. Prompts come from a task suite (``--tasks``: a suite name such as
``mtgrpo3`` or task ids ``countdown:easy,arc_1d:easy``; ``--eval-size`` prompts per task,
the suite's held-out split), from a run file's or recipe's ``tasks`` section (``--config
smollm2-mtgrpo3-easy``: its tasks, formats, seed and held-out split, the same prompts the
trainer evaluates on; ``--tasks`` picks some of them), from the papers' released test sets
(``--paper-test-sets DIR``), or from a file with a task column (``--data FILE --rewards
NAME,...``).
Writes ``results.json`` to ``--out`` and prints a table. Its last two columns guard against a
task learned without solving it: the answer the completions give most often, with its share,
and the most common gold answer, with the accuracy of always giving it; a warning follows when
the completions have collapsed onto one answer or the accuracy is no better than that constant
(``mtgrpo.evaluation.answer_warnings``).

A held-out split larger than the config's ``eval_size`` (or drawn with another ``--seed``)
would hold problems the run trained on: in a small problem space such as two-digit addition,
about one in five past the first 100. With ``--config`` each of them is replaced by an
unseen problem (the run's training split and warm start are generated, or read from the cache,
to find them; the config's own split needs nothing), and ``results.json`` records how many
(``replaced_problems``), e.g.::

    mtgrpo eval --model CHECKPOINT --config smollm2-cpu --tasks countdown:3x20 \\
        --eval-size 800 --num-samples 1

The papers' test sets hold 200 problems for each of 12 levels (``countdown:easy`` …
``arc_1d:very_hard``); ``--tasks`` names the levels. With ``--config`` a trained run's
checkpoint is measured on the released problems asked the way the run taught it: each
problem is re-asked in the config's prompt and answer formats (and graded in that answer
format, with the config's completion length), e.g.::

    mtgrpo eval --model CHECKPOINT --config smollm2-cpu \\
        --paper-test-sets DIR --tasks countdown:easy

Without ``--tasks`` the levels are the config's own tasks when these are papers' levels
(``countdown:medium``, ...); a task at a config of its own (``countdown:3x20``) needs
``--tasks``. ``--paper-prompts released`` keeps the released prompts verbatim (answers in
``\\boxed{}``), the default without ``--config``. ``results.json`` records which prompts
were used (``paper_prompts``) and their formats.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any

PAPER_PROMPTS = ("config", "released")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="hub name, directory, adapter, .gguf or a run's checkpoint-N")
    parser.add_argument("--tasks", help="suite name or comma-separated task ids (with "
                        "--config: some of its tasks; with --paper-test-sets: the papers' "
                        "levels, e.g. countdown:easy)")
    parser.add_argument("--config", help="a run file or built-in recipe (e.g. "
                        "smollm2-mtgrpo3-easy): evaluate on its tasks section, with its prompt "
                        "and answer formats, seed, eval size and completion length")
    parser.add_argument("--eval-size", type=int, help="prompts per task (default: 200, or the "
                        "config's eval_size; more than that, or another --seed, replaces every "
                        "problem the config trains on; papers' test sets: all 200, or the "
                        "config's paper_test_per_task)")
    parser.add_argument("--seed", type=int, help="suite seed (held-out split; default: 0, or "
                        "the config's)")
    parser.add_argument("--paper-test-sets", help="directory of the papers' released test sets: "
                        "evaluate on their problems at the levels --tasks names (default with "
                        "--config: the config's tasks, when they are papers' levels)")
    parser.add_argument("--paper-prompts", choices=PAPER_PROMPTS, help="with --paper-test-sets: "
                        "'config' re-asks the released problems in the config's prompt and "
                        "answer formats (default with --config); 'released' asks them verbatim, "
                        "answers in \\boxed{} (default without --config)")
    parser.add_argument("--data", help="JSONL/JSON/parquet/CSV file with prompt and task columns")
    parser.add_argument("--rewards", help="reward names or module:function, comma-separated "
                        "(required with --data; added to the task rewards with --tasks)")
    # ALGORITHMS.md §6: the papers' evaluation, 8 samples per test prompt at temperature 1.0
    parser.add_argument("--num-samples", type=int, default=8, metavar="N",
                        help="completions sampled per prompt; a task's accuracy is the mean "
                        "over them (the papers: 8)")
    parser.add_argument("--temperature", type=float, default=1.0, metavar="T",
                        help="sampling temperature (0: greedy, then one sample is enough)")
    parser.add_argument("--max-new-tokens", type=int, metavar="N",
                        help="most tokens per completion (default: 512, or the config's "
                        "max_completion_length)")
    parser.add_argument("--prompt-format", help="plain (default, or the config's), chat or "
                        "paper")
    parser.add_argument("--answer-format", help="answer_tag (default, or the config's) or boxed")
    parser.add_argument("--baseline", metavar="RESULTS_JSON",
                        # "%%": argparse %-formats help strings
                        help="results.json of a baseline model, for Δm%%")
    parser.add_argument("--backend", default="auto", help="generation backend (auto, hf, ...)")
    parser.add_argument("--out", default="runs/eval", metavar="DIR",
                        help="output directory (results.json)")


@dataclass
class _Inputs:
    """What to evaluate: rows, their rewards, a suite to close, and what results.json records."""

    rows: Any
    rewards: Any
    suite: Any = None
    record: dict[str, Any] = field(default_factory=dict)


def _inputs(args: argparse.Namespace) -> _Inputs:
    """The rows and rewards the command line asks for (errors before any model loads)."""
    extra = args.rewards.split(",") if args.rewards else None
    if args.paper_prompts and not args.paper_test_sets:
        raise ValueError(f"--paper-prompts {args.paper_prompts} says how to ask the papers' "
                         "released test sets; add --paper-test-sets DIR (their directory) or "
                         "drop --paper-prompts")
    if args.data:
        if extra is None:
            raise ValueError("--data needs --rewards (reward names or module:function paths)")
        return _Inputs(args.data, extra)
    if args.paper_test_sets:
        return _paper_inputs(args, extra)
    if args.config:
        from mtgrpo.trainer.run import held_out_suite

        suite = held_out_suite(
            _run_config(args), _task_list(args.tasks) if args.tasks else None,
            progress=lambda message: print(f"mtgrpo eval: {message}", file=sys.stderr),
            **{key: value for key, value in (
                ("eval_size", args.eval_size), ("prompt_format", args.prompt_format),
                ("answer_format", args.answer_format), ("seed", args.seed)) if value is not None})
    elif args.tasks:
        from mtgrpo.tasks import TaskSuite

        # train_size=1: only the held-out split is read; the training split is never drawn.
        suite = TaskSuite(_task_list(args.tasks), seed=args.seed or 0, train_size=1,
                          eval_size=args.eval_size or 200,  # ALGORITHMS.md §6: 200 per task
                          prompt_format=args.prompt_format or "plain",
                          answer_format=args.answer_format or "answer_tag")
    else:
        raise ValueError("give --tasks (a suite or task ids), --config (a run file with a tasks "
                         "section) or --data with --rewards")
    routing = {task: list(fns) for task, fns in suite.reward_routing.items()}
    if extra:
        routing["*"] = extra  # "*": the extra rewards score every task (mtgrpo.rewards routing)
    # start(): the problems generate in the background while the model loads.
    return _Inputs(suite.eval.start(), routing, suite)


def _task_list(tasks: str) -> list[str]:
    from mtgrpo.tasks import SUITES

    return list(SUITES.get(tasks)) if tasks in SUITES else [t.strip() for t in tasks.split(",")]


def _run_config(args: argparse.Namespace):
    """The run config of ``--config`` (it must have a ``tasks`` section); its
    ``max_completion_length`` becomes the default of ``--max-new-tokens``."""
    from mtgrpo.compat import load_run_config
    from mtgrpo.recipes import recipe_path

    run = load_run_config(recipe_path(args.config), [])
    if run.tasks is None:
        raise ValueError(f"{args.config} has no tasks section; use --tasks or --data")
    if args.max_new_tokens is None:
        args.max_new_tokens = run.training.rollout.max_completion_length
    return run


def _paper_inputs(args: argparse.Namespace, extra: list[str] | None) -> _Inputs:
    """The papers' released test sets, asked verbatim or in the config's formats."""
    from mtgrpo.tasks import PAPER_TASK_IDS, load_paper_test_sets, resolve_task, reward_routing

    tasks_config = _run_config(args).tasks if args.config else None
    if not args.tasks and tasks_config is None:
        raise ValueError("--paper-test-sets needs the levels to evaluate: --tasks (e.g. "
                         f"countdown:easy; valid: {', '.join(PAPER_TASK_IDS)}) or --config RUN "
                         "(its tasks' levels)")
    record = _paper_record(args, tasks_config)
    tasks = _task_list(args.tasks) if args.tasks else _config_paper_levels(tasks_config)
    per_task = args.eval_size
    if per_task is None and tasks_config is not None:
        per_task = tasks_config.paper_test_per_task
    formats = {key: record[key] for key in ("prompt_format", "answer_format", "think_prefix",
               "system_prompt")} if record["paper_prompts"] == "config" else {}  # fmt: skip
    rows = load_paper_test_sets(args.paper_test_sets, tasks=tasks, per_task=per_task, **formats)
    routing: dict[str, list[Any]] = dict(reward_routing(
        # Each task once, in the rows' order.
        [resolve_task(task) for task in dict.fromkeys(row["task"] for row in rows)],
        scheme=tasks_config.scheme() if tasks_config else None,
        answer_format=record["answer_format"]))
    if extra:
        routing["*"] = extra
    return _Inputs(rows, routing, record=record)


def _paper_record(args: argparse.Namespace, tasks_config: Any) -> dict[str, Any]:
    """How the papers' problems are asked (``--paper-prompts`` and the formats), for
    results.json; the released prompts are the papers' layout with answers in \\boxed{}."""
    from mtgrpo.tasks import ANSWER_FORMATS, PROMPT_FORMATS

    prompts = args.paper_prompts or ("released" if tasks_config is None else "config")
    record = {"paper_test_sets": str(args.paper_test_sets), "paper_prompts": prompts,
              "prompt_format": "paper", "answer_format": "boxed", "think_prefix": False,
              "system_prompt": None}
    if prompts == "released":
        if args.prompt_format or args.answer_format:
            raise ValueError("the released prompts have their own format (the papers' layout, "
                             "answers in \\boxed{}); drop --prompt-format/--answer-format, or "
                             "re-ask the problems in other formats with --config RUN "
                             "--paper-prompts config")
        return record
    if tasks_config is None:
        raise ValueError("--paper-prompts config re-asks the released problems in a run's "
                         "formats: add --config RUN (a run file or recipe), or use "
                         "--paper-prompts released")
    return {**record,
            "prompt_format": PROMPT_FORMATS.canonical(
                args.prompt_format or tasks_config.prompt_format),
            "answer_format": ANSWER_FORMATS.canonical(
                args.answer_format or tasks_config.answer_format),
            "think_prefix": tasks_config.think_prefix,
            "system_prompt": tasks_config.system_prompt}  # fmt: skip


def _config_paper_levels(tasks_config) -> list[str]:
    """The papers' levels a config trains on, when every task of a papers' family is one."""
    from mtgrpo.tasks import PAPER_TASK_IDS, nearest_paper_level, paper_task_of, resolve_task

    specs = [resolve_task(task) for task in tasks_config.task_list]
    families = {task.partition(":")[0] for task in PAPER_TASK_IDS}
    levels = {spec.task_id: paper_task_of(spec) for spec in specs if spec.family.name in families}
    if levels and all(levels.values()):
        return list(dict.fromkeys(levels.values()))
    own = [spec for spec in specs if spec.task_id in levels and levels[spec.task_id] is None]
    why = "; ".join(f"{spec.task_id} is {spec.family.name} at a config of its own, not one of "
                    "the papers' levels" for spec in own) or (
        "none is a task of the papers' families (countdown, zebra_puzzles, arc_1d)")
    nearest = ",".join(dict.fromkeys(str(nearest_paper_level(spec)) for spec in own))
    raise ValueError(
        f"cannot choose the papers' levels for the config's tasks "
        f"({', '.join(spec.task_id for spec in specs)}): {why}; name the levels to evaluate "
        f"with --tasks, e.g. --tasks {nearest or PAPER_TASK_IDS[0]}"
        f"{' (the nearest level of each)' if nearest else ''}; "
        f"valid: {', '.join(PAPER_TASK_IDS)}")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from mtgrpo.algo.metrics import delta_m
    from mtgrpo.evaluation import EvaluationResult, run_evaluation

    try:
        inputs = _inputs(args)
        baseline = EvaluationResult.load(args.baseline) if args.baseline else None
        try:
            result = run_evaluation(args.model, inputs.rows, inputs.rewards,
                                    num_samples=args.num_samples, temperature=args.temperature,
                                    max_new_tokens=args.max_new_tokens or 512,
                                    backend=args.backend)
        finally:
            # Close the suite's generation workers even when evaluation fails.
            if inputs.suite is not None:
                inputs.suite.close()
    except (ValueError, FileNotFoundError) as exc:
        print(f"mtgrpo eval: {exc}", file=sys.stderr)
        return 2
    result.extra.update(inputs.record)
    if inputs.suite is not None and inputs.suite.exclude_eval_rows:
        result.extra["replaced_problems"] = _replaced(inputs.suite, args.config)
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


def _replaced(suite: Any, config: str) -> dict[str, int]:
    """How many held-out problems of each task replaced another (one the run trains on, or,
    rarely, one whose generation failed), printed."""
    from mtgrpo.trainer.run import replaced_items

    counts = replaced_items(suite.eval.rows())
    keyed = {spec.task_id for spec in suite.tasks if spec.family.content_key is not None}
    for task, count in counts.items():
        if task in keyed:
            print(f"{task}: {count} of {suite.sizes['eval']} held-out problems replaced (problems "
                  f"{config} trains on)")
        else:
            print(f"{task}: not checked against the problems {config} trains on (its family "
                  "has no content key to match them by)")
    return counts


def _share(answer: str | None, share: float) -> str:
    """``'1' 99.0%`` (an answer and its share; the answer cut to 12 characters), or ``—``."""
    if answer is None:
        return "—"
    shown = answer if len(answer) <= 12 else answer[:11] + "…"
    return f"{shown!r} {100 * share:.1f}%"


def _print(result) -> None:
    from rich.console import Console

    from mtgrpo.evaluation import answer_warnings
    from mtgrpo.reporting.tables import FittedTable

    headers = ["task", "prompts", "accuracy", "mean reward", "format rate", "length",
               "top answer", "constant answer"]
    rows = []
    for name, r in result.tasks.items():
        marker = " (worst)" if name == result.worst_task else ""
        rows.append([name + marker, str(r.prompts), f"{100 * r.accuracy:.1f}%",
                     f"{r.mean_reward:.3f}", f"{100 * r.format_rate:.1f}%",
                     f"{r.mean_length:.1f}", _share(r.top_answer, r.top_answer_share),
                     _share(r.baseline_answer, r.constant_baseline)])
    # task names stay whole (countdown:2x20 and countdown:3x9 must not both read countd…)
    table = FittedTable(headers, rows, title="per-task evaluation", kept_in="results.json",
                        # Dropped first on a narrow terminal; results.json keeps them all.
                        drop_order=("length", "format rate", "mean reward", "prompts",
                                    "constant answer", "top answer"))
    console = Console()
    console.print(table)
    for _, _, message in answer_warnings(result):
        console.print(f"warning: {message}", markup=False, highlight=False)
    line = (f"worst-task accuracy {100 * result.worst_accuracy:.1f}% ({result.worst_task}), "
            f"average {100 * result.average_accuracy:.1f}%")
    if "delta_m" in result.extra:
        value = result.extra["delta_m"]
        line += ", Δm% vs baseline " + ("— (no task to compare)" if value is None
                                         else f"{value:+.1f}")
    console.print(line)
