"""Who is in the p99 TTFT tail, and why: the tail of each policy explained from E2's replay files.

    python benchmarks/tail_analysis.py --replays DIR [--scenario NAME ...] [--policy NAME ...]
        [--out DIR]

Reads the per-replay JSON files that `benchmarks/e2_p99_scenarios.py --out DIR` writes to
DIR/replays (`<scenario>--<policy>.json`, `fairway.replay_result/1`); nothing is replayed.
Scenarios: every one in the folder whose name starts with `mooncake`, plus those named by
`--scenario` (the trace name, "mooncake x1 cache0.3", or its file form, "mooncake_x1_cache0.3");
policies: every one found, or those named by `--policy`.

Per scenario and policy, over the requests without an error that are not warm-ups
(`phase == "warmup"`), with TTFT = first token - arrival, wait = first scheduled - arrival,
span = first token - first scheduled and uncached = prompt - cached tokens (the prefill work the
policy's order left to compute; cached tokens unknown count as 0):

* p50 / p99 / max TTFT, the errors (errored non-warm-up requests) and the tokens computed
  (the sum of uncached);
* by uncached length, bins [0, 4k), [4k, 16k), [16k, inf) with k = 1,024 tokens: the count,
  the median and p90 TTFT, the p90 wait and the p90 span;
* the tail set, the requests with TTFT >= the policy's own p99: their bins, mean wait and span,
  and the *work that passed them*: the uncached tokens of the requests that arrived after a tail
  request and got their first token before it, summed, and as a share of all prefill work done
  while the tail request waited (arrival to first token; each other request's uncached tokens
  counted pro rata over its span, first scheduled to first token, that falls in that window; the
  tail request's own tokens excluded). A large share means the order let later work overtake;
  a small one means the request waited behind earlier work (FCFS-like) or for its own long span.

Percentiles are numpy's linear method, as in `fairway.replay.summary`. Decode work is not counted
(the replay files hold no decode timings), and a preempted request's recomputation is not seen
(cached tokens are those at its first scheduling).

Lanes are out of scope: which lane served each tail request is recorded in Fairway's decision
trace (`fairway inspect`, `benchmarks/decision_trace_cost.py`), not in the replay files, whose
request fields (request_id, arrival_s, phase, prompt_tokens, first_scheduled_s, first_token_s,
cached_tokens, error, tags) carry no lane. Joining the tail set to the decision trace by request
id is left to a tool that reads both.

Writes tail.md (one set of tables per scenario, rows = policies), tail.json (every number, and
each tail request) and tail.png (per scenario, p90 TTFT per uncached bin and policy).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairway.replay.bench import new_out_dir, write_json  # noqa: E402
from fairway.replay.results import ReplayResult, ResultError, load, safe_name  # noqa: E402
from fairway.replay.summary import PERCENTILE_METHOD  # noqa: E402

NAME = "tail"
#: Scenarios analysed without `--scenario`: those whose name starts with this.
DEFAULT_PREFIX = "mooncake"
#: Uncached-length bins: (label, lower bound inclusive, upper bound exclusive), in tokens.
BINS: tuple[tuple[str, int, float], ...] = (
    ("<4k", 0, 4_096),
    ("4k-16k", 4_096, 16_384),
    (">=16k", 16_384, math.inf),
)
#: Policies in E2's order (its baselines, then fairway-step and fairway); others follow, sorted.
ORDER = ("fcfs", "lpm", "klpm-4", "ragcache", "preble", "peek", "hrrn", "fairway-step", "fairway")
WARMUP = "warmup"
#: The tail set: requests with TTFT >= this percentile of the policy's TTFTs.
TAIL_PERCENTILE = 99


class TailError(Exception):
    """A replays folder, scenario or policy that cannot be analysed (the script exits with 2)."""


@dataclass(frozen=True, slots=True)
class Requests:
    """The analysed requests of one replay as arrays (one entry per request, trace order)."""

    ids: list[str]
    arrival: np.ndarray
    scheduled: np.ndarray  # NaN where unknown (a live replay)
    first_token: np.ndarray
    uncached: np.ndarray

    @property
    def ttft(self) -> np.ndarray:
        return self.first_token - self.arrival

    @property
    def wait(self) -> np.ndarray:
        return self.scheduled - self.arrival

    @property
    def span(self) -> np.ndarray:
        return self.first_token - self.scheduled


# --- finding and loading replays ------------------------------------------------------------


def find_replays(folder: Path) -> dict[tuple[str, str], Path]:
    """`(scenario, policy)` (file-name forms) -> path, for every `<scenario>--<policy>.json`."""
    if not folder.is_dir():
        raise TailError(f"{folder}: not a folder (give the replays folder of an E2 run)")
    found = {}
    for path in sorted(folder.glob("*--*.json")):
        scenario, _, policy = path.stem.partition("--")
        found[(scenario, policy)] = path
    if not found:
        raise TailError(f"{folder}: no replay files (<scenario>--<policy>.json); write them with "
                        "`python benchmarks/e2_p99_scenarios.py --out DIR` (DIR/replays)")
    return found


def policy_order(policies: set[str]) -> list[str]:
    """E2's order first, then the rest alphabetically."""
    known = [p for p in ORDER if p in policies]
    return known + sorted(policies - set(known))


