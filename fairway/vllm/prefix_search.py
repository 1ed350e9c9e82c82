"""The length of a request's cached prefix, searched in the block pool's hash map.

Why a module of its own: the search is a pure function of the hash map and the request's block
hashes, shared by the memo's first lookups, extensions and re-lookups after an eviction
(`fairway.vllm.prefix_memo`), and tested alone. It relies on the cached blocks of a chain being
prefix-closed (block i cached means blocks 0..i are; the memo's module docstring says why), so
"block i is cached" is monotone in i and the hit's end is found by galloping from a likely length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fairway.vllm import internals

#: vLLM's hash-map key of a block hash in KV-cache group 0 is the hash followed by these bytes
#: (`internals.group_key_suffix`). The incremental memo appends them itself, one Python call
#: less per hash-map read, and runs only where that holds (`internals.keys_are_suffixed`).
GROUP0_SUFFIX = internals.group_key_suffix(0)


def cached_prefix_near(
    cache: dict[bytes, Any], hashes: Sequence[bytes], guess: int, hi: int, at_least: bool = False
) -> int:
    """The hit's length in blocks, known to lie in [0, hi], found by galloping from `guess` (a
    likely length, 0 <= guess <= hi; `at_least`: known to be cached) away from it by 1, 2, 4, ...
    blocks until the end is passed, then a binary search in the last gap (`_cached_prefix`):
    O(log d) hash-map reads for an end d blocks from the guess, 1-2 when the guess is right."""
    lo = 0
    if not at_least and guess and hashes[guess - 1] + GROUP0_SUFFIX not in cache:
        hi, step = guess - 1, 1  # shorter than the guess: gallop down
        while lo < hi:
            probe = max(lo + 1, hi - step + 1)  # is a hit of `probe` blocks cached?
            if hashes[probe - 1] + GROUP0_SUFFIX in cache:
                lo = probe
                break
            hi = probe - 1
            step *= 2
    else:
        lo, step = guess, 1  # at least the guess: gallop up
        while lo < hi:
            probe = min(lo + step, hi)
            if hashes[probe - 1] + GROUP0_SUFFIX not in cache:
                hi = probe - 1
                break
            lo = probe
            step *= 2
    return _cached_prefix(cache, hashes, lo, hi)


def _cached_prefix(cache: dict[bytes, Any], hashes: Sequence[bytes], lo: int, hi: int) -> int:
    """The hit's length in blocks, known to lie in [lo, hi]: a binary search, valid because the
    cached blocks of a chain are prefix-closed (block i cached means blocks 0..i are)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hashes[mid - 1] + GROUP0_SUFFIX in cache:
            lo = mid
        else:
            hi = mid - 1
    return lo
