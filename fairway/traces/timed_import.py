"""Import a timed trace (Mooncake-style JSONL, what `vllm bench serve --dataset-name timed_trace`
replays) as a Fairway trace, so Fairway's clients replay the very requests vLLM's client sends.

The inverse of `fairway.traces.export`. Each line holds ``timestamp``, ``input_length``,
``output_length`` and ``hash_ids``; vLLM's `TimedTrace` loader (vllm/benchmarks/datasets/
datasets.py, 0.32.0) turns them into a prompt, and this module follows it rule for rule:

* **Chunks.** Hash id k of a line stands for `chunk_tokens` tokens (vLLM's
  ``--timed-trace-chunk-hash-size``: 512 for Mooncake's traces, 16 by default). vLLM walks the ids
  while tokens remain, expanding each to ``min(chunk_tokens, tokens left)`` tokens keyed by
  ``"<id>:<size>"``: equal keys give equal token ids. Block ids here are exactly those keys, so two
  requests share a block exactly when vLLM gives them the same tokens: a full chunk by its hash id,
  a short last chunk only with a short chunk of the same id and size.
* **Too few or too many ids.** Ids beyond ``ceil(input_length / chunk_tokens)`` are ignored.
  When ``input_length`` needs more tokens than ``len(hash_ids) * chunk_tokens``, vLLM's prompt
  simply ends with the last id (it sends, and reports, the shorter prompt), so the import cuts it
  there too; the header's ``info`` counts such requests (``num_cut``, ``tokens_cut``) and each
  one is tagged ``cut_from`` with its ``input_length``.
* **Order and time.** vLLM sends the lines in file order, request i at ``timestamp_i *
  multiplier`` seconds after it starts (a line earlier than the one before it goes out right
  after it). Request i here is line i (ids ``t000000``, ... as vLLM's ``<prefix>i``), so
  timestamps must not decrease: a file where they do is rejected, never re-sorted. Arrivals are
  counted from the first line (``(timestamp - first) * multiplier``); vLLM also waits ``first *
  multiplier`` before the first request, a constant offset that changes no request's TTFT
  (``info["first_timestamp"]``).
* **Outputs.** ``output_length`` becomes ``max_tokens`` (vLLM ignores EOS for timed traces, so
  generation runs that long); it must be >= 1, and prompts must have at least one token (vLLM would
  send an empty prompt).

Only the default field names are read (vLLM's ``--timed-trace-label-*`` options are not mirrored).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from fairway.errors import TraceError
from fairway.traces.data import file_sha256
from fairway.traces.format import Trace, TraceHeader, TraceRequest, make_request

#: The header's family for an imported trace.
FAMILY = "timed-trace"
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


def _count(row: dict[str, Any], key: str, minimum: int) -> int:
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _timestamp(row: dict[str, Any]) -> float:
    value = row["timestamp"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value >= 0):
        raise ValueError(f"timestamp must be a finite number >= 0, got {value!r}")
    return float(value)


def _blocks(row: dict[str, Any], chunk_tokens: int) -> tuple[list[tuple[str, int]], int]:
    """The prompt's blocks as vLLM's loader expands them, and the tokens it cannot cover."""
    hash_ids = row["hash_ids"]
    if not isinstance(hash_ids, list):
        raise ValueError(f"hash_ids must be a list, got {type(hash_ids).__name__}")
    left = _count(row, "input_length", 1)
    blocks = []
    for h in hash_ids:
        if left <= 0:
            break
        if isinstance(h, bool) or not isinstance(h, int | str):
            raise ValueError(f"a hash id must be an integer or a string, got {h!r}")
        size = min(chunk_tokens, left)
        blocks.append((f"{h}:{size}", size))
        left -= size
    if not blocks:
        raise ValueError("hash_ids is empty: the prompt would have no tokens")
    return blocks, left


def _parse_line(text: str, chunk_tokens: int) -> tuple[float, list[tuple[str, int]], int, int]:
    """(timestamp, blocks, max_tokens, tokens cut) of one line; ValueError says what is wrong."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"bad JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise ValueError("a line must be a JSON object")
    missing = [k for k in _FIELDS if k not in row]
    if missing:
        raise ValueError(f"missing field {', '.join(missing)} (needs {', '.join(_FIELDS)})")
    blocks, cut = _blocks(row, chunk_tokens)
    return _timestamp(row), blocks, _count(row, "output_length", 1), cut


def import_timed_trace(path: str | Path, *, chunk_tokens: int, sec_multiplier: float = 1.0,
                       name: str | None = None) -> Trace:
    """Read a timed-trace JSONL file as vLLM's `TimedTrace` loader would (module docstring).

    Args:
        path: the JSONL file (one request per line, no blank lines, as vLLM reads it).
        chunk_tokens: tokens per hash id (vLLM's ``--timed-trace-chunk-hash-size``).
        sec_multiplier: seconds per timestamp unit (vLLM's ``--timed-trace-sec-multiplier``;
            0.001 for millisecond timestamps).
        name: recorded as the header's ``preset``, so replays name their runs ``<name>-seed0``
            (default: ``timed-trace-seed0``).

    Raises:
        TraceError: an unreadable file, a bad argument, or a bad line (with its number).
    """
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise TraceError(f"chunk_tokens must be an integer >= 1, got {chunk_tokens!r}")
    if not (math.isfinite(sec_multiplier) and sec_multiplier > 0):
        raise TraceError(f"sec_multiplier must be a finite number > 0, got {sec_multiplier!r}")
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise TraceError(f"timed trace {str(path)!r} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read timed trace {str(path)!r}: {exc}") from None
    if not lines:
        raise TraceError(f"{path}: empty file, expected one JSON request per line")
    requests: list[TraceRequest] = []
    first = last = 0.0
    num_cut = tokens_cut = 0
    for lineno, text in enumerate(lines, start=1):
        try:
            if not text.strip():
                raise ValueError("empty line (vLLM's loader cannot read it either)")
            timestamp, blocks, max_tokens, cut = _parse_line(text, chunk_tokens)
            if not requests:
                first = last = timestamp
            elif timestamp < last:
                raise ValueError(
                    f"timestamp {timestamp:g} is earlier than the line before ({last:g}); vLLM "
                    "sends lines in file order, so a replay of this file cannot keep both")
        except ValueError as exc:
            raise TraceError(f"{path}:{lineno}: {exc}") from None
        last = timestamp
        tags: dict[str, Any] = {"line": lineno}
        if cut:
            num_cut += 1
            tokens_cut += cut
            tags["cut_from"] = sum(n for _, n in blocks) + cut
        requests.append(make_request(
            f"t{len(requests):06d}", (timestamp - first) * sec_multiplier, blocks, tags=tags,
            max_tokens=max_tokens))
    header = TraceHeader(
        family=FAMILY,
        seed=0,
        shape=None,
        params={"source": path.name, "chunk_tokens": chunk_tokens,
                "sec_multiplier": sec_multiplier},
        num_requests=len(requests),
        preset=name,
        duration_s=requests[-1].arrival_s,
        info={"sources": {path.name: file_sha256(path)}, "first_timestamp": first,
              "num_cut": num_cut, "tokens_cut": tokens_cut},
    )
    return Trace(header, tuple(requests))
