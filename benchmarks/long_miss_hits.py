"""A long miss arriving into an overloaded queue of cache hits: the miss's TTFT against FCFS's and
the hits' median, per policy.

    python benchmarks/long_miss_hits.py [--miss-tokens 32000] [--load 1.3] [--out DIR] [--quick]
        [--policy NAME ...]

The trace (built here, seeded): one shared 6,144-token document, computed by a warm-up request at
t = 0; from t = 1 s, hits (the document + 256 unique tokens) arrive as a Poisson stream at `--load`
x the engine's capacity in uncached tokens (above 1: the queue of hits grows all along); at
t = 10 s one miss of `--miss-tokens` unique tokens arrives. The KV cache holds all content (the
document is never evicted). Goals: the miss's TTFT <= 1.5 x its FCFS TTFT, the hits'
median <= FCFS's. LPM's lower hit median comes from serving the miss last.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e3_flood import whole_content_blocks  # noqa: E402

from fairway.replay.bench import (  # noqa: E402
    experiment_parser,
    finish_experiment,
    new_out_dir,
    run_experiment,
    trace_info,
)
from fairway.replay.results import ReplayResult  # noqa: E402
from fairway.replay.summary import PERCENTILE_METHOD  # noqa: E402
from fairway.replay.sweep import ReplayJob  # noqa: E402
from fairway.traces.build import default_capacity_tps  # noqa: E402
from fairway.traces.format import Trace, TraceHeader, make_request  # noqa: E402

NAME = "long-miss"
POLICIES = ("fcfs", "lpm", "klpm-4", "hrrn", "fairway-step", "fairway")
DOC_TOKENS = 6_144
SUFFIX_TOKENS = 256


def build(miss_tokens: int, load: float, duration_s: float, seed: int = 11) -> Trace:
    """The warm-up, the Poisson stream of hits and the one miss (see the module docstring)."""
    rng = np.random.default_rng(seed)
    rate = load * default_capacity_tps() / SUFFIX_TOKENS
    doc = (f"lm-doc-{DOC_TOKENS}", DOC_TOKENS)
    requests = [make_request("warmup", 0.0, [doc, ("lm-warm", SUFFIX_TOKENS)], phase="warmup",
                             tags={"kind": "warmup"})]
    t, i = 1.0, 0
    while t < 1.0 + duration_s:
        requests.append(make_request(f"hit-{i:05d}", t, [doc, (f"lm-{seed}-s{i}", SUFFIX_TOKENS)],
                                     phase="hits", tags={"kind": "hit"}))
        i += 1
        t += float(rng.exponential(1.0 / rate))
    requests.append(make_request("miss", 10.0, [(f"lm-{seed}-miss", miss_tokens)], phase="hits",
                                 tags={"kind": "miss"}))
    requests.sort(key=lambda r: (r.arrival_s, r.request_id))
    header = TraceHeader(
        family="long-miss", seed=seed, shape=None,
        params={"miss_tokens": miss_tokens, "load": load, "duration_s": duration_s,
                "doc_tokens": DOC_TOKENS, "suffix_tokens": SUFFIX_TOKENS},
        num_requests=len(requests), capacity_tps=default_capacity_tps(),
        duration_s=1.0 + duration_s,
    )
    return Trace(header, requests)


def measure(result: ReplayResult) -> dict[str, Any]:
    """The miss's TTFT and the hits' median / p99 (the warm-up left out)."""
    miss = next(r for r in result.requests if r.tags.get("kind") == "miss")
    hits = [r.ttft_s for r in result.requests if r.tags.get("kind") == "hit"
            and r.ttft_s is not None]
    median, p99 = np.percentile(hits, [50, 99], method=PERCENTILE_METHOD)
    return {"miss_ttft_s": miss.ttft_s, "hit_median_s": float(median), "hit_p99_s": float(p99),
            "hits": len(hits), "errors": result.n_errors}


def table(rows: dict[str, dict[str, Any]]) -> str:
    fcfs = rows.get("fcfs")
    lines = ["| policy | miss TTFT (s) | x FCFS | hits' median (s) | x FCFS | hits' p99 (s) | "
             "goals met |", "|---|---|---|---|---|---|---|"]
    for policy, row in rows.items():
        miss_x = row["miss_ttft_s"] / fcfs["miss_ttft_s"] if fcfs else None
        hit_x = row["hit_median_s"] / fcfs["hit_median_s"] if fcfs else None
        row["miss_vs_fcfs"], row["hit_median_vs_fcfs"] = miss_x, hit_x
        met = "—" if miss_x is None else (
            "yes" if miss_x <= 1.5 and hit_x <= 1.0 + 1e-9 else "no")
        lines.append(f"| {policy} | {row['miss_ttft_s']:.2f} | {miss_x:.2f} | "
                     f"{row['hit_median_s']:.2f} | {hit_x:.2f} | {row['hit_p99_s']:.2f} | {met} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = experiment_parser(__doc__.split("\n\n")[0])
    p.add_argument("--miss-tokens", type=int, default=32_000)
    p.add_argument("--load", type=float, default=1.3, help="hits' load x capacity (default 1.3)")
    p.add_argument("--policy", action="append", default=None, metavar="NAME")
    args = p.parse_args(argv)
    started = time.perf_counter()
    out_dir = new_out_dir(args.out, NAME)
    trace = build(args.miss_tokens, args.load, 15.0 if args.quick else 60.0)
    label = f"long-miss-{args.miss_tokens}-x{args.load:g}"
    options = {"num_blocks": whole_content_blocks(trace)}
    if args.profile is not None:
        options["profile"] = args.profile
    policies = args.policy or list(POLICIES)
    jobs = [ReplayJob(label, trace, policy, {}, options) for policy in policies]
    results = run_experiment(jobs, args, out_dir)
    rows = {r.policy: measure(r) for r in results}
    rows = {policy: rows[policy] for policy in policies}
    text = (f"A {args.miss_tokens:,}-token miss at t = 10 s into hits at {args.load:g} x capacity "
            f"({trace_info(trace)['num_requests']} requests, KV cache holding all content). Goals: "
            "miss <= 1.5 x FCFS's TTFT, hits' median <= FCFS's.\n\n" + table(rows))
    finish_experiment(out_dir, NAME, text, {"rows": rows, "trace": trace_info(trace)}, results,
                      args, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
