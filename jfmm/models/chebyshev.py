"""The Chebyshev family's error model: the order n (nodes per dimension)
for a kernel, eps and the points, from an estimate of the far field's
interpolation error; a worst-case rule over all kernels where the kernel's
parameters are traced; and the leaf size."""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jfmm.models import (Choice, Points, Unreachable, check_floor, checked_order, choose_order,
                         depth_for)
from jfmm.tree import lists


# ------------------------------------------------------------ error estimate
#
# M2M and L2L are exact on the interpolating polynomials, so the far field's
# error is the error of interpolating K(|x - y|) over the boxes of each
# level's well-separated pairs. Along a line through a box of side h, with
# K's Chebyshev coefficients c_k there, interpolation at n nodes errs by at
# most 2 sum_{k >= n} |c_k| and its derivative by (2 / h) 2 sum_{k >= n} k^2
# |c_k|. `far_field_error` takes 2d such errors per pair (one per coordinate
# of x and y), averages their squares over sample lines of every M2L offset
# and turns them into relative L2 errors of phi and grad phi with random
# mixed-sign charges:
#
#   err(n)^2 = sum_l f_l (2d)^2 mean_lines(tail_l(n)^2) / mean(K^2 over pairs)
#
# (grad: K'^2 and the derivative's tail), with f_l = min(1, (6^d - 3^d) /
# 2^(dl)) the share of pairs translated at level l (an interior box's list).

_LINE_POINTS = 48
_SAMPLES = (-0.35, 0.35)
_NOISE = 1e-14


@jax.jit
def _value_and_derivative(kernel, r):
    return kernel.value_and_derivative(r)


def _radial(kernel, r) -> tuple[np.ndarray, np.ndarray]:
    """K(r) and K'(r) as float64 numpy arrays of r's shape, evaluated jitted
    on r padded to a power-of-two length: one compilation per kernel class
    and length serves every call (op by op, each new sample size compiled
    every primitive of the kernel again)."""
    r = np.asarray(r, np.float64)
    flat = r.reshape(-1)
    size = 1 << max(4, (flat.size - 1).bit_length())
    padded = np.concatenate([flat, np.ones(size - flat.size)])
    k, dk = _value_and_derivative(kernel, jax.device_put(padded))   # jnp.asarray compiles
    return tuple(np.asarray(v, np.float64)[:flat.size].reshape(r.shape) for v in (k, dk))


@functools.lru_cache(maxsize=None)
def _lines(dim: int):
    """Sample lines of well-separated pairs, in box sides.

    Returns x (L, d) target points (2^d per target box, at each M2L offset
    up to symmetry: non-negative, non-increasing components), y (L, M, d)
    the M Chebyshev points of the first kind on lines through the source box
    [-1/2, 1/2]^d along each axis (2^(d-1) per axis), weight (L,) the
    offsets' multiplicities (summing to 1), T (M, M), T[k, j] = T_k(tau_j)."""
    canon = {}
    for o in np.abs(lists.m2l_offsets(dim)):
        key = tuple(sorted(o, reverse=True))
        canon[key] = canon.get(key, 0) + 1
    tau = np.cos((2 * np.arange(_LINE_POINTS) + 1) * np.pi / (2 * _LINE_POINTS))
    xs, ys, ws = [], [], []
    for o, count in canon.items():
        for v in np.ndindex(*(2,) * dim):
            x = np.array(o, float) + np.take(_SAMPLES, v)
            for a in range(dim):
                for w in np.ndindex(*(2,) * (dim - 1)):
                    y = np.repeat(np.insert(np.take(_SAMPLES, w), a, 0.0)[None],
                                  _LINE_POINTS, axis=0)
                    y[:, a] = tau / 2
                    xs.append(x)
                    ys.append(y)
                    ws.append(count)
    ws = np.array(ws, float)
    t = np.cos(np.outer(np.arange(_LINE_POINTS), np.arccos(tau)))
    return np.array(xs), np.array(ys), ws / ws.sum(), t


def _tails_squared(kernel, dim: int, side: float) -> np.ndarray:
    """(2, M + 1): the lines' mean squared error bound of interpolation
    (row 0) and of its derivative (row 1) at n = 0..M nodes, boxes of side
    `side` (float64; kernel parameters concrete)."""
    x, y, weight, t = _lines(dim)
    r = side * np.sqrt(np.sum((x[:, None, :] - y) ** 2, axis=-1))      # (L, M)
    f = _radial(kernel, r)[0]
    c = np.abs(f @ t.T) * (2.0 / _LINE_POINTS)
    c[:, 0] /= 2
    # Coefficients at float64 rounding level are noise, not truncation: the
    # order cannot lower them (float64's own floor is separate).
    c[c < _NOISE * np.max(np.abs(f), axis=1, keepdims=True)] = 0.0
    k2 = np.arange(_LINE_POINTS) ** 2
    out = np.zeros((2, _LINE_POINTS + 1))
    for row, coef in enumerate((c, c * k2 * (2.0 / side))):
        tail = 2 * np.cumsum(coef[:, ::-1], axis=1)[:, ::-1]           # n = 0..M-1
        out[row, :-1] = weight @ (tail * tail)
    return out


