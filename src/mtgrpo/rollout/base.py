"""The generation-backend contract: token ids in, sampled completions (token ids) out.

The trainer talks to generation only through :class:`GenerationBackend`, so an external engine
(vLLM, SGLang, a server) plugs in by implementing two methods. Everything crosses the boundary
as plain Python lists of token ids: no tensors, no tokenizer, no model class.

Row order (the project's batch convention, see docs/architecture.md): with ``B`` prompts and
``G = num_samples`` completions per prompt, the output has ``N = B*G`` rows and rows
``b*G .. b*G+G-1`` are the completions of prompt ``b``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from mtgrpo.algo.registry import BACKENDS as CHOSEN_BACKENDS
from mtgrpo.algo.registry import Registry

__all__ = [
    "BACKENDS",
    "BackendFactory",
    "GenerationBackend",
    "GenerationOutput",
    "SamplingParams",
    "backend_description",
    "check_num_samples",
    "check_prompt_ids",
    "check_weights_version",
    "load_partial_state",
    "make_backend",
]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # bool is an int subclass


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions.

    The sampling distribution of every token is ``softmax(logits / temperature)`` restricted to
    the nucleus ``top_p`` and to the ``top_k`` most likely tokens, and nothing else: no minimum
    length, no repetition penalty, no hidden default top-k (transformers' ``generate`` applies
    top-k 50 unless told otherwise; vLLM does not). That distribution is the one the policy
    gradient's importance ratio assumes.

    Fields: ``max_new_tokens`` (completion length cap); ``temperature`` (0 means greedy);
    ``top_p`` in (0, 1] (1 = off); ``top_k`` (0 = off); ``greedy`` (argmax decoding, same as
    temperature 0); ``stop_token_ids`` (extra stop tokens on top of the model's EOS ids, as in
    vLLM); ``seed`` (None: the backend's current random state); ``return_logprobs`` (ask the
    backend for the log-probability of each sampled token under the distribution it was drawn
    from; a backend that cannot may return ``None``).
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    return_logprobs: bool = False

    def __post_init__(self) -> None:
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        # `not x >= 0`, not `x < 0`: NaN fails the check too
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ValueError(
                f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}"
            )
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        stop_ids = tuple(self.stop_token_ids)
        if not all(_is_int(t) and t >= 0 for t in stop_ids):
            raise ValueError(
                f"stop_token_ids must be non-negative token ids, got {self.stop_token_ids!r}"
            )
        # Accept any sequence (a list from YAML) but store a tuple, so the object stays hashable.
        object.__setattr__(self, "stop_token_ids", stop_ids)

    @property
    def is_greedy(self) -> bool:
        """Argmax decoding: ``greedy=True`` or ``temperature == 0``."""
        return self.greedy or self.temperature == 0


@dataclass
class GenerationOutput:
    """Completions for ``N = B*G`` rows, grouped by prompt (see the module docstring).

    ``prompt_ids``: ``[N]`` lists, the prompt of each row without padding.
    ``completion_ids``: ``[N]`` lists of variable length; a completion that hit a stop token ends
    with it (and has nothing after it). ``finished``: ``[N]``, True when the row hit a stop
    token, False when it was cut at ``max_new_tokens``. ``logprobs``: ``[N]`` lists aligned with
    ``completion_ids``, the engine's own token log-probabilities, or None. ``weights_version``:
    the version of the weights that generated these rows (see ``update_weights``).
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    finished: list[bool]
    logprobs: list[list[float]] | None = None
    weights_version: int | None = None

    def __post_init__(self) -> None:
        rows = len(self.prompt_ids)
        if len(self.completion_ids) != rows or len(self.finished) != rows:
            raise ValueError(
                f"GenerationOutput rows disagree: {rows} prompts, {len(self.completion_ids)} "
                f"completions, {len(self.finished)} finished flags; each field needs one per row"
            )
        if self.logprobs is not None:
            lengths = [len(c) for c in self.completion_ids]
            if [len(lp) for lp in self.logprobs] != lengths:
                raise ValueError(
                    "GenerationOutput.logprobs must hold one value per completion token, row by row"
                )

    def __len__(self) -> int:
        return len(self.completion_ids)

    @property
    def completion_lengths(self) -> list[int]:
        """``[N]`` completion lengths in tokens (including a final stop token)."""
        return [len(c) for c in self.completion_ids]


