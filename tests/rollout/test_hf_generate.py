"""The transformers ``generate`` backend on the tiny model: padding, stopping, grouping, seeding,
and the sampling distribution itself."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare
from transformers import AutoModelForCausalLM

from mtgrpo.models import apply_lora, load_model_and_tokenizer
from mtgrpo.rollout import HFGenerateBackend, SamplingParams, make_backend
from tolerance import assert_close_f32

EOS, PAD = 258, 256  # <|im_end|>, <|endoftext|>
STOPS = {EOS, PAD}  # the tiny model's generation_config.eos_token_id
# Prompts of different lengths (1 to 12 tokens), so a batch needs left padding.
PROMPTS = [[71, 100, 107, 107, 110], [257, 116, 114, 100, 113, 11, 1, 3, 9, 11, 80, 12], [42],
           [12, 11, 12, 28]]


def _model(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path)


def _reference_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int,
                      stop_ids: set[int]) -> tuple[list[int], bool]:
    """Greedy decoding as a plain loop: full forward pass on the unpadded sequence, no cache."""
    ids, completion = list(prompt), []
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]  # [V]
        token = int(logits.argmax())
        completion.append(token)
        ids.append(token)
        if token in stop_ids:
            return completion, True
    return completion, False


def _next_token_probs(
    model: torch.nn.Module, prompt: list[int], temperature: float
) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].double()  # [V]
    return torch.softmax(logits / temperature, dim=-1)


def _logit_size(model: torch.nn.Module, prompt: list[int], temperature: float) -> float:
    """max |logits / T| of the next token: the size at which a float32 log_softmax rounds (the
    log-probs of likely tokens are much smaller than that, see tests/tolerance.py)."""
    with torch.no_grad():
        return float(model(torch.tensor([prompt])).logits[0, -1].abs().max()) / temperature


def _chi_square_pvalue(samples: list[int], probs: torch.Tensor) -> float:
    """Pearson's test of the sample counts against ``probs``, pooling tokens expected < 5 times."""
    n = len(samples)
    counts = Counter(samples)
    expected = (probs * n).tolist()
    big = [t for t, e in enumerate(expected) if e >= 5]
    observed = [counts[t] for t in big] + [n - sum(counts[t] for t in big)]
    wanted = [expected[t] for t in big] + [n - sum(expected[t] for t in big)]
    if wanted[-1] < 1e-9:
        observed, wanted = observed[:-1], wanted[:-1]
    return float(chisquare(observed, wanted).pvalue)


