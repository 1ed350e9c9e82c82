"""Replay results and reports: percentiles, the six targets, starvation, errors, files and plots."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from fairway.replay import results
from fairway.replay.report import to_markdown, write_report
from fairway.replay.results import ReplayResult, RequestResult, ResultError
from fairway.replay.summary import ALL, summarize, ttft_stats
from fairway.replay.targets import six_targets

PHASE_START_S = {"calm": 0.0, "burst": 10.0, "spike": 20.0}


def req(i: int, arrival_s: float, ttft_s: float | None, phase: str | None = None,
        error: str | None = None) -> RequestResult:
    """A request that arrived at `arrival_s` and got its first token `ttft_s` later."""
    first = None if ttft_s is None else arrival_s + ttft_s
    return RequestResult(f"r{i}", arrival_s, phase, 100 + i, None, first, None, error, {"i": i})


def replay(policy: str, ttfts_by_phase: dict[str, Sequence[float]], trace: str = "t",
           errors: dict[str, int] | None = None) -> ReplayResult:
    """One result whose requests have exactly the given TTFTs per phase (plus errored ones)."""
    reqs = []
    for phase, ttfts in ttfts_by_phase.items():
        for j, ttft in enumerate(ttfts):
            reqs.append(req(len(reqs), PHASE_START_S.get(phase, 30.0) + j * 0.1, ttft, phase))
        for j in range((errors or {}).get(phase, 0)):
            reqs.append(req(len(reqs), PHASE_START_S[phase] + 5 + j * 0.1, None, phase,
                            error="HTTP 500: boom"))
    return ReplayResult(policy, trace, {"seed": 1}, reqs, wall_s=1.0, simulated_s=40.0)


# --- percentiles ----------------------------------------------------------------------------------


def test_percentiles_are_numpy_linear_on_known_values() -> None:
    ttfts = [float(i) for i in range(1, 101)]
    assert ttft_stats(ttfts) == pytest.approx((50.5, 90.1, 99.01, 100.0))
    summary = summarize([replay("fcfs", {"calm": list(reversed(ttfts))})])
    row = summary.row("t", "fcfs", "calm")
    assert row is not None
    assert (row.n, row.n_errors) == (100, 0)
    assert (row.median_s, row.p90_s, row.p99_s, row.max_s) == pytest.approx(
        (50.5, 90.1, 99.01, 100.0)
    )
    assert summary.percentile_method == "linear"


def test_empty_phase_has_no_statistics() -> None:
    assert ttft_stats([]) == (None, None, None, None)


# --- the six targets ------------------------------------------------------------------------------

# Three TTFTs [low, median, high] give median = the middle value and p99 = m + 0.98 (high - m).
LPM = {"calm": [0.5, 1.0, 10.0], "burst": [0.5, 1.0, 10.0], "spike": [0.5, 1.0, 10.0]}  # p99 9.82
FCFS = {"calm": [1.0, 2.0, 5.0], "burst": [1.0, 2.0, 5.0], "spike": [1.0, 2.0, 5.0]}  # p99 4.94
FAIRWAY = {
    "calm": [0.5, 1.05, 5.0],  # median 1.05 <= 1.1; p99 4.921 <= 5.434  -> pass, pass
    "burst": [0.5, 1.5, 5.2],  # median 1.5 > 1.1;   p99 5.126 <= 5.434  -> fail, pass
    "spike": [0.5, 1.08, 8.0],  # median 1.08 <= 1.1; p99 7.862 > 5.434  -> pass, fail
}


def test_six_targets_on_hand_made_results() -> None:
    summary = summarize([replay("fcfs", FCFS), replay("lpm", LPM), replay("fairway", FAIRWAY)])
    targets = six_targets(summary, "t")
    fairway = targets["policies"]["fairway"]
    status = {k: v["status"] for k, v in fairway["targets"].items()}
    assert status == {
        "calm.median": "pass", "calm.p99": "pass",
        "burst.median": "fail", "burst.p99": "pass",
        "spike.median": "pass", "spike.p99": "fail",
    }
    assert (fairway["met"], fairway["n_a"], fairway["total"]) == (4, 0, 6)
    assert fairway["targets"]["spike.p99"]["limit_s"] == pytest.approx(1.1 * 4.94)
    assert fairway["targets"]["burst.median"]["reference"] == "lpm"
    # The references against each other: LPM wins every median, FCFS every p99.
    assert targets["policies"]["lpm"]["met"] == 3
    assert targets["policies"]["fcfs"]["met"] == 3


def test_missing_reference_or_phase_is_not_applicable_not_pass() -> None:
    no_lpm = summarize([replay("fcfs", FCFS), replay("fairway", FAIRWAY)])
    fairway = six_targets(no_lpm, "t")["policies"]["fairway"]
    assert [fairway["targets"][f"{p}.median"]["status"] for p in ("calm", "burst", "spike")] == [
        "n/a"
    ] * 3
    assert (fairway["met"], fairway["n_a"]) == (2, 3)  # calm.p99 and burst.p99

    no_spike = {k: v for k, v in FAIRWAY.items() if k != "spike"}
    summary = summarize([replay("fcfs", FCFS), replay("lpm", LPM), replay("fairway", no_spike)])
    fairway = six_targets(summary, "t")["policies"]["fairway"]
    assert fairway["targets"]["spike.median"]["status"] == "n/a"
    assert fairway["targets"]["spike.p99"]["status"] == "n/a"
    assert (fairway["met"], fairway["n_a"]) == (3, 2)


def test_unknown_trace_is_an_error() -> None:
    summary = summarize([replay("fcfs", FCFS)])
    with pytest.raises(ValueError, match="no trace 'nope'"):
        six_targets(summary, "nope")


# --- errors and starvation ------------------------------------------------------------------------


def test_errors_are_counted_not_dropped_and_fail_their_phase() -> None:
    fairway = replay("fairway", FAIRWAY, errors={"calm": 2})
    summary = summarize([replay("fcfs", FCFS), replay("lpm", LPM), fairway])
    calm = summary.row("t", "fairway", "calm")
    assert calm is not None
    assert (calm.n, calm.n_errors, calm.median_s) == (5, 2, pytest.approx(1.05))
    whole = summary.row("t", "fairway", ALL)
    assert whole is not None and (whole.n, whole.n_errors) == (11, 2)
    targets = six_targets(summary, "t")["policies"]["fairway"]["targets"]
    assert targets["calm.median"]["status"] == "fail"
    assert targets["calm.median"]["n_errors"] == 2
    assert "| fairway | calm | 5 | 2 |" in to_markdown(summary)


def test_starvation_flag() -> None:
    starved = replay("lpm", {"calm": [1.0] * 99 + [10.0]})  # p99 = 1.09, max 10 > 3.27
    fine = replay("fcfs", {"calm": [float(i) for i in range(1, 101)]})  # max 100 < 3 x 99.01
    summary = summarize([starved, fine])
    flags = {s.policy: s.starved for s in summary.starvation}
    assert flags == {"lpm": True, "fcfs": False}
    lpm = summary.starvation[0]
    assert (lpm.max_s, lpm.p99_s) == pytest.approx((10.0, 1.09))


# --- ordering and Markdown ------------------------------------------------------------------------


def test_rows_follow_given_policy_order_and_phase_time_order() -> None:
    # Phases listed out of time order in the dict: the report orders them by first arrival.
    shuffled = {"spike": FAIRWAY["spike"], "calm": FAIRWAY["calm"], "burst": FAIRWAY["burst"]}
    summary = summarize([replay("lpm", LPM), replay("fairway", shuffled), replay("fcfs", FCFS)])
    assert summary.phases["t"] == ["calm", "burst", "spike", ALL]
    assert [(r.policy, r.phase) for r in summary.rows][:5] == [
        ("lpm", "calm"), ("lpm", "burst"), ("lpm", "spike"), ("lpm", ALL), ("fairway", "calm"),
    ]
    assert summary.policies["t"] == ["lpm", "fairway", "fcfs"]


def test_duplicate_policy_on_a_trace_is_rejected() -> None:
    with pytest.raises(ValueError, match="two results for policy 'fcfs'"):
        summarize([replay("fcfs", FCFS), replay("fcfs", FCFS)])


def test_markdown_has_phase_rows_and_targets_summary() -> None:
    results_ = [replay("fcfs", FCFS), replay("lpm", LPM), replay("fairway", FAIRWAY)]
    results_.append(replay("fairway", FAIRWAY, trace="t2"))  # a second trace, no references
    md = to_markdown(summarize(results_))
    assert "| fairway | calm | 3 | 0 | 1050.0 | 4210.0 | 4921.0 | 5000.0 |" in md
    assert "| lpm | all | 9 | 0 |" in md
    assert "| policy | t | t2 |" in md
    assert "| fairway | 4/6 | 0/6 (6 n/a) |" in md
    assert "| fcfs | 3/6 | — |" in md
    assert "| fairway | pass | pass | fail | pass | pass | fail | 4/6 |" in md
    assert 'method="linear"' in md


# --- files ----------------------------------------------------------------------------------------


def test_write_report_writes_markdown_json_and_pngs(tmp_path) -> None:
    fairway = replay("fairway", FAIRWAY, errors={"spike": 1})
    paths = write_report([replay("fcfs", FCFS), replay("lpm", LPM), fairway], tmp_path / "out")
    assert set(paths) == {"markdown", "json", "ttft_over_time/t", "cdf/t"}
    for key in ("ttft_over_time/t", "cdf/t"):
        data = paths[key].read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
    report = json.loads(paths["json"].read_text())
    assert report["percentile_method"] == "linear"
    trace = report["traces"]["t"]
    assert trace["targets"]["policies"]["fairway"]["met"] == 3  # spike.median fails on the error
    assert trace["phases"] == ["calm", "burst", "spike", "all"]
    assert paths["markdown"].read_text().startswith("# Replay report")


def test_result_file_round_trip_keeps_errors_and_is_deterministic(tmp_path) -> None:
    result = replay("fairway", FAIRWAY, errors={"burst": 2})
    path = results.save(result, tmp_path / results.file_name(result))
    assert path.name == "t--fairway.json"
    loaded = results.load(path)
    assert loaded == result
    assert loaded.n_errors == 2
    assert [r.error for r in loaded.requests].count("HTTP 500: boom") == 2
    again = results.save(loaded, tmp_path / "again.json")
    assert again.read_bytes() == path.read_bytes()


def test_ttft_is_none_for_errored_requests() -> None:
    r = RequestResult("a", 1.0, None, 10, None, 1.5, None)
    assert r.ttft_s == pytest.approx(0.5)
    r.error = "timeout after 5 s"
    assert r.ttft_s is None


def test_bad_result_file_is_a_clear_error(tmp_path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ResultError, match="not a replay result"):
        results.load(path)
    with pytest.raises(ResultError, match="cannot read"):
        results.load(tmp_path / "missing.json")


# --- hit / miss split -----------------------------------------------------------------------------


def hm_req(i: int, phase: str, ttft: float | None, prompt: int,
           cached: int | None) -> RequestResult:
    """A request of `prompt` tokens, `cached` of them from the prefix cache at admission."""
    arrival = PHASE_START_S[phase] + i * 0.01
    first = None if ttft is None else arrival + ttft
    error = None if ttft is not None else "HTTP 500: boom"
    return RequestResult(f"h{i}", arrival, phase, prompt, None, first, cached, error)


def test_hit_is_half_the_prompt_cached_at_admission() -> None:
    assert results.HIT_SHARE == 0.5
    assert hm_req(0, "calm", 1.0, 1000, 500).hit is True   # exactly half: a hit
    assert hm_req(1, "calm", 1.0, 1000, 499).hit is False
    assert hm_req(2, "calm", 1.0, 1000, 0).hit is False
    assert hm_req(3, "calm", 1.0, 1000, None).hit is None  # not known: neither


def test_hit_miss_split_per_phase_and_overall() -> None:
    reqs = [hm_req(i, "calm", 1.0 + i, 1000, 900) for i in range(3)]        # hits: 1, 2, 3
    reqs += [hm_req(10, "calm", 20.0, 1000, 0)]                           # a miss: 20
    reqs += [hm_req(20, "spike", 0.5, 1000, 800), hm_req(21, "spike", 40.0, 1000, 16)]
    reqs += [hm_req(22, "spike", None, 1000, None)]  # never scheduled: unknown, errored
    result = ReplayResult("lpm", "t", {}, reqs, wall_s=1.0, simulated_s=60.0)
    summary = summarize([result])
    calm = summary.hit_miss_row("t", "lpm", "calm")
    assert calm is not None and calm.available
    assert (calm.n_hit, calm.n_miss, calm.n_unknown) == (3, 1, 0)
    assert (calm.hit_median_s, calm.miss_median_s, calm.miss_max_s) == pytest.approx(
        (2.0, 20.0, 20.0))
    assert calm.hit_p99_s == pytest.approx(2.98)
    assert calm.miss_ttft_share == pytest.approx(20 / 26)
    spike = summary.hit_miss_row("t", "lpm", "spike")
    assert spike is not None and (spike.n_hit, spike.n_miss, spike.n_unknown) == (1, 1, 1)
    whole = summary.hit_miss_row("t", "lpm", ALL)
    assert whole is not None and (whole.n_hit, whole.n_miss, whole.n_unknown) == (4, 2, 1)
    assert whole.miss_median_s == pytest.approx(30.0)
    assert whole.miss_ttft_share == pytest.approx(60 / 66.5)
    md = to_markdown(summary)
    assert "### TTFT by cache hit / miss (ms)" in md
    assert ">= 50% of the prompt" in md
    assert ("| lpm | calm | 3 / 1 | 2000.0 | 2980.0 | 20000.0 | 20000.0 | 20000.0 | 77% | 25% |"
            in md)
    assert "| lpm | spike | 1 / 1 (+1 unknown) |" in md


def test_hit_miss_split_is_unavailable_without_cached_counts(tmp_path) -> None:
    # `replay()` builds requests with cached_tokens=None, as a live server that does not report it.
    live = replay("fcfs", FCFS)
    virtual = ReplayResult("lpm", "t", {}, [hm_req(0, "calm", 1.0, 100, 100)], 1.0, 5.0)
    summary = summarize([live, virtual])
    row = summary.hit_miss_row("t", "fcfs", ALL)
    assert row is not None and not row.available
    assert (row.n_hit, row.n_miss, row.hit_median_s) == (0, 0, None)
    assert "| fcfs | calm | unavailable: the result has no cached-token counts |" in to_markdown(
        summary)
    paths = write_report([live, virtual], tmp_path / "out")
    data = json.loads(paths["json"].read_text())
    assert data["hit_definition"] == results.HIT_DEFINITION
    split = {(h["policy"], h["phase"]): h for h in data["traces"]["t"]["hit_miss"]}
    assert split[("fcfs", "all")]["available"] is False
    assert split[("lpm", "all")]["available"] is True
    assert split[("lpm", "all")]["n_hit"] == 1
    assert split[("lpm", "all")]["hit_median_s"] == pytest.approx(1.0)
