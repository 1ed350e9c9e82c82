"""Which nodes hold which prompt blocks, and how long a prompt's leading run is on each node.

Two kinds of router keep such an index. The KV-event routers (vLLM's router `kv_aware`,
Dynamo's KV router, Fairway's `fairway-work`) fill it from the nodes' `BlockStored` /
`BlockRemoved` events (`KVEventIndex`); llm-d's approximate prefix producer fills it with the
prompts it routed (`fairway.fleet.routers.llm_d`). Both ask one question: how many of a prompt's
leading blocks does each node hold. Block hashes are chained (block k's hash covers blocks 0..k),
so a node holding block k normally holds the whole prefix; after an eviction it may not, and the
two projects count differently (`leading_run` vs `greedy_run`). Dynamo also keeps the blocks of
the requests it has in flight in one (`held`: how many of a new prompt's blocks are active on
each worker already).

A node may cache one hash twice (vLLM keeps a duplicate when two requests computed the same
block at once, and sends an event for each copy), so a holder is counted: the block stays
until as many removals as stores arrived. (Dynamo's radix tree and vLLM's router's
`KVBlockIndex` keep a set and would forget the block at the first removal; duplicates are rare
and short-lived, and counting keeps the index equal to what the node holds.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fairway.fleet.routers.base import RouterError, check_view
from fairway.fleet.routing import FleetView


class BlockIndex:
    """block hash -> {node: copies}; `sizes[node]` is the number of distinct blocks it holds
    (Dynamo's tie-break reads it as the node's tree size)."""

    def __init__(self, num_nodes: int) -> None:
        self.num_nodes = num_nodes
        self._holders: dict[int, dict[int, int]] = {}
        self.sizes = [0] * num_nodes

    def add(self, node: int, block_hash: int) -> None:
        """One more copy of `block_hash` on `node`."""
        holders = self._holders.setdefault(block_hash, {})
        copies = holders.get(node, 0)
        holders[node] = copies + 1
        if copies == 0:
            self.sizes[node] += 1

    def remove(self, node: int, block_hash: int) -> None:
        """One copy fewer; removing a block the index never saw stored is ignored (its store
        event may predate the router's subscription, as with a real subscriber)."""
        holders = self._holders.get(block_hash)
        if holders is None or node not in holders:
            return
        if holders[node] > 1:
            holders[node] -= 1
            return
        del holders[node]
        self.sizes[node] -= 1
        if not holders:
            del self._holders[block_hash]

    def discard(self, node: int, block_hash: int) -> None:
        """`node` no longer holds `block_hash` at all (an LRU eviction)."""
        holders = self._holders.get(block_hash)
        if holders is not None and holders.pop(node, None) is not None:
            self.sizes[node] -= 1
            if not holders:
                del self._holders[block_hash]

    def holders(self, block_hash: int) -> Mapping[int, int]:
        """The nodes holding `block_hash` (empty if none)."""
        return self._holders.get(block_hash, {})

    def held(self, block_hashes: Sequence[int]) -> list[int]:
        """Per node, how many of `block_hashes` it holds, wherever they stand in the prompt."""
        count = [0] * self.num_nodes
        for block_hash in block_hashes:
            for node in self.holders(block_hash):
                count[node] += 1
        return count

    def leading_run(self, block_hashes: Sequence[int]) -> list[int]:
        """Per node, how many of the prompt's first blocks it holds without a gap (vLLM's
        router `PrefixScorer::score`, Dynamo's `find_matches`: a node that misses block i
        scores i even if it holds later blocks)."""
        run = [0] * self.num_nodes
        if not block_hashes:
            return run
        alive = set(self.holders(block_hashes[0]))
        depth = 1
        for block_hash in block_hashes[1:]:
            if not alive:
                break
            holders = self.holders(block_hash)
            for node in [node for node in alive if node not in holders]:
                run[node] = depth
                alive.discard(node)
            if alive:
                depth += 1
        for node in alive:
            run[node] = depth
        return run

    def greedy_run(self, block_hashes: Sequence[int]) -> list[int]:
        """llm-d's `matchLongestPrefix`: walk the prompt's blocks until no node holds one, and
        count for each node the walked blocks it holds (a gap on one node does not stop its
        count while another node still holds the block)."""
        run = [0] * self.num_nodes
        for block_hash in block_hashes:
            holders = self.holders(block_hash)
            if not holders:
                break
            for node in holders:
                run[node] += 1
        return run


class KVEventIndex:
    """The blocks each node caches, as its KV events told the router (late by the view's
    `kv_event_delay_s`); `sync` reads the events delivered since the last call."""

    def __init__(self, num_nodes: int) -> None:
        self.blocks = BlockIndex(num_nodes)
        self._cursor = 0

    def sync(self, view: FleetView) -> None:
        """Apply the events `view` delivered since the previous call, in delivery order."""
        check_view(view, self.blocks.num_nodes)
        events, self._cursor = view.kv_events_since(self._cursor)
        for event in events:
            if not 0 <= event.node < self.blocks.num_nodes:
                raise RouterError(
                    f"a KV event names node {event.node}, not in 0..{self.blocks.num_nodes - 1}"
                )
            if event.stored:
                self.blocks.add(event.node, event.block_hash)
            else:
                self.blocks.remove(event.node, event.block_hash)

    def matched_blocks(self, block_hashes: Sequence[int]) -> list[int]:
        """Per node, the prompt's leading blocks it caches (no gap)."""
        return self.blocks.leading_run(block_hashes)


def hit_tokens(matched_blocks: int, block_size: int, prompt_tokens: int) -> int:
    """The prompt tokens a node would not compute: its matched blocks, at most all but the last
    prompt token (vLLM recomputes at least one token to get the first output's logits)."""
    return max(0, min(matched_blocks * block_size, prompt_tokens - 1))
