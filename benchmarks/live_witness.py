"""Live witness: cache hits behind long misses, against `fairway serve` with vLLM's own client.

    fairway tiny-model /tmp/tiny16k --max-len 16384 --hidden 512 --layers 4 --dtype float32
    python benchmarks/live_witness.py --serve /tmp/tiny16k --out results/live-witness \
        --serve-arg=--gpu-memory-utilization=0.15

The trace (the head-of-line check of `../shared/tools/hol_timed_trace.py`, as a Fairway trace with
phases `hit` and `miss`): one 1,536-token document, computed by a first request at t = 0; from
t = 2 s, hits (the document + 64 new tokens) at 4/s until t = 32 s; misses of 12,288 new tokens at
t = 8, 16 and 24 s. The engine runs 1,024-token steps (`--max-num-batched-tokens`), a 16k
context and 2,048 KV blocks of 32 tokens (a miss and the hits fit together); with the model above
a 12,288-token prompt takes ~4 s idle on a 2-core CPU. For each policy (fcfs, lpm,
fairway-step, fairway) `benchmarks/fidelity.py` starts the server, replays the trace `--runs`
times with `vllm bench serve` (timed_trace) and once on the virtual clock with the same engine
settings, priced by a table it measures first on the same server up to the trace's longest
prompt (`--reprofile`). The table: per policy and phase, live
median / p90 / p99 with their spread over the runs beside the virtual prediction.

Flags: `--runs` (3), `--policy` (repeatable), `--out`, `--serve-arg ARG` (repeatable, for
`fairway serve`), `--profile PATH` (a table measured earlier on this server; default: measure it
first), `--num-blocks` (KV blocks of 32 tokens, default 2,048).

Goals: `fairway`'s hits' p90 <= half of FCFS's and LPM's, its misses within 10% of
FCFS's, and the virtual replay within 15% of live.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fidelity  # noqa: E402

from fairway.replay.bench import new_out_dir  # noqa: E402
from fairway.traces.format import Trace, TraceHeader, make_request, write_trace  # noqa: E402

DOC_TOKENS, HIT_TOKENS, MISS_TOKENS = 1_536, 64, 12_288
POLICIES = ("fcfs", "lpm", "fairway-step", "fairway")
#: The table's lengths: the default ladder and the trace's prompt lengths (hits, misses).
PROFILE_LENGTHS = "128,256,512,1024,1600,2048,4096,8192,12288"


def build(hits_per_s: float = 4.0, duration_s: float = 32.0,
          miss_at: tuple[float, ...] = (8.0, 16.0, 24.0)) -> Trace:
    """The head-of-line trace (see the module docstring)."""
    doc = ("lw-doc", DOC_TOKENS)
    requests = [make_request("doc", 0.0, [doc, ("lw-first", HIT_TOKENS)], phase="hit")]
    t, i = 2.0, 0
    while t < duration_s:
        requests.append(make_request(f"hit-{i:03d}", t, [doc, (f"lw-h{i}", HIT_TOKENS)],
                                     phase="hit"))
        i += 1
        t += 1.0 / hits_per_s
    for k, at in enumerate(miss_at):
        requests.append(make_request(f"miss-{k}", at + 0.001, [(f"lw-m{k}", MISS_TOKENS)],
                                     phase="miss"))
    requests.sort(key=lambda r: (r.arrival_s, r.request_id))
    header = TraceHeader(
        family="live-witness", seed=0, shape=None,
        params={"hits_per_s": hits_per_s, "duration_s": duration_s, "miss_at": list(miss_at),
                "doc_tokens": DOC_TOKENS, "hit_tokens": HIT_TOKENS, "miss_tokens": MISS_TOKENS},
        num_requests=len(requests), duration_s=duration_s,
    )
    return Trace(header, requests)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--serve", required=True, metavar="MODEL_DIR", help="the tiny model (16k)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--policy", action="append", default=None)
    p.add_argument("--out", default=None, metavar="DIR")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG")
    p.add_argument("--profile", default=None, metavar="PATH",
                   help="a table measured earlier on this server (default: measure it first)")
    p.add_argument("--num-blocks", type=int, default=2048,
                   help="KV blocks of 32 tokens (default 2,048: a miss and the hits together)")
    args, rest = p.parse_known_args(argv)
    out_dir = new_out_dir(args.out, "live-witness")
    trace_path = out_dir / "live-witness-trace.jsonl"
    write_trace(build(), trace_path)
    forwarded = [
        "--serve", args.serve,
        *(["--profile", args.profile] if args.profile else
          ["--reprofile", "--profile-lengths", PROFILE_LENGTHS]),
        "--num-blocks", str(args.num_blocks),
        "--trace", str(trace_path), "--client", "vllm-bench", "--runs", str(args.runs),
        "--max-num-batched-tokens", "1024", "--max-model-len", "16384",
        "--cache-fraction", "1.0", "--out", str(out_dir / "fidelity"),
        *[f"--serve-arg={a}" for a in args.serve_arg], *rest,
    ]
    for policy in args.policy or POLICIES:
        forwarded += ["--policy", policy]
    return fidelity.main(forwarded)


if __name__ == "__main__":
    sys.exit(main())
