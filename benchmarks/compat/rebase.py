#!/usr/bin/env python
"""Try Fairway on a new vLLM release (`make rebase VLLM=X.Y.Z`).

Steps, each reported as it runs:

1. **fetch** vLLM X.Y.Z: its wheel's Python code as an overlay over the CPU build
   (`vllm_sources.overlay`), and its sdist's `tests/` (`run_compat.fetch_sdist`; the wheel has no
   tests);
2. **matrix**: Fairway's integration tests and the replay smoke run on X.Y.Z's code
   (`run_matrix.py --vllm X.Y.Z`);
3. **compat**: vLLM X.Y.Z's own scheduler tests with Fairway's classes substituted, on X.Y.Z's
   code (`run_compat.py --vllm-version X.Y.Z`);
4. **upstream diff** of exactly the vLLM files Fairway reads (`FAIRWAY_READS`) between the newest
   supported version (`fairway.vllm_versions.SUPPORTED[-1]`; the one before it when X.Y.Z is the
   newest) and X.Y.Z, written to `.cache/rebase/X.Y.Z/upstream.diff` and printed (a per-file
   count and the path when it is long; all of it with `--full`);
5. one summary line, `rebase: vLLM X.Y.Z: matrix PASSED|FAILED (...), compat N passed, ...:
   PASS|FAIL`; the exit code is 1 on any failure (a download, the matrix, a compat failure or a
   stale expected difference), else 0.

Usage: rebase.py X.Y.Z [--no-matrix] [--no-compat] [--full]
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

#: The vLLM files Fairway reads (paths inside the wheel), whose upstream changes a rebase must
#: review: every module `fairway/` imports from vLLM, and the modules of the classes whose
#: internals `fairway/vllm/internals/` touches (`# vLLM internal:` tags). Modules Fairway imports
#: that are left out are in `NOT_DIFFED`, with the reason; `tests/unit/test_rebase.py` checks that
#: every `from vllm... import` / `import vllm...` in `fairway/` is covered by one of the two.
FAIRWAY_READS: tuple[str, ...] = (
    # the scheduler Fairway subclasses, its queues, its output and interface
    "vllm/v1/core/sched/scheduler.py",
    "vllm/v1/core/sched/async_scheduler.py",
    "vllm/v1/core/sched/interface.py",
    "vllm/v1/core/sched/output.py",
    "vllm/v1/core/sched/request_queue.py",
    # the KV cache Fairway's probe reads (block pool, hash map, free queue, coordinator)
    "vllm/v1/core/kv_cache_manager.py",
    "vllm/v1/core/kv_cache_coordinator.py",
    "vllm/v1/core/block_pool.py",
    "vllm/v1/core/kv_cache_utils.py",
    "vllm/v1/core/single_type_kv_cache_manager.py",
    "vllm/v1/kv_cache_interface.py",
    # requests and outputs
    "vllm/v1/request.py",
    "vllm/v1/outputs.py",
    "vllm/v1/engine/__init__.py",
    "vllm/outputs.py",
    "vllm/sampling_params.py",
    # configuration fields Fairway reads or builds (offline harness)
    "vllm/config/scheduler.py",
    "vllm/config/cache.py",
    "vllm/config/kv_transfer.py",
    # the offline harness's other imports
    "vllm/v1/structured_output/__init__.py",
    "vllm/utils/hashing.py",
    # the KV offload tier Fairway's tier probe reads (OffloadingConnector, its scheduler side and
    # job books, the CPU manager, offload keys, the shared region of the offload worker)
    "vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py",
    "vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py",
    "vllm/distributed/kv_transfer/kv_connector/v1/offloading/common.py",
    "vllm/v1/kv_offload/base.py",
    "vllm/v1/kv_offload/cpu/manager.py",
    "vllm/v1/kv_offload/cpu/shared_offload_region.py",
    # the KV cache events a fleet replay's KV-aware routers read (event classes, publisher base)
    "vllm/distributed/kv_events.py",
)

#: Modules `fairway/` imports from vLLM whose files are not diffed, with the reason (large files
#: that change every release, of which Fairway reads one name).
NOT_DIFFED: dict[str, str] = {
    "vllm/__init__.py": "only vllm.__version__ (the start-up version check)",
    "vllm/envs.py": "only VLLM_LOGGING_LEVEL (the plugin's log level)",
    "vllm/logger.py": "only init_logger",
    "vllm/config/__init__.py": "re-exports; the config classes Fairway reads are diffed in "
    "vllm/config/scheduler.py, cache.py, kv_transfer.py (VllmConfig / ModelConfig / "
    "ParallelConfig: one field each, max_model_len, served_model_name, data_parallel_rank)",
}

#: Longer diffs are printed as per-file counts and the file's path (`--full`: printed whole).
PRINT_LIMIT_LINES = 400

_PYTEST_COUNTS = re.compile(
    r"((?:\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)(?:, )?)+)"
    r" in [\d.]+s"
)


@dataclass(frozen=True)
class FileDiff:
    """One file's part of the upstream diff: lines added and removed, and whether the file is
    new or gone in the target version."""

    path: str
    added: int
    removed: int
    status: str = "changed"  # "changed", "added" (new in the target), "removed" (gone in it)


@dataclass(frozen=True)
class MatrixResult:
    """`run_matrix.py`'s exit code and what it said about the version."""

    code: int
    detail: str = ""


