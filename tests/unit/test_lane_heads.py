"""A lane's first entries by partial selection (`first_rows`) against the whole lane sorted.

The engine reads only the first entries of each lane, every step over 1,000s of waiting
requests; they must be exactly the whole lane's first entries, ties, signed zeros, infinities
and NaN included (NaN last, as a sort puts it).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fairway.policies.lanes import first_rows

values = st.sampled_from([0.0, -0.0, 0.5, 1.0, 1.0 + 2**-52, 3.0, 1e9, np.inf, -np.inf, np.nan])


@settings(max_examples=500, deadline=None)
@given(scores=st.lists(values, max_size=80), arrival_ties=st.booleans(),
       count=st.integers(-1, 90), data=st.data())
def test_first_rows_are_the_sorted_lanes_first(scores, arrival_ties, count, data) -> None:
    s = np.array(scores, dtype=np.float64)
    times = st.sampled_from([0.0, 1.0]) if arrival_ties else st.floats(0, 10, allow_nan=False)
    arrival = np.array(data.draw(st.lists(times, min_size=len(s), max_size=len(s))), np.float64)
    for keys in ((arrival, -s), (arrival,), (s,)):
        want = np.lexsort(keys)[: max(count, 0)]
        assert first_rows(keys, count).tolist() == want.tolist()


def test_first_rows_read_a_long_queue_in_lane_order() -> None:
    rng = np.random.default_rng(0)
    arrival = rng.random(10_000)
    assert first_rows((arrival,), 20).tolist() == np.argsort(arrival, kind="stable")[:20].tolist()
