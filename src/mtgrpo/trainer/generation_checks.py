"""What the trainer checks of the generation engine's samples: the log-prob mismatch between
the engine and the trainer (``generation/logprob_mismatch_*``, ``generation/kl_k3``), the
engine's log-probs for TRL's importance correction (``vllm_importance_sampling_*``) and its
``sampling/*`` figures, and the dtype the engine generates in."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from mtgrpo.algo.engine_correction import (
    correction_figures,
    correction_metrics,
    importance_weights,
)
from mtgrpo.algo.metrics import logprob_mismatch
from mtgrpo.algo.sampling import ScoredGroup
from mtgrpo.rollout import (
    GroupPayload,
)
from mtgrpo.trainer.update import engine_correction

logger = logging.getLogger("mtgrpo.trainer.trainer")  # the trainer's logger


class GenerationChecks:
    """Mixed into :class:`~mtgrpo.trainer.GRPOTrainer` (see the module docstring)."""

    def _generation_dtype(self) -> torch.dtype | None:
        """bfloat16 when bf16 is on and the policy's weights are float32 (the static backend
        then generates from a bfloat16 copy); None: the policy's own dtype."""
        from mtgrpo.fast import hooked_modules

        weights = next(self.unwrapped.parameters()).dtype
        if not self.bf16 or weights != torch.float32:
            return None
        hooked = hooked_modules(self.unwrapped)
        if hooked:
            logger.info("generating in float32 from the policy itself: its modules %s have "
                        "forward hooks, which a bfloat16 copy would not compute alike", hooked[:3])
            return None
        return torch.bfloat16

    def _wants_generation_logprobs(self) -> bool:
        """Whether to ask the backend for its own token log-probabilities (compared with the
        trainer's, ``generation/logprob_mismatch_*``): ``generation_logprobs`` when set, else
        whether the backend says they cost it nothing (``cheap_logprobs``: the static backend
        computes them while sampling; transformers ``generate`` would keep every step's scores)."""
        wanted = self.config.rollout.generation_logprobs
        return bool(getattr(self.backend, "cheap_logprobs", False)) if wanted is None else wanted

    def _generation_mismatch(self, groups: list[ScoredGroup], batch: Any,
                             old_logps: torch.Tensor) -> dict[str, float]:
        """``generation/logprob_mismatch_mean``, ``_max`` and ``generation/kl_k3``
        (:func:`mtgrpo.algo.metrics.logprob_mismatch`) over the trained completion tokens of every
        process, pooled token by token (not a mean of per-process means, nor a local max): the
        backend's log-probs of its samples against the trainer's at θ_t (``old_logps`` /
        ``batch.loss_mask``: ``[n, L]``, this process's rows; a tool's reply, which the engine
        did not sample, is left out).

        Every process takes part in the gather, whatever it holds, so that the collective
        operations stay in step: one without trained rows sends no tokens, and one whose
        trained completions lack the backend's log-probs says so. The metrics are then ``{}`` on
        every process, as on one process, where they are logged only when every trained
        completion has them (a mismatch over some backends' tokens only would measure another
        quantity on N processes than on one)."""
        local = self._engine_and_trainer_logps(groups, batch.loss_mask, old_logps)
        pairs = self._gather_objects([local]) if self.world > 1 else [local]
        if any(pair is None for pair in pairs):
            self._warn_no_engine_logprobs()
            return {}
        return logprob_mismatch(np.concatenate([p[0] for p in pairs]),
                                np.concatenate([p[1] for p in pairs]))

    def _warn_no_engine_logprobs(self) -> None:
        """Say once why ``generation/logprob_mismatch_*`` is missing when the user asked for it
        (``generation_logprobs: true``) and the backend returned no log-probabilities."""
        if not self.config.rollout.generation_logprobs or self._warned_no_engine_logprobs:
            return
        self._warned_no_engine_logprobs = True
        if not self.is_main_process:
            return
        logger.warning(
            "generation_logprobs is true, but the generation backend (%s) returned no "
            "log-probabilities for some trained completions, so generation/logprob_mismatch_* "
            "and generation/kl_k3 are not logged; have its generate() fill "
            "GenerationOutput.logprobs when SamplingParams.return_logprobs is set, or set "
            "generation_logprobs: false", type(self.backend).__name__)

    def _engine_and_trainer_logps(self, groups: list[ScoredGroup], completion_mask: torch.Tensor,
                                  old_logps: torch.Tensor
                                  ) -> tuple[np.ndarray, np.ndarray] | None:
        """This process's trained tokens as ``([M] backend log-probs, [M] trainer log-probs)``
        (``M = 0`` on a process that holds only the padding group), or None when a trained
        completion has no backend log-probs."""
        local, has_rows = self._local_groups(groups)
        if not has_rows:
            nothing = np.zeros(0, dtype=np.float32)
            return nothing, nothing
        # a group without the engine's log-probs stands for one missing row: enough to say None
        rows = [row for i in local for row in (groups[i].payload.logprobs or [None])]
        if any(row is None for row in rows):
            return None
        assert len(rows) == old_logps.shape[0], (len(rows), tuple(old_logps.shape))
        # on the host: the pairs travel as NumPy arrays through gather_object (pickled)
        engine = torch.zeros_like(old_logps, device="cpu")  # [n, L]
        for i, row in enumerate(rows):
            engine[i, : len(row)] = torch.tensor(row, dtype=engine.dtype)
        mask = completion_mask.bool().cpu()  # [n, L]: the tokens the update trained on
        return engine[mask].numpy(), old_logps.detach().cpu()[mask].numpy()

    def _engine_logps(self, payloads: list[GroupPayload]) -> list[list[float]] | None:
        """The engine's log-probs of the rows, for its importance correction (vLLM), or None
        when the correction is off. Every row must have them: the engine returns them."""
        if engine_correction(self.config) is None:
            return None
        rows = [row for p in payloads for row in (p.logprobs or [None] * len(p.completion_ids))]
        if any(row is None for row in rows):
            raise RuntimeError(
                f"vllm_importance_sampling_correction needs the engine's log-probs, and the "
                f"generation backend ({type(self.backend).__name__}) returned none"
            )
        return rows

    def _correction_metrics(self, batch: Any, at_start: torch.Tensor) -> dict[str, float]:
        """TRL's ``sampling/*`` figures of the engine's importance correction, pooled over the
        trained tokens (or completions) of every process."""
        correction = engine_correction(self.config)
        if correction is None or batch.sampling_logps is None:
            return {}
        # the tokens the update weights (TRL's completion_mask * tool_mask): not a tool's reply
        mask = batch.loss_mask
        weights = importance_weights(at_start.float(), batch.sampling_logps, mask, correction)
        local = correction_figures(at_start.float(), batch.sampling_logps, mask, weights,
                                   correction)
        # a collective: every process joins, with trained tokens or without
        pairs = self._gather_objects([local]) if self.world > 1 else [local]
        return correction_metrics(np.concatenate([p[0] for p in pairs]),
                                  np.concatenate([p[1] for p in pairs]))
