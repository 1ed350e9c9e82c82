"""The event loop of one virtual-clock replay: arrivals, engine steps, the clock, the record.

`VirtualClock` keeps time, `Recorder` fills the `RequestResult`s, `EngineNode` is one engine (vLLM's
scheduler, its clock, its cost model: a request added at a time, one step at a time, each step
answered with a fake model output and timed by the cost model), and `ReplayLoop` drives one node:
it adds each request at its release (its recorded arrival, or for a session turn its parent's first
token plus the think time: `fairway.replay.sessions`) and steps the engine. The fleet replay
(`fairway.fleet.replay`) drives many `EngineNode`s on one event loop, so a node steps by the same
code in both. Why apart from `fairway.replay.sim`: that module sets the engine up and writes the
result; this is what runs in between. Must not import vllm at import time: the engine-side
modules are imported where used.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fairway.profiling.step_time import StepTimeModel
from fairway.replay.offload_sim import TierTransfers
from fairway.replay.results import RequestResult
from fairway.replay.sessions import RECORDED_ARRIVAL_TAG, Releases

if TYPE_CHECKING:
    from fairway.traces.format import Trace, TraceRequest
    from fairway.vllm.scheduler import FairwayScheduler

logger = logging.getLogger(__name__)


# --- time -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class VirtualClock:
    """Seconds since the trace start; moves only forward. Callable: it is the policy's `now`."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move forward by a step's duration (>= 0)."""
        if not seconds >= 0.0:  # also catches NaN
            raise ValueError(f"the virtual clock cannot move by {seconds!r} s")
        self.now += seconds

    def jump_to(self, when: float) -> None:
        """Move to an idle engine's next event; never backwards."""
        if not when >= self.now:
            raise ValueError(f"the virtual clock cannot go back from {self.now!r} to {when!r}")
        self.now = when


# --- recording ------------------------------------------------------------------------------------


@dataclass(slots=True)
class StepRecord:
    """One engine step, as hooks see it (seconds on the virtual clock)."""

    index: int
    start_s: float
    end_s: float
    #: request id -> (first computed position, end position) of this step's span.
    spans: dict[str, tuple[int, int]]
    finished: list[str]


@dataclass
class ReplayHooks:
    """Optional observers of a replay (tests, debugging); both are called synchronously.

    Attributes:
        on_start: called once with the scheduler before the first step.
        on_step: called after every step that scheduled something.
    """

    on_start: Callable[[Any], None] | None = None
    on_step: Callable[[StepRecord], None] | None = None


class Recorder:
    """Per-request facts of the replay, turned into `RequestResult`s at the end.

    A request's first token or failure resolves it in `releases`, which releases its children,
    and is told to `on_resolved(trace index, when)` (the fleet replay's router learns of it so).
    One recorder serves every engine of a replay: request ids are unique in a trace.
    """

    def __init__(self, requests: Sequence[TraceRequest], releases: Releases,
                 on_resolved: Callable[[int, float], None] | None = None) -> None:
        self.requests = requests
        self.releases = releases
        self.on_resolved = on_resolved
        n = len(requests)
        self.index = {r.request_id: i for i, r in enumerate(requests)}
        self.first_scheduled: list[float | None] = [None] * n
        self.first_token: list[float | None] = [None] * n
        self.cached: list[int | None] = [None] * n
        self.error: list[str | None] = [None] * n
        self.last_end: list[int] = [0] * n
        self.num_done = 0
        self.num_preemptions = 0

    def scheduled(self, request_id: str, start: int, end: int, prompt: int, step_start: float,
                  step_end: float) -> None:
        i = self.index[request_id]
        if self.first_scheduled[i] is None:
            self.first_scheduled[i] = step_start
            self.cached[i] = start  # num_computed_tokens at admission = the prefix-cache hit
        elif start < self.last_end[i]:
            self.num_preemptions += 1  # recomputing from a cached prefix after preemption
        self.last_end[i] = end
        if start < prompt <= end and self.first_token[i] is None:
            self.first_token[i] = step_end
            self.num_done += 1
            self.releases.resolved(i, step_end)
            if self.on_resolved is not None:
                self.on_resolved(i, step_end)

    def fail(self, request_id: str, reason: str, when: float) -> None:
        """Record a failure at `when` (the first reason counts; none after a first token)."""
        i = self.index[request_id]
        if self.first_token[i] is None and self.error[i] is None:
            self.error[i] = reason
            self.num_done += 1
            self.releases.resolved(i, when)
            if self.on_resolved is not None:
                self.on_resolved(i, when)

    def results(self, tier_tokens: Mapping[str, int] | None = None) -> list[RequestResult]:
        """One result per trace request; `tier_tokens` (a tier's loads per request id) sets
        each request's `tier_tokens` (0 when it loaded nothing); None: no tier.

        A request released after its parent has its release time as `arrival_s` (TTFT counts
        from there) and the trace's arrival in its tags (`RECORDED_ARRIVAL_TAG`)."""
        out = []
        for i, r in enumerate(self.requests):
            error = self.error[i]
            if error is None and self.first_token[i] is None:
                error = "no first token when the replay ended"
            tags = dict(r.tags)
            release = self.releases.release_s[i]
            if i in self.releases.waiting:
                tags[RECORDED_ARRIVAL_TAG] = r.arrival_s
            out.append(RequestResult(
                request_id=r.request_id,
                arrival_s=r.arrival_s if release is None else release,
                phase=r.phase,
                prompt_tokens=r.prompt_tokens,
                first_scheduled_s=self.first_scheduled[i],
                first_token_s=self.first_token[i],
                cached_tokens=self.cached[i],
                error=error,
                tags=tags,
                tenant=r.tenant,
                priority=r.priority,
                tier_tokens=None if tier_tokens is None else tier_tokens.get(r.request_id, 0),
            ))
        return out


