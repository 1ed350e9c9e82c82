"""The hit / miss split: TTFT of cache hits and of misses on the hit-heavy and long-context presets.

    python benchmarks/hit_miss_split.py [--out DIR] [--quick] [--workers N] [--ray ADDRESS]
        [--policy NAME ...]

A request is a hit when the prefix cache held at least half of its prompt when it was first
scheduled (`fairway.replay.results.HIT_DEFINITION`). Each preset is replayed with the settings it
is meant for, which one `fairway bench` run cannot give several traces (its flags hold for all):

* `hit-heavy` (after SGLang #31954): cache 1.5 x the reusable content (the hot contexts stay
  cached), 2,048-token steps;
* `hit-heavy-long`: the same at long context (hot contexts of 32k-64k tokens), 8,192-token steps;
* `mooncake-long`: the conversation trace with prompts up to the 131,072-token context, cache 0.3,
  8,192-token steps.

Per preset the split for every phase and over all requests, then the goals on the
long-context presets, per policy: hits' median <= 1.1 x LPM's and misses' p99 <= 1.1 x FCFS's,
over every request but the warm-ups (which compute the hot contexts once, as misses under every
order). Policies: fcfs, lpm, klpm-4, hrrn, fairway-step, fairway (the table of docs/results.md,
"Hit / miss split"), or `--policy`. Writes hit_miss.md / hit_miss.json and one JSON per replay.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairway.replay.bench import (  # noqa: E402
    experiment_parser,
    finish_experiment,
    load_trace_spec,
    new_out_dir,
    run_experiment,
    trace_info,
)
from fairway.replay.report import hit_miss_table  # noqa: E402
from fairway.replay.results import ReplayResult  # noqa: E402
from fairway.replay.summary import HitMissStats, hit_miss_stats, summarize  # noqa: E402
from fairway.replay.sweep import ReplayJob  # noqa: E402
from fairway.traces.build import LONG_CONTEXT_BATCHED_TOKENS  # noqa: E402

NAME = "hit_miss"
POLICIES = ("fcfs", "lpm", "klpm-4", "hrrn", "fairway-step", "fairway")
#: The goals' factor: hits' median <= GOAL x LPM's, misses' p99 <= GOAL x FCFS's.
GOAL = 1.1
#: The hit-heavy family's warm-up phase (`fairway.traces.flood`), left out of the goals.
WARMUP = "warmup"
#: The goals' phase label: the trace's traffic, warm-ups left out.
TRAFFIC = "traffic (no warm-up)"


@dataclass(frozen=True)
class Split:
    """One preset and the replay settings it is meant for."""

    preset: str
    cache_fraction: float
    max_num_batched_tokens: int
    #: Checked against the goals (the long-context presets).
    long_context: bool

    def replay_options(self) -> dict[str, Any]:
        """The keyword arguments of `sim.replay` for this preset."""
        return {"cache_fraction": self.cache_fraction,
                "max_num_batched_tokens": self.max_num_batched_tokens}


SPLITS = (
    Split("hit-heavy", 1.5, 2048, long_context=False),
    Split("hit-heavy-long", 1.5, LONG_CONTEXT_BATCHED_TOKENS, long_context=True),
    Split("mooncake-long", 0.3, LONG_CONTEXT_BATCHED_TOKENS, long_context=True),
)


def traffic_split(result: ReplayResult) -> HitMissStats:
    """The hit / miss split of a replay's traffic: every request but the warm-ups.

    A hit-heavy trace's warm-ups compute the hot contexts once at the start; they are misses
    under every order (the four of `hit-heavy-long` take ~76 s) and would be the misses' p99.
    """
    reqs = [r for r in result.requests if r.phase != WARMUP]
    return hit_miss_stats(result.trace_name, result.policy, TRAFFIC, reqs, True)


def goals(results: list[ReplayResult], trace_name: str, policies: tuple[str, ...]
          ) -> dict[str, dict[str, Any]]:
    """Per policy: hits' median / LPM's and misses' p99 / FCFS's (`traffic_split`), met or not.

    Empty when LPM or FCFS is not among `policies` (nothing to compare with).
    """
    if "lpm" not in policies or "fcfs" not in policies:
        return {}
    split = {r.policy: traffic_split(r) for r in results if r.trace_name == trace_name}
    lpm, fcfs = split["lpm"], split["fcfs"]
    out = {}
    for policy in policies:
        row = split[policy]
        hit = _ratio(row.hit_median_s, lpm.hit_median_s)
        miss = _ratio(row.miss_p99_s, fcfs.miss_p99_s)
        out[policy] = {
            "hits": row.n_hit, "misses": row.n_miss,
            "hit_median_s": row.hit_median_s, "hit_median_vs_lpm": hit,
            "miss_p99_s": row.miss_p99_s, "miss_p99_vs_fcfs": miss,
            "met": hit is not None and miss is not None and hit <= GOAL and miss <= GOAL,
        }
    return out


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return value / reference


def goals_table(found: dict[str, dict[str, Any]]) -> str:
    """Markdown rows of `goals`."""
    lines = [f"| policy | hits / misses | hit median (s) | x LPM | miss p99 (s) | x FCFS | "
             f"both <= {GOAL:g} |", "|---|---|---|---|---|---|---|"]
    for policy, g in found.items():
        lines.append(
            f"| {policy} | {g['hits']} / {g['misses']} | {_f(g['hit_median_s'])} | "
            f"{_f(g['hit_median_vs_lpm'])} | "
            f"{_f(g['miss_p99_s'])} | {_f(g['miss_p99_vs_fcfs'])} | "
            f"{'yes' if g['met'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def _f(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = experiment_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--policy", action="append", default=None, metavar="NAME",
                        help=f"policy (repeatable; default: {', '.join(POLICIES)})")
    args = parser.parse_args(argv)
    policies = tuple(args.policy or POLICIES)
    started = time.perf_counter()
    out_dir = new_out_dir(args.out, NAME)
    options = {} if args.profile is None else {"profile": args.profile}
    jobs, traces = [], {}
    for split in SPLITS:
        trace = load_trace_spec(split.preset, quick=args.quick, cache_dir=args.trace_cache)
        traces[split.preset] = {**trace_info(trace), **split.replay_options()}
        jobs += [ReplayJob(split.preset, trace, policy, {},
                           {**options, **split.replay_options()}) for policy in policies]
    results = run_experiment(jobs, args, out_dir)
    summary = summarize(results)
    sections, found = [], {}
    for split in SPLITS:
        name = split.preset
        sections.append(
            f"**{name}**: cache {split.cache_fraction:g} x the reusable content, "
            f"{split.max_num_batched_tokens:,}-token steps, {traces[name]['num_requests']} "
            "requests. TTFT (ms) by cache hit / miss:\n\n"
            + "\n".join(hit_miss_table(summary, name)) + "\n"
        )
        if split.long_context:
            found[name] = goals(results, name, policies)
            if found[name]:
                sections.append(f"Goals on **{name}** (every request but the warm-ups):\n\n"
                                + goals_table(found[name]))
    markdown = "\n".join(sections)
    finish_experiment(out_dir, NAME, markdown, {"goals": found, "traces": traces}, results,
                      args, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
