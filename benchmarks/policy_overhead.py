"""CPU cost of one `order()` call per registered policy, against a plain arrival sort.

    python benchmarks/policy_overhead.py [--sizes 100,1000,10000] [--repeats N] [--seed N]
        [--json PATH]

For each size it builds a seeded random waiting queue (prompts of 1k-16k tokens, cache hits on a few
shared prefixes), times `policy.order(queue, now)` for every policy registered by importing
`fairway.policies` (the plain-Python rule; and `policy.ordering(columns, Step(now))`, the engine
path the scheduler calls, for the policies that have their own: rows "(columns)"), and prints a
Markdown table of medians (over `--repeats` runs, default 15) beside `sorted(range(n),
key=arrival)` measured in the same run, with the ratio to it. Each policy gets one untimed warm-up
call first, so stateful policies are timed in their steady state (ids already seen), as at every
step but the first.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Runnable as a plain script from a checkout: put the repository root on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairway.policies import (  # noqa: E402
    Policy,
    QueueColumns,
    QueuedRequest,
    Step,
    get,
    names,
)

#: Modules whose import registers policies. `fairway.policies` imports every one of them once its
#: `__init__` exists; the baseline modules are also imported one by one so that a checkout without
#: it still measures them.
POLICY_MODULES = (
    "fairway.policies",
    "fairway.policies.fcfs",
    "fairway.policies.lpm",
    "fairway.policies.ragcache",
    "fairway.policies.preble",
    "fairway.policies.peek",
    "fairway.policies.hrrn",
)
BASELINE = "sorted-by-arrival"
BLOCK_TOKENS = 16


def register_all() -> list[str]:
    """Import the policy modules; return those that could not be imported."""
    missing = []
    for module in POLICY_MODULES:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{module} ({exc})")
    return missing


def make_queue(n: int, seed: int) -> tuple[list[QueuedRequest], float]:
    """A waiting queue of `n` requests and the `now` to order it at.

    Prompts are uniform in 1,000-16,000 tokens. 70% of requests start with one of 8 shared prefixes
    (512-8,192 tokens, Zipf-like popularity); 5 of the prefixes are cached, so those requests hit
    the prefix length (block-granular, at most L - 1) and the rest miss. Arrivals are a Poisson
    stream of 5 requests/s.
    """
    rng = np.random.default_rng(seed)
    num_prefixes = 8
    prefix_tokens = rng.integers(512 // BLOCK_TOKENS, 8192 // BLOCK_TOKENS + 1, num_prefixes)
    prefix_tokens = prefix_tokens * BLOCK_TOKENS
    cached = rng.permutation(num_prefixes) < 5
    popularity = 1.0 / np.arange(1, num_prefixes + 1)
    popularity /= popularity.sum()
    prompts = rng.integers(1000, 16001, n)
    shares = rng.random(n) < 0.7
    prefix_of = rng.choice(num_prefixes, size=n, p=popularity)
    arrivals = np.cumsum(rng.exponential(0.2, n))
    queue = []
    for i in range(n):
        prompt = int(prompts[i])
        hit = 0
        if shares[i] and cached[prefix_of[i]]:
            hit = min(int(prefix_tokens[prefix_of[i]]), prompt - 1)
            hit -= hit % BLOCK_TOKENS
        queue.append(QueuedRequest(f"req-{i}", float(arrivals[i]), prompt, hit))
    order = rng.permutation(n)  # the engine's queue is not necessarily in arrival order
    return [queue[i] for i in order], float(arrivals[-1]) + 0.1


def median_s(call: Callable[[], object], repeats: int) -> float:
    """Median wall time of `call()` in seconds over `repeats` runs."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def run(sizes: Sequence[int], repeats: int, seed: int = 0) -> dict[str, Any]:
    """Time every registered policy at every size; return the results as a JSON-able dict."""
    missing = register_all()
    policies = names()
    rows: list[dict[str, Any]] = []
    for n in sizes:
        queue, now = make_queue(n, seed)
        base = median_s(lambda q=queue: sorted(range(len(q)), key=lambda i: q[i].arrival), repeats)
        rows.append({"policy": BASELINE, "size": n, "median_s": base, "ratio": 1.0})
        for name in policies:
            row: dict[str, Any] = {"policy": name, "size": n}
            try:
                policy = get(name)
                policy.order(queue, now)  # warm-up: first sighting of every id
                row["median_s"] = median_s(lambda p=policy, q=queue, t=now: p.order(q, t), repeats)
                row["ratio"] = row["median_s"] / base
            except Exception as exc:  # report, keep measuring the others
                row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
            if "error" not in row and type(policy).ordering is not Policy.ordering:
                rows.append(_columns_row(name, queue, now, base, repeats))
    return {
        "sizes": list(sizes),
        "repeats": repeats,
        "seed": seed,
        "policies": policies,
        "missing_modules": missing,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "results": rows,
    }


def _columns_row(
    name: str, queue: list[QueuedRequest], now: float, base: float, repeats: int
) -> dict[str, Any]:
    """The policy's own engine path (`ordering` over columns, what the scheduler calls)."""
    policy = get(name)
    cols = QueueColumns.of(queue)
    policy.ordering(cols, Step(now))  # warm-up, as for `order()`
    cols.new[:] = False  # the steady state: every request seen before
    median = median_s(lambda: policy.ordering(cols, Step(now)), repeats)
    return {
        "policy": f"{name} (columns)",
        "size": len(queue),
        "median_s": median,
        "ratio": median / base,
    }


def markdown(result: dict[str, Any]) -> str:
    """The results as a Markdown table: one row per policy, median ms and ratio per size."""
    sizes = result["sizes"]
    cells: dict[tuple[str, int], str] = {}
    for row in result["results"]:
        if "error" in row:
            cells[row["policy"], row["size"]] = f"error: {row['error']} | -"
        else:
            cells[row["policy"], row["size"]] = f"{row['median_s'] * 1e3:.3f} | {row['ratio']:.1f}x"
    header = "| policy | " + " | ".join(f"n={n} ms | vs sort" for n in sizes) + " |"
    rule = "|---|" + "---:|---:|" * len(sizes)
    lines = [header, rule]
    listed = dict.fromkeys(row["policy"] for row in result["results"])
    for policy in [BASELINE, *(p for p in listed if p != BASELINE)]:
        lines.append(
            f"| {policy} | " + " | ".join(cells.get((policy, n), "- | -") for n in sizes) + " |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: run, print the table, optionally write JSON; return the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000", help="comma-separated queue lengths")
    parser.add_argument("--repeats", type=int, default=15, help="timed runs per policy and size")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random queues")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not sizes or min(sizes) < 1:
        parser.error(f"--sizes must list queue lengths >= 1, got {args.sizes!r}")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    result = run(sizes, args.repeats, args.seed)
    print(
        f"Median `order()` time over {args.repeats} runs (after one warm-up call), Python "
        f"{result['python']} on {result['machine']}; 'vs sort' = ratio to sorting the same queue "
        "by arrival.\n"
    )
    print(markdown(result))
    for module in result["missing_modules"]:
        print(f"\nnot imported: {module}", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
