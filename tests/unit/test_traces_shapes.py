"""Load shapes: windows, labels, Poisson arrivals and the rate formula."""

from __future__ import annotations

import numpy as np
import pytest

from fairway.errors import TraceError
from fairway.traces.shapes import SHAPES, get_shape, phase_rates, poisson_arrivals


def test_named_shapes() -> None:
    spike = SHAPES["spike"]
    assert [p.name for p in spike.phases] == ["calm", "burst", "spike", "calm"]
    s = spike.phases[2]
    assert s.duration_s == 60.0 and 1.5 <= s.load <= 2.0
    assert 300 <= spike.duration_s <= 420
    assert {"spike", "steady", "calm", "overload", "flood"} <= set(SHAPES)


def test_inline_shape_and_windows() -> None:
    shape = get_shape("a:0.5:10,b:2:5,c:1:5")
    assert shape.duration_s == 20.0
    assert [(w.name, w.start_s, w.end_s, w.load) for w in shape.windows()] == [
        ("a", 0.0, 10.0, 0.5), ("b", 10.0, 15.0, 2.0), ("c", 15.0, 20.0, 1.0)]
    assert shape.phase_at(9.999) == "a"
    assert shape.phase_at(10.0) == "b"
    assert shape.phase_at(99.0) == "c"  # the last phase labels late arrivals
    assert shape.load_at(12.0) == 2.0 and shape.load_at(25.0) == 0.0
    assert shape.mean_load() == pytest.approx((5 + 10 + 5) / 20)


@pytest.mark.parametrize("spec", ["nope", "a:1", "a:x:3", "a:1:-1", "a:-1:3"])
def test_bad_shapes(spec: str) -> None:
    with pytest.raises(TraceError):
        get_shape(spec)


def test_rate_formula() -> None:
    shape = get_shape("a:0.5:10,b:2:10")
    assert phase_rates(shape, 1000.0, 250.0) == [2.0, 8.0]  # load * capacity / work
    assert phase_rates(shape, 1000.0, {"a": 100.0, "b": 500.0}) == [5.0, 4.0]
    with pytest.raises(TraceError):
        phase_rates(shape, 0.0, 100.0)


def test_poisson_arrivals_follow_rates_and_seed() -> None:
    shape = get_shape("a:1:100,b:1:100")
    rates = [5.0, 20.0]
    t = poisson_arrivals(shape, rates, np.random.default_rng(3))
    assert np.all(np.diff(t) >= 0)
    n_a, n_b = int((t < 100).sum()), int((t >= 100).sum())
    # Poisson counts: mean 500 and 2000, five standard deviations of slack.
    assert abs(n_a - 500) < 5 * 500**0.5
    assert abs(n_b - 2000) < 5 * 2000**0.5
    again = poisson_arrivals(shape, rates, np.random.default_rng(3))
    other = poisson_arrivals(shape, rates, np.random.default_rng(4))
    assert np.array_equal(t, again)
    assert not np.array_equal(t[:100], other[:100])
