"""A whole run from a :class:`~mtgrpo.config.RunConfig` (what ``mtgrpo train CONFIG.yaml`` does).

The ``tasks`` section builds a task suite (:class:`mtgrpo.tasks.TaskSuite`)::

    tasks:
      suite: mtgrpo3                 # or: tasks: [countdown:easy, zebra_puzzles:easy, ...]
      train_size: 2000               # items per task (generated lazily, cached on disk)
      eval_size: 100
      seed: 0
      prompt_format: chat            # plain | chat | paper
      answer_format: answer_tag      # answer_tag | boxed
      think_prefix: false
      reward_scheme: {correct: 1.0, formatted: 0.1, unformatted: 0.0}
      paper_test_sets: null          # a directory of the papers' released test sets: eval on them
      paper_test_per_task: 200

With a suite, the reward routing defaults to each task's own reward (1.0 correct, 0.1 well
formatted, 0 otherwise); a ``rewards`` section adds to it (a list applies to every task, a
mapping to the tasks it names). Without a suite, ``data.train`` / ``data.eval`` name files or
hub datasets and ``rewards`` is required.

The ``sft`` section runs a supervised warm start on generated solutions before GRPO (see
``mtgrpo sft``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from mtgrpo.config import RunConfig

logger = logging.getLogger(__name__)

__all__ = ["build_suite", "prepare_model", "run_training"]

_SUITE_OPTIONS = ("train_size", "eval_size", "seed", "prompt_format", "answer_format",
                  "think_prefix", "system_prompt", "workers", "cache_dir", "item_timeout_s",
                  "max_retries")
_TASK_KEYS = (*_SUITE_OPTIONS, "suite", "tasks", "reward_scheme", "paper_test_sets",
              "paper_test_per_task")


def build_suite(spec: dict[str, Any]) -> Any:
    """The :class:`~mtgrpo.tasks.TaskSuite` of a ``tasks`` section."""
    from mtgrpo.tasks import RewardScheme, TaskSuite

    unknown = sorted(set(spec) - set(_TASK_KEYS))
    if unknown:
        raise ValueError(f"unknown tasks option(s) {unknown}; valid: {', '.join(_TASK_KEYS)}")
    if ("suite" in spec) == ("tasks" in spec):
        raise ValueError("the tasks section needs exactly one of 'suite' (a name such as "
                         "mtgrpo3) or 'tasks' (a list of task ids)")
    options = {k: spec[k] for k in _SUITE_OPTIONS if k in spec}
    if "reward_scheme" in spec:
        options["reward_scheme"] = RewardScheme(**spec["reward_scheme"])
    if "suite" in spec:
        return TaskSuite.from_name(spec["suite"], **options)
    return TaskSuite(spec["tasks"], **options)


def _merge_rewards(routing: dict[str, list[Any]], extra: Any) -> dict[str, list[Any]]:
    merged = {task: list(fns) for task, fns in routing.items()}
    if extra is None:
        return merged
    if isinstance(extra, dict):
        for task, fns in extra.items():
            merged.setdefault(task, []).extend(fns if isinstance(fns, list) else [fns])
        return merged
    merged.setdefault("*", []).extend(extra if isinstance(extra, list) else [extra])
    return merged


def _load(run: RunConfig, source: Any, split: str) -> Any:
    """Rows of ``source`` through ``data.loader`` when one is set (else the source itself)."""
    if source is None or run.data.loader is None:
        return source
    from mtgrpo._registry import import_object

    return import_object(run.data.loader)(source, split=split, **run.data.loader_options)


def _eval_rows(run: RunConfig, suite: Any) -> Any:
    tasks = run.tasks or {}
    paper = tasks.get("paper_test_sets")
    if paper:
        from mtgrpo.tasks import load_paper_test_sets

        return load_paper_test_sets(paper, tasks=suite.task_ids,
                                    per_task=tasks.get("paper_test_per_task"))
    if run.data.eval is not None:
        return _load(run, run.data.eval, run.data.eval_split or "test")
    return suite.eval if suite is not None else None


def _task_corpus(suite: Any, per_task: int) -> list[str]:
    """Texts of the suite's training problems (questions and gold answers) for a vocabulary."""
    from mtgrpo.tasks.prompt_set import is_conversational

    texts = []
    for task in suite.task_ids:
        data = suite.train.task(task)
        for i in range(min(per_task, len(data))):
            row = data.get(i)
            prompt = row["prompt"]
            messages = prompt if is_conversational(prompt) else [{"content": prompt}]
            texts += [m["content"] for m in messages] + [f"<answer> {row['answer']} </answer>"]
    return texts


def prepare_model(run: RunConfig, suite: Any = None) -> str:
    """The model to train: builds the tiny local model once when ``model.tiny`` is set.

    ``model.tiny_options`` are :func:`mtgrpo.models.build_tiny_model`'s keywords; with
    ``vocab_size`` and a task suite, the vocabulary is learned from the suite's training
    problems (``corpus_per_task`` of each, default 500).
    """
    name = run.model.name_or_path
    if not name:
        raise ValueError("the config has no model; set model.name_or_path (or model: NAME)")
    if run.model.tiny:
        from mtgrpo.models import ensure_tiny_model

        options = dict(run.model.tiny_options or {})
        per_task = int(options.pop("corpus_per_task", 500))
        if options.get("vocab_size") is not None:
            if suite is None:
                raise ValueError("tiny_options.vocab_size learns a vocabulary from the task "
                                 "suite's problems: add a tasks section")
            if not (Path(name) / "config.json").is_file():
                options["corpus"] = _task_corpus(suite, per_task)
        ensure_tiny_model(name, **options)
    return name


