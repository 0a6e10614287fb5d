"""The static-cache decode engine: a static KV cache, a decode loop of our own, sampling on the
device, and (on CUDA) the decode step captured once as a CUDA graph. The ``"static"`` generation
backend (:class:`mtgrpo.rollout.static.StaticCacheBackend`) is this engine behind the
generation contract: it validates the request, seeds the RNG and reports weight versions; the
engine knows token ids, a :class:`~mtgrpo.fast.static_sampling.SamplingRule` and a model.

Notation: ``N`` rows requested (``B`` prompts x ``G`` samples), ``n`` rows decoded together (a
sub-batch, padded up to a bucket), ``P`` prompt width of a sub-batch (left-padded), ``L``
``max_new_tokens``, ``C`` cache length (``>= P + L``, rounded up to a bucket), ``V`` vocabulary.

One call, read top to bottom (:meth:`StaticGenerator.generate`):

1. Prompts are sorted by length (stable), each expanded to its ``G`` rows, and the rows cut
   into sub-batches of at most ``max_batch_size`` rows (:func:`length_buckets`: a group stays
   in one sub-batch whenever ``G <= max_batch_size``), so a sub-batch holds prompts of similar
   length and pads little; results are put back in input order (rows ``i*G .. i*G+G-1`` are
   prompt ``i``'s samples).
2. Per sub-batch, a slot keyed by ``(n, C)`` is taken from a small LRU: a transformers
   ``StaticCache`` (``[n, kv_heads, C, head_dim]`` per layer) plus the step's buffers. On a GPU
   the slot also keeps the captured graphs, so a shape seen before costs no allocation and no
   capture.
3. Prefill, once per distinct prompt of the sub-batch (``u`` of them): one forward over the
   ``u`` left-padded prompts with their 2-D mask and position ids ``cumsum(mask) - 1``
   (``generate``'s rule: left padding does not shift positions) into a transformers
   ``DynamicCache``; every layer's keys/values ``[u, kv_heads, P, head_dim]`` are then copied
   into columns ``0..P-1`` of the slot's ``n`` rows, each prompt's repeated for its rows
   (``index_select`` by the expansion index, the ``repeat_interleave`` of the prompts by their
   row counts), and so are its last logits ``[u, V] -> [n, V]``, from which each row samples
   its first token independently. The ``G`` samples of a prompt share one prefill: ``G`` times
   less prefill compute, which dominates a CPU step with long prompts and short completions.
   A sub-batch whose rows all belong to different prompts (``G = 1``) is prefilled straight
   into the slot's cache (no copy).
4. Decode: one step per token for all ``n`` rows. A step feeds each row's last token at column
   ``P + t`` with an additive mask ``[n, 1, 1, C]`` (0 on the row's prompt tokens and generated
   columns so far, ``finfo.min`` on padding and future columns), samples the next token on the
   device (:mod:`mtgrpo.fast.static_sampling`), writes it (or pad, for a row already done) to
   an output buffer, and updates a ``done`` mask with the stop ids. Nothing is read on the host
   during a step; "are all rows done?" is read every ``sync_every`` steps (16 on accelerators,
   every step on the CPU, where reading a flag costs nothing). On CUDA the step is one graph
   replay (:mod:`mtgrpo.fast.static_graph`). Without graphs, at those reads, once at most
   ``compact_below`` of the decoded rows are still running, their cache and state are gathered
   into a smaller batch (``Cache.reorder_cache``), so finished rows stop costing compute (on a
   CPU a step's cost grows with its rows; HF ``generate`` keeps them to the end).
5. The outputs come back to the host once, as lists.

Departures from the "hf" backend, all deliberate:

1. Sampling draws with the Gumbel-max trick on accelerators and by inverse CDF on the CPU
   instead of ``torch.multinomial``: the same distribution
   (:mod:`mtgrpo.fast.static_sampling`), a different random stream. With
   ``seed`` set the result depends on the seed, the prompts, the parameters and the
   sub-batching (``max_batch_size``, buckets, and the compaction of finished rows, which
   changes how many numbers a step draws), as with "hf" it depends on ``max_batch_size``.
   The shared prefill draws no numbers, so a seed's samples are reproducible and equal to
   those of the earlier every-row prefill when the sub-batches are the same, except where
   prefill logits that differ in their last bits tip a draw; when ``max_batch_size`` is not a
   multiple of ``G`` the sub-batches (whole groups now) and so the samples changed.
2. With CUDA graphs, finished rows keep their place until the whole sub-batch is done or cut
   (static shapes are what make the step capturable); their outputs are pad and are dropped.
3. The ``G`` rows of a prompt start from one shared prefill (exact copies of its keys, values
   and last logits), where ``generate`` prefills every row: the same numbers up to
   floating-point effects of batch composition (greedy completions are tested equal).
4. A caller's ``torch.autocast`` is switched off for the call: the model generates in its own
   dtype (the cache, the mask and a captured graph are built for it).

When to use it: GRPO rollouts of a transformers decoder-only model with full causal attention
in every layer (Llama, Qwen2/2.5/3, Mistral without sliding window, SmolLM, ...) under the
``"sdpa"`` or ``"eager"`` attention implementation, full or LoRA. Refused with a clear error
(use ``"hf"``): sliding-window / chunked / recurrent attention, encoder-decoders, flash or flex
attention, prompt-learning peft. See ``docs/fast_generation.md``.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor, nn

from mtgrpo.fast.replica import WeightReplica
from mtgrpo.fast.static_decoders import (
    DECODERS,
    StaticDecoder,
    check_static_cache_support,
    mark_supported,
    model_dtype,
    resolve_decoder,
)
from mtgrpo.fast.static_graph import CapturedStep, capture_step
from mtgrpo.fast.static_sampling import SamplingRule
from mtgrpo.fast.unwrap import unwrap_causal_lm
from mtgrpo.models.positions import position_ids_from_attention_mask

__all__ = ["WINDOW_COLUMNS", "Completions", "StaticGenerator", "length_buckets", "widen_cache"]

logger = logging.getLogger(__name__)

UseCudaGraph = bool | Literal["auto"]

# Device types on which the decode step is captured as a graph (tests widen it to run the
# capture bookkeeping on the CPU with a stand-in capture function).
_GRAPH_DEVICE_TYPES: tuple[str, ...] = ("cuda",)
# Buckets when graphs are on: few distinct (rows, columns) shapes means few captures.
_GRAPH_ROW_BUCKET = 8
_GRAPH_LENGTH_BUCKET = 64
# Each host read of `done` waits for the device's queue; on the CPU a read is free (every step).
_ACCELERATOR_SYNC_EVERY = 16
# transpose_weights="auto" copies at most this much weight (a model of up to about 250 M
# float32 projection parameters): beyond it the copies' memory weighs more than their speed.
_AUTO_TRANSPOSE_MAX_BYTES = 1 << 30


@dataclass(frozen=True)
class Completions:
    """Sampled completions of ``N`` rows (:meth:`StaticGenerator.generate`: rows grouped by
    prompt; a sub-batch's chunk: its own row order).

    ``completion_ids``: ``[N]`` token lists, a row that hit a stop id ends with it;
    ``finished``: ``[N]``, True when it did; ``logprobs``: ``[N]`` lists aligned with
    ``completion_ids`` (the log-probability of each token under the distribution it was drawn
    from), or None when not asked for.
    """

    completion_ids: list[list[int]]
    finished: list[bool]
    logprobs: list[list[float]] | None


@dataclass
class _DecodeBuffers:
    """The tensors one decode step reads and writes in place (their addresses are what a
    captured graph replays on)."""

    tokens: Tensor  # [n, 1] int64: the token fed to the next step
    positions: Tensor  # [n, 1] int64: its position id
    column: Tensor  # [1] int64: the cache column it is written to
    step: Tensor  # [1] int64: completion index of the next sampled token
    visible: Tensor  # [n, C] model dtype: additive mask, 0 = attend, finfo.min = masked
    done: Tensor  # [n] bool: the row has emitted a stop token (or is bucket padding)
    lengths: Tensor  # [n] int64: completion tokens kept so far (stop token included)
    out_tokens: Tensor  # [n, C] int64: sampled tokens (pad after a stop)
    out_logprobs: Tensor  # [n, C] float32: their log-probabilities (0 after a stop)

    @classmethod
    def allocate(
        cls, rows: int, columns: int, dtype: torch.dtype, device: torch.device
    ) -> _DecodeBuffers:
        def ints(*shape: int) -> Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        return cls(
            tokens=ints(rows, 1),
            positions=ints(rows, 1),
            column=ints(1),
            step=ints(1),
            visible=torch.zeros((rows, columns), dtype=dtype, device=device),
            done=torch.zeros(rows, dtype=torch.bool, device=device),
            lengths=ints(rows),
            out_tokens=ints(rows, columns),
            out_logprobs=torch.zeros((rows, columns), dtype=torch.float32, device=device),
        )

    @property
    def mask(self) -> Tensor:
        return self.visible[:, None, None, :]  # [n, 1, 1, C]

    def select(self, rows: Tensor) -> _DecodeBuffers:
        """A copy holding only ``rows`` (``[m]`` indices); ``column`` and ``step`` are shared."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        # one column and one step counter for all rows: every row feeds one token per step
        shared = {"column", "step"}
        return _DecodeBuffers(**{
            name: value if name in shared else value.index_select(0, rows)
            for name, value in values.items()
        })  # fmt: skip

    def write_rows(self, rows: Tensor, part: _DecodeBuffers) -> None:
        """Copy the outputs of ``part`` (a :meth:`select` of this record) back to ``rows``."""
        for name in ("out_tokens", "out_logprobs", "lengths", "done"):
            getattr(self, name).index_copy_(0, rows, getattr(part, name))

    def state(self) -> list[Tensor]:
        """The tensors that carry state from one step to the next (outputs excluded)."""
        skip = {"out_tokens", "out_logprobs"}
        return [getattr(self, f.name) for f in fields(self) if f.name not in skip]


@dataclass
class _StepProgram:
    """A sampling rule and stop ids bound to one slot, with its captured graph if any."""

    rule: SamplingRule
    stop_ids: Tensor  # [S] int64
    graph: CapturedStep | None = None
    capture_failed: bool = False


@dataclass
class _Slot:
    """A static cache, the step buffers for its shape, and the programs recorded on them."""

    cache: Any  # transformers.StaticCache
    buffers: _DecodeBuffers
    programs: dict[tuple[SamplingRule, tuple[int, ...]], _StepProgram] = field(default_factory=dict)

    def program(self, rule: SamplingRule, stop_ids: tuple[int, ...]) -> _StepProgram:
        # a graph records the rule's branches and the stop-id tensor: one program per pair
        key = (rule, stop_ids)
        if key not in self.programs:
            device = self.buffers.tokens.device
            stops = torch.tensor(stop_ids, dtype=torch.long, device=device)
            self.programs[key] = _StepProgram(rule, stops)
        return self.programs[key]

    def start(self, attention_mask: Tensor, real_rows: int) -> None:
        """Reset for a new sub-batch whose prompts fill columns ``0..P-1`` (``attention_mask:
        [n, P]``); rows from ``real_rows`` on are bucket padding, done from the start. A
        cache left narrower by eager decoding's window (:func:`widen_cache`) gets back tensors
        of its full width."""
        _full_width(self.cache)
        self.cache.reset()
        buffers, width = self.buffers, attention_mask.shape[1]
        # finfo.min rather than -inf: the additive-mask value transformers' own masks use
        buffers.visible.fill_(torch.finfo(buffers.visible.dtype).min)
        buffers.visible[:, :width].masked_fill_(attention_mask.bool(), 0.0)
        # The first generated token sits right after the row's last prompt token.
        buffers.positions.copy_(attention_mask.sum(-1, keepdim=True))
        buffers.column.fill_(width)
        buffers.step.zero_()
        buffers.lengths.zero_()
        buffers.done.zero_()
        # bucket-padding rows start done: they emit pad and never keep the all-done check waiting
        buffers.done[real_rows:] = True

    def snapshot(self) -> list[tuple[Tensor, Tensor]]:
        """Copies of every tensor a step changes, except outputs and cache contents (a step
        writes those at the current column and step, which a restore rewinds)."""
        # transformers 5.24 StaticLayer.update advances its cumulative_length tensor in place: the
        # model_forward decoder's warm-up steps move it, so a rewind must restore it too
        counters = [layer.cumulative_length for layer in self.cache.layers]
        return [(t, t.clone()) for t in [*self.buffers.state(), *counters]]

    @staticmethod
    def restore(snapshot: list[tuple[Tensor, Tensor]]) -> None:
        for tensor, saved in snapshot:
            tensor.copy_(saved)


def _emit(
    buffers: _DecodeBuffers, program: _StepProgram, logits: Tensor, pad_token_id: int
) -> None:
    """Sample the next token of every row from ``logits: [n, V]`` and record it, in place.

    A row already done gets ``pad_token_id`` (log-prob 0) and keeps its length; a row whose
    new token is a stop id becomes done with that token counted (``finished`` rows end with
    their stop token, as in the contract).
    """
    sampled = program.rule(logits)
    active = ~buffers.done  # [n]
    tokens = torch.where(active, sampled.tokens, pad_token_id)  # [n]
    logprobs = torch.where(active, sampled.logprobs, 0.0)  # [n]
    # the column is a device tensor, not a Python int: a replayed graph writes the next column
    buffers.out_tokens.index_copy_(1, buffers.step, tokens[:, None])
    buffers.out_logprobs.index_copy_(1, buffers.step, logprobs[:, None])
    # `active` is taken before this token's stop check: a stop token is counted in the length
    buffers.lengths.add_(active)
    buffers.done.logical_or_((tokens[:, None] == program.stop_ids).any(-1))
    buffers.tokens.copy_(tokens[:, None])
    buffers.step.add_(1)


def _decode_step(
    decoder: StaticDecoder,
    slot: _Slot,
    program: _StepProgram,
    pad_token_id: int,
    visible: int | None = None,
) -> None:
    """One token for every row of ``slot``: feed, forward, sample, record; all in place and
    without reading anything on the host (this is the function a CUDA graph records).
    ``visible`` (eager steps only): the cache columns written so far, this token's included."""
    buffers = slot.buffers
    buffers.visible.index_fill_(1, buffers.column, 0.0)  # the fed token's column is visible
    logits = decoder.decode(
        slot.cache, buffers.tokens, buffers.positions, buffers.mask, buffers.column, visible
    )
    _emit(buffers, program, logits, pad_token_id)
    # advanced in place (not rebound): a captured graph replays on these tensors' addresses
    buffers.positions.add_(1)
    buffers.column.add_(1)


class StaticGenerator:
    """Samples completions of token-id prompts with a static KV cache and its own decode loop
    (see the module docstring).

    ``model``: a transformers causal LM or a peft (LoRA) model wrapping one; shared, never
    copied. ``pad_token_id``: written after a row's stop token and into bucket-padding rows
    (``None``: set the attribute before the first :meth:`generate`, as the backend does once
    the model is accepted).
    ``max_batch_size``: most rows decoded together (``None``: all rows). ``use_cuda_graph``:
    ``"auto"`` (capture on CUDA, eager elsewhere), ``True`` (require CUDA) or ``False``.
    ``decode_path``: ``"auto"``, ``"llama_modules"`` or ``"model_forward"``
    (:mod:`mtgrpo.fast.static_decoders`). ``sync_every``: decode steps between host reads of
    the ``done`` mask (``None``: 16 on an accelerator, 1 on the CPU). ``row_bucket`` /
    ``length_bucket``: rows and cache length are rounded up to multiples of these (``None``: 8
    and 64 when graphs are captured, else 1 and 1). ``max_cached_shapes``: slots (cache +
    buffers + graphs) kept for reuse, least recently used dropped first.
    ``graph_warmup_steps``: eager steps run before a capture. ``compact_below``: without
    graphs, drop finished rows from the decoded batch once at most this fraction of it is still
    running (0: never; 1: as soon as one row finishes). ``transpose_weights``: decode with
    transposed copies of the projection weights, LoRA adapters merged, and a float32 LM head
    in row blocks
    (:meth:`~mtgrpo.fast.static_decoders.LlamaModulesDecoder.transposed_weights`: about a
    quarter less matrix-product time on a CPU, one more copy of those weights in memory while
    ``generate`` runs); ``"auto"``: on the CPU when the copies take at most 1 GiB, ``True``:
    whenever decoding is eager (never with CUDA graphs, which would replay the copies of the
    call that captured them), ``False``: never. ``dtype``: generate in this dtype (e.g.
    ``torch.bfloat16`` for a float32 policy on hardware that multiplies bfloat16 natively):
    the engine then decodes from a :class:`~mtgrpo.fast.replica.WeightReplica` of the policy
    in that dtype, LoRA merged, refreshed by :meth:`weights_changed` and whenever the policy's
    weights changed since (``None``: the model itself, in its own dtype).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        pad_token_id: int | None = None,
        max_batch_size: int | None = None,
        use_cuda_graph: UseCudaGraph = "auto",
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
        _check_options(
            max_batch_size=max_batch_size,
            sync_every=sync_every,
            row_bucket=row_bucket,
            length_bucket=length_bucket,
            max_cached_shapes=max_cached_shapes,
            graph_warmup_steps=graph_warmup_steps,
        )
        _check_bool_or_auto("use_cuda_graph", use_cuda_graph)
        if decode_path != "auto" and decode_path not in DECODERS:
            raise ValueError(
                f"unknown decode_path {decode_path!r}; valid: 'auto', "
                f"{', '.join(repr(n) for n in DECODERS.names())}"
            )
        if isinstance(compact_below, bool) or not isinstance(compact_below, (int, float)):
            raise TypeError(f"compact_below must be a number, got {compact_below!r}")
        if not 0 <= compact_below <= 1:
            raise ValueError(
                f"compact_below must be a fraction in [0, 1] (0 = never compact), got "
                f"{compact_below!r}"
            )
        _check_bool_or_auto("transpose_weights", transpose_weights)
        self.dtype = _check_dtype(dtype)
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        self.use_cuda_graph = use_cuda_graph
        self.decode_path = decode_path
        self.sync_every = sync_every
        self.row_bucket = row_bucket
        self.length_bucket = length_bucket
        self.max_cached_shapes = max_cached_shapes
        self.graph_warmup_steps = graph_warmup_steps
        self.compact_below = float(compact_below)
        self.transpose_weights = transpose_weights
        self.attach(model)
        self._graphs_enabled(self.device)  # refuse use_cuda_graph=True on a CPU model now

    def attach(self, model: nn.Module) -> None:
        """Serve ``model``: check it, pick the decoder, forget slots built for another model."""
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"model must be a torch.nn.Module causal LM, got {type(model).__name__}"
            )
        lm = unwrap_causal_lm(model)
        self._replica: WeightReplica | None = None
        if self.dtype is not None and self.dtype != model_dtype(lm):
            keyword = check_static_cache_support(lm)  # probed on the policy's own precision
            self._replica = WeightReplica(model, self.dtype)
            lm = self._replica.module
            mark_supported(lm, keyword)  # the same class and config: the same verdict
        self._decoder: StaticDecoder = resolve_decoder(lm, self.decode_path)
        self.model = model
        self._lm = lm
        self._slots: OrderedDict[tuple[Any, ...], _Slot] = OrderedDict()
        self._fingerprint: tuple[Any, ...] | None = None

    def weights_changed(self) -> None:
        """The policy's weights changed (the model object is the same): a bfloat16 replica
        copies them now. Captured graphs stay valid: optimizer steps update in place, and
        :meth:`generate` notices re-assigned parameters or changed adapters itself."""
        if self._replica is not None:
            self._replica.refresh()

    @property
    def decoder_name(self) -> str:
        """The decode path in use (``"llama_modules"`` or ``"model_forward"``)."""
        return self._decoder.name

    @property
    def device(self) -> torch.device:
        return next(self._lm.parameters()).device

    @property
    def vocab_size(self) -> int | None:
        """Rows of the input embedding (the largest valid token id + 1), if known."""
        return getattr(self._lm.get_input_embeddings(), "num_embeddings", None)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        rule: SamplingRule,
        *,
        num_samples: int,
        max_new_tokens: int,
        stop_ids: tuple[int, ...],
    ) -> Completions:
        """``num_samples`` completions of at most ``max_new_tokens`` tokens per prompt, rows
        grouped by prompt (rows ``b*G .. b*G+G-1`` are prompt ``b``'s), drawn by ``rule`` and
        ending at the first of ``stop_ids``. Inputs are taken as valid (the backend checks
        them); the caller's RNG state is used as it is."""
        if self.pad_token_id is None:
            raise ValueError("StaticGenerator.pad_token_id is None; set the pad token id first")
        if self._replica is not None and self._replica.stale():
            self._replica.refresh()  # the policy changed since: never sample old weights
        group_size = num_samples
        lengths = [len(prompt) for prompt in prompts]  # [B]
        rows = len(prompts) * group_size  # N
        device = self.device
        graphs = self._graphs_enabled(device)
        completions: list[list[int]] = [[] for _ in range(rows)]
        finished = [False] * rows
        logprobs: list[list[float]] | None = [[] for _ in range(rows)] if rule.with_logprobs \
            else None
        with (
            torch.inference_mode(),
            # The cache and the mask are in the model's dtype, and a graph would replay the
            # casts it recorded: the model runs in its own dtype whatever the caller's autocast.
            torch.autocast(device.type, enabled=False),
            self._weights_layout(device, graphs),
        ):
            if graphs:
                # before any slot is reused: a graph recorded on old parameter addresses
                # would replay on memory the model no longer owns
                self._forget_stale_graphs()
            for sub_batch in length_buckets(lengths, self.max_batch_size, group_size):
                pieces = _prompt_runs(sub_batch, group_size)
                chunk = self._generate_chunk(
                    [list(prompts[prompt]) for prompt, _ in pieces],
                    [count for _, count in pieces],
                    max_new_tokens,
                    rule,
                    stop_ids,
                    graphs,
                )
                for position, row in enumerate(sub_batch):  # back to the input order
                    completions[row] = chunk.completion_ids[position]
                    finished[row] = chunk.finished[position]
                    if logprobs is not None and chunk.logprobs is not None:
                        logprobs[row] = chunk.logprobs[position]
        return Completions(completions, finished, logprobs)

    def _generate_chunk(
        self,
        prompts: list[list[int]],
        samples: list[int],
        max_new_tokens: int,
        rule: SamplingRule,
        stop_ids: tuple[int, ...],
        graphs: bool,
    ) -> Completions:
        """Prefill, first token, decode loop and read-back for one sub-batch: ``prompts[j]``
        (distinct prompts) owns the next ``samples[j]`` rows."""
        real_rows = sum(samples)
        width = max(len(prompt) for prompt in prompts)  # P
        rows = _round_up(real_rows, self.row_bucket or (_GRAPH_ROW_BUCKET if graphs else 1))
        columns = _round_up(
            width + max_new_tokens, self.length_bucket or (_GRAPH_LENGTH_BUCKET if graphs else 1)
        )
        slot = self._slot(rows, columns)
        if real_rows == len(prompts):  # every row its own prompt: nothing to share or copy
            logits = self._prefill_rows(slot, prompts, width)
        else:
            logits = self._prefill_shared(slot, prompts, samples, width)
        program = slot.program(rule, stop_ids)
        _emit(slot.buffers, program, logits, self.pad_token_id)
        if graphs or not self.compact_below:
            # Warm-up steps write the columns after the prompt; one-token calls need no step.
            capturable = graphs and max_new_tokens > 1 and columns - width > self.graph_warmup_steps
            step = self._step_function(slot, program, capturable)
            emitted = self._decode_loop(step, slot.buffers.done, max_new_tokens)
        else:
            emitted, compacted = self._decode_compacting(slot, program, max_new_tokens, width)
            if compacted:  # its cache now holds fewer rows than the slot's shape: rebuild later
                del self._slots[self._slot_key(rows, columns)]
        return _read_back(slot.buffers, real_rows, emitted, rule.with_logprobs)

    def _prefill_rows(self, slot: _Slot, prompts: list[list[int]], width: int) -> Tensor:
        """Prefill one row per prompt straight into the slot's cache (bucket-padding rows get
        one pad token); returns the last logits ``[n, V]``."""
        rows = slot.buffers.done.shape[0]
        input_ids, attention_mask = self._left_pad(prompts, rows, width)  # [n, P], [n, P]
        slot.start(attention_mask, real_rows=len(prompts))
        return self._decoder.prefill(
            slot.cache, input_ids, attention_mask, position_ids_from_attention_mask(attention_mask)
        )

    def _prefill_shared(
        self, slot: _Slot, prompts: list[list[int]], samples: list[int], width: int
    ) -> Tensor:
        """Prefill each of the ``u`` distinct prompts once and give each of its
        ``samples[j]`` rows its keys/values (cache columns ``0..P-1``) and its last logits
        (the decoder's ``prefill_shared``); returns the logits ``[n, V]``. Bucket-padding rows
        (done from the start, outputs dropped) copy prompt 0.
        """
        input_ids, attention_mask = self._left_pad(prompts, len(prompts), width)  # [u, P]
        source = _expansion_index(samples, slot.buffers.done.shape[0], self.device)  # [n]
        # the mask per decoded row: each row hides its own prompt's left padding
        slot.start(attention_mask.index_select(0, source), real_rows=sum(samples))
        return self._decoder.prefill_shared(
            slot.cache, input_ids, attention_mask, position_ids_from_attention_mask(attention_mask),
            source,
        )

    def _step_function(
        self, slot: _Slot, program: _StepProgram, capturable: bool
    ) -> Callable[[], None]:
        """The captured graph of this slot and program (capturing it now if ``capturable`` and
        not tried yet), else the eager step."""
        eager = partial(_decode_step, self._decoder, slot, program, self.pad_token_id)
        if capturable and program.graph is None and not program.capture_failed:
            program.graph = self._capture(slot, program, eager)
        return program.graph or eager

    def _capture(
        self, slot: _Slot, program: _StepProgram, eager: Callable[[], None]
    ) -> CapturedStep | None:
        """Record ``eager`` as a CUDA graph; the slot's state and the RNG are left as found
        (the warm-up steps really run). On any failure: warn once, decode eagerly."""
        saved = slot.snapshot()
        try:
            with _preserved_rng(self.device):
                # warm-up steps draw numbers: a seed's samples must not depend on a capture
                return capture_step(eager, warmup_steps=self.graph_warmup_steps)
        except Exception as error:  # capture is an optimisation; eager decoding is correct
            program.capture_failed = True
            logger.warning(
                "CUDA graph capture of the decode step failed (%s: %s); decoding this shape "
                "(%d rows, %d cache columns) eagerly. Models whose forward reads values on "
                "the host (e.g. dynamic RoPE scaling) cannot be captured; pass "
                "use_cuda_graph=False to silence this.",
                type(error).__name__, error, *slot.buffers.visible.shape,
            )  # fmt: skip
            return None
        finally:
            # the warm-up steps really ran: rewind the slot's state to before them
            _Slot.restore(saved)

    def _sync_every(self, device: torch.device) -> int:
        on_cpu = device.type == "cpu"
        # docs/fast_generation.md: 16 on an accelerator, every step on the CPU (a free read)
        return self.sync_every or (1 if on_cpu else _ACCELERATOR_SYNC_EVERY)

    def _decode_loop(self, step: Callable[[], None], done: Tensor, max_new_tokens: int) -> int:
        """Run decode steps until ``max_new_tokens`` tokens exist or every row is done, reading
        ``done`` on the host once per ``sync_every`` steps. Returns the tokens emitted."""
        sync_every = self._sync_every(done.device)
        emitted = 1  # the prefill's token
        # bool() here is the loop's only host synchronisation, once per burst of `sync_every` steps
        while emitted < max_new_tokens and not bool(done.all()):
            burst = min(sync_every, max_new_tokens - emitted)
            for _ in range(burst):
                step()
            emitted += burst
        return emitted

    def _decode_compacting(
        self, slot: _Slot, program: _StepProgram, max_new_tokens: int, width: int
    ) -> tuple[int, bool]:
        """Eager decoding that stops computing finished rows: at each host read (every
        ``sync_every`` steps), once at most ``compact_below`` of the decoded rows are active,
        the active rows' cache and state are gathered into a smaller batch. Outputs are written
        back to the slot's buffers (in the slot's row order) at the end. Returns the tokens
        emitted and whether any compaction happened. Each step attends only to the ``width``
        prompt columns and the tokens fed so far (the cache's later columns are empty).

        Where the decoder asks for it (``cache_window``: the two-product attention of half
        precision on the CPU), the cache's tensors hold only the columns written so far,
        rounded up to :data:`WINDOW_COLUMNS` and widened by that many when the next token
        needs it (:func:`widen_cache`), so that each step's attention reads contiguous tensors
        over those columns; the columns past the written ones are zero and masked out (their
        weights are exactly 0), as the full cache's are; the slot's next :meth:`_Slot.start`
        gives it full-width tensors again."""
        sync_every = self._sync_every(slot.buffers.done.device)
        live, rows = slot, None  # rows: the slot row of each live row, once compacted
        emitted = 1
        window_of = getattr(self._decoder, "cache_window", None)
        windowed = window_of is not None and window_of(slot.buffers.done.device)
        if windowed:  # the prompt and the first token's columns, rounded up
            widen_cache(slot.cache, width + 1)
        while emitted < max_new_tokens:
            decoded = live.buffers.done.shape[0]
            active = decoded - int(live.buffers.done.sum())
            if active == 0:
                break
            # a CPU step's cost grows with its rows; HF generate keeps finished rows to the end
            # compact_below 0.9 measured: docs/fast_generation.md (0.9 fastest of 0.75-1.0);
            # benchmarks/results/step_time_vs_trl_cpu.md: 0.8 / 0.97 / 1.0 inconclusive under load
            if active < decoded and active <= self.compact_below * decoded:
                live, rows = _compacted(slot, live, rows)
            burst = min(sync_every, max_new_tokens - emitted)
            for offset in range(burst):
                # the prompt's columns, the tokens emitted so far and this step's fed token
                visible = width + emitted + offset
                if windowed:  # attend to the window's columns: contiguous tensors
                    visible = widen_cache(live.cache, visible)
                _decode_step(self._decoder, live, program, self.pad_token_id, visible=visible)
            emitted += burst
        if rows is not None:
            slot.buffers.write_rows(rows, live.buffers)
        return emitted, rows is not None

    def _slot(self, rows: int, columns: int) -> _Slot:
        """The slot for this shape, most recently used last; builds it (and evicts) if new."""
        from transformers import StaticCache

        dtype, device = model_dtype(self._lm), self.device
        key = self._slot_key(rows, columns)
        if key in self._slots:
            self._slots.move_to_end(key)
            return self._slots[key]
        while len(self._slots) >= self.max_cached_shapes:
            # least recently used first: OrderedDict keeps use order (move_to_end above)
            self._slots.popitem(last=False)
        # StaticLayer allocates its tensors lazily at the first update (transformers 5.24
        # cache_utils): the keys' dtype and device come from the prefill's own states
        cache = StaticCache(config=self._lm.config, max_cache_len=columns)
        slot = _Slot(cache, _DecodeBuffers.allocate(rows, columns, dtype, device))
        self._slots[key] = slot
        return slot

    def _slot_key(self, rows: int, columns: int) -> tuple[Any, ...]:
        # the dtype and device too: a model moved or cast gets new caches and buffers
        return rows, columns, model_dtype(self._lm), self.device

    def _left_pad(self, batch: list[list[int]], rows: int, width: int) -> tuple[Tensor, Tensor]:
        """Left-padded ids and mask ``[n, P]``; bucket-padding rows get one pad token."""
        # one real token each: the packed prefill refuses a prompt without one (packed_layout)
        prompts = batch + [[self.pad_token_id]] * (rows - len(batch))
        input_ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((rows, width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1
        return input_ids.to(self.device), attention_mask.to(self.device)

    def _weights_layout(self, device: torch.device, graphs: bool) -> AbstractContextManager[None]:
        """The decoder's transposed weight copies for this call, when wanted and decoding is
        eager: a captured graph would keep reading the copies of the call that recorded it."""
        wanted = self.transpose_weights
        transposed = getattr(self._decoder, "transposed_weights", None)
        if graphs or transposed is None or wanted is False:
            return nullcontext()
        if wanted is True:
            return transposed()
        # only measured on the CPU (docs/fast_generation.md: 0.85-0.93 s -> 0.78-0.83 s per call)
        if device.type == "cpu":  # "auto"
            return transposed(max_bytes=_AUTO_TRANSPOSE_MAX_BYTES)
        return nullcontext()

    def _graphs_enabled(self, device: torch.device) -> bool:
        if self.use_cuda_graph is False:
            return False
        if device.type in _GRAPH_DEVICE_TYPES:
            return True
        if self.use_cuda_graph is True:
            raise ValueError(
                f"use_cuda_graph=True needs the model on a CUDA device, but it is on "
                f"{device.type!r}; pass use_cuda_graph='auto' (graphs where possible) or False"
            )
        return False

    def _forget_stale_graphs(self) -> None:
        """Drop every captured graph when parameter addresses or adapter state changed."""
        fingerprint = _weights_fingerprint(self._lm)
        if fingerprint != self._fingerprint:
            for slot in self._slots.values():
                slot.programs.clear()
            self._fingerprint = fingerprint


def _compacted(full: _Slot, live: _Slot, rows: Tensor | None) -> tuple[_Slot, Tensor]:
    """The active rows of ``live`` as a new, smaller slot view, and their rows in ``full``.

    ``rows`` maps ``live``'s rows to ``full``'s (None: ``live`` is ``full``). Finished rows'
    outputs are written back to ``full`` first; the shared cache is shrunk in place with
    ``Cache.reorder_cache`` (an ``index_select`` along the batch of every layer).
    """
    keep = torch.nonzero(~live.buffers.done).flatten()  # [m]
    if rows is None:
        rows = torch.arange(live.buffers.done.shape[0], device=keep.device)
    else:
        full.buffers.write_rows(rows, live.buffers)
    # transformers' reorder_cache index_selects new, smaller tensors: the slot no longer has its
    # shape, and the caller drops it after the call
    live.cache.reorder_cache(keep)
    return _Slot(live.cache, live.buffers.select(keep)), rows[keep]


# Cache-window granularity of eager decoding (StaticGenerator._decode_compacting): each widening
# copies the cache once; attention reads at most this many masked columns more than needed.
# measured: benchmarks/results/step_time_vs_trl_cpu.md (2026-12-02, AMD EPYC), a window of
# 16 columns 0.88x the generate time of none, 8 and 32 columns 0.93x and 0.89x
WINDOW_COLUMNS = 16


def widen_cache(cache: Any, columns: int) -> int:
    """Make every layer's keys and values ``[n, kv_heads, c, d]`` hold at least ``columns``
    columns: unchanged when they do, else new tensors of ``columns`` rounded up to
    :data:`WINDOW_COLUMNS` (at most the cache's ``max_cache_len``), the written columns
    copied and the others zero; a cache still as wide as its ``max_cache_len`` (just
    prefilled) is first cut to that width. Returns the tensors' width. The layers' column
    counters are left as they are."""
    first = cache.layers[0]
    current = first.keys.shape[2]
    target = min(_round_up(columns, WINDOW_COLUMNS), first.max_cache_len)
    if current == target or (columns <= current < first.max_cache_len):
        return current
    for layer in cache.layers:
        for name in ("keys", "values"):
            old = getattr(layer, name)
            kept = min(old.shape[2], target)
            # zeros, not empty: the masked columns still enter both products, and a NaN left in them
            # would survive the mask (NaN * 0 weight is NaN)
            new = old.new_zeros(old.shape[0], old.shape[1], target, old.shape[3])
            new[:, :, :kept] = old[:, :, :kept]
            setattr(layer, name, new)
    return target


def _full_width(cache: Any) -> None:
    """Give every layer whose keys and values :func:`widen_cache` narrowed new zero tensors of
    its ``max_cache_len`` columns (the caller resets the cache anyway)."""
    for layer in cache.layers:
        for name in ("keys", "values"):
            old = getattr(layer, name, None)
            if old is not None and old.shape[2] != layer.max_cache_len:
                setattr(layer, name, old.new_zeros(*old.shape[:2], layer.max_cache_len,
                                                   old.shape[3]))


def length_buckets(
    lengths: Sequence[int], max_batch_size: int | None, group_size: int = 1
) -> list[list[int]]:
    """Rows cut into sub-batches of similar prompt length.

    ``lengths``: ``[B]`` prompt lengths; a row is ``b*G + g``, sample ``g`` of prompt ``b``
    (``G = group_size``). Prompts are sorted by length (stable), each expanded to its ``G``
    consecutive rows, and the rows cut every ``m`` rows: with ``M = max_batch_size``,
    ``m = G * (M // G)`` when ``G <= M`` (whole groups only, so a sub-batch prefills each of
    its prompts once), else ``m = M`` (a group larger than a sub-batch is split, and its
    prompt is prefilled once per sub-batch holding some of its rows); ``None``: one sub-batch.
    Keeping groups whole may leave up to ``G - 1`` rows of ``M`` unused: pick ``M`` a multiple
    of ``G``.
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    rows = [prompt * group_size + sample for prompt in order for sample in range(group_size)]
    size = max_batch_size or max(len(rows), 1)
    if group_size <= size:
        # whole groups per sub-batch, so each prompt is prefilled once
        size -= size % group_size
    return [rows[start : start + size] for start in range(0, len(rows), size)]


def _prompt_runs(sub_batch: list[int], group_size: int) -> list[tuple[int, int]]:
    """``(prompt, rows)`` for each run of consecutive rows of one prompt in ``sub_batch``."""
    return [
        (prompt, len(list(run)))
        for prompt, run in itertools.groupby(sub_batch, key=lambda row: row // group_size)
    ]


def _expansion_index(samples: list[int], rows: int, device: torch.device) -> Tensor:
    """``[rows]``: the prompt each row copies, prompt ``j`` repeated ``samples[j]`` times
    (``repeat_interleave``), then 0 for bucket-padding rows."""
    counts = torch.tensor(samples, dtype=torch.long)
    source = torch.repeat_interleave(torch.arange(len(samples)), counts)
    padding = torch.zeros(rows - len(source), dtype=torch.long)
    return torch.cat([source, padding]).to(device)



def _read_back(
    buffers: _DecodeBuffers, real_rows: int, emitted: int, with_logprobs: bool
) -> Completions:
    """Outputs of the first ``real_rows`` rows, cut to each row's length (one host copy)."""
    tokens = buffers.out_tokens[:real_rows, :emitted].tolist()
    lengths = buffers.lengths[:real_rows].tolist()
    finished = buffers.done[:real_rows].tolist()
    completions = [row[:length] for row, length in zip(tokens, lengths, strict=True)]
    logprobs = None
    if with_logprobs:
        values = buffers.out_logprobs[:real_rows, :emitted].tolist()
        logprobs = [row[:length] for row, length in zip(values, lengths, strict=True)]
    return Completions(completions, finished, logprobs)


def _round_up(value: int, multiple: int) -> int:
    # ceiling division on ints (no float rounding for large values)
    return -(-value // multiple) * multiple


def _check_dtype(dtype: object) -> torch.dtype | None:
    """``None`` or a floating-point torch dtype (also given by name: ``"bfloat16"``)."""
    if dtype is None or (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        return dtype
    if isinstance(dtype, str):
        named = getattr(torch, dtype.removeprefix("torch."), None)
        if isinstance(named, torch.dtype) and named.is_floating_point:
            return named
    raise ValueError(
        f"dtype must be None (the model's own) or a floating-point torch dtype such as "
        f"torch.bfloat16 or 'bfloat16', got {dtype!r}"
    )


def _check_bool_or_auto(name: str, value: object) -> None:
    if not (isinstance(value, bool) or value == "auto"):
        raise ValueError(f"{name} must be True, False or 'auto', got {value!r}")


def _check_options(**options: object) -> None:
    """Every option is an int >= 1; those whose default is None may also be None."""
    required = {"max_cached_shapes", "graph_warmup_steps"}
    for name, value in options.items():
        if value is None and name not in required:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            kind = "an int" if name in required else "an int or None"
            raise TypeError(f"{name} must be {kind}, got {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def _weights_fingerprint(lm: nn.Module) -> tuple[Any, ...]:
    """What a captured graph depends on besides shapes: tensor addresses, adapter state."""
    tensors = itertools.chain(lm.parameters(), lm.buffers())
    # a captured graph replays on these addresses: a re-assigned parameter invalidates it
    pointers = tuple(tensor.data_ptr() for tensor in tensors)
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # pragma: no cover - peft is a core dependency
        return pointers, ()
    adapters = tuple(
        (module.disable_adapters, module.merged, tuple(module.active_adapters))
        for module in lm.modules()
        if isinstance(module, BaseTunerLayer)
    )
    return pointers, adapters


@contextmanager
def _preserved_rng(device: torch.device) -> Iterator[None]:
    """Restore the RNG of ``device`` (and the CPU's) afterwards: warm-up steps draw numbers."""
    accelerator = device.type != "cpu"
    with torch.random.fork_rng(
        # torch's fork_rng always saves the CPU generator; devices=[] forks no accelerator's
        devices=[device.index or 0] if accelerator else [],
        device_type=device.type if accelerator else None,
    ):
        yield

