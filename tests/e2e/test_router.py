"""vLLM's router (`vllm-router`, the `router` extra) in front of two `fairway serve` nodes on CPU,
driven by vLLM's own client (`vllm bench serve --dataset-name timed_trace`).

Checks the composition docs/deployment.md describes ("Behind vLLM's router"): every request sent
through the router is answered, the router spreads them over both nodes (`round_robin`: one
each in turn, so the split is exact), and on each node Fairway's scheduler placed them (its
`fairway:` series moved) with no fallback to vLLM's order. The nodes, the router and the client
are benchmarks/live_router.py's (its helpers, its trace at a small size), so the benchmark's
path is the one tested. Two CPU servers start side by side (~60-90 s on 2 cores), each model
worker on its own core; the replay is a few seconds.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from fairway import supervisor

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "live_router.py"
ROUTER = Path(sys.executable).with_name("vllm-router")
if not ROUTER.exists():
    pytest.skip("vllm-router is not installed (the `router` extra: FAIRWAY_EXTRAS=router "
                "./scripts/setup.sh)", allow_module_level=True)

#: Small nodes: a 1k context, 128 KV blocks of 32 tokens each, 512-token steps (and the
#: benchmark's node settings: float32, dummy weights, eager).
NODE_ARGS = ("--gpu-memory-utilization", "0.15", "--max-model-len", "1024",
             "--max-num-batched-tokens", "512", "--num-gpu-blocks-override", "128")


def _live_router() -> ModuleType:
    spec = importlib.util.spec_from_file_location("live_router", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_router_spreads_requests_over_two_fairway_nodes(tiny_model: Path, tmp_path: Path) -> None:
    lr = _live_router()
    trace = lr.build(docs=2, doc_tokens=256, hit_tokens=32, hits_per_s=4.0, duration_s=3.0,
                     miss_tokens=512, miss_every_s=2.0)
    export = tmp_path / "trace-vllm-timed.jsonl"
    lr.export_trace(trace, export, "vllm-timed-trace", lr.fidelity.EXPORT_CHUNK_TOKENS)
    client = argparse.Namespace(client_cpus=None, serve=str(tiny_model))
    model = str(tiny_model)
    try:
        with lr.running_nodes(model, "fairway", NODE_ARGS, tmp_path) as nodes, \
                lr.running_router("round_robin", nodes, model,
                                  tmp_path / "router.log") as (router, _):
            before = lr.scrape(nodes)
            result = lr.fidelity.vllm_bench_run(client, trace, "router-e2e", "round_robin",
                                                router.url, model, export,
                                                tmp_path / "bench.json")
            after = lr.scrape(nodes)
    except supervisor.ServerStartError as exc:
        pytest.fail(str(exc))
    logs = "\n".join(f"--- {p.name}\n{supervisor.log_tail(p, 30)}"
                     for p in sorted(tmp_path.glob("*.log")))
    row = lr.measure(result, [lr.node_counts(b, a) for b, a in zip(before, after, strict=True)])
    assert row["requests"] == len(trace)
    assert row["failed"] == 0, f"{row['failed']} failed: {row['errors']}\n{logs}"
    per_node = [c["requests"] for c in row["per_node"]]
    n = len(trace)
    assert sorted(per_node) == [n // 2, n - n // 2], f"round robin split {per_node}\n{logs}"
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        placed = row["per_node"][i]["fairway_placed"]
        assert placed >= per_node[i], f"node {i}: fairway placed {placed}\n{logs}"
        steps = lr.delta(b, a, lr.SERIES["steps"], policy="fairway")
        assert steps and steps > 0, f"node {i}: no fairway:steps_ordered_total\n{logs}"
        assert not lr.delta(b, a, lr.SERIES["fallbacks"]), f"node {i} fell back\n{logs}"
    assert row["cache_hit_share"] and row["cache_hit_share"] > 0, logs  # the documents' hits