@dataclass(frozen=True)
class CompatResult:
    """`run_compat.py`'s exit code, its counts (None: no results were written) and the selected
    test files the version's sdist does not have."""

    code: int
    counts: dict[str, int] | None
    missing: list[str] = field(default_factory=list)


@dataclass
class RebaseOutcome:
    """Everything the summary line reports (None: that step did not run)."""

    version: str
    base: str | None = None
    fetch_errors: list[str] = field(default_factory=list)
    matrix: MatrixResult | None = None
    compat: CompatResult | None = None
    diff: list[FileDiff] | None = None


def diff_base(version: str, supported: Sequence[str]) -> str | None:
    """The version the upstream diff starts from: the newest supported one, or the one before it
    when `version` is the newest (None when there is no other)."""
    if not supported:
        return None
    if version != supported[-1]:
        return supported[-1]
    return supported[-2] if len(supported) > 1 else None


def upstream_diff(
    files: Sequence[str], old: Path, new: Path, old_label: str, new_label: str
) -> tuple[str, list[FileDiff]]:
    """The unified diff (`diff -u` style) of `files` between the trees `old` and `new` (each
    holding `vllm/`), and each changed file's counts; unchanged files are left out."""
    chunks: list[str] = []
    stats: list[FileDiff] = []
    for path in files:
        a, b = old / path, new / path
        if not a.exists() and not b.exists():
            continue
        before = a.read_text().splitlines(keepends=True) if a.exists() else []
        after = b.read_text().splitlines(keepends=True) if b.exists() else []
        if before == after:
            continue
        lines = list(
            difflib.unified_diff(
                before,
                after,
                f"{old_label}/{path}" if a.exists() else "/dev/null",
                f"{new_label}/{path}" if b.exists() else "/dev/null",
            )
        )
        for i, line in enumerate(lines):
            if not line.endswith("\n"):
                lines[i] = line + "\n\\ No newline at end of file\n"
        chunks.append(f"diff -u {old_label}/{path} {new_label}/{path}\n")
        chunks.extend(lines)
        added = sum(1 for line in lines[2:] if line.startswith("+"))
        removed = sum(1 for line in lines[2:] if line.startswith("-"))
        status = "changed" if a.exists() and b.exists() else ("added" if b.exists() else "removed")
        stats.append(FileDiff(path, added, removed, status))
    return "".join(chunks), stats