# The relative error's denominator is |phi| for the charges of the call,
# which the plan does not know. For random mixed-sign charges |phi|^2 =
# sum_i s_i^2 z_i^2 over the singular values s_i of the pair matrix K(|y -
# x|), z_i about standard normal: where a few smooth modes dominate (kernels
# that grow with r: Linear, thin-plate, multiquadrics) one draw in a
# thousand gives |phi| 3-4x below its mean (and charges summing to zero
# remove the largest mode outright). The estimate divides by that lower
# quantile of |phi|^2, not its mean.
_QUANTILE = 1e-3
_GRAM_POINTS = 256
_MODES = 24


def _low_quantile(gram: np.ndarray) -> float:
    """The _QUANTILE quantile of sum_i p_i z_i^2 (z_i standard normal, p_i
    the eigenvalues of the Gram matrix M^T M of a pair matrix M) over its
    mean sum_i p_i: the largest _MODES terms drawn, the rest at their mean
    (fixed draws: a deterministic factor in (0, 1])."""
    total = float(np.trace(gram))
    if not total > 0:
        return 1.0
    top = np.clip(np.linalg.eigvalsh(gram)[::-1][:_MODES], 0.0, None)
    rest = max(total - top.sum(), 0.0)
    return float(np.quantile(_chi_draws()[:, :top.size] @ top + rest, _QUANTILE) / total)


@functools.lru_cache(maxsize=None)
def _chi_draws() -> np.ndarray:
    """(20000, _MODES) squares of fixed standard normal draws."""
    return np.random.default_rng(0).standard_normal((20000, _MODES)) ** 2


@functools.partial(jax.jit, static_argnames=("chunk",))
def square_sums(kernel, sources, targets, chunk: int = 4096):
    """(2,) mean over targets of sum over sources of K(r)^2 and K'(r)^2
    (a pair at r = 0 adds K(0)^2 where the kernel is smooth, nothing where
    it is singular), over chunks of sources."""
    n, d = sources.shape
    pad = -n % chunk
    far = jnp.full((pad, d), jnp.inf, sources.dtype)             # masked below
    xs = jnp.concatenate([sources, far]).reshape(-1, chunk, d)

    def body(acc, x):
        r2 = sum((targets[:, None, a] - x[None, :, a]) ** 2 for a in range(d))
        pos = (r2 > 0) & jnp.isfinite(r2)
        k, dk = kernel.value_and_derivative(jnp.sqrt(jnp.where(pos, r2, 1.0)))
        k = jnp.where(pos, k, 0.0 if kernel.singular else kernel.at_zero(r2.dtype))
        k = jnp.where(jnp.isfinite(r2), k, 0.0)
        dk = jnp.where(pos, dk, 0.0)
        return acc + jnp.stack([jnp.sum(k * k), jnp.sum(dk * dk)]), None

    total, _ = jax.lax.scan(body, jnp.zeros(2, targets.dtype), xs)
    return total / targets.shape[0]


# For singular kernels the largest of the targets' phi^2 and |grad phi|^2
# are left out of the mean: a target beside a source (Yukawa(2)'s gradient
# on a sphere) can carry a mean over a few hundred targets alone, far
# above the mean over all of them (measured / estimated 0.16 untrimmed).
TRIMMED = 1 / 32
# The targets (strided) at which the charges' moments are taken.
CHARGE_TARGETS = 256


def _kept(count: int, singular: bool) -> int:
    """How many of `count` targets' squares the moments average (the
    smallest; TRIMMED left out for singular kernels)."""
    return max(1, count - int(TRIMMED * count * singular))


def least_moments(log_moments) -> tuple[float, float] | None:
    """The moments `far_field_error` divides by, for charges rather than
    random ones, from their `log_moments` (2, K): the least over the
    columns that are not all zero; None where all are (floats)."""
    log_m = np.asarray(log_moments, np.float64)
    live = ~np.isposinf(log_m[0])
    if not live.any():
        return None
    return tuple(float(v) for v in np.exp(np.min(log_m[:, live], axis=1)))


