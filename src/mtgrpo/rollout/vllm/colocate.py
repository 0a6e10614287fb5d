"""The colocated vLLM backend: an in-process ``vllm.LLM`` beside the trainer (TRL's
``vllm_mode="colocate"``), registered as ``"vllm"``.

The engine loads the architecture and tokenizer from the model's directory; the weights it
samples from are always the trainer's, pushed by :meth:`VLLMColocateBackend.update_weights`
(at construction, after every optimizer step and after a resume), straight from the policy's
tensors in this process. The engine records each push's version; ``generate`` refuses to
sample when the engine's version is not the one this backend pushed last (another backend
pushed into the shared engine, or a push failed half way).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mtgrpo.rollout.base import (
    GenerationOutput,
    SamplingParams,
    check_num_samples,
    check_prompt_ids,
    check_weights_version,
)
from mtgrpo.rollout.hf_generate import _special_ids
from mtgrpo.rollout.vllm.engine import (
    EngineOptions,
    load_weights,
    sample,
    start_engine,
    weights_version,
)
from mtgrpo.rollout.vllm.errors import StaleEngineError
from mtgrpo.rollout.vllm.weights import check_weight_names, merged_named_weights

__all__ = ["VLLMColocateBackend", "model_directory"]


def model_directory(model: Any) -> str:
    """Where the engine loads the architecture from: the (base) model's ``name_or_path``."""
    # a peft model: the base model's directory holds the architecture
    owner = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    path = getattr(owner, "name_or_path", None) or getattr(
        getattr(owner, "config", None), "_name_or_path", None)
    if not path:
        raise ValueError(
            "vLLM loads the model's architecture from its directory, and this model has none "
            "(name_or_path is empty): save it with save_pretrained(dir) and pass dir as the "
            "model"
        )
    if not Path(path).is_dir():  # a hub name: its snapshot in the local cache, if there
        try:
            from huggingface_hub import snapshot_download

            # local_files_only: no network here; a miss falls through to vLLM's own lookup
            return snapshot_download(str(path), local_files_only=True)
        except Exception:  # not cached: vLLM resolves the name itself
            return str(path)
    return str(path)


class VLLMColocateBackend:
    """A :class:`~mtgrpo.rollout.base.GenerationBackend` on an in-process vLLM engine.

    ``model``: the policy (a transformers causal LM or a peft model), whose weights are pushed;
    ``tokenizer``: for the EOS and pad ids. ``engine_options``: an :class:`EngineOptions`
    (default: the model's directory with vLLM's defaults). ``structured_outputs_regex``:
    TRL's ``vllm_structured_outputs_regex``. ``sampling_options``: extra vLLM
    ``SamplingParams`` fields (TRL's ``generation_kwargs``).
    """

    name = "vllm"
    mode = "colocate"
    cheap_logprobs = True  # vLLM returns the sampled tokens' log-probs as it samples

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any = None,
        *,
        engine_options: EngineOptions | None = None,
        eos_token_ids: Sequence[int] | None = None,
        structured_outputs_regex: str | None = None,
        sampling_options: dict[str, Any] | None = None,
        push_on_start: bool = True,
    ) -> None:
        self.model = model
        self.options = engine_options or EngineOptions(model=model_directory(model))
        self.eos_token_ids, self.pad_token_id = _special_ids(model, tokenizer, eos_token_ids)
        self.regex = structured_outputs_regex
        self.sampling_options = dict(sampling_options or {})
        self.engine = start_engine(self.options)
        self.weights_version: int | None = None
        self.pushes = 0
        if push_on_start:
            self.update_weights(model, 0)

    @property
    def engine_weights_version(self) -> int | None:
        return weights_version(self.engine)

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                 num_samples: int = 1) -> GenerationOutput:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        prompts = check_prompt_ids(prompt_ids, self.model.get_input_embeddings().num_embeddings)
        group = check_num_samples(num_samples)
        held = self.engine_weights_version
        if self.weights_version is None or held != self.weights_version:
            raise StaleEngineError(
                f"the vLLM engine holds weights version {held}, but this backend pushed "
                f"{self.weights_version}: another trainer pushed into the shared engine, or a "
                "weight push failed; push the policy (update_weights) before generating"
            )
        # dict.fromkeys: duplicates dropped, the first-seen order kept
        stop_ids = tuple(dict.fromkeys(self.eos_token_ids + params.stop_token_ids))
        out = sample(self.engine, prompts, params, group, stop_ids, self.regex,
                     self.sampling_options)
        # rows grouped by prompt, as sample returns them: G rows of each prompt in turn
        return GenerationOutput(
            prompt_ids=[list(p) for p in prompts for _ in range(group)],
            completion_ids=out["completion_ids"], finished=out["finished"],
            logprobs=out["logprobs"], weights_version=held,
        )

    def update_weights(self, model_or_state: Any, version: int) -> None:
        """Push the policy's weights into the engine (a LoRA adapter merged) as ``version``.
        ``model_or_state``: the policy model, or a full state dict in transformers names."""
        check_weights_version(version)
        if isinstance(model_or_state, torch.nn.Module):
            self.model = model_or_state
            # pushed inside the block: views of the merged weights, unmerged when it ends
            with merged_named_weights(model_or_state) as named:
                load_weights(self.engine, named, version)
        elif isinstance(model_or_state, dict):
            check_weight_names(self.model, model_or_state)
            load_weights(self.engine, list(model_or_state.items()), version)
        else:
            raise TypeError(
                f"update_weights takes a model or a state dict, got {type(model_or_state).__name__}"
            )
        self.weights_version = version
        self.pushes += 1

