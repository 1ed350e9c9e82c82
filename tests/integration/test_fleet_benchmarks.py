"""`benchmarks/fleet_capacity.py` and `benchmarks/fleet_grid.py` at a tiny size (2 nodes, 2
routers, 2 policies, the quick hit-heavy preset, in this process): every cell gets a verdict
that its probes support, and the grid's goal ratios are its own rows' (a smoke test of the
scripts; the searches' logic is tests/unit/test_fleet_capacity.py's)."""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
TINY = ["--quick", "--nodes", "2", "--routers", "round-robin", "vllm-cache-aware",
        "--policies", "fcfs", "fairway", "--workers", "0", "--no-progress"]


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def documented_capacity_command() -> list[str]:
    """The arguments of FAIRWAY.md's `fleet_capacity.py` command, as written there (its entry
    in tests/integration/test_docs_commands.py only parses it: this test runs it)."""
    text = (ROOT / "FAIRWAY.md").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines()
             if line.startswith(".venv/bin/python benchmarks/fleet_capacity.py ")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])[2:]


def test_the_documented_capacity_run_gives_every_cell_a_verdict_its_probes_support(
        tmp_path, capsys):
    bench = script("fleet_capacity")
    argv = documented_capacity_command()
    # Two rounds at most: 0.25, then 0.125 if it missed; the nodes at 0.5 capacities: 1 or 2
    assert argv[argv.index("--start-load") + 1] == "0.25"
    argv[argv.index("--out") + 1] = str(tmp_path / "cap")
    data = bench.main(argv)
    out = Path(data["out_dir"])
    assert {p.name for p in out.iterdir()} >= {"capacity.md", "capacity.json", "capacity.png"}
    saved = json.loads((out / "capacity.json").read_text())
    cells = saved["capacity"]
    assert [(c["router"], c["policy"]) for c in cells] == [
        ("round-robin", "fcfs"), ("round-robin", "fairway"), ("vllm-cache-aware", "fcfs"),
        ("vllm-cache-aware", "fairway")]
    for c in cells:
        met = [p["value"] for p in c["probes"] if p["meets"]]
        missed = [p["value"] for p in c["probes"] if not p["meets"]]
        assert c["probes"][0]["value"] == 0.25 and len(c["probes"]) <= 2
        assert c["value"] == (max(met) if met else None)
        assert c["status"] == ("never" if not met else "at-least" if not missed else "found")
        assert all(p["summary"]["nodes"] == 2 for p in c["probes"])
    for c in saved["nodes_needed"]["cells"]:
        assert c["kind"] == "nodes" and c["status"] in ("found", "never")
        assert all(p["summary"]["requests"] == c["probes"][0]["summary"]["requests"]
                   for p in c["probes"])  # one offered trace on any number of nodes
    printed = capsys.readouterr().out
    assert "| vllm-cache-aware |" in printed and "Nodes needed at 0.5" in printed


def test_grid_goal_ratios_are_its_own_rows(tmp_path, capsys):
    grid = script("fleet_grid")
    data = grid.main([*TINY, "--traces", "hit-heavy", "--loads", "0.25", "--out",
                      str(tmp_path / "grid")])
    rows, goals = data["rows"], data["goals"]
    assert len(rows) == 4 and {r["load"] for r in rows} == {0.25}
    assert [g["router"] for g in goals] == ["round-robin", "vllm-cache-aware"]
    for g in goals:
        mine = {r["policy"]: r for r in rows if r["router"] == g["router"]}
        assert g["p99_vs_fcfs"] == pytest.approx(mine["fairway"]["ttft_p99_s"]
                                                 / mine["fcfs"]["ttft_p99_s"])
        assert g["best_p99_policy"] == "fcfs"  # the only other policy
        assert g["met"]["p99_vs_fcfs"] == (g["p99_vs_fcfs"] <= 0.8)
    out = Path(data["out_dir"])
    assert (out / "grid.md").is_file() and (out / "hit-heavy" / "fleet.md").is_file()
    blocks = data["traces"]["hit-heavy"]["kv_blocks"]
    assert all(r["nodes"] == 2 for r in rows) and blocks > 0
    assert "Goals: p99 / FCFS met in" in capsys.readouterr().out
