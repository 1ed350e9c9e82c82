"""Time Fairway adds to vLLM's `schedule()`: FairwayScheduler vs vLLM's own Scheduler, same run.

Per queue size N, every arm (vLLM's `Scheduler`, then Fairway with each policy) is measured in
four situations, all with a warm prefix cache of G (`--prefixes`, 40) shared 8,192-token prefixes
and N waiting requests of 8k-16k tokens (one of the cached prefixes + an uncached suffix of
0-8,192 tokens):

  * "full" steps: every running slot is busy decoding, so no step can admit anything (the
    pre-pass may skip the ordering) -- the same Request objects serve every arm, arms take turns
    in blocks of steps (`--rounds`) so machine noise hits all of them alike;
  * "admit" / "busy" steps: a prefill node: free slots, 2,048-token steps, max_tokens 1; each
    step that admits requests is an "admit" sample, each step whose token budget went to running
    chunks is a "busy" sample; after every step as many new requests arrive as were admitted, so
    the queue stays at N (each arm has its own copies, as admission mutates a request); the
    arms' nodes also take turns in `--rounds` blocks of steps;
  * "prefilling" steps: a busy prefill node, the same kind of node with 64 request slots
    (`PREFILLING_SLOTS`) and requests of 16-8,192 uncached tokens after their prefix
    (`PREFILLING_UNCACHED`); every step admits a few, as many arrive, and chunked prefills are
    always running, so the policy plans every step (the ordering is never skipped); every step
    is a sample;
  * "burst": N requests arrive at once on an idle prefill node (a fresh scheduler each time,
    `--bursts` times): their `add_request` calls plus the next step; every request is new to
    Fairway's prefix probe.

By default 120 measured steps per arm and kind (`--steps`; "admit" and "busy" together), in 4
turns (`--rounds`), with 16 running slots (`--running`; 256, vLLM's default `max_num_seqs` on
GPUs, lets the ordered head hold up to 256 requests). An arm `POLICY+tenants` spreads the
requests over `--tenants` tenants and lists them in the `tenants` option.

Timing is the CPU time of this thread (`time.thread_time`, so that a shared machine's
descheduling is not charged to an arm) of `schedule()`, `update_from_output()` (with a fake
model output, built untimed) and the `add_request` calls of the requests that arrive after it.
Every arm is built on `TimedScheduler`, vLLM's `Scheduler` with a CPU-time counter around its own
`schedule()`, `update_from_output()` and `add_request()`, so each step splits into vLLM's part and
the rest:

  * "Fairway's own" = the step's time minus vLLM's part in the same step: everything Fairway
    runs (the `add_request` hook, the pre-pass, the token share, the after-step bookkeeping, the
    queue metrics after `update_from_output`), and nothing else (0 for vLLM's own arm, up to the
    counter's own cost);
  * "added" = the arm's median minus vLLM's median of the same kind and size, both from the same
    run (paired medians): what running Fairway instead of vLLM's own scheduler costs a step. This
    is what the goals (`GOALS_MS`, the "goal met" column) bound: <= 1 ms at 1,000 waiting and
    <= 5 ms at 10,000 in every kind but "burst", <= 20 ms for the step after a burst of 1,000
    (issue 46's goals; the "own added" column is the one docs/results.md reports).
    It also holds the difference in vLLM's own work: a policy that starts more requests per step
    (hits with short uncached suffixes) makes vLLM do more admissions per step, each with vLLM's
    own prefix lookup and block allocation. "vLLM per start" (vLLM's part of an admitting step /
    requests started, median; "admit" and "prefilling") compares that work per started request
    across the arms, and "started per step" how many requests each step started (the mean over
    the admitting steps for "admit", over every step for "prefilling").
  * "own added" = Fairway's own median minus vLLM's arm's own median (the counter's and this
    harness's glue, ~0 except in "burst", whose 1,000 `add_request` calls cost the glue ~1 ms),
    same kind, size and run: what Fairway's code adds to a step that makes the admissions it
    makes. vLLM's part of Fairway's step is vLLM's own work for the requests Fairway's order
    started (every policy starts each request once; one that starts short hits first starts
    more per step, and FCFS starts the same requests in later steps), so "added" minus "own
    added" is that work, not Fairway's. The same goals (`GOALS_MS`) are judged on it too ("own
    goal met"), beside the "goal met" of "added".
  * "added at same work" = the added median between steps that started and finished as many
    requests (`same_work_added`: per work w = (started, finished), the arm's median minus
    vLLM's, weighted by the arm's steps; in brackets the share of the arm's steps so paired,
    those whose w both arms have `SAME_WORK_MIN` steps of): the cost of Fairway's step against
    vLLM's for the same admissions and releases, read from the step totals alone, so anything
    Fairway makes vLLM's own code do more per step counts as Fairway's. Judged by `GOALS_MS`
    too ("same-work goal met"); "-" where no w pairs (the burst: vLLM's FCFS starts one long
    request, Fairway several hits).

"pre-pass" is Fairway's ordering and share as `fairway:prepass_seconds` observes it (wall time,
median over the steps that ran it).
"Machine speed" (`speed_scaled`): a shared VM's speed drifts, and every arm with it; vLLM's own
admitting step at 1,000 waiting, ~1.4 ms on the machine the goals were set on, is the yardstick, and
Fairway's own times at 1,000 waiting are also shown scaled to that speed. The goal column judges
the raw times (the added ones, which the shared machine's speed moves less: both arms ran in the
same minutes).
The memory Fairway keeps per waiting request is measured with tracemalloc (allocations made from
`fairway/` files, N = the largest size <= 1,000).

The CPU offload tier (an arm POLICY+tier, e.g. `fairway+tier`): that policy with vLLM's
`OffloadingConnector` configured (`--tier-blocks` blocks of CPU memory) and the tier rule at its
default (`priced`), so that Fairway's tier probe (`fairway/vllm/tier_probe.py`) looks every waiting
request's prefix up in the tier each ordered step. A run with such an arm also runs `vllm+tier`
(vLLM's own Scheduler with the same connector: the baseline of the +tier arms' "added"), and
every arm of the run, tier or not, gets the same smaller GPU cache: `--gpu-prefixes` of the shared
prefixes' worth of blocks plus room for the running requests, so that the prefixes do not all fit
and LRU eviction keeps moving some out of the GPU cache (the warm-up computes every prefix in
turn: the first ones are already evicted when it ends). The connector stores every computed block
in the tier, so an evicted prefix stays there: a +tier arm's probe finds it (a tier hit) and vLLM
loads it on admission, where a tier-less arm recomputes it. The connector's worker half needs a
GPU; `TierWorker` answers its jobs instead (a load completes within the step that scheduled it, a
store one step later), untimed like the fake model output; the tier-less arms have nothing to
answer. A second table pairs each POLICY with POLICY+tier: Fairway's own time, the pre-pass,
vLLM's part of the step (with the connector it does more: its own tier lookups at admission, the
store and load jobs) and how many waiting requests the probe found in the tier (median over the
steps whose pre-pass ordered the queue; the probe's answer is kept by a thin wrapper around its
`lookup`, the count is taken outside the timing). Its goal (`TIER_GOAL_MS`, "tier goal met"):
Fairway's own median with the tier minus without it <= 0.1 ms at 1,000 waiting, in the kinds
that order a queue of N step after step (all but "burst").

Tier defaults: `--tier-blocks` 4 x the prefixes' blocks, `--gpu-prefixes` a quarter of
`--prefixes`, plus 600 blocks per running slot (`TIER_RUN_SLOT_BLOCKS`); `TierWorker` is the
replay's worker model (`fairway.replay.offload_sim.TierTransfers`) over an instant link. An arm
`POLICY+tier+blind` is the same with option `tier: blind`: the connector configured, Fairway's
tier probe off, so its difference to POLICY is what a connector costs Fairway without the lookup
(with any connector vLLM's scan may skip or copy any request, so Fairway orders the whole queue).
The second table also gives the probe's `lookup` alone (median / mean / p90 wall ms over the
steps that looked the tier up).

Run: `python benchmarks/scheduler_overhead.py [--sizes 100 1000 10000] [--kinds prefilling burst]
[--json out.json]`;
with the tier: `--policies fairway fairway+tier [--tier-blocks N] [--gpu-prefixes K]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

# Runnable as a plain script from a checkout: put the repository root on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PREFIX_TOKENS = 8_192
SUFFIX_MAX = 8_192
BLOCK_SIZE = 16
PREFILL_BUDGET = 2_048
KINDS = ("full", "admit", "busy", "prefilling", "burst")
#: The kinds that order a queue of N waiting requests step after step (all but "burst").
STEADY_KINDS = ("full", "admit", "busy", "prefilling")
#: The "prefilling" kind's node: request slots, and the uncached tokens of each request
#: (beyond its cached 8,192-token prefix), smallest and largest.
PREFILLING_SLOTS = 64
PREFILLING_UNCACHED = (16, 8_192)
#: What an arm's name may add to its policy after a "+" (`fairway+tenants`, `fairway+tier`).
#: An arm's flags: `tenants` (the `tenants` option), `tier` (vLLM's offloading connector) and,
#: with `tier`, `blind` (option `tier: blind`: the connector without Fairway's tier probe).
ARM_FLAGS = ("tenants", "tier", "blind")
#: GPU blocks each running slot gets in a run with a tier (beyond `--gpu-prefixes` prefixes):
#: one uncached suffix and some decode room.
TIER_RUN_SLOT_BLOCKS = SUFFIX_MAX // BLOCK_SIZE + 88
#: The goal of the tier lookup: Fairway's own median with the tier minus without it (ms), at
#: 1,000 waiting, in the steps that can order (full steps never look the tier up).
TIER_GOAL_MS = {(1_000, kind): 0.1 for kind in STEADY_KINDS}


def arm_parts(arm: str) -> tuple[str, frozenset[str]]:
    """An arm's policy ("vllm": vLLM's own Scheduler) and its flags (`ARM_FLAGS`)."""
    policy, *flags = arm.split("+")
    return policy, frozenset(flags)


def is_vllm(arm: str) -> bool:
    """vLLM's own Scheduler (with or without the tier)."""
    return arm_parts(arm)[0] == "vllm"


