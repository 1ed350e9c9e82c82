"""Mooncake traces (FAST'25 release format), replayed with their real arrivals and sharing.

Format, one JSON object per line: ``timestamp`` (ms from the first request), ``input_length``
and ``output_length`` (tokens), ``hash_ids`` (one id per 512-token block of the prompt, so
``len(hash_ids) == ceil(input_length / 512)``). Any file in this format works (the conversation
trace by default, or e.g. ``toolagent_trace.jsonl`` via ``path``).

Blocks: hash id h becomes block ``mc-<h>`` of 512 tokens; a last block of n < 512 tokens becomes
``mc-<h>:<n>``, so a block id always has one token count. Requests whose hash ids start alike
therefore share exactly those leading blocks.

Window and time scale: records with ``window_start_s <= timestamp/1000 < window_start_s +
window_s`` are kept; their times, counted from the window start, are multiplied by one factor so
that the window's mean offered work is `load` x capacity (work on the ``work_basis``, see
`fairway.traces.shapes`). The release rounds timestamps to ~3 s steps; ``jitter_ms`` spreads
each arrival uniformly over ``[t, t + jitter_ms)`` before scaling (seeded), else requests of one
step arrive together.

Sampling: the release carries ~41k prompt tokens/s, about nine times what one GPU prefills, so
a single-GPU replay of a long stretch would last hours. A short window loses the reuse of
conversations that started before it (a 45 s slice keeps ~7% ideal hits of the file's 37%).
``sample_fraction < 1`` instead keeps whole conversations: a record is kept when a hash of the
seed and its first ``sample_key_blocks`` hash ids falls below the fraction, and the turns of one
conversation share those leading ids (block 0 is a system prompt shared by every request of
the conversation trace, so the key needs two ids there).

Length limit: prompts longer than ``max_prompt_tokens`` are cut to it (``over_length="cap"``:
the leading blocks are kept, so sharing survives) or left out (``"drop"``); the header's ``info``
counts both. Requests carry ``phase: null`` (the arrivals are real, not a load shape).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from fairway.errors import TraceError
from fairway.traces.data import data_file, file_sha256
from fairway.traces.format import Block, TraceRequest, make_request
from fairway.traces.shapes import check_work_basis
from fairway.traces.stats import request_work

logger = logging.getLogger(__name__)

MOONCAKE_FILE = "mooncake/conversation_trace.jsonl"
OVER_LENGTH = ("cap", "drop")


@dataclass(frozen=True, slots=True)
class MooncakeRecord:
    """One validated line of a Mooncake trace file."""

    line: int
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_record(obj: Any, line: int, block_tokens: int) -> MooncakeRecord:
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in obj:
            raise ValueError(f"missing key {key!r}")
    ts, n_in, n_out, ids = obj["timestamp"], obj["input_length"], obj["output_length"], obj[
        "hash_ids"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
        raise ValueError(f"timestamp must be a number of ms >= 0, got {ts!r}")
    if not _is_int(n_in) or n_in < 1:
        raise ValueError(f"input_length must be an integer >= 1, got {n_in!r}")
    if not _is_int(n_out) or n_out < 0:
        raise ValueError(f"output_length must be an integer >= 0, got {n_out!r}")
    if not isinstance(ids, list) or not all(_is_int(h) for h in ids):
        raise ValueError("hash_ids must be a list of integers")
    expected = math.ceil(n_in / block_tokens)
    if len(ids) != expected:
        raise ValueError(
            f"hash_ids has {len(ids)} ids but input_length {n_in} needs "
            f"ceil({n_in}/{block_tokens}) = {expected}"
        )
    return MooncakeRecord(line, int(ts), n_in, n_out, tuple(ids))


@lru_cache(maxsize=4)
def _load_cached(
    path: str, size: int, mtime_ns: int, block_tokens: int
) -> tuple[MooncakeRecord, ...]:
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                try:
                    records.append(_parse_record(json.loads(text), lineno, block_tokens))
                except json.JSONDecodeError as exc:
                    raise TraceError(f"{path}:{lineno}: bad JSON ({exc.msg})") from None
                except ValueError as exc:
                    raise TraceError(f"{path}:{lineno}: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read Mooncake trace {path!r}: {exc}") from None
    if not records:
        raise TraceError(f"{path}: no records")
    # The release is sorted by timestamp; a stable sort keeps other files usable too.
    return tuple(sorted(records, key=lambda r: r.timestamp_ms))


def load_mooncake(path: str | Path, block_tokens: int = 512) -> tuple[MooncakeRecord, ...]:
    """Validated records of a Mooncake trace file, by timestamp; errors name the line."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"Mooncake trace {str(path)!r} not found")
    st = path.stat()
    return _load_cached(str(path), st.st_size, st.st_mtime_ns, block_tokens)


def record_blocks(
    record: MooncakeRecord, block_tokens: int = 512, prefix: str = "mc",
    max_tokens: int | None = None,
) -> list[Block]:
    """The record's prompt as blocks, cut to `max_tokens` when given (see the module docstring)."""
    length = record.input_length if max_tokens is None else min(record.input_length, max_tokens)
    blocks = []
    for i, h in enumerate(record.hash_ids):
        n = min(block_tokens, length - i * block_tokens)
        if n <= 0:
            break
        blocks.append((f"{prefix}-{h}" if n == block_tokens else f"{prefix}-{h}:{n}", n))
    return blocks


