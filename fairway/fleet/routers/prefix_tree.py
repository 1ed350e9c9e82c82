"""vLLM's router approximate prefix tree (`src/tree.rs`, `Tree`), at block granularity.

The router never sees a node's cache; it remembers which worker it sent each prompt to. One
tree holds every routed prompt; each tree node records the tenants (workers) whose prompts
passed through it, with a last-access epoch per tenant, and the tenant that created it
(`last_tenant`, a cache the Rust code reads first when it answers a match).

The Rust tree is a radix tree over characters; this one is a radix tree over prompt blocks,
keyed by their chained hashes (`RoutedRequest.block_hashes`): a tree node holds a run of blocks
(a prompt's new tail is one node, split where a later prompt diverges), so the matched length,
the sizes and the eviction order agree with the character tree up to the block granularity (a
prompt's partial last block is never stored, as it has no hash). Path compression is what keeps
a 50,000-request replay's tree at about one node per distinct prompt.

What the Rust tree does and this one keeps:
- `insert`: a node split where the prompt diverges keeps the holders, epochs and creator of
  the node it came from; nodes on the path that the tenant did not hold join it with epoch 0
  (they are not leaves, so their epoch only matters once their subtree is evicted); the new
  leaf and the node where the prompt ends get a fresh epoch; the tenant's size grows by the
  blocks of the nodes it joined.
- `prefix_match_with_counts`: walk as deep as any tenant's prompts go (into the middle of a
  node, too); the answer is that depth and that node's creator if it still holds the node,
  else another holder (Rust takes the first of a `DashMap` iteration, an arbitrary order; here
  the lowest index).
- `evict_tenant_by_size(max_size)`: while a tenant's size exceeds `max_size`, remove it from
  its least recently stamped leaf (a node it holds and none of whose children it holds), a
  whole node at a time; a node no tenant holds any more leaves the tree.
What it leaves out: the 1-in-8 epoch refresh that a match makes (it only nudges the LRU order)
and `remove_tenant` (nodes of a fleet replay never leave).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class _TreeNode:
    """A run of blocks shared by one or more routed prompts."""

    __slots__ = ("blocks", "children", "creator", "parent", "tenants")

    def __init__(
        self, blocks: tuple[int, ...], parent: _TreeNode | None, creator: int,
        tenants: dict[int, int] | None = None,
    ) -> None:
        self.blocks = blocks
        self.parent = parent
        self.creator = creator
        self.children: dict[int, _TreeNode] = {}  # keyed by the child's first block
        self.tenants: dict[int, int] = {} if tenants is None else tenants  # tenant -> epoch

    def holder(self) -> int:
        """The tenant a match ending in this node answers."""
        if self.creator in self.tenants:
            return self.creator
        return min(self.tenants)

    def is_leaf_of(self, tenant: int) -> bool:
        return tenant in self.tenants and not any(
            tenant in child.tenants for child in self.children.values()
        )


def _shared(run: tuple[int, ...], blocks: Sequence[int], start: int) -> int:
    """How many of `run`'s blocks equal `blocks[start:]`'s first ones."""
    if tuple(blocks[start : start + len(run)]) == run:
        return len(run)  # the common case, compared at C speed
    shared = 0
    for block, other in zip(run, blocks[start:], strict=False):
        if block != other:
            break
        shared += 1
    return shared


class ApproximatePrefixTree:
    """The prompts routed to each of `num_tenants` workers; sizes are in blocks."""

    def __init__(self, num_tenants: int) -> None:
        self._root = _TreeNode((), None, 0)
        # `init_workers` inserts "" for each worker: every tenant is at the root.
        self._root.tenants = dict.fromkeys(range(num_tenants), 0)
        self.sizes = [0] * num_tenants
        self._epoch = 0

    def _split(self, node: _TreeNode, at: int) -> _TreeNode:
        """Cut `node` after its first `at` blocks; the head takes its place in the tree."""
        parent = node.parent
        assert parent is not None and 0 < at < len(node.blocks)
        head = _TreeNode(node.blocks[:at], parent, node.creator, dict(node.tenants))
        parent.children[head.blocks[0]] = head
        node.blocks = node.blocks[at:]
        node.parent = head
        head.children[node.blocks[0]] = node
        return head

    def insert(self, block_hashes: Sequence[int], tenant: int) -> None:
        """Remember that `tenant` was sent a prompt with these blocks."""
        self._epoch += 1
        node, at = self._root, 0
        while at < len(block_hashes):
            child = node.children.get(block_hashes[at])
            if child is None:
                leaf = _TreeNode(tuple(block_hashes[at:]), node, tenant, {tenant: self._epoch})
                node.children[block_hashes[at]] = leaf
                self.sizes[tenant] += len(leaf.blocks)
                return
            shared = _shared(child.blocks, block_hashes, at)
            if shared < len(child.blocks):
                child = self._split(child, shared)
            if tenant not in child.tenants:
                child.tenants[tenant] = 0
                self.sizes[tenant] += len(child.blocks)
            node, at = child, at + shared
        if node is not self._root:
            node.tenants[tenant] = self._epoch

    def match(self, block_hashes: Sequence[int]) -> tuple[int, int]:
        """(blocks matched by the deepest path any tenant holds, the tenant it answers)."""
        node, at = self._root, 0
        while at < len(block_hashes):
            child = node.children.get(block_hashes[at])
            if child is None:
                break
            shared = _shared(child.blocks, block_hashes, at)
            node, at = child, at + shared
            if shared < len(child.blocks):
                break
        return at, node.holder()

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
            self.sizes[tenant] -= len(node.blocks)
            parent = node.parent
            assert parent is not None  # the root is never a candidate
            if not node.tenants and not node.children:
                del parent.children[node.blocks[0]]
            if parent is not self._root and parent.is_leaf_of(tenant):
                heapq.heappush(heap, (parent.tenants[tenant], order, tenant, parent))
                order += 1