def exact_moments(kernel, sources, targets, x: np.ndarray, y: np.ndarray, side: float,
                  dim: int) -> tuple[float, float]:
    """`pair_moments` with the mean K(r)^2 and K'(r)^2 summed over every
    source for the targets `targets` (a few hundred of them), not
    estimated from sample pairs and a uniform density of close pairs (which
    clustered points and a kernel narrower than the root box defeat); the
    lower-quantile factors from the sample pairs (x, y) as there."""
    factors = _quantile_factors(kernel, x, y, side, dim)
    sums = np.asarray(square_sums(kernel, sources, targets), np.float64)
    return tuple(float(f * v) / sources.shape[0] for f, v in zip(factors, sums))


def _quantile_factors(kernel, x: np.ndarray, y: np.ndarray, side: float, dim: int):
    """`_low_quantile` of the pair matrices (K, and K' times the unit
    vectors) between the first _GRAM_POINTS sample sources and targets
    farther apart than side / 8."""
    cut = side / 8
    g = min(_GRAM_POINTS, x.shape[0])
    diff = y[:g, None, :] - x[None, :g, :]                             # (g, g, d)
    r = np.sqrt(np.sum(diff ** 2, axis=-1))
    keep = r > cut
    k, dk = (np.where(keep, np.nan_to_num(v), 0.0)
             for v in _radial(kernel, np.where(keep, r, side)))
    unit = diff / np.where(keep, r, 1.0)[..., None]
    grad = np.moveaxis(dk[..., None] * unit, 2, 1).reshape(g * dim, g)   # (g d, g)
    return [_low_quantile(k.T @ k), _low_quantile(grad.T @ grad)]


def pair_moments(kernel, x: np.ndarray, y: np.ndarray, side: float, dim: int,
                 count: int) -> tuple[float, float]:
    """The lower-quantile mean K(r)^2 and K'(r)^2 over the pairs of `count`
    points, from sample pairs (sources x, targets y: (S, d) float64).

    Pairs farther apart than side / 8 are sampled; their mean is scaled by
    `_low_quantile` of the pair matrices (K, and K' times the unit vectors)
    between the first _GRAM_POINTS sources and targets. Pairs closer than that count as
    for uniform points in a root box of `side`, density S_d r^(d-1) /
    side^d, integrated over a geometric grid of r down to half their mean
    spacing (too few close pairs fall in a sample for a kernel much narrower
    than the box; clustered points have more of them, so this errs low: the
    estimate high; the spacing keeps a singular K'^2 finite)."""
    cut = side / 8
    r2 = np.sum((y - x) ** 2, axis=-1)
    far = np.sqrt(r2[r2 > cut * cut])
    sampled = [float(np.sum(v ** 2)) / r2.shape[0] for v in _radial(kernel, far)]
    factors = _quantile_factors(kernel, x, y, side, dim)
    spacing = 0.5 * side * max(count, 1) ** (-1.0 / dim)
    steps = np.arange(240) / 4.0                      # r from cut down to cut 2^-60
    r = cut * 2.0 ** -steps
    r = r[r >= min(spacing, cut)]
    density = (2 * np.pi if dim == 2 else 4 * np.pi) * r ** dim / side ** dim
    dlog = np.log(2.0) / 4
    close = [float(np.sum(np.nan_to_num(v ** 2) * density) * dlog) for v in _radial(kernel, r)]
    return tuple(f * s + c for f, s, c in zip(factors, sampled, close))


def far_field_error(kernel, dim: int, root_side: float, depth: int,
                    moments: tuple[float, float], cache: dict | None = None,
                    shares: dict | None = None) -> np.ndarray:
    """(2, M + 1): estimated relative L2 errors of phi (row 0) and of its
    gradient (row 1) at n = 0..M nodes per dimension, for a tree of `depth`
    over a root box of side `root_side`; moments from `pair_moments`; cache:
    {side: _tails_squared}, shared between calls; shares: {level: share of
    the source-target pairs translated at that level} where the tree says
    (an adaptive tree's `pair_shares`), else a uniform tree's. Needs
    concrete kernel parameters; evaluates in float64 (call it under
    jax.enable_x64)."""
    cache = {} if cache is None else cache
    if shares is None:
        shares = {level: min(1.0, (6 ** dim - 3 ** dim) / 2 ** (dim * level))
                  for level in range(2, depth + 1)}
    total = np.zeros((2, _LINE_POINTS + 1))
    for level, share in shares.items():
        side = root_side / 2 ** level
        if share <= 0:
            continue
        if side not in cache:
            cache[side] = _tails_squared(kernel, dim, side)
        total += share * (2 * dim) ** 2 * cache[side]
    tiny = np.finfo(float).tiny
    return np.sqrt(total / np.maximum(np.array(moments), tiny)[:, None])


