"""Pallas P2M and L2P kernels for the 3D Laplace family.

Twins of the jnp leaf operators (`jfmm.ops.laplace3d.p2m` summed per leaf,
and `laplace3d.l2p`; jfmm.ops.backend chooses between them). Both cut the
Morton-sorted points into leaf-aligned tiles of T points (as the P2P kernel
does), compute the regular harmonics of a tile in registers with the
unrolled recurrences of `laplace3d.regular_stream`, and use each harmonic as
it comes: P2M reduces q * Y over the tile into the tile's multipole (tiles
of one leaf are then summed), L2P accumulates the leaf's local coefficients
times Y per target.
Nothing of size N x p^2 is ever stored, which is what the jnp operators
spend their time on.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jfmm.ops import laplace3d, p2p
from jfmm.ops.pallas import compiler_params, fma

TILE = 32       # points per program
NUM_WARPS = 1   # one warp: the P2M reductions stay within it (shuffles only)
# Up to this order the harmonics' recurrences are unrolled (fastest); above
# it they run in loops over order m and degree n, whose compile time does
# not grow with p (unrolled, p = 22 took 136-180 s to compile).
UNROLLED_MAX = 16
# P2M's tiles grow with the leaves, up to this many points: each tile's
# K p^2 sums are added into its leaf's by a segment sum, whose colliding
# adds cost more than the kernel where leaves span many tiles (H200,
# 10^7 points at depth 5, p = 22, K = 3: 67 ms of a 715 ms call).
P2M_TILE_MAX = 128


def p2m_tile(n_points: int, n_leaves: int) -> int:
    """P2M's tile: TILE, doubled while two tiles fit a mean leaf, at most
    P2M_TILE_MAX."""
    tile = TILE
    while 2 * tile <= min(P2M_TILE_MAX, n_points / max(n_leaves, 1) / 2):
        tile *= 2
    return tile


def _rolled_stream(u0, u1, u2, p: int, mad, use):
    """`laplace3d.regular_stream` in loops: use(n, m, re, im, state) -> state
    for each regular harmonic Y_n^m (m >= 0; im is 0 for m = 0), in the
    same order, threading `state` through. n and m are traced int32."""
    r2 = mad(u2, u2, mad(u1, u1, u0 * u0))
    zero = jnp.zeros_like(u0)

    def column(m, carry):
        d_re, d_im, state = carry
        s = 1.0 / (2 * jnp.maximum(m, 1)).astype(u0.dtype)   # Y_m^m from Y_{m-1}^{m-1}
        up_re, up_im = s * mad(u1, d_re, u0 * d_im), s * mad(u1, d_im, -u0 * d_re)
        d_re, d_im = jnp.where(m > 0, up_re, d_re), jnp.where(m > 0, up_im, d_im)

        def row(n, st):                     # three-term recurrence in n > m
            cur_re, cur_im, prev_re, prev_im, state = st
            k = ((n + m) * (n - m)).astype(u0.dtype)
            a = (2 * n - 1).astype(u0.dtype) / k
            b = 1.0 / k
            cur_re, prev_re = mad(a * u2, cur_re, (-b * r2) * prev_re), cur_re
            cur_im, prev_im = mad(a * u2, cur_im, (-b * r2) * prev_im), cur_im
            return cur_re, cur_im, prev_re, prev_im, use(n, m, cur_re, cur_im, state)

        state = use(m, m, d_re, d_im, state)
        state = jax.lax.fori_loop(m + 1, p, row, (d_re, d_im, zero, zero, state))[-1]
        return d_re, d_im, state

    return lambda state: jax.lax.fori_loop(0, p, column, (zero + 1, zero, state))[-1]


def _flat(n, m, part):
    """`laplace3d._index` of traced n, m: Re at n^2 + 2m - 1 (n^2 for
    m = 0), Im after it (n^2 again for m = 0, which has none)."""
    return n * n + (2 * m - 1 + part) * (m > 0).astype(n.dtype)    # no integer select in Triton


def _p2m_kernel(meta_ref, u_ref, q_ref, out_ref, *, p: int, n_k: int, tile: int,
                interpret: bool):
    """One tile: out[i, k * P + j] = sum_t q_k(t) conj(Y_j(u_t))."""
    i = pl.program_id(0)
    t0, t1 = meta_ref[i, 0], meta_ref[i, 1]
    live = t0 + jax.lax.broadcasted_iota(jnp.int32, (tile,), 0) < t1
    u = [u_ref[a, pl.ds(t0, tile)] for a in range(3)]
    q = [jnp.where(live, q_ref[k, pl.ds(t0, tile)], 0) for k in range(n_k)]
    mad = functools.partial(fma, interpret=interpret)
    if p > UNROLLED_MAX:
        def use(n, m, re, im, state):
            for k in range(n_k):
                out_ref[i, k * p * p + _flat(n, m, 0)] = jnp.sum(q[k] * re)
                # m = 0 has no Im slot (_flat gives Re's): Re again there
                out_ref[i, k * p * p + _flat(n, m, 1)] = jnp.where(
                    m > 0, -jnp.sum(q[k] * im), jnp.sum(q[k] * re))
            return state
        _rolled_stream(*u, p, mad, use)(jnp.int32(0))
        return
    sign = laplace3d._conj_sign(p)
    for j, y in laplace3d.regular_stream(*u, p, mad):
        for k in range(n_k):
            out_ref[i, k * p * p + j] = float(sign[j]) * jnp.sum(q[k] * y)


def p2m(u, q, start, p: int, interpret: bool = False, tiles=None, tile: int = TILE):
    """Multipoles of the leaves: (n_leaves, K, p^2).

    u: (N, 3) sorted box-local scaled source positions; q: (N, K) sorted
    charges; start: (n_leaves + 2,) leaf ranges with an empty sentinel leaf;
    tiles: (leaf, t0, t1) of the tiles to run (`leaf_tiles` with `tile`
    points, `p2m_tile`), or None for all.
    """
    n, n_k = q.shape
    n_leaves = start.shape[0] - 2
    leaf, t0, t1 = p2p.leaf_tiles(start, n, tile) if tiles is None else tiles
    meta = jnp.stack([t0, t1], axis=1).astype(jnp.int32)
    n_tiles = meta.shape[0]
    body = functools.partial(_p2m_kernel, p=p, n_k=n_k, tile=tile, interpret=interpret)
    per_tile = pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct((n_tiles, n_k * p * p), u.dtype), grid=(n_tiles,),
        interpret=interpret, compiler_params=compiler_params(NUM_WARPS, interpret),
    )(meta, p2p.pad_rows(u, tile).T, p2p.pad_rows(q, tile).T)
    out = jax.ops.segment_sum(per_tile, leaf, n_leaves + 1, indices_are_sorted=True)
    return out[:n_leaves].reshape(n_leaves, n_k, p * p)


def _l2p_kernel(meta_ref, u_ref, c_ref, out_ref, *, p: int, n_k: int, n_e: int, tile: int,
                interpret: bool):
    """One tile: out[i, k E + e, t] = sum_j C_e[k, j] Y_j(u_t). Up to
    UNROLLED_MAX, c holds the leaf's local coefficients L (K P a leaf) and
    the sets are made here: C_0 = w L, C_a = w (D_a L) with D_a the sparse
    derivative maps (`laplace3d._derivative_tables`) and w the pair weights,
    so that no K E P sets of every leaf are stored; above, c holds the sets
    (K E P a leaf, `laplace3d.l2p_coefficients` times w)."""
    i = pl.program_id(0)
    t0, leaf = meta_ref[i, 0], meta_ref[i, 1]
    u = [u_ref[a, pl.ds(t0, tile)] for a in range(3)]
    n_out = n_k * n_e
    acc = [jnp.zeros((tile,), u[0].dtype) for _ in range(n_out)]
    mad = functools.partial(fma, interpret=interpret)
    if p > UNROLLED_MAX:
        def use(n, m, re, im, acc):          # m = 0: im is 0 against Re's slot
            out = []
            for o in range(n_out):
                a = mad(c_ref[leaf, o * p * p + _flat(n, m, 0)], re, acc[o])
                out.append(mad(c_ref[leaf, o * p * p + _flat(n, m, 1)], im, a))
            return tuple(out)
        acc = _rolled_stream(*u, p, mad, use)(tuple(acc))
        for o in range(n_out):
            out_ref[i, o, :] = acc[o]
        return
    w = laplace3d._pair_weight(p)
    idx, coef = laplace3d._derivative_tables(p)
    for j, y in laplace3d.regular_stream(*u, p, mad):
        for k in range(n_k):
            base = k * p * p
            sets = [float(w[j]) * c_ref[leaf, base + j]]
            for a in range(n_e - 1):
                terms = [float(w[j] * c) * c_ref[leaf, base + int(col)]
                         for col, c in zip(idx[a, j], coef[a, j]) if c != 0]
                sets.append(sum(terms[1:], terms[0]) if terms else None)
            for e, c in enumerate(sets):
                if c is not None:
                    acc[k * n_e + e] = mad(c, y, acc[k * n_e + e])
    for o in range(n_out):
        out_ref[i, o, :] = acc[o]


def l2p(u, loc, start, h, p: int, gradient: bool, interpret: bool = False, tiles=None):
    """Evaluate the leaves' local expansions at their targets.

    u: (M, 3) sorted scaled target positions; loc: (n_leaves, K, P) local
    expansions; start: (n_leaves + 2,) target leaf ranges; h: leaf side, a
    scalar or one per leaf (n_leaves,); tiles: as in `p2m`, whose leaf
    entries index loc and h (one row a tile where a caller gathered the
    tiles' own). Returns phi (M, K), grad (M, K, 3) or None, sorted order.
    Up to UNROLLED_MAX the kernel makes the gradient's coefficient sets
    per tile (stored for every leaf, they were the largest of a sum's
    temporaries: 604 MB at 2^24 points, twice); above, they are made here.
    """
    m = u.shape[0]
    n_leaves, n_k, n_p = loc.shape
    n_e = 4 if gradient else 1
    leaf, t0, t1 = p2p.leaf_tiles(start, m, TILE) if tiles is None else tiles
    # Unused tiles point at the sentinel leaf n_leaves with an empty range
    # (`tiles.leaf_tiles`), so what they make is dropped: they may read the
    # last leaf rather than a zero row appended to every leaf's
    # coefficients (a copy of them all: 151 MB at 2^24 points).
    leaf = jnp.minimum(leaf, n_leaves - 1)
    meta = jnp.stack([t0, leaf], axis=1).astype(jnp.int32)
    n_tiles = meta.shape[0]
    if p > UNROLLED_MAX:
        coef = laplace3d.l2p_coefficients(loc, p, gradient)
        c = (coef * jnp.asarray(laplace3d._pair_weight(p), coef.dtype)).reshape(n_leaves, -1)
    else:
        c = loc.reshape(n_leaves, -1)
    body = functools.partial(_l2p_kernel, p=p, n_k=n_k, n_e=n_e, tile=TILE, interpret=interpret)
    out = pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct((n_tiles, n_k * n_e, TILE), u.dtype),
        grid=(n_tiles,), interpret=interpret,
        compiler_params=compiler_params(NUM_WARPS, interpret),
    )(meta, p2p.pad_rows(u, TILE).T, c)
    out = jnp.transpose(out.reshape(n_tiles, n_k, n_e, TILE), (0, 3, 1, 2))  # (tiles, T, K, E)
    h = jnp.asarray(h, u.dtype)
    if h.ndim:                                          # one side per leaf
        h = h[leaf][:, None, None]
    phi, grad = p2p.scatter_tiles(out[..., 0] / h,
                                  out[..., 1:] / (h * h)[..., None] if gradient else None,
                                  t0, t1, m)
    return phi, grad