def select(found: dict[tuple[str, str], Path], scenarios: Sequence[str],
           policies: Sequence[str]) -> dict[str, dict[str, Path]]:
    """scenario -> policy -> path: the default scenarios plus `scenarios`, `policies` or all.

    Raises:
        TailError: a named scenario or policy has no file, or nothing is selected.
    """
    in_folder = sorted({s for s, _ in found})
    wanted = [s for s in in_folder if s.startswith(DEFAULT_PREFIX)]
    for name in scenarios:
        key = safe_name(name)
        if key not in in_folder:
            raise TailError(f"scenario {name!r}: no replays of it; scenarios in the folder: "
                            f"{', '.join(in_folder)}")
        if key not in wanted:
            wanted.append(key)
    if not wanted:
        raise TailError(f"no scenario starts with {DEFAULT_PREFIX!r} and none was named "
                        f"(--scenario); scenarios in the folder: {', '.join(in_folder)}")
    chosen: dict[str, dict[str, Path]] = {}
    for scenario in wanted:
        have = {p: path for (s, p), path in found.items() if s == scenario}
        if policies:
            missing = [p for p in policies if safe_name(p) not in have]
            if missing:
                raise TailError(f"scenario {scenario}: no replay of policy {', '.join(missing)}; "
                                f"policies there: {', '.join(policy_order(set(have)))}")
            names = [safe_name(p) for p in policies]
        else:
            names = policy_order(set(have))
        chosen[scenario] = {p: have[p] for p in names}
    return chosen


def requests_of(result: ReplayResult) -> tuple[Requests, int]:
    """The analysed requests (no error, not a warm-up) and the number of errored non-warm-ups."""
    kept = [r for r in result.requests if r.phase != WARMUP]
    ok = [r for r in kept if r.ttft_s is not None]

    def col(values: list[float | None]) -> np.ndarray:
        return np.array([np.nan if v is None else v for v in values], dtype=float)

    arrays = Requests(
        ids=[r.request_id for r in ok],
        arrival=col([r.arrival_s for r in ok]),
        scheduled=col([r.first_scheduled_s for r in ok]),
        first_token=col([r.first_token_s for r in ok]),
        uncached=np.array([r.prompt_tokens - (r.cached_tokens or 0) for r in ok], dtype=np.int64),
    )
    return arrays, len(kept) - len(ok)


# --- statistics ------------------------------------------------------------------------------


def pct(values: np.ndarray, q: float) -> float | None:
    """Percentile `q` of the finite `values` (linear method); None when there are none."""
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    return float(np.percentile(values, q, method=PERCENTILE_METHOD))


def mean(values: np.ndarray) -> float | None:
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else None


def bin_of(uncached: np.ndarray) -> np.ndarray:
    """Index into `BINS` of each uncached length."""
    edges = [low for _, low, _ in BINS[1:]]
    return np.searchsorted(edges, uncached, side="right")


def bin_stats(reqs: Requests) -> dict[str, dict[str, Any]]:
    """Per uncached bin: count, median / p90 TTFT, p90 wait, p90 span."""
    bins = bin_of(reqs.uncached)
    stats = {}
    for i, (label, _, _) in enumerate(BINS):
        mask = bins == i
        stats[label] = {
            "n": int(mask.sum()),
            "median_ttft_s": pct(reqs.ttft[mask], 50),
            "p90_ttft_s": pct(reqs.ttft[mask], 90),
            "p90_wait_s": pct(reqs.wait[mask], 90),
            "p90_span_s": pct(reqs.span[mask], 90),
        }
    return stats


def window_work(reqs: Requests, start: float, end: float) -> np.ndarray:
    """Per request, the uncached tokens computed in [start, end], pro rata over its span.

    Where the first scheduling is unknown, the tokens count at the first token.
    """
    begin = np.where(np.isfinite(reqs.scheduled), reqs.scheduled, reqs.first_token)
    length = reqs.first_token - begin
    overlap = np.clip(np.minimum(reqs.first_token, end) - np.maximum(begin, start), 0.0, None)
    inside = (begin >= start) & (reqs.first_token <= end)
    safe = np.where(length > 0, length, 1.0)
    share = np.where(length > 0, overlap / safe, inside.astype(float))
    return reqs.uncached * share


