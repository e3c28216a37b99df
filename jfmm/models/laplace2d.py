"""The 2D Laplace family's error model: the order for eps, the leaf size."""
from __future__ import annotations

from jfmm.models import Choice, Points, choose_order, series_choice


# Worst relative L2 errors of phi and of grad phi measured per order p
# (float64, every target of 1,000 sampled against the direct sum; N = 4,000
# and 20,000, uniform square, circle and clusters, two draws each). The
# error falls about 0.4x per order; the gradient's is 4-20x the potential's.
# Below the 4,000 points measured a single slow source-target pair weighs
# more (its error is fixed, ||phi|| grows like sqrt(N M)): a CI draw of 1,200
# sources and 500 targets measured grad 1.18e-10 at eps 1e-10, so the bound
# grows like 4,000 / sqrt(N M) there.
_PHI_BY_ORDER = {4: 1.8e-03, 5: 3.6e-04, 6: 1.1e-04, 7: 3.1e-05, 8: 1.1e-05, 9: 3.7e-06,
                 10: 1.4e-06, 11: 4.5e-07, 12: 1.6e-07, 13: 6.2e-08, 14: 2.6e-08, 15: 9.4e-09,
                 16: 3.4e-09, 17: 1.4e-09, 18: 6.2e-10, 19: 2.5e-10, 20: 1.1e-10, 21: 3.8e-11,
                 22: 1.6e-11, 23: 6.8e-12, 24: 2.9e-12, 25: 1.2e-12, 26: 4.9e-13, 27: 2.0e-13,
                 28: 8.6e-14, 29: 4.0e-14, 30: 1.6e-14, 31: 7.2e-15, 32: 3.2e-15}
_GRAD_BY_ORDER = {4: 6.7e-03, 5: 2.1e-03, 6: 7.1e-04, 7: 2.4e-04, 8: 9.0e-05, 9: 3.4e-05,
                  10: 1.3e-05, 11: 5.2e-06, 12: 2.0e-06, 13: 8.4e-07, 14: 3.6e-07, 15: 1.4e-07,
                  16: 6.0e-08, 17: 2.5e-08, 18: 1.1e-08, 19: 4.3e-09, 20: 1.4e-09, 21: 7.9e-10,
                  22: 2.9e-10, 23: 1.1e-10, 24: 4.5e-11, 25: 3.0e-11, 26: 1.1e-11, 27: 4.4e-12,
                  28: 1.7e-12, 29: 1.1e-12, 30: 3.7e-13, 31: 1.7e-13, 32: 7.3e-14}
_SAFETY = 1.5
_TABLE_POINTS = 4000
ORDERS = tuple(sorted(_PHI_BY_ORDER))
MAX_ORDER = ORDERS[-1]


def _error_bound(p: int, gradient: bool = False, points: float | None = None) -> float:
    """The error the order rule assumes at order p, of phi or (also) of grad
    phi, for sqrt(N M) = points (None: large sets)."""
    few = 1.0 if points is None else max(1.0, _TABLE_POINTS / points)
    return _SAFETY * few * (_GRAD_BY_ORDER if gradient else _PHI_BY_ORDER)[p]


# float32 rounding sets a floor near 5e-7 (measured, N = 4,000). float64:
# the potential's floor is kept where float64 rounding (about 1e-15, near
# p = 34) leaves a margin; the gradient's is its bound at the largest order.
EPS_FLOOR = {"float32": 3e-6, "float64": 4.8e-14}
GRADIENT_EPS_FLOOR = {"float32": 3e-6, "float64": _error_bound(MAX_ORDER, True)}


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


def order_for_eps(eps: float, dtype, points: float | None = None, gradient: bool = False) -> int:
    """Expansion order p for a requested relative L2 error eps of phi (and,
    with gradient, of grad phi), for sqrt(N M) = points (None: large sets).

    Raises ValueError if eps is below what `dtype` (or the largest tabulated
    order) can reach.
    """
    floor = GRADIENT_EPS_FLOOR if gradient else EPS_FLOOR
    return choose_order(eps, dtype, floor, ORDERS, lambda p: _error_bound(p, gradient, points),
                        "the 2D Laplace family" + (" for gradients" if gradient else ""))


# On adaptive trees the gradient errs more than on the uniform trees the
# table was measured on: each tight cluster sums like one large charge,
# which may sit at the worst geometry of its translations (CPU, 2,001
# sources in 5 clusters of width 1e-3, 1,001 targets on a circle, eps 1e-5,
# 46 draws: grad up to 1.07e-5 at the table's order plus one, up to 4.6e-6
# at plus two).
ADAPTIVE_GRADIENT_ORDERS = 2


def on_adaptive(p: int, gradient: bool) -> int:
    """The order on an adaptive tree for the uniform tree's order p."""
    return min(p + ADAPTIVE_GRADIENT_ORDERS, MAX_ORDER) if gradient else p


def choose(kernel, eps: float, dtype, points: Points, order: int | None = None,
           gradient: bool = True) -> Choice:
    """Order (from eps, or `order` range-checked) and depth for these points."""
    return series_choice(order_for_eps, MAX_ORDER, leaf_size, eps, dtype, points, order,
                         gradient)
