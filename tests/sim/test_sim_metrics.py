"""The protocol's binning of per-arrival samples at integer percents of arrived demand (metrics.bin_at)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from finesched.sim.metrics import bin_at


def test_bin_at_worked_example_from_the_docstring() -> None:
    arrived = np.array([89.6, 90.2, 90.4, 91.7])
    alloc = np.array([80.0, 81.0, 82.0, 83.0])
    got = bin_at(arrived, alloc, [90, 92, 93])
    assert got[90] == pytest.approx(81.0)  # 89.6, 90.2 and 90.4 round to 90
    assert got[92] == pytest.approx(83.0)  # 91.7 rounds to 92
    assert got[93] == pytest.approx(83.0)  # nothing rounds to 93: the samples rounding to 92..94


def test_bin_at_fallback_takes_both_neighbours_and_nan_when_none() -> None:
    arrived = np.array([89.6, 90.2, 90.4, 91.7])
    alloc = np.array([80.0, 81.0, 82.0, 83.0])
    got = bin_at(arrived, alloc, [91, 95])
    assert got[91] == pytest.approx(81.5)  # nothing rounds to 91: all four round to 90 or 92
    assert math.isnan(got[95])  # nothing within 94..96 either
    assert list(got) == [91, 95]


def test_bin_at_rounds_half_to_even() -> None:
    # As Python's round() in the artifact: 90.5 -> 90 and 91.5 -> 92, so nothing lands on 91.
    arrived = np.array([90.5, 91.5])
    values = np.array([10.0, 20.0])
    got = bin_at(arrived, values, [90, 91, 92])
    assert got[90] == pytest.approx(10.0)
    assert got[92] == pytest.approx(20.0)
    assert got[91] == pytest.approx(15.0)  # only through the ±1 fallback (half-up would give 10 here)


def test_fill_summary_means_the_frag_ratio_over_seeds() -> None:
    from finesched.sim.report import fill_summary

    def record(seed: int, ratio: float | None) -> dict[str, object]:
        points = ("90", "95", "100", "110", "120", "130")
        return {
            "policy": "FGD",
            "seed": seed,
            "alloc": dict.fromkeys(points, 95.0),
            "frag_amount": dict.fromkeys(points, 4.0),
            "frag_ratio": dict.fromkeys(points, ratio),
            "failed": 10,
            "wall_s": 1.0,
        }

    summary = fill_summary([record(1, 80.0), record(2, 90.0), record(3, None)])["FGD"]
    assert summary["frag_ratio_130"] == pytest.approx(85.0)  # a missing value is skipped, not a zero
    assert summary["frag_amount_130"] == pytest.approx(4.0) and summary["mean_130"] == pytest.approx(95.0)


def test_seed_band_is_the_median_and_middle_half_of_the_seeds() -> None:
    from finesched.sim.report import seed_band

    # 5 seeds x 3 points; one outlier seed (50) must not stretch the band, and an empty column stays empty.
    ys = np.array(
        [
            [90.0, 1.0, np.nan],
            [91.0, 2.0, np.nan],
            [92.0, 3.0, np.nan],
            [93.0, 4.0, np.nan],
            [50.0, 5.0, np.nan],
        ]
    )
    median, lo, hi = seed_band(ys)
    assert median[:2].tolist() == [91.0, 3.0]
    assert lo[:2].tolist() == [90.0, 2.0] and hi[:2].tolist() == [92.0, 4.0]
    assert np.isnan([median[2], lo[2], hi[2]]).all()
