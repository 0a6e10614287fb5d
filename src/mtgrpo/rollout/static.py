"""The fast generation backend, registered as ``"static"`` (aliases ``"static_cache"``,
``"fast"``): the generation contract (:mod:`mtgrpo.rollout.base`) over the static-cache decode
engine of the speed layer (:class:`mtgrpo.fast.StaticGenerator`: static KV cache, its own
decode loop, sampling on the device, CUDA graphs on a GPU; how it works and where it departs
from ``generate`` is in :mod:`mtgrpo.fast.static`).

This class holds what belongs to the contract: checking the request, the EOS and pad ids, the
seed, the weights version, and the model-or-state-dict forms of ``update_weights``; the engine
sees token-id lists, a :class:`~mtgrpo.fast.SamplingRule` and a model. Which models it serves
and which it refuses: :mod:`mtgrpo.fast.static` and ``docs/fast_generation.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import nn

from mtgrpo.fast import SamplingRule, StaticGenerator
from mtgrpo.rollout.base import (
    BACKENDS,
    GenerationOutput,
    SamplingParams,
    check_num_samples,
    check_prompt_ids,
    check_weights_version,
    load_partial_state,
)
from mtgrpo.rollout.hf_generate import HFGenerateBackend, _eval_mode, _seeded, _special_ids

__all__ = ["StaticCacheBackend"]


class StaticCacheBackend:
    """A :class:`~mtgrpo.rollout.base.GenerationBackend` on the static-cache decode engine.

    ``model``: a transformers causal LM or a peft (LoRA) model wrapping one; shared, never
    copied. ``tokenizer``: used only for its pad and EOS ids. ``eos_token_ids``: override the
    EOS ids read from the model and tokenizer. Every other option is the engine's
    (:class:`mtgrpo.fast.StaticGenerator` documents them): ``max_batch_size``,
    ``use_cuda_graph``, ``decode_path``, ``sync_every``, ``row_bucket``, ``length_bucket``,
    ``max_cached_shapes``, ``graph_warmup_steps``, ``compact_below``, ``transpose_weights``,
    ``dtype`` (generate from a copy of the weights in this dtype, refreshed by
    ``update_weights`` and whenever the policy's weights changed since).
    """

    name = "static"
    cheap_logprobs = True  # the sampled tokens' log-probs are computed while sampling

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any = None,
        *,
        eos_token_ids: Sequence[int] | None = None,
        max_batch_size: int | None = None,
        use_cuda_graph: bool | Literal["auto"] = "auto",
        decode_path: str = "auto",
        sync_every: int | None = None,
        row_bucket: int | None = None,
        length_bucket: int | None = None,
        max_cached_shapes: int = 8,
        graph_warmup_steps: int = 3,
        compact_below: float = 0.9,
        transpose_weights: bool | Literal["auto"] = "auto",
        dtype: torch.dtype | str | None = None,
    ) -> None:
        self.weights_version: int | None = None
        self.engine = StaticGenerator(
            model, max_batch_size=max_batch_size,
            use_cuda_graph=use_cuda_graph, decode_path=decode_path, sync_every=sync_every,
            row_bucket=row_bucket, length_bucket=length_bucket,
            max_cached_shapes=max_cached_shapes, graph_warmup_steps=graph_warmup_steps,
            compact_below=compact_below, transpose_weights=transpose_weights, dtype=dtype,
        )  # fmt: skip
        self.eos_token_ids, self.engine.pad_token_id = _special_ids(model, tokenizer, eos_token_ids)

    @property
    def model(self) -> nn.Module:
        """The policy model served (the engine may decode from a replica of it)."""
        return self.engine.model

    @property
    def dtype(self) -> torch.dtype | None:
        """The dtype generated in when it differs from the model's (a replica), else None."""
        return self.engine.dtype

    @property
    def pad_token_id(self) -> int | None:
        return self.engine.pad_token_id

    @property
    def decoder_name(self) -> str:
        """The decode path in use (``"llama_modules"`` or ``"model_forward"``)."""
        return self.engine.decoder_name

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        num_samples: int = 1,
    ) -> GenerationOutput:
        """Sample ``num_samples`` completions per prompt; rows grouped by prompt."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        # the instance's own attribute: generate patched on the object, not its class
        if "generate" in vars(self.model):
            return self._replaced_generate(prompt_ids, params, num_samples)
        prompts = check_prompt_ids(prompt_ids, self.engine.vocab_size)
        group_size = check_num_samples(num_samples)
        stop_ids = tuple(dict.fromkeys(self.eos_token_ids + params.stop_token_ids))
        # eval mode: no dropout while sampling (the caller's mode comes back afterwards)
        with _eval_mode(self.model), _seeded(params.seed, self.engine.device):
            out = self.engine.generate(
                prompts, SamplingRule.from_params(params), num_samples=group_size,
                max_new_tokens=params.max_new_tokens, stop_ids=stop_ids,
            )  # fmt: skip
        return GenerationOutput(
            prompt_ids=[list(prompt) for prompt in prompts for _ in range(group_size)],
            completion_ids=out.completion_ids,
            finished=out.finished,
            logprobs=out.logprobs,
            weights_version=self.weights_version,
        )

    def _replaced_generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                           num_samples: int) -> GenerationOutput:
        """The model object's ``generate`` was replaced after this backend was chosen (a
        custom decoder, a test's mock, as TRL's tests patch it): generation goes through it,
        under transformers' contract, so the replacement is what samples."""
        backend = HFGenerateBackend(self.model, max_batch_size=None,
                                    eos_token_ids=self.eos_token_ids)
        if self.pad_token_id is not None:
            backend.pad_token_id = self.pad_token_id
        backend.weights_version = self.weights_version
        # a replacement need not return transformers' scores: no engine log-probs from it
        return backend.generate(prompt_ids, dataclasses.replace(params, return_logprobs=False),
                                num_samples)

    def update_weights(self, model_or_state: Any, version: int) -> None:
        """Point the backend at new policy weights and record their version.

        ``model_or_state``: the model object it already serves (the trainer's usual call: only
        the version is recorded, and a bfloat16 replica copies the new weights; captured graphs
        stay valid because optimizer steps update parameters in place), another model (served
        from now on; slots and graphs are rebuilt), or a state dict copied into the current
        model in place (a partial one, e.g. adapter weights only, is allowed; unknown keys are
        an error). Re-assigning parameters (``module.weight = ...``,
        ``load_state_dict(..., assign=True)``, moving the model) or merging / switching
        adapters changes what a graph recorded: the next ``generate`` notices (parameter
        addresses, adapter state) and captures again.
        """
        check_weights_version(version)
        if isinstance(model_or_state, nn.Module):
            if model_or_state is not self.model:
                self.engine.attach(model_or_state)
        elif isinstance(model_or_state, Mapping):
            # copied in place: parameter addresses, and so captured graphs, stay valid
            load_partial_state(self.model, model_or_state)
        else:
            raise TypeError(
                f"update_weights takes a model or a state dict, got {type(model_or_state).__name__}"
            )
        # a bfloat16 replica copies the new weights now, not at the next generate
        self.engine.weights_changed()
        self.weights_version = version


BACKENDS.add("static", StaticCacheBackend, aliases=("static_cache", "fast"))
