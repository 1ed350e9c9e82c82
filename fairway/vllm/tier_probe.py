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

Memo per slot, as the GPU probe's: the run found for a request stays valid while the tier did
not change (`internals.offload_version`: no transfer job created or finished, no reset) and the
request's GPU hit ends in the same chunk. When the tier changed, a run is re-verified by its two
ends (its last chunk still held, the next one still missing) and rescanned when either moved or
when it had a pending chunk; an eviction inside a run whose ends stay is seen when the request is
rescanned, and the connector's own lookup at admission is the truth in any case.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from vllm.logger import init_logger
from vllm.v1.request import Request

from fairway.errors import FairwayError
from fairway.vllm import internals

logger = init_logger(__name__)

#: How a tier hit counts in the order (option `tier`): `priced`, its load over compute time
#: (`fairway.profiling.load_cost`); `equal`, as a GPU hit (SGLang HiCache's rule); `fixed`, a
#: constant share of one (`tier_weight`, Dynamo's router uses 0.75 for host memory); `blind`,
#: not at all (the order of a Fairway without the probe).
TIER_RULES = ("priced", "equal", "fixed", "blind")


class TierProbe:
    """Tier-hit tokens and deferrals of waiting requests, by the scheduler's slots.

    Attributes:
        weight: the share of a GPU hit one tier token counts as in the order's cached prefix h
            (so its work is c + (1 - weight) x tier tokens): 1 - load/compute for `priced`.
        chunk_tokens: tokens per offload chunk (the tier's granularity).
    """

    def __init__(self, tier_scheduler: Any, weight: float) -> None:
        self._tier = tier_scheduler
        self.group, self.chunk_tokens, self._hashes_per_chunk = internals.offload_group(
            tier_scheduler
        )
        self._manager = internals.offload_manager(tier_scheduler)
        self._make_key = internals.offload_key_maker()
        self._hit, self._miss = internals.offload_lookup_results()
        self.weight = float(weight)
        self._version: tuple[int, int, int] | None = None
        self._stamp = 0  # bumped when the version changes; a memo of an older stamp is stale
        capacity = 0
        self._start = np.zeros(capacity, dtype=np.int64)  # chunk the run starts at (GPU hit)
        self._end = np.zeros(capacity, dtype=np.int64)  # chunk after the run
        self._tokens = np.zeros(capacity, dtype=np.int64)  # tier tokens of the run (0: none)
        self._pending = np.zeros(capacity, dtype=bool)
        self._seen = np.full(capacity, -1, dtype=np.int64)  # stamp of the memo (-1: none)
        self._keys: list[list[bytes] | None] = []
        #: Tier-hit tokens and deferred requests at the last `lookup` (metrics, tests).
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

    # --- slots ------------------------------------------------------------------------------------

    def resize(self, capacity: int) -> None:
        """Grow the memo to `capacity` slots (the slot table grew)."""
        old = len(self._seen)
        if capacity <= old:
            return
        for name in ("_start", "_end", "_tokens", "_pending", "_seen"):
            arr = getattr(self, name)
            grown = np.full(capacity, -1 if name == "_seen" else 0, dtype=arr.dtype)
            grown[:old] = arr
            setattr(self, name, grown)
        self._keys.extend([None] * (capacity - old))

    def forget(self, slot: int) -> None:
        """The slot's request left the queue."""
        if slot < len(self._seen):
            self._seen[slot] = -1
            self._keys[slot] = None

    def tokens_of(self, slot: int) -> int:
        """The slot's tier tokens at its last lookup (0: never looked up)."""
        if slot >= len(self._seen) or self._seen[slot] < 0:
            return 0
        return int(self._tokens[slot])

    # --- the queue --------------------------------------------------------------------------------

    def lookup(
        self, requests: Sequence[Request], slots: np.ndarray, gpu_hits: np.ndarray,
        slot_of: Mapping[Request, int], by_id: Mapping[str, Request],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Tier tokens beyond each row's GPU hit, and which rows the connector would defer now.

        Args:
            requests: the rows' requests (row i is `requests[i]`, slot `slots[i]`).
            slots: the rows' slots.
            gpu_hits: the rows' GPU prefix hits in tokens (block-granular).
            slot_of / by_id: slot of a request, request of an id (to find deferred requests).
        """
        self.resize(int(slots.max()) + 1 if len(slots) else 0)
        version = internals.offload_version(self._tier)
        if version != self._version:
            self._version = version
            self._stamp += 1
        starts = gpu_hits // self.chunk_tokens
        stale = (self._seen[slots] != self._stamp) | (self._start[slots] != starts)
        for row in np.flatnonzero(stale).tolist():
            self._refresh(requests[row], int(slots[row]), int(starts[row]), int(gpu_hits[row]))
        tokens = self._tokens[slots]
        deferred = self._pending[slots].copy()
        busy = internals.offload_busy_requests(self._tier)
        if busy:
            marked = {slot_of[r] for rid in busy if (r := by_id.get(rid)) is not None
                      and r in slot_of}
            if marked:
                deferred |= np.isin(slots, np.fromiter(marked, dtype=slots.dtype))
        loading = internals.offload_chunks_being_loaded(self._tier)
        if loading:
            for row in np.flatnonzero(tokens > 0).tolist():
                slot = int(slots[row])
                keys = self._keys[slot]
                if keys is not None and not loading.isdisjoint(
                    keys[self._start[slot]:self._end[slot]]
                ):
                    deferred[row] = True
        self.last_tokens = int(tokens.sum())
        self.last_deferred = int(deferred.sum())
        return tokens, deferred

    def fresh_tokens(self, request: Request, gpu_hit: int) -> tuple[int, bool]:
        """A full scan that ignores and does not update the memo (tests): (tokens, pending)."""
        keys = self._keys_of(request, None)
        start = gpu_hit // self.chunk_tokens
        end, pending = self._scan(request, keys, start, len(keys))
        return self._run_tokens(request, gpu_hit, end), pending

    # --- one request ------------------------------------------------------------------------------

    def _refresh(self, request: Request, slot: int, start: int, gpu_hit: int) -> None:
        """Bring one slot's run up to date: verify it by its ends, rescan when they moved."""
        keys = self._keys_of(request, slot)
        stop = len(keys)
        # vLLM internal: Request.skip_reading_prefix_cache (a request that asked for no reuse)
        if getattr(request, "skip_reading_prefix_cache", False) or start >= stop:
            end, pending = start, False
        elif self._seen[slot] >= 0 and self._start[slot] == start and not self._pending[slot]:
            end = int(self._end[slot])
            ctx = None
            if end > start and self._lookup(request, keys[end - 1], ctx) is not self._hit:
                end, pending = self._scan(request, keys, start, stop)
            elif end < stop and self._lookup(request, keys[end], ctx) is not self._miss:
                end, pending = self._scan(request, keys, end, stop)
            else:
                pending = False
        else:
            end, pending = self._scan(request, keys, start, stop)
        self._start[slot], self._end[slot], self._pending[slot] = start, end, pending
        self._tokens[slot] = self._run_tokens(request, gpu_hit, end)
        self._seen[slot] = self._stamp

    def _run_tokens(self, request: Request, gpu_hit: int, end: int) -> int:
        """Tokens the connector loads for a run ending at chunk `end` (0 below one chunk)."""
        # vLLM internal: Request.num_tokens
        tokens = min(request.num_tokens, end * self.chunk_tokens) - gpu_hit
        return tokens if tokens >= self.chunk_tokens else 0

    def _scan(self, request: Request, keys: list[bytes], start: int, stop: int) -> tuple[int, bool]:
        """(chunk after the run from `start`, whether a chunk of it is pending or uncertain)."""
        ctx = internals.offload_request_context(self._tier, request.request_id)
        hit, miss = self._hit, self._miss
        lookup = self._manager.lookup
        end, pending = start, False
        for i in range(start, stop):
            result = lookup(keys[i], ctx)
            if result is hit:
                end = i + 1
            elif result is miss:
                break
            else:  # HIT_PENDING counts toward the run but defers; RETRY defers
                pending = True
                end = i + 1
        return end, pending

    def _lookup(self, request: Request, key: bytes, ctx: Any) -> Any:
        if ctx is None:
            ctx = internals.offload_request_context(self._tier, request.request_id)
        return self._manager.lookup(key, ctx)

    def _keys_of(self, request: Request, slot: int | None) -> list[bytes]:
        """Offload keys of the request's whole chunks (vLLM's: the last block hash of each)."""
        hashes = request.block_hashes  # vLLM internal: Request.block_hashes
        per = self._hashes_per_chunk
        wanted = len(hashes) // per
        keys = self._keys[slot] if slot is not None else None
        if keys is not None and len(keys) == wanted:
            return keys
        make, group = self._make_key, self.group
        keys = [make(hashes[(i + 1) * per - 1], group) for i in range(wanted)]
        if slot is not None:
            self._keys[slot] = keys
        return keys


def tier_weight(rule: str, fixed_weight: float, load_to_compute: float) -> float:
    """The share of a GPU hit one tier token counts as, per rule (`TIER_RULES`)."""
    if rule == "equal":
        return 1.0
    if rule == "fixed":
        return fixed_weight
    if rule == "priced":
        return max(0.0, 1.0 - load_to_compute)
    return 0.0
