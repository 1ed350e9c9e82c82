"""E5, trade-off: flood-hit median (x) against worst backlog miss (y), per policy and parameter.

    python benchmarks/e5_tradeoff.py [--out DIR] [--quick] [--workers N] [--ray ADDRESS]
        [--miss-tokens N[,N...]] [--from-replays DIR]

The E3 flood (the `flood` preset with a KV cache that holds all of its content, one panel per miss
size; default 8,192 and 16,384 tokens, 4 and 8 step budgets) under a family of orders, each a
point: how fast the flood's cache hits get their first token (the median TTFT of the flood
requests that were hits, x) against how long the worst backlogged miss waits (y). FCFS sits at
the top left of neither axis (slow hits, short worst miss), LPM at the other end; a good order is
a point below and left of the line between them. Points:

* `fairway` with `fast_weight` in {1, 2, 4, 8, 16} (4 is the default);
* `fairway-step` (the paper's per-step rule, when registered) with its defaults;
* k-LPM with k in {2, 4, 8, 16}; HRRN; LPM; FCFS.

The check the script prints: does any baseline point (k-LPM, HRRN, LPM, FCFS) dominate a Fairway
point (`fairway[...]` or `fairway-step`), i.e. have both coordinates <= and one < ? A dominated
Fairway point is a setting where a baseline is better on both counts. Writes e5.md / e5.json /
e5.png and one JSON per replay.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import e3_flood  # noqa: E402

import fairway.policies as policies  # noqa: E402
from fairway.replay import results as results_io  # noqa: E402
from fairway.replay.bench import (  # noqa: E402
    experiment_parser,
    finish_experiment,
    new_out_dir,
    run_experiment,
    trace_info,
)
from fairway.replay.results import ReplayResult  # noqa: E402
from fairway.replay.sweep import ReplayJob  # noqa: E402

NAME = "e5"
MISS_SIZES = (8192, 16384)
FAST_WEIGHTS = (1, 2, 4, 8, 16)
KLPM_KS = (2, 4, 8, 16)
#: The orders whose points must not be dominated, and the ones that may dominate them.
FAIRWAY, BASELINE = "fairway", "baseline"
#: Coordinates closer than this are equal: two orders that serve the same requests in the same
#: steps can differ by float rounding (1e-13 s) in the sums of step times on the virtual clock,
#: and a millisecond is far below one step's fixed time (15 ms).
TOLERANCE_S = 0.001


@dataclass(frozen=True)
class Point:
    """One order of the figure: a policy with parameters, and which side of the check it is on."""

    label: str
    policy: str
    params: dict[str, Any] = field(default_factory=dict)
    side: str = BASELINE


def points(known: list[str] | None = None) -> list[Point]:
    """The figure's orders; `fairway-step` only when the registry has it."""
    known = policies.names() if known is None else known
    out = [Point(f"fairway[fast_weight={w}]", "fairway", {"fast_weight": w}, FAIRWAY)
           for w in FAST_WEIGHTS]
    if "fairway-step" in known:
        out.append(Point("fairway-step", "fairway-step", {}, FAIRWAY))
    out += [Point(f"klpm[k={k}]", "klpm", {"k": k}) for k in KLPM_KS]
    out += [Point(name, name) for name in ("hrrn", "lpm", "fcfs")]
    return out


def dominated(rows: dict[str, dict[str, Any]], sides: dict[str, str]) -> dict[str, list[str]]:
    """Per Fairway point: the baseline points that dominate it (x and y <=, one <).

    Comparisons are within `TOLERANCE_S`. Points without both coordinates (no flood hit, or no
    backlog miss answered) take no part.
    """
    tol = TOLERANCE_S

    def xy(label: str) -> tuple[float, float] | None:
        x, y = rows[label]["x_flood_hit_median_s"], rows[label]["y_worst_miss_s"]
        return None if x is None or y is None else (x, y)

    out: dict[str, list[str]] = {}
    for f in (label for label, side in sides.items() if side == FAIRWAY):
        fp = xy(f)
        out[f] = [] if fp is None else [
            b for b, side in sides.items()
            if side == BASELINE and (bp := xy(b)) is not None
            and bp[0] <= fp[0] + tol and bp[1] <= fp[1] + tol
            and (bp[0] < fp[0] - tol or bp[1] < fp[1] - tol)
        ]
    return out


