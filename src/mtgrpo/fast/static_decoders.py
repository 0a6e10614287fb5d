"""The model half of the static backend's decode step: prefill and one-token decode over a
transformers ``StaticCache``, and which models can be served that way.

Notation: ``n`` rows, ``P`` prompt width (left-padded), ``C`` cache length (columns), ``V``
vocabulary size, ``H`` hidden size.

Two decoders, picked by name (:data:`DECODERS`):

* ``"model_forward"``: the causal LM's own ``forward`` with a ``StaticCache`` (passed as
  ``cache``, or ``past_key_values`` before transformers 5.24: the name a probe found) and
  a prepared 4-D additive attention mask ``[n, 1, 1, C]`` (transformers returns a 4-D mask
  unchanged, ``masking_utils._preprocess_mask_arguments``). Any causal LM whose layers all get
  a full-attention ``StaticLayer`` works. ``StaticLayer.update`` writes the new key/value at its
  own ``cumulative_length`` counter, which the backend keeps equal to its ``column`` tensor.
* ``"llama_modules"``: the same computation for the Llama family (Llama, Mistral, Qwen2,
  Qwen3), composed from the model's own submodules (embedding, rotary embedding, norms,
  projections, MLP, LM head), its own ``apply_rotary_pos_emb`` and transformers' attention
  function for the configured implementation, so the numbers are those of ``forward``
  (the tests check logits bit for bit). What it skips is the per-call machinery around them:
  output dataclasses, decorators, ``Module.__call__`` of the decoder layers and attention
  blocks, mask preparation, the cache's ``update`` dispatch. On a CPU, where a small model's
  decode forward is mostly dispatch overhead, that is roughly a quarter of it. LoRA still
  applies: peft injects its layers into the projection modules this decoder calls. Two CPU
  departures: ``sdpa`` is called directly rather than through transformers' wrapper (the same
  kernel and numbers), and inside :meth:`LlamaModulesDecoder.transposed_weights` (the backend's
  default on the CPU) the projections multiply by transposed weight copies (LoRA adapters
  merged) and a float32 LM head by blocks of its rows, equal to the module calls up to float
  rounding only.

A decoder may also offer ``transposed_weights()`` (a context manager); the backend uses it
when present.

``"model_forward"`` prefills with the model's ``forward`` and a 2-D padding mask (transformers
builds the causal mask over the cache's ``C`` columns), with position ids from the mask so that
left padding does not shift positions (``cumsum(mask) - 1``, as ``generate`` does).
``"llama_modules"`` prefills padding-free on the CPU where :mod:`mtgrpo.fast.packed` can serve
the model (each distinct prompt's real tokens once, the prefix all prompts share once, at the
same positions), equal to that forward up to float rounding, and with the forward otherwise.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtgrpo.algo.registry import Registry
from mtgrpo.fast.llama_family import (
    SUPPORTED_ATTENTION,
    attention_inputs,
    llama_family_mismatch,
    llama_functions,
    rotate_half_function,
)
from mtgrpo.fast.packed import packed_layout, packed_mismatch, packed_states
from mtgrpo.fast.shared_prompts import distinct_prompts
from mtgrpo.fast.transformers_compat import (
    CACHE_KEYWORDS,
    cache_argument,
    cache_keyword,
    sdpa_packs_one_token_queries,
)

__all__ = [
    "DECODERS",
    "HEAD_BLOCK_ROWS",
    "PACKED_ROWS_HINT",
    "LlamaModulesDecoder",
    "ModelForwardDecoder",
    "StaticCacheUnsupportedError",
    "StaticDecoder",
    "check_static_cache_support",
    "mark_supported",
    "resolve_decoder",
]


# Rows of a float32 LM head's weight per product in a CPU decode step
# (LlamaModulesDecoder.transposed_weights): 512 rows of SmolLM2's 576 columns are 1.2 MB.
HEAD_BLOCK_ROWS = 512


class StaticDecoder(Protocol):
    """Prefill and decode over a ``StaticCache``; both return next-token logits ``[n, V]``."""

    name: str

    def prefill(
        self, cache: Any, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor
    ) -> Tensor: ...

    def prefill_shared(
        self, cache: Any, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
        source: Tensor,
    ) -> Tensor: ...

    def decode(
        self, cache: Any, tokens: Tensor, positions: Tensor, mask: Tensor, column: Tensor,
        visible: int | None = None,
    ) -> Tensor: ...


class StaticCacheUnsupportedError(ValueError):
    """The static backend cannot serve a model. ``inherent``: the model itself rules it out
    (encoder-decoder, sliding-window or recurrent layers, a forward that ignores position
    ids); otherwise a setting or the installed transformers does, and the message names the
    fix."""

    def __init__(self, message: str, *, inherent: bool) -> None:
        super().__init__(message)
        self.inherent = inherent


# The cache keyword each probed model's forward writes its StaticCache through.
_PROBED: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


def check_static_cache_support(lm: nn.Module) -> str:
    """Raise :class:`StaticCacheUnsupportedError` (``TypeError`` for a model that is no
    transformers model) unless ``lm`` can decode over a full-attention ``StaticCache``; return
    the keyword its ``forward`` takes the cache under.

    Read off the config: a transformers config; not an encoder-decoder; every layer's static
    cache layer a plain ``StaticLayer`` (sliding-window or chunked attention, linear-attention
    / recurrent state, shared or indexed caches have masks or state updates other than the
    single growing causal window this backend prepares); attention implementation ``"sdpa"``
    or ``"eager"``. Then decided by running the model (:func:`_probe_forward`, once per model
    object): the decoders' calls must write the cache and give the full forward's logits.
    """
    config = getattr(lm, "config", None)
    if config is None or not callable(getattr(config, "get_text_config", None)):
        raise TypeError(
            f"{type(lm).__name__} has no transformers config; the static backend serves "
            "transformers causal LMs (use the 'hf' backend or an external engine otherwise)"
        )
    if getattr(config, "is_encoder_decoder", False):
        raise StaticCacheUnsupportedError(
            f"{type(lm).__name__} is an encoder-decoder model; the static backend serves "
            "decoder-only causal LMs (use the 'hf' backend)",
            inherent=True,
        )
    _check_cache_layers(config)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in SUPPORTED_ATTENTION:
        raise StaticCacheUnsupportedError(
            f"the static backend prepares attention masks for attn_implementation "
            f"{SUPPORTED_ATTENTION}, but this model uses {implementation!r}; load it with "
            "attn_implementation='sdpa' or use the 'hf' backend",
            inherent=False,
        )
    if lm not in _PROBED:
        _PROBED[lm] = _probe_forward(lm)
    return _PROBED[lm]


def mark_supported(lm: nn.Module, keyword: str) -> None:
    """Record that ``lm`` passed the probe with ``keyword`` without running it: for a copy of
    a probed model in another dtype (the same class and config; in half precision the
    probe's position check could be lost in rounding)."""
    _PROBED[lm] = keyword


def _probe_forward(lm: nn.Module) -> str:
    """Run ``lm`` as the backend does on a left-padded prompt and return the cache keyword
    that works.

    Reference: the full forward of tokens ``(a, b)`` at positions ``(0, 1)``, no cache. Probe,
    for each name in :data:`~mtgrpo.fast.transformers_compat.CACHE_KEYWORDS` (the installed
    release's first): prefill the left-padded prompt ``(pad, a)`` (2-D mask ``(0, 1)``,
    positions ``(0, 0)``) into a 4-column ``StaticCache`` passed under that name, which must
    then hold two columns; then decode ``b`` at position 1 under the 4-D additive mask that
    hides the padding column, as :meth:`ModelForwardDecoder.decode` does. Its logits must
    equal the reference's last ones up to rounding (1024 units in the last place of the
    model's dtype at the logits' magnitude: in half precision this catches only gross errors).
    Finally the forward must read ``position_ids`` (positions ``(0, 5)`` change the logits),
    since left padding is handled through them. Runs in eval mode under ``inference_mode``
    with the RNG restored, so training is unaffected.
    """
    from transformers import StaticCache

    device = next(lm.parameters()).device
    vocab = lm.get_input_embeddings().weight.shape[0]
    # arbitrary ids, kept inside the vocabulary
    pad, a, b = (token % vocab for token in (3, 1, 2))

    def forward(ids: list[int], positions: list[int], mask: Any = None, **extra: Any) -> Tensor:
        ids_tensor = torch.tensor([ids], device=device)
        mask = torch.ones_like(ids_tensor) if mask is None else mask
        where = torch.tensor([positions], device=device)
        output = lm(input_ids=ids_tensor, attention_mask=mask, position_ids=where, **extra)
        return output.logits[0, -1]

    with _probe_context(lm, device):
        reference = forward([a, b], [0, 1], use_cache=False)  # [V]
        keyword, failures = None, []
        # the installed release's name first, then the other; dict.fromkeys drops the repeat
        for name in dict.fromkeys((cache_keyword(), *CACHE_KEYWORDS)):
            cache = StaticCache(config=lm.config, max_cache_len=4)
            padding = torch.tensor([[0, 1]], device=device)
            try:
                # generate's positions: the left-padded prompt's one real token sits at position 0
                forward([pad, a], [0, 0], padding, use_cache=True, **cache_argument(cache, name))
            except TypeError as error:
                failures.append(f"{name!r}: {error}")
                continue
            # StaticLayer's counter: both prompt columns (padding included) were written
            if int(cache.get_seq_length()) != 2:
                failures.append(f"{name!r}: the cache was not written")
                continue
            keyword = name
            break
        if keyword is None:
            raise StaticCacheUnsupportedError(
                f"{type(lm).__name__}.forward does not write a StaticCache passed as "
                f"{' or '.join(CACHE_KEYWORDS)} ({'; '.join(failures)}); {_VERSION_FIX}",
                inherent=False,
            )
        mask = torch.zeros((1, 1, 1, 4), dtype=model_dtype(lm), device=device)
        mask[..., [0, 3]] = torch.finfo(mask.dtype).min  # the padding and the unwritten column
        decoded = forward([b], [1], mask, use_cache=True, **cache_argument(cache, keyword))
        _check_probe_logits(lm, decoded, reference)
        # a forward that ignored position_ids would shift a left-padded prompt's positions
        if torch.equal(forward([a, b], [0, 5], use_cache=False), reference):
            raise StaticCacheUnsupportedError(
                f"{type(lm).__name__}.forward ignores position_ids (logits at positions (0, 5) "
                "equal those at (0, 1)); the static backend handles left padding through them "
                "(use the 'hf' backend)",
                inherent=True,
            )
    return keyword


def _check_probe_logits(lm: nn.Module, decoded: Tensor, reference: Tensor) -> None:
    finfo = torch.finfo(reference.dtype)
    scale = max(1.0, float(reference.abs().max()))
    tolerance = 1024 * finfo.eps * scale  # rounding of another summation order, not a bug
    error = float((decoded.float() - reference.float()).abs().max())
    if not error <= tolerance:  # also catches NaN
        raise StaticCacheUnsupportedError(
            f"{type(lm).__name__}: decoding a left-padded prompt over a StaticCache under a 4-D "
            f"mask gives other logits than the full forward (max difference {error:.3g}, tolerance "
            f"{tolerance:.3g}); {_VERSION_FIX}",
            inherent=False,
        )


_VERSION_FIX = (
    "the installed transformers changed an interface the static backend relies on: install "
    "the tested versions (pip install -c requirements/lock.txt ..., or ./run.sh's set-up) "
    "or use the 'hf' backend"
)


@contextmanager
def _probe_context(lm: nn.Module, device: torch.device) -> Iterator[None]:
    """Eval mode, no autograd, no autocast, the RNG of ``device`` restored afterwards."""
    accelerator = device.type != "cpu"
    training = lm.training
    lm.eval()
    try:
        with (
            torch.random.fork_rng(
                devices=[device.index or 0] if accelerator else [],
                device_type=device.type if accelerator else None,
            ),
            torch.inference_mode(),
            torch.autocast(device.type, enabled=False),
        ):
            yield
    finally:
        lm.train(training)


def _check_cache_layers(config: Any) -> None:
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    try:
        probe = StaticCache(config=config, max_cache_len=1)  # layers allocate lazily: cheap
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise StaticCacheUnsupportedError(
            f"transformers cannot build a StaticCache for this model ({error}); use the 'hf' "
            "backend",
            inherent=True,
        ) from error
    unsupported = sorted({type(layer).__name__ for layer in probe.layers} - {"StaticLayer"})
    # `type(...) is`, not isinstance: transformers' StaticSlidingWindowLayer subclasses StaticLayer
    if unsupported or not all(type(layer) is StaticLayer for layer in probe.layers):
        raise StaticCacheUnsupportedError(
            f"the static backend needs full causal attention in every layer, but this model's "
            f"static cache has {unsupported} layers (sliding-window, chunked or recurrent "
            "attention); use the 'hf' backend",
            inherent=True,
        )


def _logits_to_keep(lm: nn.Module) -> dict[str, int]:
    accepts = "logits_to_keep" in inspect.signature(lm.forward).parameters
    # sampling reads the last position only: no [n, P, V] logits at prefill
    return {"logits_to_keep": 1} if accepts else {}


class ModelForwardDecoder:
    """Prefill and decode through the causal LM's own ``forward`` (any supported model)."""

    name = "model_forward"

    def __init__(self, lm: nn.Module) -> None:
        self.lm = lm
        self._keep = _logits_to_keep(lm)
        self._cache = check_static_cache_support(lm)  # the forward's cache keyword

    def prefill(
        self, cache: Any, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor
    ) -> Tensor:
        """Write the prompts' keys/values into columns ``0..P-1``; logits of the last column.

        ``input_ids, attention_mask, position_ids: [n, P]`` -> ``[n, V]``.
        """
        return self._last_logits(cache, input_ids, attention_mask, position_ids)

    def prefill_shared(
        self, cache: Any, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
        source: Tensor,
    ) -> Tensor:
        """Prefill ``u`` prompts once for ``n`` rows: row ``r`` gets prompt ``source[r]``'s
        keys/values in columns ``0..P-1`` and its last logits. ``input_ids, attention_mask,
        position_ids: [u, P]``, ``source: [n]`` -> ``[n, V]``.

        The prompts run through the model's forward into a ``DynamicCache`` (``[u, kv_heads, P,
        head_dim]`` per layer); each of ``cache``'s layers then takes the rows ``source``
        selects through its own ``update``, which writes columns ``0..P-1`` and advances the
        layer's column counter to ``P``, as a prefill does.
        """
        from transformers import DynamicCache

        # a DynamicCache as wide as the prompts; their rows are copied into the static cache below
        shared = DynamicCache(config=self.lm.config)
        logits = self._last_logits(shared, input_ids, attention_mask, position_ids)  # [u, V]
        for stored, prefilled in zip(cache.layers, shared.layers, strict=True):
            # StaticLayer.update (transformers 5.24) writes from its cumulative_length (0 after
            # reset) and advances it to P, as the model's own prefill into the cache would
            stored.update(
                prefilled.keys.index_select(0, source), prefilled.values.index_select(0, source)
            )
        return logits.index_select(0, source)

    def decode(
        self, cache: Any, tokens: Tensor, positions: Tensor, mask: Tensor, column: Tensor,
        visible: int | None = None,
    ) -> Tensor:
        """One token per row: ``tokens, positions: [n, 1]``, ``mask: [n, 1, 1, C]`` -> ``[n, V]``.

        ``column`` (``[1]``) is where the token's key/value go; here the cache's own counter
        decides, and the backend keeps the two equal. ``visible`` (eager decoding only: the
        number of cache columns written so far, this token's included) lets a decoder attend
        to those columns only; the columns after them are masked out anyway. This decoder
        attends to all ``C`` (the model's own attention over its ``StaticCache``).
        """
        return self._last_logits(cache, tokens, mask, positions)

    def _last_logits(
        self, cache: Any, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor
    ) -> Tensor:
        """The model's own forward over ``cache``; the logits of the last column ``[n, V]``."""
        output = self.lm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **cache_argument(cache, self._cache),
            **self._keep,
        )
        return output.logits[:, -1]


