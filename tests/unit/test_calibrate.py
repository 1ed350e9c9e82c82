"""Self-calibration from step times: the fit (`fairway.profiling.calibration`) and the
scheduler's side (`fairway.vllm.calibrate`, which reads vLLM objects but imports no vLLM).

Synthetic engine: step_s = o + b*tokens + c*pairs with multiplicative noise; the calibrator must
recover T(L) within a few % and follow a change of the engine.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from fairway.policies.fairway import FairwayPolicy
from fairway.profiling import step_time
from fairway.profiling.calibration import (
    CalibrationSettings,
    StepTimeCalibrator,
    chunk_features,
)
from fairway.profiling.step_time import CalibratedFit
from fairway.profiling.table import from_json
from fairway.vllm import calibrate, internals
from fairway.vllm.calibrate import SchedulerCalibration

CHUNK = 2048
TRUTH = CalibratedFit(overhead_s=0.004, per_token_s=3e-5, per_pair_s=2e-9)
LENGTHS = (256, 2048, 8192, 32768)


def synthetic_step(rng: random.Random) -> list[tuple[int, int]]:
    """A mixed batch: some decodes, some prefill chunks, at most CHUNK tokens in all."""
    chunks: list[tuple[int, int]] = []
    budget = CHUNK
    for _ in range(rng.randint(1, 8)):
        if budget <= 0:
            break
        if rng.random() < 0.4:
            chunks.append((1, rng.randint(100, 8000)))  # a decode
            budget -= 1
        else:
            n = min(budget, rng.randint(16, CHUNK))
            chunks.append((n, rng.choice([0, rng.randint(0, 30000)])))  # a chunk, maybe late
            budget -= n
    return chunks


def feed(cal: StepTimeCalibrator, truth: CalibratedFit, steps: int, seed: int = 0,
         noise: float = 0.03) -> None:
    rng = random.Random(seed)
    for _ in range(steps):
        chunks = synthetic_step(rng)
        tokens, pairs = chunk_features(chunks)
        cal.observe(chunks, truth.step_s(tokens, pairs) * rng.gauss(1.0, noise))


def test_converges_to_the_synthetic_engine() -> None:
    cal = StepTimeCalibrator(CHUNK)
    feed(cal, TRUTH, 3000)
    assert cal.ready
    for n in LENGTHS:
        assert cal.prefill_s(n) == pytest.approx(TRUTH.prefill_s(n, CHUNK), rel=0.03), n
    model = cal.model()
    assert model.overhead_s >= 0 and model.per_token_s >= 0 and model.per_pair_s >= 0


def test_follows_a_changed_engine() -> None:
    cal = StepTimeCalibrator(CHUNK, CalibrationSettings(half_life_steps=300))
    feed(cal, TRUTH, 1500)
    slower = CalibratedFit(0.006, 6e-5, 4e-9)  # e.g. a neighbour on the same GPU
    feed(cal, slower, 3000, seed=1)
    for n in LENGTHS:
        assert cal.prefill_s(n) == pytest.approx(slower.prefill_s(n, CHUNK), rel=0.05), n


def test_not_ready_before_enough_varied_steps() -> None:
    cal = StepTimeCalibrator(CHUNK)
    assert not cal.ready and cal.prefill_s(1024) is None and cal.profile(4096) is None
    for _ in range(500):  # every step the same shape: o, b and c cannot be told apart
        cal.observe([(CHUNK, 0)], 0.1)
    assert cal.num_used == 500 - cal.settings.skip_steps
    assert not cal.ready


def test_first_steps_and_empty_steps_are_skipped() -> None:
    cal = StepTimeCalibrator(CHUNK, CalibrationSettings(skip_steps=2))
    assert not cal.observe([(100, 0)], 1.0)
    assert not cal.observe([(100, 0)], 1.0)
    assert not cal.observe([], 1.0)
    assert not cal.observe([(100, 0)], float("nan"))
    assert cal.observe([(100, 0)], 0.01)
    assert (cal.num_seen, cal.num_used) == (5, 1)


def test_outliers_are_ignored_unless_they_persist() -> None:
    settings = CalibrationSettings(max_outliers_in_a_row=4)
    cal = StepTimeCalibrator(CHUNK, settings)
    feed(cal, TRUTH, 1000)
    before = cal.prefill_s(2048)
    assert not cal.observe([(512, 0)], 100.0)  # a 100 s step: a GC pause, a compilation
    assert cal.num_outliers == 1 and cal.prefill_s(2048) == before
    for _ in range(3):
        cal.observe([(512, 0)], 100.0)
    assert cal.num_outliers == 3  # the 4th in a row was taken as real


def test_coefficients_stay_non_negative() -> None:
    cal = StepTimeCalibrator(CHUNK)
    feed(cal, CalibratedFit(0.01, 1e-5, 0.0), 2000, noise=0.05)  # no attention term at all
    model = cal.model()
    assert model.per_pair_s >= 0 and model.per_token_s > 0 and model.overhead_s > 0


def test_snapshot_is_a_valid_profile_close_to_the_fit() -> None:
    cal = StepTimeCalibrator(CHUNK)
    feed(cal, TRUTH, 2000)
    table = cal.profile(10_000, model_name="m")
    assert table is not None
    lengths = [n for n, _ in table.points]
    assert lengths[0] == 64 and lengths[-1] == 10_000 and lengths == sorted(set(lengths))
    assert table.metadata["source"] == "self-calibrated" and table.metadata["model_name"] == "m"
    for n in (100, 700, 3000, 9000):  # between points: linear interpolation of the curve
        assert table.prefill_s(n) == pytest.approx(cal.prefill_s(n), rel=0.03)


def test_snapshot_saves_the_fit_as_its_step_time_model() -> None:
    cal = StepTimeCalibrator(CHUNK)
    feed(cal, TRUTH, 2000)
    table = cal.profile(10_000)
    assert table.step_time == {**cal.model().to_spec(), "kind": "calibrated"}
    # Through the file format and back: the replay then prices steps with the fit itself.
    reloaded = from_json(table.to_json())
    assert step_time.for_profile(reloaded) == cal.model()


def test_prefill_model_counts_chunks() -> None:
    model = CalibratedFit(0.01, 0.0, 0.0)
    assert model.prefill_s(1, 512) == pytest.approx(0.01)
    assert model.prefill_s(512, 512) == pytest.approx(0.01)
    assert model.prefill_s(513, 512) == pytest.approx(0.02)
    assert chunk_features([(4, 0), (1, 10)]) == (5.0, 4 * 2.5 + 11)


# --- the vLLM adapter, with a SchedulerOutput-shaped stand-in -------------------------------------


def fake_output(new: list[tuple[str, int, int]], cached: list[tuple[str, int, int]]):
    """(req_id, scheduled tokens, computed before) for new and continuing requests."""
    scheduled = {rid: n for rid, n, _ in new + cached}
    return SimpleNamespace(
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_new_reqs=[SimpleNamespace(req_id=r, num_computed_tokens=p) for r, _, p in new],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[r for r, _, _ in cached], num_computed_tokens=[p for _, _, p in cached]
        ),
    )


def test_step_chunks_reads_new_and_continuing_requests() -> None:
    out = fake_output([("a", 300, 6000), ("b", 548, 0)], [("c", 1, 900), ("d", 0, 5)])
    assert internals.step_chunks(out) == [(300, 6000), (548, 0), (1, 900)]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def recording_calibration(clock: FakeClock) -> tuple[SchedulerCalibration, list[float]]:
    cal = SchedulerCalibration(StepTimeCalibrator(CHUNK), max_model_len=4096, clock=clock)
    seen: list[float] = []
    cal.observe_step = lambda output, seconds: seen.append(seconds)  # type: ignore[method-assign]
    return cal, seen


def test_step_time_in_a_synchronous_engine() -> None:
    clock = FakeClock()
    cal, seen = recording_calibration(clock)
    for start in (0.0, 10.0):  # idle time between steps does not count
        out = fake_output([("a", 100, 0)], [])
        clock.now = start
        cal.on_schedule(out)
        clock.now = start + 0.25
        cal.on_update(out)
    assert seen == [0.25, 0.25]


def test_step_time_with_async_scheduling() -> None:
    clock = FakeClock()
    cal, seen = recording_calibration(clock)
    first, second = fake_output([("a", 100, 0)], []), fake_output([("b", 100, 0)], [])
    cal.on_schedule(first)  # t=0
    clock.now = 0.01
    cal.on_schedule(second)  # scheduled while the first runs
    clock.now = 0.30
    cal.on_update(first)
    clock.now = 0.50
    cal.on_update(second)  # ran from 0.30 (when the first finished) to 0.50
    assert seen == pytest.approx([0.30, 0.20])


def test_empty_steps_are_not_observed() -> None:
    clock = FakeClock()
    cal, seen = recording_calibration(clock)
    out = fake_output([], [])
    cal.on_schedule(out)
    clock.now = 1.0
    cal.on_update(out)
    assert seen == []


def test_refresh_swaps_the_policy_profile_and_sets_the_gauge() -> None:
    policy = FairwayPolicy()
    assert policy.profile is None
    labels = {"model_name": "test-calibrate", "engine": "0", "policy": "fairway"}
    cal = SchedulerCalibration(
        StepTimeCalibrator(CHUNK, CalibrationSettings(refresh_steps=500)),
        max_model_len=8192, policy=policy, labels=labels,
    )
    rng = random.Random(3)
    for _ in range(1000):
        chunks = synthetic_step(rng)
        new = [(f"r{i}", n, p) for i, (n, p) in enumerate(chunks)]
        tokens, pairs = chunk_features(chunks)
        cal.observe_step(fake_output(new, []), TRUTH.step_s(tokens, pairs))
    assert cal.profile is not None and policy.profile is cal.profile
    assert policy.patience_s(8192) == pytest.approx(3 * TRUTH.prefill_s(8192, CHUNK), rel=0.03)
    for n in (512, 2048, 8192):
        value = REGISTRY.get_sample_value(
            "fairway:calibrated_prefill_seconds", {**labels, "prompt_tokens": str(n)}
        )
        assert value == pytest.approx(cal.profile.prefill_s(n)), n
    # Lengths above max_model_len are not published.
    assert REGISTRY.get_sample_value(
        "fairway:calibrated_prefill_seconds", {**labels, "prompt_tokens": "32768"}
    ) is None


def test_off_by_default() -> None:
    from fairway.options import FairwayOptions

    options = FairwayOptions.resolve({})
    assert options.self_calibrate is False
    scheduler = SimpleNamespace(
        fairway_options=options, fairway_policy=FairwayPolicy(), fairway_metrics=None,
        vllm_config=SimpleNamespace(
            scheduler_config=SimpleNamespace(max_num_batched_tokens=2048),
            model_config=SimpleNamespace(max_model_len=4096),
        ),
    )
    assert calibrate.for_scheduler(scheduler) is None
    scheduler.fairway_options = SimpleNamespace(self_calibrate=True)
    made = calibrate.for_scheduler(scheduler)
    assert made is not None and made.calibrator.chunk_tokens == 2048
    assert made.policy is scheduler.fairway_policy and made.max_model_len == 4096


def test_option_is_a_serving_option() -> None:
    from fairway.options import SERVING_OPTIONS, FairwayOptions

    assert "self_calibrate" in SERVING_OPTIONS

    assert FairwayOptions.resolve({}).self_calibrate is False
    assert FairwayOptions.resolve({"self_calibrate": True}).self_calibrate is True
    assert FairwayOptions.resolve({}, {"FAIRWAY_SELF_CALIBRATE": "true"}).self_calibrate is True


def test_step_log_alone_writes_every_step_and_leaves_the_policy_alone(tmp_path) -> None:
    import json

    path = tmp_path / "steps.jsonl"
    policy = FairwayPolicy()
    scheduler = SimpleNamespace(
        fairway_options=SimpleNamespace(self_calibrate=False, step_log=str(path)),
        fairway_policy=policy, fairway_metrics=None,
        vllm_config=SimpleNamespace(
            scheduler_config=SimpleNamespace(max_num_batched_tokens=CHUNK),
            model_config=SimpleNamespace(max_model_len=8192),
        ),
    )
    cal = calibrate.for_scheduler(scheduler)
    assert cal is not None and not cal.fit and cal.policy is None
    rng = random.Random(5)
    expected = []
    for _ in range(600):  # enough steps for a refresh if the fit were fed
        chunks = synthetic_step(rng)
        new = [(f"r{i}", n, p) for i, (n, p) in enumerate(chunks)]
        seconds = TRUTH.step_s(*chunk_features(chunks))
        cal.observe_step(fake_output(new, []), seconds)
        expected.append(([list(c) for c in chunks], seconds))
    cal.step_log.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["chunks"], r["s"]) for r in lines] == [
        (c, pytest.approx(s, abs=1e-6)) for c, s in expected
    ]
    assert cal.calibrator.num_used == 0 and cal.profile is None and policy.profile is None


def write_step_log(path, steps) -> None:
    import json

    path.write_text("".join(
        json.dumps({"t": 0.0, "s": seconds, "chunks": [list(c) for c in chunks]}) + "\n"
        for chunks, seconds in steps
    ))


def test_fit_step_log_recovers_the_engine_and_prices_a_replay(tmp_path) -> None:
    from fairway.profiling.calibration import fit_step_log

    rng = random.Random(11)
    steps = [(chunks, TRUTH.step_s(*chunk_features(chunks)))
             for chunks in (synthetic_step(rng) for _ in range(300))]
    half = len(steps) // 2
    write_step_log(tmp_path / "a.jsonl", steps[:half])
    write_step_log(tmp_path / "b.jsonl", steps[half:])
    table = fit_step_log([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], CHUNK, 8192)
    assert table is not None and table.metadata["steps_used"] == len(steps)
    fit = step_time.for_profile(table)
    assert isinstance(fit, CalibratedFit)
    for chunks, seconds in steps[:20]:
        spans = [(before, before + n) for n, before in chunks]
        assert fit.step_time_s(spans) == pytest.approx(seconds, rel=1e-3)
    assert table.prefill_s(8192) == pytest.approx(TRUTH.prefill_s(8192, CHUNK), rel=0.01)


def test_fit_step_log_refuses_bad_input(tmp_path) -> None:
    from fairway.errors import ProfileError
    from fairway.profiling.calibration import fit_step_log

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"t": 0, "s": 0.1, "chunks": [[10, 0]]}\n{"s": 0.1}\n')
    with pytest.raises(ProfileError, match=r"bad.jsonl:2: not a step record"):
        fit_step_log([bad], CHUNK, 8192)
    with pytest.raises(ProfileError, match="cannot read the step log"):
        fit_step_log([tmp_path / "missing.jsonl"], CHUNK, 8192)
    few = tmp_path / "few.jsonl"
    write_step_log(few, [([(100, 0)], 0.01)] * 10)
    assert fit_step_log([few], CHUNK, 8192) is None


def test_profile_cli_fits_step_logs(tmp_path, capsys) -> None:
    from fairway import cli
    from fairway.profiling.table import load

    rng = random.Random(12)
    log = tmp_path / "steps.jsonl"
    write_step_log(log, [(chunks, TRUTH.step_s(*chunk_features(chunks)))
                         for chunks in (synthetic_step(rng) for _ in range(200))])
    out = tmp_path / "fit.json"
    args = ["profile", "--from-step-log", str(log), "-o", str(out)]
    assert cli.main(args) == 2  # the step budget and model length are needed
    assert "--chunk-tokens" in capsys.readouterr().err
    args += ["--chunk-tokens", str(CHUNK), "--max-model-len", "4096", "--note", "test"]
    assert cli.main(args) == 0
    table = load(str(out))
    assert table.step_time["kind"] == "calibrated" and table.metadata["note"] == "test"
    assert table.points[-1][0] == 4096
    assert cli.main(args) == 2  # exists: --force needed