def diff_stat(stats: Sequence[FileDiff]) -> str:
    """`diff --stat`-like lines: one per file (+added -removed, a file new or gone says so) and
    a total."""
    if not stats:
        return " no changes in the files Fairway reads"
    width = max(len(s.path) for s in stats)
    lines = []
    for s in stats:
        note = {"added": "  (new)", "removed": "  (GONE: Fairway reads it)"}.get(s.status, "")
        lines.append(f" {s.path:<{width}} | +{s.added:<5} -{s.removed:<5}{note}")
    added, removed = sum(s.added for s in stats), sum(s.removed for s in stats)
    lines.append(f" {len(stats)} files changed, {added} insertions(+), {removed} deletions(-)")
    return "\n".join(lines)


def compat_counts(summary: dict[str, Any]) -> dict[str, int]:
    """run_compat's JSON summary as the rebase line's counts."""
    counts = summary["counts"]
    return {
        "passed": counts["passed with a Fairway scheduler"]
        + counts["passed without building a scheduler"],
        "with_fairway": counts["passed with a Fairway scheduler"],
        "failed": counts["failed"],
        "expected": counts["expected differences (xfailed)"],
        "stale": counts.get("stale expected differences (passed)", 0),
        "skipped": counts["skipped"],
    }


def matrix_detail(lines: Sequence[str], version: str) -> str:
    """What run_matrix.py printed about `version`: its parts (`integration ok, replay FAILED
    (exit 1)`), with the integration tests' pytest counts when they were printed."""
    parts = ""
    prefix = f"matrix: vLLM {version}: "
    for line in lines:
        if line.startswith(prefix) and "(" in line and not line.endswith("integration tests"):
            parts = re.sub(r" \(\d+ s\)$", "", line[len(prefix) :].strip())
    counts = next((m.group(1) for line in lines if (m := _PYTEST_COUNTS.search(line))), "")
    counts = re.sub(r",? \d+ warnings?", "", counts).strip(", ")
    return "; ".join(p for p in (f"integration tests: {counts}" if counts else "", parts) if p)


def summary(outcome: RebaseOutcome) -> tuple[str, int]:
    """The one summary line and the exit code (1 on any failure: a download, the matrix, a compat
    failure or stale expected difference, a compat run without results)."""
    failed = bool(outcome.fetch_errors)
    parts = []
    if outcome.fetch_errors:
        parts.append(f"download FAILED ({'; '.join(outcome.fetch_errors)})")
    m = outcome.matrix
    if m is None:
        parts.append("matrix not run")
    else:
        verdict = "PASSED" if m.code == 0 else "FAILED"
        failed |= m.code != 0
        parts.append(f"matrix {verdict}" + (f" ({m.detail})" if m.detail else ""))
    c = outcome.compat
    if c is None:
        parts.append("compat not run")
    elif c.counts is None:
        failed = True
        parts.append(f"compat FAILED (no results, exit {c.code})")
    else:
        n = c.counts
        failed |= c.code != 0 or n["failed"] > 0 or n["stale"] > 0
        text = (
            f"compat {n['passed']} passed ({n['with_fairway']} with a Fairway scheduler), "
            f"{n['failed']} failed, {n['expected']} expected differences"
        )
        if n["stale"]:
            text += f", {n['stale']} STALE expected differences (passed)"
        text += f", {n['skipped']} skipped"
        if c.missing:
            text += f", {len(c.missing)} missing in {outcome.version}"
        if c.code != 0 and not n["failed"] and not n["stale"]:
            text += f" (exit {c.code})"
        parts.append(text)
    if outcome.diff is not None and outcome.base is not None:
        added = sum(s.added for s in outcome.diff)
        removed = sum(s.removed for s in outcome.diff)
        gone = sum(1 for s in outcome.diff if s.status == "removed")
        parts.append(
            f"upstream diff vs {outcome.base}: {len(outcome.diff)} files changed "
            f"(+{added} -{removed})" + (f", {gone} GONE" if gone else "")
        )
    verdict = "FAIL" if failed else "PASS"
    return f"rebase: vLLM {outcome.version}: {', '.join(parts)}: {verdict}", int(failed)


def _stream(cmd: list[str]) -> tuple[int, list[str]]:
    """Run `cmd` in the repository, echoing its output; its exit code and output lines."""
    print("rebase: $", " ".join(cmd), flush=True)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line.rstrip("\n"))
    return proc.wait(), lines


