"""The memo of one waiting request's cached prefix, and the key -> memos indexes it sits in.

Why a module of its own: `PrefixHit` is the record `fairway.vllm.prefix_memo.PrefixMemo` keeps per
waiting request, and `move` keeps the memo's two indexes (next block's key, chain tail's key) in
step with it; both are plain data, read by the memo's loops without a call into vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.v1.request import Request


@dataclass(slots=True, eq=False)
class PrefixHit:
    """Memo of one waiting request for one stint in the queue (dropped when it leaves).

    While a request waits its tokens, arrival and status do not change, only the cache around it.
    """

    request: Request
    #: The request's ticket in the queue's columns (`QueueColumns.tickets`); -1 once it left.
    ticket: int
    arrival: float
    num_tokens: int
    #: Longest possible hit in blocks, (num_tokens - 1) // block_size: the hit never covers the
    #: last token.
    max_blocks: int
    #: Hit length in blocks.
    blocks: int = 0
    #: Hash key of block `blocks` (the next one to look for; growth check); None: cannot grow.
    next_key: bytes | None = None
    #: Hash key of block `blocks - 1` (the chain's tail; eviction check); None: no hit.
    last_key: bytes | None = None
    #: False until the first lookup (a burst is probed over several steps).
    probed: bool = False
    #: Too long for an empty cache: never looked up (probed from the start, h = 0).
    oversized: bool = False


def arrival_of(hit: PrefixHit) -> float:
    """The sort key of the memos waiting for their first lookup (oldest first)."""
    return hit.arrival


def move(
    index: dict[bytes, set[PrefixHit]], hit: PrefixHit, old: bytes | None, new: bytes | None
) -> None:
    """Move `hit` from key `old` to key `new` in a key -> hits index (None: not indexed)."""
    if old is not None:
        holders = index.get(old)
        if holders is not None:
            holders.discard(hit)
            if not holders:
                del index[old]
    if new is not None:
        holders = index.get(new)
        if holders is None:
            index[new] = {hit}
        else:
            holders.add(hit)
