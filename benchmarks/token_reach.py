"""Fairway's own time per step with one of its speed-ups on and off, on one node, step by step.

Each switch leaves Fairway's decisions as they are, so one node can flip it every step: the two
sides see the same queues in the same minutes of a shared machine, which separate runs do not.
- `reach` (default): order only the waiting requests vLLM's scan can read by tokens when that is
  fewer than the free slots (`StepPrepass.tokens_reach`, docs/design.md "How far vLLM reads, by
  tokens"; the same decisions: tests/unit/test_fairway_reference.py,
  tests/integration/test_head_order.py).
- `lane-bound`: bound each lane head's selection by the same selection over the queue's first
  rows (`lanes.LEAD_MIN`; exact: tests/unit/test_fairway_fast_paths.py).
- `early-free`: drop the last order right after reading the queue, while its requests are in the
  cache (`StepPrepass.free_last_early`).
- `exact-widen`: when vLLM's scan may read past the first placements ordered exactly, order twice
  as many before the whole head (`fairway.EXACT_WIDEN`; off: 1, the whole head at once; the same
  decisions: tests/integration/test_head_order.py).
- `kept-bound`: find each lane head among the rows within a bound kept from the last step
  (`lanes.HeadBound`; off: the selection every step; exact: tests/unit/test_fairway_fast_paths.py).
The nodes are `scheduler_overhead.py`'s: the "admit" / "busy" node (16 slots) and the
"prefilling" node (64 slots, chunked prefills always running), N waiting (`--size`). Each pair
of steps runs on/off or off/on, alternating. Timing: Fairway's own CPU time of the step (the
harness's: the step minus vLLM's own methods, arrivals' `add_request` included); the table gives
the median per kind and side, and off / on.

Run: `python benchmarks/token_reach.py [--switch reach] [--size 1000] [--steps 400]`.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

# Runnable as a plain script from a checkout: the repository root and this folder on the path.
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

SIDES = ("on", "off")
SWITCHES = ("reach", "lane-bound", "early-free", "exact-widen", "kept-bound")


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--switch", choices=SWITCHES, default="reach",
                        help="the speed-up switched on and off")
    parser.add_argument("--size", type=int, default=1_000, help="waiting requests")
    parser.add_argument("--steps", type=int, default=400, help="measured steps per node")
    parser.add_argument("--prefixes", type=int, default=40, help="shared cached prefixes")
    args = parser.parse_args(argv)
    if args.size < 1 or args.steps < 2 or args.prefixes < 1:
        parser.error("--size and --prefixes must be >= 1, --steps >= 2")

    import scheduler_overhead as harness

    from fairway.policies import fairway as fairway_rule
    from fairway.policies import lanes
    from fairway.vllm import offline

    lead_min, widen = lanes.LEAD_MIN, fairway_rule.EXACT_WIDEN
    switch = {  # (the node's pre-pass, on?) -> None
        "reach": lambda prepass, on: setattr(prepass, "tokens_reach", on),
        "lane-bound": lambda _, on: setattr(lanes, "LEAD_MIN", lead_min if on else sys.maxsize),
        "early-free": lambda prepass, on: setattr(prepass, "free_last_early", on),
        "exact-widen": lambda _, on: setattr(fairway_rule, "EXACT_WIDEN", widen if on else 1),
        "kept-bound": lambda prepass, on: kept_bounds(prepass.policy, on),
    }[args.switch]

    setup = argparse.Namespace(prefixes=args.prefixes, steps=args.steps, tenants=1,
                               policies=["fairway"], running=16, warmup=5)
    work = harness.Workload(offline, setup, args.size)
    own: dict[str, dict[str, list[float]]] = {}
    for prefilling in (False, True):
        node = harness.PrefillNode(work, "fairway", setup, prefilling=prefilling)
        prepass = node.sched.fairway_prepass
        gc.collect()
        gc.disable()
        try:
            for step in range(args.steps):
                side = SIDES[(step + step // 2) % 2]  # on, off, off, on, on, off, ...
                switch(prepass, side == "on")
                sample, _ = node._step()
                kind = "prefilling" if prefilling else ("admit" if sample.admitted else "busy")
                own.setdefault(kind, {s: [] for s in SIDES})[side].append(
                    (sample.total_s - sample.vllm_s) * 1e3)
        finally:
            gc.enable()
            lanes.LEAD_MIN, fairway_rule.EXACT_WIDEN = lead_min, widen
        assert node.sched.fairway_totals.policy_fallbacks == 0
    summary = {
        kind: {side: statistics.median(v) if v else float("nan") for side, v in by.items()}
        for kind, by in own.items()
    }
    print(f"| {args.size:,} waiting, {args.steps} steps per node | steps on / off | "
          f"own ms, {args.switch} on | own ms, off | off / on |")
    print("|---|---:|---:|---:|---:|")
    for kind, medians in summary.items():
        counts = " / ".join(str(len(own[kind][s])) for s in SIDES)
        print(f"| {kind} | {counts} | {medians['on']:.3f} | {medians['off']:.3f} | "
              f"{medians['off'] / medians['on']:.2f} |")
    return summary


def kept_bounds(policy: object, on: bool) -> None:
    """The `kept-bound` switch: the policy's two `HeadBound`s, or None (the bounds survive an
    off step untouched, as a step without them leaves them)."""
    kept = policy.__dict__.setdefault("_bounds_kept", (policy._fair_bound, policy._fast_bound))
    policy._fair_bound, policy._fast_bound = kept if on else (None, None)


if __name__ == "__main__":
    main()
