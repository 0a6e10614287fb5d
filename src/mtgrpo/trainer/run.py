"""A whole run from a :class:`~mtgrpo.config.RunConfig` (what ``mtgrpo train CONFIG.yaml`` does).

The ``tasks`` section (:class:`~mtgrpo.tasks.TasksConfig`) builds a task suite; with one, the
reward routing defaults to each task's own reward (1.0 correct, 0.1 well formatted, 0
otherwise) and a ``rewards`` section adds to it (a list applies to every task, a mapping to the
tasks it names). Without a suite, ``data.train`` / ``data.eval`` name files or hub datasets and
``rewards`` is required. The ``sft`` section (:class:`~mtgrpo.sft.WarmStartConfig`) runs a
supervised warm start on generated solutions before GRPO (see ``mtgrpo sft``). Every section
was validated when the configuration was built.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mtgrpo._config_types import build_section
from mtgrpo.config import RewardsConfig, RunConfig
from mtgrpo.tasks import TasksConfig

logger = logging.getLogger(__name__)

__all__ = [
    "build_suite",
    "build_trainer",
    "held_out_suite",
    "prepare_model",
    "replaced_items",
    "run_inputs",
    "run_training",
    "trained_problems",
]

def build_suite(tasks: TasksConfig | Mapping[str, Any], **overrides: Any) -> Any:
    """The :class:`~mtgrpo.tasks.TaskSuite` of a ``tasks`` section (``overrides``: other values
    of some options)."""
    config = tasks if isinstance(tasks, TasksConfig) else build_section(TasksConfig, tasks,
                                                                        "tasks")
    return config.build_suite(**overrides)


def _merge_rewards(routing: dict[str, list[Any]],
                   extra: RewardsConfig | None) -> dict[str, list[Any]]:
    merged = {task: list(fns) for task, fns in routing.items()}
    if extra is None:
        return merged
    for task, fns in extra.by_task.items():
        merged.setdefault(task, []).extend(fns)
    if extra.every_task:
        merged.setdefault("*", []).extend(extra.every_task)
    return merged


def _load(run: RunConfig, source: Any, split: str) -> Any:
    """Rows of ``source`` through ``data.loader`` when one is set (else the source itself)."""
    if source is None or run.data.loader is None:
        return source
    from mtgrpo.algo.registry import import_object

    return import_object(run.data.loader)(source, split=split, **run.data.loader_options)


def _eval_rows(run: RunConfig, suite: Any) -> Any:
    if run.environments is not None:
        return run.environments.eval_rows()
    if run.tasks is not None and run.tasks.paper_test_sets:
        from mtgrpo.tasks import load_paper_test_sets

        return load_paper_test_sets(run.tasks.paper_test_sets, tasks=suite.task_ids,
                                    per_task=run.tasks.paper_test_per_task)
    if run.data.eval is not None:
        return _load(run, run.data.eval, run.data.eval_split or "test")
    return suite.eval if suite is not None else None


def _task_corpus(suite: Any, per_task: int) -> list[str]:
    """Texts of the suite's training problems (questions and gold answers) for a vocabulary."""
    from mtgrpo.tasks import is_conversational

    texts = []
    for task in suite.task_ids:
        data = suite.train.task(task)
        for i in range(min(per_task, len(data))):
            row = data.get(i)
            prompt = row["prompt"]
            messages = prompt if is_conversational(prompt) else [{"content": prompt}]
            texts += [m["content"] for m in messages] + [f"<answer> {row['answer']} </answer>"]
    return texts


def _environment_corpus(run: RunConfig, per_environment: int, chat_template: str) -> list[str]:
    """Texts of solved training episodes (prompts, tool calls, replies) for a vocabulary,
    rendered by the tiny model's chat template (the text does not depend on the vocabulary)."""
    from mtgrpo.models import build_tiny_tokenizer
    from mtgrpo.rollout.agent.demonstrations import demonstration_example

    assert run.environments is not None
    tokenizer = build_tiny_tokenizer(chat_template=chat_template)
    seen: dict[str, int] = {}
    texts = []
    for row in run.environments.train_rows():
        name = row["environment"]
        spec = run.environments.specs[name]
        if seen.get(name, 0) >= per_environment or spec.demonstration is None:
            continue
        seen[name] = seen.get(name, 0) + 1
        example = demonstration_example(spec, row, tokenizer,
                                        run.training.rollout.chat_template_kwargs)
        texts.append(example["prompt"] + example["completion"])
    if not texts:
        raise ValueError("tiny_options.vocab_size learns a vocabulary from solved episodes, "
                         "but no environment has a demonstration; drop vocab_size")
    return texts