# Order rules per dimension. Where the kernel's parameters are concrete the
# order comes from `far_field_error` for this kernel, these points (or the
# worst root box size, where the points are traced) and the tree's depth:
# the smallest n in [min_order, max_estimated] with phi_ratio err phi <= eps
# and, where the gradient is asked for, gradient_ratio err grad <= eps. The
# ratios bound the measured / estimated errors over every kernel of
# benchmarks/calibrate_chebyshev.py (N = 8,000, float64, uniform, sphere and
# clustered points, the worst of 8 charge draws; docs/BENCHMARKS.md): in 3D
# (n = 4-8) phi 0.04-0.35 (clusters, whose far field is small, far less),
# grad 0.0003-0.071; in 2D (n = 4-14) phi 0.02-0.86, grad 0.003-0.096, both
# largest at n = 13 (float64 gradients below 1e-11 are rounding). The
# gradient's relative error is 20-50x the potential's at the same n: a
# potential alone needs one or two orders fewer. Below RATIO_POINTS points
# a single source-target pair near two boxes' facing corners weighs more
# (its error is fixed, |phi| grows like N): at N = 1,500 (depth 2) phi
# measured up to 2.0 times its estimate, so the ratios grow like 1 / N there.
# max_estimated: 2D saturates near 1e-13 (rounding) by n = 18; in 3D the
# M2L matrices hold 317 k^2 values per level (k of the n^3 multi-indices
# kept: 3.3 GB in float64 at n = 12, k = 1,142; orders above 12 are not
# measured).
#
# Otherwise (traced kernel parameters) the worst-case rule: the relative
# error assumed at n is error_scale * error_rate^n, at least 4x the worst of
# max(err phi, err grad / 10) measured over every kernel (Gaussians of three
# widths, multiquadrics, polyharmonics, Yukawa, Laplace2D), uniform and
# clustered points (benchmarks/accuracy_rbf.py, N = 4,000, float64;
# docs/accuracy_chebyshev_*.md). The worst case is the Gaussian whose width
# is about a box side. 3D orders 8-10 were measured on the seven hardest
# kernels of n = 7. Orders below min_order were not measured.
RULES = {2: dict(error_scale=2.5, error_rate=0.215, min_order=4, max_order=18,
                 max_estimated=18, phi_ratio=1.0, gradient_ratio=0.12),
         3: dict(error_scale=1.0, error_rate=0.25, min_order=4, max_order=10,
                 max_estimated=12, phi_ratio=0.4, gradient_ratio=0.08)}
RATIO_POINTS = 8000
# Where the charges are known (eager calls, plans given charges) the
# estimate divides by their own phi (`log_moments`): no quantile over
# draws, and charges that cancel by construction (zero sum and first
# moments: an RBF interpolant's weights) raise the estimate as much as
# their error, since the far field's error, of high degree in the
# sources, does not cancel with them. Measured / estimated (phi, grad),
# benchmarks/calibrate_chebyshev.py --moment-free (float64, 4 random and 4
# moment-free draws on uniform, sphere and clustered points; errors above
# rounding, 1e-12 and 1e-11; docs/BENCHMARKS.md), random and moment-free
# alike: 3D N = 8,000, n = 4-8, phi 0.07-0.30, grad up to 0.079 (clusters
# below 0.05); 2D N = 8,192, n = 4-12, phi up to 0.50 (Linear, n = 12)
# and grad up to 0.12 (InverseQuadratic(1), clusters, n = 4).
CHARGE_RATIOS = {2: (0.6, 0.15), 3: (0.35, 0.1)}
# Rounding floors of the estimated rule (2D float64 measured: 1e-14 to 2e-13
# at n = 16-18, docs/BENCHMARKS.md). float32's rounding error, like the
# truncation's, is relative to |phi|, which some mixed-sign charges make
# small: Multiquadric(1) on 2,000 points of a sphere measured 5e-7 to 9.1e-6
# over 40 charge draws at n = 6-8 (the absolute error constant) and once
# 1.07e-5, so float32 stops at 2e-5.
ROUNDING_FLOOR = {"float32": 2e-5, "float64": 1e-12}
# The rounding error the truncation's share of eps leaves room for.
ROUNDING_ERROR = {"float32": 1.1e-5, "float64": 0.0}
# float32 gradients. The far field reaches a leaf as its local expansion's
# node values, each rounded relative to phi there, and the interpolant's
# derivative amplifies that rounding by about n^2 / h (h the leaf's side):
# where phi is large against its change over a leaf (kernels flat at the
# leaves' scale, deep trees) rounding, not truncation, sets the gradient's
# error. Measured against eps32 n^2 (root side / h) sqrt(mean K^2 / mean
# K'^2) / root side (the moments with their low-quantile factors), the
# float32 error less the float64 one at the same order: 0.13-0.27 times it
# for InverseMultiquadric(1), 0.4-0.7 for Multiquadric(1.5) and Cubic, 1.1
# for Linear (2D, uniform depths 2-7, and clusters on a 16-level adaptive
# tree: 2.6e-2 at eps 1e-4); 3D, InverseMultiquadric(1) at depths 3-4 of
# 16,384 points 1.8, and the rows of docs/BENCHMARKS.md's "Orders" table
# at 2^20 (depth 4-5, truncation included) 0.7-2.3. The model takes
# ROUNDING_SCALE[d] times it (`gradient_rounding`), added to the truncation's
# estimate in quadrature: a uniform tree takes one level fewer (leaves 2^d
# times fuller) where its depth makes it more than half the budget, and eps
# is out of reach in float32 where it exceeds the budget.
ROUNDING_SCALE = {2: 1.2, 3: 3.0}
# Root box sides tried where the points are traced (the kernel's own length
# scale is unknown): 4^-10 .. 4^10.
_TRACED_SIDES = tuple(4.0 ** k for k in range(-10, 11))


