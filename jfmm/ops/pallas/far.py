"""Pallas M2P and P2L kernels of the 3D Laplace family over an adaptive
tree's W and X work lists (twins of `jfmm.ops.far.m2p` and `far.p2l`).

One program per work-list entry: a tile of a leaf's points (T of them)
and the boxes it concerns (C, up to 7: `jfmm.tree.adaptive.far_children`).
For each box the program streams the irregular harmonics of the tile's
points relative to the box (`laplace3d.irregular_stream`, unrolled, in
registers) and uses each as it comes: M2P accumulates the box's
coefficient sets (`laplace3d.m2p_coefficients`: potential and the three
derivatives) times the harmonic per target, P2L reduces charge times
harmonic over the tile into the box's local coefficients. Nothing of size
points x boxes x p^2 is stored, which is what the jnp operators spend their
time on.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from jfmm.ops import laplace3d, p2p
from jfmm.ops.pallas import compiler_params, fma
from jfmm.tree import adaptive

NUM_WARPS = 1


def _point_and_box(u_ref, geo_ref, box, t0, tile: int, live):
    """The tile's coordinates relative to `box` in its units: (u0, u1, u2),
    and the box's side; a far point where the lane is dead or the box is
    the sentinel (its harmonics stay finite)."""
    h = geo_ref[box, 3]
    ok = live & (h > 0)
    u = [jnp.where(ok, (u_ref[a, pl.ds(t0, tile)] - geo_ref[box, a]) / jnp.where(h > 0, h, 1.0),
                   2.0) for a in range(3)]
    return u, h


def _m2p_kernel(meta_ref, u_ref, geo_ref, c_ref, out_ref, *, q: int, n_k: int, n_e: int,
                boxes: int, tile: int, interpret: bool):
    """One entry: out[i, e * K + k, t] = sum over its boxes of sum_j
    c[box, (e * K + k) * Q + j] T_j(u_t) / h (e = 0, the potential) or / h^2
    (e = 1..3, its derivatives)."""
    i = pl.program_id(0)
    t0, t1 = meta_ref[i, 0], meta_ref[i, 1]
    live = t0 + jax.lax.broadcasted_iota(jnp.int32, (tile,), 0) < t1
    mad = functools.partial(fma, interpret=interpret)
    n_out, p = n_e * n_k, int(round(q ** 0.5))

    def one_box(c, acc):
        box = meta_ref[i, 2 + c]
        u, h = _point_and_box(u_ref, geo_ref, box, t0, tile, live)
        part = [jnp.zeros((tile,), u[0].dtype) for _ in range(n_out)]
        for j, t in laplace3d.irregular_stream(*u, p, mad):
            for o in range(n_out):
                part[o] = mad(c_ref[box, o * q + j], t, part[o])
        inv = 1.0 / jnp.where(h > 0, h, 1.0)
        return tuple(a + v * (inv if o < n_k else inv * inv)
                     for o, (a, v) in enumerate(zip(acc, part)))

    init = tuple(jnp.zeros((tile,), u_ref.dtype) for _ in range(n_out))
    acc = jax.lax.fori_loop(0, boxes, one_box, init)
    for o in range(n_out):
        out_ref[i, o, :] = acc[o]


def m2p(targets, coef, center, side, tiles, boxes, gradient: bool, interpret: bool = False):
    """W-list M2P: phi (M, K), grad (M, K, 3) or None at the sorted targets.

    targets: (M, 3) sorted; coef: (B, K, E, Q) `laplace3d.m2p_coefficients`;
    center (B, 3), side (B,); tiles: (t0, t1) per entry (E entries of
    FAR_TILE points); boxes: (E, C) the boxes each entry's targets
    evaluate (B where none)."""
    m = targets.shape[0]
    n_b, n_k, n_e, q = coef.shape
    t0, t1 = tiles
    tile = adaptive.FAR_TILE
    c = jnp.swapaxes(coef, 1, 2).reshape(n_b, -1)                      # [e, k, j]
    c = jnp.concatenate([c, jnp.zeros((1, c.shape[1]), c.dtype)])      # the sentinel box
    meta = jnp.concatenate([t0[:, None], t1[:, None], boxes], axis=1).astype(jnp.int32)
    body = functools.partial(_m2p_kernel, q=q, n_k=n_k, n_e=n_e, boxes=boxes.shape[1],
                             tile=tile, interpret=interpret)
    out = pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct((meta.shape[0], n_e * n_k, tile), targets.dtype),
        grid=(meta.shape[0],), interpret=interpret,
        compiler_params=compiler_params(NUM_WARPS, interpret),
    )(meta, p2p.pad_rows(targets, tile).T, _geometry(center, side), c)
    out = jnp.transpose(out.reshape(-1, n_e, n_k, tile), (0, 3, 2, 1))  # (E, T, K, e)
    rows = t0[:, None] + jnp.arange(tile, dtype=t0.dtype)
    rows = jnp.where(rows < t1[:, None], rows, m).reshape(-1)
    total = jnp.zeros((m + 1, n_k, n_e), out.dtype).at[rows].add(out.reshape(-1, n_k, n_e))[:m]
    return total[:, :, 0], (total[:, :, 1:] if gradient else None)


def _p2l_kernel(meta_ref, u_ref, q_ref, geo_ref, out_ref, *, p: int, n_k: int, boxes: int,
                tile: int, interpret: bool):
    """One entry: out[i, c, k * P + j] = sum_t q_k(t) (-1)^n T_j(-v_t), v_t the
    tile's sources relative to box c."""
    i = pl.program_id(0)
    t0, t1 = meta_ref[i, 0], meta_ref[i, 1]
    live = t0 + jax.lax.broadcasted_iota(jnp.int32, (tile,), 0) < t1
    charges = [jnp.where(live, q_ref[k, pl.ds(t0, tile)], 0) for k in range(n_k)]
    mad = functools.partial(fma, interpret=interpret)
    sign = _degree_sign(p)

    def one_box(c, carry):
        box = meta_ref[i, 2 + c]
        v, _ = _point_and_box(u_ref, geo_ref, box, t0, tile, live)
        for j, t in laplace3d.irregular_stream(*(-a for a in v), p, mad):
            for k in range(n_k):
                out_ref[i, c, k * p * p + j] = float(sign[j]) * jnp.sum(charges[k] * t)
        return carry

    jax.lax.fori_loop(0, boxes, one_box, 0)


