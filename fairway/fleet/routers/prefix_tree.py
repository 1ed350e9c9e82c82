"""vLLM's router approximate prefix tree (`src/tree.rs`, `Tree`), at block granularity.

The router never sees a node's cache; it remembers which worker it sent each prompt to. One
tree holds every routed prompt; each tree node records the tenants (workers) whose prompts
passed through it, with a last-access epoch per tenant, and the tenant that created it
(`last_tenant`, a cache the Rust code reads first when it answers a match).

The Rust tree is a radix tree over characters; here a tree node is one prompt block, keyed by
its chained hash (`RoutedRequest.block_hashes`). A character radix node that a prompt creates
becomes a chain of block nodes, all stamped with that insert's epoch, so eviction order and the
matched length agree with the character tree up to the block granularity (a prompt's partial
last block is never stored, as it has no hash).

What the Rust tree does and this one keeps:
- `insert`: nodes on the path that the tenant did not hold join it with epoch 0 (they are not
  leaves, so their epoch only matters once their subtree is evicted); new nodes and the node
  where the prompt ends get a fresh epoch; the tenant's size grows by the blocks it joined.
- `prefix_match_with_counts`: walk as deep as any tenant's prompts go; the answer is that
  depth and the deepest node's creator if it still holds the node, else another holder (Rust
  takes the first of a `DashMap` iteration, an arbitrary order; here the lowest index).
- `evict_tenant_by_size(max_size)`: while a tenant's size exceeds `max_size`, remove it from
  its least recently stamped leaf (a node it holds and none of whose children it holds); a
  node no tenant holds any more leaves the tree.
What it leaves out: the 1-in-8 epoch refresh that a match makes (it only nudges the LRU order)
and `remove_tenant` (nodes of a fleet replay never leave).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class _TreeNode:
    """One block of one or more routed prompts."""

    __slots__ = ("block_hash", "children", "creator", "parent", "tenants")

    def __init__(self, block_hash: int, parent: _TreeNode | None, creator: int) -> None:
        self.block_hash = block_hash
        self.parent = parent
        self.creator = creator
        self.children: dict[int, _TreeNode] = {}
        self.tenants: dict[int, int] = {}  # tenant -> last access epoch

    def holder(self) -> int:
        """The tenant a match at this node answers."""
        if self.creator in self.tenants:
            return self.creator
        return min(self.tenants)

    def is_leaf_of(self, tenant: int) -> bool:
        return tenant in self.tenants and not any(
            tenant in child.tenants for child in self.children.values()
        )


class ApproximatePrefixTree:
    """The prompts routed to each of `num_tenants` workers; sizes are in blocks."""

    def __init__(self, num_tenants: int) -> None:
        self._root = _TreeNode(0, None, 0)
        # `init_workers` inserts "" for each worker: every tenant is at the root.
        self._root.tenants = dict.fromkeys(range(num_tenants), 0)
        self.sizes = [0] * num_tenants
        self._epoch = 0

    def _next_epoch(self) -> int:
        self._epoch += 1
        return self._epoch

    def insert(self, block_hashes: Sequence[int], tenant: int) -> None:
        """Remember that `tenant` was sent a prompt with these blocks."""
        epoch = self._next_epoch()
        node = self._root
        for block_hash in block_hashes:
            child = node.children.get(block_hash)
            if child is None:
                child = _TreeNode(block_hash, node, tenant)
                child.tenants[tenant] = epoch
                node.children[block_hash] = child
                self.sizes[tenant] += 1
            elif tenant not in child.tenants:
                child.tenants[tenant] = 0
                self.sizes[tenant] += 1
            node = child
        if node is not self._root:
            node.tenants[tenant] = epoch

    def match(self, block_hashes: Sequence[int]) -> tuple[int, int]:
        """(blocks matched by the deepest path any tenant holds, the tenant it answers)."""
        node = self._root
        depth = 0
        for block_hash in block_hashes:
            child = node.children.get(block_hash)
            if child is None:
                break
            node = child
            depth += 1
        return depth, node.holder()

    def evict_by_size(self, max_blocks: int) -> None:
        """Shrink every tenant holding more than `max_blocks` blocks, least recent leaves
        first (the Rust tree's periodic `evict_tenant_by_size`)."""
        over = {tenant for tenant, size in enumerate(self.sizes) if size > max_blocks}
        if not over:
            return
        heap: list[tuple[int, int, int, _TreeNode]] = []
        order = 0  # a unique second key: nodes are not comparable
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for tenant in over & node.tenants.keys():
                if node.is_leaf_of(tenant):
                    heap.append((node.tenants[tenant], order, tenant, node))
                    order += 1
        heapq.heapify(heap)
        while heap:
            _, _, tenant, node = heapq.heappop(heap)
            if self.sizes[tenant] <= max_blocks or not node.is_leaf_of(tenant):
                continue
            del node.tenants[tenant]
            self.sizes[tenant] -= 1
            parent = node.parent
            assert parent is not None  # the root is never a candidate
            if not node.tenants and not node.children:
                del parent.children[node.block_hash]
            if parent is not self._root and parent.is_leaf_of(tenant):
                heapq.heappush(heap, (parent.tenants[tenant], order, tenant, parent))
                order += 1