@dataclass(frozen=True)
class MooncakeParams:
    """Parameters of the ``mooncake`` family."""

    path: str | None = None
    """A trace file in the Mooncake release format (default: the conversation trace)."""
    load: float = 1.0
    """Mean offered work of the window as a multiple of capacity (sets the time scale)."""
    window_start_s: float = 0.0
    """Start of the slice, in seconds of the original timestamps."""
    window_s: float | None = None
    """Length of the slice in original seconds (None: to the end of the file)."""
    max_prompt_tokens: int | None = None
    """Longest prompt kept as is (None: no limit)."""
    over_length: str = "cap"
    """What to do with a longer prompt: cap (cut to max_prompt_tokens) or drop."""
    sample_fraction: float = 1.0
    """Keep this share of conversations (grouped by their leading hash ids), 1 = all."""
    sample_key_blocks: int = 2
    """Leading hash ids that identify a conversation for sampling."""
    jitter_ms: float = 0.0
    """Spread each arrival uniformly over [t, t + jitter_ms) before scaling (0: as released)."""
    work_basis: str = "prompt"
    """How the load counts work: prompt or ideal (see fairway.traces.shapes)."""
    block_tokens: int = 512
    """Tokens per hash id in the file (512 in the FAST'25 release)."""
    block_prefix: str = "mc"
    """Block-id prefix (change it to keep two files' hash ids apart on one server)."""

    def __post_init__(self) -> None:
        check_work_basis(self.work_basis)
        if self.over_length not in OVER_LENGTH:
            raise TraceError(f"over_length must be cap or drop, got {self.over_length!r}")
        if not self.load > 0:
            raise TraceError(f"load must be > 0, got {self.load}")
        if self.window_start_s < 0 or (self.window_s is not None and self.window_s <= 0):
            raise TraceError("window_start_s must be >= 0 and window_s > 0")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise TraceError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        if not 0 < self.sample_fraction <= 1 or self.sample_key_blocks < 1:
            raise TraceError("sample_fraction must be in (0, 1] and sample_key_blocks >= 1")
        if self.jitter_ms < 0 or self.block_tokens < 1:
            raise TraceError("jitter_ms must be >= 0 and block_tokens >= 1")


def _sampled(record: MooncakeRecord, seed: int, params: MooncakeParams) -> bool:
    if params.sample_fraction >= 1:
        return True
    key = ",".join(map(str, record.hash_ids[: params.sample_key_blocks]))
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < params.sample_fraction


def build_mooncake(
    family: str, seed: int, capacity_tps: float, params: MooncakeParams
) -> tuple[list[TraceRequest], dict[str, Any], float]:
    """Requests of a Mooncake trace, the header's ``info`` and the scaled duration in seconds."""
    path = Path(params.path) if params.path else data_file(MOONCAKE_FILE)
    records = load_mooncake(path, params.block_tokens)
    start_ms = params.window_start_s * 1000.0
    end_ms = math.inf if params.window_s is None else start_ms + params.window_s * 1000.0
    window = [
        r for r in records if start_ms <= r.timestamp_ms < end_ms and _sampled(r, seed, params)
    ]
    if not window:
        raise TraceError(
            f"{path}: no (sampled) request in the window [{params.window_start_s}, "
            f"{params.window_start_s + (params.window_s or math.inf)}) s; the file spans "
            f"{records[0].timestamp_ms / 1000:.1f}-{records[-1].timestamp_ms / 1000:.1f} s"
        )
    limit = params.max_prompt_tokens
    capped = dropped = 0
    kept = []
    for r in window:
        if limit is not None and r.input_length > limit:
            if params.over_length == "drop":
                dropped += 1
                continue
            capped += 1
        kept.append(r)
    if not kept:
        raise TraceError(f"{path}: every request in the window is longer than {limit} tokens")
    jitter = np.random.default_rng([seed, 1]).random(len(kept)) * params.jitter_ms
    raw_s = [(r.timestamp_ms - start_ms + j) / 1000.0 for r, j in zip(kept, jitter, strict=True)]
    order = sorted(range(len(kept)), key=lambda i: (raw_s[i], i))
    blocks = [
        record_blocks(kept[i], params.block_tokens, params.block_prefix, limit) for i in order
    ]
    # Work is measured on prompts placed in order; times do not matter for it.
    probe = [make_request(f"p{i}", 0.0, b) for i, b in enumerate(blocks)]
    work = float(sum(request_work(probe, params.work_basis)))
    if params.window_s is not None:
        span = params.window_s
    else:
        span = (records[-1].timestamp_ms - start_ms + params.jitter_ms) / 1000.0
    span = span if span > 0 else 1.0
    scale = work / (params.load * capacity_tps * span)
    reqs = []
    for i, b in zip(order, blocks, strict=True):
        r = kept[i]
        tags: dict[str, Any] = {
            "line": r.line, "timestamp_ms": r.timestamp_ms, "output_length": r.output_length,
        }
        if limit is not None and r.input_length > limit:
            tags["capped_from"] = r.input_length
        reqs.append(make_request(f"{family}-L{r.line:06d}", raw_s[i] * scale, b, tags=tags))
    info = {
        "work_basis": params.work_basis,
        "time_scale": round(scale, 9),
        "num_in_window": len(window),
        "sample_fraction": params.sample_fraction,
        "num_capped": capped,
        "num_dropped": dropped,
        "sources": {MOONCAKE_FILE if params.path is None else path.name: file_sha256(path)},
    }
    return reqs, info, span * scale
