"""``mtgrpo tiny-model OUT_DIR``: build the tiny local model (no hub, no download).

The directory it writes is a regular ``save_pretrained`` checkpoint: pass it wherever a hub
model name is accepted (``model: OUT_DIR`` in a config, ``load_model(OUT_DIR)``).
"""

from __future__ import annotations

import argparse
import sys

from mtgrpo.models.tiny import TINY_ARCHITECTURES, TinyModelShape

_DEFAULT_SHAPE = TinyModelShape()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", metavar="OUT_DIR", help="directory to write the model into")
    parser.add_argument(
        "--arch", choices=TINY_ARCHITECTURES.names(), default="llama",
        help="transformers architecture of the model (default: %(default)s)",
    )
    sizes = (
        ("--hidden-size", "hidden_size", "width of the residual stream"),
        ("--num-layers", "num_layers", "number of decoder layers"),
        ("--num-heads", "num_heads", "attention heads"),
        ("--num-kv-heads", "num_kv_heads", "key/value heads (grouped-query attention)"),
        ("--intermediate-size", "intermediate_size", "width of the MLP"),
        ("--max-position-embeddings", "max_position_embeddings", "longest sequence in tokens"),
    )
    for flag, field, help_text in sizes:
        parser.add_argument(
            flag, type=int, default=getattr(_DEFAULT_SHAPE, field),
            help=f"{help_text} (default: %(default)s)",
        )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the weight initialisation (default: 0)"
    )
    parser.add_argument(
        "--corpus", metavar="FILE",
        help="learn a BPE vocabulary from this text file (one text per line; llama only)",
    )
    parser.add_argument("--vocab-size", type=int, help="size of the learned vocabulary")
    parser.add_argument(
        "--chat-template", choices=("chatml", "tools"), default="chatml",
        help="chatml, or tools: ChatML that also renders tools, tool calls and tool replies "
             "(Hermes <tool_call> blocks; tools listed by name) (default: %(default)s)",
    )
    parser.add_argument(
        "--gguf", action="store_true",
        help="also write OUT_DIR/model.gguf (float32, llama.cpp format; needs the gguf package)",
    )


def run(args: argparse.Namespace) -> int:
    """Build the model; exit status 2 (with the rule broken on stderr) for invalid sizes."""
    from mtgrpo.models.loading import _require_gguf
    from mtgrpo.models.tiny import build_tiny_model, write_tiny_gguf

    try:
        if args.gguf:
            _require_gguf()  # before building anything
        corpus = None
        if args.corpus is not None:
            from pathlib import Path

            corpus = Path(args.corpus).read_text(encoding="utf-8").splitlines()
        out = build_tiny_model(
            args.out_dir,
            arch=args.arch,
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            num_heads=args.num_heads,
            num_kv_heads=args.num_kv_heads,
            intermediate_size=args.intermediate_size,
            max_position_embeddings=args.max_position_embeddings,
            seed=args.seed,
            corpus=corpus,
            vocab_size=args.vocab_size,
            chat_template=args.chat_template,
        )
    except (ValueError, OSError, ImportError) as err:
        print(f"mtgrpo tiny-model: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote tiny {args.arch} model to {out}")
    if args.gguf:
        print(f"wrote GGUF file {write_tiny_gguf(out)}")
    return 0
