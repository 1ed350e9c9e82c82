"""Tenants and priorities in traces, results and requests; the `tenants` family and its presets."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from fairway import client
from fairway.errors import TraceError
from fairway.replay import live
from fairway.replay.results import ReplayResult, RequestResult, ResultError
from fairway.replay.results import load as load_result
from fairway.replay.results import save as save_result
from fairway.tenants import TENANT_KEY
from fairway.traces.build import PRESETS, build_preset, build_trace, make_params, rebuild
from fairway.traces.export import timed_trace_rows
from fairway.traces.format import (
    Trace,
    TraceHeader,
    TraceRequest,
    load_trace,
    make_request,
    request_line,
    trace_bytes,
    write_trace,
)
from fairway.traces.shipped import shipped_path
from fairway.traces.tenants import TWO_TENANTS, TenantsParams, parse_tenants

SHORT = "calm:0.6:20,overload:1.5:40,calm:0.6:20"
CAPACITY = 4000.0


def _trace(*reqs: TraceRequest) -> Trace:
    return Trace(TraceHeader("test", 0, None, {}, len(reqs)), reqs)


def _by_class(trace: Trace) -> dict[str, list[TraceRequest]]:
    out: dict[str, list[TraceRequest]] = {}
    for r in trace.requests:
        out.setdefault(r.tags["class"], []).append(r)
    return out


def _hit_share(reqs: list[TraceRequest]) -> float:
    kinds = Counter(r.tags["kind"] for r in reqs)
    return kinds["hit"] / (kinds["hit"] + kinds["miss"])


# ---------------------------------------------------------------------------------- format


def test_tenant_and_priority_round_trip_through_a_file(tmp_path: Path) -> None:
    reqs = (
        make_request("a", 0.0, [("x", 4)], tenant="team-a", priority=2),
        make_request("b", 0.5, [("x", 4)], priority=-1),
        make_request("c", 1.0, [("y", 4)], tenant="team-b"),
        make_request("d", 1.5, [("y", 4)]),
    )
    trace = _trace(*reqs)
    for name in ("t.jsonl", "t.jsonl.gz"):
        again = load_trace(write_trace(trace, tmp_path / name))
        assert again == trace
        assert [(r.tenant, r.priority) for r in again] == [
            ("team-a", 2), (None, -1), ("team-b", 0), (None, 0)]
    lines = [json.loads(line) for line in trace_bytes(trace).decode().splitlines()[1:]]
    assert lines[0]["tenant"] == "team-a" and lines[0]["priority"] == 2
    assert "tenant" not in lines[1] and lines[1]["priority"] == -1
    assert lines[2]["tenant"] == "team-b" and "priority" not in lines[2]
    assert "tenant" not in lines[3] and "priority" not in lines[3]


def test_absent_fields_keep_the_old_bytes() -> None:
    plain = make_request("r", 1.25, [("b", 3)], phase="calm", tags={"k": 1})
    assert request_line(plain) == (
        '{"request_id":"r","arrival_s":1.250000,"blocks":[["b",3]],"max_tokens":1,'
        '"phase":"calm","tags":{"k":1}}')
    tagged = make_request("r", 1.25, [("b", 3)], phase="calm", tags={"k": 1}, tenant="t",
                          priority=3)
    assert request_line(tagged) == request_line(plain)[:-1] + ',"tenant":"t","priority":3}'
    # A shipped trace of before the fields: no request line names them.
    text = gzip.decompress(shipped_path("hit-heavy", quick=True).read_bytes()).decode()
    assert '"tenant"' not in text and '"priority"' not in text


@pytest.mark.parametrize(("field", "value", "message"), [
    ("tenant", "", "tenant must be a non-empty string"),
    ("tenant", 3, "tenant must be a non-empty string"),
    ("priority", True, "priority must be an integer"),
    ("priority", 1.5, "priority must be an integer"),
    ("priority", "1", "priority must be an integer"),
])
def test_bad_tenant_or_priority_is_a_trace_error(field: str, value: object, message: str,
                                                 tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=message):
        TraceRequest("r", 0.0, (("b", 1),), **{field: value})
    good = request_line(make_request("r", 0.0, [("b", 1)]))
    path = tmp_path / "bad.jsonl"
    header = '{"fairway_trace":1,"family":"t","seed":0,"shape":null,"params":{},"num_requests":1}'
    path.write_text(header + "\n" + good[:-1] + f',"{field}":{json.dumps(value)}}}\n')
    with pytest.raises(TraceError, match=f"bad.jsonl:2: {message}"):
        load_trace(path)


def test_export_keeps_tenant_and_priority_only_when_set() -> None:
    rows = timed_trace_rows(_trace(
        make_request("a", 0.0, [("x", 20)], tenant="t", priority=1),
        make_request("b", 0.1, [("x", 20)]),
    ))
    assert (rows[0]["tenant"], rows[0]["priority"]) == ("t", 1)
    assert set(rows[1]) == {"timestamp", "input_length", "output_length", "hash_ids", "request_id"}


# ---------------------------------------------------------------------------------- results


def test_request_result_round_trip_with_and_without_the_fields(tmp_path: Path) -> None:
    with_fields = RequestResult("a", 0.0, "calm", 10, 0.1, 0.2, 5, None, {"k": 1}, "team", 2)
    without = RequestResult("b", 0.0, None, 10, None, None, None, "boom")
    for r in (with_fields, without):
        assert RequestResult.from_dict(r.to_dict()) == r
    assert (without.tenant, without.priority) == (None, 0)
    # A file written before the fields existed loads, with the defaults.
    old = without.to_dict()
    del old["tenant"], old["priority"]
    assert RequestResult.from_dict(old) == without
    result = ReplayResult("fcfs", "t", {}, [with_fields, without], 1.0, 2.0)
    assert load_result(save_result(result, tmp_path / "r.json")) == result
    missing = dict(old)
    del missing["prompt_tokens"]
    with pytest.raises(ResultError, match="prompt_tokens"):
        RequestResult.from_dict(missing)


# ---------------------------------------------------------------------------------- live body


def test_the_live_request_body_carries_priority_and_tenant() -> None:
    body = json.loads(client.completion_body("m", [5, 6], 1, priority=3, tenant="team-a"))
    assert body["priority"] == 3 and body["vllm_xargs"] == {TENANT_KEY: "team-a"}
    plain = json.loads(client.completion_body("m", [5, 6], 1))
    assert "priority" not in plain and "vllm_xargs" not in plain
    req = make_request("r", 0.0, [("b", 4)], tenant="heavy", priority=1, max_tokens=2)
    sent = json.loads(live._payload(req, "model", 1000))
    assert sent["priority"] == 1 and sent["vllm_xargs"] == {"tenant": "heavy"}
    assert sent["prompt"] == req.token_ids(1000) and sent["max_tokens"] == 2
    assert sent["stream_options"] == {"include_usage": True}
    default = json.loads(live._payload(make_request("r", 0.0, [("b", 4)]), "model", 1000))
    assert "priority" not in default and "vllm_xargs" not in default


def test_a_live_result_keeps_the_trace_requests_tenant_and_priority() -> None:
    req = make_request("r", 0.0, [("b", 4)], tenant="heavy", priority=1)
    result = live._Attempt(req, 0.0, sent_s=0.0, first_token_s=0.5, done=True).result()
    assert (result.tenant, result.priority) == ("heavy", 1)


# ---------------------------------------------------------------------------------- vLLM request


def test_make_request_carries_priority_and_tenant() -> None:
    from fairway.vllm import offline  # imports vLLM

    request = offline.make_request("r", [5, 6, 7], 0.0, priority=2, tenant="team-a")
    assert request.priority == 2
    assert request.sampling_params.extra_args == {TENANT_KEY: "team-a"}
    merged = offline.make_request("m", [5], 0.0, tenant="t", extra_args={"other": 1})
    assert merged.sampling_params.extra_args == {"other": 1, TENANT_KEY: "t"}
    plain = offline.make_request("p", [5, 6, 7], 0.0)
    assert plain.priority == 0 and not plain.sampling_params.extra_args


# ---------------------------------------------------------------------------------- family


def test_spec_parsing_and_errors() -> None:
    heavy, light = parse_tenants(TWO_TENANTS)
    assert (heavy.name, heavy.request_tenant, heavy.load, heavy.hits) == ("heavy", "heavy", None,
                                                                          0.9)
    assert (light.load, light.rate, light.miss, light.contexts) == (None, 1.0, (1000, 3000), 2)
    assert heavy.rate == 3.0
    (spec,) = parse_tenants("x:tenant=none:priority=-2:context=1000-2000:contexts=3")
    assert spec.request_tenant is None and spec.priority == -2
    assert spec.context_lengths() == [1000, 1496, 2000]  # whole 16-token steps inside
    for bad, message in [
        ("", "at least one class"),
        ("a:rate=0", "rate must be > 0"),
        ("a:hits=1.5", r"hits must be in \[0, 1\]"),
        ("a:speed=3", "not KEY=VALUE"),
        ("a:contexts=two", "contexts must be an integer"),
        ("a:rate=x", "rate must be a number"),
        ("a:miss=9-3", "miss must be tokens"),
        ("a:hits=0.5:hits=0.6", "hits given twice"),
        ("a,a", "class names must be unique"),
        ("a b", "a class name is"),
        ("a:tenant=x y", "tenant must be a name"),
    ]:
        with pytest.raises(TraceError, match=message):
            make_params("tenants", {"tenants": bad})
    with pytest.raises(TraceError, match="fixed load take 0.9"):
        build_trace("tenants", 0, "a:0.5:10", CAPACITY, tenants="x:load=0.9,y")
    with pytest.raises(TraceError, match="give a class a rate share"):
        build_trace("tenants", 0, "a:0.5:10", CAPACITY, tenants="x:load=0.3")


def test_family_builds_deterministically_and_rebuilds(tmp_path: Path) -> None:
    a = build_trace("tenants", 5, SHORT, CAPACITY)
    assert trace_bytes(a) == trace_bytes(build_trace("tenants", 5, SHORT, CAPACITY))
    assert trace_bytes(a) != trace_bytes(build_trace("tenants", 6, SHORT, CAPACITY))
    path = write_trace(a, tmp_path / "t.jsonl.gz")
    assert trace_bytes(rebuild(load_trace(path).header)) == trace_bytes(a)
    assert a.header.params == {"tenants": TWO_TENANTS, "work_basis": "ideal", "warmup": True,
                               "warmup_spacing_s": 0.5, "max_requests": 20000}
    # Warm-ups first, one per hot context, each class's; every request carries its tenant.
    warm = [r for r in a.requests if r.tags["kind"] == "warmup"]
    assert [r.request_id for r in warm] == [
        "heavy-warmup-00", "heavy-warmup-01", "heavy-warmup-02", "heavy-warmup-03",
        "light-warmup-00", "light-warmup-01"]
    assert [r.arrival_s for r in warm] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    for r in a.requests:
        assert r.request_id.startswith(f"{r.tenant}-") and r.tenant == r.tags["class"]
        if r.tags["kind"] == "hit":
            context = r.blocks[0]
            assert context == next(w.blocks[0] for w in warm
                                   if w.tenant == r.tenant and w.tags["context"] ==
                                   r.tags["context"])
    heavy, light = (len([r for r in a.requests if r.tenant == t and r.phase == "overload"])
                    for t in ("heavy", "light"))
    assert heavy > 2 * light  # 3 x the light tenant's request rate (Poisson draws)


def test_the_heavy_tenant_sends_three_times_the_light_rate_in_every_phase() -> None:
    trace = build_trace("tenants", 1, SHORT, CAPACITY)
    rates = {name: c["rate_per_phase"] for name, c in trace.header.info["classes"].items()}
    work = {name: c["work_per_request_tokens"] for name, c in trace.header.info["classes"].items()}
    for k, load in enumerate((0.6, 1.5, 0.6)):
        assert rates["heavy"][k] == pytest.approx(3 * rates["light"][k], rel=1e-4)
        offered = sum(rates[n][k] * work[n] for n in rates) / CAPACITY
        assert offered == pytest.approx(load, rel=1e-4)
    light_share = rates["light"][1] * work["light"] / CAPACITY / 1.5
    assert 0.2 <= light_share <= 0.3  # a quarter of the work: under its equal share


# ---------------------------------------------------------------------------------- presets


def _ideal_load(trace: Trace, phase: str) -> float:
    """Uncached tokens (infinite cache) of a phase's arrivals over its window, x capacity."""
    seen: set[str] = set()
    work: dict[str, int] = {}
    for r in trace.requests:
        fresh = sum(n for b, n in r.blocks if b not in seen)
        seen.update(b for b, _ in r.blocks)
        work[r.phase] = work.get(r.phase, 0) + fresh
    span = sum(w.end_s - w.start_s for w in trace.header.phases if w.name == phase)
    return work[phase] / span / trace.header.capacity_tps


