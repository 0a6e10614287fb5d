"""Local stand-ins for the hub models and datasets TRL's GRPO tests load by name.

TRL's tests name tiny checkpoints of the ``trl-internal-testing`` organisation
(``tiny-Qwen2ForCausalLM-2.5``, ...) and its ``zen`` dataset. Without a model hub we build
look-alikes and put them where ``from_pretrained("trl-internal-testing/...")`` finds them
offline: a Hugging Face hub cache (``models--org--name/refs/main`` + ``snapshots/<rev>/``).

* Models: the same architectures, randomly initialised at a tiny width (hidden size 8, two
  layers), float32, in two vocabularies. *compact* (the default): the bytes and the special
  tokens only (about 260 ids), so a training step costs milliseconds. *full*: Qwen2.5's
  vocabulary size and special-token ids (``<|endoftext|>`` 151643 pad, ``<|im_start|>``
  151644, ``<|im_end|>`` 151645 EOS) and Llama 3.2's (``<|finetune_right_pad_id|>`` 128004),
  for the tests that name those ids or need the EOS token to be as rare as in a real
  vocabulary (``test_train_with_mask_truncated_completions*``).
* Tokenizers: byte-level BPE without merges (every string encodes, one token per byte), the
  Qwen2 pre-tokeniser (transformers 5 rebuilds Qwen2-family tokenizers from the vocabulary,
  so they must have that shape), unused filler tokens up to the special ids, ChatML chat
  template (Qwen3's honours ``enable_thinking``; Qwen's renders tools, tool calls and tool
  replies as Qwen2.5's does). The full Qwen vocabulary also holds, at their real ids,
  ``<tool_call>`` / ``</tool_call>`` and the Qwen2.5 tokens TRL's tool tests write completions
  with (:data:`QWEN_TOOL_TEST_TOKENS`), so those completions decode to the text their comments
  give; encoding still produces one token per byte.
* ``zen``: lines of the Zen of Python (``import this``) cut in the middle, as prompts
  (``standard_prompt_only``) or user turns (``conversational_prompt_only``); a reduced set
  (TRL's has 17 training prompts, this one 6, so that the port runs in about a minute: three
  epochs are 18 steps).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mtgrpo.rollout.agent.templates import HERMES_CHATML_TEMPLATE

ORG = "trl-internal-testing"
_REVISION = "0" * 40

QWEN_SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
QWEN_TOOL_TAGS = {"<tool_call>": 151657, "</tool_call>": 151658}  # added, not special
# Qwen2.5 tokens of the completions TRL's tool and environment tests write as token ids
QWEN_TOOL_TEST_TOKENS = {
    4913: '{"', 606: "name", 788: '":', 330: ' "', 64648: "multiply", 22785: "_tool",
    497: '",', 16370: "arguments", 5212: ' {"', 11248: "}}\n", 1513: " don", 944: "'t",
    1414: " know", 894: " any", 5392: " tool", 7692: "async", 93054: "_multiply",
    17453: "Done", 35744: "increment", 9520: "step", 2765: " won", 927: "sh", 411: "out",
    1318: "text", 6023: "hi", 95642: '"}}\n', 450: "dec", 13477: "rement",
    16252: " increment", 14172: "tool", 6659: "call", 397: ">\n", 522: "</", 314: " {",
    293: " b",
}
LLAMA_SPECIALS = {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001,
                  "<|finetune_right_pad_id|>": 128004, "<|eot_id|>": 128009}
VOCAB_SIZES = {"qwen": 151936, "llama": 128256}


def _compact(specials: dict[str, int]) -> dict[str, int]:
    """The same special tokens right after the 256 bytes."""
    return {token: 256 + i for i, token in enumerate(sorted(specials, key=specials.get))}

_GENERATION_PROMPT = "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
_CHATML = HERMES_CHATML_TEMPLATE.replace(_GENERATION_PROMPT, (
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"))
assert _CHATML != HERMES_CHATML_TEMPLATE
_LLAMA_TEMPLATE = (
    "{{- '<|begin_of_text|>' }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level(text: str) -> str:
    """``text`` in the byte-level alphabet (GPT-2's byte-to-unicode map)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]
    table = {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(rest)}}
    return "".join(table[b] for b in text.encode("utf-8"))


