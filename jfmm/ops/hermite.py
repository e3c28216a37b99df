"""The fast Gauss transform (Greengard and Strain 1991) on one grid level.

For K(r) = exp(-(epsilon r)^2), in scaled coordinates (epsilon times
lengths) the kernel factors over axes, and per axis (../shared/REFERENCES.md,
seed 001, with its errata applied)

    P2H   A_a  = sum_j q_j s_j^a / a!                  s = scaled source - box centre
    H2L   C_b  = ((-1)^b / b!) sum_a A_a h_(a+b)(D)     D = scaled target centre - source centre
    L2P   phi  = sum_b C_b t^b                          t = scaled target - box centre

with the Hermite functions h_n(x) = exp(-x^2) H_n(x); in d dimensions the
multi-indices a, b < p per axis (p^d coefficients) and every operator is a
tensor product. Unlike the FMM, every pair of boxes interacts through the
expansions (the Gaussian is entire: the series converge at any distance,
fast where the scaled box side rho = epsilon h is about 1 or less), so there
is no near field and no tree of levels: one grid of n = 2^L boxes per axis.

The H2L of all box pairs is a tensor product too: along each axis it is one
dense (n p, n p) matrix [i, b; j, a] acting on the (box, coefficient) pair
of that axis, so the whole translation is d matrix products of
(n p)^2 n^(d-1) p^(d-1) K terms, with no distance cutoff (tiny Hermite
functions at large D are exact zeros, not errors).

`GaussTransform.plan` chooses (L, p) from an error estimate for the points
(float64, numpy) and a cost model. The operators are built from epsilon in
the traced computation, so derivatives with respect to epsilon flow.

Numerics: h_n grows like sqrt(2^n n!), so the translation uses the
normalised functions g_n = h_n / sqrt(2^n n!) (bounded by about 1) and the
constant c_ab = sqrt(2^(a+b) (a+b)!) / (a! b!), built in float64.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jfmm.ops import tensor
from jfmm.tree import morton

HIGHEST = jax.lax.Precision.HIGHEST


def normalized_hermite(x, count: int):
    """g_k(x) = exp(-x^2) H_k(x) / sqrt(2^k k!) for k < count: (count,) + x.shape.

    Works on numpy (float64) and jnp arrays alike; the recurrence
    g_(k+1) = (sqrt(2) x g_k - sqrt(k) g_(k-1)) / sqrt(k + 1) is stable."""
    xp = np if isinstance(x, np.ndarray) else jnp
    g = [xp.exp(-x * x)]
    if count > 1:
        g.append(math.sqrt(2.0) * x * g[0])
    for k in range(1, count - 1):
        g.append((math.sqrt(2.0) * x * g[k] - math.sqrt(k) * g[k - 1]) / math.sqrt(k + 1))
    return xp.stack(g[:count])


@functools.lru_cache(maxsize=None)
def _coupling(p: int) -> np.ndarray:
    """(p, p) float64: [b, a] = (-1)^b sqrt(2^(a+b) (a+b)!) / (a! b!)."""
    a = np.arange(p)
    s = a[:, None] + a[None, :]
    lg = (0.5 * (s * math.log(2.0) + _lgamma(s + 1)) - _lgamma(a[:, None] + 1)
          - _lgamma(a[None, :] + 1))
    return (-1.0) ** a[:, None] * np.exp(lg)


def _lgamma(k):
    return np.vectorize(math.lgamma)(k.astype(float))


def axis_operator(rho, n: int, p: int, dtype):
    """The H2L of one axis: (n p, n p), rows (target box i, b), columns
    (source box j, a), for boxes of scaled side rho (traced) on a line of n."""
    i = np.arange(n)
    d = (i[:, None] - i[None, :]).astype(np.float64)                    # (n, n)
    g = normalized_hermite(rho * jnp.asarray(d, dtype), 2 * p - 1)      # (2p-1, n, n)
    idx = np.arange(p)[:, None] + np.arange(p)[None, :]                 # (b, a)
    t = g[idx] * jnp.asarray(_coupling(p), dtype)[:, :, None, None]     # (b, a, i, j)
    return jnp.transpose(t, (2, 0, 3, 1)).reshape(n * p, n * p)


@functools.lru_cache(maxsize=None)
def grid_order(level: int, dim: int) -> np.ndarray:
    """(n^d,) Morton index of each box of the level, boxes in row-major
    order of their integer coordinates (axis 0 slowest)."""
    n = 2 ** level
    coords = np.stack(np.meshgrid(*([np.arange(n)] * dim), indexing="ij"), -1).reshape(-1, dim)
    with jax.ensure_compile_time_eval():
        return np.asarray(morton.encode(jnp.asarray(coords, jnp.int32), level))


def _powers(x, p: int, derivative: bool = False):
    """x^a (..., p) for a < p; with derivative, also a x^(a-1)."""
    pw = [jnp.ones_like(x)]
    for _ in range(1, p):
        pw.append(pw[-1] * x)
    out = jnp.stack(pw, axis=-1)
    if not derivative:
        return out
    dpw = [jnp.zeros_like(x)] + [a * pw[a - 1] for a in range(1, p)]
    return out, jnp.stack(dpw, axis=-1)


# ---------------------------------------------------------------- the plan
#
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
GRADIENT_SLACK = 5.0       # the gradient's estimate is held to 5 eps / margin
# float32: rounding of the moment sums and translations, with mixed-sign
# charges whose sum cancels, measured up to 8e-6 beyond the truncation error
# (3D, Gaussian(0.3) over clusters spanning 20 units, 1,500 points: 1.09e-5
# at eps 1e-5 with a truncation error of 3.0e-6 in float64); so eps >= 2e-5.
ROUNDING_FLOOR = {"float32": 2e-5, "float64": 1e-12}
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


class Sample(NamedTuple):
    """Concrete points' root box and sample pairs (float64 numpy)."""
    lo: np.ndarray        # (d,)
    side: float
    x: np.ndarray         # (S, d) sources of the sample pairs
    y: np.ndarray         # (S, d) their targets


