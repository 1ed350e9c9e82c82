"""Documentation is executable: every command line in the ```bash blocks of README.md, FAIRWAY.md,
docs/*.md and benchmarks/README.md works as written in the README's environment (`make setup`:
`.venv`, the repository as the working directory).

Every command must be classified in `COMMANDS` below, by its exact text (continuation lines
joined, the trailing comment removed); a command that is not, or an entry no document uses any
more, fails `test_every_documented_command_is_classified` with the file, line and text. Kinds:

* RUN: cheap; run for real in a temporary directory (paths the entry lists are redirected there).
* PARSE: heavy (starts a server, profiles, benchmarks for minutes); run with its exact arguments up
  to argument validation: the program's own argparse parser parses them, then it stops.
* MAKE: a make target; `make -n TARGET` shows it exists and what it runs.
* EXTERNAL: needs what CI has not (docker, a GPU cluster); the reason says what, nothing runs.
* BROKEN: known not to work as written yet (the reason names the issue); expected to fail, and
  strictly: when it starts working the test says so, and it must be re-classified.

Placeholders in the docs (MODEL, `[vLLM args]`) are replaced as each entry says. A bare `fairway`
or `vllm` (not `.venv/bin/...`) needs `.venv/bin` on PATH (an activated venv, or the container);
such entries say so in `where`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "FAIRWAY.md", "docs/*.md", "benchmarks/README.md")
VENV_BIN = Path(sys.executable).parent
#: Printed by the runner when the program's parser accepted the arguments.
PARSED = "DOCS-COMMAND-PARSED"

#: Runs a Python program up to its first argparse parse, then exits 0 (or argparse's exit 2).
_RUNNER = f"""
import argparse, importlib, runpy, sys
kind, target, *argv = sys.argv[1:]
Parser = argparse.ArgumentParser
parse_args, parse_known = Parser.parse_args, Parser.parse_known_args
inside = []
def stop():
    print({PARSED!r}, flush=True)
    raise SystemExit(0)
def only_parse(self, args=None, namespace=None):
    inside.append(1)
    parse_args(self, args, namespace)
    stop()
def only_parse_known(self, args=None, namespace=None):
    result = parse_known(self, args, namespace)
    if inside:
        return result
    stop()
argparse.ArgumentParser.parse_args = only_parse
argparse.ArgumentParser.parse_known_args = only_parse_known
if kind == "module":
    sys.argv = [target, *argv]
    runpy.run_module(target, run_name="__main__", alter_sys=True)
elif kind == "path":
    sys.argv = [target, *argv]
    runpy.run_path(target, run_name="__main__")
else:
    module, _, func = target.partition(":")
    sys.argv = [kind, *argv]
    sys.exit(getattr(importlib.import_module(module), func)())
