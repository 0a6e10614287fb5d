"""Generate, score, estimate: the callable the batch-construction sampler drives.

Given prompt ids, every process generates ``G`` completions for its contiguous share of whole
groups and scores them with the reward suite; the scores are gathered so every process holds
the same list, and the advantage estimator runs once on every gathered group, giving each its
advantages and its zero-gradient verdict (filters, advantages and task weights then agree
everywhere). The sampler returns every group it generated (``SampledBatch.generated``).

With tools or environments (an :class:`~mtgrpo.rollout.agent.AgentRollouts`), generation is the
multi-turn tool loop: completions are the conversation after the prompt (assistant turns and
tool replies, as messages), each group carries its tool mask, and the reward functions also
receive each completion's environment (``environments``, TRL's keyword). With TRL's
``rollout_func`` (:class:`~mtgrpo.rollout.agent.CustomRollouts`) the user's function generates,
and the extra fields it returns go to the reward functions.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mtgrpo.algo.advantages import AdvantageResult, compute_advantages
from mtgrpo.algo.sampling import ScoredGroup
from mtgrpo.rewards import RewardSuite
from mtgrpo.rewards.accuracy import correct_completions
from mtgrpo.rollout.agent import AgentRollouts, CustomRollouts
from mtgrpo.rollout.base import GenerationBackend, GenerationOutput, SamplingParams
from mtgrpo.tasks import PromptSet, is_conversational

__all__ = ["Estimate", "GroupPayload", "RolloutWorker", "Shard"]

Estimate = Callable[[np.ndarray, int], AdvantageResult]
"""``estimate(rewards [N, R], G) -> AdvantageResult``: the advantage estimator with the run's
settings (:func:`mtgrpo.algo.advantages.compute_advantages`)."""


@dataclass
class GroupPayload:
    """The tokens and texts of one group (what the update and the logs need)."""

    prompt_ids: list[int]
    completion_ids: list[list[int]]  # [G]
    completions: list[Any]  # [G] text, or assistant messages for chat prompts
    finished: list[bool]  # [G] ended with a stop token (vs. cut at max_completion_length)
    reward_errors: np.ndarray | None = None  # [G, R] a built-in verifier failed on the text
    logprobs: list[list[float]] | None = None  # [G] the engine's own token log-probs, if asked
    tool_mask: list[list[int]] | None = None  # [G] 1 = a token the model sampled, 0 = a tool's
    row_prompts: list[list[int]] | None = None  # [G] when the rollouts' prompts differ

    @property
    def row_prompt_ids(self) -> list[list[int]]:
        """``[G]`` the prompt of each rollout (an environment's observation can make them
        differ)."""
        if self.row_prompts is not None:
            return self.row_prompts
        return [self.prompt_ids] * len(self.completion_ids)

    @property
    def model_token_counts(self) -> list[int]:
        """``[G]`` completion tokens the model sampled (tool replies not counted)."""
        return _model_token_counts(self.completion_ids, self.tool_mask)


@dataclass(frozen=True)
class Shard:
    """Process ``rank`` of ``world``; ``gather`` concatenates per-process lists in rank order."""

    rank: int = 0
    world: int = 1
    gather: Any = None

    def bounds(self, total: int) -> tuple[int, int]:
        """Contiguous share ``[start, stop)`` of ``total`` items for this process."""
        # contiguous shares in rank order: the gather gives the groups back in the prompts' order
        per, extra = divmod(total, self.world)
        # the first `extra` ranks take one item more: shares differ by at most one
        start = self.rank * per + min(self.rank, extra)
        return start, start + per + (1 if self.rank < extra else 0)

    def all(self, local: list[Any]) -> list[Any]:
        return local if self.world == 1 else list(self.gather(local))


class RolloutWorker:
    """``worker(prompt_ids) -> list[ScoredGroup]`` for :mod:`mtgrpo.algo.sampling`.

    ``estimate`` is the advantage estimator (default: :func:`compute_advantages` with the
    suite's reward weights, gates and ``on_unscorable`` policy, and its other defaults).
    ``expected_version``: the weights version generation must report (the trainer's step); a
    backend that reports another one is a stale engine, an error. ``task_params``: sampling
    parameters of the tasks (by task id) that do not sample with ``params``; prompts of such a
    task are generated in a call of their own. ``agent``: generate with the multi-turn tool
    loop (tools, environments).
    """

    def __init__(
        self,
        prompts: PromptSet,
        backend: GenerationBackend,
        rewards: RewardSuite,
        params: SamplingParams,
        group_size: int,
        tokenizer: Any,
        *,
        accuracy_threshold: float = 1.0,
        accuracy_channel: int | None = None,
        shard: Shard | None = None,
        extra: dict[str, Any] | None = None,
        estimate: Estimate | None = None,
        expected_version: Callable[[], int] | None = None,
        task_params: dict[int, SamplingParams] | None = None,
        agent: AgentRollouts | CustomRollouts | None = None,
    ) -> None:
        self.prompts = prompts
        self.backend = backend
        self.rewards = rewards
        self.params = params
        self.group_size = group_size
        self.tokenizer = tokenizer
        self.accuracy_threshold = accuracy_threshold
        self.accuracy_channel = accuracy_channel
        self.shard = shard or Shard()
        self.extra = extra or {}
        self.estimate = estimate or self._suite_estimate
        self.expected_version = expected_version
        self.task_params = dict(task_params or {})
        self.agent = agent
        self.reset()

    def reset(self) -> None:
        """Forget the previous step's timings, token count and tool counts."""
        self.seconds = {"generate": 0.0, "score": 0.0}
        self.tokens_generated = 0
        # per task: [rollouts, tool calls, failed calls] of this process since the last reset
        self.tool_counts = np.zeros((self.prompts.num_tasks, 3), dtype=np.int64)

    def tool_metrics(self) -> dict[str, float]:
        """TRL's ``tools/call_frequency`` (calls per rollout) and ``tools/failure_frequency``
        (failed calls per call, 0 without calls), over every process and per task
        (``tasks/<task>/tool_call_frequency``, ``..._failure_frequency``) since the last
        :meth:`reset`; empty without tools. Every process must call it (it gathers)."""
        if self.agent is None:
            return {}
        # summed over processes: every process must call this (a collective)
        counts = np.sum(self.shard.all([self.tool_counts]), axis=0)  # [K, 3]
        metrics = _tool_frequencies("tools/call_frequency", "tools/failure_frequency",
                                    counts.sum(0))
        for k, name in enumerate(self.prompts.task_names):
            if counts[k, 0]:
                metrics.update(_tool_frequencies(f"tasks/{name}/tool_call_frequency",
                                                 f"tasks/{name}/tool_failure_frequency",
                                                 counts[k]))
        return metrics

    def __call__(self, prompt_ids: Sequence[int]) -> list[ScoredGroup]:
        start, stop = self.shard.bounds(len(prompt_ids))
        local = [int(i) for i in prompt_ids[start:stop]]
        # every process joins the gather, one without prompts too: it is a collective
        gathered: list[ScoredGroup] = self.shard.all(self._generate_and_score(local) if local
                                                     else [])
        if not gathered:
            return []
        # on every process's groups, so that each process holds the same advantages
        estimated = self.estimate(np.concatenate([g.rewards for g in gathered]), self.group_size)
        advantages = estimated.advantages.reshape(len(gathered), self.group_size)
        return [dataclasses.replace(g, zero_gradient=bool(estimated.zero_gradient[b]),
                                    advantages=advantages[b])
                for b, g in enumerate(gathered)]

    def _suite_estimate(self, rewards: np.ndarray, group_size: int) -> AdvantageResult:
        suite = self.rewards
        return compute_advantages(rewards, group_size, reward_weights=suite.reward_weights,
                                  gates=suite.gates, on_unscorable=suite.on_unscorable)

    def _by_params(self, ids: list[int]) -> dict[SamplingParams, list[int]]:
        """Positions in ``ids`` by the sampling parameters of their task."""
        by_params: dict[SamplingParams, list[int]] = {}
        for index, i in enumerate(ids):
            task = int(self.prompts.prompt_tasks[i])
            by_params.setdefault(self.task_params.get(task, self.params), []).append(index)
        return by_params

    def _generate(self, ids: list[int]) -> GenerationOutput:
        """Completions of ``ids`` (grouped by prompt, in order): one call per sampling setting."""
        g = self.group_size
        by_params = self._by_params(ids)
        outputs = []
        for params, indices in by_params.items():
            out = self.backend.generate([self.prompts.tokens(ids[k]) for k in indices], params, g)
            self._check_version(out)
            outputs.append((indices, out))
        # one sampling setting: the backend's rows are already in ids' order
        if len(outputs) == 1:
            return outputs[0][1]
        rows: list[Any] = [None] * len(ids)
        for indices, out in outputs:
            for j, k in enumerate(indices):
                rows[k] = [(out.prompt_ids[j * g + r], out.completion_ids[j * g + r],
                            out.finished[j * g + r],
                            None if out.logprobs is None else out.logprobs[j * g + r])
                           for r in range(g)]
        flat = [row for group in rows for row in group]
        has_logprobs = all(out.logprobs is not None for _, out in outputs)
        return GenerationOutput(
            prompt_ids=[r[0] for r in flat], completion_ids=[r[1] for r in flat],
            finished=[r[2] for r in flat],
            logprobs=[r[3] for r in flat] if has_logprobs else None,
            weights_version=outputs[0][1].weights_version,
        )

    def _check_version(self, out: GenerationOutput) -> None:
        if self.expected_version is None or out.weights_version is None:
            return
        expected = self.expected_version()
        if out.weights_version != expected:
            from mtgrpo.rollout.vllm.errors import StaleEngineError

            raise StaleEngineError(
                f"the generation engine sampled with weights version {out.weights_version}, "
                f"but the trainer is at step {expected}: its weights were not pushed after the "
                "last optimizer step (or a push was lost); the completions would come from "
                "another policy than the one trained"
            )

    def _plain_generate(self, ids: list[int]) -> _Generated:
        out = self._generate(ids)
        # as TRL's GRPOTrainer: special tokens (the stop token) are not part of the text scored
        texts = self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
        prompts = [self.prompts.prompt(i) for i in ids for _ in range(self.group_size)]
        completions = [
            # TRL's form for a chat prompt: the completion as one assistant message
            [{"role": "assistant", "content": t}] if is_conversational(p) else t
            for p, t in zip(prompts, texts, strict=True)
        ]
        return _Generated(out, prompts, completions)

    def _agent_generate(self, ids: list[int]) -> _Generated:
        """The agent's rollouts of ``ids`` (one run per sampling setting), in ``ids``' order."""
        assert self.agent is not None
        g = self.group_size
        runs = [(indices, self.agent.run(self.prompts, [ids[k] for k in indices], params, g))
                for params, indices in self._by_params(ids).items()]
        for _, batch in runs:
            self._check_version(batch.output.generation)
        place = {k: (r, j) for r, (indices, _) in enumerate(runs) for j, k in enumerate(indices)}
        order = [(place[k][0], place[k][1] * g + n)  # each row of ids' order: (run, its row)
                 for k in range(len(ids)) for n in range(g)]

        def pick(values: Callable[[Any], Sequence[Any] | None]) -> list[Any] | None:
            chosen = [values(runs[r][1]) for r, _ in order]
            if any(v is None for v in chosen):
                return None
            return [v[n] for v, (_, n) in zip(chosen, order, strict=True)]

        out = GenerationOutput(
            pick(lambda b: b.output.generation.prompt_ids),
            pick(lambda b: b.output.generation.completion_ids),
            pick(lambda b: b.output.generation.finished),
            pick(lambda b: b.output.generation.logprobs),
            runs[0][1].output.generation.weights_version)
        calls = pick(lambda b: b.output.tool_calls)
        failures = pick(lambda b: b.output.tool_failures)
        for k, i in enumerate(ids):  # [rollouts, calls, failures] of each task
            rows = slice(k * g, (k + 1) * g)
            self.tool_counts[int(self.prompts.prompt_tasks[i])] += (
                g, sum(calls[rows]), sum(failures[rows]))
        names = dict.fromkeys(name for _, b in runs for name in b.columns)
        columns = {name: pick(lambda b, name=name: b.columns.get(name)) for name in names}
        return _Generated(out, pick(lambda b: b.prompts), pick(lambda b: b.output.completions),
                          pick(lambda b: b.output.tool_mask), columns)

    def _generate_and_score(self, ids: list[int]) -> list[ScoredGroup]:
        """This process's groups, scored, before estimation (no advantages yet: the estimator
        runs once the groups of every process are gathered)."""
        g = self.group_size
        begin = time.perf_counter()
        made = self._plain_generate(ids) if self.agent is None else self._agent_generate(ids)
        out = made.output
        self.seconds["generate"] += time.perf_counter() - begin
        self.tokens_generated += sum(made.model_token_counts)

        begin = time.perf_counter()
        columns = {**self.prompts.columns(ids, g), **made.columns}
        scores = self.rewards.score(
            made.prompts, made.completions, out.completion_ids, columns,
            [self.prompts.task(i) for i in ids for _ in range(g)], extra=self.extra,
        )
        correct = correct_completions(scores.values, self.accuracy_threshold,
                                      self.accuracy_channel)  # [N]
        self.seconds["score"] += time.perf_counter() - begin
        groups = []
        for b, prompt_id in enumerate(ids):
            rows = slice(b * g, (b + 1) * g)
            prompts = out.prompt_ids[rows]
            payload = GroupPayload(
                prompt_ids=prompts[0], completion_ids=out.completion_ids[rows],
                completions=made.completions[rows], finished=out.finished[rows],
                reward_errors=scores.errors[rows],
                logprobs=None if out.logprobs is None else out.logprobs[rows],
                tool_mask=None if made.tool_mask is None else made.tool_mask[rows],
                # kept only when an environment's observation made the rollouts' prompts differ
                row_prompts=None if all(p == prompts[0] for p in prompts) else prompts,
            )
            groups.append(ScoredGroup(
                prompt_id=prompt_id, task=int(self.prompts.prompt_tasks[prompt_id]),
                rewards=scores.values[rows], correct=correct[rows], zero_gradient=False,
                payload=payload))
        return groups


@dataclass
class _Generated:
    """``N`` rollouts before scoring: what the reward functions and the payloads need."""

    output: GenerationOutput
    prompts: list[Any]  # [N] as the model saw them (with an environment's observation)
    completions: list[Any]  # [N] text, or messages for chat prompts
    tool_mask: list[list[int]] | None = None  # [N]
    columns: dict[str, list[Any]] = field(default_factory=dict)  # [N] each, for the rewards

    @property
    def model_token_counts(self) -> list[int]:
        """``[N]`` completion tokens the model sampled (tool replies not counted)."""
        return _model_token_counts(self.output.completion_ids, self.tool_mask)


def _model_token_counts(completion_ids: Sequence[Sequence[int]],
                        tool_mask: Sequence[Sequence[int]] | None) -> list[int]:
    """Tokens the model sampled in each completion: all of them, or the tool mask's ones."""
    if tool_mask is None:
        return [len(ids) for ids in completion_ids]
    return [sum(mask) for mask in tool_mask]


def _tool_frequencies(calls_key: str, failures_key: str, counts: np.ndarray) -> dict[str, float]:
    """``counts``: [rollouts, calls, failed calls] -> calls per rollout, failures per call."""
    rollouts, calls, failures = (int(c) for c in counts)
    # TRL 1.16 GRPOTrainer: calls over rollouts, failures over calls (0 without calls)
    return {calls_key: calls / max(rollouts, 1), failures_key: failures / calls if calls else 0.0}