def _f(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def table(rows: dict[str, dict[str, Any]], beaten: dict[str, list[str]]) -> str:
    """One panel: every point's coordinates and, for Fairway points, who dominates it."""
    lines = ["| point | flood-hit median (s) | worst backlog miss (s) | x FCFS | dominated by |",
             "|---|---|---|---|---|"]
    for label, row in rows.items():
        cell = ", ".join(beaten[label]) or "none" if label in beaten else ""
        lines.append(f"| {label} | {_f(row['x_flood_hit_median_s'])} | "
                     f"{_f(row['y_worst_miss_s'])} | {_f(row['worst_miss_vs_fcfs'])} | {cell} |")
    return "\n".join(lines) + "\n"


def plot(panels: dict[str, dict[str, dict[str, Any]]], sizes: dict[str, int],
         plan: list[Point], path: Path) -> None:
    """One log-log panel per miss size; parameter families joined by lines and annotated."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator

    fig = Figure(figsize=(6.2 * len(panels), 5.2), layout="tight")
    axes = fig.subplots(1, len(panels), squeeze=False).ravel()
    families = (("fairway[", "C3", "o", "fairway, fast_weight"), ("klpm[", "C0", "s", "k-LPM, k"))
    for ax, (label, rows) in zip(axes, panels.items(), strict=True):
        for prefix, color, marker, name in families:
            members = [p for p in plan if p.label.startswith(prefix)
                       and rows[p.label]["x_flood_hit_median_s"] is not None]
            xs = [rows[p.label]["x_flood_hit_median_s"] for p in members]
            ys = [rows[p.label]["y_worst_miss_s"] for p in members]
            ax.plot(xs, ys, marker=marker, color=color, label=name, lw=1)
            for p, x, y in zip(members, xs, ys, strict=True):
                ax.annotate(str(next(iter(p.params.values()))), (x, y), fontsize=8,
                            xytext=(4, 4), textcoords="offset points", color=color)
        singles = (("fairway-step", "C1", "*"), ("hrrn", "C2", "^"), ("lpm", "C4", "v"),
                   ("fcfs", "k", "D"))
        for name, color, marker in singles:
            row = rows.get(name)
            if row is None or row["x_flood_hit_median_s"] is None:
                continue
            ax.plot([row["x_flood_hit_median_s"]], [row["y_worst_miss_s"]], marker=marker,
                    color=color, ls="", ms=9 if marker == "*" else 7, label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_minor_locator(LogLocator(subs=(1.2, 1.4, 1.6, 2, 3, 4, 5, 6, 7, 8, 9)))
        for axis in (ax.xaxis, ax.yaxis):  # plain seconds, not 3 x 10^0
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("flood-hit median TTFT (s)")
        ax.set_ylabel("worst backlog miss TTFT (s)")
        ax.set_title(f"{sizes[label]:,}-token misses")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def saved_results(folder: Path, jobs: list[ReplayJob]) -> list[ReplayResult]:
    """The replays of `jobs` as an earlier run saved them (one file each, by name)."""
    found = []
    for job in jobs:
        probe = ReplayResult(job.label or job.policy, job.trace_name, {}, [], 0.0, None)
        path = folder / results_io.file_name(probe)
        if not path.exists():
            raise SystemExit(f"e5: no replay {path} for {job.describe()}; run without "
                             "--from-replays")
        found.append(results_io.load(path))
    return found


def main(argv: list[str] | None = None) -> int:
    p = experiment_parser(__doc__.split("\n\n")[0])
    e3_flood.add_miss_tokens(p, MISS_SIZES)
    p.add_argument("--from-replays", default=None, metavar="DIR",
                   help="read the replays from DIR (an earlier run's replays/ folder) instead of "
                   "running them: the tables, figure and check again")
    args = p.parse_args(argv)
    started = time.perf_counter()
    out_dir = new_out_dir(args.out, NAME)
    profile = {} if args.profile is None else {"profile": args.profile}
    plan = points()
    jobs, info, sizes = [], {}, {}
    for size in args.miss_tokens:
        label, trace, options = e3_flood.warm_variant(size, args)
        info[label], sizes[label] = {**trace_info(trace), **options}, size
        jobs += [ReplayJob(label, trace, q.policy, q.params, {**profile, **options}, q.label)
                 for q in plan]
    if args.from_replays is None:
        results = run_experiment(jobs, args, out_dir)
    else:
        results = saved_results(Path(args.from_replays), jobs)
    sides = {q.label: q.side for q in plan}
    panels: dict[str, dict[str, dict[str, Any]]] = {}
    checks: dict[str, dict[str, list[str]]] = {}
    for label in sizes:
        measured = {r.policy: e3_flood.measure(r) for r in results if r.trace_name == label}
        e3_flood.add_ratios(measured)
        panels[label] = {
            q.label: {
                "policy": q.policy, "params": q.params, "side": q.side,
                "x_flood_hit_median_s": measured[q.label]["flood_hit"]["median_s"],
                "y_worst_miss_s": measured[q.label]["miss"]["max_s"],
                "worst_miss_vs_fcfs": measured[q.label]["worst_miss_vs_fcfs"],
                "errors": measured[q.label]["errors"],
            }
            for q in plan
        }
        checks[label] = dominated(panels[label], sides)
    plot(panels, sizes, plan, out_dir / f"{NAME}.png")
    parts = [
        "x: median TTFT of the flood requests that were cache hits; y: worst TTFT of a backlog "
        "miss; KV cache holding all content. 'dominated by': baseline points with both "
        f"coordinates <= and one < (Fairway points only; values within {TOLERANCE_S * 1000:g} ms "
        "count as equal).\n"
    ]
    verdicts = []
    for label, rows in panels.items():
        parts.append(f"**{label}** ({sizes[label]:,}-token misses):\n\n"
                     + table(rows, checks[label]))
        bad = {f: b for f, b in checks[label].items() if b}
        verdicts.append(
            f"- {sizes[label]:,}-token misses: "
            + ("no baseline point dominates a Fairway point." if not bad else
               "dominated: " + "; ".join(f"{f} by {', '.join(b)}" for f, b in bad.items()) + ".")
        )
    parts.append("Check:\n\n" + "\n".join(verdicts) + "\n")
    finish_experiment(
        out_dir, NAME, "\n".join(parts),
        {"panels": panels, "dominated_by": checks, "traces": info,
         "points": [dataclasses.asdict(q) for q in plan]},
        results, args, started,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
