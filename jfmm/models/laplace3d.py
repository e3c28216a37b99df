"""The 3D Laplace family's error model: the order for eps, the leaf size."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jfmm.models import Choice, Points, choose_order, series_choice, strided
from jfmm.tree import root_box
from jfmm.tree.uniform import leaf_coords


# Typical relative L2 error of the potential per order p (float64, N = 20,000,
# worst of uniform cube, sphere surface and clusters, default leaf size;
# docs/BENCHMARKS.md), used with margins for larger N (more levels) and
# float32 rounding (below); points that crowd the tree's leaves err less
# (`far_factor`).
_MEASURED = {3: 4.2e-3, 4: 1.4e-3, 5: 4.3e-4, 6: 1.5e-4, 7: 5.4e-5, 8: 2.1e-5, 9: 8.5e-6,
             10: 3.4e-6, 11: 1.6e-6, 12: 6.7e-7, 14: 1.2e-7, 16: 3.0e-8, 18: 7.4e-9,
             20: 2.2e-9, 22: 5.7e-10, 24: 1.8e-10, 26: 7.3e-11, 28: 2.9e-11, 30: 9.6e-12}
# odd orders above 12 between their neighbours (the error falls geometrically)
_ERROR_BY_ORDER = {**_MEASURED, **{p: (_MEASURED[p - 1] * _MEASURED[p + 1]) ** 0.5
                                   for p in range(13, 30, 2)}}
# Measured over typical errors on uniform points, the worst case: phi 1.7 at
# N = 16,384 (p = 14) and 1.8-1.9 at 2^20 (p = 8, 11, 14; float32 and
# float64, H100), grad over 2.5 typical 2.7-2.8 at 2^20 (p = 12, 16): the
# margins 2.5 and 4 (docs/BENCHMARKS.md, "Calibration").
_SAFETY, _GRADIENT_SAFETY = 2.5, 4.0
# Adaptive trees translate over more levels: phi measured 2.5-2.7x typical
# there (H200, 2^20 points: Plummer 9.05e-6 at p = 10, 7.4e-7 at p = 13;
# clusters 1.65e-6 at p = 12, H100), so their potential's margin is 3.75.
_ADAPTIVE_SAFETY = 3.75
# The typical error falls about 0.58x per order, but a rare source-target pair
# near the facing corners of boxes one box apart converges only about 0.69x
# per order (the worst case is 0.87x). In small sets one such pair sets the
# whole error: a uniform cube of 3,000 points (1 draw in several hundred)
# measured 1.7e-8, 2.6e-9, 3.9e-10, 9.1e-11 and 4.1e-11 at p = 20, 25, 30, 34
# and 36, 40x the typical error at p = 30. The rule also keeps twice that
# measured tail below eps, which is what sets p from p = 18 on.
# One such pair adds a fixed error at one target while ||phi|| grows like
# sqrt(N M) (N sources, M targets), so below the 3,000 points it was measured
# at the tail is scaled by 3,000 / sqrt(N M): a CI draw of 500 points at eps
# 1e-7 (p = 18, depth 2) measured 2.4e-7, and 1.0e-7 / 2.2e-8 at p = 20 / 22.
# Above 3,000 points such pairs sit at many targets and their errors add in
# quadrature against ||phi||, so the tail falls like 1 / sqrt(sqrt(N M)):
# at 2^20 float64, eps 1e-8 and 1e-10 then take p = 22 and 30 (were 24 and
# 36), measured phi 4.2e-10 and 5.4e-11, grad 8.5e-9 and 8.4e-11.
_TAIL_P30, _TAIL_RATE, _TAIL_MARGIN, _TAIL_POINTS = 3.9e-10, 0.69, 2.0, 3000
# The gradient's typical relative error is about 3x the potential's at large
# N (H100, 2^20 uniform float32: 1.14e-4 against 3.9e-5 at p = 8, 4.9e-5
# against 1.5e-5 at p = 9, 4.6e-6 against 1.6e-6 at p = 12; about equal at
# 20,000 points); with the margin, 2.5 keeps it within eps. Below the
# 3,000 points the tail was measured at, the gradient's tail is 2.5x too:
# 200 sources on a sphere and 100 targets in the cube (CPU, 4 draws)
# measured grad 0.2-1.2e-4 at p = 9, which eps 1e-4 took without it.
_GRADIENT_FACTOR = 2.5
# On adaptive trees of small sets one target beside a dense cluster can carry
# the gradient's error (it sees the cluster's many sources as one heavy one):
# 2,001 sources, half in a cluster, and 1,001 targets on a sphere (CPU,
# float64, 19 draws) measured grad up to 25-44x typical at p = 12-18 (one
# target 60-90% of the squared error); the uniform tree 4x there. It falls
# with the order like the typical error and with the set's size like the
# tail: 30x typical at 3,000 points.
_ADAPTIVE_GRADIENT = 30.0
ORDERS = tuple(sorted(_ERROR_BY_ORDER)) + (32, 34, 36)
MAX_ORDER = ORDERS[-1]


def _error_bound(p: int, points: float | None = None, gradient: bool = False,
                 adaptive: bool = False) -> float:
    """The error the order rule assumes at order p (typical and tail, with
    margins) for sqrt(N M) = points (None: the 3,000-point tail, a bound for
    any larger set), of phi or (also) of its gradient, on a uniform or an
    adaptive tree."""
    # above 3,000 points such pairs sit at many targets
    scale = 1.0 if points is None else (_TAIL_POINTS / points) ** (1.0 if points < _TAIL_POINTS
                                                                     else 0.5)
    tail = _TAIL_MARGIN * _TAIL_P30 * _TAIL_RATE ** (p - 30) * scale
    if gradient and points is not None and points < _TAIL_POINTS:
        tail *= _GRADIENT_FACTOR
    typical = _ERROR_BY_ORDER.get(p, 0.0)
    bound = (_ADAPTIVE_SAFETY if adaptive else _SAFETY) * typical
    if gradient:
        bound = max(bound, _GRADIENT_SAFETY * _GRADIENT_FACTOR * typical)
    if gradient and adaptive:
        bound = max(bound, _ADAPTIVE_GRADIENT * scale * typical)
    return max(bound, tail)


# float32 rounding sets a floor near 4e-7 for phi (measured) and 1-2e-6 for
# grad phi (2^20 points): 3e-6.
EPS_FLOOR = {"float32": 3e-6, "float64": _error_bound(MAX_ORDER)}


def leaf_size(p: int) -> int:
    """Mean points per leaf that balances near-field and M2L work at order p
    (P2P ~ 27 s^2 pair terms per leaf against ~189 p^4 M2L terms). Measured
    at p = 11, 32 points per leaf beat 256 on both backends: 9.6 against
    12.6 ms at N = 2^20 on an H200, 4.3 against 8.5 s at N = 2^17 on a
    2-core CPU; 0.5 p^2 picks the former there. Odd orders above 12 take
    the next even order's leaves, the depths those were measured at (p = 13
    with its own took depth 5 at 2^20 points, float64: 16.1 ms against
    14.6 at p = 14, depth 4; H200)."""
    q = p + p % 2 if p > 12 else p
    return max(32, int(0.5 * q * q))


def order_for_eps(eps: float, dtype, points: float | None = None, gradient: bool = False,
                  far: float = 1.0, adaptive: bool = False) -> int:
    """Expansion order p for a requested relative L2 error eps of phi (and,
    with gradient, of grad phi), for N sources and M targets with
    sqrt(N M) = points (None: large sets); far: the factor on the error
    where the far field carries less of the sums than on uniform points
    (`far_factor`); adaptive: on an adaptive tree.

    Raises ValueError if eps is below what `dtype` (or the largest tabulated
    order) can reach.
    """
    return choose_order(eps, dtype, EPS_FLOOR, ORDERS,
                        lambda p: far * _error_bound(p, points, gradient, adaptive),
                        "the 3D Laplace family")


SHARE_TARGETS = 256
# The largest near pairs left out of the share's total: a few very close
# pairs may carry most of sum 1/r^2, but what they add to |phi| rests on
# their few charges, small in some draws (a sphere of 2,400 points whose
# closest pair, 5.6e-5 apart, carried 97% of it: the share fell from about
# 0.11 to 0.003 and the order with it, and a draw erred 9.7e-7 at eps 1e-6).
SHARE_TRIM = 8


def row_top(v, k: int):
    """(R, k): the k largest entries of each row of v (R, C >= k), ties
    kept. k passes of a row maximum: on a CPU 60x faster than lax.top_k
    over the (R, C) block (2-core CPU, 256 x 2,056 float64: 1.9 ms
    against 117 ms)."""
    slots = jnp.arange(k)
    vals = jnp.full((v.shape[0], k), -jnp.inf, v.dtype)
    filled = jnp.zeros(v.shape[0], jnp.int32)
    for _ in range(k):
        m = jnp.max(v, axis=1)
        eq = v == m[:, None]
        count = jnp.sum(eq, axis=1, dtype=jnp.int32)
        put = (slots >= filled[:, None]) & (slots < (filled + count)[:, None])
        vals = jnp.where(put, m[:, None], vals)
        filled = filled + count
        v = jnp.where(eq, -jnp.inf, v)
    return vals


def share_chunk(n: int) -> int:
    """Sources per step of `far_share`'s scan: 2,048 on a CPU (a block that
    stays in cache); on an accelerator up to 2^15 (256 x 2^15 pairs a
    step), as few steps as that allows (H200, 2^20 points: 512 steps took
    14.8-15.2 ms, 32 steps 6.4-7.0 ms, the same shares; most of an eager
    call's configuration)."""
    if jax.default_backend() == "cpu":
        return 2048
    return min(2 ** 15, max(2048, 1 << (n - 1).bit_length()))


@functools.partial(jax.jit, static_argnames=("depth",))
def far_share(sources, targets, depth: int):
    """The share of sum 1/r^2 over the pairs of up to SHARE_TARGETS evenly
    strided targets (None: the sources) and every source that the uniform
    tree of `depth` leaves to its far field (pairs in leaves that are not
    neighbours), the SHARE_TRIM largest near pairs left out of the sum;
    with separate targets, the larger of the sum's and of its adjoint's
    (sources and targets swapped, which reverse mode in the charges runs on
    the same order). A scalar; jit-able."""
    lo, side = root_box(sources if targets is None else jnp.concatenate([sources, targets]))
    cells = functools.partial(leaf_coords, lo=lo, side=side, depth=depth)

    def share(x, y):
        y = strided(y, SHARE_TARGETS)
        cy = cells(y)
        n, d = x.shape
        chunk = share_chunk(n)
        xs = jnp.concatenate([x, jnp.full((-n % chunk, d), jnp.nan, x.dtype)])

        def body(carry, xc):
            sums, top = carry
            r2 = sum((y[:, None, a] - xc[None, :, a]) ** 2 for a in range(d))
            w = jnp.where(r2 > 0, 1 / jnp.where(r2 > 0, r2, 1.0), 0.0)    # NaN pads drop out
            near = jnp.max(jnp.abs(cy[:, None] - cells(xc)[None]), axis=-1) <= 1
            top = row_top(jnp.concatenate([top, jnp.where(near, w, 0.0)], axis=1), SHARE_TRIM)
            return (sums + jnp.stack([jnp.sum(w), jnp.sum(jnp.where(near, 0.0, w))]), top), None

        init = (jnp.zeros(2, x.dtype), jnp.zeros((y.shape[0], SHARE_TRIM), x.dtype))
        (sums, top), _ = jax.lax.scan(body, init, xs.reshape(-1, chunk, d))
        top = jax.lax.top_k(top.reshape(-1), SHARE_TRIM)[0]
        return sums[1] / jnp.maximum(sums[0] - jnp.sum(top), jnp.finfo(x.dtype).tiny)

    if targets is None:
        return share(sources, sources)
    return jnp.maximum(share(sources, targets), share(targets, sources))


# Where the far field carries a small share, it is a few pairs (outliers
# against the crowd) that may each sit at the worst geometry rather than the
# table's typical one: 1,201 cube targets against 803 clustered sources
# (far factor 0.0026, CPU, float64) erred 7.6x the factored typical error at
# p = 7 (1.07e-6 at eps 1e-6; 56 more crowded draws at p = 3-12 stayed within
# 7.4x). Below FAR_FLOOR the factor stops falling. At a floor of 1/20 a
# later draw of the same sets (factor 0.0066; tests/test_distributed.py,
# seed 123254222568307333400585893616600960283) took p = 10 for the
# adjoint sum and erred 1.69e-6 at eps 1e-6; at 0.15 it takes p = 11,
# 5.9e-7. Over 40 other draws the worst error fell from 1.3e-7 to 8.1e-8.
FAR_FLOOR = 0.15


def far_factor(share: float, cube_share: float) -> float:
    """The error's factor on points whose far field carries `share` of
    sum 1/r^2 (`far_share`) where uniform points carry
    `cube_share` on the same tree: a translated pair errs in proportion to
    1/r, so the relative error scales with the square root of the share
    (never above 1: the table's points are the worst case it assumes;
    never below FAR_FLOOR). CPU, N = 16,384 on the uniform tree, float64
    (docs/BENCHMARKS.md): a sphere's surface carries about a quarter of
    the cube's share, clusters of sd 1e-3 a billionth."""
    return float(min(1.0, max(FAR_FLOOR, np.sqrt(max(share, 0.0) / cube_share))))


def choose(kernel, eps: float, dtype, points: Points, order: int | None = None,
           gradient: bool = True) -> Choice:
    """Order (from eps, or `order` range-checked) and depth for these points."""
    return series_choice(order_for_eps, MAX_ORDER, leaf_size, eps, dtype, points, order,
                         gradient)