def prepare_model(run: RunConfig, suite: Any = None) -> str:
    """The model to train: builds the tiny local model once when ``model.tiny`` is set.

    ``model.tiny_options`` are :func:`mtgrpo.models.build_tiny_model`'s keywords; with
    ``vocab_size`` and a task suite, the vocabulary is learned from the suite's training
    problems (``corpus_per_task`` of each, default 500); with an environments section, from
    that many solved training episodes of each environment.
    """
    name = run.model.name_or_path
    if not name:
        raise ValueError("the config has no model; set model.name_or_path (or model: NAME)")
    if run.model.tiny:
        from mtgrpo.models import ensure_tiny_model

        options = dict(run.model.tiny_options or {})
        per_task = int(options.pop("corpus_per_task", 500))
        if options.get("vocab_size") is not None and run.environments is not None:
            if not (Path(name) / "config.json").is_file():
                options["corpus"] = _environment_corpus(
                    run, per_task, str(options.get("chat_template", "chatml")))
        elif options.get("vocab_size") is not None:
            if suite is None:
                raise ValueError("tiny_options.vocab_size learns a vocabulary from the task "
                                 "suite's problems: add a tasks section")
            if not (Path(name) / "config.json").is_file():
                options["corpus"] = _task_corpus(suite, per_task)
        ensure_tiny_model(name, **options)
    return name


def _model_kwargs(run: RunConfig) -> dict[str, Any]:
    init = dict(run.training.compute.model_init_kwargs)
    for key in ("dtype", "gguf_file", "trust_remote_code", "attn_implementation", "revision"):
        value = getattr(run.model, key)
        if value not in (None, "auto", False) and key not in init:
            init[key] = value
    return init


# Replacements allowed per warm-start position. A warm start leaves out every problem GRPO
# trains on, and a small problem space is mostly covered by those: measured on the quickstart's
# tasks, 83 % (addition), 97 % (countdown 2x20) and 73 % (countdown 3x9) of generated problems
# are among GRPO's 2,000 training problems or its evaluation problems. At 97 %, 800 draws leave
# a position unfilled with probability 0.97^800 ~ 3e-11. A problem space GRPO covers entirely
# fails after 800 draws per position, well under a second.
_WARM_START_RETRIES = 799


def _warm_start_rows(run: RunConfig, suite: Any, per_task: int, offset: int,
                     tasks: Any = None) -> list[dict]:
    """Problems for the warm start (``tasks``: those of some of the suite's tasks only, the
    same rows): drawn with another seed than GRPO's (the task seed plus ``offset``) and leaving
    out, by content (a family's ``content_key``: countdown and the generic reasoning-gym
    datasets), every problem of the suite's evaluation, validation and training splits, so
    that GRPO's training accuracy is measured on problems the warm start never answered. The
    training split must exist first: this waits until it is generated (or read from the task
    cache). Families without a content key (zebra puzzles, ARC-1D: practically unique problems)
    are kept apart by their seeds (:func:`_check_seed_ranges`)."""
    from mtgrpo.tasks import GenerationError, TaskSuite

    specs = list(tasks or suite.tasks)
    families = {spec.family.name for spec in specs}
    trained = [row for spec in suite.tasks
               if spec.family.content_key is not None and spec.family.name in families
               for row in suite.train.task(spec.task_id).rows()]
    retries = max(run.tasks.max_retries, _WARM_START_RETRIES)
    # eval_size 1, no validation: the warm suite's own held-out splits are never read (its
    # evaluation split is drawn only because a content-keyed training split leaves it out)
    options = {**run.tasks.suite_options(), "seed": run.tasks.seed + offset,
               "train_size": per_task, "eval_size": 1, "validation_size": 0,
               "max_retries": retries}
    _check_seed_ranges(run, specs, per_task, offset, retries)
    held_out = [*suite.eval.rows(), *(suite.validation.rows() if suite.validation else [])]
    with TaskSuite(specs, exclude=[*held_out, *trained], **options) as warm:
        try:
            return warm.train.rows()
        except GenerationError as error:
            raise GenerationError(
                f"the warm start found too few problems outside GRPO's training and evaluation "
                f"splits ({run.tasks.train_size} and {run.tasks.eval_size} per task): {error}. "
                "For the warm start: widen that task's config, lower tasks.train_size, or raise "
                f"tasks.max_retries above {retries}") from error


