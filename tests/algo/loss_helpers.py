"""Shared inputs of the loss tests: the hand-derived example and TRL's loss code on a stub."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

LN2 = math.log(2.0)


def hand_example() -> dict[str, torch.Tensor]:
    """Two completions of three tokens, eps_low 0.2, eps_high 0.28, beta 0.1.

    row 0: A = +1, ratios (1.5, 1.1, 1.0), ref - logp = (0, ln 2, 0), all tokens kept
    row 1: A = -2, ratios (0.5, 0.9, 2.0), ref - logp = (-ln 2, 0, 5), last token masked
    """
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]], dtype=torch.float64)
    ratios = torch.tensor([[1.5, 1.1, 1.0], [0.5, 0.9, 2.0]], dtype=torch.float64)
    ref_minus = torch.tensor([[0.0, LN2, 0.0], [-LN2, 0.0, 5.0]], dtype=torch.float64)
    return {
        "logps": logps,
        "old_logps": logps - ratios.log(),
        "ref_logps": logps + ref_minus,
        "advantages": torch.tensor([1.0, -2.0], dtype=torch.float64),
        "completion_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
    }



def trl_compute_loss(
    logps: torch.Tensor,
    old: torch.Tensor,
    ref: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str,
    eps_low: float,
    eps_high: float,
    beta: float,
    max_len: int,
    entropies: torch.Tensor | None = None,
    args: dict | None = None,
    extra_inputs: dict | None = None,
    **trainer_options,
) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """Run TRL's own ``GRPOTrainer._compute_loss`` on given log-probabilities.

    The trainer object is replaced by a namespace holding exactly the attributes the method
    reads on its single-process, no-vLLM path; the model call returns ``logps`` (and
    ``entropies``). ``args`` overrides TRL's config fields (``delta``, the sapo / vespo
    options, ``use_bias_correction_kl``), ``trainer_options`` the trainer's attributes
    (``importance_sampling_level``, ``top_entropy_quantile``, ``off_policy_mask_threshold``,
    ``entropy_coef``, ...). TRL's mask and weight helpers are TRL's own methods.
    """
    grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    trl_trainer = grpo_trainer.GRPOTrainer
    metrics: defaultdict = defaultdict(lambda: defaultdict(list))
    accelerator = SimpleNamespace(
        num_processes=1, sync_gradients=True, reduce=lambda x, reduction="sum": x,
        gather=lambda x: x, gather_for_metrics=lambda x: x,
        pad_across_processes=lambda x, dim=0, pad_index=0: x,
    )  # fmt: skip
    entropies = torch.zeros_like(logps) if entropies is None else entropies
    config = {"delta": None, "use_bias_correction_kl": False, "steps_per_generation": 1,
              "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05, "vespo_k_pos": 2.0,
              "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0,
              "entropy_target": 0.2, "entropy_coef_delta": 0.005, "entropy_coef_min": 0.0,
              "entropy_coef_max": 1.0, **(args or {})}
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, entropies, None),
        top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level="token", beta=beta, loss_type=loss_type,
        epsilon_low=eps_low, epsilon_high=eps_high, use_vllm=False,
        vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        args=SimpleNamespace(**config),
        current_gradient_accumulation_steps=1, accelerator=accelerator,
        _entropy_bonus_enabled=False, entropy_coef=0.0, use_adaptive_entropy=False,
        _last_world_entropy=float("inf"), _entropy_window_stats=None,
        aux_loss_enabled=False, _metrics=metrics, max_completion_length=max_len,
        get_off_policy_mask=trl_trainer.get_off_policy_mask,
        get_gamma_weights=trl_trainer.get_gamma_weights,
    )  # fmt: skip
    trainer.get_high_entropy_mask = (
        lambda e, m, t: trl_trainer.get_high_entropy_mask(trainer, e, m, t))
    for name, value in trainer_options.items():
        setattr(trainer, name, value)
    trainer._entropy_bonus_enabled = trainer.entropy_coef != 0.0 or trainer.use_adaptive_entropy
    rows, length = logps.shape
    inputs = {
        "prompt_ids": torch.zeros(rows, 1, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 1, dtype=torch.long),
        "completion_ids": torch.zeros(rows, length, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
        **(extra_inputs or {}),
    }
    loss = trl_trainer._compute_loss(trainer, None, inputs)
    return loss, dict(metrics["train"])
