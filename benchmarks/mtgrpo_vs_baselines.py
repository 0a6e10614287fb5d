"""Does MT-GRPO lift the worst task? MT-GRPO against GRPO, DAPO and SEC over seeds.

Every method trains the same model on the same tasks for the same number of training steps,
from the same supervised warm start, once per seed; the runs are then compared on the eval
split the way the MT-GRPO paper's Table 1 does (ALGORITHMS.md §6, §8): final worst-task and
average accuracy, Δm% against DAPO, steps to fixed worst-task thresholds, time per step and
prompts generated per informative group, each as mean ± spread over the seeds.

    python benchmarks/mtgrpo_vs_baselines.py                          # quickstart, 3 seeds
    python benchmarks/mtgrpo_vs_baselines.py --dry-run                # the runs and overrides
    python benchmarks/mtgrpo_vs_baselines.py --methods grpo,dapo,mtgrpo --seeds 1,2
    python benchmarks/mtgrpo_vs_baselines.py --config smollm2-mtgrpo3-easy --threads 8
    python benchmarks/mtgrpo_vs_baselines.py --config smollm2-cpu --jobs 2   # 2 runs at a time

Methods (:func:`method_table`; each is a set of overrides on the base run config):

======================  ============  =================  ========  ==========================
name                    weighting     batch              ε_high    paper
======================  ============  =================  ========  ==========================
``grpo``                uniform       iid                = ε       GRPO baseline
``dapo``                uniform       dynamic            0.28      DAPO baseline
``sec_grpo``            sec           iid                = ε       SEC curriculum on GRPO
``sec_dapo``            sec           dynamic            0.28      SEC-DAPO baseline
``mtgrpo_l<λ>``         mt_grpo       ratio_preserving   0.28      MT-GRPO, one per ``--lambdas``
``rp_uniform``          uniform       ratio_preserving   0.28      ablation: RP-sampler alone
``mtgrpo_no_rp``        mt_grpo (λ1)  dynamic            0.28      ablation: IWU without RP
``mtgrpo_val``          mt_grpo (λ1)  ratio_preserving   0.28      ours: IWU on held-out accuracy
======================  ============  =================  ========  ==========================

``mtgrpo_val`` (not in the paper; run only when named in ``--methods``) is MT-GRPO at the first
λ with ``task_weighting_signal: validation``: its weights read ``J_k`` and ``I_k`` from an
evaluation of the task suite's validation split every ``validation_steps`` steps instead of
the training batch (``mtgrpo.algo.weighting.ValidationSignal``). The split belongs to the base
config (``--set tasks.validation_size=N``), so that every method trains on, and the shared
warm start learns from, the same problems, none of them a validation problem::

    python benchmarks/mtgrpo_vs_baselines.py --methods grpo,dapo,mtgrpo,mtgrpo_val \
        --set tasks.validation_size=50

Parameters a method does not fix are inherited from the base config so that the methods
differ only where the table says: a method whose weighting is the base config's keeps the
base ``task_weighting_params`` (λ replaced); MT-GRPO on a base with another weighting uses the
released code's Exp-1 settings (:data:`MTGRPO_DEFAULT_PARAMS`, with ``I_k`` summed over the
samples and clipped); SEC on such a base uses the strategy's defaults (α 0.5, τ 0.2, the SEC
paper's multi-task setting). Every sampler takes the base ``batch_construction_params`` it
accepts (so DAPO and MT-GRPO share ``M_os`` and ``N_rs``). Loss, learning rate, batch sizes,
filter and evaluation are the base config's.

Defaults chosen for the quickstart (measured on it: the shared warm start, then 40 MT-GRPO
steps at its own λ 0.5, seed 1; ``--methods mtgrpo --lambdas 0.5 --max-steps 40 --set
eval_steps=10``):

- λ 0.5 and 4.0 (:data:`DEFAULT_LAMBDAS`). λ weighs the reward term ``λ J_k`` against the
  improvement ``I_k`` in the signal ``s_k``, and the task with the lowest signal gains weight.
  The quickstart's MT-GRPO is the paper text's (plain steps, ``I_k`` not clipped, ``J_k`` the
  batch accuracy) at learning rate 1e-3, where ``|I_k|`` is large: median 0.15 to 0.68 per
  task (90th percentile up to 1.6), against an accuracy gap of about 0.2 between the tasks.
  Re-scoring the logged ``I_k`` and ``J_k`` of those 37 steps, the least accurate task had the
  lowest signal on 21 of them at λ 0.5 (20 at the paper's 0.25), 24 at 2, 29 at 4 and 31 at 8.
  So 0.5, the recipe's own value, is the improvement-led end (the paper's 0.2 / 0.25 behave the
  same here: they were tuned for clipped ``I_k`` with Adam at learning rate 1e-6), and 4.0 the
  reward-led, worst-task-robust end, the role of the paper's large λ (0.9, 1.2) in its
  nine-task runs.
- Thresholds 5 / 10 / 20 % (:data:`DEFAULT_THRESHOLDS`): after the warm start the worst task
  (reverse_words) is at 0 to 1 % and the other two at 30 and 56 %, so the paper's 30 / 40 / 50 %
  would read "never" for every method. Pass ``--thresholds 0.3,0.4,0.5`` for a model that
  starts where the paper's did.

Grid mechanics:

- The supervised warm start of the base config (its ``sft:`` section; with ``model.tiny`` the
  tiny model is first built into ``<out>/warm_start/base-model``) runs once, into
  ``<out>/warm_start/`` (``mtgrpo.trainer.run``'s cached warm start: a finished one with the
  same settings is reused, wherever it lives: copy another grid's ``warm_start/`` into a new
  ``--out`` to start new runs from the same checkpoint, e.g. another ``--set``; a tiny base
  model built under the old ``<out>`` moves with it, so a tiny grid's start is reused too).
  Every run then loads ``<out>/warm_start/sft/model`` with the ``sft`` section removed, so
  all methods and seeds start from one checkpoint. The runs' processes ask for the warm
  start again and take turns on its lock file (``<cache root>/warm-start/<key>.lock``): a warm start
  whose settings changed under a running grid is trained once, not once per process.
- Run ``<method>-seed<k>`` writes to ``<out>/<method>-seed<k>/`` with ``seed: k``. A run whose
  ``checkpoint-<max_steps>`` exists, or whose ``metrics.jsonl`` holds the final step, is
  skipped; a run with an earlier checkpoint resumes from it (``resume_from_checkpoint``); a
  run directory without a checkpoint starts again (the trainer sets the old logs aside). A run
  directory written with a different config is refused before any training: mixing settings
  in one table would compare different experiments.
- A run that raises is recorded and the grid goes on; the exit status is then 1.
- ``--jobs N`` trains N runs at a time, each in a process of its own (this script with
  ``--only <label>``, its output in ``<out>/logs/<label>.log``), with ``--threads`` torch
  threads each; the warm start, which runs alone first, uses ``threads × jobs``. Runs start
  seed by seed (every method's seed 1, then seed 2, ...), with one job as with several, so that
  an interrupted grid has whole seeds to compare. On a GPU every process uses the same device
  (set ``CUDA_VISIBLE_DEVICES`` per grid to spread grids over devices).

Output in ``<out>``: ``results.md`` (command, settings, the method table, the paper-style
table, per-task accuracy, the verdict, figures, per-seed tables), ``results.json`` (the same
numbers) and ``figures/*.png`` (:func:`mtgrpo.reporting.plot_comparison`).

Decisions where the paper is silent:

1. Δm% pairs seeds: run ``<method>-seed<k>`` is measured against ``dapo-seed<k>`` (so DAPO's
   own Δm% is 0 for every seed); the table gives the spread of those per-seed values.
2. "Steps to a threshold" of a method, in the verdict, is the eval step by which a majority
   of its seeds had reached it, a seed that never did counting as never: a mean over the
   seeds that reached it (the table's cell) would reward a method that rarely gets there.
3. "Matches DAPO" means a mean final worst-task accuracy at most :data:`TOLERANCE` (two
   points) below DAPO's, the same margin the verdict allows the average accuracy.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import logging
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mtgrpo.algo.sampling import SAMPLERS
from mtgrpo.algo.weighting import WEIGHTINGS
from mtgrpo.config import FlatOptions, load_run_config, run_config_from_dict
from mtgrpo.recipes import recipe_path
from mtgrpo.reporting.compare import (
    ComparisonTable,
    RunHistory,
    RunSummary,
    SeedAggregateTable,
    Spread,
    aggregate_seeds,
    compare_runs,
    load_run,
    markdown_table,
    parse_thresholds,
)
from mtgrpo.reporting.metrics import read_metrics

logger = logging.getLogger("mtgrpo_vs_baselines")

DEFAULT_OUT = Path("benchmarks/results/mtgrpo_vs_baselines")
DEFAULT_CONFIG = "quickstart"
DEFAULT_SEEDS = (1, 2, 3)
DEFAULT_LAMBDAS = (0.5, 4.0)
DEFAULT_THRESHOLDS = (0.05, 0.1, 0.2)
TOLERANCE = 0.02  # accuracy points (as a fraction) that count as "matching" / "within"
_ROUNDING = 1e-9  # so that a gap of exactly TOLERANCE counts as within it
CLIP_HIGHER = 0.28  # DAPO's ε_high, used by every method with dynamic or RP sampling
# The released MT-GRPO code's Exp-1 settings (ALGORITHMS.md §4, §8), for a base config whose
# own weighting is not mt_grpo: Adam on the logits (lr 0.025), weight decay η 1e-5, I_k
# clipped to ±0.1, J_k an EMA (decay 0.5) of the batch accuracy.
MTGRPO_DEFAULT_PARAMS: Mapping[str, Any] = {
    "optimizer": "adam", "step_size": 0.025, "damping": 1e-5, "improvement_clip": 0.1,
    "reward_ema": 0.5,
}
MTGRPO_DEFAULT_REDUCTION = "sum"  # the released code sums I_k over samples (clipped above)
WARM_START_DIR = "warm_start"
FIGURES_DIR = "figures"
LOGS_DIR = "logs"  # <out>/logs/<label>.log: the output of each --jobs process
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"
# Keys of a run's config that may differ between an interrupted run and its continuation.
_RESUME_KEYS = ("resume_from_checkpoint",)


# ----------------------------------------------------------------------------- methods


@dataclass(frozen=True)
class Method:
    """One row of the comparison: a task weighting, a batch construction and a clip range."""

    name: str
    task_weighting: str
    batch_construction: str
    epsilon_high: float | None  # None: symmetric clipping, ε_high = ε (GRPO)
    description: str
    weighting_params: Mapping[str, Any] = field(default_factory=dict)  # set on top of inherited
    task_weighting_signal: str = "train"  # "validation": the weights read held-out accuracy
    opt_in: bool = False  # run only when named in --methods (not in the default grid)

    @property
    def reads_validation(self) -> bool:
        """Whether the weights read the validation split (the base config must have one)."""
        return self.task_weighting_signal == "validation"

    @property
    def is_mtgrpo(self) -> bool:
        """MT-GRPO proper: IWU weights with the ratio-preserving sampler."""
        return (WEIGHTINGS.canonical(self.task_weighting) == "mt_grpo"
                and SAMPLERS.canonical(self.batch_construction) == "ratio_preserving")


def mtgrpo_name(lam: float) -> str:
    """``mtgrpo_l<λ>``, e.g. ``mtgrpo_l0.25``."""
    return f"mtgrpo_l{lam:g}"


def method_table(lambdas: Sequence[float] = DEFAULT_LAMBDAS) -> dict[str, Method]:
    """Every method of the grid by name, in table order (baselines, MT-GRPO, ablations)."""
    lambdas = _check_lambdas(lambdas)
    methods = [
        Method("grpo", "uniform", "iid", None, "GRPO: uniform mixing, symmetric clip"),
        Method("dapo", "uniform", "dynamic", CLIP_HIGHER,
               "DAPO: dynamic sampling, clip-higher"),
        Method("sec_grpo", "sec", "iid", None, "SEC curriculum, GRPO batches"),
        Method("sec_dapo", "sec", "dynamic", CLIP_HIGHER, "SEC curriculum, DAPO batches"),
        *(Method(mtgrpo_name(lam), "mt_grpo", "ratio_preserving", CLIP_HIGHER,
                 f"MT-GRPO: IWU weights (λ {lam:g}) + RP-sampler", {"lam": lam})
          for lam in lambdas),
        Method("rp_uniform", "uniform", "ratio_preserving", CLIP_HIGHER,
               "ablation: RP-sampler with uniform weights"),
        Method("mtgrpo_no_rp", "mt_grpo", "dynamic", CLIP_HIGHER,
               f"ablation: IWU weights (λ {lambdas[0]:g}) with dynamic sampling, no RP",
               {"lam": lambdas[0]}),
        Method("mtgrpo_val", "mt_grpo", "ratio_preserving", CLIP_HIGHER,
               f"ours: IWU weights (λ {lambdas[0]:g}) read from held-out validation accuracy "
               "+ RP-sampler", {"lam": lambdas[0]}, task_weighting_signal="validation",
               opt_in=True),
    ]
    return {method.name: method for method in methods}


def _check_lambdas(lambdas: Sequence[float]) -> tuple[float, ...]:
    values = tuple(float(lam) for lam in lambdas)
    if not values or any(not math.isfinite(lam) or lam < 0 for lam in values):
        raise ValueError(f"--lambdas must be one or more finite λ >= 0, got {list(lambdas)}; "
                         "e.g. --lambdas 0.5,4")
    if len(set(values)) != len(values):
        raise ValueError(f"--lambdas repeats a value: {list(values)}; give distinct values")
    return values


def select_methods(table: Mapping[str, Method], names: Sequence[str] | None) -> list[Method]:
    """The methods named (when ``names`` is None: all but the opt-in ones); ``mtgrpo`` stands
    for every λ of the paper's MT-GRPO."""
    if names is None:
        return [m for m in table.values() if not m.opt_in]
    chosen: dict[str, Method] = {}
    for name in names:
        matches = ([m for m in table.values() if m.is_mtgrpo and not m.opt_in]
                   if name == "mtgrpo"
                   else [table[name]] if name in table else [])
        if not matches:
            raise ValueError(f"unknown method {name!r}; valid methods: {', '.join(table)} "
                             "(or mtgrpo for every λ)")
        chosen.update((m.name, m) for m in matches)
    return [m for m in table.values() if m.name in chosen]  # table order


