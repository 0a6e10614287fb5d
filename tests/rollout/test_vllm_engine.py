"""The vLLM backends against the real vLLM (CPU build): token-for-token greedy parity with the
``hf`` backend in float32, the engine's log-probs against the trainer's, weight sync that
provably happens (and a stale engine caught), a killed or restarted server, and a model vLLM
cannot serve refused before any engine starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mtgrpo.policy import sequence_logprobs
from mtgrpo.rollout import HFGenerateBackend, SamplingParams
from mtgrpo.rollout.vllm import EngineUnreachableError, StaleEngineError
from mtgrpo.rollout.vllm.engine import EngineOptions, check_model_servable
from mtgrpo.trainer.update import pad_policy_batch
from tolerance import assert_close_f32
from vllm_fixtures import ServerProcess

pytestmark = pytest.mark.vllm

PROMPTS = [[1, 2, 3, 4], [5, 6], [7, 8, 9, 10, 11, 12], [40, 41, 42]]
GREEDY = SamplingParams(max_new_tokens=16, greedy=True)


def _model(path: Path, seed: int | None = None) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if seed is not None:  # other weights than the directory's (which the engine loaded)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def _options(path: Path) -> EngineOptions:
    """The options a float32 trainer with vllm_max_model_length=512 and
    vllm_gpu_memory_utilization=0.01 starts (tests/trainer/test_trainer_vllm.py): one engine
    serves both files."""
    return EngineOptions(model=str(path), dtype="float32", max_model_len=512,
                         gpu_memory_utilization=0.01, enforce_eager=True, model_impl="vllm")


@pytest.fixture(params=["colocate", "server"])
def make_backend(request, vllm_model_dir):
    """``make(model) -> backend`` of either mode; the engine or server is the session's."""
    if request.param == "colocate":
        from mtgrpo.rollout.vllm.colocate import VLLMColocateBackend

        return lambda model, **kw: VLLMColocateBackend(
            model, engine_options=_options(vllm_model_dir), **kw)
    from mtgrpo.rollout.vllm.client import VLLMServerBackend

    server = request.getfixturevalue("vllm_server")
    return lambda model, **kw: VLLMServerBackend(model, url=server.url, timeout=60, **kw)


def _trainer_logps(model: torch.nn.Module, out) -> tuple[torch.Tensor, torch.Tensor,
                                                         torch.Tensor]:
    """(trainer's [n, L] log-probs, engine's [n, L], [n, L] mask) of the sampled tokens."""
    batch = pad_policy_batch(out.prompt_ids, out.completion_ids, torch.zeros(len(out)), 0,
                             sampling_logps=out.logprobs)
    with torch.no_grad():
        logps = sequence_logprobs(model, batch.input_ids, batch.attention_mask,
                                  batch.completion_length, temperature=1.0).logps
    return logps, batch.sampling_logps, batch.completion_mask.bool()


def test_greedy_completions_equal_the_hf_backend_token_for_token(make_backend, vllm_model_dir):
    model = _model(vllm_model_dir, seed=1)  # weights the engine only has if they were pushed
    backend = make_backend(model)
    ours = backend.generate(PROMPTS, GREEDY, 1)
    reference = HFGenerateBackend(model).generate(PROMPTS, GREEDY, 1)
    assert ours.completion_ids == reference.completion_ids
    assert ours.finished == reference.finished
    assert ours.weights_version == 0


def test_engine_logprobs_equal_the_trainers_and_a_stale_engine_shows(make_backend,
                                                                     vllm_model_dir):
    model = _model(vllm_model_dir, seed=2)
    backend = make_backend(model)
    sampled = SamplingParams(max_new_tokens=12, temperature=1.0, return_logprobs=True, seed=3)
    out = backend.generate(PROMPTS, sampled, 3)
    logps, engine, mask = _trainer_logps(model, out)
    # one forward against KV-cached decoding by other kernels (64 ulps of the largest |log p|)
    assert_close_f32(engine[mask], logps[mask], ulps=64)

    # the policy moves on (an optimizer step) without a push: the engine samples from the
    # old weights, and its log-probs are measurably not the policy's
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    stale = backend.generate(PROMPTS, sampled, 3)
    logps, engine, mask = _trainer_logps(model, stale)
    gap = (engine - logps)[mask].abs().max().item()
    assert gap > 1e-2, gap  # far above the tolerance above (about 5e-5)
    backend.update_weights(model, 1)
    synced = backend.generate(PROMPTS, sampled, 3)
    logps, engine, mask = _trainer_logps(model, synced)
    assert_close_f32(engine[mask], logps[mask], ulps=64)
    assert synced.weights_version == 1


def test_lora_is_pushed_merged(make_backend, vllm_model_dir):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_model(vllm_model_dir), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
        init_lora_weights=False))
    backend = make_backend(model)
    merged = HFGenerateBackend(model).generate(PROMPTS, GREEDY, 1)
    assert backend.generate(PROMPTS, GREEDY, 1).completion_ids == merged.completion_ids
    with model.disable_adapter():  # the adapter matters: without it the completions differ
        plain = HFGenerateBackend(model).generate(PROMPTS, GREEDY, 1)
    assert plain.completion_ids != merged.completion_ids