def _check_seed_ranges(run: RunConfig, specs: Any, per_task: int, offset: int,
                       retries: int) -> None:
    """Families without a content key are kept apart from GRPO's problems by their seeds only:
    reasoning-gym draws item ``i`` of seed ``s`` from ``Random(s + i)``, so the warm start's
    source indices (from ``seed + offset``) must not reach GRPO's training ones (from ``seed``,
    up to ``(max_retries + 1) * train_size``) nor its evaluation ones (from ``seed`` plus the
    split stride)."""
    from mtgrpo.tasks.suite import SPLIT_SEED_STRIDE

    keyless = [spec.task_id for spec in specs if spec.family.content_key is None]
    grpo_span = (run.tasks.max_retries + 1) * run.tasks.train_size
    warm_end = offset + (retries + 1) * per_task
    if keyless and (offset < grpo_span or warm_end > SPLIT_SEED_STRIDE):
        raise ValueError(
            f"sft.seed_offset={offset} would let the warm start of {', '.join(keyless)} repeat "
            f"GRPO's problems: GRPO's training split draws {grpo_span} source indices "
            f"(tasks.train_size x (tasks.max_retries + 1)) and the warm start's end at "
            f"{warm_end}, past the evaluation split's at {SPLIT_SEED_STRIDE}; set sft.seed_offset "
            f"between {grpo_span} and {SPLIT_SEED_STRIDE - (retries + 1) * per_task}")


# Replacements allowed per held-out position when seen problems are excluded: a small problem
# space (two-digit addition) repeats ~19 % of 2,000 training problems in 800 others, so the
# suite's default of 3 would fail about one position in 800; 10 fails one in ~10⁸.
_HELD_OUT_RETRIES = 10


def trained_problems(run: RunConfig, tasks: Any = None) -> list[dict]:
    """Every problem a run config trains on: the rows of its training split and of its warm
    start (the ``sft`` section), for the tasks of content-keyed families (countdown and the
    generic reasoning-gym datasets; others cannot be matched by content) of the families of
    ``tasks`` (task ids; default: all of the ``tasks`` section's)."""
    from mtgrpo.tasks import TaskSuite

    if run.tasks is None:
        raise ValueError("the config has no tasks section: its training problems are its data")
    with TaskSuite(run.tasks.task_list, **run.tasks.suite_options()) as trained:
        wanted = trained.task_ids if tasks is None else list(tasks)
        # problems are matched by family, so a wanted task's siblings of the same family count
        families = {spec.family.name for spec in trained.tasks if spec.task_id in wanted}
        keyed = [spec for spec in trained.tasks
                 if spec.family.name in families and spec.family.content_key is not None]
        rows = [row for spec in keyed for row in trained.train.task(spec.task_id).rows()]
        if run.sft is not None and keyed:
            rows += _warm_start_rows(run, trained, run.sft.num_examples, run.sft.seed_offset,
                                     keyed)
    return rows