def tail_requests(reqs: Requests, p99: float) -> list[dict[str, Any]]:
    """Every request with TTFT >= `p99`, slowest first, with the work that passed it."""
    ttft, bins = reqs.ttft, bin_of(reqs.uncached)
    rows = []
    for i in np.flatnonzero(ttft >= p99):
        a, f = reqs.arrival[i], reqs.first_token[i]
        passed = (reqs.arrival > a) & (reqs.first_token < f)
        work = window_work(reqs, a, f)
        work[i] = 0.0
        total = float(work.sum())
        passed_tokens = int(reqs.uncached[passed].sum())
        rows.append({
            "request_id": reqs.ids[i],
            "uncached_tokens": int(reqs.uncached[i]),
            "bin": BINS[bins[i]][0],
            "ttft_s": float(ttft[i]),
            "wait_s": _finite(reqs.wait[i]),
            "span_s": _finite(reqs.span[i]),
            "passed_requests": int(passed.sum()),
            "passed_tokens": passed_tokens,
            "work_while_waiting_tokens": total,
            "passed_share": passed_tokens / total if total > 0 else None,
        })
    return sorted(rows, key=lambda r: -r["ttft_s"])


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _column(rows: list[dict[str, Any]], key: str) -> np.ndarray:
    """`key` of every row as floats, NaN where None."""
    return np.array([np.nan if r[key] is None else r[key] for r in rows], dtype=float)


def analyse(result: ReplayResult) -> dict[str, Any]:
    """Every number of one replay (see the module docstring)."""
    reqs, errors = requests_of(result)
    ttft = reqs.ttft
    p99 = pct(ttft, TAIL_PERCENTILE)
    tail = tail_requests(reqs, p99) if p99 is not None else []
    passed = sum(t["passed_tokens"] for t in tail)
    window = sum(t["work_while_waiting_tokens"] for t in tail)
    return {
        "trace_name": result.trace_name,
        "policy": result.policy,
        "n": len(reqs.ids),
        "errors": errors,
        "p50_s": pct(ttft, 50),
        "p99_s": p99,
        "max_s": float(ttft.max()) if ttft.size else None,
        "tokens_computed": int(reqs.uncached.sum()),
        "bins": bin_stats(reqs),
        "tail": {
            "n": len(tail),
            "bins": {label: sum(t["bin"] == label for t in tail) for label, _, _ in BINS},
            "mean_wait_s": mean(_column(tail, "wait_s")),
            "mean_span_s": mean(_column(tail, "span_s")),
            "passed_tokens": passed,
            "passed_share": passed / window if window > 0 else None,
            "requests": tail,
        },
    }


# --- report ----------------------------------------------------------------------------------


def _s(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _tokens(value: float) -> str:
    return f"{value / 1000:,.0f}k" if value >= 10_000 else f"{value:,.0f}"


def summary_table(rows: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| policy | n | errors | p50 (s) | p99 (s) | max (s) | tokens computed | tail n | "
        "tail bins | tail mean wait (s) | tail mean span (s) | work that passed the tail | "
        "share of work while waiting |",
        "|---|" + "---|" * 12,
    ]
    for policy, r in rows.items():
        t = r["tail"]
        bins = ", ".join(f"{label} {n}" for label, n in t["bins"].items() if n) or "—"
        lines.append(
            f"| {policy} | {r['n']} | {r['errors']} | {_s(r['p50_s'])} | {_s(r['p99_s'])} | "
            f"{_s(r['max_s'])} | {_tokens(r['tokens_computed'])} | {t['n']} | {bins} | "
            f"{_s(t['mean_wait_s'])} | {_s(t['mean_span_s'])} | {_tokens(t['passed_tokens'])} | "
            f"{_share(t['passed_share'])} |"
        )
    return lines


def bin_table(rows: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| policy | " + " | ".join(f"{label}: n · TTFT median / p90 · p90 wait / span"
                                   for label, _, _ in BINS) + " |",
        "|---|" + "---|" * len(BINS),
    ]
    for policy, r in rows.items():
        cells = []
        for label, _, _ in BINS:
            b = r["bins"][label]
            cells.append("—" if not b["n"] else
                         f"{b['n']} · {_s(b['median_ttft_s'])} / {_s(b['p90_ttft_s'])} · "
                         f"{_s(b['p90_wait_s'])} / {_s(b['p90_span_s'])}")
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return lines


