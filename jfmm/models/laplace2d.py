"""The 2D Laplace family's error model: the order for eps, the leaf size."""
from __future__ import annotations

from jfmm.models import Choice, Points, choose_order, series_choice


# Worst relative L2 error measured per order p, max(err phi, err grad / 10),
# float64, through jfmm.passes.evaluate against the direct sum: N = 4,000
# uniform square, circle and clusters (3 draws each, depths 2, 3 and 4), and
# 20 to 60 uniform draws of N = 400 (depth 2) and 1,000 (depth 3), where a
# single slow source-target pair weighs more. The error falls about 0.4x per
# order; float64 rounding (about 1e-15) is reached near p = 34.
_ERROR_BY_ORDER = {4: 1.7e-3, 5: 5.2e-4, 6: 1.7e-4, 7: 5.1e-5, 8: 1.6e-5, 9: 3.4e-6,
                   10: 2.0e-6, 11: 9.8e-7, 12: 2.7e-7, 13: 1.1e-7, 14: 2.9e-8, 15: 1.2e-8,
                   16: 6.4e-9, 17: 2.2e-9, 18: 1.1e-9, 19: 4.2e-10, 20: 2.1e-10,
                   21: 1.1e-10, 22: 3.4e-11, 23: 1.6e-11, 24: 7.6e-12, 25: 3.5e-12,
                   26: 1.2e-12, 27: 6.9e-13, 28: 2.5e-13, 29: 1.2e-13, 30: 6.3e-14,
                   31: 2.2e-14, 32: 1.2e-14}
_SAFETY = 4.0
ORDERS = tuple(sorted(_ERROR_BY_ORDER))
MAX_ORDER = ORDERS[-1]


def _error_bound(p: int) -> float:
    """The error the order rule assumes at order p."""
    return _SAFETY * _ERROR_BY_ORDER[p]


# float32 rounding sets a floor near 5e-7 (measured, N = 4,000); p = 12 with
# the margin gives 1.1e-6.
EPS_FLOOR = {"float32": 3e-6, "float64": _error_bound(MAX_ORDER)}


def leaf_size(p: int) -> int:
    """Mean points per leaf at order p.

    Per leaf the near field costs 9 s^2 pair terms and M2L 27 (2p)^2
    multiply-adds; a dense M2L term costs a few times less than a pair
    (log and division), which puts the balance near s = 2p. Measured, the
    time is flat between 16 and 64 points per leaf for p <= 30 (H200,
    N = 2^20: 16 fastest by up to 25%; CPU, N = 2^16: 64 fastest by 25%),
    so the floor of 32 of the other families sets it up to p = 16.
    """
    return max(32, 2 * p)


def order_for_eps(eps: float, dtype, points: float | None = None) -> int:
    """Expansion order p for a requested relative L2 error eps.

    Raises ValueError if eps is below what `dtype` (or the largest tabulated
    order) can reach.
    """
    return choose_order(eps, dtype, EPS_FLOOR, ORDERS, _error_bound, "the 2D Laplace family")


def choose(kernel, eps: float, dtype, points: Points, order: int | None = None,
           gradient: bool = True) -> Choice:
    """Order (from eps, or `order` range-checked) and depth for these points;
    one rule with or without the gradient, whose error at the order for
    phi stays within eps (docs/BENCHMARKS.md)."""
    return series_choice(order_for_eps, MAX_ORDER, leaf_size, eps, dtype, points, order)