def test_a_second_backend_pushing_into_the_engine_makes_the_first_one_stale(make_backend,
                                                                           vllm_model_dir):
    first = make_backend(_model(vllm_model_dir, seed=4))
    make_backend(_model(vllm_model_dir, seed=5))  # pushes its own version 0
    first.update_weights(first.model, 1)
    make_backend(_model(vllm_model_dir, seed=5)).update_weights(
        _model(vllm_model_dir, seed=5), 7)
    with pytest.raises(StaleEngineError, match=r"version 7.*pushed (version )?1"):
        first.generate(PROMPTS, GREEDY, 1)


def test_killed_and_restarted_server(vllm_model_dir, tmp_path):
    """A server that stops mid-run is an error naming it within the timeout; one restarted
    in its place holds no pushed weights, which generation reports as a stale engine."""
    import time

    from mtgrpo.rollout.vllm.client import VLLMServerBackend

    server = ServerProcess(vllm_model_dir, tmp_path / "serve.log").start()
    try:
        backend = VLLMServerBackend(_model(vllm_model_dir), url=server.url, timeout=4)
        backend.generate(PROMPTS, GREEDY, 1)
        server.stop()
        begin = time.monotonic()
        with pytest.raises(EngineUnreachableError, match=rf"{server.url} did not answer"):
            backend.generate(PROMPTS, GREEDY, 1)
        assert time.monotonic() - begin < 4 + 3  # the timeout, and a retry's sleep at most
        server.start()
        with pytest.raises(StaleEngineError, match=r"weights version None.*restarted"):
            backend.generate(PROMPTS, GREEDY, 1)
    finally:
        server.stop()


def test_a_server_that_is_not_there_fails_within_its_timeout(vllm_model_dir):
    import time

    from mtgrpo.rollout.vllm.client import VLLMServerBackend
    from vllm_fixtures import free_port

    url = f"http://127.0.0.1:{free_port()}"
    begin = time.monotonic()
    with pytest.raises(EngineUnreachableError, match="mtgrpo vllm-serve MODEL"):
        VLLMServerBackend(_model(vllm_model_dir), url=url, timeout=2)
    assert time.monotonic() - begin < 2 + 3


def test_a_model_vllm_cannot_serve_on_the_cpu_is_refused_before_the_engine(tiny_model_dir):
    """The default tiny model has 16-wide heads, which vLLM's CPU attention does not run."""
    if torch.cuda.is_available():
        pytest.skip("the head-size rule is the CPU attention's")
    with pytest.raises(ValueError, match=r"head size is 16.*--hidden-size 128 --num-heads 2"):
        check_model_servable(_options(tiny_model_dir))
    with pytest.raises(ValueError, match=r"vllm_enable_sleep_mode=True.*only on GPUs"):
        check_model_servable(EngineOptions(model=str(tiny_model_dir), enable_sleep_mode=True))


def test_a_weight_push_with_foreign_names_fails_loudly(make_backend, vllm_model_dir):
    backend = make_backend(_model(vllm_model_dir))
    with pytest.raises(Exception, match=r"not_a_weight|refused|no attribute|weight"):
        backend.update_weights({"not_a_weight.weight": torch.zeros(3)}, 3)
    assert backend.weights_version == 0  # the failed push did not count


@pytest.fixture(scope="session")
def tied_model_dir(vllm_model_dir, tmp_path_factory) -> Path:
    """The tiny model with its head tied to the input embeddings (as Qwen2.5-0.5B's)."""
    out = tmp_path_factory.getbasetemp() / "tiny-llama-vllm-tied"
    if not (out / "config.json").is_file():
        from transformers import AutoTokenizer

        model = _model(vllm_model_dir)
        model.config.tie_word_embeddings = True
        model.tie_weights()
        model.save_pretrained(out)
        AutoTokenizer.from_pretrained(vllm_model_dir).save_pretrained(out)
    return out


def test_a_tied_head_follows_the_pushed_embeddings(tied_model_dir):
    """vLLM skips lm_head.weight of a tied model on a reload; its CPU matrix product keeps a
    packed copy of the embeddings, which the push must refresh."""
    from mtgrpo.rollout.vllm.colocate import VLLMColocateBackend

    model = _model(tied_model_dir)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    backend = VLLMColocateBackend(model, engine_options=_options(tied_model_dir))
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(
            torch.randn(model.get_input_embeddings().weight.shape,
                        generator=torch.Generator().manual_seed(6)) * 0.05)
    backend.update_weights(model, 1)
    sampled = SamplingParams(max_new_tokens=12, temperature=1.0, return_logprobs=True, seed=7)
    logps, engine, mask = _trainer_logps(model, backend.generate(PROMPTS, sampled, 2))
    assert_close_f32(engine[mask], logps[mask], ulps=64)
