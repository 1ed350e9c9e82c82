"""`fairway tiny-model DIR`: write the tiny random-weight Llama of the tests and demos.

The writer is `fairway.tiny_model`; this shell refuses to overwrite a directory that already holds
files (a server may be loading that model) unless `--force` is given.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fairway.errors import FairwayConfigError


def register(subparsers: Any) -> None:
    """Add the `tiny-model` subcommand to the `fairway` parser."""
    tiny = subparsers.add_parser(
        "tiny-model",
        help="write a tiny random-weight Llama with a byte-level tokenizer (for tests)",
        description="Write a random-weight LlamaForCausalLM (safetensors) and a byte-level BPE "
        "tokenizer built locally, servable by `vllm serve DIR` / `fairway serve DIR` on CPU. "
        "No download. The same arguments write the same files.",
    )
    tiny.add_argument("path", metavar="DIR", help="output directory (new or empty)")
    tiny.add_argument("--vocab-size", type=int, default=512, help="vocabulary (260 to 4484)")
    tiny.add_argument("--hidden", type=int, default=256, help="hidden size (multiple of 64)")
    tiny.add_argument("--layers", type=int, default=2, help="decoder layers")
    tiny.add_argument("--max-len", type=int, default=4096, help="max_position_embeddings")
    tiny.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    tiny.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("bfloat16", "float16", "float32"),
        help="weight dtype",
    )
    tiny.add_argument(
        "--force",
        action="store_true",
        help="overwrite the model files in a directory that is not empty",
    )
    tiny.set_defaults(handler=_tiny_model)


def _tiny_model(args: argparse.Namespace) -> int:
    from fairway.tiny_model import make_tiny_model

    target = Path(args.path)
    if target.exists() and not args.force and (not target.is_dir() or any(target.iterdir())):
        raise FairwayConfigError(
            f"tiny-model: {target} already exists and is not an empty directory (a server may be "
            "loading the model in it); choose a new directory, or pass --force to overwrite"
        )
    try:
        path = make_tiny_model(
            args.path,
            vocab_size=args.vocab_size,
            hidden=args.hidden,
            layers=args.layers,
            max_len=args.max_len,
            seed=args.seed,
            dtype=args.dtype,
        )
    except ValueError as exc:
        raise FairwayConfigError(f"tiny-model: {exc}") from None
    print(
        f"wrote {path} (vocab {args.vocab_size}, hidden {args.hidden}, {args.layers} layers, "
        f"max length {args.max_len}, seed {args.seed}); serve it with `fairway serve {path}`"
    )
    return 0
