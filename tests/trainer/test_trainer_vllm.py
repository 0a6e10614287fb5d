"""The trainer with ``use_vllm=True`` against the real vLLM: colocated and server modes train 3
steps, full weights and LoRA; after every step the engine's log-probs of its own samples equal
the trainer's (so the weights were pushed), a lost push shows as a mismatch far above that and
a skipped one stops the run; a resume pushes the checkpoint's weights before its first step;
a task's own max_completion_length reaches vLLM's sampling parameters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_helpers import alpha_reward, args, beta_reward, rows

from mtgrpo import GRPOTrainer
from mtgrpo.rollout.vllm import StaleEngineError
from tolerance import f32_atol

pytestmark = pytest.mark.vllm

# 64 float32 ulps of the largest |log-prob| (about 5.6 for a 259-token vocabulary):
# KV-cached decoding by vLLM's kernels against the trainer's one forward
TOLERANCE = f32_atol(6.0, ulps=64)


def _args(tmp_path: Path, mode: str, server_url: str | None = None, **overrides):
    options = {"use_vllm": True, "vllm_mode": mode, "vllm_max_model_length": 512,
               "vllm_gpu_memory_utilization": 0.01, "max_steps": 3, "report_to": "none"}
    if server_url is not None:
        options.update(vllm_server_base_url=server_url, vllm_server_timeout=60)
    options.update(overrides)
    return args(tmp_path, **options)


def _trainer(model_dir: Path, config, **kwargs) -> GRPOTrainer:
    return GRPOTrainer(str(model_dir), reward_funcs={"alpha": [alpha_reward],
                                                     "beta": [beta_reward]},
                       args=config, train_dataset=rows(8), **kwargs)


def _step_metrics(trainer: GRPOTrainer) -> list[dict]:
    """The per-step entries (not the run's closing summary)."""
    return [e for e in trainer.state.log_history
            if "generation/logprob_mismatch_max" in e and "train_runtime" not in e]


def _assert_synced(trainer: GRPOTrainer, steps: int = 3) -> None:
    logged = _step_metrics(trainer)
    assert len(logged) == steps
    for entry in logged:
        assert entry["generation/logprob_mismatch_max"] <= TOLERANCE, entry
        # TRL's figures of the importance correction: ratios of 1 within float32 rounding
        assert entry["sampling/sampling_logp_difference/max"] <= TOLERANCE
        assert abs(entry["sampling/importance_sampling_ratio/mean"] - 1) <= 2 * TOLERANCE
    assert trainer.backend.weights_version == trainer.step == steps


@pytest.fixture(params=["colocate", "server"])
def mode(request):
    url = request.getfixturevalue("vllm_server").url if request.param == "server" else None
    return request.param, url


def test_three_steps_full_weights(vllm_model_dir, tmp_path, mode):
    trainer = _trainer(vllm_model_dir, _args(tmp_path, *mode))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    _assert_synced(trainer)
    assert trainer.backend.pushes == 4  # at the start (version 0) and after every step
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert record["generation/backend"] == "vllm"


def test_three_steps_lora(vllm_model_dir, tmp_path, mode):
    from peft import LoraConfig

    trainer = _trainer(vllm_model_dir, _args(tmp_path, *mode, learning_rate=5e-2),
                       peft_config=LoraConfig(r=4, lora_alpha=8,
                                              target_modules=["q_proj", "v_proj"]))
    trainer.train()
    _assert_synced(trainer)
    lora = {n: p for n, p in trainer.model.named_parameters() if "lora_B" in n}
    assert lora
    assert any(p.abs().max() > 0 for p in lora.values())


def test_a_lost_push_shows_as_a_mismatch_and_a_skipped_one_stops_the_run(vllm_model_dir,
                                                                        tmp_path):
    trainer = _trainer(vllm_model_dir, _args(tmp_path / "lost", "colocate",
                                             learning_rate=5e-2))
    # a push that records the version but moves no weights (a transport that lost them)
    engine = trainer.backend.engine
    trainer.backend.update_weights = lambda model, version: (
        engine.llm_engine.set_weight_version(str(version)),
        setattr(trainer.backend, "weights_version", version))
    trainer.train()
    mismatch = [e["generation/logprob_mismatch_max"] for e in _step_metrics(trainer)]
    assert mismatch[0] <= TOLERANCE  # step 1 samples from the start weights, pushed for real
    # then from weights the policy has left once an update changed it (a step whose groups
    # all had zero advantage changes nothing)
    assert max(mismatch[1:]) > 100 * TOLERANCE, mismatch

    skipped = _trainer(vllm_model_dir, _args(tmp_path / "skipped", "colocate"))
    skipped._push_weights = lambda: None
    with pytest.raises(StaleEngineError, match=r"weights version 0, but the trainer is at step 1"):
        skipped.train()


def test_resume_pushes_the_checkpoint_before_its_first_step(vllm_model_dir, tmp_path):
    first = _trainer(vllm_model_dir, _args(tmp_path, "colocate", max_steps=2, save_steps=2))
    first.train()
    resumed = _trainer(vllm_model_dir, _args(tmp_path, "colocate", max_steps=3))
    seen: list[int | None] = []
    generate = resumed.backend.generate

    def recording(*a, **k):
        seen.append(resumed.backend.engine_weights_version)
        return generate(*a, **k)

    resumed.backend.generate = recording
    resumed.train(resume_from_checkpoint=True)
    assert seen
    assert seen[0] == 2
    logged = _step_metrics(resumed)
    assert logged[-1]["generation/logprob_mismatch_max"] <= TOLERANCE


def test_a_tasks_own_completion_length_reaches_vllm(vllm_model_dir, tmp_path, monkeypatch):
    from mtgrpo.rollout.vllm import engine

    asked: list[int] = []  # max_tokens of each vLLM call
    original = engine.vllm_sampling

    def recording(params, n, *a, **k):
        sampling = original(params, n, *a, **k)
        asked.append(sampling.max_tokens)
        return sampling

    monkeypatch.setattr(engine, "vllm_sampling", recording)
    trainer = _trainer(vllm_model_dir, _args(
        tmp_path, "colocate", max_steps=1,
        task_generation={"alpha": {"max_completion_length": 3}}))
    lengths: dict[int, list[int]] = {}  # max_new_tokens -> completion lengths generated
    generate = trainer.backend.generate

    def generating(prompts, params, n):
        out = generate(prompts, params, n)
        lengths.setdefault(params.max_new_tokens, []).extend(out.completion_lengths)
        return out

    trainer.backend.generate = generating
    trainer.train()
    assert sorted(set(asked)) == [3, 12]  # alpha's own limit and the run's, in vLLM's params
    assert sorted(lengths) == [3, 12]
    assert max(lengths[3]) <= 3
    assert max(lengths[12]) > 3  # beta's completions are not cut at alpha's limit
