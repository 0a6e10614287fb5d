"""The final checkpoints of a comparison grid, scored again on a larger held-out split.

    python benchmarks/final_checkpoints.py --grid GRID --config smollm2-cpu \
        --tasks countdown:3x20,chain_sum:2x2d,addition:2d --eval-size 800 --jobs 2 --threads 1
    python benchmarks/final_checkpoints.py --grid GRID --config smollm2-cpu \
        --paper-test-sets DIR --tasks countdown:easy --num-samples 2 --jobs 2

A grid of ``benchmarks/mtgrpo_vs_baselines.py`` evaluates its runs every ``eval_steps`` on the
config's own held-out split, which is small on a CPU (smollm2-cpu: 100 prompts × 2 samples
per task, a standard error of 2.7 points at 18 %), so methods whose seeds land a few points
apart cannot be told apart by it. This script scores the final checkpoint of every finished
run (``GRID/<method>-seed<k>/checkpoint-<max_steps>/model``, ``max_steps`` the run's own, from
its ``config.yaml``, so a grid trained with ``--max-steps`` or ``--set`` is found; the base
config's for a run without one) and the grid's shared warm start
(``GRID/warm_start/sft/model``, when there is one) on ``--eval-size`` held-out prompts of each
task in ``--tasks``, with ``--num-samples`` samples each at the config's evaluation
temperature, by running

    mtgrpo eval --model CHECKPOINT --config CONFIG --tasks TASK --eval-size N --num-samples S

whose held-out split holds none of the problems the runs trained on (their training split and
the warm start's; ``mtgrpo.trainer.run.held_out_suite``). ``--config`` is the grid's base config
(the runs' own tasks section). A finished evaluation (``OUT/<task>/<label>/results.json``) is
kept, so the script resumes where it stopped.

Then, per task: every run's accuracy and its binomial standard error, each method's mean over
seeds, the gain over the warm start with the standard error of that gain (the evaluation noise
of the seed mean and of the warm start's score) and whether it exceeds twice it; and, on the
worst of these tasks per run, one-sided Welch and exact permutation tests of each MT-GRPO
method above GRPO and above DAPO (the tests of ``mtgrpo_vs_baselines.py``); with two or more
tasks, each run's average over them and each method's gap to the best method's mean. Writes
``OUT/results.md`` and ``OUT/results.json`` (default ``OUT``: ``GRID/final_checkpoints``).

With ``--paper-test-sets DIR`` the same is done on the MT-GRPO paper's released test problems
(``mtgrpo eval --paper-test-sets DIR``) at the levels ``--tasks`` names, asked in the config's
formats: problems of another distribution than the training's (Countdown's numbers up to 100,
where the recipes train on 20), the first ``--eval-size`` of each level's 200 (default all);
default ``OUT``: ``GRID/paper_test``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from mtgrpo.reporting.compare import Spread, markdown_table

LABEL = re.compile(r"^(?P<method>.+)-seed(?P<seed>\d+)$")
WARM_START = "warm_start"
BASELINES = ("grpo", "dapo")
DEFAULT_EVAL_SIZE = 800
PAPER_LEVEL_SIZE = 200  # problems per level in the papers' released test sets


def _grid_module() -> ModuleType:
    """``mtgrpo_vs_baselines.py`` beside this file (its noise tests)."""
    path = Path(__file__).with_name("mtgrpo_vs_baselines.py")
    if path.stem in sys.modules:
        return sys.modules[path.stem]
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Checkpoint:
    label: str  # "<method>-seed<k>" or "warm_start"
    method: str
    seed: int | None
    model: Path
    step: int | None = None  # the run's final step (None: the warm start)


def final_step(run: Path, default: int) -> int:
    """The step a run ends at: ``max_steps`` of the config the trainer saved in the run
    (``RUN/config.yaml``, where the grid's ``--max-steps`` and ``--set`` land), else
    ``default`` (the base config's)."""
    saved = run / "config.yaml"
    if not saved.is_file():
        return default
    value = (yaml.safe_load(saved.read_text()) or {}).get("max_steps")
    if value is None or value == -1:  # not saved, or -1: the run counted epochs, not steps
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{saved}: max_steps is {value!r}, not a positive integer (or -1); "
                         "the run's saved config is damaged (rerun the run, or move it out of "
                         "the grid)")
    return value


def find_checkpoints(grid: Path, max_steps: int) -> list[Checkpoint]:
    """The grid's finished runs (a ``checkpoint-<final step>/model``, the final step each run's
    own: :func:`final_step`, ``max_steps`` the base config's), sorted by method and seed, and
    its warm start's model when there is one (first)."""
    found = []
    warm = grid / WARM_START / "sft" / "model"
    if warm.is_dir():
        found.append(Checkpoint(WARM_START, WARM_START, None, warm))
    runs = []
    for run in sorted(grid.iterdir()):
        match = LABEL.match(run.name)
        if not match or not run.is_dir():
            continue
        step = final_step(run, max_steps)
        model = run / f"checkpoint-{step}" / "model"
        if model.is_dir():
            runs.append(Checkpoint(run.name, match["method"], int(match["seed"]), model, step))
    if not runs:
        raise ValueError(f"no finished run in {grid}: expected <method>-seed<k>/checkpoint-"
                         f"<max_steps>/model (max_steps from each run's config.yaml, else "
                         f"{max_steps} of the config); finish the grid's runs first, or pass "
                         "the grid's own --config")
    return found + sorted(runs, key=lambda c: (c.method, c.seed))


def _paper_level_sizes(args: argparse.Namespace) -> dict[str, int]:
    """Problems per level of the papers' test sets (the first ``--eval-size``); an unknown
    level or a directory without the sets fails here, before any evaluation."""
    from mtgrpo.tasks import load_paper_test_sets

    sizes = {}
    for task in args.tasks:
        # raises, naming the levels the files hold, for one they do not
        sizes[task] = len(load_paper_test_sets(args.paper_test_sets, tasks=[task],
                                               per_task=args.eval_size))
    return sizes


def _task_dir(task: str) -> str:
    return task.replace(":", "_")


def evaluate(checkpoint: Checkpoint, task: str, args: argparse.Namespace) -> Path:
    """``OUT/<task>/<label>/results.json`` of one checkpoint on one task (run if missing)."""
    out = args.out / _task_dir(task) / checkpoint.label
    results = out / "results.json"
    if results.is_file():
        return results
    command = [sys.executable, "-c", "import sys; from mtgrpo.cli import main; "
               "sys.exit(main(sys.argv[1:]))", "eval", "--model", str(checkpoint.model),
               "--config", args.config, "--tasks", task, "--eval-size", str(args.eval_size),
               "--num-samples", str(args.num_samples), "--out", str(out)]  # fmt: skip
    if args.paper_test_sets:
        command += ["--paper-test-sets", str(args.paper_test_sets)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "eval.log", "w") as log:
        code = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0 or not results.is_file():
        raise RuntimeError(f"mtgrpo eval of {checkpoint.label} on {task} failed (exit {code}); "
                           f"its output is in {out / 'eval.log'}")
    return results


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}"