def _why(exc: BaseException) -> str:
    """A failed download in a few words (pip printed the details above)."""
    if isinstance(exc, subprocess.CalledProcessError):
        return f"{' '.join(str(a) for a in exc.cmd[2:4])} exited {exc.returncode}"
    return str(exc)


def vllm_tree(version: str, installed: str) -> Path:
    """A folder holding `vllm/` of `version`: the installed package, or the version's overlay."""
    if version == installed:
        spec = importlib.util.find_spec("vllm")
        assert spec is not None and spec.origin is not None
        return Path(spec.origin).parent.parent
    from vllm_sources import overlay

    return overlay(version)


def main(argv: list[str] | None = None) -> int:
    from fairway.vllm_versions import SUPPORTED

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", help="the vLLM release to try, X.Y.Z")
    parser.add_argument("--no-matrix", action="store_true", help="skip run_matrix.py")
    parser.add_argument("--no-compat", action="store_true", help="skip run_compat.py")
    parser.add_argument("--full", action="store_true", help="print the whole upstream diff")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".cache")
    args = parser.parse_args(argv)

    import run_compat
    from vllm_sources import installed_version, overlay

    version = args.version
    installed = installed_version()
    outcome = RebaseOutcome(version, base=diff_base(version, SUPPORTED))
    compat_cache = args.cache_dir / "compat"

    print(f"rebase: vLLM {version}: fetching the wheel (overlay) and the sdist", flush=True)
    if version != installed:
        try:
            overlay(version)
        except (SystemExit, subprocess.CalledProcessError, OSError) as exc:
            outcome.fetch_errors.append(f"wheel: {_why(exc)}")
    try:
        sdist = run_compat.fetch_sdist(version, compat_cache.resolve())
        run_compat.extract_tests(sdist, compat_cache.resolve() / f"vllm-{version}")
    except (SystemExit, subprocess.CalledProcessError, OSError) as exc:
        outcome.fetch_errors.append(f"sdist: {_why(exc)}")

    python = sys.executable
    if not args.no_matrix and not outcome.fetch_errors:
        code, lines = _stream([python, str(HERE / "run_matrix.py"), "--vllm", version])
        outcome.matrix = MatrixResult(code, matrix_detail(lines, version))
    if not args.no_compat and not outcome.fetch_errors:
        report = compat_cache / f"results-vllm-{version}-fcfs.json"
        report.unlink(missing_ok=True)  # no stale counts when the run stops before pytest
        code, _ = _stream(
            [
                python,
                str(HERE / "run_compat.py"),
                "--vllm-version",
                version,
                "--cache-dir",
                str(compat_cache),
            ]
        )
        counts, missing = None, []
        if report.exists():
            results = json.loads(report.read_text())
            counts, missing = compat_counts(results["summary"]), results.get("missing", [])
        outcome.compat = CompatResult(code, counts, missing)

    if outcome.base is not None and "wheel" not in " ".join(outcome.fetch_errors):
        try:
            old = vllm_tree(outcome.base, installed)
            new = vllm_tree(version, installed)
        except (SystemExit, subprocess.CalledProcessError, OSError) as exc:
            outcome.fetch_errors.append(f"wheel of {outcome.base}: {_why(exc)}")
        else:
            text, outcome.diff = upstream_diff(
                FAIRWAY_READS, old, new, f"a/{outcome.base}", f"b/{version}"
            )
            out = args.cache_dir / "rebase" / version / "upstream.diff"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
            print(
                f"rebase: upstream diff {outcome.base} -> {version} of the "
                f"{len(FAIRWAY_READS)} vLLM files Fairway reads:"
            )
            if args.full or text.count("\n") <= PRINT_LIMIT_LINES:
                sys.stdout.write(text)
            print(diff_stat(outcome.diff))
            print(f"rebase: the diff is in {out}" + ("" if args.full else " (--full prints it)"))

    line, code = summary(outcome)
    print(line, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