# --- one engine -----------------------------------------------------------------------------------


class EngineNode:
    """One engine of a replay: vLLM's scheduler with its own virtual clock, cost model and (with
    an offload tier) tier; requests are added one at a time and the engine steps once at a time.

    The single-node replay (`ReplayLoop`) drives one, the fleet replay (`fairway.fleet`) many;
    both step it with `turn`, so a node of a fleet runs exactly the code a single replay runs.
    The facts of each request go to the shared `Recorder`. `next_release` gives the replay's
    next release time (None: none pending), which a node waiting for its tier moves to at most.
    """

    def __init__(self, scheduler: FairwayScheduler, cost: StepTimeModel, clock: VirtualClock,
                 block_size: int, recorder: Recorder, next_release: Callable[[], float | None],
                 *, tier: TierTransfers | None = None,
                 on_step: Callable[[StepRecord], None] | None = None) -> None:
        from fairway.vllm import offline_vllm  # lazy, as every vLLM-side import here

        self.scheduler = scheduler
        self.cost = cost
        self.clock = clock
        self.block_size = block_size
        self.recorder = recorder
        self.requests = recorder.requests
        self.next_release = next_release
        self.tier = tier
        self.on_step = on_step
        self.vocab_size = int(offline_vllm.TINY_MODEL_CONFIG["vocab_size"])
        self.num_steps = 0
        self.empty_steps = 0

    def make_request(self, index: int, arrival: float) -> Any:
        """The vLLM `Request` of trace request `index`, stamped with `arrival` (token ids built
        once, here; block hashes by vLLM's hasher)."""
        from fairway.vllm import offline

        r = self.requests[index]
        return offline.make_request(
            r.request_id, r.token_ids(self.vocab_size), arrival, r.max_tokens,
            block_size=self.block_size, priority=r.priority, tenant=r.tenant,
        )

    def add(self, request: Any) -> None:
        """Hand a request built by `make_request` to the engine (between steps, as an engine
        adds them)."""
        self.scheduler.add_request(request)

    @property
    def busy(self) -> bool:
        """Whether the engine holds a request it has not finished."""
        return bool(self.scheduler.has_unfinished_requests())

    @property
    def tier_pending(self) -> bool:
        """Whether the offload tier has a job not reported yet."""
        return self.tier is not None and self.tier.pending

    def turn(self) -> bool:
        """One step of the engine, and what follows a step that did nothing. False when the
        engine stalled: a second step in a row with nothing to schedule and no tier work (the
        caller moves the clock to the next release, or gives up)."""
        polling = self.tier_pending
        if self.step():
            self.empty_steps = 0
        elif polling:
            # vLLM's engine keeps stepping (polling its worker) while transfers are in flight: a
            # poll is no stall, and the polls that would find nothing are skipped
            self._wait_for_tier()
            self.empty_steps = 0
        else:
            # an engine loops again at once after a step with nothing to schedule (a policy may
            # change its plan after one); only a second one in a row stalls
            self.empty_steps += 1
            if self.empty_steps > 1:
                return False
        return True

    def step(self) -> bool:
        """One engine step; False when it scheduled nothing."""
        from fairway.vllm import internals, offline, offload_worker

        scheduler = self.scheduler
        output = scheduler.schedule()
        scheduled = internals.scheduled_tokens(output)
        spans = internals.scheduled_spans(scheduler, scheduled)
        start = self.clock.now
        tier = self.tier
        if tier is not None:  # the step's forward pass waits for its flushed stores
            offload_worker.order_finished_ids(scheduler)
            self.clock.advance(tier.start_step(offload_worker.step_metadata(output), start))
        if spans:
            self.clock.advance(self.cost.step_time_s([(s, e) for s, e, _ in spans.values()]))
            end = self.clock.now
            for request_id, (s, e, prompt) in spans.items():
                self.recorder.scheduled(request_id, s, e, prompt, start, end)
            self.num_steps += 1
        model_output = offline.fake_model_output(scheduler, output)
        if tier is not None:
            model_output.kv_connector_output = tier.finish_step(self.clock.now)
        finished = offline.finished_ids(scheduler.update_from_output(output, model_output))
        for request_id in finished:  # only errors remain: a finished prefill has its token
            self.recorder.fail(request_id, self._failure(request_id), self.clock.now)
        if self.on_step is not None and spans:
            self.on_step(StepRecord(self.num_steps, start, self.clock.now,
                                    {k: (s, e) for k, (s, e, _) in spans.items()}, finished))
        return bool(spans) or bool(finished)

    def _failure(self, request_id: str) -> str:
        from fairway.vllm import internals

        i = self.recorder.index[request_id]
        tokens = self.requests[i].prompt_tokens
        blocks = internals.usable_blocks(self.scheduler)
        return (
            f"finished by the engine without a first token (a {tokens}-token prompt; the KV "
            f"cache has {blocks} usable blocks of {self.block_size} tokens)"
        )

    def _wait_for_tier(self) -> None:
        """After a step with nothing to schedule while the tier has jobs: move to the next
        completion or release, whichever is first (no move when only deferred stores are left:
        the next step submits them)."""
        assert self.tier is not None
        when = self.tier.next_completion()
        if when is None:
            return
        release = self.next_release()
        if release is not None:
            when = min(when, release)
        self.clock.jump_to(max(self.clock.now, when))


