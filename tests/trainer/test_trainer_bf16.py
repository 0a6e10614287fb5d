"""bf16 on the CPU, end to end on the tiny model: bf16 autocast in the update, generation from a
bfloat16 copy of the float32 policy that the trainer keeps current after every optimizer step,
and ``bf16: auto`` following the CPU's features."""

from __future__ import annotations

import pytest
import torch
import trainer_helpers as _common

from mtgrpo import GRPOTrainer
from mtgrpo.fast.replica import WeightReplica
from mtgrpo.models import precision
from mtgrpo.reporting import read_metrics


def _trainer(tiny_model_dir, tmp_path, **overrides):
    return GRPOTrainer(
        str(tiny_model_dir), [_common.alpha_reward, _common.beta_reward],
        args=_common.args(tmp_path, **overrides), train_dataset=_common.rows(),
        peft_config={"r": 4, "lora_alpha": 8},
    )


def test_bf16_generates_from_a_copy_that_follows_every_optimizer_step(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, bf16=True, max_steps=2)
    assert trainer.backend.name == "static"
    assert trainer.backend.dtype is torch.bfloat16
    assert next(trainer.unwrapped.parameters()).dtype == torch.float32  # master weights
    versions = []
    original = trainer.backend.update_weights
    trainer.backend.update_weights = lambda model, version: (versions.append(version),
                                                             original(model, version))
    trainer.train()
    assert versions == [1, 2]  # pushed after each optimizer step
    assert trainer.backend.weights_version == 2
    served = trainer.backend.engine._lm
    expected = WeightReplica(trainer.unwrapped, torch.float32).module  # merged, float32
    for (name, got), want in zip(served.named_parameters(), expected.parameters(), strict=True):
        assert torch.equal(got, want.to(torch.bfloat16)), name  # the trained weights, rounded
    [run] = read_metrics(tmp_path, split="run")
    assert run["precision/bf16"] is True
    assert run["precision/bf16_reason"] == "bf16=True in the config"
    assert run["generation/dtype"] == "bfloat16"
    for record in read_metrics(tmp_path, split="train"):
        assert record["loss"] == pytest.approx(record["loss"])  # finite (NaN != NaN)


@pytest.mark.parametrize(("feature", "min_width", "on", "reason"), [
    ("avx512_bf16", 0, True, "auto: this CPU has avx512_bf16"),
    # the tiny model is 64 wide: too narrow for bf16 to pay on a CPU
    ("avx512_bf16", None, False, "auto: this CPU has avx512_bf16, but the model's hidden size 64 "
                                 "is below 256"),
    (None, 0, False, "auto: this CPU has no native bfloat16 instructions"),
])
def test_auto_follows_the_cpu_and_the_model_width(tiny_model_dir, tmp_path, monkeypatch, feature,
                                                  min_width, on, reason):
    monkeypatch.setattr(precision, "cpu_bf16_feature", lambda: feature)
    if min_width is not None:
        monkeypatch.setattr(precision, "CPU_BF16_MIN_WIDTH", min_width)
    trainer = _trainer(tiny_model_dir, tmp_path, bf16=None, max_steps=1)
    assert trainer.bf16 is on
    assert trainer.accelerator.mixed_precision == "no"  # on the CPU, bf16 is our own autocast
    with trainer._autocast():
        assert torch.is_autocast_enabled("cpu") is on
    assert trainer.backend.dtype == (torch.bfloat16 if on else None)
    trainer.train()
    [run] = read_metrics(tmp_path, split="run")
    assert run["generation/dtype"] == ("bfloat16" if on else "float32")
    assert run["precision/bf16_reason"].startswith(reason)


def test_a_policy_with_forward_hooks_generates_from_itself(tiny_model_dir, tmp_path):
    # cast_lm_head_to_fp32 hooks the head: a bfloat16 copy would not compute it alike
    trainer = _trainer(tiny_model_dir, tmp_path, bf16=True, max_steps=1,
                       cast_lm_head_to_fp32=True)
    assert trainer.backend.name == "static"
    assert trainer.backend.dtype is None
    trainer.train()
    [run] = read_metrics(tmp_path, split="run")
    assert run["generation/dtype"] == "float32"