def _sampler_options(name: str) -> set[str]:
    """Keyword options a sampler's constructor accepts (its class and bases)."""
    options: set[str] = set()
    for klass in SAMPLERS.get(name).__mro__:
        if klass is object:
            break
        for param in inspect.signature(klass.__init__).parameters.values():
            if param.kind is inspect.Parameter.KEYWORD_ONLY:
                options.add(param.name)
    return options - {"seed", "zero_gradient_filter"}


def method_overrides(method: Method, base: Mapping[str, Any]) -> dict[str, Any]:
    """The training options ``method`` sets on top of the base config mapping ``base``.

    Weighting parameters come from the base when its weighting is the method's (else the
    strategy's defaults, or :data:`MTGRPO_DEFAULT_PARAMS` for MT-GRPO), then the method's own
    (λ); sampler parameters are the base's that the method's sampler accepts.
    """
    weighting = WEIGHTINGS.canonical(method.task_weighting)
    inherited = WEIGHTINGS.canonical(str(base.get("task_weighting", "uniform"))) == weighting
    released_code = weighting == "mt_grpo" and not inherited
    if inherited:
        weighting_params = dict(base.get("task_weighting_params") or {})
    else:
        weighting_params = dict(MTGRPO_DEFAULT_PARAMS) if released_code else {}
    weighting_params.update(method.weighting_params)
    accepted = _sampler_options(method.batch_construction)
    sampler_params = {key: value for key, value in
                      (base.get("batch_construction_params") or {}).items() if key in accepted}
    overrides = {
        "task_weighting": weighting,
        "task_weighting_params": weighting_params,
        "batch_construction": SAMPLERS.canonical(method.batch_construction),
        "batch_construction_params": sampler_params,
        "epsilon_high": method.epsilon_high,
    }
    if released_code:
        overrides["improvement_reduction"] = MTGRPO_DEFAULT_REDUCTION
    if method.reads_validation:
        overrides["task_weighting_signal"] = method.task_weighting_signal
    return overrides


def check_validation_split(methods: Sequence[Method], base: Mapping[str, Any]) -> None:
    """A method whose weights read the validation split needs one in the base config."""
    readers = [m.name for m in methods if m.reads_validation]
    size = (base.get("tasks") or {}).get("validation_size") or 0
    if readers and not size:
        raise ValueError(
            f"{', '.join(readers)} weight tasks by held-out validation accuracy, but the base "
            f"config has no validation split (tasks.validation_size is {size}); add --set "
            "tasks.validation_size=50 (on the base, so every method and the shared warm start "
            "leave the same problems out)")


