"""Generation with transformers' ``model.generate``: the reference backend, any causal LM.

Departures from calling ``generate`` with its defaults, each on purpose:

1. The sampling distribution is exactly ``softmax(logits / T)`` (restricted by ``top_p`` and an
   explicit ``top_k``). ``generate`` fills every option the caller leaves unset from the model's
   ``generation_config.json`` and then from global defaults, which include top-k 50, and
   checkpoints often add a repetition penalty, ``min_p`` or a minimum length. Options that are
   off only when unset (``min_p``, ``sequence_bias``, ``suppress_tokens``, ...) cannot be turned
   off by a keyword, so for the duration of the call the model's generation config is replaced
   by a blank one and every sampling option is passed explicitly.
2. Generation always stops at the model's EOS ids (from its generation config and the
   tokenizer) plus ``SamplingParams.stop_token_ids``; the completion keeps the first stop token
   and drops everything after it.
3. Prompts of different lengths are left-padded within a micro-batch of at most
   ``max_batch_size`` rows; the attention mask keeps padding out of the computation.
4. ``SamplingParams.return_logprobs`` asks ``generate`` for its processed scores, which it keeps
   for every step (``L`` tensors ``[n, V]``): meant for checks and small models; a trainer
   recomputes log-probabilities with its own forward pass anyway.
5. With ``SamplingParams.seed`` set, sampling draws from ``torch.manual_seed(seed)`` inside a
   forked RNG state, so the caller's random state is untouched and the result depends only on
   the seed, the prompts, the parameters and ``max_batch_size``.
6. ``generation_options`` (TRL's ``min_p``, ``repetition_penalty``, ``generation_kwargs``,
   ``cache_implementation``) are added to the generation config of every call, on top of the
   sampling parameters; they change the sampling distribution, so the importance ratio of the
   update no longer starts at the sampler's distribution (as in TRL).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from mtgrpo.rollout.base import (
    BACKENDS,
    GenerationOutput,
    SamplingParams,
    check_num_samples,
    check_prompt_ids,
    check_weights_version,
    load_partial_state,
)

if TYPE_CHECKING:
    from transformers import GenerationConfig

__all__ = ["HFGenerateBackend"]


@dataclass
class _Chunk:
    """Completions of one micro-batch, before they are concatenated."""

    completion_ids: list[list[int]]
    finished: list[bool]
    logprobs: list[list[float]] | None


def _as_id_list(value: int | Sequence[int] | None) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def _generation_owner(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model whose ``generation_config`` ``generate`` reads (peft wraps it)."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model


@contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextmanager
def _blank_generation_config(model: torch.nn.Module) -> Iterator[None]:
    """Hide the model's generation config so that none of its options leak into sampling."""
    from transformers import GenerationConfig

    owner = _generation_owner(model)
    saved = owner.generation_config
    owner.generation_config = GenerationConfig()
    try:
        yield
    finally:
        owner.generation_config = saved


@contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    if seed is None:
        yield
        return
    # Fork the RNG of the accelerator that samples (cuda, xpu, mps, ...) as well as the CPU's.
    accelerator = device.type != "cpu"
    with torch.random.fork_rng(
        devices=[device.index or 0] if accelerator else [],
        device_type=device.type if accelerator else None,
    ):
        # torch.manual_seed seeds the CPU's and every accelerator's generator
        torch.manual_seed(seed)
        yield