class LlamaModulesDecoder(ModelForwardDecoder):
    """The decode step of a Llama-family model, composed from its modules (module docstring).

    Mirrors ``<Family>DecoderLayer.forward`` and ``<Family>Attention.forward`` of transformers
    5.23-5.24 line by line: ``x += attn(input_layernorm(x))``;
    ``x += mlp(post_attention_layernorm(x))``;
    attention: project, view ``[n, 1, heads, d]``, q/k norms where the family has them,
    transpose, rotary embedding, write key/value at ``column``, attention over all ``C``
    columns under the additive mask, ``o_proj``. With ``sdpa`` on the CPU the attention is
    :func:`_grouped_query_sdpa` (the kernel call transformers makes, without its wrapper).

    Inside :meth:`transposed_weights` (the backend's default on the CPU) the projections
    multiply by transposed copies of their weights (LoRA adapters merged) and a float32 LM
    head by blocks of its rows, instead of calling the modules; see there.
    """

    name = "llama_modules"

    def __init__(self, lm: nn.Module) -> None:
        super().__init__(lm)
        reason = llama_family_mismatch(lm)
        if reason is not None:
            raise ValueError(
                f"decode path 'llama_modules' cannot serve this model: {reason}; use "
                "decode_path='model_forward' (or 'auto')"
            )
        self._rotary, self._attention = llama_functions(lm.model)
        # torch's kernel called directly where transformers' wrapper would make the same call
        self._sdpa = lm.config._attn_implementation == "sdpa" and sdpa_packs_one_token_queries()
        self._dtype = model_dtype(lm)
        self._transposed: dict[nn.Module, tuple[Tensor, Tensor | None]] = {}
        # attention block or MLP -> its fused [in, q+k+v] or [in, gate+up] copy and bias
        self._fused: dict[nn.Module, tuple[Tensor, Tensor | None]] = {}
        self._head_blocks: tuple[Tensor, ...] = ()
        # projections whose per-part views serve the prefill only (a fused copy decodes)
        self._fused_parts: set[nn.Module] = set()
        # fused owner or module -> its weight copy in oneDNN's packed layout (bfloat16, CPU)
        self._packed: dict[nn.Module, Tensor] = {}
        self._rotate_half = rotate_half_function(lm.model)

    @contextmanager
    def transposed_weights(self, max_bytes: int | None = None) -> Iterator[None]:
        """Decode with ``[in, out]`` copies of the projection weights (LoRA merged) and the LM
        head in row blocks.

        ``nn.Linear`` computes ``x @ W.T`` from its ``[out, in]`` weight; a decode step
        multiplies a few dozen rows by every weight of the model, which no longer fit in the
        CPU's cache from one step to the next, and MKL reads a contiguous ``[in, out]`` copy
        about a quarter faster there (``torch.mm(x, W.T.contiguous())``; measured on the
        benchmark's model, see ``docs/fast_generation.md``). The copies are made on entry (so
        they hold the current weights) and dropped on exit: memory for one more copy of those
        weights while a ``generate`` call runs. Copied are plain ``nn.Linear`` modules without
        hooks and peft LoRA layers over one (their active adapters merged,
        ``W + scaling * B @ A`` as peft's safe merge computes it, so a step makes one product
        per projection instead of three plus the adapter's elementwise work); other adapter
        layers and hooked modules are called as they are.

        A float32 LM head without bias is not copied: its ``[V, H]`` weight is multiplied in
        blocks of :data:`HEAD_BLOCK_ROWS` rows (views, ``F.linear`` per block, the logits
        concatenated). One ``[n, H] x [H, V]`` product over a vocabulary of tens of thousands
        runs at half the speed of the others on a CPU; blocks of a few hundred rows run at
        the others' speed (a ``[72, 576]`` step over SmolLM2's 49,152 rows: 59 ms against
        107 ms with the transposed copy, 2-core AMD EPYC, AVX2).

        Results equal the module calls up to float rounding (the products may be summed in
        another order; a merged adapter adds its delta before the product rather than after).
        ``max_bytes``: make no copies when they would take more than this (the calls then run
        as without the context).
        """
        head = self.lm.lm_head
        # the measured case: a float32 head (F.linear per block below adds no bias)
        blocks = (_plain_linear(head) and head.bias is None
                  and head.weight.dtype == torch.float32)
        modules = [module for module in self._linears()
                   if _copyable(module) and not (blocks and module is head)]
        size = sum(_base_weight(module).nbytes for module in modules)
        if max_bytes is None or size <= max_bytes:
            with torch.no_grad():  # the adapters' deltas need no graph
                self._fuse_copies(set(modules))
                self._transposed.update({module: _transposed_copy(module) for module in modules
                                         if module not in self._transposed})
            if blocks:
                # views: 59 ms against 107 ms from a transposed copy (docs/fast_generation.md)
                self._head_blocks = head.weight.detach().split(HEAD_BLOCK_ROWS)
            self._packed = _packed_copies(self._fused, self._transposed, self._fused_parts)
        try:
            yield
        finally:
            self._transposed = {}
            self._fused = {}
            self._fused_parts = set()
            self._packed = {}
            self._head_blocks = ()

    def _fuse_copies(self, copyable: set[nn.Module]) -> None:
        """One ``[in, q + k + v]`` copy per attention block and one ``[in, gate + up]`` per MLP
        (where every part is copyable and all or none have a bias), with each part's entry in
        ``_transposed`` a column view of it: a decode step then makes one product for the
        query, key and value and one for the gate and up projections, instead of five (fewer,
        larger products and fewer dispatches; the per-part views serve the prefill). A LoRA
        layer's part keeps its own merged weight for the prefill, so those five projections
        of a LoRA policy are held twice while the call runs."""
        backbone = self.lm.model
        for layer in backbone.layers[: backbone.config.num_hidden_layers]:
            attn, mlp = layer.self_attn, layer.mlp
            for owner, parts in ((attn, (attn.q_proj, attn.k_proj, attn.v_proj)),
                                 (mlp, (getattr(mlp, "gate_proj", None),
                                        getattr(mlp, "up_proj", None)))):
                if not all(part in copyable for part in parts):
                    continue
                pieces = [_transposed_parts(part) for part in parts]
                if len({bias is None for _, bias in pieces}) != 1 or (
                        owner is mlp and pieces[0][0].shape != pieces[1][0].shape):
                    continue  # a decode step splits gate | up into two equal halves
                # q | k | v (gate | up) side by side: one product, its columns split into the parts
                weight = torch.cat([w for w, _ in pieces], dim=1)  # [in, sum of outs]
                bias = None if pieces[0][1] is None else torch.cat([b for _, b in pieces])
                self._fused[owner] = (weight, bias)
                self._fused_parts.update(parts)
                start = 0
                for part, (w, b) in zip(parts, pieces, strict=True):
                    end = start + w.shape[1]
                    # a merged LoRA weight keeps its own [out, in] layout for the prefill's
                    # products (as before fusing: a row-major view rounds differently)
                    self._transposed[part] = (w, b) if _lora_over_linear(part) else (
                        weight[:, start:end], None if bias is None else bias[start:end])
                    start = end

    def prefill(
        self, cache: Any, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor
    ) -> Tensor:
        """As :meth:`ModelForwardDecoder.prefill`, padding-free where it can
        (:meth:`_packed_prefill`)."""
        logits = self._packed_prefill(cache, input_ids, attention_mask, position_ids, None)
        if logits is None:
            return super().prefill(cache, input_ids, attention_mask, position_ids)
        return logits

    def prefill_shared(
        self, cache: Any, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
        source: Tensor,
    ) -> Tensor:
        """As :meth:`ModelForwardDecoder.prefill_shared`, padding-free where it can
        (:meth:`_packed_prefill`: no ``DynamicCache``, each row's cache columns written once)."""
        logits = self._packed_prefill(cache, input_ids, attention_mask, position_ids, source)
        if logits is None:
            return super().prefill_shared(cache, input_ids, attention_mask, position_ids, source)
        return logits

    def _packed_prefill(
        self, cache: Any, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
        source: Tensor | None,
    ) -> Tensor | None:
        """The prefill as the padding-free training forward runs it (:mod:`mtgrpo.fast.packed`):
        each distinct prompt's real tokens once, the prefix all of them share (a chat
        template's system turn) once, no padding; the projections through
        :meth:`_project` and :meth:`_mlp` (the merged weight copies inside
        :meth:`transposed_weights`). Row ``r`` of ``cache`` gets prompt ``source[r]``'s keys
        and values in columns ``0..P-1`` (its left-padding columns a copy of some key: masked
        out, as the padded forward's padding keys are); returns the rows' last logits
        ``[n, V]``. ``None`` off the CPU (where padding costs little and the forward's
        prefill keeps greedy completions token for token those of ``generate``; measured and
        tested on the CPU only) or when the packed forward cannot serve the model or the batch
        (:func:`~mtgrpo.fast.packed.packed_mismatch`, a prompt without a real token); the
        caller then runs the model's forward. Equal to it up to float rounding.
        """
        backbone = self.lm.model
        if input_ids.device.type != "cpu" or packed_mismatch(backbone) is not None:
            return None
        width = input_ids.shape[1]
        first, inverse = distinct_prompts(input_ids, attention_mask, width)
        layout = packed_layout(input_ids, attention_mask, position_ids, 0, first, inverse)
        if layout is None:
            return None
        prompt_of_row = inverse if source is None else inverse.index_select(0, source)  # [n]
        keys_values: list[tuple[Tensor, Tensor]] = []
        hidden = packed_states(backbone, layout, project=self._project, mlp=self._mlp,
                               keys_values=keys_values)  # [M, H]
        columns = layout.prompt_index.index_select(0, prompt_of_row)  # [n, P] packed tokens
        for stored, (key, value) in zip(cache.layers, keys_values, strict=True):
            stored.update(_cache_rows(key, columns), _cache_rows(value, columns))
        # left padding puts every prompt's last real token in column P - 1
        last = backbone.norm(hidden.index_select(0, layout.prompt_index[:, -1]))  # [U, H]
        return self._head(last).index_select(0, prompt_of_row)  # [n, V]

    def _linears(self) -> Iterator[nn.Module]:
        backbone = self.lm.model
        # the layers LlamaModel.forward runs (transformers 5.24 slices them the same way)
        for layer in backbone.layers[: backbone.config.num_hidden_layers]:
            attn, mlp = layer.self_attn, layer.mlp
            yield from (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
            if _composable_mlp(mlp):
                yield from (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        yield self.lm.lm_head

    def _project(self, module: nn.Module, hidden: Tensor) -> Tensor:
        """``module(hidden)``, through the transposed weight copy when there is one."""
        copied = self._transposed.get(module)
        if copied is None:
            return module(hidden)
        weight, bias = copied
        output = self._product(module, hidden.reshape(-1, hidden.shape[-1]), weight, bias)
        return output.view(*hidden.shape[:-1], weight.shape[1])

    def _fused_product(self, owner: nn.Module, hidden: Tensor) -> Tensor:
        """``hidden [n, in]`` times the fused copy of ``owner`` (an attention block or MLP)."""
        return self._product(owner, hidden, *self._fused[owner])

    def _product(self, owner: nn.Module, hidden: Tensor, weight: Tensor,
                 bias: Tensor | None) -> Tensor:
        """``hidden [n, in] @ weight [in, out] (+ bias)``: from the packed copy of ``owner``'s
        weight when there is one (:func:`_packed_copies`)."""
        packed = self._packed.get(owner)
        if packed is not None:
            return _packed_product(hidden, packed, bias)
        return _fused_product(hidden, weight, bias)

    def _head(self, hidden: Tensor) -> Tensor:
        """The LM head: ``[n, 1, H]`` -> ``[n, 1, V]`` logits, in row blocks when there are."""
        if not self._head_blocks:
            return self._project(self.lm.lm_head, hidden)
        flat = hidden.reshape(-1, hidden.shape[-1])
        logits = torch.cat([F.linear(flat, block) for block in self._head_blocks], dim=1)
        return logits.view(*hidden.shape[:-1], logits.shape[1])

    def _mlp(self, mlp: nn.Module, hidden: Tensor) -> Tensor:
        if mlp.down_proj not in self._transposed:
            return mlp(hidden)
        # LlamaMLP.forward's down(act(gate(x)) * up(x)) (transformers 5.24)
        gate = mlp.act_fn(self._project(mlp.gate_proj, hidden))
        return self._project(mlp.down_proj, gate * self._project(mlp.up_proj, hidden))

    def cache_window(self, device: torch.device) -> bool:
        """Whether eager decoding should keep the cache's tensors only as wide as the columns
        written so far, rounded up (:func:`~mtgrpo.fast.static.widen_cache`), so that attention
        reads contiguous tensors over those columns only. Worth it for the two-product
        attention (half precision on the CPU), whose products copy a sliced cache: at 64 rows
        and 4 key/value heads of 32 dims (AMD EPYC, one thread), the products over 112 of 176
        columns take 0.24 ms contiguous, 0.70 ms as a slice and 0.34 ms over all 176."""
        return _matmul_attention(device, self._dtype)

    def decode(
        self, cache: Any, tokens: Tensor, positions: Tensor, mask: Tensor, column: Tensor,
        visible: int | None = None,
    ) -> Tensor:
        """As :meth:`ModelForwardDecoder.decode`; with ``visible``, attention reads only the
        first ``visible`` cache columns (the same result: the others are masked out).

        With the two-product attention (half precision on the CPU) the columns are read as a
        slice only while it holds at most half of the cache: a slice of the cache is not
        contiguous, and the products copy it, which costs more than attending to the masked
        columns, whose weights are exactly 0. The cache's tensors may hold fewer columns than
        the mask (a window, :meth:`cache_window`): attention then reads all of theirs, the
        mask cut to them.
        """
        matmul = _matmul_attention(tokens.device, self._dtype)
        columns = _cache_columns(cache, mask.shape[-1])
        # measured (cache_window): over 112 of 176 columns, 0.70 ms as a copied slice, 0.34 ms
        # over all of them; past half the cache the masked columns are the cheaper read
        if visible is not None and matmul and visible < columns and 2 * visible > columns:
            visible = None
        if visible is None and columns < mask.shape[-1]:
            visible = columns
        if visible is not None:
            mask = mask[..., :visible]
        backbone = self.lm.model
        layers = backbone.layers[: backbone.config.num_hidden_layers]
        # the fused step calls torch's attention itself: where the old path would, not
        # through transformers' wrapper (eager attention, older transformers)
        direct = matmul or (self._sdpa and tokens.device.type == "cpu")
        if direct and self._fused and all(
            layer.self_attn in self._fused and layer.mlp in self._fused for layer in layers
        ):
            return self._decode_fused(cache, tokens, positions, mask, column, visible)
        hidden = backbone.embed_tokens(tokens)  # [n, 1, H]
        cos_sin = backbone.rotary_emb(hidden, positions)
        for layer, stored in zip(layers, cache.layers, strict=True):
            attended = self._attend(
                layer.self_attn, layer.input_layernorm(hidden), cos_sin, mask, stored, column,
                visible,
            )
            # LlamaDecoderLayer.forward's two residual additions (transformers 5.24)
            hidden = hidden + attended
            hidden = hidden + self._mlp(layer.mlp, layer.post_attention_layernorm(hidden))
        return self._head(backbone.norm(hidden))[:, -1]  # [n, V]

    def _decode_fused(
        self, cache: Any, tokens: Tensor, positions: Tensor, mask: Tensor, column: Tensor,
        visible: int | None,
    ) -> Tensor:
        """:meth:`decode` over the fused copies (:meth:`_fuse_copies`), hidden states ``[n, H]``
        (no sequence dimension, so no reshapes around the products): per layer one product
        for query, key and value, the rotary embedding applied once to query and key heads
        together (``[n, heads + kv_heads, d]``, the family's formula and ``rotate_half``), one
        product for gate and up. The same operations as the module calls, up to the products'
        float rounding."""
        backbone = self.lm.model
        # one token per row: the sequence dimension dropped, so the products need no reshapes
        hidden = backbone.embed_tokens(tokens[:, 0])  # [n, H]
        cos, sin = backbone.rotary_emb(hidden, positions)  # [n, 1, d]: broadcast over heads
        layers = backbone.layers[: backbone.config.num_hidden_layers]
        for layer, stored in zip(layers, cache.layers, strict=True):
            hidden = hidden + self._attend_fused(
                layer.self_attn, layer.input_layernorm(hidden), cos, sin, mask, stored, column,
                visible,
            )
            mlp = layer.mlp
            gate, up = self._fused_product(
                mlp, layer.post_attention_layernorm(hidden)
            ).chunk(2, dim=-1)  # the fused copy is [gate | up], two equal widths
            hidden = hidden + self._project(mlp.down_proj, mlp.act_fn(gate) * up)
        return self._head(backbone.norm(hidden))  # [n, V]

    def _attend_fused(
        self, attn: nn.Module, hidden: Tensor, cos: Tensor, sin: Tensor, mask: Tensor,
        stored: Any, column: Tensor, visible: int | None,
    ) -> Tensor:
        rows, dim = hidden.shape[0], attn.head_dim
        heads = attn.config.num_attention_heads
        kv_heads = attn.config.num_key_value_heads
        qkv = self._fused_product(attn, hidden).view(rows, -1, dim)  # [n, h+2kv, d]
        value = qkv[:, heads + kv_heads:]  # [n, kv_heads, d]
        if getattr(attn, "q_norm", None) is None:
            qk = qkv[:, : heads + kv_heads]
            # apply_rotary_pos_emb's formula (transformers 5.24 modeling_llama), q and k at once
            qk = (qk * cos) + (self._rotate_half(qk) * sin)
            query, key = qk[:, :heads], qk[:, heads:]
        else:  # per-head norms first (Qwen3), then the same formula on each
            query, key = attn.q_norm(qkv[:, :heads]), attn.k_norm(qkv[:, heads: heads + kv_heads])
            query = (query * cos) + (self._rotate_half(query) * sin)
            key = (key * cos) + (self._rotate_half(key) * sin)
        # straight at the backend's column, skipping the cache's update dispatch (module
        # docstring); the layer's counter stays where the prefill left it
        stored.keys.index_copy_(2, column, key.unsqueeze(2))  # [n, kv_heads, C, d]
        stored.values.index_copy_(2, column, value.unsqueeze(2))
        keys, values = stored.keys, stored.values
        if visible is not None:
            keys, values = keys[:, :, :visible], values[:, :, :visible]
        grouped = query.view(rows, kv_heads, heads // kv_heads, dim)
        if _matmul_attention(query.device, query.dtype):
            output = _matmul_attention_grouped(grouped, keys, values, mask, attn.scaling)
        else:
            output = torch.nn.functional.scaled_dot_product_attention(
                grouped, keys, values, attn_mask=mask, scale=attn.scaling
            )  # [n, kv_heads, heads // kv_heads, d]: query heads in order
        return self._project(attn.o_proj, output.reshape(rows, heads * dim))

    def _attend(
        self,
        attn: nn.Module,
        hidden: Tensor,
        cos_sin: tuple[Tensor, Tensor],
        mask: Tensor,
        stored: Any,
        column: Tensor,
        visible: int | None = None,
    ) -> Tensor:
        query, key, value = attention_inputs(  # [n, ., 1, d]
            attn, hidden, cos_sin, self._rotary, self._project
        )
        stored.keys.index_copy_(2, column, key)  # [n, kv_heads, C, d]
        stored.values.index_copy_(2, column, value)
        keys, values = stored.keys, stored.values
        if visible is not None:
            keys, values = keys[:, :, :visible], values[:, :, :visible]
        if _matmul_attention(query.device, query.dtype):
            output = _grouped_query_matmul_attention(query, keys, values, mask, attn.scaling)
        elif self._sdpa and query.device.type == "cpu":
            output = _grouped_query_sdpa(query, keys, values, mask, attn.scaling)
        else:
            output, _ = self._attention(
                attn, query, keys, values, mask, dropout=0.0, scaling=attn.scaling
            )
            # as LlamaAttention.forward does after its attention call (transformers 5.24)
            output = output.reshape(*hidden.shape[:-1], -1).contiguous()
        return self._project(attn.o_proj, output)


def _cache_columns(cache: Any, default: int) -> int:
    """Columns of the cache's key tensors (``default`` before the first layer is written)."""
    layers = getattr(cache, "layers", None)
    keys = getattr(layers[0], "keys", None) if layers else None
    return default if keys is None else keys.shape[2]


def _cache_rows(states: Tensor, columns: Tensor) -> Tensor:
    """``states: [M, kv_heads, d]`` at ``columns: [n, P]`` (packed token indices), laid out as
    a cache's rows: ``[n, kv_heads, P, d]``."""
    _, heads, dim = states.shape
    gathered = states.index_select(0, columns.reshape(-1))  # [n * P, kv_heads, d]
    return gathered.view(*columns.shape, heads, dim).transpose(1, 2)


def _plain_linear(module: nn.Module) -> bool:
    """A ``torch.nn.Linear`` itself (not a subclass or a peft wrapper) with no hooks and a
    plain weight tensor (not a quantized tensor subclass)."""
    return (
        type(module) is nn.Linear
        and type(module.weight) in (nn.Parameter, Tensor)
        and not module._forward_hooks
        and not module._forward_pre_hooks
        and not hasattr(module, "_hf_hook")  # accelerate's offloading hook
    )


def _lora_over_linear(module: nn.Module) -> bool:
    """A peft LoRA layer (:func:`mtgrpo.fast.replica.mergeable_lora`: any variant peft can
    merge) over a plain ``nn.Linear``, without hooks of its own."""
    from mtgrpo.fast.replica import mergeable_lora

    return (
        mergeable_lora(module)
        and _plain_linear(module.get_base_layer())
        and not module._forward_hooks
        and not module._forward_pre_hooks
    )


def _copyable(module: nn.Module) -> bool:
    """Whether :meth:`LlamaModulesDecoder.transposed_weights` may copy ``module``."""
    return _plain_linear(module) or _lora_over_linear(module)


def _base_weight(module: nn.Module) -> Tensor:
    return module.get_base_layer().weight if _lora_over_linear(module) else module.weight


def _transposed_parts(module: nn.Module) -> tuple[Tensor, Tensor | None]:
    """``(W.T, bias)`` of a copyable module as views (a plain ``nn.Linear``'s weight) or of a
    fresh merged weight (LoRA), for :meth:`LlamaModulesDecoder._fuse_copies` to concatenate."""
    if _lora_over_linear(module):
        from mtgrpo.fast.replica import merged_lora

        weight, bias = merged_lora(module)
        return weight.t(), bias
    return module.weight.detach().t(), None if module.bias is None else module.bias.detach()


def _transposed_copy(module: nn.Module) -> tuple[Tensor, Tensor | None]:
    """``(W.T, bias)`` of a copyable module: a contiguous ``[in, out]`` copy of a plain
    ``nn.Linear``'s weight; for a LoRA layer, the transposed view of a fresh ``[out, in]``
    tensor holding its weight with the active adapters merged
    (:func:`mtgrpo.fast.replica.merged_lora`; laying that out again would cost one more pass
    over every weight per ``generate`` call, for a product no faster)."""
    if _lora_over_linear(module):
        from mtgrpo.fast.replica import merged_lora

        weight, bias = merged_lora(module)
        return weight.t(), bias
    bias = None if module.bias is None else module.bias.detach()
    # contiguous [in, out]: MKL streams it about a quarter faster (docs/fast_generation.md:
    # 192 µs as nn.Linear, 134 µs from the copy)
    return module.weight.detach().t().contiguous(), bias


def _composable_mlp(mlp: nn.Module) -> bool:
    """The family's gated MLP, ``down(act(gate(x)) * up(x))``, with copyable projections."""
    names = ("gate_proj", "up_proj", "down_proj")
    return (
        type(mlp).__name__.endswith("MLP")
        and callable(getattr(mlp, "act_fn", None))
        and not mlp._forward_hooks
        and not mlp._forward_pre_hooks
        and all(_copyable(getattr(mlp, name, None) or nn.Identity()) for name in names)
    )


def _grouped_query_sdpa(
    query: Tensor, keys: Tensor, values: Tensor, mask: Tensor, scaling: float
) -> Tensor:
    """One-token attention with the query heads that share a key/value head stacked as that
    head's queries: ``query: [n, heads, 1, d]``, ``keys, values: [n, kv_heads, C, d]``, ``mask:
    [n, 1, 1, C]`` -> ``[n, 1, heads * d]``.

    Head ``h`` reads key/value head ``h // (heads // kv_heads)``, as with ``repeat_kv``. This
    is the call transformers' ``sdpa_attention_forward`` makes for a one-token query (its
    ``pack_gqa``), without the wrapper's per-call work: about 4 % of a ``generate`` call on
    the CPU benchmark's model. Used on the CPU only (measured there), and only with a
    transformers whose wrapper makes this call (5.23 on; older releases repeat the key/value
    heads, and the decoder then calls their wrapper so that its numbers stay the forward's:
    :func:`~mtgrpo.fast.transformers_compat.sdpa_packs_one_token_queries`).
    """
    rows, heads, _, dim = query.shape
    kv_heads = keys.shape[1]
    # transformers' pack_gqa layout for a one-token query: each key/value head read once
    grouped = query.view(rows, kv_heads, heads // kv_heads, dim)
    output = torch.nn.functional.scaled_dot_product_attention(
        grouped, keys, values, attn_mask=mask, scale=scaling
    )  # [n, kv_heads, heads // kv_heads, d]: query heads in order
    return output.reshape(rows, 1, heads * dim)


# Half-precision dtypes whose one-token attention runs as two matrix products on the CPU.
_MATMUL_ATTENTION_DTYPES = (torch.bfloat16, torch.float16)


def _matmul_attention(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype in _MATMUL_ATTENTION_DTYPES


def _grouped_query_matmul_attention(
    query: Tensor, keys: Tensor, values: Tensor, mask: Tensor, scaling: float
) -> Tensor:
    """One-token attention as two batched matrix products with a float32 softmax, query heads
    grouped per key/value head as in :func:`_grouped_query_sdpa` (same shapes in and out).

    Used on the CPU for bfloat16 (and float16) caches, where torch's fused CPU attention
    kernel runs slower than in float32, while the two products run at the bfloat16 rate
    (measured on an AMD EPYC with ``avx512_bf16``, 64 rows, 4 layers' caches of 176 columns:
    6.4 ms fused, 3.0 ms as products; float32: 4.9 ms fused). The scores are rounded to
    bfloat16 by the product, then scaled, masked and normalised in float32.
    """
    rows, heads, _, dim = query.shape
    kv_heads = keys.shape[1]
    grouped = query.view(rows, kv_heads, heads // kv_heads, dim)  # [n, kv_heads, g, d]
    output = _matmul_attention_grouped(grouped, keys, values, mask, scaling)
    return output.reshape(rows, 1, heads * dim)


def _matmul_attention_grouped(
    grouped: Tensor, keys: Tensor, values: Tensor, mask: Tensor, scaling: float
) -> Tensor:
    """:func:`_grouped_query_matmul_attention` on grouped queries ``[n, kv_heads, g, d]`` ->
    ``[n, kv_heads, g, d]``."""
    # the product runs at the bfloat16 rate; softmax's exponentials and sums then in float32
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).float()  # [n, kv_heads, g, C]
    scores = scores.mul_(scaling).add_(mask)  # mask [n, 1, 1, C] broadcasts
    # back to the cache's dtype: the second product also runs at the bfloat16 rate
    weights = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(weights, values)


# Rows a packed weight is laid out for (oneDNN's batch-size hint; any row count works): a
# decode step's batch, GRPO's 8 prompts x 8 samples.
PACKED_ROWS_HINT = 64


def _packed_copies(fused: dict[nn.Module, tuple[Tensor, Tensor | None]],
                   transposed: dict[nn.Module, tuple[Tensor, Tensor | None]],
                   parts: set[nn.Module]) -> dict[nn.Module, Tensor]:
    """The decode step's bfloat16 CPU weight copies (each fused copy, and every other
    projection's copy) laid out again in oneDNN's packed format, which a linear product reads
    without re-laying its weight on every call: with 16 to 64 rows, 17-25 % less time for a
    decode step's products (AMD EPYC with ``avx512_bf16``, one thread, the CPU benchmark's
    model). The same bfloat16 products with float32 accumulation as ``torch.mm``, up to
    summation order. Empty (the products then run as ``torch.mm``) for other dtypes or
    devices, or where this torch build lacks oneDNN's linear operators."""
    copies = {**fused, **{module: copy for module, copy in transposed.items()
                          if module not in parts}}
    if not copies or not all(w.device.type == "cpu" and w.dtype == torch.bfloat16
                             for w, _ in copies.values()):
        return {}
    if not torch.backends.mkldnn.is_available():
        return {}
    try:
        reorder = torch.ops.mkldnn._reorder_linear_weight
        # oneDNN's linear takes F.linear's [out, in] weight (torch inductor's mkldnn_fusion
        # permutes mm's [in, out] weight before this reorder too)
        return {owner: reorder(weight.t().contiguous(), PACKED_ROWS_HINT)
                for owner, (weight, _) in copies.items()}
    except (AttributeError, RuntimeError, NotImplementedError):  # no oneDNN linear here
        return {}


def _packed_product(hidden: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    """``hidden [n, in]`` times a weight packed by :func:`_packed_copies` (``+ bias``)."""
    return torch.ops.mkldnn._linear_pointwise(hidden.contiguous(), packed, bias, "none", [], "")


def _fused_product(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``hidden [n, in] @ weight [in, out] (+ bias)``."""
    return torch.mm(hidden, weight) if bias is None else torch.addmm(bias, hidden, weight)


DECODERS: Registry[Callable[[nn.Module], StaticDecoder]] = Registry("static decode path")
DECODERS.add("model_forward", ModelForwardDecoder, aliases=("forward",))
DECODERS.add("llama_modules", LlamaModulesDecoder, aliases=("modules",))


def resolve_decoder(lm: nn.Module, decode_path: str = "auto") -> StaticDecoder:
    """The decoder named ``decode_path``; ``"auto"``: ``"llama_modules"`` where it applies,
    else ``"model_forward"``. Checks :func:`check_static_cache_support` first."""
    check_static_cache_support(lm)
    if decode_path == "auto":
        decode_path = "llama_modules" if llama_family_mismatch(lm) is None else "model_forward"
    return DECODERS.get(decode_path)(lm)


def model_dtype(lm: nn.Module) -> torch.dtype:
    """The dtype of the hidden states (the input embedding's), which the mask must match."""
    return lm.get_input_embeddings().weight.dtype