# ----------------------------------------------------------------------------- options


@dataclass(frozen=True)
class GridOptions:
    """What to run: the command line of the script, parsed and checked."""

    config: str = DEFAULT_CONFIG
    out: Path = DEFAULT_OUT
    methods: tuple[str, ...] | None = None  # None: every method of the table
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    lambdas: tuple[float, ...] = DEFAULT_LAMBDAS
    max_steps: int | None = None  # None: the base config's
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    threads: int = 1
    jobs: int = 1  # runs trained at a time, each in its own process
    only: str | None = None  # train this run alone and write no report (a --jobs worker)
    sets: tuple[str, ...] = ()  # "key=value" overrides for every run
    dry_run: bool = False
    argv: tuple[str, ...] = ()  # the command line, for results.md


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _parse_seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(part) for part in _csv(text))
    except ValueError:
        raise ValueError(f"--seeds takes comma-separated integers such as 1,2,3; "
                         f"got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds needs distinct integers such as 1,2,3; got {text!r}")
    return seeds


def _parse_lambdas(text: str) -> tuple[float, ...]:
    try:
        values = [float(part) for part in _csv(text)]
    except ValueError:
        raise ValueError(f"--lambdas takes comma-separated numbers such as 0.5,4; "
                         f"got {text!r}") from None
    return _check_lambdas(values)


def _check_set(item: str) -> str:
    key, sep, _ = item.partition("=")
    if not sep or not key.strip() or key.startswith("-"):
        raise ValueError(f"--set takes key=value (a config option, dotted for sections, e.g. "
                         f"tasks.train_size=64); got {item!r}")
    return item


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="MT-GRPO vs GRPO / DAPO / SEC over seeds: worst-task and average accuracy.")
    parser.add_argument("--config", default=DEFAULT_CONFIG,
                        help="base run config: a YAML file or a built-in recipe name")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="grid directory")
    parser.add_argument("--methods", default=None,
                        help="comma-separated subset of the methods (mtgrpo: every λ)")
    parser.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)),
                        help="comma-separated run seeds")
    parser.add_argument("--lambdas", default=",".join(f"{v:g}" for v in DEFAULT_LAMBDAS),
                        help="comma-separated MT-GRPO λ values, one method each")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="training steps of every run (default: the config's)")
    parser.add_argument("--thresholds", default=",".join(f"{t:g}" for t in DEFAULT_THRESHOLDS),
                        help="worst-task accuracy thresholds (fractions) for steps-to-threshold")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1: no oversubscription on a shared machine)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs trained at a time, each in a process of its own with "
                             "--threads threads (the warm start uses threads × jobs)")
    parser.add_argument("--only", default=None, metavar="LABEL",
                        help="train only this run (e.g. grpo-seed1) and write no report; "
                             "what each --jobs process runs")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config option for every run (repeatable)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the runs, their state and overrides, and exit")
    return parser


def parse_options(argv: Sequence[str]) -> GridOptions:
    """Parse and check the command line (``ValueError`` says the rule and the fix)."""
    args = build_parser().parse_args(list(argv))
    if args.max_steps is not None and args.max_steps < 1:
        raise ValueError(f"--max-steps must be a positive integer, got {args.max_steps}")
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    if args.only is not None and args.jobs > 1:
        raise ValueError("--only trains one run in this process; drop --jobs")
    lambdas = _parse_lambdas(args.lambdas)
    methods = None if args.methods is None else tuple(_csv(args.methods))
    if methods is not None:
        select_methods(method_table(lambdas), methods)  # unknown names fail here
    return GridOptions(
        config=args.config, out=args.out, methods=methods, seeds=_parse_seeds(args.seeds),
        lambdas=lambdas, max_steps=args.max_steps,
        thresholds=parse_thresholds(args.thresholds), threads=args.threads,
        jobs=args.jobs, only=args.only, sets=tuple(_check_set(item) for item in args.sets),
        dry_run=args.dry_run,
        argv=tuple(argv),
    )


# ----------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class SharedStart:
    """Where every run's model comes from: the warm start (or the base model) and how."""

    warm_start_dir: Path  # <out>/warm_start
    model_section: dict[str, Any]  # the runs' `model:` section
    tiny_dir: Path | None  # the tiny model built here, when the base config asks for one
    warm_start: bool  # the base config has an sft section, trained once here


@dataclass(frozen=True)
class RunState:
    """How far a run directory got: ``done``, ``resume`` (from ``checkpoint``) or ``new``."""

    status: str
    checkpoint: Path | None = None
    step: int = 0


@dataclass(frozen=True)
class PlannedRun:
    """One (method, seed) run: its directory, resolved config mapping and current state."""

    label: str  # "<method>-seed<k>"
    method: Method
    seed: int
    run_dir: Path
    config: dict[str, Any]  # YAML-shaped run config, as the run will be started
    overrides: dict[str, Any]  # what the method and seed set on top of the base
    state: RunState


@dataclass(frozen=True)
class GridPlan:
    base_path: Path
    base: dict[str, Any]  # resolved base config mapping (after --set / --max-steps)
    start: SharedStart
    max_steps: int  # of every run
    runs: tuple[PlannedRun, ...]


def load_base(options: GridOptions) -> tuple[Path, dict[str, Any]]:
    """The base config, resolved: recipe or file, then ``--set``, then ``--max-steps``.

    Returned as the mapping a run directory's ``config.yaml`` holds. The comparison needs
    per-task eval accuracy, so a config without evaluation is refused here, before any work.
    """
    path = recipe_path(options.config)
    overrides = [f"--{item}" for item in options.sets]
    if options.max_steps is not None:
        overrides.append(f"--max_steps={options.max_steps}")
    run = load_run_config(path, overrides)
    if run.training.evaluation.eval_steps < 1:
        raise ValueError(
            f"the comparison is made on the eval split, but {path.name} has eval_steps="
            f"{run.training.evaluation.eval_steps}; add --set eval_steps=N (e.g. a tenth of "
            "max_steps)")
    if run.sft and not run.tasks:
        raise ValueError("the sft section warm-starts on a task suite's gold answers; the base "
                         "config needs a tasks section")
    return path, run.to_dict()


def shared_start(base: Mapping[str, Any], out: Path) -> SharedStart:
    """The model section every run loads, from the base config's model and sft sections."""
    warm = out / WARM_START_DIR
    model = dict(base.get("model") or {})
    tiny_dir = None
    if model.get("tiny"):
        # Built inside the grid so that the grid is self-contained and its start reproducible.
        tiny_dir = warm / "base-model"
        model["name_or_path"] = str(tiny_dir)
    if base.get("sft"):
        # the warm start is a save_pretrained directory, whatever format the base came in
        model.update(name_or_path=str(warm / "sft" / "model"), gguf_file=None)
    model.update(tiny=False, tiny_options=None)
    return SharedStart(warm, model, tiny_dir, bool(base.get("sft")))


