"""Evaluation inside a run: the eval sets at ``eval_strategy``'s steps (per-task accuracy and
TRL's ``loss`` of the evaluation completions), ``evaluate()`` with transformers' prefixes, and
the validation split the task weights read with ``task_weighting_signal: validation``."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from mtgrpo.algo.metrics import scalar_rewards
from mtgrpo.rollout import (
    SamplingParams,
    Shard,
)
from mtgrpo.tasks.prompt_set import PromptSet
from mtgrpo.trainer.metrics import (
    channel_metrics,
)
from mtgrpo.trainer.setup import (
    training_rows,
)

logger = logging.getLogger("mtgrpo.trainer.trainer")  # the trainer's logger


class Evaluating:
    """Mixed into :class:`~mtgrpo.trainer.GRPOTrainer` (see the module docstring)."""

    def _validate_if_due(self) -> dict[str, Any]:
        """With ``task_weighting_signal: validation``: evaluate the validation split when it is
        due (step 0, then every ``validation_steps`` steps; at once when a resumed run holds no
        result) and hand the result to the weights' :class:`ValidationSignal`. Returns the
        held-out accuracies the weights read (``validation/<task>/accuracy``, the step they
        were measured at as ``weighting/validation_step``, and ``time/validation`` when the
        split was evaluated now); ``{}`` when the weights read the training batch."""
        if self.validation is None or self.validation_prompts is None:
            return {}
        last, out = self.validation.last_step, {}
        if last is None or (self.step % self.validation_every == 0 and last < self.step):
            begin = time.perf_counter()
            # eval mode (no dropout), as transformers' evaluation loop; train mode comes back
            # even when generation fails
            self.unwrapped.eval()
            try:
                result = self._sample_held_out(self.validation_prompts,
                                               self.config.resolved_num_generations_validation)
            finally:
                self.unwrapped.train()
            groups = result.groups
            self.validation.observe(self.step, self._group_stats(
                groups, np.concatenate([g.advantages for g in groups])))
            out["time/validation"] = time.perf_counter() - begin
        stats = self.validation.task_stats()
        assert stats is not None
        for k, name in enumerate(self.task_names):
            out[f"validation/{name}/accuracy"] = float(stats.accuracy[k])
        out["weighting/validation_step"] = self.validation.last_step
        return out

    def _eval_params(self) -> SamplingParams:
        args = self.config
        return SamplingParams(
            max_new_tokens=args.rollout.max_completion_length,
            temperature=args.evaluation.eval_temperature,
            # greedy at temperature 0: top_p 1.0 and top_k 0 are transformers' "no warper" values
            top_p=args.rollout.top_p if args.evaluation.eval_temperature > 0 else 1.0,
            top_k=args.rollout.top_k if args.evaluation.eval_temperature > 0 else 0,
        )

    def _sample_held_out(self, prompts: PromptSet, num_samples: int) -> Any:
        """``num_samples`` completions of every prompt of ``prompts`` at the evaluation's
        sampling settings, scored, with their advantages
        (:class:`~mtgrpo.evaluation.EvaluationResult`; the same on every process)."""
        from mtgrpo.evaluation import evaluate_prompts

        with self._gathered():  # sharded: every process gathers, prompts or not
            return evaluate_prompts(
                prompts, self.backend, self.rewards, self._eval_params(), num_samples,
                self.tokenizer, accuracy_threshold=self.config.advantage.accuracy_threshold,
                accuracy_channel=self.accuracy_channel,
                shard=Shard(self.rank, self.world, gather=self._gather_objects),
                extra=self._reward_extras(), estimate=self.estimate,
                agent=self._agent_runner,
            )

    def _evaluate_set(self, prompts: PromptSet) -> dict[str, Any]:
        """Per-task accuracy (``num_generations_eval`` samples per prompt) and TRL's ``loss``:
        the GRPO loss of the evaluation completions at the current policy. ``time/eval``: the
        seconds of the whole evaluation, the loss included."""
        begin = time.perf_counter()
        g = self.config.evaluation.num_generations_eval
        self.unwrapped.eval()
        try:
            result = self._sample_held_out(prompts, g)
            metrics = result.metrics()
            self._warn_answers(result)
            if result.groups:
                # the training batch's layout and advantages, so eval_loss is TRL's loss
                _, batch, _, has_rows = self._policy_batch(result.groups)
                metrics["loss"] = self.updater.evaluation_loss(batch, has_rows)
                values = np.concatenate([group.rewards for group in result.groups])  # [N, R]
                scalar = scalar_rewards(values, np.asarray(self.rewards.reward_weights))
                metrics.update(channel_metrics(self.rewards.channel_names, values, scalar))
        finally:
            self.unwrapped.train()
        metrics["time/eval"] = time.perf_counter() - begin
        return metrics

    def _warn_answers(self, result: Any) -> None:
        """Log once per task and kind when an evaluation's answers show a task learned without
        solving it (:func:`mtgrpo.evaluation.answer_warnings`; its figures are in the metrics
        as ``tasks/<task>/top_answer_share`` and ``tasks/<task>/constant_baseline``)."""
        from mtgrpo.evaluation import answer_warnings

        for task, kind, message in answer_warnings(result):
            if (task, kind) not in self._answer_warnings and self.rank == 0:
                logger.warning("step %d: %s", self.step, message)
            self._answer_warnings.add((task, kind))

    def _eval_prompt_sets(self, eval_dataset: Any) -> dict[str | None, PromptSet]:
        if eval_dataset is None:
            return self.eval_sets
        data = training_rows(self.train_dataset, eval_dataset, self.config.multitask.task_column)
        sets = {}
        for name, rows in data.evals.items():
            sets[name] = PromptSet(rows, self.tokenizer,
                                   max_prompt_length=self.config.rollout.max_prompt_length,
                                   on_long_prompt=self.config.rollout.on_long_prompt,
                                   chat_template_kwargs=self.config.rollout.chat_template_kwargs)
            self.rewards.validate_tasks(sets[name].task_names)
        return sets

    def evaluate(self, eval_dataset: Any = None, ignore_keys: Any = None,
                 metric_key_prefix: str = "eval") -> dict[str, Any]:
        """Evaluate on ``eval_dataset`` (default: the trainer's); returns the metrics with
        transformers' prefixes (``eval_loss``, ``eval_accuracy/worst``; a named set
        ``data1`` gives ``eval_data1_loss``), logs them and calls ``on_evaluate``."""
        sets = self._eval_prompt_sets(eval_dataset)
        if not sets:
            raise ValueError("evaluate() needs an eval_dataset (here or in the constructor)")
        out: dict[str, Any] = {}
        for name, prompts in sets.items():
            metrics = self._evaluate_set(prompts)
            self._write(metrics, "eval" if name is None else f"eval/{name}")
            prefix = metric_key_prefix if name is None else f"{metric_key_prefix}_{name}"
            out.update({f"{prefix}_{key}": value for key, value in metrics.items()})
        self._record(out)
        self.flow.evaluate(self.state, out)
        return out
