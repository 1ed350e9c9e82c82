"""`benchmarks/scheduler_overhead.py` at a tiny size: every arm and step kind is measured, and the
split into vLLM's own methods and Fairway's own time adds up (a smoke test, not a timing)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "scheduler_overhead.py"


def _load():
    spec = importlib.util.spec_from_file_location("scheduler_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_arm_and_kind_is_split_into_vllm_and_fairway_time(capsys):
    bench = _load()
    report = bench.main(
        ["--sizes", "40", "--policies", "fairway", "lpm", "--steps", "8", "--rounds", "2",
         "--warmup", "1", "--bursts", "1", "--prefixes", "4", "--no-memory"]
    )
    results = [bench.ArmResult(**{k: v for k, v in r.items()}) for r in report["results"]]
    kinds = {(r.arm, r.kind) for r in results}
    for arm in ("vllm", "fairway", "lpm"):
        assert {(arm, "full"), (arm, "prefilling"), (arm, "burst")} <= kinds
        assert (arm, "admit") in kinds or (arm, "busy") in kinds
    for r in results:
        assert 0 <= r.own_median_ms <= r.median_ms + 1e-9
        if r.arm == "vllm":
            assert r.own_median_ms < 0.5  # only the benchmark's own glue runs outside vLLM
            assert r.prepass_ms is None
        else:
            assert r.own_median_ms > 0  # Fairway's hooks ran
        if r.kind == "admit":
            assert r.admitted_mean >= 1 and r.vllm_per_start_ms > 0
        assert len(r.samples_work) == len(r.samples_ms)
        assert all(started >= 0 and finished >= 0 for started, finished in r.samples_work)
        if r.kind == "prefilling":  # every step a sample
            assert len(r.samples_ms) == 8 and r.admitted_mean is not None
            assert sum(s for s, _ in r.samples_work) == pytest.approx(8 * r.admitted_mean)
            assert sum(f for _, f in r.samples_work) > 0  # max_tokens 1: prefilled, finished
            assert r.admitted_mean > 0  # the mean over every step, those that start none included
            if r.arm != "vllm":
                assert r.prepass_ms is not None  # chunked prefills run: the policy plans
        base = next(b for b in results if (b.arm, b.kind) == ("vllm", r.kind))
        assert bench.goal_met(r, base) == "-"  # no goal at 40 waiting
    out = capsys.readouterr().out
    assert "Fairway's own median / p90 ms" in out and "| 40 | burst | Fairway (fairway) |" in out
    assert "| 40 | prefilling | Fairway (fairway) |" in out


def test_the_prefilling_kind_keeps_chunked_prefills_running_on_64_slots():
    """The "prefilling" node: 64 slots, 2,048-token steps, every request one cached prefix plus
    16-8,192 uncached tokens; the queue stays at N while chunked prefills run."""
    bench = _load()
    args = argparse.Namespace(
        prefixes=4, steps=8, tenants=1, policies=["fairway"], running=16, warmup=1, rounds=2
    )
    from fairway.vllm import offline

    work = bench.Workload(offline, args, 40)
    for t in work.prefilling_templates:
        uncached = t.num_tokens - bench.PREFIX_TOKENS
        assert bench.PREFILLING_UNCACHED[0] <= uncached <= bench.PREFILLING_UNCACHED[1]
    node = bench.PrefillNode(work, "fairway", args, prefilling=True)
    assert node.sched.scheduler_config.max_num_seqs == bench.PREFILLING_SLOTS
    node.run(6)
    assert len(node.steps) == 6 and not node.admit and not node.busy
    assert len(node.sched.waiting) == 40 and any(r.num_computed_tokens for r in node.sched.running)


def test_the_goal_is_judged_on_the_added_median():
    """Added = the arm's median minus vLLM's of the same kind, size and run: 1 ms at 1,000
    waiting in every kind that orders a queue, 5 ms at 10,000, 20 ms after a burst of 1,000."""
    bench = _load()
    vllm = bench.ArmResult("vllm", "prefilling", 1_000, median_ms=1.0, p90_ms=1.0)
    row = bench.ArmResult("fairway", "prefilling", 1_000, median_ms=1.5, p90_ms=9.0,
                          own_median_ms=0.9)
    assert bench.added_ms(row, vllm) == 0.5 and bench.goal_met(row, vllm) == "yes"
    row.median_ms = 2.1
    assert bench.goal_met(row, vllm) == "no"
    row.own_median_ms = 0.1  # Fairway's own time alone does not decide it
    assert bench.goal_met(row, vllm) == "no"
    assert bench.goal_met(row, None) == "-"  # no vLLM row to pair with
    assert {kind for (size, kind) in bench.GOALS_MS if size == 10_000} == set(bench.STEADY_KINDS)
    assert bench.GOALS_MS[(10_000, "full")] == 5.0 and bench.GOALS_MS[(1_000, "burst")] == 20.0
    burst = bench.ArmResult("fairway", "burst", 10_000, 1.0, 1.0)
    assert bench.goal_met(burst, bench.ArmResult("vllm", "burst", 10_000, 1.0, 1.0)) == "-"
    assert bench.goal_met(vllm, vllm) == "-"


def test_the_own_added_median_is_paired_with_vllms_glue_and_judged_apart():
    """Own added = Fairway's own median minus vLLM's arm's own median (the harness's glue), same
    kind, size and run; it is judged by the same goals, apart from the added median: a step that
    starts more requests than vLLM's (vLLM's admissions of them in the arm's vLLM part) can miss
    the one and meet the other."""
    bench = _load()
    vllm = bench.ArmResult("vllm", "burst", 1_000, median_ms=6.0, p90_ms=6.5, own_median_ms=1.0)
    row = bench.ArmResult("fairway", "burst", 1_000, median_ms=28.0, p90_ms=29.0,
                          own_median_ms=9.5)
    assert bench.added_ms(row, vllm) == 22.0 and bench.goal_met(row, vllm) == "no"
    assert bench.own_added_ms(row, vllm) == 8.5 and bench.own_goal_met(row, vllm) == "yes"
    row.own_median_ms = 21.5
    assert bench.own_goal_met(row, vllm) == "no"
    assert bench.own_added_ms(vllm, vllm) is None and bench.own_goal_met(vllm, vllm) == "-"
    assert bench.own_goal_met(row, None) == "-"
    table = bench.markdown([vllm, row])
    assert "| 1,000 | burst | Fairway (fairway) | 28.000 | 29.000 | +22.000 | no | +20.500 | no |" \
        in table


def test_the_same_work_added_pairs_steps_that_started_and_finished_as_many():
    """Added at the same work: per (started, finished), the arm's median minus vLLM's, weighted
    by the arm's steps; a kind of step either side has fewer than SAME_WORK_MIN of is left out
    (its share reported); the step totals alone decide it, not the counter's split."""
    bench = _load()
    m = bench.SAME_WORK_MIN
    # vLLM: idle steps 0.3 ms, one start and one finish 1.3 ms; the arm: 1.3 and 2.5 ms, plus
    # steps of two starts vLLM never made (unpaired)
    base_ms = [0.3] * (2 * m) + [1.3] * m
    base_work = [(0, 0)] * (2 * m) + [(1, 1)] * m
    arm_ms = [1.3] * m + [2.5] * (2 * m) + [3.5] * m
    arm_work = [(0, 0)] * m + [(1, 1)] * (2 * m) + [(2, 2)] * m
    added, share = bench.same_work_added(arm_ms, arm_work, base_ms, base_work)
    assert added == pytest.approx((1.0 * m + 1.2 * 2 * m) / (3 * m)) and share == 0.75
    # the plain added median pairs a step that starts one with vLLM's idle median step
    vllm = bench.ArmResult("vllm", "prefilling", 1_000, median_ms=0.3, p90_ms=1.3,
                           samples_ms=base_ms, samples_work=base_work)
    row = bench.ArmResult("fairway", "prefilling", 1_000, median_ms=2.5, p90_ms=3.5,
                          own_median_ms=0.45, samples_ms=arm_ms, samples_work=arm_work)
    assert bench.goal_met(row, vllm) == "no" and bench.same_work_goal_met(row, vllm) == "no"
    row.samples_ms = [0.7] * m + [1.7] * (2 * m) + [2.9] * m  # 0.4 ms more for the same work
    assert bench.same_work_added_ms(row, vllm)[0] == pytest.approx(0.4)
    assert bench.same_work_goal_met(row, vllm) == "yes" and bench.goal_met(row, vllm) == "no"
    assert "| +0.400 (75%) | yes |" in bench.markdown([vllm, row])
    # fewer than SAME_WORK_MIN steps of every kind on one side: nothing to pair
    assert bench.same_work_added([1.0] * (m - 1), [(1, 1)] * (m - 1), base_ms, base_work) is None
    assert bench.same_work_added_ms(vllm, vllm) is None
    assert bench.same_work_goal_met(row, None) == "-"


