"""The two lanes of one step, as `FairwayPolicy`'s rule reads them. Must not import vllm.

A step's requests are the waiting rows (key i >= 0, the queue's row i) and the running prefills
(key -(j + 1), `Step.prefilling[j]`). The rule reads each lane only at its first entry not yet
placed, so a step needs only the first entries of each lane: `StepLanes.first` builds them from
the queue's columns by a partial selection (what the engine runs, thousands of rows), and
`StepLanes.whole` builds the whole lanes from views with plain `sorted` (the reference).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fairway.policies.lanes import FastLanePolicy, first_rows
from fairway.policies.queue import QueueColumns, QueuedRequest, Step


@dataclass(slots=True)
class StepLanes:
    """The lanes' first entries (or whole lanes) of one step and what the rule reads of them.

    Attributes:
        fast: keys in the Fast lane's order: score descending, then older, a running prefill
            before a waiting request of an equal score and arrival, then by position.
        fair: keys in the Fair lane's order: the running prefills (by arrival, then position),
            then the waiting requests by arrival, then by row.
        work: uncached tokens (>= 1) of every key in either list.
        done: tokens each key already holds (cached or computed).
        queue_work: the whole waiting queue's work (the contest reads it).
        waiting: the number of waiting rows.
        ids_of: rows -> their request ids (read only for the rows the rule places).
        whole_fast: `fast` is the whole Fast lane (a rule that passes over all of it is done).
    """

    fast: list[int]
    fair: list[int]
    work: dict[int, int]
    done: dict[int, int]
    queue_work: float
    waiting: int
    ids_of: Callable[[list[int]], list[str]]
    whole_fast: bool

    @classmethod
    def first(
        cls, policy: FastLanePolicy, queue: QueueColumns, step: Step, scores: np.ndarray,
        fast_count: int, fair_count: int,
    ) -> StepLanes:
        """The first `fast_count` waiting rows of the Fast lane and `fair_count` of the Fair
        lane, with every running prefill in its place in both (`scores`: the rows' Fast
        scores)."""
        n, running = len(queue), step.prefilling
        m = len(running)
        fast_rows = first_rows((queue.arrival, -scores), fast_count) if n else np.zeros(0, np.intp)
        fair_rows = first_rows((queue.arrival,), fair_count) if n else np.zeros(0, np.intp)
        views = [p.view() for p in running]
        run = QueueColumns.of(views)
        # running prefills, then the rows, each set by the lane's own keys
        keys = np.concatenate([-(np.arange(m) + 1), fast_rows])
        order = np.lexsort((
            np.concatenate([np.arange(m), fast_rows]),
            np.concatenate([np.zeros(m), np.ones(len(fast_rows))]),
            np.concatenate([run.arrival, queue.arrival[fast_rows]]),
            -np.concatenate([policy.scores(run, step.now), scores[fast_rows]]),
        ))
        fair_running = sorted(range(-1, -m - 1, -1), key=lambda k: (running[-k - 1].arrival, -k))
        rows = np.union1d(fast_rows, fair_rows)
        amounts = queue.remaining[rows].astype(np.int64)
        work = dict(zip(rows.tolist(), amounts.tolist(), strict=True))
        done = dict(zip(rows.tolist(), (queue.prompt_tokens[rows] - amounts).tolist(),
                        strict=True))
        for j, view in enumerate(views):
            work[-(j + 1)] = view.remaining
            done[-(j + 1)] = view.prompt_tokens - view.remaining
        return cls(keys[order].tolist(), fair_running + fair_rows.tolist(), work, done,
                   float(queue.remaining.sum()), n, queue.ids_of, len(fast_rows) >= n)

    @classmethod
    def whole(
        cls, policy: FastLanePolicy, waiting: Sequence[QueuedRequest], step: Step
    ) -> StepLanes:
        """Both whole lanes, sorted in plain Python: the reference the engine's `first` must
        agree with wherever the rule reads."""
        requests = dict(enumerate(waiting))
        requests.update({-(j + 1): p.view() for j, p in enumerate(step.prefilling)})
        keys = list(requests)
        scores = dict(zip(keys, policy.fast_scores(list(requests.values()), step.now),
                          strict=True))

        def position(k: int) -> tuple[bool, int]:  # running prefills first, then by position
            return (k >= 0, k if k >= 0 else -k - 1)

        fast = sorted(keys, key=lambda k: (-scores[k], requests[k].arrival, position(k)))
        fair = sorted(keys, key=lambda k: (k >= 0, requests[k].arrival, position(k)))
        work = {k: r.remaining for k, r in requests.items()}
        done = {k: r.prompt_tokens - r.remaining for k, r in requests.items()}
        ids = [r.request_id for r in waiting]
        return cls(fast, fair, work, done, float(sum(r.remaining for r in waiting)),
                   len(waiting), lambda rows: [ids[i] for i in rows], True)
