"""The trainer keeps training when completions attack scoring (issues 12 and 38): programs that
try to escape the code sandbox or forge its verdicts earn nothing, a built-in verifier that
raises on a completion scores it 0 and is counted in ``rewards/<name>/errors``, and a reward
function that never returns costs its time limit and is counted in
``rewards/<name>/timeouts``."""

from __future__ import annotations

import math
import sysconfig
from collections.abc import Sequence
from typing import Any

import pytest
import trainer_helpers as _common
from transformers import AutoTokenizer

import mtgrpo.rewards.verifiers.format as format_module
from mtgrpo import GRPOTrainer
from mtgrpo.reporting import read_metrics
from mtgrpo.rewards import RewardFunction
from mtgrpo.rewards.verifiers import code_reward, format_reward
from mtgrpo.rollout import GenerationOutput, SamplingParams

BASE_SITE = sysconfig.get_path("purelib", vars={"base": sysconfig.get_config_var("base")})
COMPLETIONS = [
    # through the base interpreter's site-packages to an FFI module (the escape of issue 12)
    f"<code>\nimport sys\nsys.path.append({BASE_SITE!r})\nimport _cffi_backend\n"
    "def add(a, b):\n    return 0\n</code>",
    # forged pass records and a forged reply to the judge, and a printed verdict
    "<code>\nimport os\nos.write(4, b'P0\\n')\nos.write(6, b'[\"v\",\"j1\",true,[]]\\n')\n"
    "print('ALL TESTS PASSED')\n"
    "def add(a, b):\n    return 0\n</code>",
    "<code>\ndef add(a, b):\n    return a + b\n</code>",  # honest
    "boom</think>\n<answer>7</answer>",  # makes the (broken) format verifier raise
]


class HostileBackend:
    """Generates :data:`COMPLETIONS` for every prompt."""

    def __init__(self, tokenizer: Any) -> None:
        self.version = None
        self.ids = [tokenizer.encode(text, add_special_tokens=False) for text in COMPLETIONS]

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                 num_samples: int = 1) -> GenerationOutput:  # fmt: skip
        prompts, completions = [], []
        for ids in prompt_ids:
            for j in range(num_samples):
                completions.append(self.ids[j % len(self.ids)][: params.max_new_tokens])
                prompts.append(list(ids))
        return GenerationOutput(prompts, completions, [True] * len(completions))

    def update_weights(self, model_or_state: Any, version: int) -> None:
        self.version = version


def test_training_goes_on_through_hostile_completions(
    tiny_model_dir, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(text: str) -> None:
        if "boom" in text:
            raise RecursionError("a verifier bug met a pathological completion")

    monkeypatch.setattr(format_module, "parse_think_answer", broken)
    rows = [{"prompt": f"Write add ({i}):", "task": "code", "tests": ["assert add(1, 2) == 3"]}
            for i in range(4)]  # fmt: skip
    args = _common.args(tmp_path, max_steps=2, max_completion_length=200)
    backend = HostileBackend(AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    trainer = GRPOTrainer(str(tiny_model_dir), [code_reward, format_reward], args=args,
                          train_dataset=rows, generation_backend=backend)  # fmt: skip
    trainer.train()
    records = read_metrics(tmp_path, split="train")
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert math.isfinite(record["loss"])
        # one honest program in every group of four: the attacks earned nothing
        assert record["rewards/code_reward/mean"] == pytest.approx(0.25)
        assert record["rewards/code_reward/errors"] == 0
        # every "boom" completion (one per group of four) failed the format verifier
        assert record["rewards/format_reward/errors"] == record["sampling/prompts_generated"]
        assert record["rewards/format_reward/mean"] == 0.0


def hangs(prompts, completions, **kwargs):
    """A reward function that never returns (and swallows what interrupts it once)."""
    import time

    try:
        time.sleep(3600)
    except BaseException:
        while True:
            time.sleep(1)


def test_a_reward_that_never_returns_costs_its_limit_and_training_goes_on(
    tiny_model_dir, tmp_path
) -> None:
    import time

    rows = [{"prompt": f"Write add ({i}):", "task": "code", "tests": ["assert add(1, 2) == 3"]}
            for i in range(4)]  # fmt: skip
    args = _common.args(tmp_path, max_steps=2, max_completion_length=200, reward_timeout=0.5)
    backend = HostileBackend(AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    patient = RewardFunction(code_reward, timeout=300)  # its own limit wins over the suite's
    trainer = GRPOTrainer(str(tiny_model_dir), [patient, hangs], args=args,
                          train_dataset=rows, generation_backend=backend)  # fmt: skip
    started = time.monotonic()
    trainer.train()
    elapsed = time.monotonic() - started
    records = read_metrics(tmp_path, split="train")
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert math.isfinite(record["loss"])
        assert record["rewards/hangs/timeouts"] == record["sampling/prompts_generated"] * 4
        assert record["rewards/code_reward/timeouts"] == 0
        assert record["rewards/code_reward/mean"] == pytest.approx(0.25)
    # each step waited at most its limit on the hung function (plus generation and scoring)
    assert elapsed < 60, elapsed
