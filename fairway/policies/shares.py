"""Priority levels and tenants in `fairway`: the share classes, their counters and interleave.

Must not import vllm. A share class is one (priority level, tenant) pair. Levels are strict (a
level is placed only after every request of the levels above it); tenants at one level share the
step by weight: each class's own two lanes are merged as the paper's step merges them, then the
classes are interleaved by tag (`tenant_tags`: the class's counter plus the work placed before
the entry, over its weight), and after a step the counters are charged what each class got, none
left more than its credit behind (docs/design.md, "Priority levels and tenants").
`TenantShares` keeps that state for one `FairwayPolicy`; the functions below it read the lane
pieces per class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fairway.policies.lanes import merge
from fairway.policies.queue import PrefillingRequest, QueueColumns, Step

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


@dataclass(eq=False)
class TenantShares:
    """The share classes' counters of one `FairwayPolicy`: who is owed what, across steps.

    `served[code]` is the uncached tokens a class was scheduled over its tenant's weight
    (relative: only differences between classes of one level matter); `credit_steps` is the
    policy's `tenant_credit_steps`."""

    credit_steps: float = 12.0
    #: (priority level, tenant) -> class code, and each code's counter and weight.
    class_code: dict[tuple[int, int], int] = field(default_factory=dict)
    served: np.ndarray = field(default_factory=lambda: np.zeros(0))
    class_weight: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: Classes present at the last classed step (None: the last step had one class).
    present: frozenset[int] | None = None
    #: Request id -> class of the last classed step's requests, to charge after it.
    class_of_id: dict[str, int] = field(default_factory=dict)
    #: The last classed step's requests asked for more prefill tokens than it had.
    contend: bool = False
    #: The class of every request of the last step, when it had one class.
    single_class: int | None = None
    #: `credit_steps` in tokens, and the step's budget, at the last classed step.
    credit: float = 0.0
    step_tokens: int = 0

    def forget_step(self) -> None:
        """A step that scheduled nothing: nothing of it is charged."""
        self.single_class, self.class_of_id, self.contend = None, {}, False

    def interleave(
        self,
        fast_lane: np.ndarray,
        fair_lane: np.ndarray,
        share: np.ndarray,
        level: np.ndarray,
        work: np.ndarray,
        prompt: np.ndarray,
        waiting: np.ndarray,
        depth: int,
        tokens: int,
        fast_weight: float,
        whole: bool = False,
    ) -> tuple[tuple[list[int], list[str], list[str]], list[int], dict[int, int], dict[int, int]]:
        """Tenants outermost, lanes inside: each share class's own two lanes merged as the
        paper's step merges them (its Fast lane starting only what it finishes in the step),
        then the classes interleaved by tag along those sequences (`tenant_tags`), level by
        level. Returns the placements (keys, lanes, charges), the class of each, and the work
        and done tokens by key of the entries read.

        A class's lanes are read while its waiting work before an entry is below the step's
        tokens (and up to its `depth`-th waiting request), and every running prefill of it: an
        entry past that has at least a step of work placed before it, so it gets nothing this
        step, whatever the other classes' tags. `whole`: read every entry (the reference).
        """
        n = int(waiting.sum())
        limit = float(tokens) if tokens > 0 and not whole else float("inf")
        class_size = np.bincount(share[fast_lane])
        while True:
            fast_entries, fast_groups = class_prefixes(fast_lane, share, waiting, work, limit,
                                                       depth)
            fair_entries, fair_groups = class_prefixes(fair_lane, share, waiting, work, limit,
                                                       depth)
            work_of, done = key_maps(np.union1d(fast_entries, fair_entries), n, work, prompt)
            fast_keys = entry_keys(fast_entries, n).tolist()
            fair_keys = entry_keys(fair_entries, n).tolist()
            sequences: list[list[int]] = []
            labels: list[list[str]] = []
            charges: list[list[str]] = []
            for code, (fast_start, fast_end) in fast_groups.items():
                fair_start, fair_end = fair_groups[code]
                fast_part, passed = fast_keys[fast_start:fast_end], set[int]()
                got, lanes, charged = merge(
                    fast_part, fair_keys[fair_start:fair_end], work_of, fast_weight, None, None,
                    tokens or None, fit=tokens > 0, skipped=passed,
                )
                if (passed and len(fast_part) < class_size[code]
                        and passed.union(got).issuperset(fast_part)):
                    break  # the class's Fast lane passed over all it was given: read further
                sequences.append(got)
                labels.append(lanes)
                charges.append(charged)
            else:
                break
            limit, depth = 2 * limit, 2 * depth
        flat = np.asarray([k for group in sequences for k in group], dtype=np.int64)
        entry = np.where(flat >= 0, flat, n - flat - 1)  # key -(j + 1): running prefill j
        tags = tenant_tags(np.arange(len(entry)), share[entry], work[entry], self.served,
                           self.class_weight)
        order = np.lexsort((np.arange(len(entry)), tags, level[entry])).tolist()
        flat_keys = flat.tolist()
        flat_lanes = [lane for group in labels for lane in group]
        flat_charged = [c for group in charges for c in group]
        classes = share[entry].tolist()
        merged = (
            [flat_keys[i] for i in order],
            [flat_lanes[i] for i in order],
            [flat_charged[i] for i in order],
        )
        return merged, [classes[i] for i in order], work_of, done


    def one_class(self, queue: QueueColumns, step: Step) -> None:
        """A step whose requests are all of one share class: the plain rule orders it, and the
        class is charged all the step's tokens (so a tenant that returns finds the others'
        counters moved on by what they got meanwhile, and has its credit)."""
        prefilling = step.prefilling
        if len(queue):
            level = int(queue.priority[0]) if queue.priority is not None else 0
            tenant = int(queue.tenant[0]) if queue.tenant is not None else 0
        elif prefilling:
            level, tenant = prefilling[0].priority, prefilling[0].tenant
        else:
            return
        code = int(self.classify(
            np.array([level], dtype=np.int64), np.array([tenant], dtype=np.intp), step
        )[0])
        self.class_of_id = {}
        self.single_class = code
        budget = step.budget
        work = float(queue.remaining.sum()) + sum(p.remaining for p in prefilling)
        self.contend = budget is not None and work > max(
            0, budget.tokens - sum(budget.ahead)
        )


    def classify(self, level: np.ndarray, tenant: np.ndarray, step: Step) -> np.ndarray:
        """The share class (a code for one (priority level, tenant) pair) of every entry, and
        VTC's lift of the classes present, level by level.

        Levels are strict, so tenants share within a level: a tenant's counter at one level is
        not charged for what it got at another. A class that was not present at the last classed
        step starts no lower than the lowest counter of its level's classes that were (it banks
        no credit while away); a level none of whose classes stays restarts at 0."""
        low = int(level.min()) if len(level) else 0
        width = int(tenant.max()) + 1 if len(tenant) else 1
        combined, inverse = np.unique((level - low) * width + tenant, return_inverse=True)
        pairs = np.stack([combined // width + low, combined % width])  # (level, tenant) each
        if len(self.class_code) > MAX_SHARE_CLASSES:  # levels are client-chosen integers
            self.class_code, self.present = {}, None
            self.served, self.class_weight = np.zeros(0), np.zeros(0)
        codes = []
        for lvl, ten in pairs.T.tolist():
            code = self.class_code.setdefault((lvl, ten), len(self.class_code))
            codes.append(code)
        size = len(self.class_code)
        if len(self.served) < size:  # a new class is one back after a long pause
            grow = size - len(self.served)
            self.served = np.concatenate([self.served, np.full(grow, -np.inf)])
            self.class_weight = np.concatenate([self.class_weight, np.ones(grow)])
        levels: dict[int, list[int]] = {}
        for (lvl, ten), code in zip(pairs.T.tolist(), codes, strict=True):
            self.class_weight[code] = step.weight_of(ten)
            levels.setdefault(lvl, []).append(code)
        before = self.present
        served = self.served
        budget = step.budget
        self.step_tokens = budget.tokens if budget is not None else 0
        self.credit = self.credit_steps * self.step_tokens
        credit = self.credit / self.class_weight
        for present in levels.values():
            staying = [c for c in present if before is not None and c in before]
            if not staying:  # the level starts again: no one more than its credit behind
                known = served[present][np.isfinite(served[present])]
                lead = float(known.max()) if len(known) else 0.0
                served[present] = np.maximum(served[present], lead - credit[present])
                continue
            floor = min(served[c] for c in staying)
            for code in present:
                if code not in staying:
                    served[code] = max(served[code], floor - credit[code])
        self.present = frozenset(codes)
        share: np.ndarray = np.asarray(codes, dtype=np.intp)[inverse.reshape(-1)]
        return share


    def charge(self, prefill_by_request: Mapping[str, int] | None) -> None:
        """The share classes' counters after a classed step whose requests asked for more than
        its budget: each class is charged the prefill tokens vLLM scheduled for it over its
        tenant's weight, and none is left more than its credit behind its level's leader. A
        step that served every request all it asked for charges nothing."""
        class_of, self.class_of_id = self.class_of_id, {}
        single, self.single_class = self.single_class, None
        contested, self.contend = self.contend, False
        present = self.present
        if (not class_of and single is None) or present is None:
            return
        if not contested or prefill_by_request is None:
            return  # every request got all it asked for: nobody fell behind
        served, weight = self.served, self.class_weight
        if single is not None:
            served[single] += sum(prefill_by_request.values()) / weight[single]
        for request_id, tokens in prefill_by_request.items():
            charged = class_of.get(request_id)
            if charged is not None:
                served[charged] += tokens / weight[charged]
        by_level: dict[int, list[int]] = {}
        for (lvl, _), code in self.class_code.items():
            if code in present:
                by_level.setdefault(lvl, []).append(code)
        # no tenant falls further behind than its credit and one step: with less than a step
        # of lag kept, a tenant that got nothing in a step (its tie lost to a long running
        # prefill) would be even again at the next one, and lose it again
        for codes in by_level.values():
            lead = served[codes].max()
            keep = (self.credit + self.step_tokens) / weight[codes]
            served[codes] = np.maximum(served[codes], lead - keep)


    def counters(self) -> dict[int, float]:
        """Tenant code -> counter (uncached tokens over weight, relative to the lowest) of the
        tenants present at the top priority level of the last classed step, for tests, the
        decision trace and `fairway inspect`; empty after a one-class step."""
        if self.present is None:
            return {}
        present = [(key, code) for key, code in self.class_code.items() if code in self.present]
        top = min(lvl for (lvl, _), _ in present)
        counters = {ten: float(self.served[code]) for (lvl, ten), code in sorted(present)
                    if lvl == top}
        low = min(counters.values())
        return {ten: value - low for ten, value in counters.items()}


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


def lane_prefix(lane: np.ndarray, waiting: np.ndarray, depth: int) -> np.ndarray:
    """The lane's entries up to its `depth`-th waiting request, and every running prefill."""
    is_waiting = waiting[lane]
    rank = np.cumsum(is_waiting)
    prefix: np.ndarray = lane[~is_waiting | (rank <= depth)]
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
    depth: int,
) -> tuple[np.ndarray, dict[int, tuple[int, int]]]:
    """Each share class's part of a lane, in the lane's order, while the class's waiting work
    before an entry is below `limit` (the entry reaching it included) and up to its `depth`-th
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
    keep = ~is_waiting | ((before < limit) & (rank <= depth))
    kept, kept_group = grouped[keep], group[keep]
    codes, first = np.unique(kept_group, return_index=True)
    ends = [*first[1:].tolist(), len(kept)]
    spans = dict(zip(codes.tolist(), zip(first.tolist(), ends, strict=True), strict=True))
    return kept, spans
