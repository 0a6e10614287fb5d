"""Per-task evaluation: accuracy, worst task, average, Δm% (ALGORITHMS.md §6).

For every test prompt ``n`` completions are sampled (paper: ``n = 8`` at temperature 1.0);
a task's accuracy is the mean 0/1 correctness over its prompts' samples. Worst-task and average
accuracy, and Δm% against a baseline, follow :mod:`mtgrpo.algo.metrics` (the rules every report
uses). ``format_rate`` is the fraction of completions whose accuracy reward is above 0: under
the papers' scheme (1.0 correct, 0.1 wrong but in the expected answer tag, 0 otherwise) that is
"the answer was where it should be".

Two figures tell a task learned from a reward earned without solving it
(:func:`answer_concentration`): ``top_answer_share``, the share of completions that give the
task's most common answer, and ``constant_baseline``, the accuracy of always giving the most
common gold answer (the share of prompts whose gold answer it is). A policy that answers "1" to
every "how many times does the letter ... appear" question scores 54 % where 54 % of the gold
answers are "1"; :func:`answer_warnings` says so.

The trainer's periodic evaluation and ``mtgrpo eval`` run the same code
(:func:`evaluate_prompts`); generation and scoring reuse the trainer's rollout worker.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mtgrpo._progress import accuracy_status, progress
from mtgrpo.algo.metrics import scalar_rewards, task_accuracy, worst_and_average

__all__ = ["EvaluationResult", "TaskResult", "answer_concentration", "answer_warnings",
           "evaluate_prompts", "run_evaluation"]

# answer_warnings: a task needs this many prompts to be judged; a policy has collapsed onto one
# answer when at least COLLAPSE_SHARE of its completions give it, COLLAPSE_MARGIN more than the
# share of the task's problems whose gold answer is the most common one; a constant answer is
# worth stating when it scores at least FLOOR_MIN.
MIN_PROMPTS = 20
COLLAPSE_SHARE = 0.8
COLLAPSE_MARGIN = 0.2
FLOOR_MIN = 0.2


@dataclass(frozen=True)
class TaskResult:
    """One task's evaluation (means over ``prompts × samples`` completions)."""

    task: str
    prompts: int
    samples: int
    accuracy: float
    mean_reward: float
    format_rate: float
    mean_length: float
    top_answer: str | None = None  # the answer completions give most often (None: none given)
    top_answer_share: float = math.nan  # its share of all the task's completions
    top_answer_gold_share: float = math.nan  # the share of the task's prompts whose gold it is
    constant_baseline: float = math.nan  # accuracy of always giving the commonest gold answer
    baseline_answer: str | None = None  # that gold answer


