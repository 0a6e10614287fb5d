"""What a run writes besides checkpoints: one step's metrics record (assembled here in one
function, :meth:`RunRecords._step_metrics`, from the update's figures, the sampler's report,
the rewards and the timings), the rollout logs (``completions.jsonl``, ``rollouts.jsonl``,
printed samples), the run record, the output files' lifetime and the end-of-run report."""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

import numpy as np
import torch

from mtgrpo.algo.metrics import scalar_rewards
from mtgrpo.algo.sampling import ScoredGroup
from mtgrpo.policy.logprobs import resolve_logprob_path
from mtgrpo.reporting import MetricsWriter, Trackers
from mtgrpo.rollout import (
    backend_description,
)
from mtgrpo.trainer.hub import HubUploader, default_repo_id
from mtgrpo.trainer.identity import record_history
from mtgrpo.trainer.metrics import (
    channel_metrics,
    length_metrics,
    task_metrics,
)

logger = logging.getLogger("mtgrpo.trainer.trainer")  # the trainer's logger


class RunRecords:
    """Mixed into :class:`~mtgrpo.trainer.GRPOTrainer` (see the module docstring)."""

    def _step_metrics(self, built: Any, weights: np.ndarray, improvement: np.ndarray | None,
                      metrics: dict[str, Any], seconds: dict[str, float]) -> dict[str, Any]:
        """A training step's record: ``metrics`` (the update's and the validation's) plus the
        weighting's diagnostics, per-task and per-channel statistics, rollout and tool counts,
        tokens seen and the timings (``seconds``: the step's start, update and weighting)."""
        generated, report = built.generated, built.report
        diagnostics = getattr(self.weighting, "diagnostics", None)  # a registered duck type
        if diagnostics is not None:  # may have none
            metrics.update(diagnostics())  # e.g. MT-GRPO's improvement share
        values = np.concatenate([g.rewards for g in generated])  # [N, R]
        scalar = scalar_rewards(values, np.asarray(self.rewards.reward_weights))  # [N]
        metrics.update(task_metrics(self.task_names, generated, scalar, weights, report,
                                    improvement))
        errors = [g.payload.reward_errors for g in generated]
        errors = np.concatenate(errors) if generated and all(e is not None for e in errors) \
            else None
        metrics.update(channel_metrics(self.rewards.channel_names, values, scalar, errors))
        metrics.update(self.rewards.pop_timeouts())
        metrics.update(self._rollout_metrics(generated, report))
        metrics.update(self.rollouts.tool_metrics())
        # TRL's name; here the estimator's zero-gradient verdict over every generated group
        metrics["frac_reward_zero_std"] = float(np.mean([g.zero_gradient for g in generated]))
        metrics.update(self.log_window.step_custom())
        metrics["num_tokens"] = float(self.state.num_input_tokens_seen)
        if self.config.output.include_num_input_tokens_seen == "all":  # the Trainer's name for it
            metrics["num_input_tokens_seen"] = metrics["num_tokens"]
        metrics.update({
            "time/generate": self.rollouts.seconds["generate"],
            "time/score": self.rollouts.seconds["score"],
            "time/update": seconds["update"], "time/weighting": seconds["weighting"],
            "time/step": time.perf_counter() - seconds["begin"],
            "throughput/tokens_per_second": self.rollouts.tokens_generated
            / max(self.rollouts.seconds["generate"], 1e-9),
        })
        return metrics

    def _rollout_metrics(self, generated: list[ScoredGroup], report: Any) -> dict[str, Any]:
        lengths = np.array([n for g in generated for n in g.payload.model_token_counts])
        finished = np.array([f for g in generated for f in g.payload.finished], dtype=bool)
        out = length_metrics(lengths, finished)
        if finished.any():  # TRL's lengths of the completions that ended with a stop token
            ended = lengths[finished]
            out.update({"completions/mean_terminated_length": float(ended.mean()),
                        "completions/min_terminated_length": float(ended.min()),
                        "completions/max_terminated_length": float(ended.max())})
        out.update({
            "sampling/rounds": report.rounds,
            "sampling/prompts_generated": report.prompts_generated,
            "sampling/prompts_per_informative_group": report.prompts_per_informative_group,
            "sampling/batch_groups": report.batch_size,
        })
        return out

    def _jsonl(self, name: str, records: list[dict[str, Any]]) -> None:
        path = self.output_dir / name
        with path.open("a", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")

    def _remember_completions(self, generated: list[ScoredGroup],
                              advantages: np.ndarray) -> None:
        """TRL's ``trainer._logs``: the step's prompts, completions, rewards, advantages."""
        logs = self._logs
        for group in generated:
            for j, completion in enumerate(group.payload.completions):
                logs["prompt"].append(self.train_prompts.prompt(group.prompt_id))
                logs["completion"].append(completion)
                for r, name in enumerate(self.rewards.channel_names):
                    logs["rewards"][name].append(float(group.rewards[j, r]))
        logs["advantages"].extend(advantages.tolist())

    def _save_rollouts(self, generated: list[ScoredGroup], advantages: np.ndarray) -> None:
        g = self.config.batch.num_generations
        records = []
        for i, group in enumerate(generated):
            # null for not applicable: strict JSON has no NaN
            rewards = [[None if math.isnan(v) else v for v in row]
                       for row in group.rewards.tolist()]
            records.append({
                "step": self.step, "prompt_id": group.prompt_id,
                "task": self.task_names[group.task], "channels": self.rewards.channel_names,
                "rewards": rewards, "advantages": advantages[i * g:(i + 1) * g].tolist(),
            })
        self._jsonl("rollouts.jsonl", records)

    def _log_batch_rollouts(self, groups: list[ScoredGroup], advantages: np.ndarray,
                            generated: int) -> None:
        if not (self.config.output.log_completions and self.is_main_process):
            return
        g, records = self.config.batch.num_generations, []
        for i, group in enumerate(groups):
            for j, completion in enumerate(group.payload.completions):
                records.append({
                    # logged inside the step, before self.step counts it
                    "step": self.step + 1, "prompt_id": group.prompt_id,
                    "task": self.task_names[group.task],
                    "completion": completion if isinstance(completion, str)
                    else completion[-1]["content"],
                    "rewards": [None if math.isnan(v) else v for v in group.rewards[j].tolist()],
                    "advantage": float(advantages[i * g + j]),
                })
        for column, values in self._pending_extra.items():
            if len(values) == generated == len(records):  # one value per completion
                for record, value in zip(records, values, strict=True):
                    record[column] = value
        self._jsonl("completions.jsonl", records)

    def _print_completions(self) -> None:
        """TRL's ``num_completions_to_print``: a table of the newest completions."""
        count = self.config.output.num_completions_to_print
        if not (self.config.output.log_completions and count and self.is_main_process):
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"completions at step {self.step}", show_lines=True)
        for column in ("prompt", "completion", "advantage"):
            table.add_column(column)
        rows = list(zip(self._logs["prompt"], self._logs["completion"],
                        self._logs["advantages"], strict=False))[-count:]
        for prompt, completion, advantage in rows:
            table.add_row(str(prompt), str(completion), f"{advantage:.2f}")
        Console().print(table)

    def run_record(self) -> dict[str, Any]:
        """How this run computes, the ``split: "run"`` record at the head of each ``train()``
        call in ``metrics.jsonl``: the generation backend (and the static backend's decode
        path), whether the update's forward is padding-free, and the versions of torch,
        transformers and mtgrpo. Also logged at INFO."""
        import transformers

        from mtgrpo._version import __version__

        # the update's model, as it scores it (a DeepSpeed engine runs its own forward)
        route = resolve_logprob_path(self.model)
        record = {
            "step": self.step, "split": "run", **backend_description(self.backend),
            "policy/logprob_path": route.path,
            "policy/padding_free": bool(self.config.batch.padding_free and route.packed),
            "weighting/signal": self.config.multitask.task_weighting_signal,
            "precision/bf16": self.bf16, "precision/bf16_reason": self.bf16_reason,
            "generation/dtype": str(getattr(self.backend, "dtype", None) or
                                    next(self.unwrapped.parameters()).dtype).removeprefix("torch."),
            "versions/torch": torch.__version__,
            "versions/transformers": transformers.__version__,
            "versions/mtgrpo": __version__,
        }  # fmt: skip
        logger.info("run: %s", ", ".join(f"{k}={v}" for k, v in record.items()
                                           if k not in ("step", "split")))
        return record

    def _report_at_end(self) -> None:
        """What ``mtgrpo train`` shows when a run ends, for every ``train()``: the ``report/``
        figures (a run too short to plot gets a warning instead) and the run summary."""
        from rich.console import Console

        from mtgrpo.reporting import plot_run
        from mtgrpo.reporting.compare import load_run, run_report, summarize_run, summarize_tasks

        # the training is done and saved: a report that cannot be made is a warning, not a
        # failed train()
        try:
            written = plot_run(self.output_dir, self.output_dir / "report")
            logger.info("report figures: %s", ", ".join(str(p) for p in written))
        except (ValueError, FileNotFoundError) as exc:
            logger.warning("no report figures: %s", exc)
        try:
            history = load_run(self.output_dir)
            Console().print(run_report(summarize_run(history), summarize_tasks(history)))
        except (ValueError, FileNotFoundError) as exc:
            logger.warning("no run summary: %s", exc)
        print(f"run directory: {self.output_dir}  (metrics.jsonl, checkpoints, report/)")

    def _open_outputs(self) -> None:
        args = self.config
        self._writer = self._trackers = None
        if not self.is_main_process:
            return
        self._write_config()
        config = self.run_config
        if config is None:  # a Python run: its counting, so the file loads back as it ran
            config = self.config.to_dict()
        record_history(self.output_dir, self.step, config, self._accepted_changes)
        self._writer = MetricsWriter(self.output_dir / "metrics.jsonl")
        self._writer.write(self.run_record())
        if args.output.report_to:
            self._trackers = Trackers(args.output.report_to, self.output_dir,
                                      args.output.run_name or self.output_dir.name, args.to_dict())
        if args.saving.push_to_hub:
            self._hub = HubUploader(
                default_repo_id(args.output.output_dir, args.saving.hub_model_id),
                token=args.saving.hub_token,
                private=args.saving.hub_private_repo, revision=args.saving.hub_revision)

    def _close_outputs(self) -> None:
        for output in (self._writer, self._trackers):
            if output is not None:
                output.close()
        self._writer = self._trackers = None

    def _profiled_step(self) -> dict[str, Any]:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities, record_shapes=True) as prof:
            metrics = self.training_step()
        if self.is_main_process:
            trace = self.output_dir / f"profile-step{self.step}.json"
            prof.export_chrome_trace(str(trace))
            logger.info("profiler trace of step %d written to %s", self.step, trace)
        return metrics
