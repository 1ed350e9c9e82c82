"""Argument types shared by the subcommands (`argparse` `type=` callables). Imports only argparse:
`fairway --help` builds every parser."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (vLLM's own rules between limits are vLLM's to check)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value
