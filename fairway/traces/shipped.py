"""The preset traces that ship built inside the package: the benchmark needs no data directory.

Every preset of `fairway.traces.build.PRESETS` ships in ``fairway/traces/presets/`` as two files,
both built against the shipped profile's capacity:

* ``<preset>.jsonl.gz``: the preset as registered;
* ``<preset>-quick.jsonl.gz``: its quick variant (`quick_overrides`: every phase a quarter long).

A trace is a pure function of its header and writing is deterministic, so a shipped file equals a
rebuild from the source data byte for byte (tests/unit/test_traces_shipped.py checks that where
the sources are present, and everywhere that each file's header matches the registry). Regenerate
them all, after changing a preset, a builder or the shipped profile, with one command::

    fairway trace build --all-presets --into fairway/traces/presets

Any other variant (another seed, shape, capacity or parameter, e.g. E2's load scaling) is built
from the source data (`fairway.traces.data`); `preset_trace` says so when the data is absent.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fairway.traces.build import (
    PRESETS,
    build_preset,
    default_capacity_tps,
    make_params,
    preset_arguments,
    quick_overrides,
)
from fairway.traces.data import MissingDataError
from fairway.traces.format import Trace, load_trace, write_trace

logger = logging.getLogger(__name__)

#: Where the shipped traces live (package data, see pyproject.toml).
PRESET_DIR = Path(__file__).with_name("presets")
SUFFIX = ".jsonl.gz"
QUICK_TAG = "-quick"


def shipped_path(name: str, quick: bool = False) -> Path:
    """The shipped file of preset `name` (its quick variant with `quick`); it may not exist."""
    preset_arguments(name)  # an unknown name raises with the known ones
    return PRESET_DIR / f"{name}{QUICK_TAG if quick else ''}{SUFFIX}"


def variants(name: str) -> dict[str, dict[str, Any]]:
    """File name -> preset overrides, for each shipped variant of preset `name`."""
    return {shipped_path(name).name: {}, shipped_path(name, quick=True).name: quick_overrides(name)}


def expected_header(name: str, quick: bool = False,
                    capacity_tps: float | None = None) -> dict[str, Any]:
    """What the header of the shipped file must say: family, seed, shape, params, capacity.

    `params` are resolved (defaults filled in), as builders record them.
    """
    args = preset_arguments(name)
    overrides = quick_overrides(name) if quick else {}
    shape = overrides.pop("shape", args["shape"])
    params = make_params(args["family"], {**args["params"], **overrides})
    return {
        "family": args["family"], "seed": args["seed"], "shape": shape,
        "params": dataclasses.asdict(params), "preset": name,
        "capacity_tps": float(capacity_tps if capacity_tps is not None else default_capacity_tps()),
    }


def header_mismatch(trace: Trace, name: str, quick: bool = False,
                    capacity_tps: float | None = None) -> list[str]:
    """The header fields of `trace` that differ from `expected_header` (empty: it is the one)."""
    header = trace.header
    return [
        f"{key}: file {getattr(header, key)!r}, wanted {value!r}"
        for key, value in expected_header(name, quick, capacity_tps).items()
        if (dict(header.params) if key == "params" else getattr(header, key)) != value
    ]


def shipped_trace(name: str, *, quick: bool = False, capacity_tps: float | None = None,
                  **overrides: Any) -> Trace | None:
    """The shipped trace of preset `name` when it is the one asked for, else None.

    None when `overrides` are given (only the registered preset and its quick variant ship), when
    `capacity_tps` differs from the capacity the file was built against, or when the file is
    missing or stale (its header disagrees with the registry: logged, rebuild with the command in
    the module docstring).
    """
    if overrides or name not in PRESETS:
        return None
    path = shipped_path(name, quick)
    if not path.is_file():
        logger.warning("no shipped trace %s; rebuilding preset %s from its source data", path, name)
        return None
    trace = load_trace(path)
    problems = header_mismatch(trace, name, quick, capacity_tps)
    if problems and capacity_tps is None:
        logger.warning("shipped trace %s does not match preset %s (%s); rebuilding from the "
                       "source data (regenerate: fairway trace build --all-presets --into %s)",
                       path, name, "; ".join(problems), PRESET_DIR)
    return None if problems else trace


def build_from_sources(name: str, capacity_tps: float | None = None, *, quick: bool = False,
                       **overrides: Any) -> Trace:
    """Build preset `name` (its quick variant with `quick`, `overrides` applied) from the sources.

    Raises:
        MissingDataError: the source data is absent; the message says that this variant is not
            shipped and which file is missing.
    """
    params = {**(quick_overrides(name) if quick else {}), **overrides}
    try:
        return build_preset(name, capacity_tps, **params)
    except MissingDataError as exc:
        changes = [f"{k}={v}" for k, v in sorted(overrides.items())]
        if capacity_tps is not None:
            changes.append(f"capacity_tps={capacity_tps:g}")
        variant = f"{'the --quick variant of ' if quick else ''}preset {name}"
        if not changes:  # regenerating a shipped file
            raise MissingDataError(f"rebuilding {variant} needs its source data: {exc}") from None
        raise MissingDataError(
            f"{variant} with {', '.join(changes)} is not one of the shipped traces (those are each "
            f"preset and its --quick variant at the shipped profile's capacity), so it is built "
            f"from the source data, which is missing: {exc}"
        ) from None


def preset_trace(name: str, *, quick: bool = False, capacity_tps: float | None = None,
                 **overrides: Any) -> Trace:
    """Preset `name` (quick variant with `quick`, `overrides` applied): shipped, or built.

    The shipped file when it is the trace asked for (no data needed), else a build from the
    source data (`build_from_sources`).
    """
    shipped = shipped_trace(name, quick=quick, capacity_tps=capacity_tps, **overrides)
    if shipped is not None:
        return shipped
    return build_from_sources(name, capacity_tps, quick=quick, **overrides)


def write_presets(into: str | Path, names: Iterable[str] | None = None,
                  progress: Callable[[str], None] | None = None) -> list[Path]:
    """Build every shipped variant of `names` (default: all presets) from the sources into `into`.

    Everything is built before anything is written, so missing data leaves `into` unchanged.
    """
    root = Path(into)
    built = [
        (shipped_path(name, quick).name, build_from_sources(name, quick=quick))
        for name in (list(names) if names is not None else list(PRESETS))
        for quick in (False, True)
    ]
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for file_name, trace in built:
        paths.append(write_trace(trace, root / file_name))
        if progress is not None:
            progress(f"wrote {root / file_name}: {len(trace)} requests, "
                     f"{paths[-1].stat().st_size:,} bytes")
    return paths