"""


@dataclass(frozen=True)
class Entry:
    """How one documented command is checked, and why that way."""

    kind: str  # RUN, PARSE, MAKE, EXTERNAL, BROKEN
    reason: str
    #: Text replacements before running (placeholders, fixed paths -> the temporary directory).
    replace: tuple[tuple[str, str], ...] = ()
    #: Where a bare program name comes from.
    where: str = ""
    #: A console script of an optional extra (`vllm-router`: the `router` extra); without it in
    #: the environment the command is skipped, saying which extra installs it.
    needs: str = ""


_ACTIVATED = "bare `fairway`/`vllm`: needs .venv/bin on PATH (source .venv/bin/activate)"
_IN_IMAGE = "runs inside the container image or on a deployment host, where it is on PATH"
_VLLM_ARGS = (("[vLLM args ...]", ""), ("[vLLM args]", ""))
_SERVER = "starts a vLLM server and loads a model"

#: Every documented command, by its exact text.
COMMANDS: dict[str, Entry] = {
    # README.md
    "make bench": Entry("MAKE", "the full default benchmark (minutes)"),
    "make test": Entry("MAKE", "the test suite itself"),
    # FAIRWAY.md (upgrading vLLM)
    "make rebase VLLM=0.34.0": Entry(
        "MAKE", "fetches a release and runs the matrix and vLLM's own tests on it (~20 min); "
        "tests/unit/test_rebase.py tests its parts, CI runs the matrix"
    ),
    ".venv/bin/fairway serve MODEL --profile my-gpu.json [vLLM args]":
        Entry("PARSE", _SERVER, _VLLM_ARGS),
    ".venv/bin/fairway profile --model MODEL -o my-gpu.json":
        Entry("PARSE", "profiling starts a server and measures for minutes"),
    ".venv/bin/fairway bench --policy fcfs --policy fairway --policy-arg fast_weight=2":
        Entry("PARSE", "virtual-clock replays of the two SEC spike traces (minutes)"),
    ".venv/bin/fairway replay --url http://127.0.0.1:8000 --trace t.jsonl":
        Entry("PARSE", "needs a running server and a trace file"),
    ".venv/bin/fairway bench --trace musique --policy fcfs --policy fairway --open-loop":
        Entry("PARSE", "two replays of the MuSiQue agent sessions at their recorded arrivals "
              "(tests/integration/test_closed_loop.py runs both arrival modes)"),
    # FAIRWAY.md (fleet replay)
    ".venv/bin/fairway bench --trace hit-heavy --quick --nodes 2 --router round-robin "
    "--policy fcfs --policy fairway --cache-fraction 1.5":
        Entry("RUN", "two fleet replays of 2 nodes on the synthetic hit-heavy preset's quick "
              "variant at 2 x capacity (built without source data; about a minute)"),
    ".venv/bin/python benchmarks/fleet_capacity.py --quick --nodes 2 --routers round-robin "
    "vllm-cache-aware --policies fcfs fairway --start-load 0.25 --min-load 0.125 --max-load 0.25 "
    "--tolerance 0.25 --offered-load 0.5 --max-nodes 2 --workers 0 --out results/capacity-demo":
        Entry("PARSE", "fleet replays (half a minute); tests/integration/test_fleet_benchmarks.py "
              "runs it as written and checks its verdicts"),
    # (also in FAIRWAY.md)
    ".venv/bin/fairway inspect http://127.0.0.1:8000 --window-s 60":
        Entry("PARSE", "needs a running server (tests/e2e/test_inspect_live.py runs it for real)"),
    # FAIRWAY.md
    "fairway serve MODEL --profile my-gpu.json [vLLM args ...]":
        Entry("PARSE", _SERVER, _VLLM_ARGS, where=_ACTIVATED),
    "vllm serve MODEL --scheduler-cls fairway.vllm.scheduler.FairwayScheduler "
    "--scheduling-policy fcfs --enable-prefix-caching --additional-config "
    "'{\"fairway\": {\"policy\": \"fairway\", \"profile\": \"my-gpu.json\"}}'":
        Entry("PARSE", _SERVER, (("my-gpu.json", "cpu-tiny-llama"),), where=_ACTIVATED),
    "fairway profile --model meta-llama/Llama-3.1-8B-Instruct -o h100-llama3.1-8b.json -- "
    "--max-model-len 32768 --max-num-batched-tokens 8192":
        Entry("PARSE", "profiling an 8B model on a GPU", where=_ACTIVATED),
    "fairway profile --url http://10.0.0.1:8000 --hardware \"1 x H100 80GB\" -o "
    "h100-llama3.1-8b.json":
        Entry("PARSE", "needs a running GPU server", where=_ACTIVATED),
    ".venv/bin/python -m fairway.supervisor --grace-s 10 -- .venv/bin/python -m "
    "vllm.entrypoints.openai.api_server --model MODEL --scheduler-cls "
    "fairway.vllm.scheduler.FairwayScheduler --enable-prefix-caching":
        Entry("PARSE", _SERVER),
    "fairway serve MODEL --fairway-option tenants='{\"team-a\": 2, \"team-b\": 1}' "
    "--fairway-option tenant_source=api-key --fairway-option tenant_keys=keys.json "
    "[vLLM args ...]":
        Entry("PARSE", _SERVER + " (tests/e2e/test_live_trust.py runs the api-key source)",
              _VLLM_ARGS, where=_ACTIVATED),
    "fairway serve MODEL --fairway-option tenants='{\"team-a\": 2, \"team-b\": 1}' "
    "--fairway-option tenant_source=header --scheduling-policy priority [vLLM args ...]":
        Entry("PARSE", _SERVER + " behind a gateway that sets x-fairway-tenant",
              _VLLM_ARGS, where=_ACTIVATED),
    ".venv/bin/fairway serve MODEL --fairway-option decision_trace=decisions.jsonl "
    "--fairway-option decision_trace_every=10":
        Entry("PARSE", _SERVER),
    ".venv/bin/fairway profile --from-step-log steps.jsonl --chunk-tokens 2048 --max-model-len "
    "8192 -o live-steps.json":
        Entry("PARSE", "needs a step log a server wrote under load"),
    ".venv/bin/python benchmarks/e6_tenants.py --out results/e6":
        Entry("PARSE", "replays three presets under five policies with alone runs (~2 min)"),
    ".venv/bin/python benchmarks/scheduler_overhead.py --policies fairway fairway+tenants "
    "--tenants 8 --sizes 1000 --no-memory":
        Entry("PARSE", "a timing benchmark (~80 s)"),
    ".venv/bin/python benchmarks/scheduler_overhead.py --policies fairway fairway+tier "
    "fairway+tier+blind --sizes 1000 --no-memory":
        Entry("PARSE", "a timing benchmark (~40 s); tests/integration/test_overhead_benchmark.py "
              "runs its +tier arm at a tiny size"),
    ".venv/bin/python benchmarks/e7_offload_tier.py --out results/e7":
        Entry("PARSE", "204 replays with the tier (~25 min)"),
    ".venv/bin/python benchmarks/live_tenants.py --serve /tmp/lt-tiny --profile "
    "results/live-tenants-profile.json --runs 3 --out results/live-tenants":
        Entry("PARSE", "starts six tiny-model servers and replays live (~25 min)"),
    # docs/deployment.md
    "docker build -t vllm-fairway .":
        Entry("EXTERNAL", "needs docker (tests/unit/test_dockerfile.py checks the Dockerfile)"),
    "docker run --gpus all --ipc=host -p 8000:8000 -v "
    "~/.cache/huggingface:/root/.cache/huggingface -v "
    "\"$PWD/h100-llama3.1-8b.json:/profiles/h100.json:ro\" -e "
    "FAIRWAY_PROFILE=/profiles/h100.json vllm-fairway meta-llama/Llama-3.1-8B-Instruct "
    "--max-model-len 32768":
        Entry("EXTERNAL", "needs docker and a GPU"),
    "VLLM_NIXL_SIDE_CHANNEL_HOST=10.0.0.1 VLLM_NIXL_SIDE_CHANNEL_PORT=5600 fairway serve "
    "meta-llama/Llama-3.1-8B-Instruct --profile /profiles/h100.json --port 8100 "
    "--kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_producer\"}'":
        Entry("PARSE", "a prefill node on a GPU host", where=_IN_IMAGE),
    "vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8200 --kv-transfer-config "
    "'{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_consumer\"}'":
        Entry("PARSE", "a decode node on a GPU host", where=_IN_IMAGE),
    "fairway serve meta-llama/Llama-3.1-8B-Instruct --profile h100-llama3.1-8b.json "
    "--kv-offloading-size 64 --additional-config '{\"fairway\": {\"tier\": \"priced\"}}'":
        Entry("PARSE", "a GPU server with vLLM's CPU offload tier (the CPU build's worker "
              "refuses the tier)", where=_IN_IMAGE),
    ".venv/bin/fairway bench --trace sec-a --policy fcfs --policy fairway --kv-offloading-size 8":
        Entry("PARSE", "two replays of sec-a with the offload tier modelled"),
    "ray start --head":
        Entry("EXTERNAL", "starts a Ray cluster head (tests/integration run Ray locally)"),
    "fairway serve meta-llama/Llama-3.1-70B-Instruct --profile "
    "/profiles/h100x4-llama3.1-70b.json --tensor-parallel-size 4 "
    "--distributed-executor-backend ray":
        Entry("PARSE", "tensor parallelism over 4 GPUs on Ray", where=_IN_IMAGE),
    # docs/deployment.md, many prefill nodes behind vLLM's router (the `router` extra)
    "make setup FAIRWAY_EXTRAS=router":
        Entry("MAKE", "the set-up with the `router` extra (vllm-router)"),
    ".venv/bin/fairway tiny-model /tmp/tiny-router --max-len 8192 --hidden 256 --layers 2 "
    "--dtype float32":
        Entry("RUN", "writes a tiny model in seconds",
              (("/tmp/tiny-router", "{tmp}/tiny-router"),)),
    "PYTHONHASHSEED=0 VLLM_CPU_OMP_THREADS_BIND=0 .venv/bin/fairway serve /tmp/tiny-router "
    "--port 8001 --policy fairway --block-size 32 --max-num-seqs 64 --dtype float32 "
    "--load-format dummy --enforce-eager --num-gpu-blocks-override 384 "
    "--max-num-batched-tokens 1024 --max-model-len 8192 --gpu-memory-utilization 0.15 "
    "--kv-events-config "
    "'{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\"}'":
        Entry("PARSE", "a node of the live router benchmark (a server; benchmarks/live_router.py "
              "and tests/e2e/test_router.py start it)"),
    "PYTHONHASHSEED=0 VLLM_CPU_OMP_THREADS_BIND=1 .venv/bin/fairway serve /tmp/tiny-router "
    "--port 8002 --policy fairway --block-size 32 --max-num-seqs 64 --dtype float32 "
    "--load-format dummy --enforce-eager --num-gpu-blocks-override 384 "
    "--max-num-batched-tokens 1024 --max-model-len 8192 --gpu-memory-utilization 0.15 "
    "--kv-events-config "
    "'{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5558\"}'":
        Entry("PARSE", "a node of the live router benchmark (a server; benchmarks/live_router.py "
              "and tests/e2e/test_router.py start it)"),
    ".venv/bin/vllm-router --port 8000 --worker-urls http://127.0.0.1:8001 "
    "http://127.0.0.1:8002 --policy cache_aware --worker-startup-check-interval 1":
        Entry("PARSE", "a router in front of two running nodes", needs="vllm-router"),
    ".venv/bin/vllm-router --port 8000 --worker-urls http://127.0.0.1:8001 "
    "http://127.0.0.1:8002 --policy kv_aware --worker-startup-check-interval 1 "
    "--kv-event-source http://127.0.0.1:8001=tcp://127.0.0.1:5557 "
    "--kv-event-source http://127.0.0.1:8002=tcp://127.0.0.1:5558 --kv-event-block-size 32 "
    "--kv-event-model /tmp/tiny-router":
        Entry("PARSE", "a router in front of two running nodes publishing KV events",
              needs="vllm-router"),
    ".venv/bin/vllm bench serve --backend vllm --base-url http://127.0.0.1:8000 --model "
    "/tmp/tiny-router --tokenizer /tmp/tiny-router --dataset-name timed_trace --dataset-path "
    "results/live-router/replays/trace-vllm-timed.jsonl --timed-trace-chunk-hash-size 16 "
    "--num-prompts 268 --save-result --save-detailed --result-dir results/vllm-bench":
        Entry("PARSE", "needs the router and its nodes running, and the trace the benchmark "
              "below writes"),
    ".venv/bin/python benchmarks/live_router.py --serve /tmp/tiny-router --out "
    "results/live-router":
        Entry("PARSE", "starts two nodes per node policy and a router per run (~30 min); "
              "tests/e2e/test_router.py runs its path at a small size"),
    # docs/results.md
    ".venv/bin/python benchmarks/e1_sec_spikes.py --out results/e1":
        Entry("PARSE", "26 replays (about a minute)"),
    ".venv/bin/python benchmarks/e2_p99_scenarios.py --out results/e2":
        Entry("PARSE", "240 replays (minutes); the overload scenarios build from ../shared data"),
    ".venv/bin/python benchmarks/tail_analysis.py --replays results/e2/replays --policy fcfs "
    "--policy lpm --policy ragcache --policy fairway --out results/tail":
        Entry("PARSE", "reads the replay files the E2 command before it writes"),
    ".venv/bin/python benchmarks/e3_flood.py --out results/e3 --policy fcfs --policy lpm "
    "--policy klpm --policy klpm-4 --policy klpm-8 --policy hrrn --policy fairway-step "
    "--policy fairway":
        Entry("PARSE", "replays of the flood at four miss sizes (minutes)"),
    ".venv/bin/python benchmarks/e4_ablation.py --out results/e4-step":
        Entry("PARSE", "8 replays of the full flood trace"),
    ".venv/bin/python benchmarks/e5_tradeoff.py --out results/e5":
        Entry("PARSE", "the trade-off sweep: dozens of flood replays (minutes)"),
    ".venv/bin/python benchmarks/hit_miss_split.py --out results/hit-miss":
        Entry("PARSE", "18 replays of the hit-heavy and long-context presets"),
    ".venv/bin/python benchmarks/long_miss_hits.py --out results/long-miss":
        Entry("PARSE", "six replays of a 61 s overloaded trace"),
    ".venv/bin/fairway tiny-model /tmp/tiny16k --max-len 16384 --hidden 512 --layers 4 --dtype "
    "float32":
        Entry("RUN", "writes a tiny model in seconds", (("/tmp/tiny16k", "{tmp}/tiny16k"),)),
    ".venv/bin/python benchmarks/live_witness.py --serve /tmp/tiny16k --out results/live-witness "
    "--serve-arg=--gpu-memory-utilization=0.15":
        Entry("PARSE", "profiles, then starts four servers and replays live (about 10 minutes)"),
    ".venv/bin/fairway tiny-model /tmp/tiny --max-len 8192":
        Entry("RUN", "writes a tiny model in seconds", (("/tmp/tiny", "{tmp}/tiny"),)),
    ".venv/bin/python benchmarks/fidelity.py --reprofile --profile-repeats 7 --serve /tmp/tiny "
    "--quick --client fairway --client vllm-bench --policy fcfs --policy lpm --policy "
    "fairway-step --policy fairway --step-log --client-cpus 0 "
    "--serve-arg=--gpu-memory-utilization=0.15 --serve-arg=--dtype=float32 --out "
    "results/fidelity-sec-a":
        Entry("PARSE", "starts servers and replays live for about an hour"),
    ".venv/bin/python benchmarks/fidelity.py --profile results/fidelity-sec-a/profile.json "
    "--live-from results/fidelity-sec-a --quick --client fairway --client vllm-bench --policy "
    "fcfs --policy lpm --policy fairway-step --policy fairway --fit-live-steps --out "
    "results/fidelity-sec-a-fitted":
        Entry("PARSE", "reads the live runs the command before it saved"),
    "python3 ../shared/tools/mooncake_tiny_timed_trace.py mooncake-100.jsonl 8000 100 3500 3500":
        Entry("EXTERNAL", "needs the Mooncake conversation trace in ../shared/data, which a "
              "user's machine does not have"),
    ".venv/bin/fairway trace import mooncake-100.jsonl -o mooncake-100.jsonl.gz --chunk-tokens "
    "512 --sec-multiplier 0.001 --name mooncake-tiny-100":
        Entry("PARSE", "reads the file the command before it writes from ../shared data"),
    ".venv/bin/python benchmarks/fidelity.py --reprofile --profile-repeats 7 --serve /tmp/tiny "
    "--trace mooncake-100.jsonl.gz --max-model-len 4096 --client fairway --client vllm-bench "
    "--policy fcfs --policy lpm --policy fairway-step --policy fairway --step-log --fit-live-steps "
    "--server-cpus 0 --engine-cpus 1 --client-cpus 0 --serve-arg=--gpu-memory-utilization=0.15 "
    "--serve-arg=--dtype=float32 --out results/fidelity-mooncake":
        Entry("PARSE", "starts servers and replays live for about 45 minutes"),
    ".venv/bin/python benchmarks/fleet_grid.py --quick --nodes 8 --out results/fleet-grid-quick-N8":
        Entry("PARSE", "126 fleet replays of 8 nodes (about 27 minutes on 2 cores); "
              "tests/integration/test_fleet_benchmarks.py runs a small grid"),
    ".venv/bin/python benchmarks/scheduler_overhead.py --policies fairway --sizes 1000 10000 "
    "--no-memory":
        Entry("PARSE", "minutes of engine steps at 1,000 and 10,000 waiting"),
    # benchmarks/README.md
    ".venv/bin/fairway bench --trace mooncake-long --max-num-batched-tokens 8192":
        Entry("PARSE", "every policy on the long-context Mooncake preset (about a minute)"),
    ".venv/bin/fairway bench --trace tenants --policy fcfs --policy lpm --cache-fraction 1.5":
        Entry("PARSE", "two policies on the two-tenant preset (about 20 s)"),
    ".venv/bin/fairway bench --trace agent-sessions --policy fcfs --policy lpm --policy fairway "
    "--max-num-batched-tokens 8192":
        Entry("PARSE", "three closed-loop replays of the coding-agent sessions preset (about "
              "30 s)"),
    ".venv/bin/fairway trace build sec-a -o sec-a.jsonl":
        Entry("RUN", "builds a trace in seconds (the shipped preset when the sources are absent)"),
    ".venv/bin/fairway trace stats sec-a.jsonl":
        Entry("RUN", "reads the trace the command before it built"),
    ".venv/bin/fairway trace build flood -o flood.jsonl.gz":
        Entry("RUN", "builds the synthetic flood trace in seconds"),
    ".venv/bin/fairway trace export flood.jsonl.gz -o flood-vllm.jsonl":
        Entry("RUN", "reads the trace the command before it built"),
    ".venv/bin/vllm bench serve --backend vllm --base-url http://127.0.0.1:8000 --model MODEL "
    "--tokenizer MODEL --dataset-name timed_trace --dataset-path flood-vllm.jsonl --num-prompts "
    "100000 --timed-trace-chunk-hash-size 16 --save-result --save-detailed --result-dir "
    "results/vllm-bench":
        Entry("PARSE", "needs a running server and the served model's tokenizer"),
    ".venv/bin/fairway trace import flood-vllm.jsonl -o flood-back.jsonl.gz --chunk-tokens 16":
        Entry("RUN", "reads the export two commands before it"),
    ".venv/bin/fairway replay --url http://127.0.0.1:8000 --trace flood-back.jsonl.gz":
        Entry("PARSE", "needs a running server (and the trace the command before it wrote)"),
    ".venv/bin/python benchmarks/scheduler_overhead.py --policies fairway-step fairway lpm "
    "--sizes 100 1000 10000":
        Entry("PARSE", "minutes of engine steps at 100 to 10,000 waiting"),
    ".venv/bin/python benchmarks/scheduler_overhead.py --policies fairway-step fairway lpm "
    "--running 256 --sizes 1000 10000 --kinds admit busy":
        Entry("PARSE", "minutes of engine steps at 1,000 and 10,000 waiting"),
}


@dataclass(frozen=True)
class DocCommand:
    """One command of a ```bash block: where it is and its text."""

    path: str
    line: int
    text: str
    env: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def _doc_files() -> list[Path]:
    files: list[Path] = []
    for pattern in DOCS:
        files.extend(sorted(ROOT.glob(pattern)))
    return files


def _split(logical: str) -> list[str]:
    """A logical line -> its commands (split at && and ;), comments removed, tokens re-joined."""
    lexer = shlex.shlex(logical, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands, current = [], []
    for token in lexer:
        if token in ("&&", ";", "||"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    return [shlex.join(c) for c in commands if c]


def extract() -> list[DocCommand]:
    """Every command of every ```bash block, with the file and the line it starts on."""
    out = []
    for path in _doc_files():
        in_block, pending, start = False, "", 0
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip().startswith("```"):
                in_block = line.strip() == "```bash" and not in_block
                continue
            if not in_block:
                continue
            if not pending:
                start = number
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            logical, pending = pending + line, ""
            for text in _split(logical):
                out.append(DocCommand(str(path.relative_to(ROOT)), start, text))
    return out


def _key(command: DocCommand) -> str:
    """The command as written: its tokens joined by single spaces (quotes as shlex writes them)."""
    return command.text


def _known_keys() -> dict[str, str]:
    return {shlex.join(shlex.split(k)): k for k in COMMANDS}


def entry_of(command: DocCommand) -> Entry | None:
    raw = _known_keys().get(_key(command))
    return None if raw is None else COMMANDS[raw]


DOC_COMMANDS = extract()


def test_every_documented_command_is_classified() -> None:
    problems = [
        f"{c.where}: `{c.text}` is not classified: add it to COMMANDS in {Path(__file__).name} "
        "(RUN, PARSE, MAKE, EXTERNAL or BROKEN, with the reason)"
        for c in DOC_COMMANDS if entry_of(c) is None
    ]
    used = {_key(c) for c in DOC_COMMANDS}
    problems += [
        f"COMMANDS has `{raw}`, which no document contains any more: remove or update it"
        for key, raw in _known_keys().items() if key not in used
    ]
    assert not problems, "\n".join(problems)
    assert all(e.reason for e in COMMANDS.values())


def _argv(command: DocCommand, entry: Entry, tmp: Path) -> tuple[dict[str, str], list[str]]:
    """Environment assignments and argv of a command, placeholders replaced."""
    text = command.text
    for old, new in entry.replace:
        text = text.replace(shlex.join(shlex.split(old)) if " " in old else old,
                            new.format(tmp=tmp))
    tokens = shlex.split(text)
    env: dict[str, str] = {}
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
        name, _, value = tokens.pop(0).partition("=")
        env[name] = value
    return env, tokens


def _program(tokens: list[str], entry: Entry, where: str) -> tuple[str, str, list[str]]:
    """(runner kind, target, arguments) of a Python program as the docs name it."""
    head, *rest = tokens
    if head.startswith(".venv/bin/"):
        script = ROOT / head
        assert script.exists() or (VENV_BIN / Path(head).name).exists(), (
            f"{where}: {head} does not exist after `make setup`")
        name = Path(head).name
    else:
        assert entry.where, f"{where}: bare `{head}` needs `where` in its entry"
        assert (VENV_BIN / head).exists(), f"{where}: `{head}` is not in {VENV_BIN}"
        name = head
    if name == "fairway":
        return "fairway", "fairway.cli:main", rest
    if name == "vllm":
        return "vllm", "vllm.entrypoints.cli.main:main", rest
    if name == "vllm-router":
        return "vllm-router", "vllm_router.launch_router:main", rest
    if name.startswith("python"):
        if rest[:1] == ["-m"]:
            return "module", rest[1], rest[2:]
        return "path", str(ROOT / rest[0]), rest[1:]
    raise AssertionError(f"{where}: no parse check for program {head!r}")


def _parse(command: DocCommand, entry: Entry, tmp: Path) -> None:
    env, tokens = _argv(command, entry, tmp)
    _parse_tokens(tokens, entry, command.where, env, tmp)


def _parse_tokens(tokens: list[str], entry: Entry, where: str, env: dict[str, str],
                  tmp: Path) -> None:
    kind, target, args = _program(tokens, entry, where)
    done = subprocess.run(
        [sys.executable, "-c", _RUNNER, kind, target, *args], cwd=ROOT,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300,
    )
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 0 and PARSED in done.stdout, (
        f"{where}: `{shlex.join(tokens)}` does not parse (exit {done.returncode}):\n"
        f"{output[-2000:]}")
    if target == "fairway.supervisor" and "--" in args:  # the supervised command as well
        _parse_tokens(args[args.index("--") + 1:], entry, where, env, tmp)


def _run(command: DocCommand, entry: Entry, tmp: Path) -> None:
    env, tokens = _argv(command, entry, tmp)
    head = tokens[0]
    program = str(ROOT / head) if head.startswith(".venv/bin/") else str(VENV_BIN / head)
    done = subprocess.run([program, *tokens[1:]], cwd=tmp, capture_output=True, text=True,
                          env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert done.returncode == 0, (
        f"{command.where}: `{command.text}` failed (exit {done.returncode}):\n"
        f"{(done.stdout + done.stderr)[-2000:]}")


def _make(command: DocCommand) -> None:
    tokens = shlex.split(command.text)
    done = subprocess.run(["make", "-n", *tokens[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, f"{command.where}: `make -n` failed:\n{done.stderr}"


def _cases() -> Iterator[object]:
    for c in DOC_COMMANDS:
        entry = entry_of(c)
        marks = []
        if entry is not None and entry.kind == "BROKEN":
            marks.append(pytest.mark.xfail(strict=True, reason=entry.reason))
        yield pytest.param(c, id=f"{c.where}:{c.text[:40]}", marks=marks)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for the RUN commands, so a command can read what the one before wrote."""
    return tmp_path_factory.mktemp("docs")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("command", list(_cases()))
def test_documented_command_works(command: DocCommand, run_dir: Path) -> None:
    entry = entry_of(command)
    if entry is None:
        pytest.skip("not classified (test_every_documented_command_is_classified fails)")
    if entry.needs and not (VENV_BIN / entry.needs).exists():
        pytest.skip(f"{command.where}: `{entry.needs}` is not installed (its extra: "
                    "FAIRWAY_EXTRAS=router ./scripts/setup.sh)")
    if entry.kind == "RUN":
        _run(command, entry, run_dir)
    elif entry.kind in ("PARSE", "BROKEN"):
        _parse(command, entry, run_dir)
    elif entry.kind == "MAKE":
        _make(command)
    elif entry.kind == "EXTERNAL":
        pytest.skip(f"{command.where}: {entry.reason}")
    else:
        raise AssertionError(f"unknown kind {entry.kind!r} for `{command.text}`")
