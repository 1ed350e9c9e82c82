"""`fairway profile` against a stub OpenAI-compatible server on 127.0.0.1 (its own thread and loop).

The stub sleeps a + b*L seconds before the first token of an L-token prompt and lists a
`max_model_len`, so the measured table can be compared with the truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from stub_server import serve_app

from fairway import cli, client
from fairway.errors import ProfileError
from fairway.profiling import measured_profile, profiler, step_time
from fairway.profiling import table as profile
from fairway.profiling.profiler import ProfilerError, ProfileSettings
from fairway.supervisor import free_port

pytestmark = pytest.mark.timeout(120)

A_S, B_S = 0.02, 1e-4  # the stub's prefill time: a + b*L
MAX_MODEL_LEN = 1024
LENGTHS = (64, 256, 512)


@dataclass
class Stub:
    """A stub server's settings and what it received."""

    status: int = 200
    max_model_len: int | None = MAX_MODEL_LEN
    url: str = ""
    received: list[dict] = field(default_factory=list)


STUB = web.AppKey("stub", Stub)


async def _completions(request: web.Request) -> web.StreamResponse:
    stub = request.app[STUB]
    body = await request.json()
    stub.received.append(body)
    if stub.status != 200:
        return web.Response(status=stub.status, text='{"error": {"message": "boom"}}')
    await asyncio.sleep(A_S + B_S * len(body["prompt"]))
    choice = {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}
    if not body.get("stream"):
        return web.json_response(choice)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(f"data: {json.dumps(choice)}\n\ndata: [DONE]\n\n".encode())
    return resp


async def _models(request: web.Request) -> web.Response:
    card: dict = {"id": "stub-model", "object": "model"}
    if request.app[STUB].max_model_len is not None:
        card["max_model_len"] = request.app[STUB].max_model_len
    return web.json_response({"object": "list", "data": [card]})


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": "0.0.stub"})


@contextlib.contextmanager
def run_stub(stub: Stub) -> Iterator[Stub]:
    """Serve `stub` (in a thread, so the client's timing cannot slow it down)."""
    app = web.Application()
    app[STUB] = stub
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/version", _version)
    with serve_app(app) as url:
        stub.url = url
        yield stub


@pytest.fixture(scope="module")
def stub() -> Iterator[Stub]:
    with run_stub(Stub()) as s:
        yield s


@pytest.fixture(scope="module")
def outcome(stub: Stub) -> measured_profile.ProfileOutcome:
    stub.received.clear()
    settings = ProfileSettings(lengths=LENGTHS, repeats=3, warmup_rounds=1)
    run = profiler.measure(stub.url + "/v1/", settings)
    return measured_profile.build_profile(run, hardware="unknown", hardware_detected=False)


def test_table_is_valid_non_decreasing_and_near_the_truth(outcome) -> None:
    table = outcome.profile
    assert [n for n, _ in table.points] == list(LENGTHS)
    times = [t for _, t in table.points]
    assert times == sorted(times)
    for n, t in table.points:
        truth = A_S + B_S * n
        # Client-side: the truth plus the local round trip (a few ms on a busy box).
        assert truth * 0.98 <= t <= truth * 1.3 + 0.01, (n, t, truth)
    reloaded = profile.from_json(json.loads(json.dumps(table.to_json())))
    assert reloaded.points == table.points


def test_metadata_says_what_was_measured(outcome) -> None:
    meta = outcome.profile.metadata
    assert meta["source"] == "measured"
    assert (meta["hardware"], meta["hardware_detected"]) == ("unknown", False)
    assert (meta["model"], meta["vllm_version"], meta["max_model_len"]) == (
        "stub-model", "0.0.stub", MAX_MODEL_LEN,
    )
    assert meta["repetitions"] == 3 and meta["warmup_rounds"] == 1
    assert "max_tokens=1" in meta["method"] and "first response token" in meta["method"]
    assert A_S * 0.98 <= meta["overhead_s"] <= A_S * 1.3 + 0.01  # the 1-token round trip
    assert sorted(meta["samples_s"], key=int) == ["1", *map(str, LENGTHS)]
    assert all(len(v) == 3 for v in meta["samples_s"].values())
    assert meta["date"].endswith("+00:00")
    assert set(meta["fit"]) >= {"a_s", "b_s_per_token", "c_s_per_token2"}


def test_fit_follows_the_stub(outcome) -> None:
    for n in LENGTHS:
        truth = A_S + B_S * n
        assert outcome.fit(n) == pytest.approx(truth, rel=0.3, abs=0.01)


