"""`make rebase` and `make compat`'s bookkeeping, without the network, an sdist or vLLM.

* `benchmarks/compat/rebase.py`: the summary line and exit code from given outcomes, the diff's
  base version, the upstream diff and its per-file counts, what it reads from run_matrix.py's
  output, and that `FAIRWAY_READS` covers every vLLM module `fairway/` imports;
* `benchmarks/compat/run_compat.py`: a selected test file missing from a version's sdist is
  reported and left out (none left: exit 4, pytest not started), the run's environment puts the
  version's overlay first, the summary line;
* `benchmarks/compat/fairway_compat.py`: expected differences apply by vLLM version, one that
  passes is counted and listed as stale (not as a pass, nor silently), and the summary counts it.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / "benchmarks" / "compat"


def _load(name: str) -> Any:
    """A module of benchmarks/compat, loaded from its file under a private name."""
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", COMPAT / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rebase() -> Any:
    return _load("rebase")


@pytest.fixture(scope="module")
def run_compat() -> Any:
    return _load("run_compat")


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> Any:
    module = _load("fairway_compat")
    monkeypatch.setattr(module, "_results", [])
    return module


# --- rebase.py: the summary line and the exit code ------------------------------------------


def _counts(**kw: int) -> dict[str, int]:
    base = {
        "passed": 600,
        "with_fairway": 200,
        "failed": 0,
        "expected": 8,
        "stale": 0,
        "skipped": 59,
    }
    return {**base, **kw}


def test_summary_passes_only_when_every_part_passed(rebase):
    outcome = rebase.RebaseOutcome(
        "0.35.0",
        base="0.34.0",
        matrix=rebase.MatrixResult(0, "integration ok, replay ok"),
        compat=rebase.CompatResult(0, _counts(), ["tests/v1/gone.py"]),
        diff=[rebase.FileDiff("vllm/a.py", 10, 4), rebase.FileDiff("vllm/b.py", 0, 30, "removed")],
    )
    line, code = rebase.summary(outcome)
    assert code == 0
    assert line == (
        "rebase: vLLM 0.35.0: matrix PASSED (integration ok, replay ok), compat 600 passed "
        "(200 with a Fairway scheduler), 0 failed, 8 expected differences, 59 skipped, 1 missing "
        "in 0.35.0, upstream diff vs 0.34.0: 2 files changed (+10 -34), 1 GONE: PASS"
    )


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"matrix": ("MatrixResult", 1, "integration FAILED (exit 1), replay ok")},
            "matrix FAILED (integration FAILED (exit 1), replay ok)",
        ),
        # the counts decide even when the exit code says 0
        ({"compat": ("CompatResult", 0, _counts(failed=3), [])}, "3 failed"),
        (
            {"compat": ("CompatResult", 0, _counts(stale=2), [])},
            "2 STALE expected differences (passed)",
        ),
        ({"compat": ("CompatResult", 4, None, [])}, "compat FAILED (no results, exit 4)"),
        ({"compat": ("CompatResult", 2, _counts(), [])}, "59 skipped (exit 2)"),
        ({"fetch_errors": ["sdist: pip fetched nothing"]}, "download FAILED (sdist: pip"),
    ],
)
def test_summary_fails_on_any_failure(rebase, change, says):
    fields: dict[str, Any] = {
        "matrix": rebase.MatrixResult(0, ""),
        "compat": rebase.CompatResult(0, _counts(), []),
    }
    for key, value in change.items():
        if isinstance(value, tuple):
            value = getattr(rebase, value[0])(*value[1:])
        fields[key] = value
    line, code = rebase.summary(rebase.RebaseOutcome("0.34.0", **fields))
    assert code == 1, line
    assert line.endswith(": FAIL") and says in line, line


def test_summary_of_a_quick_run_names_what_did_not_run(rebase):
    line, code = rebase.summary(rebase.RebaseOutcome("0.34.0", base="0.33.0", diff=[]))
    assert code == 0
    assert line == (
        "rebase: vLLM 0.34.0: matrix not run, compat not run, upstream diff vs 0.33.0: "
        "0 files changed (+0 -0): PASS"
    )


def test_diff_base_is_the_newest_supported_or_the_one_before(rebase):
    from fairway.vllm_versions import SUPPORTED

    supported = ("0.32.0", "0.33.0", "0.34.0")
    assert rebase.diff_base("0.35.0", supported) == "0.34.0"
    assert rebase.diff_base("0.34.0", supported) == "0.33.0"
    assert rebase.diff_base("0.33.0", supported) == "0.34.0"
    assert rebase.diff_base("0.32.0", ("0.32.0",)) is None
    assert rebase.diff_base(SUPPORTED[-1], SUPPORTED) == SUPPORTED[-2]


# --- rebase.py: the upstream diff -----------------------------------------------------------


def test_upstream_diff_is_unified_with_counts_per_file(rebase, tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    files = {
        "vllm/same.py": ("a\nb\n", "a\nb\n"),
        "vllm/changed.py": ("a\nb\nc\n", "a\nB\nc\nd\n"),
        "vllm/gone.py": ("x\ny\n", None),
        "vllm/new.py": (None, "z\n"),
    }
    for path, (before, after) in files.items():
        for root, text in ((old, before), (new, after)):
            if text is not None:
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                (root / path).write_text(text)
    text, stats = rebase.upstream_diff(
        [*files, "vllm/nowhere.py"], old, new, "a/0.34.0", "b/0.35.0"
    )
    assert [(s.path, s.added, s.removed, s.status) for s in stats] == [
        ("vllm/changed.py", 2, 1, "changed"),
        ("vllm/gone.py", 0, 2, "removed"),
        ("vllm/new.py", 1, 0, "added"),
    ]
    assert "--- a/0.34.0/vllm/changed.py\n+++ b/0.35.0/vllm/changed.py\n@@ -1,3 +1,4 @@\n" in text
    assert " a\n-b\n+B\n c\n+d\n" in text
    assert "--- a/0.34.0/vllm/gone.py\n+++ /dev/null\n" in text
    assert "--- /dev/null\n+++ b/0.35.0/vllm/new.py\n" in text
    assert "same.py" not in text and "nowhere" not in text
    stat = rebase.diff_stat(stats)
    assert "GONE" in stat.splitlines()[1] and "(new)" in stat.splitlines()[2]
    assert stat.splitlines()[-1] == " 3 files changed, 3 insertions(+), 3 deletions(-)"


def test_matrix_detail_reads_run_matrix_output(rebase):
    lines = [
        "matrix: vLLM 0.34.0: integration tests",
        "....F",
        "FAILED tests/integration/test_x.py::test_y - AssertionError",
        "1 failed, 411 passed, 2 skipped, 14 warnings in 201.33s (0:03:21)",
        "matrix: vLLM 0.34.0: replay smoke (fairway bench --quick)",
        "matrix: vLLM 0.34.0: integration FAILED (exit 1), replay ok (250 s)",
        "matrix: 0 of 1 versions passed: FAILED on 0.34.0",
    ]
    assert rebase.matrix_detail(lines, "0.34.0") == (
        "integration tests: 1 failed, 411 passed, 2 skipped; integration FAILED (exit 1), replay ok"
    )
    assert rebase.matrix_detail([], "0.34.0") == ""


def _vllm_modules_imported_by_fairway() -> set[str]:
    pattern = re.compile(r"^\s*(?:from\s+(vllm[\w.]*)\s+import|import\s+(vllm[\w.]*))", re.M)
    found = set()
    for path in (ROOT / "fairway").rglob("*.py"):
        for match in pattern.finditer(path.read_text()):
            found.add(match.group(1) or match.group(2))
    return found


def test_fairway_reads_covers_every_vllm_module_fairway_imports(rebase):
    """A vLLM module `fairway/` starts importing must be diffed by `make rebase` (or listed in
    NOT_DIFFED with the reason)."""
    covered = set(rebase.FAIRWAY_READS) | set(rebase.NOT_DIFFED)
    modules = _vllm_modules_imported_by_fairway()
    assert "vllm.v1.core.sched.scheduler" in modules  # the grep works
    uncovered = []
    for module in sorted(modules):
        path = module.replace(".", "/")
        if f"{path}.py" not in covered and f"{path}/__init__.py" not in covered:
            uncovered.append(module)
    assert not uncovered, f"vLLM modules fairway/ imports that rebase.py does not diff: {uncovered}"
    assert len(set(rebase.FAIRWAY_READS)) == len(rebase.FAIRWAY_READS)
    assert not set(rebase.FAIRWAY_READS) & set(rebase.NOT_DIFFED)


def test_fairway_reads_exist_in_the_installed_vllm(rebase):
    spec = importlib.util.find_spec("vllm")  # locates the package without importing it
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    site = Path(spec.origin).parent.parent
    missing = [p for p in (*rebase.FAIRWAY_READS, *rebase.NOT_DIFFED) if not (site / p).exists()]
    assert not missing


# --- run_compat.py: missing files, the environment, the summary line ---------------------


def test_select_tests_leaves_out_files_missing_from_the_sdist(run_compat, tmp_path):
    (tmp_path / "tests" / "v1").mkdir(parents=True)
    (tmp_path / "tests" / "v1" / "test_here.py").write_text("")
    present, missing = run_compat.select_tests(
        [
            "tests/v1/test_here.py",
            "tests/v1/test_gone.py",
            "tests/v1/test_here.py::test_one",
            "tests/v1/test_gone.py::test_two",
        ],
        tmp_path,
    )
    assert present == ["tests/v1/test_here.py", "tests/v1/test_here.py::test_one"]
    assert missing == ["tests/v1/test_gone.py", "tests/v1/test_gone.py::test_two"]


@pytest.fixture
def fake_run(run_compat, monkeypatch, tmp_path):
    """run_compat.main with the sdist, the downloads, the overlay and pytest replaced: pytest
    'runs' by writing the plugin's report; returns the calls it saw."""
    tests_dir = tmp_path / "vllm-0.34.0"
    (tests_dir / "tests" / "v1").mkdir(parents=True)
    (tests_dir / "tests" / "v1" / "test_here.py").write_text("")
    seen: dict[str, Any] = {}
    monkeypatch.setattr(run_compat, "installed_vllm_version", lambda: "0.32.0")
    monkeypatch.setattr(run_compat, "fetch_sdist", lambda version, cache: tmp_path / "x.tar.gz")
    monkeypatch.setattr(run_compat, "extract_tests", lambda sdist, dest: tests_dir)
    monkeypatch.setattr(run_compat, "install_test_deps", lambda site: None)
    monkeypatch.setattr(run_compat, "write_hub_cache", lambda hub: None)

    def overlay_env(version: str, base: dict[str, str]) -> dict[str, str]:
        env = dict(base)
        env["PYTHONPATH"] = f"/overlay/{version}:/compat:" + base["PYTHONPATH"]
        return env

    monkeypatch.setitem(sys.modules, "vllm_sources", types.SimpleNamespace(overlay_env=overlay_env))

    def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> Any:
        seen["cmd"], seen["env"] = cmd, env
        counts = {
            "passed with a Fairway scheduler": 3,
            "passed without building a scheduler": 1,
            "failed": 0,
            "skipped": 2,
            "expected differences (xfailed)": 1,
            "stale expected differences (passed)": 0,
        }
        Path(env["FAIRWAY_COMPAT_REPORT"]).write_text(
            json.dumps({"summary": {"counts": counts}, "tests": []})
        )
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(run_compat.subprocess, "run", run)
    return seen


