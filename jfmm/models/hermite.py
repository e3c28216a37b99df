"""The fast Gauss transform's planner: the grid level and order for a
Gaussian, eps and the points, from its truncation error on sample pairs of
the points and on uniform points, and a cost model."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jfmm.models import Choice, Points, Sample, check_floor, checked_order
from jfmm.ops.hermite import _coupling, normalized_hermite
from jfmm.tree import morton

# Error estimate. A pair's approximate kernel is the product over axes of
# the 1D double series truncated at p, so its error is known exactly for
# any given pair. `_pair_errors` evaluates it for sample pairs of the
# points; `_model_errors` for uniform points over the grid (the close pairs
# a sample of a narrow Gaussian misses). The relative L2 error of phi with
# random mixed-sign charges is sqrt(mean E^2 / mean K^2) over pairs, and
# likewise for the gradient; the estimate is the larger of the two.

_NODES = 7                 # positions per box and axis in the uniform model
PAIRS = 1024               # sample pairs of the points the estimate uses
ESTIMATE_MARGIN = 4.0
# Where asked, the gradient's estimate is held to eps / 2: it measured 1.24x
# its estimate (Gaussian(0.7), 3D, 700 clustered sources and 300 clustered
# targets, grid level 3, p = 8: 1.09e-3 against 8.8e-4; CPU, float64),
# which a margin of 1 had let past eps 1e-3.
GRADIENT_SLACK = 2.0
# float32: rounding of the moment sums and translations, with mixed-sign
# charges whose sum cancels, measured up to 8e-6 beyond the truncation error
# (3D, Gaussian(0.3) over clusters spanning 20 units, 1,500 points: 1.09e-5
# at eps 1e-5 with a truncation error of 3.0e-6 in float64); so eps >= 2e-5.
ROUNDING_FLOOR = {"float32": 2e-5, "float64": 1e-12}
# Charges known when the order is chosen (eager calls, plans given them):
# their phi and grad at strided targets against the sums that random charges
# of the same sizes would leave there, sqrt(sum q^2 K^2) (`Cancellation`).
# Where phi is smaller, the estimate (made for random charges) grows by the
# ratio beyond CANCEL_SLACK: 3D, Gaussian(0.3), 1,500 clustered sources, 400
# targets in a cube apart, 200 draws of random charges: errors up to 21x the
# estimate, and at most 1.16x the estimate times the ratio.
CANCEL_SLACK = 2.0
MAX_ORDER = 24
# Scaled box sides beyond which no order up to MAX_ORDER reaches 1e-3 (the
# estimate at rho = 3, p = 24: 4e-3).
MAX_RHO = 3.0
# Grid coefficients n^d p^d per charge column the transform may hold.
GRID_VALUES = 2 ** 26


def _series_1d(s, t, dd, p: int):
    """Truncated 1D series at every order 1..p for scaled source offsets s,
    target offsets t and centre offsets dd (broadcast together, float64).

    Returns (approx, dapprox/dt), each (p,) + shape: entry k-1 is order k."""
    s, t, dd = np.broadcast_arrays(*map(np.asarray, (s, t, dd)))
    shape = s.shape
    s, t, dd = s.reshape(-1), t.reshape(-1), dd.reshape(-1)
    a = np.arange(p)
    g = normalized_hermite(dd[:, None], 2 * p - 1)[:, :, 0].T               # (S, 2p-1)
    terms = g[:, a[:, None] + a[None, :]] * _coupling(p).T                  # (S, a, b)
    terms *= (s[:, None] ** a)[:, :, None]
    tb = t[:, None] ** a                                                    # (S, b)
    dtb = np.concatenate([np.zeros_like(t)[:, None], a[1:] * tb[:, :-1]], axis=1)
    below = a[:, None] <= a[None, :]                                        # [a, k]: a <= k
    out = []
    for tt in (tb, dtb):
        rows = np.cumsum(terms * tt[:, None, :], axis=2)                    # sum over b <= k
        out.append(np.einsum("sak,ak->ks", rows, below).reshape((p,) + shape))
    return out[0], out[1]


def _combine(approx, dapprox, exact, dexact):
    """Per-pair errors of phi and |grad| from per-axis values (d, p, pairs)
    and exact ones (d, pairs): returns (p, pairs) squared errors and the
    pairs' squared K and |grad K|."""
    d = approx.shape[0]
    k = np.prod(exact, axis=0)
    e = np.prod(approx, axis=0) - k[None]
    ge2 = np.zeros_like(e)
    gk2 = np.zeros_like(k)
    for a in range(d):
        others = [b for b in range(d) if b != a]
        ga = dapprox[a] * np.prod(approx[others], axis=0) if others else dapprox[a]
        gx = dexact[a] * np.prod(exact[others], axis=0) if others else dexact[a]
        ge2 += (ga - gx[None]) ** 2
        gk2 += gx ** 2
    return e * e, ge2, k * k, gk2