def test_requests_are_one_token_cache_proof_prompts(stub: Stub, outcome) -> None:
    bodies = stub.received
    # (1 + 3 lengths) x (1 warm-up + 3 repeats)
    assert len(bodies) == 16
    assert {b["max_tokens"] for b in bodies} == {1}
    assert {b["model"] for b in bodies} == {"stub-model"}
    assert all(b["stream"] is True for b in bodies)
    prompts = [b["prompt"] for b in bodies]
    assert sorted({len(p) for p in prompts}) == [1, *LENGTHS]
    assert all(profiler.FIRST_TOKEN_ID <= t < profiler.DEFAULT_VOCAB_SIZE for p in prompts
               for t in p)
    heads = [tuple(p[:4]) for p in prompts if len(p) >= 4]
    assert len(set(heads)) == len(heads)  # no two prompts share a first block


def test_not_streaming_measures_too(stub: Stub) -> None:
    settings = ProfileSettings(lengths=(128,), repeats=1, warmup_rounds=0, stream=False)
    run = profiler.measure(stub.url, settings)
    assert run.samples[0].median_s >= A_S + B_S * 128
    assert stub.received[-1]["stream"] is False


def test_default_ladder_doubles_up_to_the_longest_prompt() -> None:
    assert profiler.default_lengths(1024) == [128, 256, 512, 1023]
    assert profiler.default_lengths(1025) == [128, 256, 512, 1024]
    assert profiler.default_lengths(100) == [99]


def test_default_ladder_read_from_the_server(stub: Stub) -> None:
    async def info() -> profiler.ServerInfo:
        async with client.new_session() as session:
            return await profiler.fetch_server_info(session, stub.url)

    assert profiler.resolve_lengths(None, asyncio.run(info())) == [128, 256, 512, 1023]


def test_server_error_is_a_clear_error() -> None:
    with run_stub(Stub(status=500)) as s:
        with pytest.raises(ProfilerError, match="HTTP 500") as err:
            profiler.measure(s.url, ProfileSettings(lengths=(64,), repeats=1))
        assert f"{s.url}/v1/completions" in str(err.value)


def test_unreachable_url_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ProfilerError, match="cannot reach the server") as err:
        profiler.measure(url, ProfileSettings(lengths=(64,), repeats=1))
    assert url in str(err.value)


def test_length_above_max_model_len_is_a_clear_error(stub: Stub) -> None:
    stub.received.clear()
    with pytest.raises(ProfilerError, match="max model length is 1024") as err:
        profiler.measure(stub.url, ProfileSettings(lengths=(512, 1024, 4096), repeats=1))
    assert "1024, 4096" in str(err.value) and stub.url in str(err.value)
    assert stub.received == []  # refused before sending anything


def test_no_max_model_len_needs_lengths() -> None:
    with run_stub(Stub(max_model_len=None)) as s, pytest.raises(ProfilerError, match="--lengths"):
        profiler.measure(s.url, ProfileSettings(repeats=1))


def test_non_decreasing_pools_violators() -> None:
    points, adjusted = measured_profile.non_decreasing([(1, 1.0), (2, 3.0), (3, 2.0), (4, 4.0)])
    assert points == [(1, 1.0), (2, 2.5), (3, 2.5), (4, 4.0)]
    assert [(a.prompt_tokens, a.measured_s, a.stored_s) for a in adjusted] == [
        (2, 3.0, 2.5), (3, 2.0, 2.5),
    ]
    assert measured_profile.non_decreasing([(1, 1.0), (2, 2.0)]) == ([(1, 1.0), (2, 2.0)], [])


def test_fit_recovers_a_quadratic() -> None:
    a, b, c = 0.01, 2e-5, 3e-9
    points = [(n, a + b * n + c * n * n) for n in (128, 512, 2048, 8192, 32768)]
    fit = measured_profile.fit_quadratic(points)
    assert (fit.a_s, fit.b_s_per_token, fit.c_s_per_token2) == pytest.approx((a, b, c), rel=1e-6)
    line = measured_profile.fit_quadratic(points[:2])
    assert line.c_s_per_token2 == 0.0 and line(128) == pytest.approx(points[0][1])


def test_the_fit_can_be_saved_as_the_step_time_model(outcome) -> None:
    convex = [profiler.LengthSamples(n, (0.01 + 1e-5 * n + 1e-9 * n * n,)) for n in LENGTHS]
    run = dataclasses.replace(outcome.run, samples=tuple(convex))
    saved = measured_profile.build_profile(run, hardware="h", hardware_detected=False,
                                   step_time="quadratic")
    assert saved.profile.step_time == saved.fit.to_spec()
    assert saved.profile.step_time["kind"] == "quadratic"
    model = step_time.for_profile(profile.from_json(saved.profile.to_json()))
    assert model == saved.fit and model.step_time_s([(0, 512)]) == pytest.approx(saved.fit(512))
    # The default keeps the table as the model: no entry, as before.
    plain = measured_profile.build_profile(run, hardware="h", hardware_detected=False)
    assert plain.profile.step_time is None and "step_time" not in plain.profile.to_json()


def test_a_fit_with_a_negative_coefficient_cannot_price_steps(outcome) -> None:
    concave = [profiler.LengthSamples(n, (0.01 + 1e-4 * n - 5e-8 * n * n,)) for n in LENGTHS]
    run = dataclasses.replace(outcome.run, samples=tuple(concave))
    with pytest.raises(ProfileError, match="c_s_per_token2 must be a finite number >= 0"):
        measured_profile.build_profile(run, hardware="h", hardware_detected=False,
                               step_time="quadratic")


