#!/usr/bin/env python
"""How much of `fairway/` one contested step executes: distinct lines, functions and files.

A maintainer's measure of how much stands between vLLM's `schedule()` and the decision: one
contested `schedule()` of `fairway` at 1,000 waiting requests (a third of them hits on a cached
4,096-token document, the others misses of 800 / 4,000 / 9,000 tokens), run under `sys.settrace`
after four untraced steps. Prints the count of distinct lines executed per file, the functions
called (with how many calls) and how many times the rule (`FairwayPolicy._rule`) ran. Adapted
from ../shared/tools/trace_step.py.

Run from the repository root: .venv/bin/python benchmarks/trace_step.py
"""

from __future__ import annotations

import collections
import random
import sys
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fairway.policies import fairway as fairway_rule  # noqa: E402
from fairway.vllm.offline import make_offline_scheduler, make_request, step  # noqa: E402


def main() -> dict[str, int]:
    random.seed(0)
    sched = make_offline_scheduler("fairway", max_num_batched_tokens=2048, max_num_seqs=64,
                                   num_blocks=40000)
    clock = [1000.0]
    sched.set_fairway_clock(lambda: clock[0])
    doc = [random.randrange(1, 30000) for _ in range(4096)]
    sched.add_request(make_request("warm", doc, arrival_time=0.0))
    for _ in range(5):
        step(sched)
    for i in range(1000):
        if i % 3 == 0:
            tokens = doc[:2048] + [random.randrange(1, 30000) for _ in range(200)]
        else:
            tokens = [random.randrange(1, 30000)
                      for _ in range(random.choice([800, 4000, 9000]))]
        sched.add_request(make_request(f"r{i}", tokens, arrival_time=1.0 + i * 0.001))
    for _ in range(4):
        clock[0] += 0.05
        step(sched)
    root = str(ROOT / "fairway") + "/"
    lines: set[tuple[str, int]] = set()
    funcs: collections.Counter[tuple[str, str, int]] = collections.Counter()

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        name = frame.f_code.co_filename
        if not name.startswith(root):
            return trace
        if event == "call":
            funcs[(name[len(root):], frame.f_code.co_name, frame.f_code.co_firstlineno)] += 1
        if event == "line":
            lines.add((name, frame.f_lineno))
        return trace

    rules = [0]
    rule = fairway_rule.FairwayPolicy._rule

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        rules[0] += 1
        return rule(self, *args, **kwargs)

    fairway_rule.FairwayPolicy._rule = counted  # type: ignore[method-assign]
    clock[0] += 0.05
    sys.settrace(trace)
    sched.schedule()
    sys.settrace(None)
    fairway_rule.FairwayPolicy._rule = rule  # type: ignore[method-assign]
    plan = sched.fairway_last_plan
    assert plan is not None and plan.contested, "the traced step was not contested"
    by_file = collections.Counter(name[len(root):] for name, _ in lines)
    print(f"waiting {len(sched.waiting)}, running {len(sched.running)}; the rule ran "
          f"{rules[0]} time(s)")
    print(f"distinct fairway/ lines executed in one contested schedule(): {len(lines)}")
    for name, count in by_file.most_common():
        print(f"  {name}: {count}")
    print(f"distinct fairway/ functions called: {len(funcs)}, in {len(by_file)} files")
    for (name, function, first), calls in sorted(funcs.items()):
        print(f"  {name}:{first} {function} x{calls}")
    return {"lines": len(lines), "functions": len(funcs), "files": len(by_file),
            "rule_calls": rules[0]}


if __name__ == "__main__":
    main()