def _per_method(per_run: dict[str, float], runs: Sequence[Checkpoint],
                methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per method: its runs' values (in seed order) and their mean."""
    by_method = {m: [per_run[c.label] for c in runs if c.method == m] for m in methods}
    return {m: {"values": v, "mean": sum(v) / len(v)} for m, v in by_method.items()}


def _seed_means(per_method: dict[str, dict[str, Any]]) -> str:
    """``method mean (value, value, ...)`` per method, comma-joined, in %."""
    return ", ".join(f"{method} {_pct(m['mean'])} ({', '.join(_pct(v) for v in m['values'])})"
                     for method, m in per_method.items())


def _standard_error(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


def summarize(scores: dict[str, dict[str, dict[str, Any]]], checkpoints: Sequence[Checkpoint],
              tasks: Sequence[str]) -> dict[str, Any]:
    """Per task and method: accuracies, means, gains over the warm start with their standard
    errors; per MT-GRPO method and baseline: the noise tests on the worst of ``tasks``.

    ``scores[task][label]`` is ``{"accuracy": fraction, "samples": scored completions}``, with
    ``top_answer`` / ``top_answer_share`` / ``baseline_answer`` / ``constant_baseline`` where
    the evaluation recorded them (``mtgrpo eval`` since 2026-11-29): ``summary["tasks"][task]
    ["answers"]`` then holds each checkpoint's commonest answer and its share of the
    completions, and ``["constant"]`` the commonest gold answer and the accuracy of always
    giving it (a task whose runs all give one answer is learned as a constant).
    """
    grid = _grid_module()
    runs = [c for c in checkpoints if c.seed is not None]
    methods = list(dict.fromkeys(c.method for c in runs))
    summary: dict[str, Any] = {"tasks": {}, "worst": {}, "tests": [],
                               "final_steps": {c.label: c.step for c in runs}}
    for task in tasks:
        per_method = {}
        warm = scores[task].get(WARM_START)
        for method in methods:
            mine = [(c.seed, scores[task][c.label]) for c in runs if c.method == method]
            accuracy = [s["accuracy"] for _, s in mine]
            spread = Spread.of(accuracy)
            mean = spread.mean
            noise = math.sqrt(sum(_standard_error(s["accuracy"], s["samples"]) ** 2
                                  for _, s in mine)) / len(mine)  # fmt: skip
            entry = {"seeds": [seed for seed, _ in mine], "accuracy": accuracy, "mean": mean,
                     "sd": spread.std or 0.0, "mean_standard_error": noise}
            if warm is not None:
                gain_error = math.hypot(noise, _standard_error(warm["accuracy"], warm["samples"]))
                entry |= {"gain": mean - warm["accuracy"], "gain_standard_error": gain_error,
                          "gain_above_2se": mean - warm["accuracy"] > 2 * gain_error}
            per_method[method] = entry
        summary["tasks"][task] = {"warm_start": warm, "methods": per_method,
                                  "samples": {label: s["samples"]
                                              for label, s in scores[task].items()}}
        answers = {label: [s["top_answer"], s["top_answer_share"]]
                   for label, s in scores[task].items() if s.get("top_answer") is not None}
        constant = next(([s["baseline_answer"], s["constant_baseline"]]
                         for s in scores[task].values() if s.get("baseline_answer") is not None),
                        None)
        if answers:
            summary["tasks"][task] |= {"answers": answers, "constant": constant}
    worst = {c.label: min(scores[task][c.label]["accuracy"] for task in tasks) for c in runs}
    summary["worst"] = _per_method(worst, runs, methods)
    average = {c.label: sum(scores[task][c.label]["accuracy"] for task in tasks) / len(tasks)
               for c in runs}
    summary["average"] = _per_method(average, runs, methods)
    if all(WARM_START in scores[task] for task in tasks):
        summary["average_warm_start"] = sum(scores[task][WARM_START]["accuracy"]
                                            for task in tasks) / len(tasks)
    for method in (m for m in methods if m.startswith("mtgrpo")):
        for other in (b for b in BASELINES if b in summary["worst"]):
            mine, theirs = summary["worst"][method]["values"], summary["worst"][other]["values"]
            if len(mine) < 2 or len(theirs) < 2:
                continue
            summary["tests"].append({
                "method": method, "other": other, "mean": sum(mine) / len(mine),
                "other_mean": sum(theirs) / len(theirs),
                "welch_p": grid.welch_p_value(mine, theirs),
                "permutation_p": grid.permutation_p_value(mine, theirs)})
    return summary


def _ratio(gain: float, error: float) -> str:
    """``gain / error`` to one decimal; "—" where both are 0 (every score 0 or 1)."""
    if error > 0:
        return f"{gain / error:+.1f}"
    return "—" if gain == 0 else ("+inf" if gain > 0 else "-inf")


def _answers_line(entry: dict[str, Any]) -> str:
    """The commonest answer per checkpoint (its share of the completions, a method's range
    over its seeds) and what always giving the commonest gold answer scores."""
    answers = entry["answers"]
    parts = []
    if WARM_START in answers:
        answer, share = answers[WARM_START]
        parts.append(f"warm start {answer!r} {100 * share:.1f} %")
    for method, m in entry["methods"].items():
        given = [answers[f"{method}-seed{seed}"] for seed in m["seeds"]
                 if f"{method}-seed{seed}" in answers]
        if not given:
            continue
        shares = [share for _, share in given]
        which = "/".join(dict.fromkeys(repr(answer) for answer, _ in given))
        span = (f"{100 * min(shares):.1f}" if min(shares) == max(shares) else
                f"{100 * min(shares):.1f}-{100 * max(shares):.1f}")
        parts.append(f"{method} {which} {span} %")
    line = "Commonest answer given, share of the completions: " + "; ".join(parts) + "."
    if entry.get("constant") is not None:
        answer, accuracy = entry["constant"]
        line += (f" Always answering {answer!r}, the commonest gold answer, scores "
                 f"{100 * accuracy:.1f} %.")
    return line


def render(summary: dict[str, Any], args: argparse.Namespace) -> str:
    """Markdown of :func:`summarize`."""
    paper = getattr(args, "paper_test_sets", None)
    lines = [("# Final checkpoints on the papers' test sets" if paper else
              "# Final checkpoints on a larger held-out split"), "",
             f"Command: `python benchmarks/final_checkpoints.py --grid {args.grid} --config "
             f"{args.config} --tasks {','.join(args.tasks)} --eval-size {args.eval_size} "
             f"--num-samples {args.num_samples}"
             + (f" --paper-test-sets {args.paper_test_sets}`" if paper else "`"), "",
             (f"Each checkpoint: the MT-GRPO paper's released test problems, the first "
              f"{args.eval_size} of each level × {args.num_samples} sample(s), asked in the "
              "config's prompt and answer formats." if paper else
              f"Each checkpoint: {args.eval_size} held-out prompts per task × "
              f"{args.num_samples} sample(s), none of them a problem the runs trained on "
              "(training split or warm start; checked for families with a content key, such "
              "as countdown and the reasoning-gym datasets).")
             + " Accuracies in %; SE: binomial standard error of the evaluation (of the "
             "prompts × samples scored, so it understates the noise when a prompt has several "
             "samples).", ""]
    steps = summary["final_steps"]
    if len(set(steps.values())) == 1:
        lines += [f"Every run's checkpoint is its final one, step {next(iter(steps.values()))}.",
                  ""]
    else:  # a grid trained with --max-steps or --set for some runs: say which is which
        lines += ["**The runs end at different steps**: " + ", ".join(
            f"{label} {step}" for label, step in steps.items()) + ".", ""]
    for task, entry in summary["tasks"].items():
        warm = entry["warm_start"]
        lines += [f"## {task}", ""]
        if warm is not None:
            lines += [f"Warm start: {_pct(warm['accuracy'])} % "
                      f"(SE {_pct(_standard_error(warm['accuracy'], warm['samples']))}).", ""]
        rows = []
        for method, m in entry["methods"].items():
            seeds = ", ".join(f"{_pct(a)} (s{s})" for s, a in zip(m["seeds"], m["accuracy"],
                                                                    strict=True))
            gain = (["—", "—", "—"] if "gain" not in m else
                    [f"{100 * m['gain']:+.1f} ± {_pct(m['gain_standard_error'])}",
                     _ratio(m["gain"], m["gain_standard_error"]),
                     "yes" if m["gain_above_2se"] else "no"])
            rows.append([method, seeds, f"{_pct(m['mean'])} ± {_pct(m['sd'])}",
                         _pct(m["mean_standard_error"]), *gain])
        lines += [markdown_table(["method", "per seed", "mean ± sd", "SE of the mean (eval)",
                                  "gain over the warm start", "gain / SE", "> 2 SE"], rows), ""]
        if entry.get("answers"):
            lines += [_answers_line(entry), ""]
    lines += ["## Worst task", "", "Per run, the lowest accuracy of the tasks above; means over "
              f"seeds: {_seed_means(summary['worst'])}.", ""]
    for t in summary["tests"]:
        lines.append(f"- {t['method']} above {t['other']}: {_pct(t['mean'])} against "
                     f"{_pct(t['other_mean'])}; one-sided Welch p = {t['welch_p']:.3f}, exact "
                     f"permutation p = {t['permutation_p']:.3f}")
    if len(summary["tasks"]) > 1:
        lines += ["", *_average_lines(summary)]
    return "\n".join(lines) + "\n"


def _average_lines(summary: dict[str, Any]) -> list[str]:
    """The average over the tasks: each method's mean over seeds and its gap to the best."""
    average = summary["average"]
    best = max(average, key=lambda m: average[m]["mean"])
    warm = summary.get("average_warm_start")
    lines = ["## Average", "", "Per run, the mean accuracy of the tasks above; means over seeds: "
             + _seed_means(average) + (f"; warm start {_pct(warm)}." if warm is not None else "."),
             ""]
    lines += [f"- {method}: {100 * (a['mean'] - average[best]['mean']):+.1f} points against "
              f"the best method ({best})" for method, a in average.items() if method != best]
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", type=Path, required=True,
                        help="the grid directory of mtgrpo_vs_baselines.py (its --out)")
    parser.add_argument("--config", required=True,
                        help="the grid's base config (recipe name or run file)")
    parser.add_argument("--tasks", required=True, help="comma-separated task ids of the config")
    parser.add_argument("--eval-size", type=int, default=None, help="held-out prompts per task "
                        "(default 800; with --paper-test-sets: the first N of each level's "
                        "200, default all)")
    parser.add_argument("--paper-test-sets", type=Path, default=None, metavar="DIR",
                        help="score on the papers' released test sets in DIR instead, at the "
                        "levels --tasks names (e.g. countdown:easy), asked in the config's "
                        "formats (default --out: GRID/paper_test)")
    parser.add_argument("--num-samples", type=int, default=1, help="samples per prompt")
    parser.add_argument("--jobs", type=int, default=1, help="evaluations at a time")
    parser.add_argument("--threads", type=int, default=1, help="OMP threads per evaluation")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: GRID/final_checkpoints)")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from mtgrpo.config import load_run_config
    from mtgrpo.recipes import recipe_path
    from mtgrpo.trainer.run import held_out_suite

    args = build_parser().parse_args(argv)
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    args.out = args.out or args.grid / ("paper_test" if args.paper_test_sets
                                        else "final_checkpoints")
    if args.eval_size is None:
        args.eval_size = PAPER_LEVEL_SIZE if args.paper_test_sets else DEFAULT_EVAL_SIZE
    for name in ("eval_size", "num_samples", "jobs", "threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got "
                             f"{getattr(args, name)}")
    run = load_run_config(recipe_path(args.config), [])
    # unknown tasks fail here, before any evaluation
    if args.paper_test_sets:
        prompts = _paper_level_sizes(args)
    else:
        held_out_suite(run, args.tasks).close()
        prompts = dict.fromkeys(args.tasks, args.eval_size)
    checkpoints = find_checkpoints(args.grid, run.training.schedule.max_steps)
    jobs = [(c, task) for task in args.tasks for c in checkpoints]
    with ThreadPoolExecutor(args.jobs) as pool:
        paths = list(pool.map(lambda job: evaluate(job[0], job[1], args), jobs))
    scores: dict[str, dict[str, dict[str, Any]]] = {task: {} for task in args.tasks}
    replaced: dict[str, dict[str, int]] = {task: {} for task in args.tasks}
    for (checkpoint, task), path in zip(jobs, paths, strict=True):
        result = json.loads(path.read_text())
        own = result["tasks"].get(task) or next(iter(result["tasks"].values()))  # an alias
        if (own["prompts"], own["samples"]) != (prompts[task], args.num_samples):
            raise ValueError(f"{path} scored {own['prompts']} prompts × {own['samples']} "
                             f"samples, not {prompts[task]} × {args.num_samples}: give the "
                             "same --eval-size and --num-samples, or another --out")
        scores[task][checkpoint.label] = {"accuracy": own["accuracy"],
                                          "samples": own["prompts"] * own["samples"]} | {
            key: own[key] for key in ("top_answer", "top_answer_share", "baseline_answer",
                                      "constant_baseline") if key in own}
        replaced[task][checkpoint.label] = result.get("replaced_problems", {}).get(task, 0)
    summary = summarize(scores, checkpoints, args.tasks) | {"replaced_problems": replaced}
    (args.out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    text = render(summary, args)
    (args.out / "results.md").write_text(text)
    print(text)
    return summary


if __name__ == "__main__":
    main()