def test_the_speed_view_scales_own_times_by_vllms_admitting_step():
    """A run where vLLM's own admitting step at 1,000 waiting took 2.8 ms ran 2x slower than the
    reference machine's 1.4 ms: Fairway's own times at 1,000 waiting are halved in the second
    view; without that vLLM row there is no view."""
    bench = _load()
    rows = [
        bench.ArmResult("vllm", "admit", 1_000, 2.8, 3.0),
        bench.ArmResult("fairway", "admit", 1_000, 4.0, 5.0, own_median_ms=1.2),
        bench.ArmResult("fairway", "busy", 1_000, 1.0, 1.2, own_median_ms=0.8),
        bench.ArmResult("fairway", "admit", 10_000, 9.0, 9.0, own_median_ms=3.0),
    ]
    speed = bench.speed_scaled(rows)
    assert speed["scale"] == 0.5
    assert speed["own_1000_scaled_ms"] == {"fairway admit": 0.6, "fairway busy": 0.4}
    line = bench.speed_line(speed)
    assert "2.800 ms here" in line and "fairway admit 0.600" in line
    assert bench.speed_scaled(rows[1:]) is None


def test_the_tier_arm_is_paired_with_its_tierless_arm_and_finds_tier_hits(capsys):
    """`fairway+tier` (the OffloadingConnector configured, its jobs answered) runs beside
    `fairway` and `vllm+tier` on the same workload; the GPU cache holds 1 of 8 prefixes' worth
    (+ the slots' room), so the tier probe finds tier hits, and the tier table pairs the arms."""
    bench = _load()
    report = bench.main(
        ["--sizes", "40", "--policies", "fairway", "fairway+tier", "--steps", "8", "--rounds", "2",
         "--warmup", "1", "--bursts", "1", "--prefixes", "8", "--running", "2",
         "--gpu-prefixes", "1", "--tier-blocks", "8192", "--no-memory"]
    )
    assert report["config"]["tier_blocks"] == 8192 and report["config"]["gpu_prefixes"] == 1
    results = [bench.ArmResult(**r) for r in report["results"]]
    arms = {r.arm for r in results}
    assert arms == {"vllm", "vllm+tier", "fairway", "fairway+tier"}
    for r in results:
        assert 0 <= r.own_median_ms <= r.median_ms + 1e-9 and r.vllm_median_ms > 0
        if r.arm == "fairway+tier" and r.kind in ("admit", "busy", "burst"):
            assert r.tier_lookup_steps > 0
        if r.arm != "fairway+tier":  # only Fairway's probe looks the tier up
            assert r.tier_hits_median is None and r.tier_lookup_steps == 0
    tiered = [r for r in results if r.arm == "fairway+tier" and r.tier_hits_median is not None]
    assert any(r.tier_hits_median > 0 and r.tier_tokens_median > 0 for r in tiered)
    pairs = bench.tier_pairs(results)
    assert {(a.arm, b.arm) for a, b in pairs} == {
        ("vllm", "vllm+tier"), ("fairway", "fairway+tier")
    }
    out = capsys.readouterr().out
    assert "| 40 | burst | Fairway (fairway+tier) |" in out
    assert "| 40 | burst | fairway / fairway+tier |" in out and report["tier_markdown"] in out


def test_a_run_without_a_tier_arm_keeps_its_config_and_rejects_tier_options():
    bench = _load()
    with pytest.raises(SystemExit):
        bench.main(["--policies", "fairway", "--tier-blocks", "100"])
    with pytest.raises(SystemExit):
        bench.main(["--policies", "fairway+bogus"])
    assert bench.arm_parts("fairway+tenants+tier") == ("fairway", frozenset({"tenants", "tier"}))
    assert bench.base_arm("fairway+tier") == "vllm+tier" and bench.base_arm("lpm") == "vllm"
