"""`TierProbe`: how much of each waiting request's prompt, beyond its GPU prefix hit, vLLM's CPU
offload tier holds (`--kv-offloading-size`, the `OffloadingConnector`), read without side effects.

The connector decides at admission (`get_num_new_matched_tokens`): from the chunk of the GPU hit
on, the run of consecutive chunks its manager holds, whole chunks only, at least one chunk, at
most the prompt; and it defers the request (returns None, vLLM skips it for the step) while any
chunk of that run is still being stored (`HIT_PENDING`) or loaded for another request, or while
the request has a transfer of its own in flight. The probe applies the same rules through the
manager's `lookup()` (a dict read for vLLM's CPU manager: no touch, no load prepared, no event),
so that the order prices a tier hit before vLLM serves it (`tests/integration/test_tier_probe.py`
checks the probe against what the connector then loads, request for request).

Memo per ticket, kept up to date by what changed, read from the connector's own books before each
step: the keys of the store jobs created (chunks inserted, pending) and of those finished (now
readable) since the last step; a ticket is looked at again only when one of its run's end keys
(the first and the last chunk of the run, the chunk after it) changed, when its GPU hit ends in
another chunk, or while its run has a pending chunk. Evictions are not in those books: when the
tier's chunks in use grew less than the stores inserted (something was evicted), or a job came
and went unseen, every ticket is checked by its ends. Looking at
it again checks those ends and scans only what moved (a GPU hit that shrank: the chunks between
the new and the old start). An eviction inside a run whose ends stay is not seen until an end
changes; the connector's own lookup at admission is the truth in any case (an over-estimate
orders one request early, vLLM then computes what the tier did not hold).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
from vllm.logger import init_logger
from vllm.v1.request import Request

from fairway.errors import FairwayError
from fairway.vllm import internals

logger = init_logger(__name__)

class TierProbe:
    """Tier-hit tokens and deferrals of waiting requests, by the scheduler's tickets.

    Attributes:
        weight: the share of a GPU hit one tier token counts as in the order's cached prefix h
            (so its work is c + (1 - weight) x tier tokens): 1 - load/compute for `priced`.
        chunk_tokens: tokens per offload chunk (the tier's granularity).
        last_tokens / last_deferred: tier-hit tokens and deferred requests at the last lookup.
    """

    def __init__(self, tier_scheduler: Any, weight: float) -> None:
        self._tier = tier_scheduler
        group, self.chunk_tokens, self._per = internals.offload_group(tier_scheduler)
        self._suffix = internals.offload_key_suffix(group)
        self._manager = internals.offload_manager(tier_scheduler)
        if type(self._manager).__name__ != "CPUOffloadingManager":
            raise FairwayError(
                f"the tier's manager is {type(self._manager).__name__}: only vLLM's "
                "CPUOffloadingManager is read (its lookup is a dict read; another manager's may "
                "start a transfer)"
            )
        self._lookup = internals.offload_lookup(self._manager)
        self._hit, self._miss = internals.offload_lookup_results()
        self.weight = float(weight)
        self._changed: set[bytes] = set()
        # The connector's books at the last lookup: next job id, the store jobs in flight (id ->
        # keys), chunks in use, reset generation.
        self._next_job = internals.offload_job_counter(tier_scheduler)
        self._stores: dict[int, Collection[bytes]] = {}
        self._used = internals.offload_used_chunks(self._manager)
        self._generation = internals.offload_generation(self._manager)
        self._start = np.zeros(0, dtype=np.int64)  # chunk the run starts at (the GPU hit's)
        self._end = np.zeros(0, dtype=np.int64)  # chunk after the run
        self._tokens = np.zeros(0, dtype=np.int64)  # tier tokens of the run (0: none)
        self._pending = np.zeros(0, dtype=bool)  # a chunk of the run is pending or uncertain
        self._seen = np.zeros(0, dtype=bool)  # the ticket has a memo
        self._ends: list[tuple[bytes, ...]] = []  # the keys the ticket is indexed under
        self._by_key: dict[bytes, set[int]] = {}
        #: Runs scanned in the current lookup: key of the first chunk -> (first chunk, chunk
        #: after the run, key of its last chunk). Chunk keys are chained hashes, so a row whose
        #: key at that last chunk is the same shares the whole run: requests of one document
        #: scan it once per step, not once each (scheduler_overhead.py +tier, 1,000 waiting,
        #: 25 per prefix: ~160 lookups per refreshed row -> ~8).
        self._runs: dict[bytes, tuple[int, int, bytes]] = {}
        self.last_tokens = 0
        self.last_deferred = 0

    @classmethod
    def for_scheduler(cls, scheduler: Any, rule: str, weight: float) -> TierProbe | None:
        """The probe of the scheduler's offload tier; None without one, or (one warning) when
        the configured connector cannot be read: the order is then tier-blind."""
        connector = internals.kv_connector(scheduler)
        if connector is None or rule == "blind":
            return None
        try:
            tier = internals.offloading_scheduler(connector)
            if tier is None:
                raise FairwayError(
                    f"the KV connector is {type(connector).__name__}, not OffloadingConnector"
                )
            return cls(tier, weight)
        except Exception as exc:  # noqa: BLE001 - any unreadable config: tier-blind, not a crash
            logger.warning(
                "Fairway cannot read the KV offload tier (%s); the order is tier-blind "
                "(hits in the tier count as misses).", exc,
            )
            return None

    # --- tickets ----------------------------------------------------------------------------------

    def resize(self, capacity: int) -> None:
        """Grow the memo to `capacity` tickets (the queue table grew)."""
        old = len(self._seen)
        if capacity <= old:
            return
        capacity = max(capacity, 2 * old, 64)
        for name in ("_start", "_end", "_tokens", "_pending", "_seen"):
            arr = getattr(self, name)
            grown = np.zeros(capacity, dtype=arr.dtype)
            grown[:old] = arr
            setattr(self, name, grown)
        self._ends.extend([()] * (capacity - old))

    def forget(self, ticket: int) -> None:
        """The ticket's request left the queue."""
        if ticket < len(self._seen):
            self._seen[ticket] = False
            self._tokens[ticket] = 0
            self._index(ticket, ())

    def tokens_of(self, ticket: int) -> int:
        """The ticket's tier tokens at its last lookup (0: never looked up)."""
        if ticket >= len(self._seen) or not self._seen[ticket]:
            return 0
        return int(self._tokens[ticket])

    # --- the queue --------------------------------------------------------------------------------

    def lookup(
        self, requests: Sequence[Request], tickets: np.ndarray, gpu_hits: np.ndarray,
        ticket_of: Mapping[Request, int], by_id: Mapping[str, Request],
        unprobed: Collection[int] = (),
    ) -> tuple[np.ndarray, np.ndarray]:
        """Tier tokens beyond each row's GPU hit, and which rows the connector would defer now.

        Args:
            requests: the rows' requests (row i is `requests[i]`, ticket `tickets[i]`).
            tickets: the rows' tickets.
            gpu_hits: the rows' GPU prefix hits in tokens (block-granular).
            ticket_of / by_id: ticket of a request, request of an id (to find deferred requests).
            unprobed: tickets whose GPU hit is not known yet (no tier lookup for them: their run
                would start at the prompt's first chunk; they get 0 until the GPU probe has them).
        """
        self.resize(int(tickets.max()) + 1 if len(tickets) else 0)
        check_all = self._read_books()
        starts = gpu_hits // self.chunk_tokens
        stale = ~self._seen[tickets] | (self._start[tickets] != starts) | self._pending[tickets]
        if check_all:
            stale[:] = True
            self._changed.clear()
        elif self._changed:
            by_key = self._by_key
            affected = [s for key in self._changed if (hit := by_key.get(key)) for s in hit]
            self._changed.clear()
            if affected:
                stale |= np.isin(tickets, np.fromiter(affected, dtype=tickets.dtype))
        rows = np.flatnonzero(stale)
        if len(rows):
            self._runs = {}  # runs found in this lookup, shared by the rows of one prefix
            skip = set(unprobed)
            for row in rows.tolist():
                ticket = int(tickets[row])
                if ticket in skip:
                    continue
                self._refresh(requests[row], ticket, int(starts[row]), int(gpu_hits[row]))
        tokens = self._tokens[tickets]
        if unprobed:
            unseen = np.isin(tickets, np.fromiter(unprobed, dtype=tickets.dtype))
            tokens = np.where(unseen, 0, tokens)
        deferred = self._pending[tickets] & (tokens > 0)
        busy = internals.offload_busy_requests(self._tier)
        loading = internals.offload_chunks_being_loaded(self._tier)
        marked = {
            ticket_of[r] for rid in busy if (r := by_id.get(rid)) is not None and r in ticket_of
        }
        if loading:
            by_key = self._by_key
            marked.update(s for key in loading if (hit := by_key.get(key)) for s in hit)
        if marked:
            deferred |= np.isin(tickets, np.fromiter(marked, dtype=tickets.dtype)) & (tokens > 0)
        self.last_tokens = int(tokens.sum())
        self.last_deferred = int(deferred.sum())
        return tokens, deferred

    # --- one request ------------------------------------------------------------------------------

    def _read_books(self) -> bool:
        """Collect the keys the connector's jobs changed since the last lookup into `_changed`;
        True when every ticket must be checked (an eviction, a job unseen; a reset clears all)."""
        tier, manager = self._tier, self._manager
        generation = internals.offload_generation(manager)
        if generation != self._generation:
            self._generation = generation
            self._seen[:] = False
            self._by_key.clear()
            self._ends = [()] * len(self._ends)
        jobs = internals.offload_jobs(tier)
        changed, stores = self._changed, self._stores
        check_all = False
        for job_id in [j for j in stores if j not in jobs]:  # finished: readable now
            changed.update(stores.pop(job_id))
        inserted = 0
        counter = internals.offload_job_counter(tier)
        for job_id in range(self._next_job, counter):
            job = jobs.get(job_id)
            if job is None:  # created and finished between two lookups: its keys are unknown
                check_all = True
                continue
            is_store, keys = internals.offload_job_keys(job)
            if is_store:
                stores[job_id] = keys
                changed.update(keys)
                inserted += len(keys)
        self._next_job = counter
        used = internals.offload_used_chunks(manager)
        if used < self._used + inserted:
            check_all = True  # chunks were freed (an eviction)
        self._used = used
        return check_all

    def _refresh(self, request: Request, ticket: int, start: int, gpu_hit: int) -> None:
        """Bring one ticket's run up to date: check the ends of the run it had and scan only what
        moved (all of it while the run had a pending chunk)."""
        known = None
        seen = self._seen[ticket] and not self._pending[ticket]
        if seen and self._end[ticket] > self._start[ticket]:
            known = (int(self._start[ticket]), int(self._end[ticket]))
            if not known[0] <= start < known[1] and start > known[0]:
                known = None  # the GPU hit passed the whole run: scan from it
            elif known[0] < start:
                known = (start, known[1])  # the GPU hit grew into the run
        end, pending = self._scan(request, start, known, _load_limit(request, gpu_hit,
                                                                    self.chunk_tokens))
        self._start[ticket], self._end[ticket], self._pending[ticket] = start, end, pending
        self._tokens[ticket] = self._run_tokens(request, gpu_hit, end)
        self._seen[ticket] = True
        self._index(ticket, self._end_keys(request, start, end))

    def _run_tokens(self, request: Request, gpu_hit: int, end: int) -> int:
        """Tokens the connector loads for a run ending at chunk `end` (0 below one chunk)."""
        tokens = min(request.num_tokens, end * self.chunk_tokens) - gpu_hit
        return tokens if tokens >= self.chunk_tokens else 0

    def _key(self, hashes: Sequence[bytes], chunk: int) -> bytes:
        """vLLM's offload key of a chunk: the hash of its last block + the group's suffix."""
        return hashes[(chunk + 1) * self._per - 1] + self._suffix

    def _scan(self, request: Request, start: int, known: tuple[int, int] | None,
              limit: int | None = None) -> tuple[int, bool]:
        """(chunk after the run from `start`, whether a chunk of it is pending or uncertain).

        `known`: a run [a, b) believed held; reaching chunk a, its first and last chunks are
        checked and, if both are held, the scan jumps to b. `limit`: the chunk the run may not
        reach (the request's `max_load_tokens`).
        """
        if internals.skips_external_kv(request):
            return start, False
        hashes = request.block_hashes
        stop = len(hashes) // self._per
        if limit is not None:
            stop = min(stop, limit)
            if known is not None and known[1] > stop:
                known = None
        ctx = internals.offload_request_context(self._tier, request.request_id)
        lookup, hit, miss, key = self._lookup, self._hit, self._miss, self._key
        i, pending = start, False
        runs = self._runs
        first = key(hashes, start) if start < stop else None
        shared = runs.get(first) if first is not None else None
        if shared is not None and shared[0] == start and shared[1] <= stop and (
            key(hashes, shared[1] - 1) == shared[2]
        ):
            i, known = shared[1], None
        while i < stop:
            if known is not None and i == known[0]:
                a, b = known
                known = None
                if b <= stop and lookup(key(hashes, b - 1), ctx) is hit and (
                    b - 1 == a or lookup(key(hashes, a), ctx) is hit
                ):
                    i = b
                    continue
            result = lookup(key(hashes, i), ctx)
            if result is hit:
                i += 1
            elif result is miss:
                break
            else:  # HIT_PENDING counts toward the run but defers; RETRY defers
                pending = True
                i += 1
        if first is not None and i > start and not pending:
            runs[first] = (start, i, key(hashes, i - 1))
        return i, pending

    def _end_keys(self, request: Request, start: int, end: int) -> tuple[bytes, ...]:
        """The keys whose change can change the ticket's run: its first and last chunk and the
        chunk after it."""
        hashes = request.block_hashes
        stop = len(hashes) // self._per
        keys = []
        if start < stop:
            keys.append(self._key(hashes, start))
        if end - 1 > start:
            keys.append(self._key(hashes, end - 1))
        if start < end < stop:
            keys.append(self._key(hashes, end))
        return tuple(keys)

    def _index(self, ticket: int, keys: tuple[bytes, ...]) -> None:
        """Index the ticket under `keys` (replacing its old ones)."""
        by_key = self._by_key
        old = self._ends[ticket]
        if old == keys:
            return
        for key in old:
            hit = by_key.get(key)
            if hit is not None:
                hit.discard(ticket)
                if not hit:
                    del by_key[key]
        for key in keys:
            by_key.setdefault(key, set()).add(ticket)
        self._ends[ticket] = keys


def _load_limit(request: Request, gpu_hit: int, chunk_tokens: int) -> int | None:
    """The chunk a load may not reach under the request's `max_load_tokens` (vLLM's
    experimental `kv_transfer_params` field, `internals.max_load_tokens`); None: no cap."""
    cap = internals.max_load_tokens(request)
    return None if cap is None else (gpu_hit + cap) // chunk_tokens


def tier_weight(rule: str, fixed_weight: float, load_to_compute: float) -> float:
    """The share of a GPU hit one tier token counts as, per rule (option `tier`): `priced`, its
    load over compute time (`fairway.profiling.load_cost`); `equal`, a GPU hit's (SGLang HiCache's
    rule); `fixed`, a constant share (`tier_weight`: Dynamo's router uses 0.75 for host memory);
    `blind`, none (the order of a Fairway without the probe)."""
    if rule == "equal":
        return 1.0
    if rule == "fixed":
        return fixed_weight
    if rule == "priced":
        return max(0.0, 1.0 - load_to_compute)
    return 0.0