def _tokenizer(specials: dict[str, int], eos: str, pad: str, template: str,
               pinned: dict[int, str] | None = None, added: dict[str, int] | None = None) -> Any:
    """Byte-level tokenizer whose special tokens sit at ``specials``' ids (fillers before);
    ``pinned``: vocabulary entries at given ids (text), ``added``: non-special added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: index for index, symbol in enumerate(alphabet)}
    first_special = min(specials.values())
    at = {index: _byte_level(text) for index, text in (pinned or {}).items()}
    reserved = set(at.values())
    # unused fillers (two or three alphabet symbols) up to the specials
    fillers = (a + b + tail for a in alphabet for b in alphabet for tail in ("", *alphabet))
    while len(vocab) < first_special:
        if len(vocab) in at:
            vocab[at[len(vocab)]] = len(vocab)
            continue
        filler = next(fillers)
        if filler not in vocab and filler not in reserved:
            vocab[filler] = len(vocab)
    backend = Tokenizer(BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    tokens = [(t, i, True) for t, i in specials.items()] + \
        [(t, i, False) for t, i in (added or {}).items()]
    for token, index, special in sorted(tokens, key=lambda kv: kv[1]):
        while backend.get_vocab_size() < index:  # reserved ids between specials
            backend.add_special_tokens([AddedToken(f"<|reserved_{backend.get_vocab_size()}|>",
                                                   special=True)])
        if special:
            backend.add_special_tokens([AddedToken(token, special=True, normalized=False)])
        else:
            backend.add_tokens([AddedToken(token, special=False, normalized=False)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=eos, pad_token=pad, padding_side="left",
        clean_up_tokenization_spaces=False, model_max_length=32768)
    tokenizer.chat_template = template
    return tokenizer


def _specials(family: str, full: bool) -> dict[str, int]:
    specials = QWEN_SPECIALS if family == "qwen" else LLAMA_SPECIALS
    return specials if full else _compact(specials)


def family_tokenizer(family: str, full: bool) -> Any:
    """The Qwen (ChatML) or Llama 3 tokenizer stand-in, full or compact ids."""
    if family == "qwen":
        if full:
            return _tokenizer(QWEN_SPECIALS, "<|im_end|>", "<|endoftext|>", _CHATML,
                              pinned=QWEN_TOOL_TEST_TOKENS, added=QWEN_TOOL_TAGS)
        return _tokenizer(_specials("qwen", full), "<|im_end|>", "<|endoftext|>", _CHATML)
    return _tokenizer(_specials("llama", full), "<|eot_id|>", "<|eot_id|>", _LLAMA_TEMPLATE)


_SMALL = {"hidden_size": 8, "intermediate_size": 32, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2}


def _ids(family: str, full: bool) -> dict[str, Any]:
    specials = _specials(family, full)
    size = VOCAB_SIZES[family] if full else 272  # 256 bytes + specials, padded to 16
    if family == "qwen":
        return {"vocab_size": size, "pad_token_id": specials["<|endoftext|>"],
                "eos_token_id": specials["<|im_end|>"], "bos_token_id": None}
    return {"vocab_size": size, "pad_token_id": specials["<|finetune_right_pad_id|>"],
            "bos_token_id": specials["<|begin_of_text|>"], "eos_token_id": specials["<|eot_id|>"]}


def _configs(full: bool) -> dict[str, tuple[Callable[[], Any], str, str]]:
    """name -> (config factory, Auto class name, tokenizer family)."""
    import transformers as tf

    qwen, llama = _ids("qwen", full), _ids("llama", full)
    return {
        "tiny-Qwen2ForCausalLM-2.5": (
            lambda: tf.Qwen2Config(**_SMALL, **qwen, tie_word_embeddings=True,
                                   use_sliding_window=False),
            "AutoModelForCausalLM", "qwen"),
        "tiny-Qwen2ForSequenceClassification-2.5": (
            lambda: tf.Qwen2Config(**_SMALL, **qwen, num_labels=1, use_sliding_window=False),
            "AutoModelForSequenceClassification", "qwen"),
        "tiny-Qwen3ForCausalLM": (
            lambda: tf.Qwen3Config(**_SMALL, **qwen, head_dim=4, tie_word_embeddings=False),
            "AutoModelForCausalLM", "qwen"),
        "tiny-Qwen3ForSequenceClassification": (
            lambda: tf.Qwen3Config(**_SMALL, **qwen, head_dim=4, num_labels=1),
            "AutoModelForSequenceClassification", "qwen"),
        "tiny-Qwen3MoeForCausalLM": (
            lambda: tf.Qwen3MoeConfig(**_SMALL, **qwen, head_dim=4, num_experts=4,
                                      num_experts_per_tok=2, moe_intermediate_size=8),
            "AutoModelForCausalLM", "qwen"),
        "tiny-LlamaForSequenceClassification-3.2": (
            lambda: tf.LlamaConfig(**_SMALL, **llama, num_labels=1),
            "AutoModelForSequenceClassification", "llama"),
        "tiny-Gemma2ForCausalLM": (
            lambda: tf.Gemma2Config(**_SMALL, **qwen, head_dim=4, tie_word_embeddings=True),
            "AutoModelForCausalLM", "qwen"),
        "tiny-Cohere2ForCausalLM": (
            lambda: tf.Cohere2Config(**_SMALL, **qwen), "AutoModelForCausalLM", "qwen"),
        "tiny-Glm4MoeForCausalLM": (
            lambda: tf.Glm4MoeConfig(**_SMALL, **qwen, n_routed_experts=4, num_experts_per_tok=2,
                                     moe_intermediate_size=8, n_group=1, topk_group=1,
                                     first_k_dense_replace=1),
            "AutoModelForCausalLM", "qwen"),
        "tiny-GptOssForCausalLM": (
            lambda: tf.GptOssConfig(**_SMALL, **qwen, head_dim=4, num_local_experts=4,
                                    num_experts_per_tok=2, sliding_window=16),
            "AutoModelForCausalLM", "qwen"),
        "tiny-NemotronHForCausalLM-nano": (
            lambda: tf.NemotronHConfig(
                **qwen, hidden_size=8, intermediate_size=16, num_attention_heads=2,
                num_key_value_heads=1, head_dim=4, layers_block_type=["mamba", "attention",
                                                                      "mlp"],
                mamba_num_heads=2, mamba_head_dim=8, ssm_state_size=8, n_groups=1,
                chunk_size=8, tie_word_embeddings=False),
            "AutoModelForCausalLM", "qwen"),
    }


def standin_names() -> list[str]:
    """The model stand-ins :func:`build_model` knows."""
    return list(_configs(full=False))


def _repository(cache: Path, name: str) -> Path:
    repo = cache / f"models--{ORG}--{name}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(_REVISION)
    return repo / "snapshots" / _REVISION


def build_model(cache: Path, name: str, tokenizers: dict[str, Any], full: bool = False) -> Path:
    """Build ``trl-internal-testing/<name>`` into the hub cache ``cache`` (``full``: the real
    vocabulary sizes and special ids); returns its snapshot directory."""
    import transformers

    make_config, auto, family = _configs(full)[name]
    snapshot = _repository(cache, name)
    if (snapshot / "config.json").is_file():
        return snapshot
    config = make_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = getattr(transformers, auto).from_config(config, dtype=torch.float32)
    model.save_pretrained(snapshot)
    if (family, full) not in tokenizers:
        tokenizers[family, full] = family_tokenizer(family, full)
    tokenizers[family, full].save_pretrained(snapshot)
    return snapshot


_REMOTE_CONFIG = '''from transformers import Qwen2Config


class RemoteConfig(Qwen2Config):
    model_type = "remote"
'''
_REMOTE_MODEL = '''from transformers import Qwen2ForCausalLM

from .configuration_remote import RemoteConfig


class RemoteForCausalLM(Qwen2ForCausalLM):
    config_class = RemoteConfig
'''


def build_remote_model(cache: Path, tokenizers: dict[str, Any], full: bool = False) -> Path:
    """``tiny-RemoteForCausalLM``: a Qwen2 subclass shipped as code in the repository, so
    loading it needs ``trust_remote_code``."""
    snapshot = build_model(cache, "tiny-Qwen2ForCausalLM-2.5", tokenizers, full)
    remote = _repository(cache, "tiny-RemoteForCausalLM")
    if (remote / "config.json").is_file():
        return remote
    remote.mkdir(parents=True, exist_ok=True)
    for path in snapshot.iterdir():
        if path.name != "config.json":
            (remote / path.name).write_bytes(path.read_bytes())
    config = json.loads((snapshot / "config.json").read_text())
    config.update(model_type="remote", architectures=["RemoteForCausalLM"], auto_map={
        "AutoConfig": "configuration_remote.RemoteConfig",
        "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM"})
    (remote / "config.json").write_text(json.dumps(config))
    (remote / "configuration_remote.py").write_text(_REMOTE_CONFIG)
    (remote / "modeling_remote.py").write_text(_REMOTE_MODEL)
    return remote


def zen_lines() -> list[str]:
    """The Zen of Python, one aphorism a line: the ROT13 text in the standard library's
    ``this`` module, read without importing it (importing prints it)."""
    import ast
    import importlib.util

    origin = importlib.util.find_spec("this").origin
    tree = ast.parse(Path(origin).read_text(encoding="utf-8"))
    encoded = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                   and getattr(node.targets[0], "id", None) == "s")
    text = codecs.decode(encoded, "rot13")
    return [line for line in text.splitlines()[2:] if line.strip()]


_TRAIN_LINES, _TEST_LINES = 6, 2


def zen_split(config_name: str, split: str) -> list[dict[str, Any]]:
    """Rows of the ``zen`` stand-in: ``standard_prompt_only`` or ``conversational_prompt_only``,
    split ``train`` (6 rows) or ``test`` (2)."""
    lines = zen_lines()
    chosen = lines[:_TRAIN_LINES] if split == "train" else \
        lines[_TRAIN_LINES:_TRAIN_LINES + _TEST_LINES]
    prompts = [" ".join(line.split()[: max(1, len(line.split()) - 1)]) for line in chosen]
    if config_name == "standard_prompt_only":
        return [{"prompt": p} for p in prompts]
    if config_name == "conversational_prompt_only":
        return [{"prompt": [{"role": "user", "content": f"Complete: {p}"}]} for p in prompts]
    raise ValueError(f"the zen stand-in has no configuration {config_name!r}")