def run_config_mapping(base: Mapping[str, Any], start: SharedStart,
                       overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The YAML-shaped config of one run: the base, the shared start, then the overrides."""
    raw = {key: value for key, value in base.items() if key != "sft"}
    raw["model"] = dict(start.model_section)
    raw.update(overrides)
    return raw


def plan_grid(options: GridOptions) -> GridPlan:
    """Every run of the grid, validated, with its state on disk; nothing is trained."""
    base_path, base = load_base(options)
    start = shared_start(base, options.out)
    max_steps = int(base["max_steps"])
    runs = []
    methods = select_methods(method_table(options.lambdas), options.methods)
    check_validation_split(methods, base)
    for method in methods:
        for seed in options.seeds:
            label = f"{method.name}-seed{seed}"
            run_dir = options.out / label
            overrides = {**method_overrides(method, base), "seed": seed,
                         "output_dir": str(run_dir)}
            config = run_config_mapping(base, start, overrides)
            run_config_from_dict(config)  # a bad combination fails before any training
            state = run_state(run_dir, config, max_steps)
            if state.status == "resume":
                config["resume_from_checkpoint"] = str(state.checkpoint)
            runs.append(PlannedRun(label, method, seed, run_dir, config, overrides, state))
    return GridPlan(base_path, base, start, max_steps, tuple(runs))


# ----------------------------------------------------------------------------- run states


def written_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """What ``run_training`` writes to ``config.yaml`` for ``config``, without the keys a
    resume changes."""
    from mtgrpo.trainer.run import _model_kwargs

    run = run_config_from_dict(config)
    run.training.compute.model_init_kwargs = _model_kwargs(run)  # run_training writes them so
    resolved = run.to_dict()
    for key in _RESUME_KEYS:
        resolved.pop(key, None)
    return yaml.safe_load(yaml.safe_dump(resolved, sort_keys=False))


def _check_same_config(run_dir: Path, config: Mapping[str, Any]) -> None:
    written = run_dir / CONFIG_FILE
    if not written.is_file():
        return
    old = yaml.safe_load(written.read_text(encoding="utf-8")) or {}
    for key in _RESUME_KEYS:
        old.pop(key, None)
    new = written_config(config)
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if changed:
        details = "; ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:5])
        raise ValueError(
            f"{run_dir} was trained with a different config ({details}); a grid compares runs "
            "of one setting, so use another --out, or delete that run directory to redo it")


def _last_step(log: Path, split: str) -> int | None:
    if not log.is_file():
        return None
    steps = [record.get("step") for record in read_metrics(log, split)]  # skips cut lines
    steps = [s for s in steps if isinstance(s, int) and not isinstance(s, bool)]
    return max(steps) if steps else None


def run_state(run_dir: Path, config: Mapping[str, Any], max_steps: int) -> RunState:
    """``done`` when ``checkpoint-<max_steps>`` exists or the log holds the final eval step,
    ``resume`` from the newest earlier checkpoint, else ``new``.

    Raises ``ValueError`` when the directory holds a run of another config, or one trained
    beyond ``max_steps``.
    """
    from mtgrpo.trainer.checkpoint import latest_checkpoint

    _check_same_config(run_dir, config)
    final = run_dir / f"checkpoint-{max_steps}"
    logged = _last_step(run_dir / METRICS_FILE, "eval")  # every grid run evaluates
    if (final / "trainer_state.json").is_file() or (logged is not None and logged >= max_steps):
        return RunState("done", final if final.is_dir() else None, max_steps)
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return RunState("new")
    step = int(checkpoint.name.rpartition("-")[2])
    if step > max_steps:
        raise ValueError(f"{checkpoint} is beyond max_steps={max_steps}; use another --out or "
                         f"--max-steps >= {step}")
    return RunState("resume", checkpoint, step)


# ----------------------------------------------------------------------------- running


@dataclass
class GridResult:
    """What one invocation did, and where the report is."""

    plan: GridPlan
    executed: list[str] = field(default_factory=list)  # labels trained (fully or resumed)
    skipped: list[str] = field(default_factory=list)  # labels already done
    failed: dict[str, str] = field(default_factory=dict)  # label -> error
    results: Path | None = None  # results.md


def prepare_start(plan: GridPlan) -> Path:
    """Build the tiny model and run the warm start once (both cached); the start model."""
    start = plan.start
    name = Path(start.model_section["name_or_path"])
    if start.tiny_dir is None and not start.warm_start:
        return name
    from mtgrpo.trainer.run import _warm_start, build_suite, prepare_model

    raw = dict(plan.base, output_dir=str(start.warm_start_dir))
    if start.tiny_dir is not None:
        raw["model"] = dict(raw["model"], name_or_path=str(start.tiny_dir))
    run = run_config_from_dict(raw)
    suite = build_suite(run.tasks) if run.tasks else None
    try:
        model = prepare_model(run, suite)
        if start.warm_start:
            model = _warm_start(run, model, suite)
    finally:
        if suite is not None:
            suite.close()
    assert Path(model) == name, (model, name)  # the runs were planned with this path
    return name


def execute_run(planned: PlannedRun) -> None:
    """Train one run of the grid (from scratch or from its checkpoint)."""
    from mtgrpo.models import release_memory
    from mtgrpo.trainer.run import run_training

    logger.info("%s: %s", planned.label, "resuming from " + str(planned.state.checkpoint)
                if planned.state.status == "resume" else "training")
    try:
        run_training(run_config_from_dict(planned.config))
    finally:
        release_memory()


def run_grid(options: GridOptions) -> GridResult:
    """Plan, warm-start once, train every unfinished run (``options.jobs`` at a time), and
    write the report; with ``options.only``, train that one run and write nothing else."""
    import torch

    plan = plan_grid(options)
    result = GridResult(plan)
    if options.dry_run:
        print(describe_plan(plan))
        return result
    if options.only is not None:
        return _train_only(plan, options, result)
    # seed by seed (stable: the method table's order within a seed)
    pending = sorted((run for run in plan.runs if run.state.status != "done"),
                     key=lambda run: options.seeds.index(run.seed))
    result.skipped = [run.label for run in plan.runs if run.state.status == "done"]
    if pending:
        torch.set_num_threads(options.threads * options.jobs)  # the warm start runs alone
        prepare_start(plan)
    torch.set_num_threads(options.threads)
    if options.jobs > 1:
        _train_in_workers(pending, options, result)
    else:
        _train_here(pending, result)
    result.results = write_results(plan, options, result)
    return result


def _train_here(pending: Sequence[PlannedRun], result: GridResult) -> None:
    for planned in pending:
        try:
            execute_run(planned)
        except Exception as error:  # one broken run must not cost the rest of the grid
            logger.error("%s failed:\n%s", planned.label, traceback.format_exc())
            result.failed[planned.label] = f"{type(error).__name__}: {error}"
        else:
            result.executed.append(planned.label)


def _train_only(plan: GridPlan, options: GridOptions, result: GridResult) -> GridResult:
    """``--only LABEL``: that run alone (a ``--jobs`` worker); an error propagates, so the
    process's exit status says whether the run finished."""
    import torch

    planned = {run.label: run for run in plan.runs}.get(options.only)
    if planned is None:
        raise ValueError(f"--only {options.only!r} is not a run of this grid; its runs: "
                         + ", ".join(run.label for run in plan.runs))
    if planned.state.status == "done":
        result.skipped.append(planned.label)
        return result
    torch.set_num_threads(options.threads)
    prepare_start(plan)  # cached: a finished warm start is reused
    execute_run(planned)
    result.executed.append(planned.label)
    return result


def worker_argv(options: GridOptions, label: str) -> list[str]:
    """The command line of the process that trains run ``label`` of this grid (``--only``)."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--config", options.config,
            "--out", str(options.out), "--seeds", ",".join(map(str, options.seeds)),
            "--lambdas", ",".join(map(str, options.lambdas)),
            "--threads", str(options.threads), "--only", label]
    if options.methods is not None:
        argv += ["--methods", ",".join(options.methods)]
    if options.max_steps is not None:
        argv += ["--max-steps", str(options.max_steps)]
    for item in options.sets:
        argv += ["--set", item]
    return argv


def _train_in_workers(pending: Sequence[PlannedRun], options: GridOptions,
                      result: GridResult) -> None:
    logs = {run.label: options.out / LOGS_DIR / f"{run.label}.log" for run in pending}
    # a log is appended to by every invocation: this one's output starts at its current end
    starts = {label: log.stat().st_size if log.is_file() else 0 for label, log in logs.items()}
    statuses = run_parallel({run.label: worker_argv(options, run.label) for run in pending},
                            logs, options.jobs)
    for run in pending:
        status, log = statuses[run.label], logs[run.label]
        if status == 0:
            result.executed.append(run.label)
        else:
            result.failed[run.label] = (f"{_exit_text(status)}: "
                                        f"{_last_line(log, starts[run.label])} (log: {log})")


def _exit_text(status: int) -> str:
    """``exit status 1``, or the signal that stopped the process (``killed by SIGKILL``)."""
    if status >= 0:
        return f"exit status {status}"
    try:
        return f"killed by {signal.Signals(-status).name}"
    except ValueError:
        return f"killed by signal {-status}"


def _last_line(path: Path, start: int = 0) -> str:
    """The last line ``path`` gained after byte ``start``."""
    with path.open("rb") as handle:
        handle.seek(start)
        lines = handle.read().decode("utf-8", errors="replace").strip().splitlines()
    return lines[-1] if lines else "(no output)"


def run_parallel(commands: Mapping[str, Sequence[str]], logs: Mapping[str, Path], jobs: int,
                 *, poll_seconds: float = 1.0) -> dict[str, int]:
    """Run ``commands`` (label -> argv) in their order, at most ``jobs`` at a time, each one's
    stdout and stderr appended to ``logs[label]``; label -> exit status (negative: the signal
    that stopped it). Interrupted (Ctrl-C, or SIGTERM from a scheduler), it stops the commands
    still running, killing any that has not ended 30 s later (a stopped run resumes from its
    last checkpoint)."""
    waiting = list(commands)
    running: dict[str, subprocess.Popen[bytes]] = {}
    statuses: dict[str, int] = {}
    previous = _raise_on_sigterm()
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                label = waiting.pop(0)
                logs[label].parent.mkdir(parents=True, exist_ok=True)
                with logs[label].open("ab") as log:
                    running[label] = subprocess.Popen(list(commands[label]), stdout=log,
                                                      stderr=subprocess.STDOUT)
                logger.info("%s: started (log %s)", label, logs[label])
            time.sleep(poll_seconds)
            for label, process in list(running.items()):
                status = process.poll()
                if status is not None:
                    statuses[label] = status
                    del running[label]
                    logger.info("%s: %s", label, "finished" if status == 0
                                else f"failed, {_exit_text(status)} (log {logs[label]})")
    finally:
        if running:
            logger.info("stopping %s; the same command resumes each from its last checkpoint",
                        ", ".join(running))
        _stop(running.values())
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return statuses


def _raise_on_sigterm() -> Any:
    """Make SIGTERM raise ``SystemExit`` here (so the ``finally`` above stops the workers);
    the previous handler, or None where none can be set (not the main thread)."""
    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        return signal.signal(signal.SIGTERM, stop)
    except ValueError:  # signal handlers can be set in the main thread only
        return None


def _stop(processes: Iterable[subprocess.Popen[bytes]], grace_seconds: float = 30.0) -> None:
    """Terminate ``processes``, then kill those still running after ``grace_seconds``."""
    processes = [p for p in processes if p.poll() is None]
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + grace_seconds
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def describe_plan(plan: GridPlan) -> str:
    """The dry-run listing: the shared start, then every run with its state and overrides."""
    start = plan.start
    lines = [f"base config: {plan.base_path}",
             f"start model: {start.model_section['name_or_path']}"
             + (" (supervised warm start, trained once)" if start.warm_start else "")]
    for run in plan.runs:
        state = run.state.status + (f" from {run.state.checkpoint.name}"
                                    if run.state.status == "resume" else "")
        shown = {k: v for k, v in run.overrides.items() if k != "output_dir"}
        lines.append(f"{run.label:<24} [{state}] -> {run.run_dir}")
        flow = yaml.safe_dump(shown, default_flow_style=True, width=10_000, sort_keys=False)
        lines.append(f"    {flow.strip()}")
    lines.append(f"{len(plan.runs)} runs, "
                 f"{sum(r.state.status == 'done' for r in plan.runs)} already done")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- verdict


@dataclass(frozen=True)
class Check:
    """One question of the verdict, answered from the numbers."""

    method: str  # the MT-GRPO variant asked about
    question: str
    answer: bool | None  # None: undecidable (a method or a number is missing)
    evidence: str  # the numbers behind the answer, in words


def steps_by_majority(steps: Sequence[int | None]) -> float:
    """The step by which a majority of the seeds (more than half) had reached a threshold.

    ``steps``: one entry per seed, None for "never", which counts as ``+inf``. With seeds
    ``[40, None, 20]`` the sorted values are ``[20, 40, inf]`` and two of three seeds had
    reached it by step 40; with ``[30, None]`` one seed of two is no majority: ``inf``.
    """
    if not steps:
        return math.inf
    ordered = sorted(math.inf if s is None else float(s) for s in steps)
    return ordered[len(ordered) // 2]


def _pts(value: float) -> str:
    return f"{value * 100:.1f}%"


def _range(spread: Spread) -> str:
    return f"[{_pts(spread.min)}–{_pts(spread.max)}]"


def _worst_vs(mt: Spread, other: Spread, name: str, *, tolerance: float,
              noise: NoiseCheck | None = None) -> tuple[bool, str]:
    diff = mt.mean - other.mean
    apart = mt.min > other.max or mt.max < other.min
    overlap = "do not overlap" if apart else "overlap"
    text = (f"{_pts(mt.mean)} {_range(mt)} against {name}'s {_pts(other.mean)} "
            f"{_range(other)}: {diff * 100:+.1f} points; the seed ranges {overlap}")
    if noise is not None:
        where = "outside" if noise.outside_noise else "within"
        text += (f"; {where} the seed noise (one-sided, above {name}: Welch p = "
                 f"{noise.welch_p:.2f}, permutation p = {noise.permutation_p:.2f})")
    return diff > 0 if tolerance == 0 else diff >= -tolerance - _ROUNDING, text


def _steps_text(value: float, reached: int, runs: int) -> str:
    return ("never" if math.isinf(value) else f"step {value:g}") + f" ({reached}/{runs} reached)"


def _threshold_checks(name: str, threshold: float, members: Mapping[str, Sequence[RunSummary]],
                      baselines: Sequence[str]) -> Check:
    def step_and_reached(method: str) -> tuple[float, int, int]:
        values = [run.steps_to_threshold.get(threshold) for run in members[method]]
        return steps_by_majority(values), sum(v is not None for v in values), len(values)

    question = (f"Worst task at {threshold * 100:g}% in fewer steps than "
                + " and ".join(b.upper() for b in baselines or ("GRPO", "DAPO")))
    if not baselines:
        return Check(name, question, None, "no GRPO or DAPO run to compare with")
    own = step_and_reached(name)
    others = {b: step_and_reached(b) for b in baselines}
    answer = math.isfinite(own[0]) and all(own[0] < other[0] for other in others.values())
    evidence = "step by which most seeds got there: " + ", ".join(
        f"{method} {_steps_text(*values)}" for method, values in {name: own, **others}.items())
    return Check(name, question, answer, evidence)


def runs_by_method(summaries: Sequence[RunSummary],
                   group_of: Mapping[str, str]) -> dict[str, list[RunSummary]]:
    """The runs of each method (``group_of``: run label -> method; a label not in it is its
    own method), in the order given."""
    members: dict[str, list[RunSummary]] = {}
    for summary in summaries:
        members.setdefault(group_of.get(summary.label, summary.label), []).append(summary)
    return members


def verdict(aggregate: SeedAggregateTable, summaries: Sequence[RunSummary],
            mtgrpo_methods: Sequence[str], *, grpo: str = "grpo", dapo: str = "dapo",
            tolerance: float = TOLERANCE,
            noise: Sequence[NoiseCheck] | None = None) -> list[Check]:
    """Did MT-GRPO beat GRPO, match or beat DAPO, keep its average near the best, and reach
    the worst-task thresholds sooner? One :class:`Check` per question and MT-GRPO method.

    Accuracies compare means over seeds; "match" allows ``tolerance`` (a fraction) below;
    steps use :func:`steps_by_majority` on the eval steps of each seed. Where both methods
    have two or more finished seeds, a worst-task answer's evidence also says whether the gap
    stands outside the seed noise (:func:`noise_checks`: both one-sided tests at 5 %), since
    an answer by the means alone can rest on a gap smaller than the noise; ``noise`` passes
    tests already run (the report's "Signal and noise" section) instead of running them again.
    """
    by_name = {m.method: m for m in aggregate.methods}
    group_of = aggregate.group_of
    members = runs_by_method(summaries, group_of)
    if noise is None:
        noise = noise_checks(summaries, group_of, mtgrpo_methods, (grpo, dapo))
    tests = {(c.method, c.other): c for c in noise}
    averages = {m.method: m.final_average.mean for m in aggregate.methods if m.final_average}
    checks = []
    for name in mtgrpo_methods:
        mt = by_name.get(name)
        if mt is None or mt.final_worst is None:
            checks.append(Check(name, "Finished with an eval accuracy for every task", False,
                                f"no run of {name} has a final eval step"))
            continue
        for other, question, tol in ((grpo, "Final worst-task accuracy above GRPO's", 0.0),
                                     (dapo, "Final worst-task accuracy at least DAPO's (within "
                                            f"{tolerance * 100:g} points)", tolerance)):
            base = by_name.get(other)
            if base is None or base.final_worst is None:
                checks.append(Check(name, question, None, f"no finished {other} run"))
                continue
            answer, text = _worst_vs(mt.final_worst, base.final_worst, other, tolerance=tol,
                                     noise=tests.get((name, other)))
            checks.append(Check(name, question, answer, text))
        checks.append(_average_check(name, averages, tolerance))
        baselines = [b for b in (grpo, dapo) if b in members]
        checks += [_threshold_checks(name, t, members, baselines) for t in aggregate.thresholds]
    return checks


def _average_check(name: str, averages: Mapping[str, float], tolerance: float) -> Check:
    best = max(averages, key=lambda method: averages[method])
    gap = averages[best] - averages[name]
    question = f"Final average accuracy within {tolerance * 100:g} points of the best method"
    evidence = (f"{_pts(averages[name])} against the best, {best}'s {_pts(averages[best])}: "
                f"{gap * 100:.1f} points below" if best != name
                else f"{_pts(averages[name])} is the highest of all methods")
    return Check(name, question, gap <= tolerance + _ROUNDING, evidence)


def render_verdict(checks: Sequence[Check]) -> str:
    """Markdown, per MT-GRPO method: each question, **Yes.** / **No.** / **Undecided.**, and
    the numbers behind the answer."""
    words = {True: "**Yes.**", False: "**No.**", None: "**Undecided.**"}
    lines = []
    for method in dict.fromkeys(check.method for check in checks):
        lines += [f"**{method}**", ""]
        lines += [f"- {c.question}? {words[c.answer]} {c.evidence[:1].upper()}{c.evidence[1:]}."
                  for c in checks if c.method == method]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


@dataclass(frozen=True)
class NoiseCheck:
    """Is one method's final worst-task accuracy above another's by more than the seed noise?

    ``values`` are the per-seed final worst-task accuracies (fractions). Two tests, one-sided
    (``method`` above ``other``): Welch's t-test (unequal variances; assumes roughly normal
    per-seed means) and the exact two-sample permutation test on the difference of means (no
    distributional assumption: every way of splitting the pooled seeds into two groups of the
    observed sizes is equally likely under "no difference"). ``average_gap`` is the cost (or
    gain) in mean final average accuracy, ``method`` minus ``other``.
    """

    method: str
    other: str
    values: tuple[float, ...]
    other_values: tuple[float, ...]
    welch_p: float
    permutation_p: float
    average_gap: float

    @property
    def outside_noise(self) -> bool:
        """Both tests reject "no difference" at the 5 % level."""
        return self.welch_p < 0.05 and self.permutation_p < 0.05


def permutation_p_value(values: Sequence[float], other: Sequence[float]) -> float:
    """Exact one-sided p of ``mean(values) - mean(other)`` under random relabelling.

    The fraction of the ``C(n + m, n)`` splits of the pooled values whose difference of means
    is at least the observed one (the observed split included, so p ≥ 1 / C(n + m, n)).
    """
    from itertools import combinations

    pooled = [*values, *other]
    n, total = len(values), sum(pooled)
    observed = sum(values) / n - (total - sum(values)) / len(other)
    splits = list(combinations(range(len(pooled)), n))
    at_least = 0
    for split in splits:
        chosen = sum(pooled[i] for i in split)
        at_least += chosen / n - (total - chosen) / len(other) >= observed - _ROUNDING
    return at_least / len(splits)


def welch_p_value(values: Sequence[float], other: Sequence[float]) -> float:
    """One-sided p of Welch's t-test, mean(values) > mean(other) (scipy.stats.ttest_ind).

    Two identical constant samples give p = 1 (no evidence of a difference); two different
    constant samples give 0 or 1 by the sign of the gap.
    """
    from scipy import stats

    if len(set(values)) <= 1 and len(set(other)) <= 1:
        gap = (values[0] if values else 0.0) - (other[0] if other else 0.0)
        return 0.0 if gap > _ROUNDING else 1.0
    with warnings.catch_warnings():
        # one constant group (two seeds that scored alike) has variance 0, which Welch's
        # statistic takes as it is; scipy still warns of "catastrophic cancellation" for it
        warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
        return float(stats.ttest_ind(values, other, equal_var=False,
                                     alternative="greater").pvalue)


def noise_checks(summaries: Sequence[RunSummary], group_of: Mapping[str, str],
                 mtgrpo_methods: Sequence[str],
                 baselines: Sequence[str] = ("grpo", "dapo")) -> list[NoiseCheck]:
    """One :class:`NoiseCheck` per MT-GRPO method and baseline with finished runs of both."""
    finished = [s for s in summaries if s.final_worst is not None and s.final_average is not None]
    members = runs_by_method(finished, group_of)
    worst = {method: [s.final_worst for s in runs] for method, runs in members.items()}
    average = {method: [s.final_average for s in runs] for method, runs in members.items()}
    checks = []
    for name in mtgrpo_methods:
        for other in baselines:
            if len(worst.get(name, ())) < 2 or len(worst.get(other, ())) < 2:
                continue
            mine, theirs = worst[name], worst[other]
            checks.append(NoiseCheck(
                name, other, tuple(mine), tuple(theirs), welch_p_value(mine, theirs),
                permutation_p_value(mine, theirs),
                sum(average[name]) / len(average[name])
                - sum(average[other]) / len(average[other])))
    return checks


def evaluation_standard_error(summaries: Sequence[RunSummary], samples: int) -> float:
    """The largest binomial standard error ``sqrt(p (1 - p) / n)`` of one final per-task
    accuracy over all runs (``n = samples`` per task and evaluation), as a fraction; NaN
    without samples."""
    if samples < 1:
        return math.nan
    return max((math.sqrt(p * (1 - p) / samples) for s in summaries
                for p in s.final_accuracy.values()), default=math.nan)


def render_noise(checks: Sequence[NoiseCheck], standard_error: float, samples: int) -> str:
    """Markdown: the evaluation's standard error and one line per test."""
    lines = [f"One evaluation scores {samples} samples per task, so a final per-task accuracy "
             f"has a binomial standard error of at most {standard_error * 100:.1f} points in "
             "these runs. Across seeds (final worst-task accuracy, one-sided, MT-GRPO above "
             "the baseline; Welch's t-test and the exact permutation test):", ""]
    for c in checks:
        verdict_word = "**outside the noise**" if c.outside_noise else "**within the noise**"
        lines.append(
            f"- {c.method} vs {c.other}: {_pts(sum(c.values) / len(c.values))} against "
            f"{_pts(sum(c.other_values) / len(c.other_values))} "
            f"(seeds {', '.join(f'{v * 100:.1f}' for v in c.values)} against "
            f"{', '.join(f'{v * 100:.1f}' for v in c.other_values)}); Welch p = "
            f"{c.welch_p:.3f}, permutation p = {c.permutation_p:.3f}: {verdict_word}; "
            f"average accuracy {c.average_gap * 100:+.1f} points")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class StartGain:
    """One task of one method: its accuracy at the first evaluation (step 0, the shared start
    model sampled with each run's seed) and at the final one, per seed, and whether the gain
    stands outside the evaluation's noise.

    ``standard_error`` is the binomial standard error of the gain of the seed means,
    ``sqrt(Σ_k [p0_k (1 - p0_k) + p1_k (1 - p1_k)] / n) / S`` over the ``S`` seeds with ``n``
    samples per task and evaluation: both ends are noisy measurements (the start is sampled
    anew by every run), so the difference carries both variances."""

    method: str
    task: str
    start: tuple[float, ...]  # [S] per-seed step-0 accuracy
    final: tuple[float, ...]  # [S] per-seed final accuracy
    samples: int  # per task and evaluation

    @property
    def gain(self) -> float:
        return sum(self.final) / len(self.final) - sum(self.start) / len(self.start)

    @property
    def seed_gains(self) -> tuple[float, ...]:
        """``[S]`` final minus start, per seed (the spread between seeds, which the standard
        error of the evaluation does not include)."""
        return tuple(f - s for s, f in zip(self.start, self.final, strict=True))

    @property
    def standard_error(self) -> float:
        """NaN when the samples per evaluation are unknown (``samples < 1``)."""
        if self.samples < 1:
            return math.nan
        variance = sum(p * (1 - p) for p in (*self.start, *self.final)) / self.samples
        return math.sqrt(variance) / len(self.start)

    @property
    def z(self) -> float:
        """The gain in standard errors (inf for a gain from a noiseless 0 % or 100 %; NaN
        when the standard error is unknown)."""
        se = self.standard_error
        if math.isnan(se):
            return math.nan
        if se == 0:
            return math.copysign(math.inf, self.gain) if self.gain else 0.0
        return self.gain / se


def start_gains(histories: Mapping[str, RunHistory], group_of: Mapping[str, str],
                samples: int) -> list[StartGain]:
    """Per method and task, the step-0 and final eval accuracy of every run that has both (the
    runs' start is their first evaluation, which must be at step 0)."""
    pairs: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for label, history in histories.items():
        for task in history.tasks_with("accuracy", "eval"):
            series = history.task_series(task, "accuracy", "eval").finite()
            if len(series) < 2 or int(series.steps[0]) != 0:
                continue
            start, final = pairs.setdefault((group_of[label], task), ([], []))
            start.append(float(series.values[0]))
            final.append(float(series.values[-1]))
    return [StartGain(method, task, tuple(start), tuple(final), samples)
            for (method, task), (start, final) in pairs.items()]


def render_start_gains(gains: Sequence[StartGain]) -> str:
    """Markdown: per method and task, start → final (mean over seeds), the gain and its
    standard error, and whether it exceeds two standard errors."""
    rows = [[g.method, g.task, f"{len(g.start)}", _pts(sum(g.start) / len(g.start)),
             _pts(sum(g.final) / len(g.final)), f"{g.gain * 100:+.1f}",
             ", ".join(f"{v * 100:+.1f}" for v in g.seed_gains),
             f"{g.standard_error * 100:.1f}", f"{g.z:+.1f}", "yes" if g.z > 2 else "no"]
            for g in gains]
    table = markdown_table(["method", "task", "seeds", "start (step 0)", "final", "gain (points)",
                            "per seed", "SE (points)", "gain / SE", "> 2 SE"], rows)
    return (table + "\n\n- start: the first evaluation (step 0) of each run, the shared start "
            "model sampled with the run's seed; gain: mean over seeds of final minus start; SE: "
            "binomial standard error of that difference, both ends counted "
            f"({gains[0].samples} samples per task and evaluation): the evaluation's noise, "
            "not the spread between seeds (per seed); > 2 SE: a gain (one-sided), a loss "
            "reads no\n" if gains else "")


@dataclass(frozen=True)
class TaskSignal:
    """What one task of one method trained on, mean over its runs: the mean task weight and
    share of the trained batch over the training steps, the share of the task's generated
    groups with zero gradient (every completion scored alike), and the groups of the task
    trained in all (share × groups per step, summed over the steps)."""

    method: str
    task: str
    runs: int
    weight: float | None  # None: no run of the method logged it
    batch_share: float | None
    zero_gradient_rate: float | None
    groups_trained: float | None


def _groups_trained(history: RunHistory, task: str) -> float | None:
    """Σ over the steps of the task's batch share × the groups trained that step (steps where
    either is missing are left out; None when none has both)."""
    groups = history.series("sampling/batch_groups", "train").finite()
    counts = dict(zip(groups.steps.tolist(), groups.values.tolist(), strict=True))
    share = history.task_series(task, "batch_share", "train").finite()
    products = [v * counts[step] for step, v in zip(share.steps.tolist(), share.values.tolist(),
                                                    strict=True) if step in counts]
    return sum(products) if products else None


def _mean_of_known(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def training_signal(histories: Mapping[str, RunHistory],
                    group_of: Mapping[str, str]) -> list[TaskSignal]:
    """Per method and task, :class:`TaskSignal` from the runs' train records; a number a run
    did not log is left out of its method's mean (None when no run logged it)."""
    per_run: dict[tuple[str, str], list[tuple[float | None, ...]]] = {}
    for label, history in histories.items():
        for task in history.tasks_with("batch_share", "train"):
            per_run.setdefault((group_of[label], task), []).append((
                *(history.task_series(task, metric, "train").mean()
                  for metric in ("weight", "batch_share", "zero_gradient_rate")),
                _groups_trained(history, task)))
    return [TaskSignal(method, task, len(rows),
                       *(_mean_of_known([row[i] for row in rows]) for i in range(4)))
            for (method, task), rows in per_run.items()]


def render_training_signal(signals: Sequence[TaskSignal]) -> str:
    """Markdown: per method and task, the weight, batch share, zero-gradient rate and groups
    trained (means over the method's runs)."""
    def cell(value: float | None, digits: int) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    rows = [[g.method, g.task, f"{g.runs}", cell(g.weight, 2), cell(g.batch_share, 2),
             cell(g.zero_gradient_rate, 2), cell(g.groups_trained, 0)] for g in signals]
    table = markdown_table(["method", "task", "runs", "mean weight", "mean batch share",
                            "zero-gradient rate", "groups trained"], rows)
    return (table + "\n\n- means over the training steps, then over the method's runs; "
            "zero-gradient rate: share of the task's generated groups whose completions all "
            "scored alike; groups trained: batch share × groups per step, summed over the "
            "steps\n")


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Comparison:
    """The numbers of the finished runs: per-seed tables, the seed aggregate, all runs."""

    per_seed: dict[int, ComparisonTable]  # Δm% against dapo-seed<k>
    aggregate: SeedAggregateTable
    summaries: tuple[RunSummary, ...]  # per run, with paired Δm%
    combined: ComparisonTable  # every finished run (for the figures)
    start_gains: tuple[StartGain, ...] = ()  # per method and task: step 0 against final
    signal: tuple[TaskSignal, ...] = ()  # per method and task: what it trained on


def compare_grid(plan: GridPlan, thresholds: Sequence[float]) -> Comparison | None:
    """Compare the finished runs of the plan on the eval split; None when none finished."""
    done = [run for run in plan.runs
            if run_state(run.run_dir, run.config, plan.max_steps).status == "done"]
    if not done:
        return None
    histories: dict[str, RunHistory] = {r.label: load_run(r.run_dir, name=r.label) for r in done}
    per_seed = {}
    for seed in dict.fromkeys(run.seed for run in done):
        labels = [run.label for run in done if run.seed == seed]
        baseline = f"dapo-seed{seed}"
        per_seed[seed] = compare_runs(
            [histories[label] for label in labels],
            baseline=histories.get(baseline),
            thresholds=thresholds, split="eval", labels=labels)
    order = [run.label for run in done]  # method table order, then seeds
    summaries = tuple(sorted((s for table in per_seed.values() for s in table.runs),
                             key=lambda summary: order.index(summary.label)))
    aggregate = aggregate_seeds(summaries, group_by={run.label: run.method.name for run in done})
    if any(table.baseline for table in per_seed.values()):
        aggregate = dataclasses.replace(aggregate, baseline="dapo (same seed)")
    combined = compare_runs(list(histories.values()), thresholds=thresholds, split="eval",
                            labels=list(histories))
    gains = start_gains(histories, aggregate.group_of, eval_samples_per_task(plan))
    signal = training_signal(histories, aggregate.group_of)
    return Comparison(per_seed, aggregate, summaries, combined, tuple(gains), tuple(signal))


def paper_table(aggregate: SeedAggregateTable, summaries: Sequence[RunSummary]) -> str:
    """The seed aggregate's table with a "worst task (most often)" column after "worst":
    the task that was the final worst in most of the method's runs (ties: suite order)."""
    headers, rows = aggregate.rows()
    worst_of: dict[str, Counter[str]] = {}
    for summary in summaries:
        counts = worst_of.setdefault(aggregate.group_of[summary.label], Counter())
        if summary.final_worst_task is not None:
            counts[summary.final_worst_task] += 1
    order = aggregate.tasks
    at = headers.index("worst") + 1
    headers.insert(at, "worst task (most often)")
    for row, method in zip(rows, aggregate.methods, strict=True):
        counts = worst_of.get(method.method, Counter())
        if counts:  # ties go to the task listed first in the suite
            task = max(counts, key=lambda t: (counts[t], -order.index(t)))
            cell = f"{task} ({counts[task]}/{len(method.members)})"
        else:
            cell = "—"
        row.insert(at, cell)
    return markdown_table(headers, rows)


def per_task_table(aggregate: SeedAggregateTable) -> str:
    """Final accuracy (%) per task and method, mean ± std [min–max] over seeds."""
    rows = [[m.method, *("—" if m.final_accuracy.get(t) is None
                         else m.final_accuracy[t].format(100.0, 1) for t in aggregate.tasks)]
            for m in aggregate.methods]
    return markdown_table(["method", *aggregate.tasks], rows)


def method_rows(plan: GridPlan) -> str:
    """The methods as run: weighting, batch construction, ε_high and their parameters."""
    epsilon = run_config_from_dict(plan.base).training.loss.epsilon
    seen: dict[str, PlannedRun] = {}
    for run in plan.runs:
        seen.setdefault(run.method.name, run)
    rows = []
    for name, run in seen.items():
        o = run.overrides
        eps = f"{o['epsilon_high']:g}" if o["epsilon_high"] is not None else f"= ε ({epsilon:g})"
        rows.append([name, run.method.description, o["task_weighting"],
                     _flow(o["task_weighting_params"]), o["batch_construction"],
                     _flow(o["batch_construction_params"]), eps])
    return markdown_table(["method", "what", "task weighting", "weighting params",
                            "batch construction", "batch params", "ε_high"], rows,
                           numeric=False)


def _flow(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "—"


_FIGURE_CAPTIONS = {
    "compare_worst": "Worst-task eval accuracy vs step: mean over seeds, band min–max",
    "compare_accuracy": "Per-task eval accuracy vs step, mean over seeds per method",
    "compare_weights": "Final task weights of every run",
}


def environment(threads: int, jobs: int = 1) -> str:
    """Machine, library versions, thread settings and runs at a time (``--jobs``: they share
    the cores and the memory bandwidth), for reading the time per step."""
    import torch

    device = (torch.cuda.get_device_name(0) if torch.cuda.is_available()
              else f"CPU ({os.cpu_count()} cores visible)")
    return (f"{device}; torch {torch.__version__}, Python {platform.python_version()}; "
            f"torch threads {threads}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}"
            f"; runs at a time {jobs}")


def _display(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (a portable record)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _eval_prompts_per_task(plan: GridPlan) -> int | None:
    tasks = plan.base.get("tasks") or {}
    return tasks.get("paper_test_per_task") if tasks.get("paper_test_sets") \
        else tasks.get("eval_size")


def eval_samples_per_task(plan: GridPlan) -> int:
    """Completions scored per task at one evaluation: eval prompts × samples per prompt."""
    run = FlatOptions(run_config_from_dict(plan.base).training)  # options by flat name
    return (_eval_prompts_per_task(plan) or 0) * run.num_generations_eval


def settings(plan: GridPlan) -> list[str]:
    """The shared settings of every run, in words."""
    run = FlatOptions(run_config_from_dict(plan.base).training)  # options by flat name
    eval_size = _eval_prompts_per_task(plan)
    return [
        f"base config `{_display(plan.base_path)}`; start model "
        f"`{plan.start.model_section['name_or_path']}`"
        + (" (supervised warm start of the base config, trained once)"
           if plan.start.warm_start else ""),
        f"{run.max_steps} training steps of {run.resolved_prompts_per_step()} prompts × "
        f"{run.num_generations} completions; learning rate {run.learning_rate:g}; loss "
        f"{run.loss_type}; ε {run.epsilon:g}; zero-gradient filter {run.zero_gradient_filter}",
        f"eval every {run.eval_steps} steps: {eval_size or '?'} prompts per task × "
        f"{run.num_generations_eval} samples at temperature {run.eval_temperature:g}",
    ]


def write_results(plan: GridPlan, options: GridOptions, result: GridResult) -> Path:
    """Write ``results.md``, ``results.json`` and ``figures/`` into the grid directory."""
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    comparison = compare_grid(plan, options.thresholds)
    command = "python benchmarks/mtgrpo_vs_baselines.py " + shlex.join(options.argv)
    parts = [f"# MT-GRPO vs GRPO / DAPO / SEC ({plan.base_path.stem})", "",
             f"Command: `{command}`", "", *(f"- {line}" for line in settings(plan)),
             f"- machine: {environment(options.threads, options.jobs)}", "", "## Methods", "",
             method_rows(plan), "", *_status_lines(plan, result, comparison)]
    payload: dict[str, Any] = {"command": command, "failed": result.failed}
    if comparison is not None:
        mtgrpo_methods = list(dict.fromkeys(r.method.name for r in plan.runs
                                            if r.method.is_mtgrpo))
        noise = noise_checks(comparison.summaries, comparison.aggregate.group_of, mtgrpo_methods)
        checks = verdict(comparison.aggregate, comparison.summaries, mtgrpo_methods, noise=noise)
        samples = eval_samples_per_task(plan)
        standard_error = evaluation_standard_error(comparison.summaries, samples)
        parts += _result_sections(comparison, checks, out,
                                  render_noise(noise, standard_error, samples) if noise else "")
        payload.update(noise=[{**dataclasses.asdict(c), "outside_noise": c.outside_noise}
                              for c in noise],
                       evaluation_standard_error=standard_error, eval_samples_per_task=samples)
        payload["training_signal"] = [dataclasses.asdict(g) for g in comparison.signal]
        payload["start_gains"] = [{**dataclasses.asdict(g), "gain": g.gain,
                                   "standard_error": _finite_or_none(g.standard_error),
                                   "z": _finite_or_none(g.z)}
                                  for g in comparison.start_gains]
        payload.update(aggregate=json.loads(comparison.aggregate.to_json()),
                       per_seed={str(k): json.loads(t.to_json())
                                 for k, t in comparison.per_seed.items()},
                       verdict=[dataclasses.asdict(c) for c in checks])
    (out / "results.md").write_text("\n".join(parts).rstrip() + "\n", encoding="utf-8")
    (out / "results.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return out / "results.md"


def _finite_or_none(value: float) -> float | None:
    """JSON has no NaN or infinity: those are written as null."""
    return value if math.isfinite(value) else None


def _status_lines(plan: GridPlan, result: GridResult,
                  comparison: Comparison | None) -> list[str]:
    finished = set() if comparison is None else set(comparison.combined.labels)
    waiting = [r.label for r in plan.runs if r.label not in finished
               and r.label not in result.failed]
    lines = [f"Runs: {len(finished)} of {len(plan.runs)} finished "
             f"({len(result.executed)} trained by this invocation, {len(result.skipped)} "
             "found finished)."]
    if result.failed:
        lines.append("Failed: " + "; ".join(f"`{k}` ({v})" for k, v in result.failed.items()))
    if waiting:
        lines.append("Not finished (left out of every table): " + ", ".join(waiting))
    if comparison is None:
        lines.append("\nNo run has finished, so there is nothing to compare yet.")
    return [*lines, ""]


def _result_sections(comparison: Comparison, checks: Sequence[Check], out: Path,
                     noise: str = "") -> list[str]:
    from mtgrpo.reporting.plots import plot_comparison

    figures = plot_comparison(comparison.combined, out / FIGURES_DIR,
                              aggregate=comparison.aggregate)
    aggregate = comparison.aggregate
    parts = ["## Results (eval split)", "", paper_table(aggregate, comparison.summaries), "",
             "- cells: mean ± sample std [min–max] over seeds, accuracies in %; steps→T%: mean "
             "first eval step with worst-task accuracy ≥ T over the seeds that reached it "
             "(reached / seeds); Δm%: relative change of the final per-task accuracy against "
             "DAPO of the same seed; s/step: mean wall time of a training step; prompts/inf. "
             "group: prompts generated per informative group", "",
             "### Final accuracy per task (%)", "", per_task_table(aggregate), "",
             *(["### Gain over the start (step 0)", "",
                render_start_gains(comparison.start_gains)] if comparison.start_gains else []),
             *(["### Training signal per task", "",
                render_training_signal(comparison.signal)] if comparison.signal else []),
             "## Verdict", "",
             render_verdict(checks) if checks else "No MT-GRPO method was run.\n",
             *(["## Signal and noise", "", noise] if noise else []),
             "## Figures", ""]
    for path in figures.written:
        caption = _FIGURE_CAPTIONS.get(path.stem, path.stem.replace("_", " "))
        parts += [f"{caption}:", "", f"![{caption}]({FIGURES_DIR}/{path.name})", ""]
    parts += [f"- left out: {reason}" for reason in figures.skipped]
    parts += ["", "## Per seed", ""]
    for seed, table in comparison.per_seed.items():
        parts += [f"### Seed {seed}", "", table.to_markdown()]
    return parts


# ----------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 every run finished, 1 a run failed, 2 invalid options or config."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        options = parse_options(argv)
        if not options.dry_run:
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
            for noisy in ("httpx", "urllib3", "filelock", "datasets", "transformers"):
                logging.getLogger(noisy).setLevel(logging.WARNING)
        result = run_grid(options)
    except (ValueError, FileNotFoundError) as error:
        print(f"mtgrpo_vs_baselines: {error}", file=sys.stderr)
        return 2
    if result.results is not None:
        print(f"results: {result.results}")
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
