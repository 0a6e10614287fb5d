"""Worked examples beyond the papers' tasks (docs/examples.md walks through each).

* :mod:`mtgrpo.examples.customer_comms`: a fintech support desk, a non-verifiable domain with
  three reward channels from rule-based judges (compliance, politeness, next step), politeness
  gated on compliance, trained with normalise-then-sum (``configs/customer-comms.yaml``).
* GSM8K math with correctness, format and length channels lives with the other tasks, in
  :mod:`mtgrpo.tasks.gsm8k` (``configs/gsm8k-math.yaml``).
"""

from __future__ import annotations

from mtgrpo.examples.customer_comms import (
    SCENARIOS,
    JudgeScores,
    Scenario,
    comms_judge,
    comms_reward,
    judge_reply,
    make_comms_reward,
    make_prompts,
    write_prompts,
)

__all__ = [
    "SCENARIOS",
    "JudgeScores",
    "Scenario",
    "comms_judge",
    "comms_reward",
    "judge_reply",
    "make_comms_reward",
    "make_prompts",
    "write_prompts",
]