def _pair_errors(x, y, lo, side, level: int, epsilon: float, p: int):
    """(2, p) relative errors (phi, grad) at orders 1..p over sample pairs
    of sources x and targets y (numpy (S, d))."""
    n = 2 ** level
    h = side / n

    def centre(z):
        return lo + (np.clip(np.floor((z - lo) / h), 0, n - 1) + 0.5) * h

    cx, cy = centre(x), centre(y)
    s, t, dd = (epsilon * (x - cx)).T, (epsilon * (y - cy)).T, (epsilon * (cy - cx)).T
    approx, dapprox = _series_1d(s, t, dd, p)                 # (p, d, S)
    u = dd + t - s
    exact = np.exp(-u * u)
    e2, ge2, k2, gk2 = _combine(np.swapaxes(approx, 0, 1), np.swapaxes(dapprox, 0, 1),
                                exact, -2 * u * exact)
    return np.stack([e2.sum(1) / max(k2.sum(), 1e-300), ge2.sum(1) / max(gk2.sum(), 1e-300)])


def _model_errors(rho: float, n: int, dim: int, p: int):
    """(2, p) relative errors (phi, grad) at orders 1..p for uniform points
    on a grid of n boxes of scaled side rho per axis (pairs of boxes
    weighted by their count; per-axis errors combined as for independent
    axes: d^2 times the 1D ratio for phi, and for the gradient its own
    ratio plus (d - 1)^2 times phi's)."""
    if rho == 0.0:
        return np.zeros((2, p))
    pos = rho * 0.5 * np.cos((2 * np.arange(_NODES) + 1) * np.pi / (2 * _NODES))
    # Offsets with any weight: the kernel and the series' error are below
    # float64 rounding beyond 6 scaled units.
    offs = np.arange(min(n, int(6.0 / rho) + 3))
    w = np.where(offs == 0, n, 2.0 * (n - offs))
    s, t, dd = np.meshgrid(pos, pos, rho * offs, indexing="ij")
    approx, dapprox = _series_1d(s, t, dd, p)                 # (p, nodes, nodes, offs)
    u = dd + t - s
    k, dk = np.exp(-u * u), -2 * u * np.exp(-u * u)
    mean = lambda v: np.mean(v, axis=(-3, -2)) @ w             # noqa: E731
    r_phi = mean((approx - k) ** 2) / mean(k * k)
    r_grad = mean((dapprox - dk) ** 2) / mean(dk * dk)
    return np.stack([dim * dim * r_phi, r_grad + (dim - 1) ** 2 * r_phi])


class Cancellation(NamedTuple):
    """How much more given charges cancel at strided targets than random
    ones of the same sizes would: ||sqrt(sum_j q_j^2 K_ij^2)|| / ||phi||,
    and likewise for the gradient (`configure.charged`), each at least 1."""
    phi: float
    grad: float


class _Plan(NamedTuple):
    level: int
    order: int
    error: float          # estimated relative error of phi
    cost: float


def _lowest_order(err, eps: float, order: int | None, gradient: bool,
                  cancel: Cancellation | None = None) -> int | None:
    """The lowest order (from 1; `order` only, if given) whose relative
    errors err (2, p_cap) meet eps (phi's, and with gradient grad's), or
    None; cancel: the charges' (`Cancellation`), beyond CANCEL_SLACK."""
    grow = (1.0, 1.0) if cancel is None else [max(1.0, c / CANCEL_SLACK) for c in cancel]
    ok = np.maximum(err[0] * grow[0], err[1] * grow[1] / GRADIENT_SLACK * gradient) \
        * ESTIMATE_MARGIN <= eps
    if order is not None:
        ok[:order - 1] = False
    return int(np.argmax(ok)) + 1 if ok.any() else None


