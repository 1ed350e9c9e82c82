"""Which hash keys vLLM cached since the last step: a walk back from the hash map's newest key.

Why a module of its own: `fairway.vllm.prefix_memo` needs, once per step, the waiting requests
whose next block got cached. vLLM's hash map is an insertion-ordered dict, so the keys cached
since the last step are the ones after the newest key seen then; `CacheGrowth` remembers that key
and proves each walk (or falls back to checking every next key), apart from the memo's per-request
bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Any

#: Steps after which `advance()` checks every waiting request's next block against the cache
#: even when the walk over the newly cached keys proved that nothing else was cached (the walk:
#: `CacheGrowth.grown_keys`).
FULL_CHECK_EVERY = 32
#: Keys `grown_keys` reads from the hash map's end at a time.
_WALK_CHUNK = 256


class CacheGrowth:
    """The hash map's newest key at the last step, and the steps since the last full check."""

    def __init__(self) -> None:
        #: The hash map's newest key, its block and the key before it at the last `advance()`,
        #: and the steps since the last check of every next key (see `grown_keys`).
        self.newest: tuple[bytes | None, Any, bytes | None] = (None, None, None)
        self.since_full_check = 0

    def forget(self) -> None:
        """Remember no newest key (the hash map was replaced): the next walk cannot prove itself,
        so every next key is checked."""
        self.newest = (None, None, None)

    def grown_keys(self, cache: dict[bytes, Any], by_next: dict[bytes, Any]) -> Iterable[bytes]:
        """Keys of `by_next` that may have been cached since the last `advance()`.

        The hash map is a dict, so keys cached since then come after the newest key seen last
        time (`mark_newest`), in insertion order: a walk back from the newest key (newest first)
        costs O(blocks cached since), instead of a check of every waiting request's next key.
        The walk proves itself: it must meet the remembered newest key, holding the same block,
        with the remembered second-newest key right behind it (else a key was popped and put
        back at the end, which vLLM does when an eviction finds another block under the hash).
        When it cannot prove it, or after `FULL_CHECK_EVERY` steps, the whole index is checked
        (one C-level intersection), so a growth is seen at the latest that many steps late.

        Wins benchmarks/scheduler_overhead.py's full, admit and busy steps: with the whole index
        checked every step instead, Fairway's own step at 10,000 waiting took 7.3x as long on full
        steps (0.033 -> 0.244 ms median) and 52-57% longer on admit and busy steps; at 1,000
        waiting 48% longer on full steps.
        """
        newest, block, second = self.newest
        if (
            newest is None
            or self.since_full_check >= FULL_CHECK_EVERY
            or cache.get(newest) is not block
        ):
            return self._all_grown(cache, by_next)
        grown: list[bytes] = []
        walk = reversed(cache)
        while len(grown) <= len(by_next):  # else as costly as the full check: do that instead
            chunk = list(islice(walk, _WALK_CHUNK))  # newest first, read in C
            try:
                i = chunk.index(newest)
            except ValueError:
                grown += chunk
                if len(chunk) < _WALK_CHUNK:  # the newest key is gone
                    break
                continue
            if chunk[i] is not newest:  # an equal key, inserted again
                break
            behind = chunk[i + 1] if i + 1 < len(chunk) else next(walk, None)
            if behind is not second:
                break
            grown += chunk[:i]
            return by_next.keys() & grown  # the lookups in C, too
        return self._all_grown(cache, by_next)

    def _all_grown(self, cache: dict[bytes, Any], by_next: dict[bytes, Any]) -> Iterable[bytes]:
        self.since_full_check = 0
        return by_next.keys() & cache.keys()

    def mark_newest(self, cache: dict[bytes, Any]) -> None:
        """Remember the hash map's newest key, its block and the key before it (`grown_keys`)."""
        walk = reversed(cache)
        newest = next(walk, None)
        block = cache[newest] if newest is not None else None
        self.newest = (newest, block, next(walk, None))
