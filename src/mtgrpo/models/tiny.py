"""The tiny local model: a real transformers causal LM plus a byte-level tokenizer, built offline.

Everything in the project that needs a model (the trainer's end-to-end tests, the built-in
benchmark on a laptop, the generation backends) runs on this model, so it must go through the
same code paths as a hub checkpoint: ``build_tiny_model`` writes the standard ``save_pretrained``
layout (``config.json``, ``model.safetensors``, ``generation_config.json``, ``tokenizer.json``,
``tokenizer_config.json`` holding the ChatML chat template), and any function that takes a hub
name takes this directory.

The tokenizer is a byte-level BPE with no merges: each of the 256 bytes is one token, so every
string (ASCII or not) encodes without an unknown token, plus three special tokens
(``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``), 259 in all. Its normaliser (NFC) and
pre-tokeniser (the Qwen2 split regex followed by byte-level mapping) are exactly the ones
transformers' ``Qwen2Tokenizer`` rebuilds on load. That is deliberate: transformers 5 ignores the
saved ``tokenizer_class`` for a ``qwen2`` config and re-derives the tokenizer from the vocabulary,
so a tokenizer of any other shape would encode differently once reloaded. Special tokens follow
Qwen2.5-Instruct: EOS is ``<|im_end|>`` (a chat turn ends there), padding is ``<|endoftext|>``,
and ``generation_config.eos_token_id`` holds both.

``write_tiny_gguf`` writes the same weights and tokenizer as a float32 GGUF file (llama.cpp's
format), so the GGUF loading path is exercised without any download.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtgrpo.algo.registry import Registry
from mtgrpo.models.chat_templates import TOOLS_CHATML_TEMPLATE

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerFast

__all__ = [
    "CHATML_TEMPLATE",
    "CHAT_TEMPLATES",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "TINY_ARCHITECTURES",
    "TOOLS_CHATML_TEMPLATE",
    "TinyModelShape",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "ensure_tiny_model",
    "write_tiny_gguf",
]

# Qwen2.5-Instruct's special tokens, so chat code paths match a real checkpoint
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, IM_START, EOS_TOKEN)

# The pre-tokeniser split of Qwen2 (and of transformers' Qwen2Tokenizer), see the module docstring.
_QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


CHAT_TEMPLATES: dict[str, str] = {"chatml": CHATML_TEMPLATE, "tools": TOOLS_CHATML_TEMPLATE}
"""The tiny tokenizer's chat templates by name (``build_tiny_model(chat_template=...)``)."""