def test_tenants_preset() -> None:
    trace = build_preset("tenants")
    assert trace.header.seed == PRESETS["tenants"]["seed"] == 9
    assert 300 <= len(trace) <= 1500 and 180 <= trace.header.duration_s <= 300
    classes = _by_class(trace)
    assert set(classes) == {"heavy", "light"}
    assert {(r.tenant, r.priority) for r in classes["heavy"]} == {("heavy", 0)}
    assert {(r.tenant, r.priority) for r in classes["light"]} == {("light", 0)}
    assert 0.85 <= _hit_share(classes["heavy"]) <= 0.95
    assert 0.03 <= _hit_share(classes["light"]) <= 0.2
    for r in classes["heavy"]:
        assert r.prompt_tokens in (7200,)  # a miss, or a 6,000-token context + 1,200
    assert all(1000 <= r.prompt_tokens <= 3000 for r in classes["light"]
               if r.tags["kind"] == "miss")
    # The overload is ~1.5x capacity; the light tenant is a quarter of the work (~0.37x).
    assert 1.3 <= _ideal_load(trace, "overload") <= 1.7
    info = trace.header.info["classes"]
    light = info["light"]["rate_per_phase"][1] * info["light"]["work_per_request_tokens"]
    assert 0.3 <= light / trace.header.capacity_tps <= 0.45
    for k in range(3):  # heavy sends 3x light's request rate in every phase
        ratio = info["heavy"]["rate_per_phase"][k] / info["light"]["rate_per_phase"][k]
        assert ratio == pytest.approx(3, rel=1e-4)


