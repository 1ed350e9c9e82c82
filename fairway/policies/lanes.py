"""The two lanes both Fairway policies share: the Fast-lane score and the work-charge merge.

Must not import vllm. `FastLanePolicy` is the base class of `fairway-step` (the paper's per-step
rule, `fairway.policies.fairway_step`) and `fairway` (the charges carried across steps,
`fairway.policies.fairway`): the parameters both take, the patience (SLO) and the Fast score.
`merge` is the paper's merge of the two lanes, with the cross-step policy's two extensions (start
ledgers, free request slots). `first_rows` finds the first entries of a lane by a partial
selection instead of sorting the whole queue: the merge reads each lane only at its first entry not
yet placed, so a step of k placements needs only each lane's first k entries.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fairway.policies.base import Policy
from fairway.policies.queue import QueueColumns, QueuedRequest
from fairway.profiling.table import PrefillProfile, load

FAST, FAIR = "fast", "fair"


@dataclass(eq=False)
class FastLanePolicy(Policy):
    """The Fast lane's score and the parameters both Fairway policies share (a base class).

    Fast lane, highest score first (ties: older first, then queue position)::

        s = h / max(c, 1) + wait / SLO,    SLO = max(patience_floor_s, patience_multiplier * T(L))

    with h the cached prefix tokens, c the tokens still to compute, L the prompt length, wait =
    now - arrival (>= 0) and T the idle prefill time from the profile table. The first term is
    RAGCache's order; the second makes every request's urgency grow at a rate relative to its own
    size, so a short prompt that waited 2 s with 1 s of patience (term 2) outranks a long one that
    waited 2 s with 4 s of patience (term 0.5).
    """

    #: Charge on Fast-lane work in the merge (> 0): hits may take 1 / fast_weight of the oldest
    #: request's work before it is placed, and under contention (fairway) the Fair lane gets
    #: fast_weight / (1 + fast_weight) of the prefill tokens. Larger: closer to FCFS.
    fast_weight: float = 4.0
    #: SLO = patience_multiplier x T(L) (> 0).
    patience_multiplier: float = 3.0
    #: Lower bound of the SLO in seconds (> 0); also the unit of wait for `fairway-abswait`.
    patience_floor_s: float = 1.0
    #: Prefill-time table T(L) (object, path or shipped name); None: every SLO is the floor.
    profile: PrefillProfile | str | None = None
    needs_cache_hits: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for name in ("fast_weight", "patience_multiplier", "patience_floor_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
            if value == float("inf"):
                raise ValueError(f"{name} must be finite, got {value!r}")
        if isinstance(self.profile, str):
            self.profile = load(self.profile)
        elif self.profile is not None and not isinstance(self.profile, PrefillProfile):
            raise ValueError(
                f"profile must be a PrefillProfile, a path or None, got {self.profile!r}"
            )

    # --- the rule ---------------------------------------------------------------------------------

    def patience(self, prompt_tokens: np.ndarray) -> np.ndarray:
        """SLO in seconds of each prompt length: max(floor, multiplier x T(L)). The one patience
        function (elementwise, so a length gets the same float in any batch)."""
        if not isinstance(self.profile, PrefillProfile):
            return np.full(prompt_tokens.shape, self.patience_floor_s)
        prefill = self.profile.prefill_s_array(prompt_tokens)
        return np.maximum(self.patience_floor_s, self.patience_multiplier * prefill)

    def patience_s(self, prompt_tokens: int) -> float:
        """SLO of a prompt of this length, in seconds."""
        return float(self.patience(np.array([prompt_tokens], dtype=np.float64))[0])

    def wait_units(self, prompt_tokens: np.ndarray) -> np.ndarray | float:
        """What each request's wait is divided by in its score: its SLO (`fairway-abswait`: the
        floor). One number when every SLO is the floor (no profile)."""
        if self.profile is None:
            return self.patience_floor_s
        return self.patience(prompt_tokens)

    def scores(self, queue: QueueColumns, now: float) -> np.ndarray:
        """s = h / max(c, 1) + wait / SLO of every row, float64: the one place the Fast score is
        written (views and running prefills are scored as columns of themselves)."""
        wait = np.maximum(now - queue.arrival, 0.0) / self.wait_units(queue.prompt_tokens)
        scores: np.ndarray = queue.cached_tokens / queue.remaining + wait
        return scores

    def fast_scores(self, queue: Sequence[QueuedRequest], now: float) -> list[float]:
        """`scores` of these requests."""
        scores: list[float] = self.scores(QueueColumns.of(queue), now).tolist()
        return scores

    def fast_score(self, request: QueuedRequest, now: float) -> float:
        """`scores` of one request."""
        return self.fast_scores([request], now)[0]


def fast_lane_order(scores: Sequence[float], queue: Sequence[QueuedRequest]) -> list[int]:
    """The Fast lane: positions by score descending, then older, then queue position."""
    return sorted(range(len(queue)), key=lambda i: (-scores[i], queue[i].arrival))


def merge(
    fast: Sequence[int],
    fair: Sequence[int],
    work: Mapping[int, int] | Sequence[float] | np.ndarray,
    weight: float,
    ledgers: tuple[float, float] | None = None,
    slots: int | None = None,
    step_tokens: int | None = None,
    fit: bool = False,
    skipped: set[int] | None = None,
) -> tuple[list[int], list[str], list[str]]:
    """The paper's merge of two lanes over the same requests.

    `fast` and `fair` list the same requests (keys; waiting rows >= 0, running prefills < 0) in
    each lane's order; `ledgers` are the (fast, fair) ledgers to start from, or None for the
    paper's start (w x the Fast front's work, the Fair front's work). The lane with the smaller
    ledger places its first request not yet placed and adds its work (x weight for Fast); ties
    go to Fast. Each lane is read only at its first entry not yet placed, so the merge of two
    lane prefixes equals the whole lanes' until one prefix is used up, where it stops.

    `slots`: the step can start at most this many waiting requests. Once they are placed, only
    the running prefills are placed (a waiting request without a slot gets nothing, so it must
    not move the ledgers ahead of them), then the other waiting requests as before.
    Returns the placed keys, the lane that placed each, and the lane each is charged to: the
    placing lane, except that a Fair front (`fair[0]`, the oldest request) of at least
    w x `step_tokens` work, one the paper's per-step rule would starve, is charged to the Fair
    lane whichever lane places it. That changes no placement of the merge itself (its ledgers are
    the paper's), only what the step's tokens are booked as: without it the Fast lane would pay
    w x a whole chunk of the long front whenever its score put the front next (a running
    prefill's computed tokens raise its score), and the hits behind it would wait up to w steps
    while the Fair lane caught up.

    `fit` (with `step_tokens`): the Fast lane starts only what it finishes in the step. While
    the work placed so far is below `step_tokens`, a Fast-lane request whose work exceeds what
    is left is passed over by the Fast lane (it stays in the Fair lane, in its place there) and
    its key is added to `skipped`. Every partial start of a step is then the Fair lane's.

    """
    placed: set[int] = set()
    keys: list[int] = []
    lanes: list[str] = []
    charged: list[str] = []
    if not fast or not fair:
        return keys, lanes, charged
    if ledgers is None:
        ledger = [weight * float(work[fast[0]]), float(work[fair[0]])]
    else:
        ledger = list(ledgers)
    front = fair[0]
    long_front = step_tokens is not None and float(work[front]) >= weight * step_tokens
    passed = set() if skipped is None else skipped
    gone_fast = placed | passed  # what the Fast lane skips: placed or passed over
    check_fit = fit and step_tokens is not None
    tokens = float(step_tokens) if step_tokens is not None else 0.0
    placed_work = 0.0
    waiting = 0

    def run(fast_keys: Sequence[int], fair_keys: Sequence[int], waiting_limit: int | None) -> None:
        nonlocal placed_work, waiting
        n_fast, n_fair = len(fast_keys), len(fair_keys)
        limit = sys.maxsize if waiting_limit is None else waiting_limit
        fast_pos = fair_pos = 0
        while waiting < limit:
            while fast_pos < n_fast and fast_keys[fast_pos] in gone_fast:
                fast_pos += 1
            while fair_pos < n_fair and fair_keys[fair_pos] in placed:
                fair_pos += 1
            if fair_pos == n_fair or (fast_pos == n_fast and not passed):
                return
            if fast_pos < n_fast and ledger[0] <= ledger[1]:
                key = fast_keys[fast_pos]
                amount = float(work[key])
                if check_fit and placed_work < tokens and amount > tokens - placed_work:
                    passed.add(key)  # the Fast lane would start what it cannot finish: pass it
                    gone_fast.add(key)
                    continue
                ledger[0] += weight * amount
                lanes.append(FAST)
                charged.append(FAIR if key == front and long_front else FAST)
            else:
                key = fair_keys[fair_pos]
                amount = float(work[key])
                ledger[1] += amount
                lanes.append(FAIR)
                charged.append(FAIR)
            placed.add(key)
            gone_fast.add(key)
            keys.append(key)
            placed_work += amount
            waiting += key >= 0

    if slots is None:
        run(fast, fair, None)
    else:
        run(fast, fair, max(0, slots))
        run([k for k in fast if k < 0], [k for k in fair if k < 0], None)
        run(fast, fair, None)
    return keys, lanes, charged


def first_rows(keys: tuple[np.ndarray, ...], count: int) -> np.ndarray:
    """The first `count` rows of the lane `np.lexsort(keys)` orders (the last key first, row
    order breaking the last ties), without sorting the whole queue: a partial selection of the
    rows whose primary key is within the `count`-th smallest (every row tied with it kept),
    then a sort of just those. A lane head for `count` placements (`merge` reads no further)."""
    primary = keys[-1]
    if count >= len(primary):
        whole: np.ndarray = np.lexsort(keys)
        return whole
    if count <= 0:
        return np.zeros(0, np.intp)
    kth = np.partition(primary, count - 1)[count - 1]
    if kth != kth:  # NaN reached: the lane's NaN rows (sorted last) are read too
        nan_reached: np.ndarray = np.lexsort(keys)[:count]
        return nan_reached
    rows = np.flatnonzero(primary <= kth)
    head: np.ndarray = rows[np.lexsort(tuple(key[rows] for key in keys))][:count]
    return head