def held_out_suite(run: RunConfig, tasks: Any = None, progress: Any = logger.info,
                   **overrides: Any) -> Any:
    """The task suite to evaluate a model that ``run`` trained: its ``tasks`` section (``tasks``:
    some of its task ids; ``overrides``: other suite options, such as a larger ``eval_size``,
    another ``seed`` or other formats) whose evaluation split holds no problem the run trained
    on. The run's own held-out split (its seed, at most its ``eval_size`` items) is disjoint
    from its training and warm-start problems by construction when no two of its tasks share a
    family, and is then returned as it is; any other held-out split (or that of a run with
    two tasks of one family, whose training splits only leave out their own task's) is
    drawn with each of those problems replaced (content-keyed families; see
    :func:`trained_problems`), which in a small problem space is ~10-20 % of the items past the
    run's own. ``suite.eval`` rows whose ``source_index`` differs from their position are the
    replaced ones (:func:`replaced_items`). ``progress`` is told when the run's problems are
    gathered (generating a large training split that is not cached takes minutes)."""
    from mtgrpo.tasks import TaskSuite, resolve_task

    if run.tasks is None:
        raise ValueError("the config has no tasks section to evaluate on; use --tasks or --data")
    config = run.tasks
    own = {spec.task_id: spec for spec in map(resolve_task, config.task_list)}
    wanted = list(own) if tasks is None else list(dict.fromkeys(tasks))
    unknown = [task for task in wanted if task not in own]
    if unknown or not wanted:
        raise ValueError(f"{', '.join(unknown) or 'no task'} is not a task of this config; its "
                         f"tasks are {', '.join(own)} (name some of them, comma-separated)")
    options = {**config.suite_options(), "train_size": 1, **overrides}
    specs = [own[task] for task in wanted]
    families = [spec.family.name for spec in own.values()]
    # a training split leaves out its own task's evaluation problems, not a sibling task's of
    # the same family: only without siblings is the run's own split clean by construction
    if (options["seed"] == config.seed and options["eval_size"] <= config.eval_size
            and len(set(families)) == len(families)):
        return TaskSuite(specs, **options)
    options["max_retries"] = max(options["max_retries"], _HELD_OUT_RETRIES)
    warm = f" and {run.sft.num_examples} of the warm start" if run.sft is not None else ""
    progress(f"a held-out split of {options['eval_size']} problems per task, seed "
             f"{options['seed']} (the run's own: {config.eval_size}, seed {config.seed}): "
             f"leaving out the problems the run trains on ({config.train_size} per task{warm}; "
             "from the task cache, or generated now)")
    return TaskSuite(specs, exclude_eval=trained_problems(run, wanted), **options)


def replaced_items(rows: Any) -> dict[str, int]:
    """``{task: rows drawn from another source index than their position}`` of a held-out
    split: problems that replaced a seen, failed or timed-out one."""
    import json

    counts: dict[str, int] = {}
    for row in rows:
        metadata = row["metadata"]
        metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
        position = int(row["id"].rsplit("/", 1)[1])
        counts[row["task"]] = counts.get(row["task"], 0) + (metadata["source_index"] != position)
    return counts


def _warm_start(run: RunConfig, model: str, suite: Any) -> str:
    """Supervised warm start on generated problems with gold answers (the ``sft`` section,
    :class:`~mtgrpo.sft.WarmStartConfig`); returns ``<output_dir>/sft/model``.

    Trained once per content into a shared cache directory that ``<output_dir>/sft`` links to
    (:mod:`mtgrpo.trainer.warm_start`): a run with the same base model contents, problem
    settings and training settings reuses it, whatever its ``output_dir``; so does a copy of a
    run directory. Runs asking for one warm start at once (a grid's parallel runs) take turns
    on a lock file beside it: one trains, the others wait and reuse its result. ``sft.reuse:
    false`` trains a new one and replaces the shared one."""
    from filelock import FileLock

    from mtgrpo.trainer.warm_start import (
        finished_warm_start,
        link_run_directory,
        warm_start_entry,
        warm_start_key,
        warm_start_settings,
    )

    settings = warm_start_settings(run, model)
    key = warm_start_key(settings)
    out = Path(run.training.output.output_dir) / "sft"
    marker = finished_warm_start(out, key) if run.sft.reuse else None
    if marker is not None:  # this run directory's own link, or a copy of a warm start
        _log_reuse(out, marker)
        return str(out / "model")
    entry = warm_start_entry(run, key)
    entry.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(entry.with_name(f"{key}.lock"))):
        # checked again under the lock: the run that held it may have trained it meanwhile
        marker = finished_warm_start(entry, key) if run.sft.reuse else None
        if marker is None:
            _train_warm_start(run, model, suite, entry, {"key": key, "settings": settings})
        else:
            _log_reuse(entry, marker)
        kept = link_run_directory(out, entry)
    if kept is not None:
        logger.info("the run directory's earlier warm start was moved to %s", kept)
    return str(out / "model")


def _log_reuse(directory: Path, marker: dict[str, Any]) -> None:
    logger.info("reusing the warm start from %s (trained for %s); to train a new one, set "
                "sft.reuse: false (--sft.reuse false) or delete that directory",
                directory.resolve(), marker.get("trained_for", "an earlier run"))


