"""The router's delayed view of the fleet (`fairway.fleet.view.DelayedView`), without an engine."""

from __future__ import annotations

import pytest

from fairway.fleet.routing import FleetSignals, FleetView, NodeLoad
from fairway.fleet.view import DelayedView, FleetError

SIGNALS = FleetSignals(metrics_delay_s=0.5, kv_event_delay_s=0.2)


def load(node: int, at: float, waiting: int) -> NodeLoad:
    return NodeLoad(node=node, published_s=at, waiting_requests=waiting, running_requests=1,
                    kv_usage=0.5, active_blocks=10, queued_uncached_tokens=100 * waiting,
                    total_blocks=99)


def test_the_view_is_a_fleet_view_that_starts_idle():
    view = DelayedView([99, 50], SIGNALS)
    assert isinstance(view, FleetView)
    assert view.num_nodes == 2
    first = view.loads()
    assert [(x.node, x.waiting_requests, x.total_blocks) for x in first] == [(0, 0, 99), (1, 0, 50)]
    assert all(0.0 - x.published_s >= SIGNALS.metrics_delay_s for x in first)


def test_a_load_is_seen_only_metrics_delay_after_it_was_published():
    view = DelayedView([99, 99], SIGNALS)
    view.publish_load(load(0, 1.0, waiting=3))
    view.publish_load(load(0, 1.2, waiting=5))
    view.publish_load(load(1, 0.9, waiting=7))
    view.advance(1.45)
    assert [x.waiting_requests for x in view.loads()] == [0, 7]  # node 0's first not yet
    view.advance(1.55)
    assert [x.waiting_requests for x in view.loads()] == [3, 7]  # 1.2's not yet
    view.advance(1.7)
    assert [x.waiting_requests for x in view.loads()] == [5, 7]
    for x in view.loads():
        assert 1.7 - x.published_s >= SIGNALS.metrics_delay_s


def test_a_delay_that_rounds_is_never_shortened():
    # 0.1 + 0.05 = 0.15000000000000002 > 0.15, and 0.15 - 0.1 = 0.04999999999999999 < 0.05:
    # at 0.15 the load is not seen, whatever the sum says
    view = DelayedView([99], FleetSignals(metrics_delay_s=0.05))
    view.publish_load(load(0, 0.1, waiting=1))
    view.advance(0.15)
    assert view.loads()[0].waiting_requests == 0
    view.advance(0.1500001)
    assert view.loads()[0].waiting_requests == 1


def test_kv_events_arrive_kv_event_delay_late_in_time_order_and_once():
    view = DelayedView([99, 99], SIGNALS)
    assert view.kv_events_since(0) == ((), 0)  # the router reads them from its first route
    view.first_route_done()
    view.publish_events(1, 2.0, [(11, True), (12, True)])
    view.publish_events(0, 1.9, [(11, False)])
    view.advance(2.15)
    events, cursor = view.kv_events_since(0)
    assert [(e.node, e.block_hash, e.stored) for e in events] == [(0, 11, False)]
    view.advance(2.2)
    events, cursor = view.kv_events_since(cursor)
    assert [(e.node, e.time_s, e.block_hash, e.stored) for e in events] == [
        (1, 2.0, 11, True), (1, 2.0, 12, True)]
    assert cursor == 3
    assert view.kv_events_since(cursor) == ((), 3)
    with pytest.raises(FleetError, match="cursor 1"):
        view.kv_events_since(1)  # already handed over and dropped


def test_a_router_that_reads_no_events_by_its_first_route_gets_none():
    stopped = []
    view = DelayedView([99], SIGNALS, stop_events=lambda: stopped.append(True))
    view.first_route_done()
    assert view.reads_events is False and stopped == [True]
    view.publish_events(0, 1.0, [(5, True)])
    view.advance(10.0)
    with pytest.raises(FleetError, match="after its first route"):
        view.kv_events_since(0)
