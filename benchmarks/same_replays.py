#!/usr/bin/env python
"""Two runs' replays compared request by request: did a change move any scheduler decision?

Reads the `replays/*.json` of two output folders of `fairway bench` or of an experiment script
(E2's `--out`, say), and compares every replay present in either, request by request, on the
records' timing and cache fields (`compat/replays_across.py`'s `FIELDS`: arrival, first
scheduled, first token, cached tokens, tier tokens, error; wall time is not compared). The same
decisions give the same records to the bit. Prints one line per replay and a summary; exits 1 if
any replay differs, is missing on one side, or had a policy fallback.

Usage: same_replays.py BEFORE_DIR AFTER_DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "compat"))

from replays_across import compare, records  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    sides = []
    fell_back = 0
    for folder in (args.before, args.after):
        if not (folder / "replays").is_dir():
            print(f"same_replays: {folder} has no replays/ folder")
            return 1
        found, fallbacks = records(folder)
        sides.append(found)
        fell_back += sum(fallbacks.values())
    lines = compare(*sides)
    for line in lines:
        print(f"same_replays: {line}")
    same = sum("identical" in line for line in lines)
    print(f"same_replays: {same} of {len(lines)} replays identical, {fell_back} policy fallbacks")
    return 0 if lines and same == len(lines) and not fell_back else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
