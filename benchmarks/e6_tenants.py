"""E6, tenants and priority classes: does each tenant (class) keep what it gets when it runs alone?

    python benchmarks/e6_tenants.py [--out DIR] [--quick] [--preset NAME ...] [--policy NAME ...]
        [--no-progress]

Traces: the `tenants`, `tenants-mixed` and `priority` presets (seeds 9, 10, 11), replayed through
vLLM's real Scheduler on the virtual clock with the shipped A6000 estimate, 2,048-token steps and
a KV cache of 1.5 x each trace's reusable content (so the hot contexts stay cached, as the
presets intend). The replay lists a trace's tenants as the `tenants` option (weight 1 each) and
runs `--scheduling-policy priority` for a trace with priorities (`fairway.replay.sim.replay`).
Policies: `fairway`, `vtc`, `dlpm`, `lpm`, `fcfs` (or those given).

The presets (the `tenants` family, `fairway/traces/tenants.py`: classes of traffic, each with its
own tenant or none, priority, request-rate share or fixed load, hit share, hot contexts, suffix and
miss lengths; one warm-up request per hot context comes first):

- `tenants` (seed 9, 760 requests, 270 s): tenant `heavy` (90% hits on four 6,000-token contexts,
  1,200-token new turns, 7,200-token misses) sends 3 x the request rate of tenant `light` (90%
  misses of 1,000-3,000 tokens) in every phase: 0.6 x capacity in uncached tokens for a minute,
  1.5 x for 150 s, 0.6 x again; the light tenant is a quarter of the work (0.37 x capacity in the
  overload), under its equal share, so a fair share in uncached work can protect it;
- `tenants-mixed` (seed 10, 820 requests, 270 s): `chat` (short, 90% hits, most requests), `rag`
  (8k-token contexts, 80% hits), `batch` (4k-12k-token misses) and `agent` (16k-24k-token
  contexts, 95% hits), 1.3 x capacity in the 150 s busy phase;
- `priority` (seed 11, 593 requests, 240 s): no tenant, two priorities: `interactive` (priority
  0, 95% hits) at 0.3 x capacity throughout and a `batch` backlog (priority 1, half hits on
  8k-token contexts, half 8k-token misses) at 2 x capacity for the first 60 s, which queues for
  minutes; requests are tagged `class`.

Per preset, policy and class (the tenant; for `priority`, the `class` tag, interactive or
batch), over the requests that are not warm-ups: the count, median and p99 TTFT, the share of
the prefill tokens vLLM computed, and p99 / alone-p99, where alone-p99 is the class's p99 when
only its requests (with its own warm-ups) run, under the same policy on the same engine (the
same number of KV blocks). Beside it, per policy: the overall median, the prefill tokens
computed (and their ratio to LPM's) and the worst class's p99 / alone-p99.

Shares under contention (tenant presets): a step is contested when at least two tenants are
backlogged (a request that arrived by the step's start has no first token by its end) and the
step used at least 90% of its budget. Over every run of 10 consecutive engine steps that are all
contested, each
tenant backlogged in all 10 should get at least its weight share (1 / the number of such
tenants) of the window's prefill tokens minus one chunk (2,048 tokens): the table gives the
largest shortfall, share x total - tokens, over all windows and tenants (<= 2,048: the goal met).

Goals checked (docs/results.md quotes them): `tenants`: the light tenant's p99 <= 1.2 x alone,
the worst 10-step shortfall <= one chunk, prefill tokens <= 1.02 x LPM's; `tenants-mixed`: the
worst tenant's p99 / alone lower under `fairway` than under `vtc` and `dlpm`, the overall median
<= 1.1 x `dlpm`'s; `priority`: the interactive class's p99 <= 1.1 x alone, the batch class's
median and worst TTFT beside FCFS's.

Writes e6.md and e6.json (every number) to the output directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairway.replay.bench import new_out_dir, write_json  # noqa: E402
from fairway.replay.results import ReplayResult  # noqa: E402
from fairway.replay.sim import replay  # noqa: E402
from fairway.replay.sim_loop import ReplayHooks, StepRecord  # noqa: E402
from fairway.replay.summary import PERCENTILE_METHOD  # noqa: E402
from fairway.traces.format import Trace, TraceRequest  # noqa: E402
from fairway.traces.shipped import preset_trace  # noqa: E402

PRESETS = ("tenants", "tenants-mixed", "priority")
POLICIES = ("fairway", "vtc", "dlpm", "lpm", "fcfs")
CACHE_FRACTION = 1.5
BUDGET = 2048
WINDOW = 10
#: A step that used at least this share of its budget counts as contested (with two backlogs).
FULL_STEP = 0.9


def class_of(request: TraceRequest) -> str:
    """The class a request is reported under: its tenant, else its `class` tag."""
    if request.tenant is not None:
        return request.tenant
    return str(request.tags.get("class", "default"))


def only(trace: Trace, keep: Callable[[TraceRequest], bool]) -> Trace:
    """The trace with only the requests `keep` accepts (warm-ups of other classes dropped)."""
    requests = tuple(r for r in trace.requests if keep(r))
    return Trace(dataclasses.replace(trace.header, num_requests=len(requests)), requests)


@dataclasses.dataclass
class Run:
    """One replay and the prefill tokens of each of its steps, per request."""

    result: ReplayResult
    steps: list[StepRecord]


#: `fairway`'s parameters for this run (`--fairway-arg KEY=VALUE`).
FAIRWAY_ARGS: dict[str, Any] = {}


def run(trace: Trace, policy: str, num_blocks: int | None, progress: bool) -> Run:
    steps: list[StepRecord] = []
    result = replay(
        trace, policy, policy_params=FAIRWAY_ARGS if policy == "fairway" else None,
        cache_fraction=CACHE_FRACTION, num_blocks=num_blocks,
        max_num_batched_tokens=BUDGET, hooks=ReplayHooks(on_step=steps.append),
        progress=progress,
    )
    if result.n_errors:
        raise SystemExit(f"{trace.header.preset} under {policy}: {result.n_errors} requests failed")
    return Run(result, steps)


def ttfts(result: ReplayResult, cls: str | None, trace: Trace) -> np.ndarray:
    classes = {r.request_id: class_of(r) for r in trace.requests}
    return np.array([
        r.ttft_s for r in result.requests
        if r.phase != "warmup" and r.ttft_s is not None
        and (cls is None or classes[r.request_id] == cls)
    ])


def pct(values: np.ndarray, q: float) -> float:
    if not len(values):
        return float("nan")
    return float(np.percentile(values, q, method=PERCENTILE_METHOD))


def shortfall(run_: Run, trace: Trace, window_steps: int = WINDOW) -> float | None:
    """The largest share x total - tokens over windows of `window_steps` consecutive contested
    steps (tokens)."""
    classes = {r.request_id: class_of(r) for r in trace.requests}
    spans = [(r.request_id, r.arrival_s, r.first_token_s) for r in run_.result.requests]
    contested: list[tuple[set[str], dict[str, int]] | None] = []
    for step in run_.steps:
        tokens: dict[str, int] = defaultdict(int)
        for rid, (start, end) in step.spans.items():
            tokens[classes[rid]] += end - start
        backlogged = {
            classes[rid] for rid, arrival, first in spans
            if arrival <= step.start_s and (first is None or first > step.end_s + 1e-9)
        }
        full = len(backlogged) >= 2 and sum(tokens.values()) >= FULL_STEP * BUDGET
        contested.append((backlogged, tokens) if full else None)
    worst: float | None = None
    for k in range(len(contested) - window_steps + 1):
        steps = contested[k : k + window_steps]
        if any(s is None for s in steps):
            continue
        window = [s for s in steps if s is not None]
        always = set.intersection(*(b for b, _ in window))
        if len(always) < 2:
            continue
        total = sum(sum(t.values()) for _, t in window)
        for cls in always:
            got = sum(t.get(cls, 0) for _, t in window)
            short = total / len(always) - got
            worst = short if worst is None else max(worst, short)
    return worst


def computed_tokens(run_: Run) -> int:
    return sum(end - start for step in run_.steps for start, end in step.spans.values())


def measure(preset: str, policies: Sequence[str], quick: bool, progress: bool) -> dict[str, Any]:
    trace = preset_trace(preset, quick=quick)
    classes = sorted({class_of(r) for r in trace.requests if r.phase != "warmup"})
    class_by_id = {r.request_id: class_of(r) for r in trace.requests}
    out: dict[str, Any] = {"preset": preset, "quick": quick, "classes": classes, "policies": {}}
    for policy in policies:
        whole = run(trace, policy, None, progress)
        blocks = whole.result.settings["kv_cache"]["num_blocks"]
        row: dict[str, Any] = {
            "median_s": pct(ttfts(whole.result, None, trace), 50),
            "p99_s": pct(ttfts(whole.result, None, trace), 99),
            "computed_tokens": computed_tokens(whole),
            "num_blocks": blocks,
            "classes": {},
        }
        total = row["computed_tokens"]
        for cls in classes:
            alone_trace = only(trace, lambda r, c=cls: class_of(r) == c)
            alone = run(alone_trace, policy, blocks, False)
            values = ttfts(whole.result, cls, trace)
            alone_p99 = pct(ttfts(alone.result, cls, alone_trace), 99)
            tokens = sum(
                end - start for step in whole.steps for rid, (start, end) in step.spans.items()
                if class_by_id[rid] == cls
            )
            row["classes"][cls] = {
                "n": len(values), "median_s": pct(values, 50), "p99_s": pct(values, 99),
                "max_s": float(values.max()) if len(values) else float("nan"),
                "alone_p99_s": alone_p99, "p99_over_alone": pct(values, 99) / alone_p99,
                "token_share": tokens / total if total else 0.0,
            }
        row["worst_over_alone"] = max(c["p99_over_alone"] for c in row["classes"].values())
        row["shortfall_tokens"] = shortfall(whole, trace) if preset != "priority" else None
        row["shortfall_50_tokens"] = (
            shortfall(whole, trace, 5 * WINDOW) if preset != "priority" else None
        )
        out["policies"][policy] = row
        print(f"{preset} {policy}: median {row['median_s']:.2f} s, worst p99/alone "
              f"{row['worst_over_alone']:.2f}", flush=True)
    lpm = out["policies"].get("lpm")
    for row in out["policies"].values():
        row["tokens_over_lpm"] = row["computed_tokens"] / lpm["computed_tokens"] if lpm else None
    return out


def _num(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def goals(results: dict[str, Any]) -> list[str]:
    """The issue's goals, one line each, from the measured numbers."""
    lines = []
    t = results.get("tenants", {}).get("policies", {}).get("fairway")
    if t:
        light = t["classes"].get("light", {})
        ratio = light.get("p99_over_alone", float("nan"))
        lines.append(f"tenants: light p99 / alone {ratio:.2f} "
                     f"(goal <= 1.2); worst 10-step shortfall "
                     f"{_num(t['shortfall_tokens'], 0)} tokens "
                     f"(goal <= {BUDGET}); tokens / LPM's {_num(t['tokens_over_lpm'], 3)} "
                     "(goal <= 1.02)")
    m = results.get("tenants-mixed", {}).get("policies", {})
    if "fairway" in m:
        others = {p: m[p]["worst_over_alone"] for p in ("vtc", "dlpm") if p in m}
        dlpm = m.get("dlpm", {}).get("median_s")
        lines.append(
            f"tenants-mixed: worst p99 / alone fairway {m['fairway']['worst_over_alone']:.2f}, "
            + ", ".join(f"{p} {v:.2f}" for p, v in others.items())
            + " (goal: fairway lowest)"
            + (f"; median / dlpm's {m['fairway']['median_s'] / dlpm:.2f} (goal <= 1.1)"
               if dlpm else "")
        )
    p = results.get("priority", {}).get("policies", {})
    if "fairway" in p:
        inter = p["fairway"]["classes"].get("interactive", {})
        batch = p["fairway"]["classes"].get("batch", {})
        fcfs = p.get("fcfs", {}).get("classes", {}).get("batch", {})
        lines.append(
            f"priority: interactive p99 / alone {inter.get('p99_over_alone', float('nan')):.2f} "
            f"(goal <= 1.1); batch median {batch.get('median_s', float('nan')):.1f} s, worst "
            f"{batch.get('max_s', float('nan')):.1f} s"
            + (f" (FCFS inside the class: {fcfs['median_s']:.1f} s, {fcfs['max_s']:.1f} s)"
               if fcfs else "")
        )
    return lines


