"""The backend contract: sampling parameters, outputs, the protocol and the registry."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from mtgrpo.rollout import (
    BACKENDS,
    GenerationBackend,
    GenerationOutput,
    HFGenerateBackend,
    SamplingParams,
    check_num_samples,
    check_prompt_ids,
)


class EchoEngine:
    """A stand-in for an external engine: completes every prompt with its own last token + EOS."""

    def __init__(self, eos: int) -> None:
        self.eos = eos
        self.version: int | None = None

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, num_samples: int = 1
    ) -> GenerationOutput:
        rows = [list(p) for p in prompt_ids for _ in range(num_samples)]
        return GenerationOutput(
            prompt_ids=rows,
            completion_ids=[[p[-1], self.eos] for p in rows],
            finished=[True] * len(rows),
            weights_version=self.version,
        )

    def update_weights(self, model_or_state: Any, version: int) -> None:
        self.version = version


def test_sampling_params_defaults_and_greedy() -> None:
    params = SamplingParams(max_new_tokens=8)
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (1.0, 1.0, 0, None)
    assert not params.is_greedy
    assert SamplingParams(max_new_tokens=8, temperature=0).is_greedy
    assert SamplingParams(max_new_tokens=8, greedy=True, temperature=0.7).is_greedy


def test_stop_token_ids_are_stored_as_a_tuple() -> None:
    params = SamplingParams(max_new_tokens=4, stop_token_ids=[5, 9])  # type: ignore[arg-type]
    assert params.stop_token_ids == (5, 9)
    assert hash(params) == hash(SamplingParams(max_new_tokens=4, stop_token_ids=(5, 9)))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_new_tokens": 0}, r"max_new_tokens must be an int >= 1, got 0"),
        ({"max_new_tokens": 2.0}, r"max_new_tokens must be an int >= 1, got 2\.0"),
        ({"max_new_tokens": 4, "temperature": -0.1}, r"temperature must be >= 0"),
        ({"max_new_tokens": 4, "temperature": float("nan")}, r"temperature must be >= 0"),
        ({"max_new_tokens": 4, "top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"max_new_tokens": 4, "top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"max_new_tokens": 4, "top_k": -1}, r"top_k must be an int >= 0 \(0 = off\)"),
        ({"max_new_tokens": 4, "seed": "7"}, r"seed must be an int or None"),
        ({"max_new_tokens": 4, "stop_token_ids": (3, -1)}, r"stop_token_ids must be non-neg"),
    ],
)
def test_sampling_params_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_generation_output_checks_row_alignment() -> None:
    out = GenerationOutput(
        [[1], [2]], [[3, 4], [5]], [True, False], logprobs=[[-1.0, -2.0], [-3.0]]
    )
    assert len(out) == 2
    assert out.completion_lengths == [2, 1]
    with pytest.raises(ValueError, match="2 prompts, 1 completions, 2 finished flags"):
        GenerationOutput([[1], [2]], [[3]], [True, False])
    with pytest.raises(ValueError, match="one value per completion token"):
        GenerationOutput([[1]], [[3, 4]], [True], logprobs=[[-1.0]])


def test_protocol_admits_the_hf_backend_and_an_external_engine() -> None:
    engine = EchoEngine(eos=0)
    assert isinstance(engine, GenerationBackend)
    out = engine.generate([[7, 8], [9]], SamplingParams(max_new_tokens=2), num_samples=2)
    assert out.prompt_ids == [[7, 8], [7, 8], [9], [9]]
    assert out.completion_ids == [[8, 0], [8, 0], [9, 0], [9, 0]]
    assert issubclass(HFGenerateBackend, GenerationBackend)


def test_registry_names_and_errors() -> None:
    assert "hf" in BACKENDS.names()
    assert BACKENDS.get("transformers") is HFGenerateBackend
    with pytest.raises(ValueError, match=r"unknown generation backend 'vllm'; valid names: hf"):
        BACKENDS.get("vllm")
    with pytest.raises(ValueError, match="'hf' is already registered"):
        BACKENDS.add("hf", EchoEngine)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("prompts", "error", "match"),
    [
        ("hello", TypeError, "tokenize text prompts first"),
        ([], ValueError, "prompt_ids is empty"),
        ([[1, 2], []], ValueError, "prompt 1 is empty"),
        ([[1, 2], "ab"], TypeError, "prompt 1 is a str"),
        ([[1, 300]], ValueError, r"prompt 0 holds invalid token ids \[300\]; .*\[0, 259\)"),
        ([[1, -2, True]], ValueError, r"invalid token ids \[-2, True\]"),
    ],
)
def test_prompt_validation(prompts: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        check_prompt_ids(prompts, vocab_size=259)


def test_prompt_validation_returns_lists() -> None:
    assert check_prompt_ids(((1, 2), range(3))) == [[1, 2], [0, 1, 2]]


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_num_samples_validation(bad: object) -> None:
    with pytest.raises(ValueError, match="num_samples must be an int >= 1"):
        check_num_samples(bad)