@dataclass(frozen=True)
class TinyModelShape:
    """The size of the tiny model; ``build_tiny_model``'s keyword arguments, validated."""

    # defaults: about 0.1 M parameters (build_tiny_model), quick on a CPU
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 512

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"tiny model {name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_heads "
                f"({self.num_heads}); pick e.g. hidden_size={self.num_heads * 16}"
            )
        # rotary embeddings rotate pairs of dimensions
        if (self.hidden_size // self.num_heads) % 2:
            head_size = self.hidden_size // self.num_heads
            raise ValueError(
                f"the head size hidden_size / num_heads = {head_size} must "
                "be even for rotary position embeddings; change hidden_size or num_heads"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention"
            )


ConfigFactory = Callable[[TinyModelShape, int, dict[str, Any]], "PretrainedConfig"]
TINY_ARCHITECTURES: Registry[ConfigFactory] = Registry("tiny model architecture")


def _common_config_fields(
    shape: TinyModelShape, vocab_size: int, token_ids: dict[str, Any]
) -> dict[str, Any]:
    return {
        "vocab_size": vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": 1e-6,  # Qwen2.5's value
        "tie_word_embeddings": False,
        **token_ids,
    }


@TINY_ARCHITECTURES.register("llama")
def _llama_config(
    shape: TinyModelShape, vocab_size: int, token_ids: dict[str, Any]
) -> PretrainedConfig:
    from transformers import LlamaConfig

    return LlamaConfig(**_common_config_fields(shape, vocab_size, token_ids))


@TINY_ARCHITECTURES.register("qwen2")
def _qwen2_config(
    shape: TinyModelShape, vocab_size: int, token_ids: dict[str, Any]
) -> PretrainedConfig:
    from transformers import Qwen2Config

    # Qwen2 carries biases on the q/k/v projections; the class sets that itself.
    return Qwen2Config(
        # full attention, as Qwen2.5's own configs set it
        use_sliding_window=False, **_common_config_fields(shape, vocab_size, token_ids)
    )


def build_tiny_tokenizer(
    *,
    model_max_length: int = 512,
    corpus: Iterable[str] | None = None,
    vocab_size: int | None = None,
    chat_template: str = "chatml",
) -> PreTrainedTokenizerFast:
    """The tokenizer of the tiny model, with a ChatML chat template: ``chat_template`` names
    one of :data:`CHAT_TEMPLATES` (``"tools"`` also renders tools, tool calls and replies).

    Without ``corpus``: byte level (259 tokens). Ids 0..255 are the bytes in the order of
    GPT-2's byte-to-unicode alphabet sorted by code point; 256, 257, 258 are
    ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``.

    With ``corpus`` (texts) and ``vocab_size``: byte-level BPE merges learned from the texts
    (every byte stays representable), so frequent words and tags become single tokens and
    sequences get several times shorter; the special tokens follow the learned vocabulary.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer
    from transformers import PreTrainedTokenizerFast

    if chat_template not in CHAT_TEMPLATES:
        raise ValueError(f"chat_template={chat_template!r} is not a tiny model template; choose "
                         f"one of {', '.join(CHAT_TEMPLATES)}")
    if (corpus is None) != (vocab_size is None):
        raise ValueError("give both corpus and vocab_size (a learned vocabulary) or neither")
    if vocab_size is not None and not 256 < vocab_size <= 65_536:
        raise ValueError(f"vocab_size={vocab_size} must be in (256, 65536]: the bytes come first")

    # sorted by code point, so the byte ids are the same in every build
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: index for index, symbol in enumerate(alphabet)}
    backend = Tokenizer(
        # every byte is in the vocabulary: no unknown token is ever needed
        BPE(vocab=vocab, merges=[], continuing_subword_prefix="", end_of_word_suffix="",
            fuse_unk=False, byte_fallback=False)
    )
    # what Qwen2Tokenizer rebuilds on load (module docstring)
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        # the Qwen2 split above replaces ByteLevel's own GPT-2 regex
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    if corpus is not None:
        # initial_alphabet keeps every byte representable after merging
        trainer = BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet,
                             min_frequency=2, show_progress=False)
        backend.train_from_iterator(corpus, trainer=trainer)
    backend.add_special_tokens(
        # matched on the raw text, before NFC
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=model_max_length,
        padding_side="left",  # TRL 1.16 pads prompts on the left for generation
        # decode(encode(text)) == text: rewards read the exact completion
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATES[chat_template]
    return tokenizer


def build_tiny_model(
    out_dir: str | Path,
    *,
    arch: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
    vocab_size: int | None = None,
    chat_template: str = "chatml",
) -> Path:
    """Build, randomly initialise and save a tiny causal LM and its tokenizer to ``out_dir``.

    The weights are the architecture's own initialisation under ``torch.manual_seed(seed)`` (the
    caller's RNG state is restored afterwards), so the same arguments give byte-identical files.
    With the defaults the model has about 0.1 M parameters. ``corpus`` and ``vocab_size`` give
    it a BPE vocabulary learned from those texts (Llama only; see
    :func:`build_tiny_tokenizer`); ``chat_template`` names its chat template (``"tools"`` for
    tool calling). Returns ``out_dir`` as a ``Path``.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    shape = TinyModelShape(hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size,
                           max_position_embeddings)
    config_factory = TINY_ARCHITECTURES.get(arch)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir {str(out)!r} exists and is not a directory; pick another path")

    if corpus is not None and arch != "llama":
        raise ValueError(
            f"a learned vocabulary needs arch='llama' (transformers rebuilds {arch!r} "
            "tokenizers from their own class on load); drop corpus/vocab_size or use llama"
        )
    tokenizer = build_tiny_tokenizer(model_max_length=max_position_embeddings, corpus=corpus,
                                     vocab_size=vocab_size, chat_template=chat_template)
    pad_id, eos_id = tokenizer.convert_tokens_to_ids([PAD_TOKEN, EOS_TOKEN])
    # A chat turn ends at <|im_end|>; <|endoftext|> ends a plain document. Stop at either.
    token_ids = {"bos_token_id": None, "eos_token_id": [eos_id, pad_id], "pad_token_id": pad_id}
    config = config_factory(shape, len(tokenizer), token_ids)
    # the caller's RNG is untouched; devices=[]: CPU state only
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # generate() stops at either token, as Qwen2.5-Instruct's generation_config lists both
    model.generation_config = GenerationConfig(**token_ids)

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    # The chat template goes into tokenizer_config.json (not chat_template.jinja) so that
    # transformers 4.x readers and GGUF export find it where they look first.
    tokenizer.save_pretrained(out, save_jinja_files=False)
    return out


def ensure_tiny_model(out_dir: str | Path, **options: Any) -> Path:
    """``out_dir`` if it already holds a built model, else :func:`build_tiny_model` into it.

    Lets a config say "the tiny model at this path" and build it only on first use. An existing
    checkpoint is reused as it is; ``options`` (``build_tiny_model``'s keywords) apply only when
    building.
    """
    out = Path(out_dir)
    # both files: a build interrupted before the weights were written is rebuilt
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    return build_tiny_model(out, **options)


def _gguf_tokenizer_fields(tokenizer: PreTrainedTokenizerFast) -> dict[str, Any]:
    import gguf

    # GGUF's token list is indexed by id
    tokens = [token for token, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    special = set(tokenizer.all_special_ids) | set(
        tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))
    )
    token_types = [
        gguf.TokenType.CONTROL if index in special else gguf.TokenType.NORMAL
        for index in range(len(tokens))
    ]
    return {"tokens": tokens, "token_types": token_types}


