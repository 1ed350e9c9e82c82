"""The share classes of `fairway`'s classed lanes: vLLM's priority levels and the tenants.

Must not import vllm. A share class is one (priority level, tenant) pair; these are the lane
pieces `FairwayPolicy`'s classed path (`fairway.policies.fairway`) reads per class, and the
tenants' tags (docs/design.md, "Priority levels and tenants").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fairway.policies.queue import PrefillingRequest, QueueColumns

#: Share classes remembered at most (levels are integers a client picks); past it all restart.
MAX_SHARE_CLASSES = 4096


def classes_differ(queue: QueueColumns, prefilling: Sequence[PrefillingRequest]) -> bool:
    """Whether the running prefills bring a tenant or level the (one-class) queue lacks."""
    if not prefilling:
        return False
    if len(queue):  # the first row's class (no n-long column of zeros when there is none)
        tenant = int(queue.tenant[0]) if queue.tenant is not None else 0
        level = int(queue.priority[0]) if queue.priority is not None else 0
    else:
        tenant, level = prefilling[0].tenant, prefilling[0].priority
    return any(p.tenant != tenant or p.priority != level for p in prefilling)


def tenant_tags(
    entries: np.ndarray,
    tenant: np.ndarray,
    work: np.ndarray,
    served: np.ndarray,
    weights: np.ndarray,
) -> np.ndarray:
    """The tenant tag of each entry of a lane (`entries`, in the lane's order): its tenant's
    counter plus the work of that tenant's entries before it in the lane, over its weight. The
    merge by tag (smallest first) is the work charges one level up: the tenant that has been
    served least, for its weight, places next."""
    t = tenant[entries]
    w = work[entries]
    by_tenant = np.argsort(t, kind="stable")
    cum = np.cumsum(w[by_tenant])
    starts = np.searchsorted(t[by_tenant], t[by_tenant], side="left")
    before_sorted = cum - w[by_tenant] - (cum[starts] - w[by_tenant][starts])
    before = np.empty_like(before_sorted)
    before[by_tenant] = before_sorted
    tags: np.ndarray = served[t] + before / weights[t]
    return tags


def lane_prefix(lane: np.ndarray, waiting: np.ndarray, reach: int) -> np.ndarray:
    """The lane's entries up to its `reach`-th waiting request, and every running prefill."""
    is_waiting = waiting[lane]
    rank = np.cumsum(is_waiting)
    prefix: np.ndarray = lane[~is_waiting | (rank <= reach)]
    return prefix


def entry_keys(entries: np.ndarray, n: int) -> np.ndarray:
    """The merge's keys of entries (rows 0..n-1 waiting, n + j running prefill j): a waiting
    row is its row, running prefill j is -(j + 1)."""
    keys: np.ndarray = np.where(entries < n, entries, n - entries - 1)
    return keys


def key_maps(
    entries: np.ndarray, n: int, work: np.ndarray, prompt: np.ndarray
) -> tuple[dict[int, int], dict[int, int]]:
    """Work and tokens already held (cached or computed), by key, of these entries only."""
    keys = entry_keys(entries, n).tolist()
    amounts = work[entries].astype(np.int64)
    return (
        dict(zip(keys, amounts.tolist(), strict=True)),
        dict(zip(keys, (prompt[entries] - amounts).tolist(), strict=True)),
    )


def class_prefixes(
    lane: np.ndarray, share: np.ndarray, waiting: np.ndarray, work: np.ndarray, limit: float,
    reach: int,
) -> tuple[np.ndarray, dict[int, tuple[int, int]]]:
    """Each share class's part of a lane, in the lane's order, while the class's waiting work
    before an entry is below `limit` (the entry reaching it included) and up to its `reach`-th
    waiting entry, with every running prefill: the entries grouped by class, and each class's
    [start, end) in them (one stable sort and grouped cumulative sums for all classes)."""
    classes = share[lane]
    order = np.argsort(classes, kind="stable")
    grouped, group = lane[order], classes[order]
    is_waiting = waiting[grouped]
    waiting_work = np.where(is_waiting, work[grouped], 0.0)
    starts = np.searchsorted(group, group, side="left")
    cum = np.cumsum(waiting_work)
    before = cum - waiting_work - (cum[starts] - waiting_work[starts])
    count = np.cumsum(is_waiting)
    rank = count - (count[starts] - is_waiting[starts])
    keep = ~is_waiting | ((before < limit) & (rank <= reach))
    kept, kept_group = grouped[keep], group[keep]
    codes, first = np.unique(kept_group, return_index=True)
    ends = [*first[1:].tolist(), len(kept)]
    spans = dict(zip(codes.tolist(), zip(first.tolist(), ends, strict=True), strict=True))
    return kept, spans