@dataclass
class EvaluationResult:
    """Per-task results plus the worst task and the average (:mod:`mtgrpo.algo.metrics`: defined
    when every task has an accuracy; NaN and no worst task otherwise)."""

    tasks: dict[str, TaskResult]
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    groups: list[Any] = field(default_factory=list, repr=False)  # the scored groups
    tools: dict[str, float] = field(default_factory=dict)  # tool-call and failure rates

    def _summary(self) -> tuple[float, float, str | None]:
        accuracy = np.array([r.accuracy for r in self.tasks.values()], dtype=np.float64)  # [K]
        # ALGORITHMS.md §6: worst = min over tasks, average = mean over tasks
        worst, average, index = worst_and_average(accuracy)
        # index -1: some task has no accuracy, so no task is the worst
        return float(worst), float(average), list(self.tasks)[index] if index >= 0 else None

    @property
    def worst_task(self) -> str | None:
        return self._summary()[2]

    @property
    def worst_accuracy(self) -> float:
        return self._summary()[0]

    @property
    def average_accuracy(self) -> float:
        return self._summary()[1]

    def metrics(self) -> dict[str, Any]:
        """Flat metrics with the keys of ``metrics.jsonl`` (``tasks/<task>/accuracy``, ...)."""
        out: dict[str, Any] = {}
        for name, result in self.tasks.items():
            for key in ("accuracy", "mean_reward", "format_rate", "mean_length",
                        "top_answer_share", "constant_baseline"):
                out[f"tasks/{name}/{key}"] = getattr(result, key)
        out.update({
            "accuracy/worst": self.worst_accuracy, "accuracy/average": self.average_accuracy,
            "accuracy/worst_task": self.worst_task, "time/eval": self.seconds,
        })
        out.update(self.tools)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "tasks": {name: asdict(result) for name, result in self.tasks.items()},
            "worst_accuracy": self.worst_accuracy, "worst_task": self.worst_task,
            "average_accuracy": self.average_accuracy, "seconds": self.seconds, **self.extra,
            **({"tools": self.tools} if self.tools else {}),
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2))
        return path

    @classmethod
    def load(cls, path: str | Path) -> EvaluationResult:
        """Read a results file written by :meth:`save` (``mtgrpo eval``'s ``results.json``)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no evaluation results at {str(path)!r}")
        raw = json.loads(path.read_text())
        if "tasks" not in raw:
            raise ValueError(f"{path} is not an evaluation results file (no 'tasks' key)")
        return cls({name: TaskResult(**r) for name, r in raw["tasks"].items()},
                   seconds=raw.get("seconds", 0.0), tools=dict(raw.get("tools") or {}))


def answer_concentration(prompts: Any, groups: Any) -> dict[int, dict[str, Any]]:
    """Per task index: how concentrated the completions' answers and the gold answers are.

    ``top_answer`` / ``top_answer_share``: the answer the task's completions give most often
    (read in each row's ``answer_format``, ``answer_tag`` by default, stripped) and its share of
    all the task's completions (those without an answer count in the total);
    ``top_answer_gold_share``: the share of the task's prompts whose gold answer (the row's
    ``answer`` column) it is. ``baseline_answer`` / ``constant_baseline``: the most common gold
    answer (among tied ones the top answer, if it is one) and the share of the task's prompts
    that have it, i.e. the accuracy of a policy that always gives it when answers are graded by
    matching. Gold figures need every prompt's gold answer. Missing figures are ``None`` / NaN.
    """
    from mtgrpo.rewards import completion_text
    from mtgrpo.tasks import ANSWER_FORMATS
    from mtgrpo.tasks.rewards import _parse_metadata

    given: dict[int, Counter[str]] = {}
    gold: dict[int, Counter[str]] = {}
    completions: Counter[int] = Counter()
    prompts_seen: Counter[int] = Counter()
    for group in groups:
        payload = getattr(group, "payload", None)
        if payload is None:
            continue
        row = prompts.row(group.prompt_id)
        k = group.task
        try:
            metadata = _parse_metadata(row.get("metadata"), group.prompt_id, "evaluation")
        except ValueError:  # metadata that is not a JSON object: the default format
            metadata = {}
        name = metadata.get("answer_format", "answer_tag")
        try:  # a row in a format of the user's own has no answer read here
            answer_format = ANSWER_FORMATS.get(name) if isinstance(name, str) else None
        except (LookupError, ValueError):
            answer_format = None
        counts = given.setdefault(k, Counter())
        for completion in payload.completions:
            answer = answer_format.extract(completion_text(completion)) if answer_format else None
            if answer and answer.strip():
                counts[answer.strip()] += 1
        completions[k] += len(payload.completions)
        prompts_seen[k] += 1
        if row.get("answer") is not None:
            gold.setdefault(k, Counter())[str(row["answer"]).strip()] += 1
    out = {}
    for k, total in completions.items():
        top = given[k].most_common(1)
        answer = top[0][0] if top else None
        figures: dict[str, Any] = {
            "top_answer": answer,
            "top_answer_share": top[0][1] / total if top and total else math.nan,
            "top_answer_gold_share": math.nan, "baseline_answer": None,
            "constant_baseline": math.nan,
        }
        counts = gold.get(k, Counter())
        # a share over only the prompts that have a gold answer would misstate the floor
        if counts and sum(counts.values()) == prompts_seen[k]:
            best = max(counts.values())
            figures["baseline_answer"] = answer if counts.get(answer) == best else \
                counts.most_common(1)[0][0]
            figures["constant_baseline"] = best / prompts_seen[k]
            if answer is not None:
                figures["top_answer_gold_share"] = counts.get(answer, 0) / prompts_seen[k]
        out[k] = figures
    return out


def answer_warnings(result: EvaluationResult,
                    min_prompts: int = MIN_PROMPTS) -> list[tuple[str, str, str]]:
    """What the evaluation's answers say about a task learned without solving it: a policy
    collapsed onto one answer (at least ``COLLAPSE_SHARE`` of the completions give it, at least
    ``COLLAPSE_MARGIN`` more than the share of the problems whose gold answer it is), or an
    accuracy no better than always giving the most common gold answer (within twice the
    standard error of the completions scored, where that constant scores ``FLOOR_MIN`` or more).
    Tasks with fewer than ``min_prompts`` prompts, or without gold answers, are not judged.
    Returns ``(task, kind, message)`` triples, ``kind`` ``"collapse"`` or ``"floor"``."""
    lines = []
    for name, r in result.tasks.items():
        if r.prompts < min_prompts:
            continue
        gold = r.top_answer_gold_share  # NaN without gold answers: no verdict
        if (r.top_answer is not None and r.top_answer_share >= COLLAPSE_SHARE
                and r.top_answer_share >= gold + COLLAPSE_MARGIN):
            lines.append((name, "collapse",
                f"{name}: {100 * r.top_answer_share:.1f} % of the completions answer "
                f"{r.top_answer!r} and {100 * gold:.1f} % of its problems have that answer: "
                "the policy has collapsed onto one answer; the "
                "reward is earned without solving the task (use problems whose answers vary "
                "more, or lower the task's weight)"))
        if not math.isfinite(r.constant_baseline) or r.constant_baseline < FLOOR_MIN:
            continue
        # two binomial standard errors, sqrt(b(1 - b)/n), of a mean of n 0/1 scores at rate b
        b, n = r.constant_baseline, r.prompts * r.samples
        if r.accuracy <= b + 2 * math.sqrt(b * (1 - b) / n):
            lines.append((name, "floor",
                f"{name}: accuracy {100 * r.accuracy:.1f} % is no better than always answering "
                f"{r.baseline_answer!r} ({100 * b:.1f} % of its {r.prompts} problems have that "
                "gold answer); read its gains against that floor"))
    return lines


def _chunks(n: int, size: int) -> list[list[int]]:
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


def evaluate_prompts(
    prompts: Any,
    backend: Any,
    rewards: Any,
    params: Any,
    num_samples: int,
    tokenizer: Any,
    *,
    accuracy_threshold: float = 1.0,
    accuracy_channel: int | None = None,
    shard: Any = None,
    prompts_per_call: int = 64,
    extra: dict[str, Any] | None = None,
    estimate: Any = None,
    agent: Any = None,
) -> EvaluationResult:
    """Sample ``num_samples`` completions per prompt of ``prompts`` (a
    :class:`~mtgrpo.tasks.PromptSet`) and score them with ``rewards`` (``extra``: the
    keyword arguments every reward call also gets, e.g. TRL's ``trainer_state``; ``estimate``:
    the advantage estimator, see :class:`~mtgrpo.rollout.RolloutWorker`; ``agent``: the
    multi-turn tool loop, :class:`~mtgrpo.rollout.agent.AgentRollouts`, for a policy that
    calls tools)."""
    from mtgrpo.rollout import RolloutWorker

    worker = RolloutWorker(
        prompts, backend, rewards, params, num_samples, tokenizer,
        accuracy_threshold=accuracy_threshold, accuracy_channel=accuracy_channel, shard=shard,
        extra=extra, estimate=estimate, agent=agent,
    )
    begin = time.perf_counter()
    # a bar (plain lines in a log): a few hundred prompts at 8 samples take minutes; one
    # process of several shows it
    unit = f"prompts ({num_samples} sample{'s' if num_samples > 1 else ''} each)"
    with progress("eval", len(prompts), unit=unit,
                  enabled=getattr(shard, "rank", 0) == 0) as phase:
        groups: list[Any] = []
        for chunk in _chunks(len(prompts), prompts_per_call):
            groups.extend(worker(chunk))
            phase.update(advance=len(chunk))
        result = EvaluationResult(
            _task_results(prompts, groups, rewards, num_samples, accuracy_channel),
            seconds=time.perf_counter() - begin, groups=groups, tools=worker.tool_metrics())
        # the last line in a log, and the enclosing GRPO bar's "eval:" status
        phase.summary = accuracy_status("eval", result.worst_accuracy, result.worst_task,
                                        result.average_accuracy)
    return result


def _task_results(prompts: Any, groups: list[Any], rewards: Any, num_samples: int,
                  accuracy_channel: int | None) -> dict[str, TaskResult]:
    """Each task's :class:`TaskResult` from the scored groups."""

    from mtgrpo.rewards.accuracy import accuracy_values

    group_tasks = np.array([g.task for g in groups], dtype=np.int64)
    # [n] task of each completion: a group holds its prompt's num_samples completions in order
    rows = np.repeat(group_tasks, num_samples)
    accuracy = task_accuracy(rows, np.concatenate([g.correct for g in groups]) if groups
                             else np.zeros(0, dtype=bool), prompts.num_tasks)  # [K]
    concentration = answer_concentration(prompts, groups)
    results = {}
    for k, name in enumerate(prompts.task_names):
        mine = [g for g in groups if g.task == k]
        if not mine:
            continue
        values = np.concatenate([g.rewards for g in mine])  # [n, R]
        # NaN for a completion no reward applies to: left out of the mean below, as TRL 1.16
        # logs it (algo.metrics.scalar_rewards)
        scalar = scalar_rewards(values, np.asarray(rewards.reward_weights, dtype=np.float64))
        accuracy_value = accuracy_values(values, accuracy_channel)
        # tokens the model sampled; tool replies of a multi-turn rollout not counted
        lengths = [n for g in mine for n in g.payload.model_token_counts]
        results[name] = TaskResult(
            task=name, prompts=len(mine), samples=num_samples, accuracy=float(accuracy[k]),
            mean_reward=float(np.nanmean(scalar)) if np.isfinite(scalar).any() else math.nan,
            # above 0 is the papers' 0.1 "wrong but in the expected tag" or better
            # (ALGORITHMS.md §6); a NaN (the reward did not apply) counts as unformatted
            format_rate=float((np.nan_to_num(accuracy_value, nan=0.0) > 0).mean()),
            mean_length=float(np.mean(lengths)), **concentration.get(k, {}),
        )
    return results


