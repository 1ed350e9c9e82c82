"""Workload traces: the file format, load shapes and the builders of every family (`FAMILIES`).

Must not import vllm. Typical use::

    from fairway.traces import build_preset, write_trace, load_trace
    write_trace(build_preset("sec-a"), "sec-a.jsonl")
"""

from fairway.traces.build import (
    FAMILIES,
    PRESETS,
    build_preset,
    build_trace,
    rebuild,
)
from fairway.traces.data import data_dir, data_file, download
from fairway.traces.format import (
    PhaseWindow,
    Trace,
    TraceHeader,
    TraceRequest,
    block_token_ids,
    load_trace,
    write_trace,
)
from fairway.traces.shapes import SHAPES, LoadShape, Phase, get_shape
from fairway.traces.stats import TraceStats, format_stats, trace_stats

__all__ = [
    "FAMILIES",
    "PRESETS",
    "SHAPES",
    "LoadShape",
    "Phase",
    "PhaseWindow",
    "Trace",
    "TraceHeader",
    "TraceRequest",
    "TraceStats",
    "block_token_ids",
    "build_preset",
    "build_trace",
    "data_dir",
    "data_file",
    "download",
    "format_stats",
    "get_shape",
    "load_trace",
    "rebuild",
    "trace_stats",
    "write_trace",
]
