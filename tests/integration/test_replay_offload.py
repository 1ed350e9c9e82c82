"""The virtual replay with a CPU offload tier: vLLM's OffloadingConnector in the engine, the
worker's copies timed by `TierTransfers` (`replay(offload_blocks=...)`, `--kv-offloading-size`)."""

from __future__ import annotations

import json
import math

import pytest

from fairway import cli
from fairway.errors import FairwayConfigError
from fairway.profiling.load_cost import LoadCost
from fairway.profiling.table import from_points
from fairway.replay import results as results_io
from fairway.replay.sim import replay
from fairway.traces.format import Trace, TraceHeader, TraceRequest, write_trace

pytestmark = pytest.mark.integration

OVERHEAD_S = 0.01  # the toy table of test_sim.py: compute ~0.1 ms per token
PROFILE = from_points(
    [(n, OVERHEAD_S + n / 1e4 + (n / 1e4) ** 2) for n in (128, 1_000, 2_048, 4_096, 8_192)],
    constants={"overhead_s": OVERHEAD_S},
)
KV_BYTES = 131_072  # Llama-3.1-8B's bf16 KV per token
#: PCIe 4.0's pinned rate: a block of 16 tokens loads in ~87 us, far below its compute.
PCIE = LoadCost(kv_bytes_per_token=KV_BYTES, h2d_bytes_per_s=24e9, d2h_bytes_per_s=24e9)
#: A link so fast that a copy takes no time on the clock (1e-27 s per token).
INSTANT = LoadCost(kv_bytes_per_token=1, h2d_bytes_per_s=1e27, d2h_bytes_per_s=1e27)
#: A link slower than compute: loading a token costs more than computing it.
SLOW = LoadCost(kv_bytes_per_token=KV_BYTES, h2d_bytes_per_s=1e9, d2h_bytes_per_s=1e9)
GPU_BLOCKS = 200  # 199 usable blocks of 16 tokens: one 2,000-token document and a little more
TIER_BLOCKS = 4 * GPU_BLOCKS


def make_trace(*requests: tuple[str, float, list[tuple[str, int]]]) -> Trace:
    reqs = tuple(
        TraceRequest(rid, arrival, tuple(blocks), phase="calm") for rid, arrival, blocks in requests
    )
    header = TraceHeader(family="test", seed=0, shape=None, params={}, num_requests=len(reqs))
    return Trace(header, reqs)


#: `doc` is computed by a, pushed out of the GPU cache by b and c, and asked for again by d.
EVICTED = make_trace(
    ("a", 0.0, [("doc", 2_000), ("q1", 40)]),
    ("b", 1.0, [("x", 1_500)]),
    ("c", 2.0, [("y", 1_500)]),
    ("d", 3.0, [("doc", 2_000), ("q2", 40)]),
)


def run(trace: Trace, cost: LoadCost | None = None, **kwargs):
    kwargs.setdefault("num_blocks", GPU_BLOCKS)
    if cost is not None:
        kwargs.setdefault("offload_blocks", TIER_BLOCKS)
    return replay(trace, "fcfs", profile=PROFILE, load_cost=cost, **kwargs)


def by_id(result):
    return {r.request_id: r for r in result.requests}


@pytest.fixture(scope="module")
def evicted():
    """The EVICTED trace without a tier and with the three links."""
    return {name: run(EVICTED, cost)
            for name, cost in (("none", None), ("pcie", PCIE), ("instant", INSTANT),
                               ("slow", SLOW))}


def test_an_evicted_prefix_is_loaded_from_the_tier(evicted):
    none, pcie = by_id(evicted["none"]), by_id(evicted["pcie"])
    assert all(r.error is None for run_ in evicted.values() for r in run_.requests)
    gpu_hit = none["d"].cached_tokens
    assert gpu_hit < 2_000  # the GPU cache lost most of the document
    assert pcie["d"].tier_tokens == 2_000 - gpu_hit  # the tier gives the rest back
    assert pcie["d"].cached_tokens == 2_000
    assert [pcie[k].tier_tokens for k in "abc"] == [0, 0, 0]
    assert none["d"].tier_tokens is None
    tier = evicted["pcie"].settings["kv_offloading"]
    assert tier["loads"] == 1 and tier["loaded_tokens"] == pcie["d"].tier_tokens
    assert tier["stores"] >= 3 and tier["stored_tokens"] > 0
    assert tier["blocks"] == TIER_BLOCKS
    assert tier["gib"] == pytest.approx(TIER_BLOCKS * 16 * KV_BYTES / 2**30)
    assert tier["load_cost"] == PCIE.to_json()
    assert tier["load_to_compute"] == pytest.approx(PCIE.load_to_compute(PROFILE))


def test_the_load_takes_its_modelled_time(evicted):
    pcie, instant = by_id(evicted["pcie"])["d"], by_id(evicted["instant"])["d"]
    load_s = PCIE.load_s(pcie.tier_tokens)
    # d waits in WAITING_FOR_REMOTE_KVS while its blocks load, then runs its 40 new tokens
    assert instant.first_scheduled_s == pytest.approx(3.0)
    assert pcie.first_scheduled_s == pytest.approx(3.0 + load_s, rel=1e-12)
    assert pcie.first_token_s == pytest.approx(instant.first_token_s + load_s, rel=1e-12)
    assert evicted["pcie"].settings["kv_offloading"]["load_s"] == pytest.approx(load_s)