def run_evaluation(
    model: Any,
    rows: Any,
    rewards: Any,
    *,
    # ALGORITHMS.md §6: the paper samples 8 completions per test prompt at temperature 1.0
    num_samples: int = 8,
    temperature: float = 1.0,
    max_new_tokens: int = 512,
    top_p: float = 1.0,
    backend: str = "auto",
    max_prompt_length: int | None = None,
    tokenizer: Any = None,
    accuracy_threshold: float = 1.0,
) -> EvaluationResult:
    """Load ``model`` (name, path, adapter directory or loaded model) and evaluate it on
    ``rows`` (a list of task rows or a task suite split) scored by ``rewards`` (anything
    :class:`~mtgrpo.rewards.RewardSuite.from_user` takes, names and reward models included)."""
    from mtgrpo.models import load_model, load_tokenizer
    from mtgrpo.rewards import RewardSuite
    from mtgrpo.rewards.registry import resolve_rewards
    from mtgrpo.rollout import SamplingParams, build_backend
    from mtgrpo.tasks import PromptSet

    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples} must be >= 1")
    suite = rewards if isinstance(rewards, RewardSuite) else \
        RewardSuite.from_user(resolve_rewards(rewards))
    loaded = load_model(model, for_training=False)
    tokenizer = load_tokenizer(tokenizer if tokenizer is not None else (
        model if isinstance(model, str | Path) else loaded))
    prompts = PromptSet(rows, tokenizer, max_prompt_length=max_prompt_length)
    suite.validate_tasks(prompts.task_names)
    generation = build_backend(backend, loaded, tokenizer)
    # temperature 0 is greedy decoding (SamplingParams.is_greedy): a nucleus means nothing there
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature,
                            top_p=top_p if temperature > 0 else 1.0)
    result = evaluate_prompts(prompts, generation, suite, params, num_samples, tokenizer,
                              accuracy_threshold=accuracy_threshold)
    result.extra.update({"model": str(model) if isinstance(model, str | Path) else
                         type(loaded).__name__, "num_samples": num_samples,
                         "temperature": temperature, "max_new_tokens": max_new_tokens})
    return result
