"""The per-step shortcuts of `fairway`'s `step_share` against the numpy forms they replace.

`step_share` runs before every step over 1,000s of waiting requests, so its small parts avoid
numpy calls on tiny arrays and n-sized temporaries: the running prefills' scores in scalar math
and the lane's head by a partition of the scores themselves (not of their negation). Each must
give exactly what the form it replaced gave (bit for bit: the merge compares these numbers).
The replaced forms are kept here as the reference.
"""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairway.policies import get
from fairway.policies.base import PrefillingRequest
from fairway.policies.fairway_step import _Columns, _lane_head, _top
from fairway.profiling.table import from_points


def _ref_running_columns(prefilling: list[PrefillingRequest]) -> _Columns:
    """The running prefills as score columns, as `step_share` built them before."""
    k = len(prefilling)
    arrival = np.fromiter((p.arrival for p in prefilling), np.float64, k)
    prompt = np.fromiter((p.prompt_tokens for p in prefilling), np.float64, k)
    remaining = np.fromiter((p.remaining for p in prefilling), np.float64, k)
    return _Columns(arrival, prompt, prompt - remaining, np.maximum(remaining, 1.0))


def _ref_top(key: np.ndarray, head: int) -> np.ndarray:
    n = len(key)
    if head >= n:
        return np.arange(n)
    threshold = key[np.argpartition(key, head - 1)[head - 1]]
    return np.flatnonzero(key <= threshold)


def _ref_lane_head(scores: np.ndarray, arrival: np.ndarray, head: int) -> np.ndarray:
    neg = -scores
    top = _ref_top(neg, head)
    return top[np.lexsort((arrival[top], neg[top]))][:head]


def _bits(values: object) -> bytes:
    return np.asarray(values, dtype=np.float64).tobytes()


prefills = st.lists(
    st.builds(
        lambda i, arrival, remaining, computed: PrefillingRequest(
            f"p{i}", arrival, remaining, remaining + computed
        ),
        st.integers(0, 99),
        st.one_of(st.floats(0, 100, allow_nan=False), st.integers(0, 100)),
        st.integers(1, 40_000),
        st.integers(0, 40_000),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(earlier=prefills, prefilling=prefills, now=st.floats(0, 120, allow_nan=False))
def test_prefill_scores_from_remembered_patience_equal_the_column_scores(
    earlier, prefilling, now
) -> None:
    """T(L) is interpolated once per prompt length and remembered (`_units`): scores after other
    steps, and after the profile is replaced, are still the column scores bit for bit."""
    profiles = [from_points([(1000, 0.2), (8000, 4 / 3), (32000, 9.0)]),
                from_points([(500, 0.1), (40000, 20.0)])]
    policy = get("fairway", profile=profiles[0])
    for profile in profiles:
        policy.profile = profile
        for step in (earlier, prefilling, prefilling[::-1]):
            got = policy._prefill_scores(step, now)
            want = policy._scores(_ref_running_columns(step), now) if step else []
            assert _bits(got) == _bits(want)
        assert set(policy._units) <= {p.prompt_tokens for p in (*earlier, *prefilling)}


@settings(max_examples=400, deadline=None)
@given(
    prefilling=prefills,
    now=st.one_of(st.floats(0, 120, allow_nan=False), st.integers(0, 120)),
    profiled=st.booleans(),
    floor=st.sampled_from([0.25, 1.0, 3.0]),
)
@example(prefilling=[PrefillingRequest("p", 5.0, 1, 1)], now=5.0, profiled=False, floor=1.0)
def test_prefill_scores_equal_the_column_scores(prefilling, now, profiled, floor) -> None:
    """Scalar float64 math gives numpy's elementwise results; T(L) comes from the profile."""
    profile = from_points([(1000, 0.2), (8000, 4 / 3), (32000, 9.0)]) if profiled else None
    policy = get("fairway", profile=profile, patience_floor_s=floor)
    got = policy._prefill_scores(prefilling, now)
    want = policy._scores(_ref_running_columns(prefilling), now) if prefilling else []
    assert _bits(got) == _bits(want)


keys = st.lists(st.sampled_from([0.0, -0.0, 0.5, 1.0, 1.0 + 2**-52, 3.0, 7.25, 1e9]), max_size=60)


@settings(max_examples=500, deadline=None)
@given(scores=keys, arrival_ties=st.booleans(), head=st.integers(0, 64), data=st.data())
def test_lane_head_equals_the_negated_selection(scores, arrival_ties, head, data) -> None:
    """The partition of the scores for their highest keeps the rows the partition of their
    negation for its lowest kept, in the same lane order, ties and signed zeros included."""
    s = np.array(scores, dtype=np.float64)
    times = st.sampled_from([0.0, 1.0]) if arrival_ties else st.floats(0, 10, allow_nan=False)
    arrival = np.array(data.draw(st.lists(times, min_size=len(s), max_size=len(s))), np.float64)
    assert _lane_head(s, arrival, head).tolist() == _ref_lane_head(s, arrival, head).tolist()
    assert _top(s, head).tolist() == _ref_top(s, head).tolist()