def test_missing_file_is_reported_and_left_out_not_an_error(run_compat, fake_run, tmp_path, capsys):
    code = run_compat.main(
        [
            "--vllm-version",
            "0.34.0",
            "--cache-dir",
            str(tmp_path),
            "--tests",
            "tests/v1/test_here.py",
            "tests/v1/test_gone.py",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "compat: tests/v1/test_gone.py missing in 0.34.0, not run" in out
    assert "tests/v1/test_here.py" in fake_run["cmd"]
    assert "tests/v1/test_gone.py" not in fake_run["cmd"]
    # the version's own code first, then this folder, the tests, the side site
    paths = fake_run["env"]["PYTHONPATH"].split(":")
    assert paths[0] == "/overlay/0.34.0"
    assert str(COMPAT) in paths and str(tmp_path / "vllm-0.34.0") in paths
    # a Fairway scheduler refuses FAIRWAY_ names it does not know
    assert {k for k in fake_run["env"] if k.startswith("FAIRWAY_")} <= {
        "FAIRWAY_DATA", "FAIRWAY_POLICY", "FAIRWAY_COMPAT_REPORT"
    }
    assert fake_run["env"]["COMPAT_VLLM_VERSION"] == "0.34.0"
    report = json.loads((tmp_path / "results-vllm-0.34.0-fcfs.json").read_text())
    assert report["missing"] == ["tests/v1/test_gone.py"] and report["vllm"] == "0.34.0"
    assert out.rstrip().splitlines()[-1] == (
        "compat: vLLM 0.34.0 (policy fcfs): 4 passed (3 with a Fairway scheduler), 0 failed, "
        "1 expected differences, 2 skipped, 1 missing in 0.34.0 (not run): PASS"
    )


def test_only_missing_files_is_exit_4_without_pytest(run_compat, fake_run, tmp_path, capsys):
    code = run_compat.main(
        [
            "--vllm-version",
            "0.34.0",
            "--cache-dir",
            str(tmp_path),
            "--tests",
            "tests/v1/test_gone.py",
        ]
    )
    assert code == 4
    assert "cmd" not in fake_run
    assert "none of the selected test files" in capsys.readouterr().out


def test_installed_version_runs_without_overlay(run_compat, fake_run, tmp_path):
    base = {"PYTHONPATH": "/elsewhere", "PROMETHEUS_MULTIPROC_DIR": "/tmp/p"}
    env = run_compat.compat_env("0.32.0", "0.32.0", base, [Path("/compat"), Path("/tests")])
    assert env["PYTHONPATH"] == "/compat:/tests:/elsewhere"
    assert "PROMETHEUS_MULTIPROC_DIR" not in env


def test_compat_summary_line_fails_on_stale_or_failed(run_compat):
    counts = {
        "passed with a Fairway scheduler": 5,
        "passed without building a scheduler": 0,
        "failed": 0,
        "skipped": 0,
        "expected differences (xfailed)": 1,
        "stale expected differences (passed)": 1,
    }
    line = run_compat.summary_line("0.34.0", "fcfs", {"counts": counts}, [], 1)
    assert "1 stale expected differences (passed)" in line and line.endswith(": FAIL")
    counts["stale expected differences (passed)"] = 0
    assert run_compat.summary_line("0.34.0", "fcfs", {"counts": counts}, [], 0).endswith(": PASS")
    assert run_compat.summary_line("0.34.0", "fcfs", None, [], 3).endswith(
        "no results (pytest exit 3): FAIL"
    )


# --- fairway_compat.py: expected differences by version, stale when passing -----------------


def test_expected_differences_apply_by_version(plugin, monkeypatch):
    monkeypatch.setattr(
        plugin,
        "EXPECTED_DIFFERENCES",
        {
            "tests/a.py::test_new": plugin.Difference("refused at start-up", since="0.34.0"),
            "tests/a.py::test_old": plugin.Difference("heap internals", until="0.34.0"),
            "tests/a.py::test_all": "every version",
        },
    )
    monkeypatch.setenv(plugin.VERSION_ENV, "0.33.0")
    assert plugin.difference_for("tests/a.py::test_new[4]") is None
    assert plugin.difference_for("tests/a.py::test_old") == "heap internals"
    assert plugin.difference_for("tests/a.py::test_all[x]") == "every version"
    # on 0.33 the 0.34-only entry is not reported as uncollected, the others are
    assert plugin.unmatched_entries(["tests/a.py::test_other"]) == [
        "tests/a.py::test_all",
        "tests/a.py::test_old",
    ]
    monkeypatch.setenv(plugin.VERSION_ENV, "0.34.0")
    assert plugin.difference_for("tests/a.py::test_new[4]") == "refused at start-up"
    assert plugin.difference_for("tests/a.py::test_old") is None
    assert plugin.unmatched_entries(["tests/a.py::test_new[0]", "tests/a.py::test_all"]) == []
    assert plugin.unmatched_entries(["tests/b.py::test_new"]) == []  # a.py was not collected


def test_cache_aware_entries_apply_from_0_34_only(plugin, monkeypatch):
    node = "tests/v1/core/test_scheduler.py::test_cache_aware_admission_prefers_cached_prefix"
    monkeypatch.setenv(plugin.VERSION_ENV, "0.34.0")
    assert "cache_aware_admission_window" in plugin.difference_for(node)
    monkeypatch.setenv(plugin.VERSION_ENV, "0.33.0")
    assert plugin.difference_for(node) is None


def _report(outcome: str, longrepr: Any = None, wasxfail: str | None = None) -> Any:
    report = types.SimpleNamespace(
        nodeid="tests/a.py::test_x",
        when="call",
        outcome=outcome,
        passed=outcome == "passed",
        failed=outcome == "failed",
        skipped=outcome == "skipped",
        longrepr=longrepr,
        longreprtext=str(longrepr or ""),
        user_properties=[("fairway_schedulers", 1)],
    )
    if wasxfail is not None:
        report.wasxfail = wasxfail
    return report


def test_a_passing_expected_difference_is_stale_not_silent(plugin):
    # pytest's report of a strict xfail that passed, and of one that failed as expected
    plugin.pytest_runtest_logreport(_report("failed", "[XPASS(strict)] refused at start-up"))
    plugin.pytest_runtest_logreport(_report("skipped", None, wasxfail="refused at start-up"))
    plugin.pytest_runtest_logreport(_report("failed", "AssertionError: order"))
    assert [(r["outcome"], r["reason"]) for r in plugin._results] == [
        ("stale", "refused at start-up"),
        ("xfailed", "refused at start-up"),
        ("failed", "AssertionError: order"),
    ]
    summary = plugin.summarize(plugin._results)
    assert summary["counts"]["stale expected differences (passed)"] == 1
    assert summary["counts"]["expected differences (xfailed)"] == 1
    assert summary["counts"]["failed"] == 1
    assert summary["counts"]["passed with a Fairway scheduler"] == 0
    assert summary["stale_differences"] == ["tests/a.py::test_x"]