def markdown(results: dict[str, Any]) -> str:
    out = ["# E6: tenants and priority classes", ""]
    for preset, res in results.items():
        out += [f"## {preset}{' (quick)' if res['quick'] else ''}", "",
                "| policy | class | n | median s | p99 s | p99 / alone | share of tokens |",
                "|---|---|---|---|---|---|---|"]
        for policy, row in res["policies"].items():
            for cls, c in row["classes"].items():
                out.append(f"| {policy} | {cls} | {c['n']} | {c['median_s']:.2f} | "
                           f"{c['p99_s']:.2f} | {c['p99_over_alone']:.2f} | "
                           f"{c['token_share']:.2f} |")
        out += ["", "| policy | median s | p99 s | worst p99 / alone | tokens / LPM's | "
                "worst 10-step shortfall (tokens) | worst 50-step shortfall |",
                "|---|---|---|---|---|---|---|"]
        for policy, row in res["policies"].items():
            short = row["shortfall_tokens"]
            short50 = row["shortfall_50_tokens"]
            ratio = row["tokens_over_lpm"]
            out.append(f"| {policy} | {row['median_s']:.2f} | {row['p99_s']:.2f} | "
                       f"{row['worst_over_alone']:.2f} | "
                       f"{'n/a' if ratio is None else f'{ratio:.3f}'} | "
                       f"{'n/a' if short is None else f'{short:.0f}'} | "
                       f"{'n/a' if short50 is None else f'{short50:.0f}'} |")
        out.append("")
    out += ["## Goals", "", *[f"- {line}" for line in goals(results)], ""]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="output directory (default results/e6-<timestamp>)")
    parser.add_argument("--quick", action="store_true", help="the presets' quick variants")
    parser.add_argument("--preset", action="append", choices=PRESETS, help="repeatable")
    parser.add_argument("--policy", action="append", help="repeatable (default: %(default)s)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--fairway-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="a parameter of fairway (repeatable), e.g. tenant_credit_steps=4")
    args = parser.parse_args(argv)
    for item in args.fairway_arg:
        key, _, value = item.partition("=")
        FAIRWAY_ARGS[key] = json.loads(value)
    policies = args.policy or list(POLICIES)
    out_dir = new_out_dir(args.out, "e6")
    results = {
        preset: measure(preset, policies, args.quick, not args.no_progress)
        for preset in (args.preset or PRESETS)
    }
    write_json(out_dir / "e6.json", results)
    (out_dir / "e6.md").write_text(markdown(results), encoding="utf-8")
    print(markdown(results))
    print(f"wrote {out_dir / 'e6.md'} and {out_dir / 'e6.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