def is_tier(arm: str) -> bool:
    return "tier" in arm_parts(arm)[1]


def base_arm(arm: str) -> str:
    """The vLLM arm an arm is compared to: vLLM with the same connector."""
    return "vllm+tier" if is_tier(arm) else "vllm"


@dataclass
class ArmResult:
    """Timings of one arm, one kind of step, one queue size (milliseconds)."""

    arm: str
    kind: str
    waiting: int
    median_ms: float
    p90_ms: float
    #: Median of Fairway's own pre-pass (what `fairway:prepass_seconds` observes; wall time).
    prepass_ms: float | None = None
    samples_ms: list[float] = field(default_factory=list, repr=False)
    #: Requests started per measured step ("admit" steps; vLLM's own work grows with it).
    admitted_mean: float | None = None
    #: Fairway's own time per step: the step minus vLLM's own methods in it.
    own_median_ms: float = 0.0
    own_p90_ms: float = 0.0
    #: vLLM's part of an admitting step per request it started (median; "admit" steps only).
    vllm_per_start_ms: float | None = None
    #: vLLM's own methods per step (median): with a connector, its lookups and jobs too.
    vllm_median_ms: float = 0.0
    #: +tier arms: waiting requests the tier probe found a tier hit for, and its tier-hit
    #: tokens (medians over the steps whose pre-pass looked the tier up; None: no such step).
    tier_hits_median: float | None = None
    tier_tokens_median: float | None = None
    #: Steps whose pre-pass looked the tier up (of the measured ones).
    tier_lookup_steps: int = 0
    #: The tier probe's `lookup` alone (wall ms over those steps): median, mean, p90.
    tier_lookup_ms: tuple[float, float, float] | None = None
    #: Each measured step's work for vLLM, in the order of `samples_ms`: (requests started,
    #: requests finished).
    samples_work: list[tuple[int, int]] = field(default_factory=list, repr=False)


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed step: CPU seconds in all and in vLLM's own methods, requests started (and
    finished, last), Fairway's pre-pass (wall seconds; None: no pre-pass ran), and the tier
    probe's answer (waiting requests with a tier hit, their tier tokens; None: no tier lookup
    in the step)."""

    total_s: float
    vllm_s: float
    admitted: int = 0
    prepass_s: float | None = None
    tier_hits: int | None = None
    tier_tokens: int | None = None
    #: Wall seconds of the tier probe's `lookup` in the step (None: no lookup).
    tier_lookup_s: float | None = None
    #: Requests the step finished (vLLM's `update_from_output` released them).
    finished: int = 0

    def plus(self, total_s: float, vllm_s: float) -> Sample:
        """The same step with more work timed (the arrivals' `add_request` calls)."""
        return replace(self, total_s=self.total_s + total_s, vllm_s=self.vllm_s + vllm_s)


def timed_classes() -> tuple[type, type]:
    """`TimedScheduler` (vLLM's `Scheduler` counting the CPU time of its own `schedule()`,
    `update_from_output()` and `add_request()` in `vllm_cpu_s`) and Fairway's mixin on top."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from fairway.vllm.scheduler import FairwaySchedulerMixin

    def counted(name: str) -> Any:
        """`Scheduler.<name>`, its CPU time added to `vllm_cpu_s`."""
        method = getattr(Scheduler, name)

        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return method(self, *args, **kwargs)
            finally:
                self.vllm_cpu_s += time.thread_time() - start

        timed.__name__ = name
        return timed

    class TimedScheduler(Scheduler):
        vllm_cpu_s = 0.0
        schedule = counted("schedule")
        add_request = counted("add_request")
        update_from_output = counted("update_from_output")

    class TimedFairwayScheduler(FairwaySchedulerMixin, TimedScheduler):
        pass

    return TimedScheduler, TimedFairwayScheduler


class TierWorker:
    """The `OffloadingConnector`'s worker half, answered without a GPU: the replay's worker model
    (`fairway.replay.offload_sim.TierTransfers`) over an instant link, polled at once, so a load
    completes within the step that scheduled it and a store in the next step (vLLM's worker
    defers stores by one step)."""

    def __init__(self) -> None:
        from fairway.profiling.load_cost import LoadCost
        from fairway.replay.offload_sim import TierTransfers

        instant = LoadCost(kv_bytes_per_token=1, h2d_bytes_per_s=math.inf,
                           d2h_bytes_per_s=math.inf, source="instant")
        self._transfers = TierTransfers(instant, BLOCK_SIZE)

    def answer(self, output: Any, model_output: Any) -> None:
        """Set the worker's answer to the step `output` on its fake `model_output`."""
        from fairway.vllm import offload_worker

        self._transfers.start_step(offload_worker.step_metadata(output), 0.0)
        model_output.kv_connector_output = self._transfers.finish_step(math.inf)


class TierRecorder:
    """Keeps the tier probe's answer to each `lookup` (its tier tokens per row) and how long the
    call took, so that the benchmark counts the tier hits outside the timing and reports the
    lookup's own time; the wrapper itself is inside the step's timing (one Python call, two
    clock reads and three attribute writes per step)."""

    def __init__(self, tier: Any) -> None:
        self.calls = 0
        self.tokens: Any = None
        self.seconds = 0.0
        original = tier.lookup

        def lookup(*args: Any) -> Any:
            start = time.perf_counter()
            found = original(*args)
            self.seconds = time.perf_counter() - start
            self.calls += 1
            self.tokens = found[0]
            return found

        tier.lookup = lookup


def _model_output(offline: Any, sched: Any, out: Any) -> Any:
    """The fake model output of a step, with the connector's worker answer where it has one."""
    model_output = offline.fake_model_output(sched, out)
    worker = getattr(sched, "tier_worker", None)
    if worker is not None:
        worker.answer(out, model_output)
    return model_output


def _step(offline: Any, sched: Any) -> Any:
    """One untimed engine step (`offline.step`, the connector answered)."""
    out = sched.schedule()
    sched.update_from_output(out, _model_output(offline, sched, out))
    return out


def _run_until_idle(offline: Any, sched: Any, max_steps: int = 10_000) -> None:
    """`offline.run_until_idle`, the connector answered (its last stores complete too)."""
    for _ in range(max_steps):
        if not sched.has_requests():
            break
        _step(offline, sched)


class Workload:
    """The prompts (built once per size) and cheap per-arm copies of them as vLLM Requests.

    Hashing a 16k-token prompt's blocks costs ~10 ms, so the shared prefixes are hashed once and
    each request hashes only its own suffix; a copy for another arm reuses the hashes.
    """

    def __init__(self, offline: Any, args: argparse.Namespace, n: int) -> None:
        from vllm.v1.request import Request

        self._request_cls = Request
        self.offline = offline
        rng = random.Random(n)
        self.prefixes = [
            list(range(100_000 * (g + 1), 100_000 * (g + 1) + PREFIX_TOKENS))
            for g in range(args.prefixes)
        ]
        seeds = [
            offline.make_request(f"seed{g}", p, 0.0, block_size=BLOCK_SIZE)
            for g, p in enumerate(self.prefixes)
        ]
        self.hasher = seeds[0]._block_hasher  # vLLM internal: Request._block_hasher
        self.seeds = seeds
        self._pool = list(range(1_000_000, 1_000_000 + 4 * SUFFIX_MAX))
        self.num_waiting = n
        self.tenants = args.tenants
        self._count = n + args.steps * 4
        # suffix of 0-8,192 tokens after its first (unique) token: 1-8,193 uncached tokens
        self.templates = self._templates(rng, "w", 10_000_000, 1, SUFFIX_MAX + 1)
        self._prefilling: list[Any] | None = None
        #: A run with a +tier arm: every arm's GPU cache holds `gpu_prefixes` prefixes' worth
        #: (plus the running slots' room), the +tier arms have a tier of `tier_blocks` blocks.
        self.tier_run = any(is_tier(arm) for arm in args.policies)
        self.tier_blocks: int = getattr(args, "tier_blocks", None) or 0
        self.gpu_prefixes: int = getattr(args, "gpu_prefixes", None) or 0

    def _templates(
        self, rng: random.Random, name: str, unique: int, fewest: int, most: int
    ) -> list[Any]:
        """Requests of one shared prefix (in turn) and `fewest`..`most` uncached tokens."""
        pool, now, templates = self._pool, time.time(), []
        for i in range(self._count):
            g = i % len(self.prefixes)
            suffix_len = rng.randint(fewest - 1, most - 1)
            start = rng.randint(0, len(pool) - SUFFIX_MAX - 1)
            # the first suffix token makes each request unique, the rest is shared int objects
            suffix = [unique + i, *pool[start : start + suffix_len]]
            arrival = now - rng.uniform(0, 30)
            prompt = self.prefixes[g] + suffix
            tenant = f"t{i % self.tenants}" if self.tenants > 1 else None
            templates.append(self._new(f"{name}{i}", prompt, arrival,
                                       hashes=self.seeds[g].block_hashes, tenant=tenant))
        return templates

    @property
    def prefilling_templates(self) -> list[Any]:
        """The "prefilling" kind's requests: a shared prefix and `PREFILLING_UNCACHED` tokens
        (built on first use, with their own random draws: the other kinds' stay as they were)."""
        if self._prefilling is None:
            rng = random.Random(f"prefilling {self.num_waiting}")
            self._prefilling = self._templates(rng, "p", 20_000_000, *PREFILLING_UNCACHED)
        return self._prefilling

    def _new(
        self,
        request_id: str,
        prompt: list[int],
        arrival: float,
        max_tokens: int = 1,
        hashes: Sequence[Any] = (),
        tenant: str | None = None,
    ) -> Any:
        """A Request whose block hashes start from `hashes` (a hashed prefix of `prompt`), of
        `tenant` (`vllm_xargs`' tenant; every arm gets it, only `+tenants` arms read it)."""
        from vllm.sampling_params import SamplingParams

        extra = {"tenant": tenant} if tenant is not None else None
        request = self._request_cls(
            request_id=request_id,
            prompt_token_ids=prompt,
            sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                           extra_args=extra),
            pooling_params=None,
            arrival_time=arrival,
        )
        request.block_hashes = list(hashes)  # vLLM internal: Request.block_hashes
        request._block_hasher = self.hasher  # vLLM internal: Request._block_hasher
        request.update_block_hashes()  # hashes the blocks after `hashes` only
        return request

    def copy(self, template: Any, request_id: str, arrival: float | None = None) -> Any:
        """A fresh Request with the template's prompt and block hashes."""
        return self._new(
            request_id,
            template.prompt_token_ids,  # never mutated by vLLM; the token list is copied
            template.arrival_time if arrival is None else arrival,
            hashes=template.block_hashes,  # vLLM internal: Request.block_hashes
            tenant=(template.sampling_params.extra_args or {}).get("tenant"),
        )

    def scheduler(self, arm: str, *, max_num_seqs: int, budget: int, fill: bool) -> Any:
        """A scheduler with the prefixes cached; `fill`: every running slot decoding.

        In a run with a tier, the GPU cache is smaller (`gpu_prefixes`): the warm-up computes
        every prefix in turn, so the first ones are evicted by its end, and a +tier arm's
        connector has stored them all in its tier (the worker answering the stores).
        """
        from fairway.vllm import offload_worker

        offline = self.offline
        prefix_blocks = PREFIX_TOKENS // BLOCK_SIZE
        if self.tier_run:
            num_blocks = self.gpu_prefixes * prefix_blocks + max_num_seqs * TIER_RUN_SLOT_BLOCKS
        else:
            num_blocks = len(self.prefixes) * prefix_blocks + max_num_seqs * 1_100 + 4_096
        timed_vllm, timed_fairway = timed_classes()
        policy, flags = arm_parts(arm)  # "fairway+tenants": the tenants listed
        options: dict[str, Any] = {}
        if "tenants" in flags:
            options["tenants"] = [f"t{k}" for k in range(self.tenants)]
        if "blind" in flags:  # the connector without Fairway's tier probe
            options["tier"] = "blind"
        sched = offline.make_offline_scheduler(
            None if policy == "vllm" else policy,
            fairway_options=options or None,
            scheduler_cls=timed_vllm if policy == "vllm" else timed_fairway,
            num_blocks=num_blocks,
            block_size=BLOCK_SIZE,
            max_num_batched_tokens=budget,
            max_num_seqs=max_num_seqs,
            max_model_len=PREFIX_TOKENS + SUFFIX_MAX + 64,
            kv_transfer_config=(offload_worker.transfer_config(self.tier_blocks)
                                if "tier" in flags else None),
        )
        if "tier" in flags:
            offload_worker.check_tier_blocks(sched, self.tier_blocks)
            sched.tier_worker = TierWorker()
            if policy != "vllm" and "blind" not in flags:
                tier = sched.fairway_mirror.tier
                assert tier is not None, "Fairway could not read the offload tier"
                sched.tier_recorder = TierRecorder(tier)
        for seed in self.seeds:  # warm the cache
            sched.add_request(self.copy(seed, seed.request_id))
        _run_until_idle(offline, sched)
        if fill:
            for i in range(max_num_seqs):  # fill every running slot with long decodes
                prompt = [7, 8, 9, i] * 4
                sched.add_request(self._new(f"dec{i}", prompt, 0.0, max_tokens=1_000_000))
            _step(offline, sched)
            assert len(sched.running) == max_num_seqs
        return sched