def test_settings_are_checked() -> None:
    with pytest.raises(ProfilerError, match="repeats"):
        ProfileSettings(repeats=0)
    with pytest.raises(ProfilerError, match="lengths"):
        ProfileSettings(lengths=(0, 5))
    assert ProfileSettings(lengths=(512, 128, 128)).lengths == (128, 512)


# --- the command ------------------------------------------------------------------------------


def test_cli_writes_table_and_plot(stub: Stub, tmp_path: Path, capsys) -> None:
    out = tmp_path / "t.json"
    code = cli.main(["profile", "--url", stub.url, "--lengths", "64,128", "--repeats", "2",
                     "--warmup", "0", "-o", str(out), "--hardware", "stub box"])
    assert code == 0
    table = profile.load(out)
    assert [n for n, _ in table.points] == [64, 128]
    assert table.metadata["hardware"] == "stub box"
    assert table.metadata["generated_by"].startswith("fairway profile --url http://127.0.0.1:")
    assert out.with_suffix(".png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "fit: T(L) =" in printed and "overhead" in printed
    # No silent overwrite.
    assert cli.main(["profile", "--url", stub.url, "-o", str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err


def test_cli_errors_name_the_url(tmp_path: Path, capsys) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["profile", "--url", url, "-o", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fairway: error: cannot reach the server") and url in err


def test_cli_rejects_vllm_args_without_model(tmp_path: Path, capsys) -> None:
    code = cli.main(["profile", "--url", "http://127.0.0.1:1", "-o", str(tmp_path / "x.json"),
                     "--", "--max-model-len", "512"])
    assert code == 2
    assert "need --model" in capsys.readouterr().err


def test_cli_rejects_a_port_for_its_own_server(tmp_path: Path, capsys) -> None:
    code = cli.main(["profile", "--model", "/nonexistent", "-o", str(tmp_path / "x.json"),
                     "--", "--port", "8000"])
    assert code == 2
    assert "--port after `--`" in capsys.readouterr().err


def test_command_line_reproduces_the_options() -> None:
    from fairway.cli.profile import command_line

    args = cli.build_parser().parse_args(
        ["profile", "--model", "/m", "--lengths", "64,128", "--repeats", "2", "-o", "o.json",
         "--", "--max-model-len", "512"]
    )
    assert command_line(args, ["--max-model-len", "512"]) == (
        "fairway profile --model /m --lengths 64,128 --repeats 2 --warmup 1 -o o.json "
        "-- --max-model-len 512"
    )


def test_cli_without_cuda_writes_no_load_cost_and_says_so(stub: Stub, tmp_path: Path, capsys,
                                                          monkeypatch) -> None:
    from fairway.profiling import copy_rate

    def no_cuda() -> None:
        raise ProfileError("no CUDA device here (torch.cuda.is_available() is False)")

    monkeypatch.setattr(copy_rate, "cuda_device", no_cuda)
    out = tmp_path / "t.json"
    assert cli.main(["profile", "--url", stub.url, "--lengths", "64", "--repeats", "1",
                     "--warmup", "0", "--no-plot", "-o", str(out),
                     "--hardware", "NVIDIA H100"]) == 0
    assert "load_cost" not in profile.load(out).metadata
    lines = [line for line in capsys.readouterr().err.splitlines() if "load_cost" in line]
    assert len(lines) == 1
    assert "torch.cuda.is_available() is False" in lines[0]
    assert "estimate for the GPU class of 'NVIDIA H100'" in lines[0] and "50 GB/s" in lines[0]


def test_cli_saves_the_measured_load_cost(stub: Stub, tmp_path: Path, monkeypatch) -> None:
    """The CUDA path is replaced by its result: the file carries it and the tier reads it."""
    from fairway.profiling import copy_rate
    from fairway.profiling.load_cost import LoadCost, for_profile

    measured = LoadCost(4096, 2.5e10, 2.0e10, "measured", "pinned copies on cuda:0")
    calls: list[dict] = []

    def fake(**kwargs: object) -> LoadCost:
        calls.append(kwargs)
        return measured

    monkeypatch.setattr(copy_rate, "measure_load_cost", fake)
    out = tmp_path / "t.json"
    assert cli.main(["profile", "--url", stub.url, "--lengths", "64", "--repeats", "1",
                     "--warmup", "0", "--no-plot", "-o", str(out),
                     "--kv-bytes-per-token", "4096"]) == 0
    assert calls == [{"model": "stub-model", "kv_bytes_per_token": 4096, "kv_dtype": None}]
    table = profile.load(out)
    assert table.metadata["load_cost"] == measured.to_json()
    assert for_profile(table) == measured
    assert "--kv-bytes-per-token 4096" in table.metadata["generated_by"]
