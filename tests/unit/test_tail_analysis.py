"""benchmarks/tail_analysis.py: the bins, the tail set and the work that passed it, on hand-made
replay files; the errors for an empty folder and a missing scenario or policy."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import tail_analysis  # noqa: E402

from fairway.replay.results import ReplayResult, RequestResult, file_name, save  # noqa: E402

SCENARIO = "mooncake tiny"


def req(rid: str, arrival: float, scheduled: float | None, first: float | None, prompt: int,
        cached: int = 0, phase: str | None = None, error: str | None = None) -> RequestResult:
    return RequestResult(rid, arrival, phase, prompt, scheduled, first, cached, error)


#: One tail request (r2: 20,000 uncached tokens, TTFT 9 s); r3 and r4 arrive after it and get their
#: first token before it (2,000 + 5,000 tokens pass it); r1's span [0.5, 3] lies 80% inside r2's
#: window [1, 10] (arrival to first token), r0's not at all; a warm-up and an errored request are
#: left out.
FCFS = [
    req("warm", 0.0, 0.0, 0.2, 50_000, phase="warmup"),
    req("r0", 0.0, 0.0, 1.0, 2_000),
    req("r1", 0.5, 0.5, 3.0, 10_000, cached=2_000),
    req("r2", 1.0, 3.0, 10.0, 20_000),
    req("r3", 2.0, 4.0, 5.0, 3_000, cached=1_000),
    req("r4", 3.0, 5.0, 6.0, 5_000),
    req("bad", 4.0, None, None, 1_000, error="timeout after 30 s"),
]
#: The same requests, in arrival order: nobody passes anybody.
FAIRWAY = [
    req("r0", 0.0, 0.0, 1.0, 2_000),
    req("r1", 0.5, 1.0, 3.0, 10_000, cached=2_000),
    req("r2", 1.0, 3.0, 6.0, 20_000),
    req("r3", 2.0, 6.0, 7.0, 3_000, cached=1_000),
    req("r4", 3.0, 7.0, 8.5, 5_000),
]


def write(folder: Path, scenario: str, policy: str, requests: list[RequestResult]) -> None:
    result = ReplayResult(policy, scenario, {}, requests, wall_s=0.0, simulated_s=10.0)
    save(result, folder / file_name(result))


@pytest.fixture
def replays(tmp_path: Path) -> Path:
    folder = tmp_path / "replays"
    write(folder, SCENARIO, "fairway", FAIRWAY)
    write(folder, SCENARIO, "fcfs", FCFS)
    write(folder, "sec-a x1 cache0.3", "fcfs", FAIRWAY)
    return folder


def test_main_explains_the_tail(replays: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert tail_analysis.main(["--replays", str(replays), "--out", str(out)]) == 0
    for name in ("tail.md", "tail.json", "tail.png"):
        assert (out / name).stat().st_size > 0
    data = json.loads((out / "tail.json").read_text())
    # Only the mooncake scenario by default, every policy found.
    assert list(data["scenarios"]) == ["mooncake_tiny"]
    rows = data["scenarios"]["mooncake_tiny"]
    assert set(rows) == {"fcfs", "fairway"}

    fcfs = rows["fcfs"]
    assert (fcfs["n"], fcfs["errors"]) == (5, 1)
    assert fcfs["tokens_computed"] == 2_000 + 8_000 + 20_000 + 2_000 + 5_000
    # TTFTs 1, 2.5, 9, 3, 3: linear p50 = 3, p99 = 3 + 0.96 * 6.
    assert fcfs["p50_s"] == pytest.approx(3.0)
    assert fcfs["p99_s"] == pytest.approx(8.76)
    assert fcfs["max_s"] == pytest.approx(9.0)

    bins = fcfs["bins"]
    assert [bins[b]["n"] for b in ("<4k", "4k-16k", ">=16k")] == [2, 2, 1]
    assert bins["<4k"]["median_ttft_s"] == pytest.approx(2.0)        # r0 1 s, r3 3 s
    assert bins["<4k"]["p90_ttft_s"] == pytest.approx(2.8)
    assert bins["4k-16k"]["p90_wait_s"] == pytest.approx(1.8)        # waits 0 (r1), 2 (r4)
    assert bins["4k-16k"]["p90_span_s"] == pytest.approx(2.35)       # spans 2.5, 1
    assert bins[">=16k"]["p90_ttft_s"] == pytest.approx(9.0)

    tail = fcfs["tail"]
    assert tail["n"] == 1
    assert tail["bins"] == {"<4k": 0, "4k-16k": 0, ">=16k": 1}
    assert (tail["mean_wait_s"], tail["mean_span_s"]) == pytest.approx((2.0, 7.0))
    (r2,) = tail["requests"]
    assert r2["request_id"] == "r2"
    assert (r2["passed_requests"], r2["passed_tokens"]) == (2, 7_000)
    # While r2 waited: 80% of r1's 8,000 tokens, all of r3's and r4's, none of r0's.
    assert r2["work_while_waiting_tokens"] == pytest.approx(6_400 + 2_000 + 5_000)
    assert r2["passed_share"] == pytest.approx(7_000 / 13_400)
    assert tail["passed_tokens"] == 7_000

    fairway = rows["fairway"]
    assert fairway["errors"] == 0
    assert [t["request_id"] for t in fairway["tail"]["requests"]] == ["r4"]  # TTFT 5.5 s
    assert fairway["tail"]["passed_tokens"] == 0

    text = (out / "tail.md").read_text()
    assert "## mooncake tiny" in text and "| fcfs | r2 | 20,000 | >=16k |" in text
    assert text.index("| fcfs | 5 | 1 |") < text.index("| fairway | 5 | 0 |")  # E2's order


def test_named_scenario_and_policy(replays: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["--replays", str(replays), "--out", str(out), "--scenario", "sec-a x1 cache0.3",
            "--policy", "fcfs"]
    assert tail_analysis.main(argv) == 0
    data = json.loads((out / "tail.json").read_text())
    assert {s: sorted(rows) for s, rows in data["scenarios"].items()} == {
        "mooncake_tiny": ["fcfs"], "sec-a_x1_cache0.3": ["fcfs"],
    }


def test_empty_folder_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "replays").mkdir()
    assert tail_analysis.main(["--replays", str(tmp_path / "replays"),
                               "--out", str(tmp_path / "out")]) == 2
    assert "no replay files" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("flag", "name", "message"), [
    ("--scenario", "musique", "scenario 'musique': no replays of it"),
    ("--policy", "hrrn", "no replay of policy hrrn"),
])
def test_missing_scenario_or_policy_is_an_error(
    replays: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, name: str,
    message: str,
) -> None:
    assert tail_analysis.main(["--replays", str(replays), flag, name,
                               "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
