"""The `fairway` command. Each subcommand is a thin shell over a library function.

Each module in `COMMAND_MODULES` (one per verb group: bench/replay, profile, serve, tiny-model,
trace/data, inspect) has a `register(subparsers)` function and delegates to the library; handlers
import heavy modules (vLLM, matplotlib) lazily so that `fairway --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from fairway import __version__
from fairway.errors import FairwayError

#: Modules that contribute subcommands, in `--help` order.
COMMAND_MODULES = (
    "fairway.cli.replay",        # bench, replay
    "fairway.cli.profile",       # profile
    "fairway.cli.serve",         # serve
    "fairway.cli.tiny_model",    # tiny-model
    "fairway.cli.trace",         # trace, data
    "fairway.cli.inspect",       # inspect
)


class HelpFormatter(argparse.HelpFormatter):
    """Takes a callable epilog: built only when help is shown, printed with its line breaks.

    The option lists in `fairway serve --help` and `fairway bench --help` are generated from the
    options' docstrings, which needs the policy registry: too slow to build for every command.
    """

    def add_text(self, text: Any) -> None:
        if callable(text):
            block = text()
            self._add_item(lambda: f"{block}\n\n", [])
        else:
            super().add_text(text)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (every registered subcommand)."""
    parser = argparse.ArgumentParser(
        prog="fairway",
        description="Load-aware, prefix-cache-aware ordering of vLLM's waiting queue.",
    )
    parser.add_argument("--version", action="version", version=f"fairway {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `fairway` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except FairwayError as exc:
        print(f"fairway: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fairway: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `fairway trace stats F | head`: the reader went away
        sys.stderr.close()
        return 0
