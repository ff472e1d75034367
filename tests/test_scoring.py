"""S0.4 scorers as pure array functions: worked values, ranges, and the zero-capacity edge."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from finesched.plugins.scoring import least_requested, most_allocated, most_balanced
from finesched.sched.framework import MAX_SCORE


def shares(*columns: list[float]) -> list[np.ndarray]:
    return [np.array(c, dtype=float) for c in columns]


@pytest.mark.parametrize(
    ("classes", "want"),
    [
        # node 0: cpu (2+2)/8 = 0.5, mem (4+4)/16 = 0.5 -> mean 0.5 -> 100 * (1 - 0.5) = 50
        # node 1: cpu 2/4 = 0.5, mem 4/16 = 0.25 -> mean 0.375 -> floor(62.5) = 62
        pytest.param(shares([0.5, 0.5], [0.5, 0.25]), [50, 62], id="two-classes"),
        # one class: 0.3 -> 70 (not 69: float noise is absorbed)
        pytest.param(shares([0.3, 0.0, 1.0]), [70, 100, 0], id="one-class"),
        # no requested class: nothing used -> 100 everywhere
        pytest.param([], [100, 100], id="no-classes"),
        # an infeasible node (share 1.5) stays in range
        pytest.param(shares([1.5]), [0], id="over-requested-clamped"),
    ],
)
def test_least_requested(classes: list[np.ndarray], want: list[int]) -> None:
    assert least_requested(classes, len(want)).tolist() == want


@pytest.mark.parametrize(
    ("classes", "want"),
    [
        # mean 0.375 -> 37; mean (1.0 + 0.5)/2 = 0.75 -> 75
        pytest.param(shares([0.5, 1.0], [0.25, 0.5]), [37, 75], id="two-classes"),
        pytest.param(shares([1.7]), [100], id="over-requested-clamped"),
    ],
)
def test_most_allocated(classes: list[np.ndarray], want: list[int]) -> None:
    assert most_allocated(classes, len(want)).tolist() == want


@pytest.mark.parametrize(
    ("classes", "want"),
    [
        # shares 0.5, 0.25: variance ((0.5-0.25)/2)^2 = 0.015625 -> 100 * (1 - 4 * 0.015625) = 93.75 -> 93
        # shares 0.5, 0.5: variance 0 -> 100;  shares 1, 0: variance 0.25 -> 0
        pytest.param(shares([0.5, 0.5, 1.0], [0.25, 0.5, 0.0]), [93, 100, 0], id="two-classes"),
        # three classes 0.2, 0.5, 0.8: mean 0.5, variance (0.09 + 0 + 0.09)/3 = 0.06 -> 100 * (1 - 0.24) = 76
        pytest.param(shares([0.2], [0.5], [0.8]), [76], id="three-classes"),
        pytest.param(shares([0.7]), [100], id="one-class-is-balanced"),
    ],
)
def test_most_balanced(classes: list[np.ndarray], want: list[int]) -> None:
    assert most_balanced(classes, len(want)).tolist() == want


share_columns = st.lists(
    st.lists(st.floats(0, 3, allow_nan=False), min_size=4, max_size=4).map(np.array), min_size=0, max_size=4
)


@given(share_columns)
def test_every_scorer_stays_in_range(classes: list[np.ndarray]) -> None:
    for scorer in (least_requested, most_allocated, most_balanced):
        scores = scorer(classes, 4)
        assert scores.dtype == np.int64 and scores.shape == (4,)
        assert ((scores >= 0) & (scores <= MAX_SCORE)).all()


@given(
    st.integers(1, 64).flatmap(
        lambda n: st.lists(
            st.lists(st.floats(0, 3, allow_nan=False), min_size=n, max_size=n).map(np.array), min_size=3, max_size=8
        )
    )
)
def test_stacked_mean_and_variance_equal_the_class_by_class_sums_bit_for_bit(classes: list[np.ndarray]) -> None:
    from finesched.plugins.shares import Shares

    total = classes[0] + classes[1]  # the reference: one class after another, in order
    for a in classes[2:]:
        total += a
    total *= 1.0 / len(classes)
    var = np.zeros(len(total))
    for a in classes:
        d = a - total
        var += d * d
    var *= 1.0 / len(classes)
    shares = Shares(len(total), classes)
    assert shares.mean().tobytes() == total.tobytes() and shares.variance().tobytes() == var.tobytes()