def gradient_rounding(dim: int, n: int, depth: int, side: float, moments) -> float:
    """The float32 rounding error of grad phi at n nodes per dimension on
    a tree `depth` levels deep over a `dim`-dimensional root box of `side` (see
    ROUNDING_SCALE); moments: (mean K^2, mean K'^2) over the pairs."""
    flat = np.sqrt(moments[0] / max(moments[1], np.finfo(float).tiny))
    unit = np.finfo(np.float32).eps * n * n * 2.0 ** depth * flat / side
    return ROUNDING_SCALE[dim] * float(unit)


_LOG_ZERO = -1000.0


class ChargeCheck(NamedTuple):
    """The error estimate of a chosen order, kept for a check of the
    charges it sums (`passes`): where they cancel more than those it was
    chosen for (unknown charges: random ones), the estimate with their own
    moments (`log_moments`, CHARGE_RATIOS) may exceed eps. Per root box
    side (one for concrete points; _TRACED_SIDES for traced ones, between
    which the check interpolates in log side), in logs: num (phi, grad),
    the estimate times sqrt of the moments it divides by; accepted, the
    estimate the order was chosen with (for the charges assumed); static,
    phi's moment of random charges, which float32's rounding error
    (`rounding`) is relative to; noise: float32 gradients' rounding
    (`gradient_rounding`). Floats in a `Config` (hashable); the sums take
    it as arrays (a pytree: `arrays`), so that its values are no static
    argument of jit."""
    log_sides: tuple
    log_num: tuple          # (sides,) of (phi, grad)
    log_accepted: tuple     # (sides,) of (phi, grad)
    log_static: tuple       # (sides,)
    rounding: float
    noise: float

    @classmethod
    def of(cls, sides, err, moments, static, ratios, ratio_charged, rounding,
           noise) -> ChargeCheck:
        """err (sides, 2): estimates at the chosen order, for the moments
        (sides of (phi, grad)) with the ratios they were chosen with;
        static: random charges' moments per side."""
        with np.errstate(divide="ignore"):
            static = np.log([m[0] for m in static])
            num = np.log(np.asarray(ratio_charged) * err * np.sqrt(np.asarray(moments)))
            accepted = np.log(np.asarray(ratios) * err)
        # -inf (no far field, or no gradient asked) as a finite floor: interpolated
        # between sides it would give NaN
        rows = lambda a: tuple(tuple(max(float(v), _LOG_ZERO) for v in r) for r in a)  # noqa: E731
        return cls(tuple(float(np.log(s)) for s in sides), rows(num), rows(accepted),
                   tuple(max(float(v), _LOG_ZERO) for v in static), float(rounding),
                   float(noise))

    def arrays(self) -> ChargeCheck:
        """The same check with arrays for fields."""
        return ChargeCheck(*(jax.device_put(np.asarray(v, jnp.result_type(float)))
                             for v in self))

    def passes(self, eps: float, side, log_moments):
        """(2, K) bool: whether the estimate for charges with these moments
        (`log_moments`, (2, K)) keeps phi's (row 0) and grad phi's
        (row 1) errors within eps, or within what the order was chosen for
        (it may stand above eps where a traced call's order is capped by
        the worst-case rule). side: the tree's root side (jit-able)."""
        def at(table):
            table = jnp.asarray(table, log_moments.dtype)
            if table.shape[0] == 1:
                return table[0]
            x = jnp.log(side).astype(table.dtype)
            xp = jnp.asarray(self.log_sides, table.dtype)
            if table.ndim == 1:
                return jnp.interp(x, xp, table)
            return jnp.stack([jnp.interp(x, xp, c) for c in table.T])

        log_m = log_moments
        num = at(self.log_num)[:, None]
        # no far field (num at the floor): no error, whatever the moments
        pred = jnp.where(num > _LOG_ZERO, jnp.exp(num - 0.5 * log_m), 0.0)  # (2, K)
        accepted = jnp.exp(at(self.log_accepted))                            # (2,)
        # float32's rounding grows by the charges' cancellation against random ones'
        cancel = jnp.exp(0.5 * (log_m[0] - at(self.log_static)))
        budget = jnp.where(self.rounding > 0, eps - self.rounding / jnp.minimum(1.0, cancel),
                           eps)
        ok_phi = pred[0] <= jnp.maximum(budget, accepted[0])
        ok_grad = (jnp.hypot(pred[1], self.noise)
                   <= jnp.maximum(budget, jnp.hypot(accepted[1], self.noise)))
        return jnp.stack([ok_phi, ok_grad])