def test_tenants_mixed_preset() -> None:
    trace = build_preset("tenants-mixed")
    assert trace.header.seed == 10 and 300 <= len(trace) <= 1500
    classes = _by_class(trace)
    assert set(classes) == {"chat", "rag", "batch", "agent"}
    for name, reqs in classes.items():
        assert {r.tenant for r in reqs} == {name} and {r.priority for r in reqs} == {0}
    assert _hit_share(classes["chat"]) > 0.8 and _hit_share(classes["agent"]) > 0.85
    assert 0.7 <= _hit_share(classes["rag"]) <= 0.9 and _hit_share(classes["batch"]) == 0
    longest = {n: max(r.prompt_tokens for r in reqs) for n, reqs in classes.items()}
    assert longest["chat"] < 3000 < longest["rag"] < longest["batch"] < longest["agent"]
    assert len(classes["chat"]) == max(len(r) for r in classes.values())
    assert 1.1 <= _ideal_load(trace, "busy") <= 1.5


def test_priority_preset() -> None:
    trace = build_preset("priority")
    assert trace.header.seed == 11 and 300 <= len(trace) <= 1500
    classes = _by_class(trace)
    assert set(classes) == {"interactive", "batch"}
    assert {(r.tenant, r.priority) for r in classes["interactive"]} == {(None, 0)}
    assert {(r.tenant, r.priority) for r in classes["batch"]} == {(None, 1)}
    assert _hit_share(classes["interactive"]) > 0.9
    assert 0.3 <= _hit_share(classes["batch"]) <= 0.7
    # Interactive arrives steadily throughout; the batch backlog only in the first minute.
    assert {r.phase for r in classes["interactive"]} == {"warmup", "burst", "steady"}
    assert max(r.arrival_s for r in classes["batch"]) < 60
    info = trace.header.info["classes"]
    interactive = info["interactive"]["rate_per_phase"][1] * info[
        "interactive"]["work_per_request_tokens"]
    assert interactive / trace.header.capacity_tps == pytest.approx(0.3)
    assert 1.7 <= _ideal_load(trace, "burst") - 0.3 <= 2.6  # the batch class's ~2x


def test_default_params_are_the_tenants_presets() -> None:
    assert make_params("tenants", {}) == TenantsParams()
    assert PRESETS["tenants"]["params"] == {}