class HFGenerateBackend:
    """A :class:`~mtgrpo.rollout.base.GenerationBackend` on transformers' ``generate``.

    ``model``: a transformers causal LM (or a peft model wrapping one). ``tokenizer``: used only
    for its pad and EOS ids (may be None when the model's generation config has them).
    ``max_batch_size``: most rows per ``generate`` call (a memory bound; ``None``: every row in
    one call). ``eos_token_ids``: override the EOS ids read from the model and tokenizer.
    ``generation_options``: extra ``GenerationConfig`` fields for every call (departure 6).
    """

    name = "hf"
    cheap_logprobs = False  # generate keeps every step's [n, V] scores to return them

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any = None,
        *,
        max_batch_size: int | None = 64,
        eos_token_ids: Sequence[int] | None = None,
        generation_options: Mapping[str, Any] | None = None,
    ) -> None:
        if max_batch_size is not None and (
            isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int)
        ):
            raise TypeError(f"max_batch_size must be an int or None, got {max_batch_size!r}")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(
                f"max_batch_size must be >= 1 (or None: no limit), got {max_batch_size}"
            )
        if not callable(getattr(model, "generate", None)):
            raise TypeError(f"{type(model).__name__} has no generate(); pass a causal LM")
        self.model = model
        self.max_batch_size = max_batch_size
        self.eos_token_ids: tuple[int, ...]
        self.eos_token_ids, self.pad_token_id = _special_ids(model, tokenizer, eos_token_ids)
        self.weights_version: int | None = None
        self.generation_options = dict(generation_options or {})

    @property
    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _vocab_size(self) -> int | None:
        embeddings = self.model.get_input_embeddings()
        return getattr(embeddings, "num_embeddings", None)

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        num_samples: int = 1,
    ) -> GenerationOutput:
        """Sample ``num_samples`` completions per prompt; rows grouped by prompt."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        prompts = check_prompt_ids(prompt_ids, self._vocab_size())
        group_size = check_num_samples(num_samples)
        # [N] rows grouped by prompt; copies, so that rows of one group do not share a list
        rows = [list(prompt) for prompt in prompts for _ in range(group_size)]
        stop_ids = tuple(dict.fromkeys(self.eos_token_ids + params.stop_token_ids))

        chunks: list[_Chunk] = []
        with (
            # no dropout while sampling; the caller's mode is restored afterwards
            _eval_mode(self.model),
            _blank_generation_config(self.model),
            torch.no_grad(),
            _seeded(params.seed, self._device),
        ):
            step = self.max_batch_size or len(rows)
            for start in range(0, len(rows), step):
                batch = rows[start : start + step]
                chunks.append(self._generate_chunk(batch, params, stop_ids))
        logprobs = None
        if params.return_logprobs:
            logprobs = [lp for chunk in chunks for lp in chunk.logprobs or []]
        return GenerationOutput(
            prompt_ids=rows,
            completion_ids=[c for chunk in chunks for c in chunk.completion_ids],
            finished=[f for chunk in chunks for f in chunk.finished],
            logprobs=logprobs,
            weights_version=self.weights_version,
        )

    def _generation_config(
        self, params: SamplingParams, stop_ids: tuple[int, ...]
    ) -> GenerationConfig:
        from transformers import GenerationConfig

        sampling: dict[str, Any] = {"do_sample": False}
        if not params.is_greedy:
            sampling = {
                "do_sample": True,
                "temperature": float(params.temperature),
                "top_p": float(params.top_p),
                "top_k": params.top_k,  # 0 disables generate's default top-k of 50
            }
        options = {
            # min_length above the prompt would mask EOS (MinLengthLogitsProcessor)
            "max_new_tokens": params.max_new_tokens, "min_length": 0, "num_beams": 1,
            "eos_token_id": list(stop_ids), "pad_token_id": self.pad_token_id,
            # generate's scores are the warped ones: the distribution each token came from
            "return_dict_in_generate": True, "output_scores": params.return_logprobs,
            **sampling,
        }
        if not params.is_greedy:
            options.update(self.generation_options)
        return GenerationConfig(**options)

    def _left_pad(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in batch)
        input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        # left: generate appends after the last column, so each prompt must end there
        for row, prompt in enumerate(batch):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1
        return input_ids.to(self._device), attention_mask.to(self._device)

    def _generate_chunk(
        self, batch: list[list[int]], params: SamplingParams, stop_ids: tuple[int, ...]
    ) -> _Chunk:
        input_ids, attention_mask = self._left_pad(batch)  # [n, P], [n, P]
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=self._generation_config(params, stop_ids),
        )
        # A replaced generate (a model's own, or a mock) may return the token tensor itself.
        # [n, P + L]: the padded prompt's columns, then the completion's
        sequences = output.sequences if hasattr(output, "sequences") else output
        generated = sequences[:, input_ids.shape[1] :].tolist()  # [n, L]
        lengths, finished = _cut_at_stop(generated, set(stop_ids))
        completions = [ids[:length] for ids, length in zip(generated, lengths, strict=True)]
        logprobs = None
        if params.return_logprobs:
            logprobs = _token_logprobs(output.scores, sequences[:, input_ids.shape[1] :])
            logprobs = [lp[:length] for lp, length in zip(logprobs, lengths, strict=True)]
        return _Chunk(completions, finished, logprobs)

    def update_weights(self, model_or_state: Any, version: int) -> None:
        """Point the backend at new policy weights and record their version.

        ``model_or_state``: the model object itself (the usual case, shared with the trainer:
        only the version is recorded), another model (generation switches to it), or a state
        dict loaded into the current model (a partial one, e.g. adapter weights only, is
        allowed; keys the model does not have are an error).
        """
        check_weights_version(version)
        if isinstance(model_or_state, torch.nn.Module):
            if not callable(getattr(model_or_state, "generate", None)):
                raise TypeError(f"{type(model_or_state).__name__} has no generate()")
            self.model = model_or_state
        elif isinstance(model_or_state, Mapping):
            load_partial_state(self.model, model_or_state)
        else:
            raise TypeError(
                "update_weights takes a model or a state dict, got "
                f"{type(model_or_state).__name__}"
            )
        self.weights_version = version


def _special_ids(
    model: torch.nn.Module, tokenizer: Any, eos_token_ids: Sequence[int] | None
) -> tuple[tuple[int, ...], int]:
    """EOS ids (generation config, then tokenizer, unless given) and the pad id."""
    generation_config = getattr(_generation_owner(model), "generation_config", None)
    if eos_token_ids is None:
        eos = _as_id_list(getattr(generation_config, "eos_token_id", None))
        # a config may list several (a chat model's end-of-turn id too); the tokenizer's joins them
        eos += _as_id_list(getattr(tokenizer, "eos_token_id", None))
        eos_token_ids = list(dict.fromkeys(eos))
    if not eos_token_ids:
        raise ValueError(
            "no EOS token id found in the model's generation config or the tokenizer; "
            "pass eos_token_ids=[...]"
        )
    eos_ids = tuple(int(t) for t in eos_token_ids)
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(generation_config, "pad_token_id", None)
    # Padding is masked out and cut from the outputs, so any id works; EOS is conventional.
    return eos_ids, int(pad) if pad is not None else eos_ids[0]


def _cut_at_stop(generated: list[list[int]], stop_ids: set[int]) -> tuple[list[int], list[bool]]:
    """Per row: the length up to and including the first stop token, and whether there was one."""
    lengths, finished = [], []
    for ids in generated:
        stop_at = next((i for i, token in enumerate(ids) if token in stop_ids), None)
        # the stop token is kept: a finished completion ends with it (the generation contract)
        lengths.append(len(ids) if stop_at is None else stop_at + 1)
        finished.append(stop_at is not None)
    return lengths, finished


def _token_logprobs(
    scores: tuple[torch.Tensor, ...], generated: torch.Tensor
) -> list[list[float]]:
    """log p(token) under the processed (tempered, nucleus-filtered) distribution of each step.

    ``scores``: L tensors ``[n, V]`` (the logits after generate's processors); ``generated``:
    ``[n, L]``. One step at a time, so no ``[n, L, V]`` copy is made on top of ``scores``.
    """
    chosen = [
        torch.log_softmax(step.float(), dim=-1).gather(-1, generated[:, i, None])[:, 0]  # [n]
        for i, step in enumerate(scores)
    ]
    return torch.stack(chosen, dim=1).tolist()  # [n, L]


BACKENDS.add("hf", HFGenerateBackend, aliases=("transformers", "hf_generate"))