def log_moments(kernel, phi, grad, charges):
    """(2, K): logs of the moments the estimate divides by for charges (N,
    K) rather than random ones, per column: mean phi^2 and |grad phi|^2
    over a few hundred targets (the sums there, phi (T, K) and grad (T, K,
    d); None: row 1 is 0; for singular kernels the largest TRIMMED of each
    left out) over N mean q^2; inf for a column of zero charges (its sums
    are exact). Each column scaled to its largest value first, so that no
    square underflows (jit-able)."""
    def log_sum_squares(x, keep=None):
        x = jnp.abs(x)
        top = jnp.max(x, axis=0)
        top = jnp.where(top > 0, top, 1.0)
        sq = (x / top) ** 2
        if keep is not None:
            sq = jnp.sort(sq, axis=0)[:keep]
        return jnp.log(jnp.sum(sq, axis=0)) + 2 * jnp.log(top)

    keep = _kept(phi.shape[0], kernel.singular)
    power = log_sum_squares(charges)
    out = [log_sum_squares(phi, keep) - jnp.log(keep) - power]
    if grad is None:
        out.append(jnp.zeros_like(out[0]))
    else:
        g = jnp.sqrt(jnp.sum(grad ** 2, axis=-1))
        out.append(log_sum_squares(g, keep) - jnp.log(keep) - power)
    return jnp.where(jnp.isneginf(power), jnp.inf, jnp.stack(out))


def _float64():
    """A context in which jnp computes in float64 (jax.enable_x64 here,
    jax.experimental.enable_x64 in releases without it)."""
    ctx = getattr(jax, "enable_x64", None)
    if ctx is None:
        from jax.experimental import enable_x64 as ctx
    return ctx(True)