def _train_warm_start(run: RunConfig, model: str, suite: Any, entry: Path,
                      marker: dict[str, Any]) -> None:
    """Train the warm start into ``entry``, atomically: the directory appears whole, with its
    marker (``warm_start.json``: key, settings, base model, the run it was trained for)."""
    import json
    import time

    from mtgrpo._files import write_atomically
    from mtgrpo.sft import sft_train, solutions_from_rows
    from mtgrpo.trainer.warm_start import MARKER

    warm = run.sft
    if run.environments is not None:
        pairs = _demonstrations(run, model)
    else:
        rows = _warm_start_rows(run, suite, warm.num_examples, warm.seed_offset)
        pairs = solutions_from_rows(rows, warm.template, reasoning=warm.reasoning)
    logger.info("supervised warm start on %d solved problems -> %s", len(pairs), entry)
    marker = {**marker, "model": model,
              "trained_for": str(Path(run.training.output.output_dir).resolve()),
              "trained_at": time.strftime("%Y-%m-%d %H:%M:%S")}

    def train(directory: Path) -> None:
        config = warm.sft_config(str(directory), seed=run.training.schedule.seed)
        sft_train(model, None, pairs, config, peft_config=warm.lora)
        (directory / MARKER).write_text(json.dumps(marker, indent=2), encoding="utf-8")

    write_atomically(entry, train)


def _demonstrations(run: RunConfig, model: str) -> list[dict[str, Any]]:
    """The warm start of an environments run: ``sft.num_examples`` episodes per environment
    (none of them a training or evaluation one), each solved by its environment's
    demonstration and rendered by the model's chat template as the tool loop renders it."""
    from mtgrpo.models import load_tokenizer
    from mtgrpo.rollout.agent.demonstrations import demonstration_example

    assert run.environments is not None
    assert run.sft is not None
    tokenizer = load_tokenizer(model)
    rows = run.environments.warm_start_rows(run.sft.num_examples, run.sft.seed_offset)
    return [demonstration_example(run.environments.specs[row["environment"]], row, tokenizer,
                                  run.training.rollout.chat_template_kwargs) for row in rows]


def run_inputs(run: RunConfig, suite: Any = None) -> tuple[Any, Any]:
    """``(rewards, train_dataset)`` of a run config: the task suite's routed rewards (merged
    with the ``rewards`` section) and its training stream, started now so that problems are
    generated while anything else (a warm start) runs; or, without a suite, the ``rewards``
    section and ``data.train``."""
    if suite is not None:
        return _merge_rewards(suite.reward_routing, run.rewards), suite.train.start()
    if run.environments is not None:  # the environments' get_reward channels score them
        return run.rewards, run.environments.train_rows()
    if run.data.train is None or run.rewards is None:
        raise ValueError("without a tasks section the config needs data.train and rewards")
    return run.rewards, _load(run, run.data.train, run.data.split)


def build_trainer(run: RunConfig, model: Any, rewards: Any, train: Any,
                  suite: Any = None) -> Any:
    """The :class:`~mtgrpo.trainer.GRPOTrainer` a run config describes, on ``model`` (a name,
    a path or a module), with ``rewards`` and ``train`` from :func:`run_inputs`, the
    held-out set of ``suite`` (or of ``data.eval``) and its validation split
    (``tasks.validation_size``; what ``task_weighting_signal: validation`` reads)."""
    from mtgrpo.trainer import GRPOTrainer

    args = run.training
    args.compute.model_init_kwargs = _model_kwargs(run)
    return GRPOTrainer(
        model, rewards, args=args, train_dataset=train, eval_dataset=_eval_rows(run, suite),
        peft_config=run.peft, run_config=run.to_dict(),
        validation_dataset=suite.validation if suite is not None else None,
        environment_factory=None if run.environments is None else run.environments.factories(),
    )


def run_training(run: RunConfig) -> dict[str, Any]:
    """Build everything a run config describes, train, and write the report."""
    from mtgrpo.models import release_memory

    suite = run.tasks.build_suite() if run.tasks is not None else None
    try:
        model = prepare_model(run, suite)
        rewards, train = run_inputs(run, suite)
        if run.sft is not None:
            if suite is None and run.environments is None:
                raise ValueError("the sft section warm-starts on a task suite's gold answers "
                                 "or on environments' demonstrations; add a tasks or an "
                                 "environments section, or run `mtgrpo sft --data FILE` first")
            model = _warm_start(run, model, suite)
            release_memory()  # the fine-tuned model and its optimizer state are gone: hand back
        trainer = build_trainer(run, model, rewards, train, suite)
        metrics = trainer.train()
    finally:
        if suite is not None:
            suite.close()
    return metrics  # train() wrote the report and printed the summary (report_at_end)
