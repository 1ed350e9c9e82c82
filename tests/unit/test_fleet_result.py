"""A fleet replay's result: per-node figures, balance, the table row and its file; the grid's
traces and flags (no engine)."""

from __future__ import annotations

import argparse

import pytest

from fairway import cli
from fairway.errors import FairwayConfigError, TraceError
from fairway.fleet import result as fleet_io
from fairway.fleet.bench import fleet_markdown
from fairway.fleet.result import FleetResult, max_over_mean, node_stats
from fairway.fleet.traces import fleet_trace_label, load_fleet_trace
from fairway.replay.results import ReplayResult, RequestResult


def request(rid: str, node: int | None, ttft: float | None, prompt: int, cached: int | None
            ) -> RequestResult:
    tags = {} if node is None else {"node": node}
    return RequestResult(rid, 1.0, None, prompt, 1.0 if cached is not None else None,
                         None if ttft is None else 1.0 + ttft, cached,
                         None if ttft is not None else "failed", tags)


def fleet() -> FleetResult:
    requests = [
        request("a", 0, 0.5, 1000, 900),   # hit
        request("b", 0, 1.5, 1000, 0),     # miss
        request("c", 1, 0.25, 400, 300),   # hit
        request("d", 1, None, 600, None),  # failed before admission
    ]
    replay = ReplayResult("fairway", "t-N2", {}, requests, 1.0, 10.0)
    return FleetResult(replay, "round-robin", 2, node_stats(requests, [5, 3], "node"))


def test_each_node_gets_its_requests_and_their_figures():
    a, b = fleet().nodes
    assert (a.node, a.requests, a.errors, a.steps) == (0, 2, 0, 5)
    assert a.ttft_p50_s == pytest.approx(1.0) and a.hit_share == 0.5
    assert a.tokens_computed == 100 + 1000
    assert (b.requests, b.errors, b.hit_share, b.tokens_computed) == (2, 1, 1.0, 100 + 600)
    assert b.ttft_p99_s == pytest.approx(0.25)


def test_balance_is_the_busiest_node_over_the_mean():
    assert max_over_mean([3, 1]) == 1.5
    assert max_over_mean([2, 2, 2]) == 1.0
    assert max_over_mean([0, 0]) is None
    assert fleet().balance() == {"tokens_computed": pytest.approx(1100 / 900), "requests": 1.0}


def test_the_row_and_the_table():
    row = fleet().summary()
    assert (row["requests"], row["errors"], row["hit_share"]) == (4, 1, pytest.approx(2 / 3))
    assert row["tokens_computed"] == 1800 and row["node_p99_max_s"] == pytest.approx(1.49)
    text = fleet_markdown([row], 2)
    assert "| round-robin | fairway | 4 | 1 |" in text and "## t-N2" in text


def test_a_fleet_result_round_trips_through_its_file(tmp_path):
    result = fleet()
    path = fleet_io.save(result, tmp_path / fleet_io.file_name(result))
    assert path.name == "t-N2--fairway--round-robin.json"
    back = fleet_io.load(path)
    assert back.nodes == result.nodes and back.router == "round-robin"
    assert [r.to_dict() for r in back.replay.requests] == [
        r.to_dict() for r in result.replay.requests]


def test_fleet_trace_labels_and_bad_loads(tmp_path):
    assert fleet_trace_label("sec-a", True, 4, 1.0) == "sec-a-quick-N4"
    assert fleet_trace_label("sec-a", False, 32, 1.2) == "sec-a-N32-x1.2"
    with pytest.raises(TraceError, match="--load must be a number > 0"):
        load_fleet_trace("sec-a", num_nodes=2, load=0.0)
    trace_file = tmp_path / "t.jsonl"
    trace_file.write_text("")
    with pytest.raises(TraceError, match="is a trace file"):
        load_fleet_trace(str(trace_file), num_nodes=2, load=2.0)


def parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["bench", *argv])


@pytest.mark.parametrize(("argv", "message"), [
    (("--router", "round-robin"), "add --nodes N"),
    (("--load", "1.2"), "add --nodes N"),
    (("--nodes", "3"), "needs a router"),
])
def test_fleet_flags_need_each_other(argv, message):
    from fairway.cli.replay import fleet_config

    with pytest.raises(FairwayConfigError, match=message):
        fleet_config(parse(*argv))


def test_a_fleet_config_from_the_flags():
    from fairway.cli.replay import fleet_config

    config = fleet_config(parse("--nodes", "3", "--router", "round-robin", "--load", "0.9",
                                "--load", "1.2", "--metrics-delay-s", "0"))
    assert (config.num_nodes, config.routers, config.loads) == (3, ("round-robin",), (0.9, 1.2))
    assert config.signals.metrics_delay_s == 0.0 and config.signals.kv_event_delay_s > 0
    assert fleet_config(parse()) is None


@pytest.mark.parametrize("argv", [("--nodes", "0"), ("--nodes", "-2"), ("--load", "0")])
def test_bad_fleet_numbers_are_argument_errors(argv, capsys):
    with pytest.raises(SystemExit):
        parse(*argv)
    assert "must be" in capsys.readouterr().err


def test_an_unknown_router_is_a_user_error_before_any_work(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["bench", "--nodes", "2", "--router", "no-such-router", "--out",
                     str(out)]) == 2
    err = capsys.readouterr().err
    assert "unknown router 'no-such-router'" in err and "round-robin" in err
    assert not out.exists()