def _model_pairs(dim: int, count: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """`count` sample pairs (x, y) of uniform points in the unit cube."""
    rng = np.random.default_rng(0)
    return rng.random((count, dim)), rng.random((count, dim))


def _traced_moments(kernel, dim: int, count: int) -> list:
    """`pair_moments` of uniform points in root boxes of sides _TRACED_SIDES
    (float64), remembered for hashable kernels: every trace of a jitted
    call with traced points asks again, and the 21 Gram matrices take
    about 0.3 s."""
    try:
        return _remembered_traced_moments(kernel, dim, count)
    except TypeError:                   # array-valued parameters
        return _remembered_traced_moments.__wrapped__(kernel, dim, count)


@functools.lru_cache(maxsize=64)
def _remembered_traced_moments(kernel, dim: int, count: int) -> list:
    x, y = _model_pairs(dim)
    return [pair_moments(kernel, x * s, y * s, s, dim, count) for s in _TRACED_SIDES]


class Rule:
    """The order rules of the Chebyshev family in `dim` dimensions.

    `order_for` chooses n from an error estimate for the kernel and points;
    `order` is the worst-case rule (`RULES`) used where the kernel's
    parameters are traced.
    """

    def __init__(self, dim: int, error_scale: float, error_rate: float, min_order: int,
                 max_order: int, max_estimated: int, phi_ratio: float, gradient_ratio: float):
        self.dim = dim
        self.phi_ratio, self.gradient_ratio = phi_ratio, gradient_ratio
        self.error_scale, self.error_rate = error_scale, error_rate
        self.MAX_ORDER = max(max_order, max_estimated)
        self.ORDERS = tuple(range(min_order, max_order + 1))
        self.ESTIMATED_ORDERS = tuple(range(min_order, max_estimated + 1))

    def _error_bound(self, n: int) -> float:
        return self.error_scale * self.error_rate ** n

    @property
    def EPS_FLOOR(self):
        """The worst-case rule's floor (`order_for` may reach further)."""
        worst = self._error_bound(self.ORDERS[-1])
        return {"float32": max(ROUNDING_FLOOR["float32"], worst), "float64": worst}

    def order(self, eps: float, dtype, points: float | None = None) -> int:
        """Nodes per dimension n for a relative L2 error eps by the
        worst-case rule (ValueError if eps is below what dtype or the
        largest n reaches)."""
        return choose_order(eps, dtype, self.EPS_FLOOR, self.ORDERS, self._error_bound,
                                  f"the {self.dim}D Chebyshev family")

    def order_for(self, eps: float, dtype, kernel, depth_of, root_side=None,
                  pairs=None, gradient: bool = True, count: int = 1, shares=None,
                  moments=None, charged=None) -> tuple[int, int | None, ChargeCheck]:
        """n for a relative L2 error eps from `far_field_error`: the
        smallest n whose estimates, phi_ratio err phi and (gradient)
        gradient_ratio err grad, are <= eps less the dtype's rounding error.

        kernel: concrete parameters; depth_of(n): the tree depth at n;
        count: the points' number (the larger of sources and targets);
        root_side and pairs (sample pairs of the points: sources and
        targets, (S, d) each): None where the points are traced, and then
        the worst of uniform points in root boxes of sides _TRACED_SIDES;
        shares: an adaptive tree's (`far_field_error`; concrete points
        only), which then stands for depth_of; moments: `exact_moments`
        where the caller has them (else `pair_moments` of the pairs);
        charged: `least_moments` of the charges to be summed (concrete
        points only), which then stand for the moments, with
        CHARGE_RATIOS, and scale float32's rounding error (`ROUNDING_ERROR`
        is relative to phi of random charges: charges that cancel leave
        it larger against their phi).
        Returns (n, depth, check): depth None where the tree's stands, else
        the uniform tree's depth for float32 gradients (`gradient_rounding`);
        check: the estimate at n, for the sums' check of their charges
        (`ChargeCheck`).
        ValueError if no n reaches eps, or eps is below the dtype's
        ROUNDING_FLOOR.
        """
        check_floor(eps, dtype, ROUNDING_FLOOR, f"the {self.dim}D Chebyshev family")
        # Traced points: their scale, which the rounding depends on, is unknown.
        rounds = gradient and jnp.dtype(dtype) == jnp.float32 and root_side is not None
        charged = None if root_side is None else charged
        few = max(1.0, RATIO_POINTS / max(count, 1))
        ratio = (self.phi_ratio, self.gradient_ratio) if charged is None else \
            CHARGE_RATIOS[self.dim]
        ratios = few * ratio[0], few * ratio[1] * gradient
        charge_ratio = CHARGE_RATIOS[self.dim]
        ratio_charged = few * charge_ratio[0], few * charge_ratio[1] * gradient
        if root_side is None:
            # The worst over box sizes; no more than the worst-case rule's n.
            try:
                cap = self.order(eps, dtype)
            except ValueError:
                cap = None
            sides = _TRACED_SIDES
        else:
            sides = (float(root_side),)
        with _float64(), jax.ensure_compile_time_eval():
            if moments is not None:
                moments = [moments]
            elif root_side is None:
                moments = _traced_moments(kernel, self.dim, count)
            else:
                moments = [pair_moments(kernel, *(np.asarray(v, np.float64) for v in pairs),
                                        sides[0], self.dim, count)]
            rounding_error = ROUNDING_ERROR[jnp.dtype(dtype).name]
            static = moments                 # the gradient's rounding was measured on them
            if charged is not None:
                cancel = np.sqrt(max(charged[0], 1e-300) / moments[0][0])
                rounding_error /= min(1.0, cancel)
                moments = [charged]
                if rounding_error >= eps:
                    raise Unreachable(
                        f"eps={eps:g} is below what {jnp.dtype(dtype).name} reaches for "
                        f"{kernel} with these charges: they cancel in phi (about {cancel:.1g} "
                        f"times random charges' of the same size), and rounding alone errs "
                        f"about {rounding_error:.1e} relative to it; use float64 inputs with "
                        f"jax_enable_x64 or a larger eps", rounding_error)
            budget = eps - rounding_error
            per_side, cache = {}, {}
            best = reach = rounded = None

            def rounding(n, depth):
                return max(gradient_rounding(self.dim, n, depth, s, m)
                           for s, m in zip(sides, static))

            def estimates(depth):           # (sides, 2, M + 1)
                if depth not in per_side:
                    per_side[depth] = np.array([far_field_error(kernel, self.dim, s, depth, m,
                                                                cache, shares)
                                                for s, m in zip(sides, moments)])
                return per_side[depth]

            def chosen(n, depth, fewer, noise):
                check = ChargeCheck.of(sides, estimates(fewer)[:, :, n], moments, static,
                                       ratios, ratio_charged,
                                       ROUNDING_ERROR[jnp.dtype(dtype).name], noise)
                return n, (None if fewer == depth else fewer), check

            for n in self.ESTIMATED_ORDERS:
                depth = fewer = depth_of(n) if shares is None else None
                if rounds and shares is None and rounding(n, depth) > budget / 2:
                    fewer = depth - 1
                # an adaptive tree's leaves reach its deepest translated level
                deepest = fewer if shares is None else max(shares, default=0)
                noise = rounding(n, deepest) if rounds else 0.0
                rounded = noise                             # at the highest order tried
                err = estimates(fewer).max(axis=0)[:, n]
                grad = np.hypot(ratios[1] * err[1], noise)
                if max(ratios[0] * err[0], grad) <= budget:
                    if root_side is None and cap is not None and cap < n:
                        n, depth = cap, depth_of(cap)      # traced points: fewer is depth
                        fewer = depth
                    return chosen(n, depth, fewer, noise)
                if root_side is None and n == cap:
                    return chosen(n, depth, fewer, noise)
                best = err[0] if best is None else min(best, err[0])
                need = max(ratios[0] * err[0], grad) + eps - budget
                reach = need if reach is None else min(reach, need)
        if rounded is not None and rounded > budget / 4:
            raise Unreachable(
                f"eps={eps:g} is below what float32 gradients of the {self.dim}D Chebyshev "
                f"family reach for {kernel} on a tree this deep (about {reach:.1e}): the far "
                f"field's rounding grows with the order and the depth where the kernel is "
                f"flat over the leaves; use float64 inputs with jax_enable_x64, a larger eps "
                f"or larger leaves", reach)
        raise Unreachable(f"eps={eps:g} is below what the {self.dim}D Chebyshev family "
                          f"reaches for {kernel} on these points (estimated error {best:.1e} "
                          f"at n = {self.ESTIMATED_ORDERS[-1]}); use a larger eps", reach)

    def leaf_size(self, n: int) -> int:
        """Mean points per leaf s that balances, per leaf, the near field's
        3^d s^2 pair terms against M2L's 2 L P^2 flops (L = 189 or 27
        translations): s = P sqrt(2 L / (3^d r)), with r = 40 flops of GEMM
        per pair term (H200: 7e11 pairs/s against 3e13 flop/s)."""
        translations = 6 ** self.dim - 3 ** self.dim      # an interior box's list
        share = (2 * translations / (3 ** self.dim * 40)) ** 0.5
        return max(32, int(share * n ** self.dim))


@functools.lru_cache(maxsize=None)
def rule(dim: int) -> Rule:
    return Rule(dim, **RULES[dim])


def choose(kernel, eps: float, dtype, points: Points, order: int | None = None,
           gradient: bool = True) -> Choice:
    """n from the error estimate where the kernel's parameters are concrete
    (for these points, or the worst root box size where they are traced;
    the gradient's error within eps too where `gradient`), else from the
    worst-case rule (both); or `order`, range-checked."""
    r = rule(points.dim)
    n = checked_order(order, r.MAX_ORDER)
    if n is None and kernel.is_concrete():
        sample = points.sample
        side, pairs = (None, None) if sample is None else (sample.side, (sample.x, sample.y))
        shares = moments = None
        if points.shares is not None:       # an adaptive tree's root, shares and moments
            side, shares, moments = points.shares
        n, depth, check = r.order_for(eps, dtype, kernel,
                                      lambda k: depth_for(points, r.leaf_size(k)), side, pairs,
                                      gradient, max(points.n_src, points.n_tgt), shares,
                                      moments, points.charged)
        return Choice(n, depth_for(points, r.leaf_size(n)) if depth is None else depth, check)
    elif n is None:
        try:
            n = r.order(eps, dtype)
        except ValueError as e:
            raise ValueError(
                f"{e} for kernels whose parameters are traced (inside jax.jit or vmap, "
                f"where their values cannot choose the order): pass order= (nodes per "
                f"dimension, up to {r.MAX_ORDER}), or call outside jit (jax.grad outside "
                f"jit chooses by the parameters' values), or use a larger eps") from None
    return Choice(n, depth_for(points, r.leaf_size(n)))
