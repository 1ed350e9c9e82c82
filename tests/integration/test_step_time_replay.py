"""The virtual replay prices steps with whichever step-time model its table file names.

One small trace through vLLM's real Scheduler under each model: the table, the profiler's
quadratic fit and a self-calibrated fit, each saved in a table file and loaded back, as
`fairway bench --profile FILE` does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fairway.profiling import step_time
from fairway.profiling.calibration import StepTimeCalibrator, chunk_features
from fairway.profiling.step_time import CalibratedFit, QuadraticFit
from fairway.profiling.table import PrefillProfile, from_points, load
from fairway.replay.sim import replay
from fairway.traces.format import Trace, TraceHeader, TraceRequest

pytestmark = pytest.mark.integration

CHUNK = 2_048
QUADRATIC = QuadraticFit(0.01, 1e-4, 1e-8)
CALIBRATED = CalibratedFit(overhead_s=0.01, per_token_s=1e-4, per_pair_s=2e-8)
LENGTHS = (128, 1_000, 2_048, 4_096, 8_192)


def calibrated_table() -> PrefillProfile:
    """A snapshot of a calibrator fed with CALIBRATED's step times (as `self_calibrate` makes)."""
    calibrator = StepTimeCalibrator(CHUNK)
    for k in range(400):
        chunks = [(16 + (37 * k) % CHUNK, (911 * k) % 9_000)]
        calibrator.observe(chunks, CALIBRATED.step_s(*chunk_features(chunks)))
    table = calibrator.profile(8_192)
    assert table is not None
    return table


def tables() -> dict[str, PrefillProfile]:
    points = [(n, QUADRATIC(n)) for n in LENGTHS]
    return {
        "table": from_points(points, constants={"overhead_s": QUADRATIC.a_s}),
        "quadratic": PrefillProfile(tuple(points), step_time=QUADRATIC.to_spec()),
        "calibrated": calibrated_table(),
    }


def trace() -> Trace:
    reqs = (
        TraceRequest("a", 1.0, (("doc", 3_000),), phase="calm"),
        TraceRequest("b", 1.0, (("doc", 3_000), ("q", 64)), phase="calm"),
        TraceRequest("c", 30.0, (("other", 700),), phase="calm"),
    )
    header = TraceHeader(family="test", seed=0, shape=None, params={}, num_requests=len(reqs))
    return Trace(header, reqs)


@pytest.mark.parametrize("kind", ["table", "quadratic", "calibrated"])
def test_the_replay_runs_on_each_model_from_its_file(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"{kind}.json"
    tables()[kind].save(path)
    model = step_time.for_profile(load(path))
    assert type(model).__name__ == {"table": "TableStepTime", "quadratic": "QuadraticFit",
                                    "calibrated": "CalibratedFit"}[kind]
    result = replay(trace(), "fcfs", profile=str(path), num_blocks=1_000,
                    max_num_batched_tokens=CHUNK)
    assert result.n_errors == 0
    assert result.settings["cost_model"] == model.describe()
    alone = {r.request_id: r for r in result.requests}["c"]
    # On an idle engine a 700-token prompt is one step: exactly the model's price of it.
    assert alone.ttft_s == pytest.approx(model.step_time_s([(0, 700)]), rel=1e-9)


def test_table_and_its_own_fit_agree_where_the_table_was_measured() -> None:
    made = tables()
    results = {
        kind: replay(trace(), "fcfs", profile=made[kind], num_blocks=1_000,
                     max_num_batched_tokens=CHUNK)
        for kind in ("table", "quadratic")
    }
    for kind, result in results.items():
        assert result.n_errors == 0, kind
    ttft = {kind: [r.ttft_s for r in result.requests] for kind, result in results.items()}
    # The table interpolates the same curve linearly: within a few % on these lengths.
    assert ttft["table"] == pytest.approx(ttft["quadratic"], rel=0.05)
    assert ttft["table"] != ttft["quadratic"]  # ... but it is a different model
