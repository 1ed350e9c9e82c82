#!/usr/bin/env python
"""The shipped presets' quick replays on two vLLM releases' code, compared request by request.

Runs `fairway bench --quick` for every shipped preset (or `--trace`) under the chosen policies,
once per version (`vllm_sources.overlay_env`: the newer release's Python code over the CPU
build), and compares every replay's per-request records (arrival, first scheduled, first token,
cached tokens, tier tokens, error): the same scheduler decisions give the same records to the
bit. Prints one line per (trace, policy) and a summary; exits 1 if any replay differs or fails.

Usage: replays_across.py [--vllm A B] [--trace PRESET ...] [--policy NAME ...]
                         [--kv-offloading-size GiB] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from vllm_sources import overlay_env  # noqa: E402

from fairway import vllm_versions  # noqa: E402
from fairway.traces.build import PRESETS  # noqa: E402

#: The per-request fields compared (the records' timing and cache fields; wall time is not).
FIELDS = ("request_id", "arrival_s", "first_scheduled_s", "first_token_s", "cached_tokens",
          "tier_tokens", "error")


def replay(version: str, args: argparse.Namespace, out: Path) -> int:
    """`fairway bench --quick` on vLLM `version`'s code into `out`; its exit code."""
    cmd = [sys.executable, "-m", "fairway.cli", "bench", "--quick", "--no-progress",
           "--out", str(out)]
    for trace in args.trace:
        cmd += ["--trace", trace]
    for policy in args.policy:
        cmd += ["--policy", policy]
    if args.kv_offloading_size:
        cmd += ["--kv-offloading-size", str(args.kv_offloading_size)]
    print(f"replays_across: vLLM {version}: {' '.join(cmd[3:])}", flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=overlay_env(version)).returncode


def records(folder: Path) -> tuple[dict[str, list[tuple]], dict[str, int]]:
    """(`<trace>--<policy>` -> the compared fields of each request in trace order, the same ->
    the engine's policy fallbacks: a step where Fairway's ordering, probe, protection or tier
    failed and vLLM's order was kept)."""
    found, fallbacks = {}, {}
    for path in sorted((folder / "replays").glob("*.json")):
        data = json.loads(path.read_text())
        found[path.stem] = [tuple(r.get(f) for f in FIELDS) for r in data["requests"]]
        fallbacks[path.stem] = int(data["settings"]["engine"]["policy_fallbacks"])
    return found, fallbacks


def compare(a: dict[str, list[tuple]], b: dict[str, list[tuple]]) -> list[str]:
    """One line per replay: identical, or where the first difference is."""
    lines = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            lines.append(f"{name}: only on one side")
            continue
        diffs = [i for i, (x, y) in enumerate(zip(a[name], b[name], strict=False)) if x != y]
        if len(a[name]) != len(b[name]):
            lines.append(f"{name}: {len(a[name])} against {len(b[name])} requests")
        elif diffs:
            first = diffs[0]
            lines.append(f"{name}: {len(diffs)} of {len(a[name])} requests differ, first "
                         f"{a[name][first]} against {b[name][first]}")
        else:
            lines.append(f"{name}: identical ({len(a[name])} requests)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm", nargs=2, metavar=("A", "B"),
                        default=[vllm_versions.SUPPORTED[0], vllm_versions.SUPPORTED[-1]])
    parser.add_argument("--trace", nargs="+", default=sorted(PRESETS),
                        help="presets (default: every shipped one)")
    parser.add_argument("--policy", nargs="+", default=[],
                        help="policies (default: every registered one)")
    parser.add_argument("--kv-offloading-size", type=float, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "replays-across")
    args = parser.parse_args(argv)

    sides, fell_back = {}, 0
    for version in args.vllm:
        out = args.out / version
        if replay(version, args, out) != 0:
            print(f"replays_across: the replays on vLLM {version} failed")
            return 1
        sides[version], fallbacks = records(out)
        for name, count in fallbacks.items():
            if count:
                print(f"replays_across: vLLM {version}: {name}: {count} policy fallbacks")
        fell_back += sum(fallbacks.values())
    lines = compare(*sides.values())
    for line in lines:
        print(f"replays_across: {line}")
    same = sum("identical" in line for line in lines)
    print(f"replays_across: vLLM {args.vllm[0]} against {args.vllm[1]}: {same} of {len(lines)} "
          f"replays identical, {fell_back} policy fallbacks")
    return 0 if same == len(lines) and not fell_back else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