def _timed_step(offline: Any, sched: Any) -> Sample:
    """One `schedule()` and its `update_from_output()`, timed (the fake model output and the
    connector's worker answer are not)."""
    totals = getattr(sched, "fairway_totals", None)
    before = (totals.prepass_total_s, totals.prepass_count) if totals is not None else (0.0, 0)
    recorder = getattr(sched, "tier_recorder", None)
    lookups = recorder.calls if recorder is not None else 0
    vllm_before = sched.vllm_cpu_s
    known = len(sched.requests)  # vLLM internal: Scheduler.requests
    start = time.thread_time()
    out = sched.schedule()
    elapsed = time.thread_time() - start
    model_output = _model_output(offline, sched, out)
    start = time.thread_time()
    sched.update_from_output(out, model_output)
    elapsed += time.thread_time() - start
    prepass = None
    if totals is not None and totals.prepass_count > before[1]:
        prepass = totals.prepass_total_s - before[0]
    vllm_s = sched.vllm_cpu_s - vllm_before
    hits = tokens = lookup_s = None
    if recorder is not None and recorder.calls > lookups:
        hits = int(np.count_nonzero(recorder.tokens))
        tokens = int(recorder.tokens.sum())
        lookup_s = recorder.seconds
    return Sample(elapsed, vllm_s, len(out.scheduled_new_reqs), prepass, hits, tokens, lookup_s,
                  finished=known - len(sched.requests))