# --- the loop -------------------------------------------------------------------------------------


class ReplayLoop:
    """The event loop of one replay: arrivals, steps, clock, recording, on one `EngineNode`.

    Requests enter at their release times (`releases`; None: closed loop): the recorded
    arrivals, and a session turn its think time after its parent's first token or failure.
    """

    def __init__(self, trace: Trace, scheduler: FairwayScheduler, cost: StepTimeModel,
                 clock: VirtualClock, block_size: int, progress: bool,
                 hooks: ReplayHooks | None, tier: TierTransfers | None = None,
                 releases: Releases | None = None) -> None:
        self.requests = trace.requests
        self.scheduler = scheduler
        self.clock = clock
        self.releases = Releases(trace.requests) if releases is None else releases
        self.recorder = Recorder(trace.requests, self.releases)
        self.node = EngineNode(
            scheduler, cost, clock, block_size, self.recorder, self.releases.next_s, tier=tier,
            on_step=hooks.on_step if hooks is not None else None,
        )
        self.progress = progress
        self.aborted = False

    @property
    def num_steps(self) -> int:
        """Steps that scheduled something."""
        return self.node.num_steps

    def run(self) -> None:
        from tqdm import tqdm

        node = self.node
        bar = tqdm(total=len(self.requests), disable=not self.progress, unit="req",
                   desc="replay", leave=False, mininterval=0.5)
        try:
            while not self.aborted:
                self._admit_arrivals()
                busy = node.busy
                # idle, every added request is resolved, so every child is in the heap
                release = self.releases.next_s()
                if not busy and release is None:
                    break
                if not busy and not node.tier_pending:
                    assert release is not None
                    self.clock.jump_to(release)
                    continue
                done_before = self.recorder.num_done
                if not node.turn():
                    self._stalled()
                bar.update(self.recorder.num_done - done_before)
        finally:
            bar.close()
        self._drain()

    def _admit_arrivals(self) -> None:
        """Add every request released by now, stamped with its release time."""
        node = self.node
        for i in self.releases.due(self.clock.now):
            arrival = self.releases.release_s[i]
            assert arrival is not None  # in the heap, so released
            node.add(node.make_request(i, arrival))

    def _stalled(self) -> None:
        """Nothing could be scheduled: wait for the next release, or give up on the rest."""
        release = self.releases.next_s()
        if release is not None:
            self.clock.jump_to(max(self.clock.now, release))
            return
        # the engine is left as it is: it is thrown away with the replay
        abort_unanswered(self.recorder, self.clock.now)
        self.aborted = True

    def _drain(self) -> None:
        """Requests still without a result (none unless the loop was cut) get an error."""
        drain(self.recorder, self.clock.now)


#: Why `abort_unanswered` fails the requests it fails.
STALLED = "never scheduled: the engine could not admit it (KV cache too small?)"


def abort_unanswered(recorder: Recorder, when: float, reason: str = STALLED) -> None:
    """Record every request without a first token as failed at `when` (trace order: a parent
    fails before its children)."""
    unfinished = [r.request_id for i, r in enumerate(recorder.requests)
                  if recorder.first_token[i] is None]
    for request_id in unfinished:
        recorder.fail(request_id, reason, when)
    logger.warning("replay stopped with %d requests unanswered: %s", len(unfinished), reason)


def drain(recorder: Recorder, when: float) -> None:
    """Every request still without a result gets an error (none unless the loop was cut)."""
    for r in recorder.requests:
        recorder.fail(r.request_id, "no first token when the replay ended", when)
