"""`fairway inspect URL`: a thin shell over `fairway.inspection` (argparse registration only)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

_HELP = (
    "Read a running server's /metrics over a window and report what an operator needs: requests "
    "and prefix-hit rate, the queue's work spread and whether ordering matters here, the lane "
    "split, TTFT and queue time by cache hit vs miss, the oldest waiting request, fallbacks and "
    "the pre-pass cost. Works against plain `vllm serve` too (from vLLM's own series)."
)


def register(subparsers: Any) -> None:
    """Add the `inspect` subcommand to the `fairway` parser."""
    parser = subparsers.add_parser("inspect", help="is Fairway worth it here, and is it helping?",
                                   description=_HELP)
    parser.add_argument("url", metavar="URL",
                        help="server base URL, e.g. http://127.0.0.1:8000 (or its /metrics)")
    parser.add_argument("--window-s", type=float, default=60.0,
                        help="seconds to watch (default 60); run it while traffic flows")
    parser.add_argument("--interval-s", type=float, default=2.0,
                        help="seconds between polls of the gauges (default 2)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(handler=_inspect)


def _inspect(args: argparse.Namespace) -> int:
    from fairway import inspection

    report = inspection.inspect(args.url, args.window_s, interval_s=args.interval_s,
                                progress=not args.no_progress and sys.stderr.isatty())
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    else:
        print(inspection.render(report))
    return 0