def _timed_add(offline: Any, sched: Any, requests: list[Any]) -> tuple[float, float]:
    """CPU seconds of `add_request` for `requests`: in all, and in vLLM's own method."""
    vllm_before = sched.vllm_cpu_s
    start = time.thread_time()
    offline.add_requests(sched, requests)
    return time.thread_time() - start, sched.vllm_cpu_s - vllm_before


def _unprobed(sched: Any) -> int:
    """Waiting requests Fairway has not looked up yet (0 for vLLM's own scheduler)."""
    memo = getattr(sched, "fairway_mirror", None)
    return getattr(memo, "num_unprobed", 0) if memo is not None else 0


def _p90(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) >= 2 else values[0]


def _result(arm: str, kind: str, n: int, samples: Sequence[Sample]) -> ArmResult:
    ms = [s.total_s * 1e3 for s in samples]
    own = [(s.total_s - s.vllm_s) * 1e3 for s in samples]
    ran = [s.prepass_s * 1e3 for s in samples if s.prepass_s is not None]
    starts = [s for s in samples if s.admitted]
    per_start = [s.vllm_s * 1e3 / s.admitted for s in starts]
    tiered = [s for s in samples if s.tier_hits is not None]
    return ArmResult(
        arm,
        kind,
        n,
        statistics.median(ms),
        _p90(ms),
        statistics.median(ran) if ran else None,
        ms,
        _started_per_step(kind, samples, starts),
        statistics.median(own),
        _p90(own),
        statistics.median(per_start) if kind in ("admit", "prefilling") and per_start else None,
        statistics.median(s.vllm_s * 1e3 for s in samples),
        statistics.median(s.tier_hits or 0 for s in tiered) if tiered else None,
        statistics.median(s.tier_tokens or 0 for s in tiered) if tiered else None,
        len(tiered),
        _lookup_ms([s.tier_lookup_s * 1e3 for s in tiered if s.tier_lookup_s is not None]),
        [(s.admitted, s.finished) for s in samples],
    )