def test_greedy_batched_with_left_padding_equals_each_prompt_alone(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    params = SamplingParams(max_new_tokens=10, greedy=True)
    batched = HFGenerateBackend(model, max_batch_size=64).generate(PROMPTS, params)
    micro = HFGenerateBackend(model, max_batch_size=3).generate(PROMPTS, params)
    unbounded = HFGenerateBackend(model, max_batch_size=None).generate(PROMPTS, params)
    assert unbounded.completion_ids == batched.completion_ids
    alone = HFGenerateBackend(model, max_batch_size=1).generate(PROMPTS, params)
    reference = [_reference_greedy(model, p, 10, STOPS) for p in PROMPTS]
    assert batched.completion_ids == micro.completion_ids == alone.completion_ids
    assert batched.completion_ids == [completion for completion, _ in reference]
    assert batched.finished == [finished for _, finished in reference]
    assert batched.prompt_ids == PROMPTS


def test_completions_stop_at_eos_and_finished_is_right(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    first = _reference_greedy(model, PROMPTS[0], 1, set())[0][0]
    with torch.no_grad():
        # Make EOS's output row 3x the row of prompt 0's greedy first token: wherever that
        # token's logit is the (positive) maximum, EOS's is 3x larger and wins.
        model.lm_head.weight[EOS] = 3 * model.lm_head.weight[first]
    out = HFGenerateBackend(model).generate(PROMPTS, SamplingParams(max_new_tokens=8, greedy=True))
    reference = [_reference_greedy(model, p, 8, STOPS) for p in PROMPTS]
    assert out.completion_ids == [completion for completion, _ in reference]
    assert out.finished == [finished for _, finished in reference]
    assert out.completion_ids[0] == [EOS]  # the forced stop
    assert False in out.finished  # and at least one row cut at max_new_tokens
    for completion, finished in zip(out.completion_ids, out.finished, strict=True):
        stops = [i for i, t in enumerate(completion) if t in STOPS]
        assert stops == ([len(completion) - 1] if finished else [])
        assert finished or len(completion) == 8


def test_extra_stop_token_cuts_at_its_first_occurrence(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    free, _ = _reference_greedy(model, PROMPTS[1], 10, STOPS)
    stop = free[4]
    cut = free.index(stop) + 1
    params = SamplingParams(max_new_tokens=10, greedy=True, stop_token_ids=(stop,))
    out = HFGenerateBackend(model).generate(PROMPTS, params)
    assert out.completion_ids[1] == free[:cut]
    assert out.finished[1]
    assert out.completion_ids == [_reference_greedy(model, p, 10, STOPS | {stop})[0]
                                  for p in PROMPTS]


def test_num_samples_rows_are_grouped_by_prompt(tiny_model_dir: Path) -> None:
    backend = HFGenerateBackend(_model(tiny_model_dir), max_batch_size=5)
    greedy = backend.generate(PROMPTS[:2], SamplingParams(max_new_tokens=6, greedy=True),
                              num_samples=3)
    alone = backend.generate(PROMPTS[:2], SamplingParams(max_new_tokens=6, greedy=True))
    assert greedy.prompt_ids == [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3
    assert greedy.completion_ids == [alone.completion_ids[0]] * 3 + [alone.completion_ids[1]] * 3
    sampled = backend.generate(PROMPTS, SamplingParams(max_new_tokens=6, seed=1), num_samples=4)
    assert len(sampled) == 16
    assert sampled.prompt_ids == [p for p in PROMPTS for _ in range(4)]


def test_seeded_sampling_is_reproducible_and_leaves_the_global_rng(tiny_model_dir: Path) -> None:
    backend = HFGenerateBackend(_model(tiny_model_dir), max_batch_size=4)
    params = SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=123)
    state = torch.random.get_rng_state()
    first = backend.generate(PROMPTS, params, num_samples=2)
    assert torch.equal(torch.random.get_rng_state(), state)
    second = backend.generate(PROMPTS, params, num_samples=2)
    other = backend.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0.9,
                                                     top_p=0.95, seed=124), num_samples=2)
    assert first.completion_ids == second.completion_ids
    assert first.finished == second.finished
    assert first.completion_ids != other.completion_ids


def test_unseeded_sampling_follows_the_global_rng(tiny_model_dir: Path) -> None:
    backend = HFGenerateBackend(_model(tiny_model_dir))
    params = SamplingParams(max_new_tokens=8)
    torch.manual_seed(5)
    first = backend.generate(PROMPTS, params).completion_ids
    second = backend.generate(PROMPTS, params).completion_ids
    torch.manual_seed(5)
    assert backend.generate(PROMPTS, params).completion_ids == first
    assert first != second


def _spy_on_processors(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    captured: list[list[str]] = []
    original = model._get_logits_processor

    def spy(*args: object, **kwargs: object) -> object:
        processors = original(*args, **kwargs)
        captured.append([type(p).__name__ for p in processors])
        return processors

    monkeypatch.setattr(model, "_get_logits_processor", spy)
    return captured


def test_only_temperature_top_p_and_explicit_top_k_shape_the_distribution(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(tiny_model_dir)
    # A checkpoint whose generation_config.json asks for all the usual extras:
    saved = model.generation_config
    saved.update(top_k=20, repetition_penalty=1.3, min_new_tokens=4, min_p=0.05,
                 suppress_tokens=[5], temperature=0.6, do_sample=True)
    captured = _spy_on_processors(model, monkeypatch)
    backend = HFGenerateBackend(model)
    for params in (SamplingParams(max_new_tokens=2, temperature=0.7, top_p=0.9),
                   SamplingParams(max_new_tokens=2),
                   SamplingParams(max_new_tokens=2, top_k=5),
                   SamplingParams(max_new_tokens=2, greedy=True)):
        backend.generate(PROMPTS[:1], params)
    assert captured == [["TemperatureLogitsWarper", "TopPLogitsWarper"], [],
                        ["TopKLogitsWarper"], []]
    # the model's own generation config is back in place, untouched
    assert model.generation_config is saved
    assert (saved.top_k, saved.min_new_tokens, saved.repetition_penalty) == (20, 4, 1.3)


def test_default_top_k_is_really_off(tiny_model_dir: Path) -> None:
    # The untrained model is close to uniform over 259 tokens: 3000 draws of the first token see
    # about 259 * (1 - exp(-3000/259)) ~ 259 distinct tokens; generate's default top-k 50 would
    # allow at most 50.
    out = HFGenerateBackend(_model(tiny_model_dir), max_batch_size=3000).generate(
        [PROMPTS[0]], SamplingParams(max_new_tokens=1, seed=0), num_samples=3000
    )
    assert len({c[0] for c in out.completion_ids}) > 200


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_first_token_frequencies_match_softmax_over_temperature(
    tiny_model_dir: Path, temperature: float
) -> None:
    model = _model(tiny_model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(25.0)  # a peaked distribution, so temperature matters
    probs = _next_token_probs(model, PROMPTS[1], temperature)  # softmax(logits / T)
    n = 4000
    out = HFGenerateBackend(model, max_batch_size=n).generate(
        [PROMPTS[1]],
        SamplingParams(max_new_tokens=1, temperature=temperature, seed=11, return_logprobs=True),
        num_samples=n,
    )
    samples = [c[0] for c in out.completion_ids]
    assert _chi_square_pvalue(samples, probs) > 1e-3
    # the same samples are far from what T = 1 (no temperature) would give
    if temperature != 1.0:
        assert _chi_square_pvalue(samples, _next_token_probs(model, PROMPTS[1], 1.0)) < 1e-6
    # the engine's log-probs are log softmax(logits / T) of the drawn token
    assert out.logprobs is not None
    # float32 logits of 4000 rows against one, log-softmaxed in float32 against float64: a few
    # roundings of logits / T of 7 to 25; sampling at T = 1 instead is off by more than 0.1
    got = torch.tensor([lp[0] for lp in out.logprobs], dtype=torch.float64)
    scale = _logit_size(model, PROMPTS[1], temperature)
    assert_close_f32(got, probs.log()[samples], ulps=16, scale=scale)


def test_top_p_keeps_exactly_the_nucleus(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(25.0)
    temperature, top_p = 0.8, 0.7
    probs = _next_token_probs(model, PROMPTS[2], temperature)
    # Nucleus by a plain loop: most probable first, keep a token while the mass before it < p.
    nucleus, mass_before = [], 0.0
    for token in sorted(range(len(probs)), key=lambda t: -float(probs[t])):
        if mass_before >= top_p:
            break
        nucleus.append(token)
        mass_before += float(probs[token])
    assert 1 < len(nucleus) < 20
    expected = torch.zeros_like(probs)
    expected[nucleus] = probs[nucleus] / probs[nucleus].sum()
    n = 4000
    out = HFGenerateBackend(model, max_batch_size=n).generate(
        [PROMPTS[2]],
        SamplingParams(max_new_tokens=1, temperature=temperature, top_p=top_p, seed=3,
                       return_logprobs=True),
        num_samples=n,
    )
    samples = [c[0] for c in out.completion_ids]
    assert set(samples) <= set(nucleus)
    assert _chi_square_pvalue(samples, expected) > 1e-3
    # (as above, plus the renormalisation; the unrestricted softmax is off by -log(0.7) or more)
    got = torch.tensor([lp[0] for lp in out.logprobs or []], dtype=torch.float64)
    scale = _logit_size(model, PROMPTS[2], temperature)
    assert_close_f32(got, expected.log()[samples], ulps=16, scale=scale)


def test_logprobs_match_a_teacher_forced_forward_pass(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    temperature = 0.8
    out = HFGenerateBackend(model, max_batch_size=3).generate(
        PROMPTS,
        SamplingParams(max_new_tokens=9, temperature=temperature, seed=2, return_logprobs=True),
        num_samples=2,
    )
    assert out.logprobs is not None
    for prompt, completion, logprobs in zip(out.prompt_ids, out.completion_ids, out.logprobs,
                                            strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0]  # [P+L, V]
        steps = logits[len(prompt) - 1 : -1] / temperature  # [L, V]: predicts each completion token
        expected = torch.log_softmax(steps, dim=-1).gather(
            -1, torch.tensor(completion)[:, None])[:, 0]
        # KV-cached generate against one forward (tests/tolerance.py); the wrong temperature
        # or a shifted position is off by more than 1e-2
        assert_close_f32(torch.tensor(logprobs), expected, ulps=64)


def test_model_mode_is_restored(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    backend = HFGenerateBackend(model)
    params = SamplingParams(max_new_tokens=2, seed=0)
    model.train()
    backend.generate(PROMPTS[:1], params)
    assert model.training
    model.eval()
    backend.generate(PROMPTS[:1], params)
    assert not model.training


def test_update_weights_records_the_version_and_loads_state(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from mtgrpo.models import build_tiny_model

    model = _model(tiny_model_dir)
    backend = HFGenerateBackend(model)
    greedy = SamplingParams(max_new_tokens=6, greedy=True)
    assert backend.generate(PROMPTS, greedy).weights_version is None
    backend.update_weights(model, version=3)
    assert backend.model is model
    assert backend.generate(PROMPTS, greedy).weights_version == 3

    other = _model(build_tiny_model(tmp_path / "other", seed=1))
    expected = HFGenerateBackend(other).generate(PROMPTS, greedy).completion_ids
    backend.update_weights(other.state_dict(), version=4)
    out = backend.generate(PROMPTS, greedy)
    assert (out.completion_ids, out.weights_version) == (expected, 4)
    assert backend.model is model  # loaded in place

    with pytest.raises(ValueError, match=r"1 key\(s\) the generation model lacks"):
        backend.update_weights({"not.a.weight": torch.zeros(1)}, version=5)
    with pytest.raises(ValueError, match="version must be an int >= 0"):
        backend.update_weights(model, version=-1)
    with pytest.raises(TypeError, match="takes a model or a state dict, got list"):
        backend.update_weights([1, 2], version=6)


def test_lora_policy_generates_with_its_adapters(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = _model(tiny_model_dir)
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    expected = HFGenerateBackend(base).generate(PROMPTS, greedy).completion_ids
    base.generation_config.top_k = 20  # must not leak through the peft wrapper either
    policy = apply_lora(base)
    captured = _spy_on_processors(base, monkeypatch)
    backend = make_backend("hf", policy, None)
    # zero-initialised lora_B: the adapter is the identity
    assert backend.generate(PROMPTS, greedy).completion_ids == expected
    backend.generate(PROMPTS[:1], SamplingParams(max_new_tokens=1, seed=0))
    assert captured[-1] == []
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(std=1.0, generator=torch.Generator().manual_seed(0))
    assert backend.generate(PROMPTS, greedy).completion_ids != expected


def test_eos_and_pad_come_from_model_and_tokenizer(tiny_model_dir: Path) -> None:
    loaded = load_model_and_tokenizer(tiny_model_dir)
    backend = make_backend("hf", loaded.model, loaded.tokenizer, max_batch_size=2)
    assert backend.eos_token_ids == (EOS, PAD)
    assert backend.pad_token_id == PAD
    assert HFGenerateBackend(loaded.model, eos_token_ids=[7]).eos_token_ids == (7,)


def test_bad_arguments_are_refused(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    with pytest.raises(ValueError, match=r"max_batch_size must be >= 1 \(or None: no limit\)"):
        HFGenerateBackend(model, max_batch_size=0)
    with pytest.raises(TypeError, match=r"max_batch_size must be an int or None, got 2\.5"):
        HFGenerateBackend(model, max_batch_size=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="has no generate"):
        HFGenerateBackend(torch.nn.Linear(2, 2))
    backend = HFGenerateBackend(model)
    with pytest.raises(TypeError, match="params must be a SamplingParams, got dict"):
        backend.generate(PROMPTS, {"max_new_tokens": 3})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"invalid token ids \[259\]; .* in \[0, 259\)"):
        backend.generate([[1, 259]], SamplingParams(max_new_tokens=3))
    with pytest.raises(ValueError, match="num_samples must be an int >= 1, got 0"):
        backend.generate(PROMPTS, SamplingParams(max_new_tokens=3), num_samples=0)