@runtime_checkable
class GenerationBackend(Protocol):
    """What the trainer needs from a generation engine.

    ``generate`` returns ``len(prompt_ids) * num_samples`` rows, rows ``i*num_samples ..
    (i+1)*num_samples - 1`` being the samples of prompt ``i``. ``update_weights`` hands the engine
    the policy's current weights (a model or a state dict) and their version number, which later
    outputs report in ``weights_version``; an engine that shares the trainer's model object only
    records the version. The trainer calls it after every optimizer step (version = the steps
    done) and after resuming from a checkpoint.

    Optional: ``cheap_logprobs = True`` says the engine returns ``GenerationOutput.logprobs`` at
    no real cost when ``SamplingParams.return_logprobs`` asks for them (vLLM-like engines, the
    static backend); the trainer then asks by default (``generation_logprobs``) and logs how far
    they are from its own (``generation/logprob_mismatch_mean``, ``_max``, ``generation/kl_k3``).
    """

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        num_samples: int = 1,
    ) -> GenerationOutput: ...

    def update_weights(self, model_or_state: Any, version: int) -> None: ...


BackendFactory = Callable[..., GenerationBackend]
BACKENDS: Registry[BackendFactory] = CHOSEN_BACKENDS  # names declared in mtgrpo.algo.registry


def backend_description(backend: object) -> dict[str, str]:
    """What run logs and summaries say about a backend: ``{"generation/backend": name}``, the
    backend's ``name`` attribute (``"static"``, ``"hf"``) or else its class name, plus
    ``"generation/decode_path"`` for a backend that has a ``decoder_name`` (the static one)."""
    described = {"generation/backend": str(getattr(backend, "name", type(backend).__name__))}
    decoder = getattr(backend, "decoder_name", None)
    if decoder is not None:
        described["generation/decode_path"] = str(decoder)
    return described


def make_backend(name: str, model: Any, tokenizer: Any = None, **options: Any) -> GenerationBackend:
    """Build the generation backend registered as ``name`` (``BACKENDS.names()`` lists them)."""
    factory = BACKENDS.get(name)
    return factory(model, tokenizer, **options)


def check_num_samples(num_samples: object) -> int:
    """Validate ``num_samples`` (the group size ``G``) for a backend's ``generate``."""
    if not _is_int(num_samples) or num_samples < 1:
        raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
    return num_samples


def check_weights_version(version: object) -> int:
    """Validate the ``version`` passed to a backend's ``update_weights`` (an int >= 0)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"version must be an int >= 0, got {version!r}")
    return version


def load_partial_state(model: Any, state: Mapping[str, Any]) -> None:
    """Copy ``state`` into ``model`` in place; a partial state dict (e.g. adapter weights only)
    is fine, keys the model lacks are an error."""
    # strict=False: missing keys are allowed (a partial state); unexpected ones are checked
    result = model.load_state_dict(dict(state), strict=False)
    if result.unexpected_keys:
        raise ValueError(
            f"state dict has {len(result.unexpected_keys)} key(s) the generation model "
            f"lacks, e.g. {result.unexpected_keys[:3]}; pass the state dict of the same "
            "model (peft models: get_peft_model_state_dict is not the full state dict)"
        )


def check_prompt_ids(prompt_ids: object, vocab_size: int | None = None) -> list[list[int]]:
    """Validate prompts as a non-empty list of non-empty token-id lists; return them as lists."""
    # a str is a Sequence too: text passed by mistake would read as characters
    if isinstance(prompt_ids, (str, bytes, Mapping)) or not isinstance(prompt_ids, Sequence):
        raise TypeError(
            "prompt_ids must be a sequence of token-id sequences (one per prompt), got "
            f"{type(prompt_ids).__name__}; tokenize text prompts first"
        )
    if not prompt_ids:
        raise ValueError("prompt_ids is empty; pass at least one prompt")
    prompts = []
    for index, prompt in enumerate(prompt_ids):
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
            raise TypeError(
                f"prompt {index} is a {type(prompt).__name__}, not a sequence of token ids"
            )
        ids = list(prompt)
        if not ids:
            raise ValueError(f"prompt {index} is empty; every prompt needs at least one token")
        limit = vocab_size if vocab_size is not None else float("inf")
        bad = [t for t in ids if not _is_int(t) or not 0 <= t < limit]
        if bad:
            raise ValueError(
                f"prompt {index} holds invalid token ids {bad[:5]}; ids must be ints in "
                f"[0, {vocab_size if vocab_size is not None else 'vocab size'})"
            )
        prompts.append(ids)
    return prompts