def p2l(sources, charges, center, side, tiles, boxes, p: int, into, interpret: bool = False):
    """X-list P2L: the local coefficients the boxes get, added to `into`
    (B, K, p^2); returns the sums.

    sources (N, 3), charges (N, K) sorted; center (B, 3), side (B,); tiles:
    (t0, t1) per entry (FAR_TILE points); boxes: (E, C) the boxes each
    entry's sources add to (B where none)."""
    n_k = charges.shape[1]
    n_b = center.shape[0]
    t0, t1 = tiles
    tile = adaptive.FAR_TILE
    meta = jnp.concatenate([t0[:, None], t1[:, None], boxes], axis=1).astype(jnp.int32)
    body = functools.partial(_p2l_kernel, p=p, n_k=n_k, boxes=boxes.shape[1], tile=tile,
                             interpret=interpret)
    out = pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct((meta.shape[0], boxes.shape[1], n_k * p * p),
                                             sources.dtype),
        grid=(meta.shape[0],), interpret=interpret,
        compiler_params=compiler_params(NUM_WARPS, interpret),
    )(meta, p2p.pad_rows(sources, tile).T, p2p.pad_rows(charges, tile).T, _geometry(center, side))
    loc = into.reshape(n_b, n_k * p * p).at[boxes.reshape(-1)].add(
        out.reshape(-1, n_k * p * p), mode="drop")
    return loc.reshape(n_b, n_k, p * p)


def _geometry(center, side):
    """(B + 1, 4): centre and side of every box, the sentinel's side 0."""
    geo = jnp.concatenate([center, side[:, None]], axis=1)
    return jnp.concatenate([geo, jnp.zeros((1, 4), geo.dtype)])


@functools.lru_cache(maxsize=None)
def _degree_sign(p: int) -> np.ndarray:
    return np.concatenate([np.full(2 * n + 1, (-1.0) ** n) for n in range(p)])
