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
    "the pre-pass cost. Works against plain `vllm serve` too (from vLLM's own series). With "
    "tenants configured (option tenants) it adds one line per tenant (default, the listed "
    "names, other for unlisted ones): `Tenant NAME prefill N tokens (S%)`, the prompt tokens "
    "scheduled for its requests in the window and their share of all tenants'; `waiting W now, "
    "up to M`, its requests in vLLM's waiting queue at the last scrape and the most at a poll; "
    "`TTFT median X, p99 Y (n=K)`, scheduler-side time to first token estimated from the "
    "histogram's buckets. With --decision-trace, a `Counters` line: fairway's tenant counters "
    "(uncached tokens served over weight, above the lowest) from the trace's last record "
    "carrying them."
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
    parser.add_argument("--decision-trace", metavar="PATH",
                        help="the server's decision trace (option decision_trace, a file on "
                        "this machine): also show fairway's tenant counters from its last "
                        "record that carries them")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(handler=_inspect)


def _inspect(args: argparse.Namespace) -> int:
    from fairway import inspection
    from fairway.inspection_text import render

    report = inspection.inspect(args.url, args.window_s, interval_s=args.interval_s,
                                progress=not args.no_progress and sys.stderr.isatty(),
                                decision_trace=args.decision_trace)
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    else:
        print(render(report))
    return 0