def _started_per_step(
    kind: str, samples: Sequence[Sample], starts: Sequence[Sample]
) -> float | None:
    """Requests started per step: over the admitting steps ("admit"), over every step
    ("prefilling", where a step that starts none is one of the kind's samples); None otherwise."""
    if kind == "admit" and starts:
        return statistics.mean(s.admitted for s in starts)
    if kind == "prefilling" and samples:
        return statistics.mean(s.admitted for s in samples)
    return None


def _lookup_ms(values: list[float]) -> tuple[float, float, float] | None:
    """(median, mean, p90) of the tier lookup's times; None: no lookup."""
    if not values:
        return None
    return statistics.median(values), statistics.mean(values), _p90(values)


def full_steps(work: Workload, arms: list[str], args: argparse.Namespace) -> list[ArmResult]:
    """No slot free: nothing can be admitted. Same Request objects in every arm."""
    scheds = {
        arm: work.scheduler(arm, max_num_seqs=args.running, budget=16_384, fill=True)
        for arm in arms
    }
    waiting = work.templates[: work.num_waiting]
    for sched in scheds.values():
        work.offline.add_requests(sched, waiting)
    samples: dict[str, list[Sample]] = {arm: [] for arm in arms}
    for arm in arms:  # the first steps see every request new: that is the "burst" kind
        _timed_step(work.offline, scheds[arm])
        while _unprobed(scheds[arm]):
            _timed_step(work.offline, scheds[arm])
    for _ in range(args.rounds):
        for arm in arms:
            for _ in range(args.steps // args.rounds):
                sample = _timed_step(work.offline, scheds[arm])
                assert not sample.admitted, "a full step must not admit anything"
                samples[arm].append(sample)
    for arm, sched in scheds.items():
        if not is_vllm(arm):
            assert sched.fairway_totals.policy_fallbacks == 0
    return [_result(arm, "full", work.num_waiting, samples[arm]) for arm in arms]


class PrefillNode:
    """One arm's prefill node: free slots, 2,048-token steps, max_tokens 1; the queue kept at N.

    After every step as many new requests arrive as were admitted (each arm has its own copies,
    as admission mutates a request). `prefilling` False (the "admit" / "busy" kinds): `--running`
    slots, the workload's requests; each step that admits requests is an "admit" sample, each
    step whose token budget went to running chunks a "busy" sample. `prefilling` True (the
    "prefilling" kind): `PREFILLING_SLOTS` slots, requests of `PREFILLING_UNCACHED` uncached
    tokens, every step one sample. The arms' nodes take turns in blocks of steps (`run`), like
    the full steps, so that a slow spell of a shared machine hits every arm alike.
    """

    def __init__(
        self, work: Workload, arm: str, args: argparse.Namespace, prefilling: bool = False
    ) -> None:
        self.work, self.arm, self.prefilling = work, arm, prefilling
        self.templates = work.prefilling_templates if prefilling else work.templates
        self.sched = work.scheduler(
            arm, max_num_seqs=PREFILLING_SLOTS if prefilling else args.running,
            budget=PREFILL_BUDGET, fill=False,
        )
        templates = self.templates[: work.num_waiting]
        work.offline.add_requests(
            self.sched, [work.copy(t, f"{arm}-{k}") for k, t in enumerate(templates)]
        )
        self.next_k = work.num_waiting
        self.admit: list[Sample] = []
        self.busy: list[Sample] = []
        self.steps: list[Sample] = []  # every step ("prefilling")
        warm = 0
        while warm < args.warmup:  # untimed, until the probe has seen every waiting request
            _, unprobed = self._step()
            warm = 0 if unprobed else warm + 1

    def _step(self) -> tuple[Sample, int]:
        """One timed step, then the arrivals that keep the queue at N (their add_request timed);
        and how many waiting requests the probe had not seen after the step (before arrivals)."""
        work = self.work
        sample = _timed_step(work.offline, self.sched)
        unprobed = _unprobed(self.sched)
        arrivals = []
        for _ in range(sample.admitted):
            template = self.templates[self.next_k % len(self.templates)]
            arrivals.append(work.copy(template, f"{self.arm}-{self.next_k}", time.time()))
            self.next_k += 1
        return sample.plus(*_timed_add(work.offline, self.sched, arrivals)), unprobed

    def run(self, steps: int) -> None:
        """`steps` measured steps."""
        for _ in range(steps):
            sample, _ = self._step()
            if self.prefilling:
                self.steps.append(sample)
            else:
                (self.admit if sample.admitted else self.busy).append(sample)

    def results(self) -> list[ArmResult]:
        if not is_vllm(self.arm):
            assert self.sched.fairway_totals.policy_fallbacks == 0
        n = self.work.num_waiting
        if self.prefilling:
            return [_result(self.arm, "prefilling", n, self.steps)]
        results = []
        if self.admit:
            results.append(_result(self.arm, "admit", n, self.admit))
        if self.busy:
            results.append(_result(self.arm, "busy", n, self.busy))
        return results


def prefill_steps(
    work: Workload, arms: list[str], args: argparse.Namespace, prefilling: bool = False
) -> list[ArmResult]:
    """Every arm's prefill node, the arms taking turns in `--rounds` blocks of steps."""
    nodes = [PrefillNode(work, arm, args, prefilling) for arm in arms]
    for _ in range(args.rounds):
        for node in nodes:
            node.run(args.steps // args.rounds)
    return [result for node in nodes for result in node.results()]


def bursts(work: Workload, arm: str, args: argparse.Namespace) -> list[ArmResult]:
    """N requests arrive at once on a prefill node: their `add_request` calls and the next step.

    A fresh scheduler each time; `add_request` is timed too, since Fairway registers a new request
    there (vLLM's own `add_request` is in the baseline's time as well).
    """
    samples: list[Sample] = []
    for b in range(args.bursts):
        sched = work.scheduler(arm, max_num_seqs=args.running, budget=PREFILL_BUDGET, fill=False)
        burst = [
            work.copy(t, f"{arm}-b{b}-{k}")
            for k, t in enumerate(work.templates[: work.num_waiting])
        ]
        gc.collect()
        added = _timed_add(work.offline, sched, burst)
        samples.append(_timed_step(work.offline, sched).plus(*added))
        del sched, burst
    return [_result(arm, "burst", work.num_waiting, samples)]


def memory_per_request(work: Workload, policy: str, args: argparse.Namespace) -> float:
    """Bytes Fairway holds per waiting request after a few steps (tracemalloc, fairway/ files)."""
    sched = work.scheduler(policy, max_num_seqs=args.running, budget=16_384, fill=True)
    gc.collect()
    tracemalloc.start(1)
    snap0 = tracemalloc.take_snapshot()
    work.offline.add_requests(sched, work.templates[: work.num_waiting])  # Fairway registers here
    for _ in range(3):
        _timed_step(work.offline, sched)
    gc.collect()
    snap1 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    ours = os.sep + "fairway" + os.sep
    filters = [tracemalloc.Filter(True, f"*{ours}*")]
    diff = snap1.filter_traces(filters).compare_to(snap0.filter_traces(filters), "filename")
    kept = sum(stat.size_diff for stat in diff)
    return kept / work.num_waiting


def run_size(offline: Any, n: int, args: argparse.Namespace) -> list[ArmResult]:
    """Measure every arm and kind at queue size `n`."""
    print(f"building {n} waiting requests ...", file=sys.stderr, flush=True)
    work = Workload(offline, args, n)
    arms = ["vllm", *(["vllm+tier"] if work.tier_run else []), *args.policies]
    gc.collect()
    gc.disable()  # a collection inside one arm's timing would be charged to that arm only
    try:
        results = []
        if "full" in args.kinds:
            print(f"measuring {n}: full steps", file=sys.stderr, flush=True)
            results += full_steps(work, arms, args)
        if {"admit", "busy"} & set(args.kinds):
            print(f"measuring {n}: prefill steps", file=sys.stderr, flush=True)
            results += prefill_steps(work, arms, args)
            gc.collect()
        if "prefilling" in args.kinds:
            print(f"measuring {n}: prefilling steps", file=sys.stderr, flush=True)
            results += prefill_steps(work, arms, args, prefilling=True)
            gc.collect()
        if "burst" in args.kinds:
            for arm in arms:
                print(f"measuring {n}: {arm} bursts", file=sys.stderr, flush=True)
                results += bursts(work, arm, args)
                gc.collect()
    finally:
        gc.enable()
    return results


#: The goals: bounds on the time an arm adds to vLLM's step (ms; "added": the arm's median minus
#: vLLM's median of the same kind and size in the same run), by (waiting, step kind).
GOALS_MS = {
    **{(1_000, kind): 1.0 for kind in STEADY_KINDS},
    **{(10_000, kind): 5.0 for kind in STEADY_KINDS},
    (1_000, "burst"): 20.0,
}


#: vLLM's own step (schedule + update_from_output) on this workload at 1,000 waiting, admitting
#: steps, on the machine the goals were set on (ms): the speed yardstick.
REFERENCE_VLLM_ADMIT_MS = 1.4


def speed_scaled(results: list[ArmResult]) -> dict[str, Any] | None:
    """This machine's speed against the reference machine's (the one the goals were set on), and
    Fairway's own times at 1,000 waiting scaled to that speed; None without vLLM's admitting
    steps at 1,000 waiting in `results`.

    A shared VM's speed drifts (2x within an hour on docs/results.md's 2-core VM), and every arm
    slows with it. vLLM's own admitting step on this workload is the yardstick: it took ~1.4 ms on
    the reference machine, so a run where it takes X ms ran X / 1.4 times slower, and Fairway's own
    time x 1.4 / X is what the same run would have shown at the reference speed. The goal is
    judged on the raw times (`goal_met`); this is a second view, for runs in a slow phase.
    """
    vllm = next(
        (r for r in results if r.arm == "vllm" and r.waiting == 1_000 and r.kind == "admit"), None
    )
    if vllm is None or vllm.median_ms <= 0:
        return None
    scale = REFERENCE_VLLM_ADMIT_MS / vllm.median_ms
    scaled = {
        f"{r.arm} {r.kind}": r.own_median_ms * scale
        for r in results
        if not is_vllm(r.arm) and r.waiting == 1_000 and r.kind in STEADY_KINDS
    }
    return {"vllm_admit_1000_ms": vllm.median_ms, "scale": scale, "own_1000_scaled_ms": scaled}


def speed_line(speed: dict[str, Any]) -> str:
    """`speed_scaled` as one line of the report."""
    scaled = ", ".join(f"{key} {ms:.3f}" for key, ms in speed["own_1000_scaled_ms"].items())
    return (
        f"Machine speed: vLLM's own admitting step at 1,000 waiting took "
        f"{speed['vllm_admit_1000_ms']:.3f} ms here ({REFERENCE_VLLM_ADMIT_MS} ms on the "
        f"reference machine); Fairway's own median ms at 1,000 waiting scaled to that speed "
        f"(x {speed['scale']:.2f}): {scaled}."
    )


def added_ms(result: ArmResult, base: ArmResult | None) -> float | None:
    """What the arm adds to vLLM's step: its median minus `base`'s (vLLM's own arm, same kind,
    size and run; `base_arm`); None without that row, or for vLLM's own arms."""
    if base is None or is_vllm(result.arm):
        return None
    return result.median_ms - base.median_ms


def _judged(result: ArmResult, added: float | None) -> str:
    """Yes/no: `added` (ms) against the goal of `result`'s size and kind; "-": none of either."""
    goal = GOALS_MS.get((result.waiting, result.kind))
    if goal is None or added is None:
        return "-"
    return "yes" if added <= goal else "no"


def goal_met(result: ArmResult, base: ArmResult | None) -> str:
    """Yes/no: the added median (`added_ms` against `base`, vLLM's row of the same kind and size
    in the same run) against `GOALS_MS`; "-": no goal, vLLM's arm, or no vLLM row."""
    return _judged(result, added_ms(result, base))


def own_added_ms(result: ArmResult, base: ArmResult | None) -> float | None:
    """What Fairway's own code adds to the step: the arm's own median minus `base`'s (vLLM's
    arm of the same kind, size and run: the harness's glue around vLLM's methods); None without
    that row, or for vLLM's own arms."""
    if base is None or is_vllm(result.arm):
        return None
    return result.own_median_ms - base.own_median_ms


def own_goal_met(result: ArmResult, base: ArmResult | None) -> str:
    """Yes/no: the own added median (`own_added_ms`) against `GOALS_MS`; "-" as `goal_met`."""
    return _judged(result, own_added_ms(result, base))


#: Steps of one kind of work (requests started, requests finished) an arm and vLLM's arm must
#: each have for `same_work_added` to pair their medians at it.
SAME_WORK_MIN = 5


def same_work_added(
    arm_ms: Sequence[float], arm_work: Sequence[Sequence[int]],
    base_ms: Sequence[float], base_work: Sequence[Sequence[int]],
) -> tuple[float, float] | None:
    """The added median between steps that did the same admissions and releases: per work w
    (requests started, requests finished in the step), the arm's median step of work w minus
    vLLM's, averaged over the arm's steps (weights: how many of them did w); and the share of
    the arm's steps paired so. None: no w with `SAME_WORK_MIN` steps on both sides.

    Why: the added median pairs steps that do different work. A policy that starts the short
    hits first starts and finishes more requests per step (0.8 against vLLM's 0.5 on the
    prefilling node), so vLLM's median prefilling step starts none and Fairway's starts one,
    whose admission, block allocation and release vLLM's own code spends ~1 ms on. Pairing
    steps of the same starts and finishes compares the same vLLM work, and it is read from the
    step totals alone: whatever Fairway's hooks make vLLM's own code do more per step (the step
    plan's cap and hold-back, the re-ordered queue) counts as Fairway's, which `own_added_ms`
    (the counter's split) would not see.
    """
    def by_work(
        ms: Sequence[float], work: Sequence[Sequence[int]]
    ) -> dict[tuple[int, ...], list[float]]:
        """Step times by work (a JSON report gives the pairs back as lists)."""
        groups: dict[tuple[int, ...], list[float]] = {}
        for value, w in zip(ms, work, strict=True):
            groups.setdefault(tuple(w), []).append(value)
        return groups

    arm, base = by_work(arm_ms, arm_work), by_work(base_ms, base_work)
    paired = [w for w in arm if len(arm[w]) >= SAME_WORK_MIN
              and len(base.get(w, ())) >= SAME_WORK_MIN]
    if not paired:
        return None
    weights = np.array([len(arm[w]) for w in paired], dtype=float)
    diffs = np.array([np.median(arm[w]) - np.median(base[w]) for w in paired])
    return float(np.average(diffs, weights=weights)), float(weights.sum() / len(arm_ms))


def same_work_added_ms(result: ArmResult, base: ArmResult | None) -> tuple[float, float] | None:
    """`same_work_added` of an arm against `base` (vLLM's arm, same kind, size and run); None
    for vLLM's own arms, without that row, or with no work both have enough steps of."""
    if base is None or is_vllm(result.arm) or not result.samples_work:
        return None
    return same_work_added(result.samples_ms, result.samples_work,
                           base.samples_ms, base.samples_work)


def same_work_goal_met(result: ArmResult, base: ArmResult | None) -> str:
    """Yes/no: the same-work added median against `GOALS_MS`; "-" as `goal_met`."""
    paired = same_work_added_ms(result, base)
    return _judged(result, paired[0] if paired is not None else None)


def markdown(results: list[ArmResult]) -> str:
    """One row per size, kind and arm: the step's median and p90, the added median over vLLM's
    and its goal, Fairway's own added median and its goal, Fairway's own time (median, p90),
    the pre-pass, vLLM's part per started request and the requests started per step."""
    base = {(r.arm, r.waiting, r.kind): r for r in results if is_vllm(r.arm)}
    lines = [
        "| waiting | step kind | scheduler | median ms | p90 ms | added median ms | goal met | "
        "own added ms | own goal met | ratio | Fairway's own median / p90 ms | "
        "pre-pass median ms | vLLM per start ms | started per step | "
        "added at same work ms (steps paired) | same-work goal met |",
        "|---:|---|---|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in sorted(results, key=lambda r: (r.waiting, KINDS.index(r.kind))):
        b = base.get((base_arm(r.arm), r.waiting, r.kind))
        if is_vllm(r.arm):
            arm = "vLLM Scheduler" + (" (+tier)" if is_tier(r.arm) else "")
        else:
            arm = f"Fairway ({r.arm})"
        added_value, own_added_value = added_ms(r, b), own_added_ms(r, b)
        if added_value is None or own_added_value is None:
            added, own_added, own = "-", "-", "-"
        else:
            added = f"{added_value:+.3f}"
            own_added = f"{own_added_value:+.3f}"
            own = f"{r.own_median_ms:.3f} / {r.own_p90_ms:.3f}"
        ratio = f"{r.median_ms / b.median_ms:.2f}" if b is not None else "-"
        prepass = f"{r.prepass_ms:.3f}" if r.prepass_ms is not None else "-"
        per_start = f"{r.vllm_per_start_ms:.3f}" if r.vllm_per_start_ms is not None else "-"
        started = f"{r.admitted_mean:.2f}" if r.admitted_mean is not None else "-"
        paired = same_work_added_ms(r, b)
        same = f"{paired[0]:+.3f} ({paired[1]:.0%})" if paired is not None else "-"
        lines.append(
            f"| {r.waiting:,} | {r.kind} | {arm} | {r.median_ms:.3f} | {r.p90_ms:.3f} | "
            f"{added} | {goal_met(r, b)} | {own_added} | {own_goal_met(r, b)} | {ratio} | {own} | "
            f"{prepass} | {per_start} | {started} | {same} | {same_work_goal_met(r, b)} |"
        )
    return "\n".join(lines)


def tier_pairs(results: list[ArmResult]) -> list[tuple[ArmResult, ArmResult]]:
    """(POLICY, POLICY+tier) rows of the same size and kind, vLLM's two arms first."""
    rows = {(r.arm, r.waiting, r.kind): r for r in results}
    pairs = []
    for r in sorted(results, key=lambda r: (r.waiting, KINDS.index(r.kind), not is_vllm(r.arm))):
        if is_tier(r.arm):
            plain = "+".join([arm_parts(r.arm)[0],
                              *sorted(arm_parts(r.arm)[1] - {"tier", "blind"})])
            other = rows.get((plain, r.waiting, r.kind))
            if other is not None:
                pairs.append((other, r))
    return pairs


def tier_goal_met(plain: ArmResult, tiered: ArmResult) -> str:
    """Yes/no: the tier's addition to Fairway's own median against `TIER_GOAL_MS`; "-": none."""
    goal = TIER_GOAL_MS.get((tiered.waiting, tiered.kind))
    if goal is None or is_vllm(tiered.arm):
        return "-"
    return "yes" if tiered.own_median_ms - plain.own_median_ms <= goal else "no"


def tier_markdown(results: list[ArmResult]) -> str:
    """One row per size, kind and pair (POLICY, POLICY+tier): Fairway's own median without and
    with the tier and the difference (what the tier lookup adds), the same for the pre-pass and
    for vLLM's part of the step, and the waiting requests the probe found in the tier."""

    def ms(value: float | None) -> str:
        return f"{value:.3f}" if value is not None else "-"

    def diff(a: float | None, b: float | None) -> str:
        return f"{b - a:+.3f}" if a is not None and b is not None else "-"

    lines = [
        "| waiting | step kind | arms | Fairway's own median ms | + tier ms | pre-pass median ms "
        "| + tier ms | vLLM's part median ms | + tier ms | waiting with a tier hit | "
        "tier tokens | tier lookups | lookup median / mean / p90 ms | tier goal met |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for plain, tiered in tier_pairs(results):
        vllm = is_vllm(plain.arm)
        own = "-" if vllm else f"{plain.own_median_ms:.3f} / {tiered.own_median_ms:.3f}"
        own_diff = "-" if vllm else diff(plain.own_median_ms, tiered.own_median_ms)
        hits, tokens = (
            "-" if value is None else f"{value:,.1f}".removesuffix(".0")
            for value in (tiered.tier_hits_median, tiered.tier_tokens_median)
        )
        times = tiered.tier_lookup_ms
        lookup = "-" if times is None else " / ".join(f"{t:.3f}" for t in times)
        lines.append(
            f"| {plain.waiting:,} | {plain.kind} | {plain.arm} / {tiered.arm} | {own} | "
            f"{own_diff} | {ms(plain.prepass_ms)} / {ms(tiered.prepass_ms)} | "
            f"{diff(plain.prepass_ms, tiered.prepass_ms)} | "
            f"{plain.vllm_median_ms:.3f} / {tiered.vllm_median_ms:.3f} | "
            f"{diff(plain.vllm_median_ms, tiered.vllm_median_ms)} | {hits} | {tokens} | "
            f"{tiered.tier_lookup_steps} | {lookup} | {tier_goal_met(plain, tiered)} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 10_000])
    parser.add_argument("--policies", nargs="+", default=["fairway", "lpm"])
    parser.add_argument(
        "--kinds", nargs="+", default=list(KINDS), choices=KINDS, help="what to measure"
    )
    parser.add_argument(
        "--steps", type=int, default=120,
        help="measured steps per arm and kind (admit + busy together)",
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed prefill steps first")
    parser.add_argument("--rounds", type=int, default=4, help="turns each arm takes in a kind")
    parser.add_argument("--bursts", type=int, default=3, help="bursts per arm and size")
    parser.add_argument("--running", type=int, default=16, help="max_num_seqs")
    parser.add_argument("--prefixes", type=int, default=40, help="shared cached prefixes")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc pass")
    parser.add_argument(
        "--tenants", type=int, default=1,
        help="requests spread over this many tenants (vllm_xargs); an arm POLICY+tenants lists "
        "them (the `tenants` option), the others ignore them (default 1: no tenants)",
    )
    parser.add_argument(
        "--tier-blocks", type=int, default=None,
        help="CPU offload tier of the POLICY+tier arms, in blocks (vLLM's OffloadingConnector; "
        "default: 4 x the shared prefixes' blocks)",
    )
    parser.add_argument(
        "--gpu-prefixes", type=int, default=None,
        help="in a run with a +tier arm, every arm's GPU cache holds this many prefixes' "
        f"blocks plus {TIER_RUN_SLOT_BLOCKS} per running slot (default: --prefixes / 4)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if min(args.sizes) < 1 or args.steps < args.rounds or args.bursts < 1:
        parser.error("--sizes must be >= 1, --steps >= --rounds, --bursts >= 1")
    for arm in args.policies:
        policy, flags = arm_parts(arm)
        if policy == "vllm" or not flags <= set(ARM_FLAGS) or ("blind" in flags
                                                              and "tier" not in flags):
            parser.error(f"--policies: {arm!r} is not POLICY[+tenants][+tier[+blind]]")
    if any(is_tier(arm) for arm in args.policies):
        prefix_blocks = PREFIX_TOKENS // BLOCK_SIZE
        if args.tier_blocks is None:
            args.tier_blocks = 4 * args.prefixes * prefix_blocks
        if args.gpu_prefixes is None:
            args.gpu_prefixes = max(1, args.prefixes // 4)
        if args.tier_blocks < 1 or not 0 <= args.gpu_prefixes <= args.prefixes:
            parser.error("--tier-blocks must be >= 1, --gpu-prefixes in [0, --prefixes]")
    elif args.tier_blocks is not None or args.gpu_prefixes is not None:
        parser.error("--tier-blocks / --gpu-prefixes need a POLICY+tier arm in --policies")

    from fairway.vllm import offline

    started = time.perf_counter()
    results: list[ArmResult] = []
    for n in args.sizes:
        results += run_size(offline, n, args)
    memory: dict[str, float] = {}
    small = [n for n in args.sizes if n <= 1_000]
    if not args.no_memory and small:
        work = Workload(offline, args, max(small))
        for policy in args.policies:
            memory[policy] = memory_per_request(work, policy, args)
    table = markdown(results)
    tier_table = tier_markdown(results) if any(is_tier(r.arm) for r in results) else None
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    took = time.perf_counter() - started
    print(f"Python {platform.python_version()} on {machine}; {took:.0f} s\n")
    print(table)
    if tier_table is not None:
        print(
            f"\nThe offload tier ({args.tier_blocks:,} blocks; every arm's GPU cache "
            f"{args.gpu_prefixes} of {args.prefixes} prefixes + {TIER_RUN_SLOT_BLOCKS} blocks per "
            "running slot): each arm without and with it (medians; 'waiting with a tier hit' "
            "and 'tier tokens' over the steps whose pre-pass looked the tier up, 'tier lookups' "
            "of them).\n"
        )
        print(tier_table)
    speed = speed_scaled(results)
    if speed is not None:
        print(f"\n{speed_line(speed)}")
    for policy, size in memory.items():
        print(f"\nFairway ({policy}) keeps {size:,.0f} bytes per waiting request.")
    report = {
        "config": {  # the tier's settings only in a run with a tier (others stay as they were)
            k: v for k, v in vars(args).items()
            if k != "json" and not (k in ("tier_blocks", "gpu_prefixes") and v is None)
        },
        "block_size": BLOCK_SIZE,
        "prompt_tokens": [PREFIX_TOKENS, PREFIX_TOKENS + SUFFIX_MAX],
        "machine": machine,
        "results": [asdict(r) for r in results],
        "memory_bytes_per_waiting_request": memory,
        "speed": speed,
        "markdown": table,
    }
    if tier_table is not None:
        report["tier_markdown"] = tier_table
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