def _cost(d: int, n: int, p: int, n_points: int) -> float:
    """The cost model of `plan`: grows with n and with p."""
    return (16 * n_points * p ** d + 16 * d * (n * p) ** d
            + 2 * d * n ** (d + 1) * p ** (d + 1) / 7.5)


def plan(dim: int, eps: float, dtype, epsilon: float, sample: Sample, n_points: int,
         order: int | None = None, gradient: bool = True,
         cancel: Cancellation | None = None) -> _Plan | None:
    """The cheapest (level L, order p) whose estimated errors meet eps:
    max(err phi, err grad / GRADIENT_SLACK) <= eps / ESTIMATE_MARGIN (err
    phi alone without gradient),
    with n^d p^d <= GRID_VALUES. With `order`, that p only; cancel: the
    charges' `Cancellation`, where known. None if no (L, p) does (the
    caller falls back to another family); ValueError for an eps below
    the dtype's rounding floor.

    Cost model (H200-like): the points' P2H and L2P move 16 p^d bytes
    each, the grid passes 16 d (n p)^d bytes, the d matrix products
    2 d n^(d+1) p^(d+1) flops at 7.5 flops per byte."""
    check_floor(eps, dtype, ROUNDING_FLOOR, "the fast Gauss transform")
    d = dim
    epsilon = abs(float(epsilon))
    best = None
    for level in range(morton.MAX_DEPTH[d] + 1):
        n = 2 ** level
        p_cap = MAX_ORDER if order is None else order
        while p_cap > 0 and (n * p_cap) ** d > GRID_VALUES:
            p_cap -= 1
        if p_cap < (1 if order is None else order):
            break
        if best is not None and _cost(d, n, 1, n_points) >= best.cost:
            break                         # finer grids cost more at any order
        rho = epsilon * sample.side / n
        if rho > MAX_RHO:
            continue
        # The estimate is the larger of the model's and the sample pairs'
        # errors: where the model alone rules this level out (no order meets
        # eps, or its lowest order already costs more than the best plan),
        # the pairs cannot bring it back.
        err = np.sqrt(_model_errors(rho, n, d, p_cap))    # (2, p_cap), orders 1..p_cap
        p = _lowest_order(err, eps, order, gradient, cancel)
        if p is None or best is not None and _cost(d, n, p, n_points) >= best.cost:
            continue
        err = np.maximum(err, np.sqrt(_pair_errors(sample.x[:PAIRS], sample.y[:PAIRS],
                                                   sample.lo, sample.side, level, epsilon,
                                                   p_cap)))
        p = _lowest_order(err, eps, order, gradient, cancel)
        if p is None:
            continue
        cost = _cost(d, n, p, n_points)
        if best is None or cost < best.cost:
            best = _Plan(level, p, float(err[0, p - 1]), float(cost))
    return best


def choose(kernel, eps: float, dtype, points: Points, order: int | None = None,
           gradient: bool = True, explicit: bool = False,
           cancel: Cancellation | None = None) -> Choice | None:
    """(order, grid level) of the cheapest plan meeting eps, or None where
    none does or the points or epsilon are traced; explicit (the caller
    asked for this family): raise instead of None; cancel: the charges'
    `Cancellation`, where known."""
    if points.sample is None or not kernel.is_concrete():
        if explicit:
            raise ValueError("family 'hermite' needs concrete points and epsilon (its grid "
                             "and order depend on their values): call it outside jit, or "
                             "use family='chebyshev'")
        return None
    order = checked_order(order, MAX_ORDER)
    best = plan(points.dim, eps, dtype, float(kernel.epsilon), points.sample,
                points.n_points, order, gradient, cancel)
    if best is None and explicit:
        charges = "" if cancel is None else " and charges (they cancel at the targets)"
        raise ValueError(f"eps={eps:g} is below what the fast Gauss transform reaches for "
                         f"{kernel} on these points{charges} (order <= {MAX_ORDER}, grid "
                         f"of at most {GRID_VALUES} coefficients); use family='chebyshev' "
                         f"or a larger eps")
    return None if best is None else Choice(best.order, best.level)