def tail_table(rows: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| policy | request | uncached | bin | TTFT (s) | wait (s) | span (s) | passed by | "
        "work that passed it | share of work while waiting |",
        "|---|" + "---|" * 9,
    ]
    for policy, r in rows.items():
        for t in r["tail"]["requests"]:
            lines.append(
                f"| {policy} | {t['request_id']} | {t['uncached_tokens']:,} | {t['bin']} | "
                f"{_s(t['ttft_s'])} | {_s(t['wait_s'])} | {_s(t['span_s'])} | "
                f"{t['passed_requests']} | {_tokens(t['passed_tokens'])} | "
                f"{_share(t['passed_share'])} |"
            )
    return lines


def markdown(analysis: dict[str, dict[str, dict[str, Any]]], folder: Path) -> str:
    parts = [
        f"_Tail analysis of {folder}: TTFT over the requests without an error, warm-ups "
        f"excluded. Tail = TTFT >= the policy's own p99. Wait = first scheduled - arrival, span "
        f"= first token - first scheduled. Uncached = prompt - cached tokens, bins of k = 1,024 "
        f"tokens. Work that passed the tail: uncached tokens of the requests that arrived after a "
        f"tail request and got their first token before it; share: of all prefill work done "
        f"while it waited (others' tokens pro rata over their spans). A policy's errored requests "
        f"(never answered) are in no percentile: with errors, its tail is flattered. Lanes: in "
        f"the decision trace, not in the replay files._",
    ]
    for rows in analysis.values():
        name = next(iter(rows.values()))["trace_name"]
        parts += [
            f"\n## {name}\n",
            *summary_table(rows),
            "\nBy uncached length (times in s):\n",
            *bin_table(rows),
            "\nTail requests (slowest first):\n",
            *tail_table(rows),
        ]
    return "\n".join(parts) + "\n"


def plot(analysis: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    """Per scenario a panel: p90 TTFT per uncached bin, one bar per policy (log scale)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import LogFormatter

    n = len(analysis)
    cols = min(n, 2)
    nrows = math.ceil(n / cols)
    fig = Figure(figsize=(6.5 * cols, 4.0 * nrows), layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    for ax, rows in zip(axes, analysis.values(), strict=False):
        policies = list(rows)
        width = 0.8 / len(policies)
        for j, policy in enumerate(policies):
            heights = [rows[policy]["bins"][label]["p90_ttft_s"] for label, _, _ in BINS]
            xs = [i - 0.4 + (j + 0.5) * width for i in range(len(BINS))]
            ax.bar(xs, [np.nan if h is None else h for h in heights], width,
                   label=policy, color=f"C{j % 10}")
        ax.set_xticks(range(len(BINS)), [f"uncached {label}" for label, _, _ in BINS])
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(LogFormatter())  # 10, 100 rather than 10^1, 10^2
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
        ax.set_ylabel("p90 TTFT (s)")
        ax.set_title(next(iter(rows.values()))["trace_name"], fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize=8)
    fig.suptitle("p90 TTFT by uncached prompt length")
    fig.savefig(path, dpi=110)


# --- main ------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replays", required=True, metavar="DIR",
                   help="a replays folder (`e2_p99_scenarios.py --out DIR` writes DIR/replays)")
    p.add_argument("--scenario", action="append", default=[], metavar="NAME",
                   help=f"also analyse this scenario (repeatable; the {DEFAULT_PREFIX}* ones "
                   "always are)")
    p.add_argument("--policy", action="append", default=[], metavar="NAME",
                   help="analyse only this policy (repeatable; default every one found)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help=f"output directory (default results/{NAME}-<timestamp>; never "
                   "overwritten)")
    return p


def run(folder: Path, scenarios: Sequence[str],
        policies: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """scenario -> policy -> `analyse` of its replay."""
    chosen = select(find_replays(folder), scenarios, policies)
    analysis: dict[str, dict[str, dict[str, Any]]] = {}
    for scenario, paths in chosen.items():
        analysis[scenario] = {}
        for path in paths.values():
            try:
                result = load(path)
            except ResultError as exc:
                raise TailError(str(exc)) from exc
            analysis[scenario][result.policy] = analyse(result)
    return analysis


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    folder = Path(args.replays)
    try:
        analysis = run(folder, args.scenario, args.policy)
    except TailError as exc:
        print(f"tail_analysis: error: {exc}", file=sys.stderr)
        return 2
    out_dir = new_out_dir(args.out, NAME)
    text = markdown(analysis, folder)
    (out_dir / f"{NAME}.md").write_text(text, encoding="utf-8")
    bins = [{"label": label, "min_tokens": low, "max_tokens": None if math.isinf(high) else high}
            for label, low, high in BINS]
    write_json(out_dir / f"{NAME}.json",
               {"replays": str(folder), "bins": bins, "tail_percentile": TAIL_PERCENTILE,
                "percentile_method": PERCENTILE_METHOD, "scenarios": analysis})
    plot(analysis, out_dir / f"{NAME}.png")
    print(text)
    print(f"wrote {out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
