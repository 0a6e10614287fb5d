"""The generation contract as the training loop uses it: an engine that keeps its own copy of the
weights (the stand-in of an external engine such as a vLLM server) is handed the new weights
after every optimizer step, and the log-probabilities it returns are compared with the
trainer's (``generation/logprob_mismatch_*``, ``generation/kl_k3``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch
import trainer_helpers as _common
from transformers import AutoModelForCausalLM, AutoTokenizer

from mtgrpo import GRPOTrainer
from mtgrpo.rollout import GenerationOutput, HFGenerateBackend, SamplingParams
from tolerance import f32_atol

MISMATCH_KEYS = ("generation/logprob_mismatch_mean", "generation/logprob_mismatch_max",
                 "generation/kl_k3")


class CopyEngine:
    """An external engine's stand-in: its own copy of the weights, loaded from the checkpoint
    the policy starts from (as a server would load it), changed only by ``update_weights``;
    it samples with transformers ``generate`` on that copy and returns its log-probs.
    ``follow=False``: an engine that records the version but keeps its old weights."""

    cheap_logprobs = True

    def __init__(self, model_dir: Any, follow: bool = True) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.sampler = HFGenerateBackend(self.model, AutoTokenizer.from_pretrained(model_dir))
        self.follow = follow
        self.weights_version: int | None = None

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                 num_samples: int = 1) -> GenerationOutput:
        out = self.sampler.generate(prompt_ids, params, num_samples)
        out.weights_version = self.weights_version
        return out

    def update_weights(self, model_or_state: Any, version: int) -> None:
        if self.follow:
            state = model_or_state.state_dict() if isinstance(model_or_state, torch.nn.Module) \
                else model_or_state
            self.model.load_state_dict(state)  # copies into the engine's own tensors
        self.weights_version = version


class RecordingTrainer(GRPOTrainer):
    """Keeps, after every training step, the step's metrics and the largest difference between
    the engine's weights and the policy's, per parameter."""

    def training_step(self) -> dict[str, Any]:
        metrics = super().training_step()
        self.records.append((self.step, metrics, _weight_gaps(self)))
        return metrics


class ForgetfulTrainer(RecordingTrainer):
    """A broken loop: it never hands the backend the new weights."""

    def _push_weights(self) -> None:
        pass


def _weight_gaps(trainer: GRPOTrainer) -> dict[str, tuple[float, float]]:
    """name -> (max |engine - policy|, tolerance): ``f32_atol(policy, 1 ulp)``. The copy here is
    exact; one ulp of the weights' magnitude admits an engine whose transfer rounds once (a
    serialisation round trip), far below what one optimizer step moves a weight (checked)."""
    engine = dict(trainer.backend.model.named_parameters())
    gaps = {}
    for name, param in trainer.unwrapped.named_parameters():
        gap = float((engine[name].detach() - param.detach()).abs().max())
        gaps[name] = (gap, f32_atol(param.detach(), ulps=1))
    return gaps


def _trainer(cls: type[RecordingTrainer], model_dir: Any, tmp_path: Any, engine: CopyEngine,
             **overrides: Any) -> RecordingTrainer:
    trainer = cls(
        str(model_dir), [_common.alpha_reward, _common.beta_reward],
        args=_common.args(tmp_path, **overrides), train_dataset=_common.rows(),
        generation_backend=engine,
    )
    trainer.records = []
    return trainer


def _assert_engine_current(records: list[tuple[int, dict[str, Any], dict]]) -> None:
    for step, _, gaps in records:
        stale = {name: gap for name, (gap, atol) in gaps.items() if gap > atol}
        assert not stale, f"after step {step} the engine's weights differ from the policy's: " \
                          f"{dict(list(stale.items())[:3])}"


def test_an_engine_with_its_own_weights_is_kept_current_after_every_step(tiny_model_dir,
                                                                        tmp_path):
    engine = CopyEngine(tiny_model_dir)
    trainer = _trainer(RecordingTrainer, tiny_model_dir, tmp_path, engine, max_steps=3)
    shared = {p.data_ptr() for p in trainer.unwrapped.parameters()}
    assert not shared & {p.data_ptr() for p in engine.model.parameters()}  # its own copy
    initial = {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters()}
    trainer.train()
    assert [step for step, _, _ in trainer.records] == [1, 2, 3]
    _assert_engine_current(trainer.records)
    assert engine.weights_version == trainer.step == 3
    # the steps really moved the weights far beyond the tolerance, so equality means something
    moved = max(float((p.detach() - initial[n]).abs().max())
                for n, p in trainer.unwrapped.named_parameters())
    assert moved > 1000 * max(atol for _, atol in trainer.records[-1][2].values())


def test_a_loop_that_skips_update_weights_is_caught(tiny_model_dir, tmp_path):
    engine = CopyEngine(tiny_model_dir)
    trainer = _trainer(ForgetfulTrainer, tiny_model_dir, tmp_path, engine, max_steps=2)
    trainer.train()
    with pytest.raises(AssertionError, match="after step 1 the engine's weights differ"):
        _assert_engine_current(trainer.records)
    assert engine.weights_version is None  # and no version was ever reported


def test_the_logprob_mismatch_is_zero_for_current_weights_and_not_for_stale_ones(
        tiny_model_dir, tmp_path):
    current = _trainer(RecordingTrainer, tiny_model_dir, tmp_path / "current",
                       CopyEngine(tiny_model_dir), max_steps=2, learning_rate=5e-2)
    current.train()
    stale = _trainer(RecordingTrainer, tiny_model_dir, tmp_path / "stale",
                     CopyEngine(tiny_model_dir, follow=False), max_steps=2, learning_rate=5e-2)
    stale.train()
    # The engine decodes with a KV cache, the trainer runs one forward over the whole sequence:
    # 64 ulps (tests/tolerance.py) of the roundings' magnitude, the log-softmax normaliser,
    # about log V for this small random model (times 2 for a margin on the largest logit).
    vocab = current.unwrapped.config.vocab_size
    atol = f32_atol(2 * math.log(vocab), ulps=64)
    for step, metrics, _ in current.records:
        assert set(MISMATCH_KEYS) <= set(metrics), f"step {step}: {sorted(metrics)}"
        assert metrics["generation/logprob_mismatch_max"] <= atol, (step, metrics)
        assert abs(metrics["generation/kl_k3"]) <= atol, (step, metrics)
    # step 1 samples from the starting weights in both runs; step 2 of the stale run samples
    # from them again while the policy has moved
    first, second = (metrics for _, metrics, _ in stale.records)
    assert first["generation/logprob_mismatch_max"] <= atol
    assert second["generation/logprob_mismatch_mean"] > 100 * atol
    assert second["generation/kl_k3"] > 100 * atol


@pytest.mark.parametrize(("backend", "option", "asked"), [
    ("static", None, True),   # the static backend computes them while sampling
    ("hf", None, False),      # generate would keep every step's scores
    ("hf", True, True),
    ("static", False, False),
])
def test_log_probs_are_asked_for_when_cheap_or_configured(tiny_model_dir, tmp_path, backend,
                                                         option, asked):
    trainer = GRPOTrainer(
        str(tiny_model_dir), [_common.alpha_reward, _common.beta_reward],
        args=_common.args(tmp_path, max_steps=1, generation_backend=backend,
                          generation_logprobs=option),
        train_dataset=_common.rows(),
    )
    assert trainer.sampling_params.return_logprobs is asked
    metrics = trainer.training_step()
    assert (set(MISMATCH_KEYS) <= set(metrics)) is asked


class NoLogprobEngine(CopyEngine):
    """An engine that ignores ``return_logprobs``: its outputs never carry log-probabilities."""

    cheap_logprobs = False

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                 num_samples: int = 1) -> GenerationOutput:
        out = super().generate(prompt_ids, params, num_samples)
        out.logprobs = None
        return out


@pytest.mark.parametrize("option", [True, None])
def test_asking_an_engine_without_log_probs_warns_once(tiny_model_dir, tmp_path, caplog,
                                                       option):
    """``generation_logprobs: true`` with an engine that returns none: the mismatch metrics
    are missing, and the log says so once (not every step); unasked, nothing is said."""
    trainer = _trainer(RecordingTrainer, tiny_model_dir, tmp_path, NoLogprobEngine(tiny_model_dir),
                       max_steps=3, generation_logprobs=option)
    with caplog.at_level("WARNING", logger="mtgrpo.trainer.trainer"):
        trainer.train()
    assert [step for step, _, _ in trainer.records] == [1, 2, 3]
    assert not any(set(MISMATCH_KEYS) & set(metrics) for _, metrics, _ in trainer.records)
    said = [r.getMessage() for r in caplog.records
            if "returned no log-probabilities" in r.getMessage()]
    if option:
        assert len(said) == 1, said
        assert "NoLogprobEngine" in said[0]
        assert "generation_logprobs: false" in said[0]
    else:
        assert said == []


def test_a_resumed_run_hands_the_engine_the_checkpoint_weights(tiny_model_dir, tmp_path):
    """The engine of a resumed run starts from the initial checkpoint, as a server would; the
    trainer pushes the resumed weights before generating, so the first resumed step samples
    from them (without the push its log-probs would be a step behind: mismatch far above 0)."""
    first = _trainer(RecordingTrainer, tiny_model_dir, tmp_path, CopyEngine(tiny_model_dir),
                     max_steps=2, save_steps=2, learning_rate=5e-2)
    first.train()
    engine = CopyEngine(tiny_model_dir)
    resumed = _trainer(RecordingTrainer, tiny_model_dir, tmp_path, engine, max_steps=3,
                       save_steps=2, learning_rate=5e-2, resume_from_checkpoint=True)
    resumed.train()
    [(step, metrics, _)] = resumed.records
    assert step == 3
    assert engine.weights_version == 3
    _assert_engine_current(resumed.records)
    # the tolerance of the mismatch test above
    atol = f32_atol(2 * math.log(resumed.unwrapped.config.vocab_size), ulps=64)
    assert metrics["generation/logprob_mismatch_max"] <= atol