def write_tiny_gguf(model_dir: str | Path, out_file: str | Path | None = None) -> Path:
    """Write a model built by :func:`build_tiny_model` as a float32 GGUF file; return its path.

    Follows llama.cpp's ``convert_hf_to_gguf.py`` for these two architectures: tensor names from
    ``gguf.get_tensor_name_map``, a byte-level ("gpt2") vocabulary with the "qwen2" split, and, for
    Llama only, the q/k projection rows permuted into llama.cpp's rotary layout (transformers
    undoes that permutation on load). Weights are stored unquantised, so loading the file back
    gives the same logits up to float rounding. Default ``out_file``: ``model_dir/model.gguf``.
    """
    import gguf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = model.config
    arch_names = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2}
    if config.model_type not in arch_names:
        raise ValueError(
            f"write_tiny_gguf supports the tiny model architectures {sorted(arch_names)}, "
            f"got model_type {config.model_type!r} from {str(model_dir)!r}"
        )
    arch = arch_names[config.model_type]
    out_path = Path(out_file) if out_file is not None else model_dir / "model.gguf"

    writer = gguf.GGUFWriter(out_path, gguf.MODEL_ARCH_NAMES[arch])
    _write_gguf_metadata(writer, config, tokenizer)
    for name, tensor in _gguf_tensors(model, arch):
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()  # gguf's writer refuses any other order
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def _write_gguf_metadata(writer: Any, config: Any, tokenizer: PreTrainedTokenizerFast) -> None:
    import gguf

    head_dim = config.hidden_size // config.num_attention_heads
    # transformers 5 keeps rope_theta in rope_parameters; 10000 is Llama's default
    rope_theta = (config.rope_parameters or {}).get("rope_theta", 10000.0)
    writer.add_name("mtgrpo-tiny")
    # unquantised: the file loads back to the same logits
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(head_dim)  # rotary over the whole head
    writer.add_rope_freq_base(float(rope_theta))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)

    fields = _gguf_tokenizer_fields(tokenizer)
    writer.add_tokenizer_model("gpt2")  # llama.cpp's name for a byte-level BPE vocabulary
    # the pre-tokeniser split this tokenizer uses (_QWEN2_SPLIT_REGEX)
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(fields["tokens"])
    writer.add_token_types(fields["token_types"])
    # No merges: an empty merge list is dropped by GGUF readers, and transformers then derives
    # merges from the scores, which yields none for a byte-only vocabulary.
    writer.add_token_scores([0.0] * len(fields["tokens"]))
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)  # the tiny model has no BOS token (bos_token_id None)
    writer.add_chat_template(tokenizer.chat_template)


def _permute_for_llama_cpp(weight: Any, num_heads: int) -> Any:
    """llama.cpp's rotary layout: within each head, interleave the two halves of the rows."""
    rows, cols = weight.shape
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, cols)
        .swapaxes(1, 2)  # convert_hf_to_gguf.py's LlamaModel.permute
        .reshape(rows, cols)
    )


def _gguf_tensors(model: Any, arch: Any) -> list[tuple[str, Any]]:
    import gguf

    config = model.config
    name_map = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    tensors = []
    for hf_name, tensor in model.state_dict().items():
        base, suffix = hf_name.rsplit(".", 1)
        gguf_name = name_map.get_name(base)
        assert gguf_name is not None, f"no GGUF name for tensor {hf_name}"
        array = tensor.detach().to("cpu").float().numpy()  # float32, as ALL_F32 declares
        # Qwen2 GGUF files keep transformers' rotary layout; only Llama is permuted
        if arch == gguf.MODEL_ARCH.LLAMA and base.endswith("q_proj") and suffix == "weight":
            array = _permute_for_llama_cpp(array, config.num_attention_heads)
        elif arch == gguf.MODEL_ARCH.LLAMA and base.endswith("k_proj") and suffix == "weight":
            # k_proj has num_kv_heads heads under grouped-query attention
            array = _permute_for_llama_cpp(array, config.num_key_value_heads)
        tensors.append((f"{gguf_name}.{suffix}", array))
    return tensors