def test_the_tier_pays_when_compute_dominates_and_not_when_the_link_does(evicted):
    ttft = {name: by_id(result)["d"].ttft_s for name, result in evicted.items()}
    assert ttft["instant"] < ttft["pcie"] < ttft["none"]  # loading beats recomputing
    assert ttft["slow"] > ttft["none"]  # vLLM loads whatever hits, even over a slow link
    # the other requests are untouched (nothing they need is loaded; no flush delays them)
    for name in ("pcie", "instant", "slow"):
        assert evicted[name].settings["kv_offloading"]["flush_wait_s"] == 0.0
        tiered, plain = by_id(evicted[name]), by_id(evicted["none"])
        for rid in "abc":
            assert tiered[rid].first_token_s == plain[rid].first_token_s


def unique(gap_s: float, n: int = 8) -> Trace:
    return make_trace(*[(f"u{i}", i * gap_s, [(f"x{i}", 1_500)]) for i in range(n)])


def test_without_hits_spaced_requests_get_the_tierless_times():
    """Stores run beside compute: with time between requests they delay nothing."""
    trace = unique(0.5)
    base, tiered = run(trace), run(trace, PCIE)
    tier = tiered.settings["kv_offloading"]
    assert tier["loads"] == 0 and tier["stores"] > 0 and tier["flushes"] == 0
    assert all(r.tier_tokens == 0 for r in tiered.requests)
    assert [r.first_token_s for r in tiered.requests] == [r.first_token_s for r in base.requests]


def test_without_hits_back_to_back_requests_wait_for_flushed_stores():
    """A tiny GPU cache reuses a finished request's blocks at once: vLLM flushes their pending
    store first (`jobs_to_flush`) and the step waits, so the first tokens come later, by at
    most the flush waits."""
    trace = unique(0.0)
    base, tiered = run(trace), run(trace, PCIE)
    tier = tiered.settings["kv_offloading"]
    assert tier["loads"] == 0 and tier["flushes"] > 0 and tier["flush_wait_s"] > 0
    delays = [t.first_token_s - b.first_token_s
              for t, b in zip(tiered.requests, base.requests, strict=True)]
    assert min(delays) >= 0.0
    assert max(delays) == pytest.approx(tier["flush_wait_s"], rel=1e-9)
    assert tiered.n_errors == 0


def test_without_the_tier_the_result_is_the_same_bytes():
    plain = run(EVICTED)
    explicit = replay(EVICTED, "fcfs", profile=PROFILE, num_blocks=GPU_BLOCKS,
                      kv_offloading_gib=None, offload_blocks=None, load_cost=PCIE)

    def without_wall(result):
        data = result.to_dict()
        data.pop("wall_s")
        return json.dumps(data, sort_keys=True)

    assert without_wall(plain) == without_wall(explicit)
    assert "kv_offloading" not in plain.settings
    assert all("tier_tokens" not in r.to_dict() for r in plain.requests)


def test_gib_are_converted_to_blocks_of_the_load_costs_kv(tmp_path):
    result = run(EVICTED, PCIE, offload_blocks=None, kv_offloading_gib=0.5)
    tier = result.settings["kv_offloading"]
    assert tier["gib"] == 0.5
    assert tier["blocks"] == math.floor(0.5 * 2**30 / (KV_BYTES * 16)) == 256
    assert by_id(result)["d"].tier_tokens > 0
    # the tier field survives a result file; files without a tier do not get it
    back = results_io.load(results_io.save(result, tmp_path / "r.json"))
    assert [r.tier_tokens for r in back.requests] == [r.tier_tokens for r in result.requests]
    assert back.settings["kv_offloading"] == tier


@pytest.mark.parametrize("kwargs, match", [
    ({"kv_offloading_gib": 0.0}, "kv-offloading-size"),
    ({"kv_offloading_gib": -1.0}, "kv-offloading-size"),
    ({"kv_offloading_gib": 1e-9}, "holds no block"),
    ({"offload_blocks": 0}, "offload_blocks"),
    ({"kv_offloading_gib": 1.0, "offload_blocks": 10}, "not both"),
])
def test_bad_tier_sizes_are_refused(kwargs, match):
    with pytest.raises(FairwayConfigError, match=match):
        replay(EVICTED, "fcfs", profile=PROFILE, num_blocks=GPU_BLOCKS, **kwargs)


def test_bench_flag(tmp_path):
    trace_file = write_trace(EVICTED, tmp_path / "evicted.jsonl")
    out = tmp_path / "out"
    argv = ["bench", "--trace", str(trace_file), "--policy", "fcfs", "--num-blocks",
            str(GPU_BLOCKS), "--workers", "0", "--no-progress", "--out", str(out)]
    assert cli.main([*argv, "--kv-offloading-size", "0.5"]) == 0
    (path,) = (out / "replays").glob("*.json")
    data = json.loads(path.read_text())
    assert data["settings"]["kv_offloading"]["blocks"] == 256
    assert data["settings"]["kv_offloading"]["load_cost"]["source"] == "estimate"
    assert sum(r["tier_tokens"] for r in data["requests"]) > 0


@pytest.mark.parametrize("value", ["0", "-2", "nan", "inf", "lots"])
def test_bench_flag_refuses_sizes_that_are_not_positive(value, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--kv-offloading-size", value])
    assert exc.value.code == 2
    assert "--kv-offloading-size: must be a number > 0" in capsys.readouterr().err


def test_bench_flag_refuses_a_size_below_one_block(tmp_path, capsys):
    trace_file = write_trace(EVICTED, tmp_path / "evicted.jsonl")
    code = cli.main(["bench", "--trace", str(trace_file), "--policy", "fcfs", "--workers", "0",
                     "--no-progress", "--out", str(tmp_path / "out"),
                     "--kv-offloading-size", "1e-9"])
    assert code == 2
    assert "holds no block" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything is written