def _model_kwargs(run: RunConfig) -> dict[str, Any]:
    init = dict(run.training.model_init_kwargs)
    for key in ("dtype", "gguf_file", "trust_remote_code", "attn_implementation", "revision"):
        value = getattr(run.model, key)
        if value not in (None, "auto", False) and key not in init:
            init[key] = value
    return init


_SFT_DATA_KEYS = ("num_examples", "template", "reasoning", "lora", "seed_offset")


def _warm_start_rows(run: RunConfig, suite: Any, per_task: int, offset: int) -> list[dict]:
    """Problems for the warm start: generated with another seed than GRPO's training problems
    (so GRPO trains on problems the warm start never answered) and excluding every problem of
    the evaluation split."""
    from mtgrpo.tasks import TaskSuite

    spec = dict(run.tasks or {})
    options = {k: spec[k] for k in _SUITE_OPTIONS if k in spec}
    options.update(seed=int(spec.get("seed", 0)) + offset, train_size=per_task,
                   eval_size=int(spec.get("eval_size", 200)))
    with TaskSuite(suite.tasks, exclude=suite.eval.rows(), **options) as warm:
        return warm.train.rows()


def _warm_start(run: RunConfig, model: str, suite: Any) -> str:
    """Supervised warm start on generated problems with gold answers.

    The ``sft`` section holds ``num_examples`` (per task, default 256), ``template`` and
    ``reasoning`` (see ``mtgrpo sft``), ``lora`` (a LoRA config to train and merge, default
    full fine-tuning), ``seed_offset`` (the warm start's problems come from the task seed plus
    this, default 1,000,003: other problems than GRPO trains on, none of the evaluation
    split's) and any :class:`~mtgrpo.sft.SFTConfig` field. The result is cached in
    ``<output_dir>/sft``: a finished warm start with the same settings is reused.
    """
    import json

    from mtgrpo.sft import SFTConfig, sft_train, solutions_from_rows

    spec = dict(run.sft or {})
    data = {k: spec.pop(k) for k in _SFT_DATA_KEYS if k in spec}
    out = Path(run.training.output_dir) / "sft"
    config = SFTConfig.from_dict({"output_dir": str(out), "overwrite_output_dir": True,
                                  "seed": run.training.seed, **spec})
    fingerprint = {"model": model, "config": config.to_dict(), "data": data,
                   "tasks": run.tasks}
    done = out / "warm_start.json"
    if done.is_file() and json.loads(done.read_text()) == fingerprint:
        logger.info("reusing the warm start in %s", out)
        return str(out / "model")
    rows = _warm_start_rows(run, suite, int(data.get("num_examples", 256)),
                            int(data.get("seed_offset", 1_000_003)))
    pairs = solutions_from_rows(rows, data.get("template", "think_answer"),
                                reasoning=data.get("reasoning", "restate"))
    lora = data.get("lora")
    if lora is not None:
        config = SFTConfig.from_dict({**config.to_dict(), "merge_lora": True})
    logger.info("supervised warm start on %d solved problems -> %s", len(pairs), out)
    result = sft_train(model, None, pairs, config, peft_config=lora)
    done.write_text(json.dumps(fingerprint))
    return str(result.model_dir)


def run_training(run: RunConfig) -> dict[str, Any]:
    """Build everything a run config describes, train, and write the report."""
    from mtgrpo.trainer import GRPOTrainer

    args = run.training
    suite = build_suite(run.tasks) if run.tasks else None
    try:
        model = prepare_model(run, suite)
        if suite is not None:
            rewards = _merge_rewards(suite.reward_routing, run.rewards)
            train = suite.train.start()
        else:
            if run.data.train is None or run.rewards is None:
                raise ValueError("without a tasks section the config needs data.train and "
                                 "rewards")
            rewards, train = run.rewards, _load(run, run.data.train, run.data.split)
        if run.sft:
            if suite is None:
                raise ValueError("the sft section warm-starts on a task suite's gold answers; "
                                 "add a tasks section, or run `mtgrpo sft --data FILE` first")
            model = _warm_start(run, model, suite)
        args.model_init_kwargs = _model_kwargs(run)
        trainer = GRPOTrainer(
            model, rewards, args=args, train_dataset=train, eval_dataset=_eval_rows(run, suite),
            peft_config=run.peft, run_config=run.to_dict(),
        )
        metrics = trainer.train()
    finally:
        if suite is not None:
            suite.close()
    if trainer.is_main_process:
        _write_report(Path(args.output_dir))
    return metrics


def _write_report(run_dir: Path) -> None:
    from mtgrpo.reporting import plot_run

    try:
        written = plot_run(run_dir, run_dir / "report")
        logger.info("report figures: %s", ", ".join(str(p) for p in written))
    except (ValueError, FileNotFoundError) as exc:  # a run too short to plot is not an error
        logger.warning("no report figures: %s", exc)