class Choice(NamedTuple):
    level: int
    order: int
    error: float          # estimated relative error of phi
    cost: float


class GaussTransform:
    """The fast Gauss transform family in `dim` dimensions (Gaussian only)."""

    NAME = "hermite"
    SCHEME = "grid"          # moments on one grid level to local series; no near field
    MAX_ORDER = MAX_ORDER

    def __init__(self, dim: int):
        self.dim = dim

    def __repr__(self):
        return f"GaussTransform(dim={self.dim})"

    # -------------------------------------------------------------- choice
    def plan(self, eps: float, dtype, epsilon: float, sample: Sample, n_points: int,
             order: int | None = None) -> Choice | None:
        """The cheapest (level L, order p) whose estimated errors meet eps:
        max(err phi, err grad / GRADIENT_SLACK) <= eps / ESTIMATE_MARGIN,
        with n^d p^d <= GRID_VALUES. With `order`, that p only. None if no
        (L, p) does (the caller falls back to another family); ValueError
        for an eps below the dtype's rounding floor.

        Cost model (H200-like): the points' P2H and L2P move 16 p^d bytes
        each, the grid passes 16 d (n p)^d bytes, the d matrix products
        2 d n^(d+1) p^(d+1) flops at 7.5 flops per byte."""
        name = jnp.dtype(dtype).name
        if eps < ROUNDING_FLOOR[name]:
            hint = "; use float64 inputs with jax_enable_x64" if name == "float32" else ""
            raise ValueError(f"eps={eps:g} is below what the fast Gauss transform reaches in "
                             f"{name} (about {ROUNDING_FLOOR[name]:.1e}){hint}")
        d = self.dim
        epsilon = abs(float(epsilon))
        best = None
        for level in range(morton.MAX_DEPTH[d] + 1):
            n = 2 ** level
            p_cap = MAX_ORDER if order is None else order
            while p_cap > 0 and (n * p_cap) ** d > GRID_VALUES:
                p_cap -= 1
            if p_cap < (1 if order is None else order):
                break
            rho = epsilon * sample.side / n
            if rho > MAX_RHO:
                continue
            err = np.maximum(_model_errors(rho, n, d, p_cap),
                             _pair_errors(sample.x[:PAIRS], sample.y[:PAIRS], sample.lo,
                                          sample.side, level, epsilon, p_cap))
            err = np.sqrt(err)                                # (2, p_cap), orders 1..p_cap
            ok = np.maximum(err[0], err[1] / GRADIENT_SLACK) * ESTIMATE_MARGIN <= eps
            if order is not None:
                ok[:order - 1] = False
            if not ok.any():
                continue
            p = int(np.argmax(ok)) + 1
            cost = (16 * n_points * p ** d + 16 * d * (n * p) ** d
                    + 2 * d * n ** (d + 1) * p ** (d + 1) / 7.5)
            if best is None or cost < best.cost:
                best = Choice(level, p, float(err[0, p - 1]), float(cost))
        return best

    # -------------------------------------------------------------- operators
    def operators(self, p: int, m2l_offsets, dtype):
        """None: every operator is built from epsilon in the evaluation."""
        return None

    def p2m(self, u, q, p: int):
        """(N, K, p^d) per-source moments q s^a at scaled offsets u (N, d)
        from their box centres (the 1 / a! of A_a is in `axis_operator`)."""
        mono = tensor.product([_powers(u[:, a], p) for a in range(u.shape[1])])
        return q[:, :, None] * mono[:, None, :]

    def h2l(self, herm, rho, level: int, p: int):
        """Taylor coefficients (B, K, p^d) of every box from the Hermite
        moments (B, K, p^d) of every box (Morton order), boxes of scaled
        side rho: d products with `axis_operator`."""
        d, n = self.dim, 2 ** level
        k = herm.shape[1]
        order = grid_order(level, d)
        g = herm[order].reshape((n,) * d + (k,) + (p,) * d)
        op = axis_operator(rho, n, p, herm.dtype)
        for a in range(d):
            g = jnp.moveaxis(g, (a, d + 1 + a), (0, 1))
            shape = g.shape
            g = jnp.dot(op, g.reshape(n * p, -1), precision=HIGHEST).reshape(shape)
            g = jnp.moveaxis(g, (0, 1), (a, d + 1 + a))
        out = g.reshape(n ** d, k, p ** d)
        return jnp.zeros_like(out).at[order].set(out, unique_indices=True)

    def l2p_coefficients(self, loc, p: int, gradient: bool):
        return loc[:, :, None, :]

    def l2p(self, u, coef, h, p: int, gradient: bool):
        """phi (M, K) and grad (M, K, d) from per-target Taylor coefficients
        coef (M, K, 1, p^d) at scaled offsets u (M, d); h: the length unit
        of u (1 / epsilon)."""
        pairs = [_powers(u[:, a], p, derivative=True) if gradient
                 else (_powers(u[:, a], p), None) for a in range(self.dim)]
        return tensor.evaluate(coef[:, :, 0, :], pairs, h, gradient)
