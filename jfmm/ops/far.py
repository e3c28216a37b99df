"""M2P and P2L over the W and X work lists of an adaptive tree, for any
family with `m2p_basis` and `p2l_basis` (jnp).

A work-list entry (`jfmm.tree.adaptive.far_pairs`) is a tile of a leaf's
points (at most `adaptive.FAR_TILE`) and a colleague j of the leaf; the
boxes it concerns are j's children that are split themselves
(`adaptive.far_boxes`, up to 2^d - 1; they do not touch the leaf). M2P
evaluates those children's multipoles at the tile's targets (W); P2L adds
the tile's sources to those children's local expansions (X). Both are a
basis per (point, box) pair contracted with the expansions or the charges,
so they run as batched products over chunks of entries, and any leaf
occupancy works (a leaf has as many tiles as its points need).

Geometry: the boxes are at least a box side (of the children) away from
the leaf's points, so u = (y - centre) / h has a max-norm of at least 1.5
(M2P) and v likewise (P2L): the series converge faster than the M2L's.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jfmm.ops import p2p
from jfmm.tree import adaptive

HIGHEST = jax.lax.Precision.HIGHEST
# Basis values (entries x tile x boxes x P x (1 + d)) one chunk of
# entries may hold.
CHUNK_VALUES = 2 ** 26


def entries(tree, tile, pos, start, n_points: int):
    """A work list's entries: the point ranges [t0, t1) of their tiles (E,)
    each (t0 = n_points where the entry is padding) and the boxes (E, C)
    they concern (B where none)."""
    total = tree.n_boxes
    leaf, t0, t1 = adaptive.far_tiles(start, n_points)
    n_tiles = leaf.shape[0]
    ext = lambda a, fill: jnp.concatenate([a, jnp.full((1,) + a.shape[1:], fill, a.dtype)])  # noqa: E731
    boxes = adaptive.far_boxes(tree, ext(leaf, total)[tile], pos)
    real = tile < n_tiles
    return jnp.where(real, ext(t0, n_points)[tile], n_points), \
        jnp.where(real, ext(t1, 0)[tile], n_points), boxes


def _entries(tree, tile, pos, start, points, n_points: int):
    """Per work-list entry: its tile's points (E, T, d) and live mask (E, T),
    the point rows (E, T) (n_points where dead), and the boxes (E, C) it
    concerns (B where none) with their centres (E, C, d) and sides (E, C)."""
    t0, t1, boxes = entries(tree, tile, pos, start, n_points)
    rows = t0[:, None] + jnp.arange(adaptive.FAR_TILE, dtype=jnp.int32)
    live = rows < t1[:, None]
    rows = jnp.where(live, rows, n_points)
    pts = p2p.pad_rows(points, 1)[rows]
    ext = lambda a, fill: jnp.concatenate([a, jnp.full((1,) + a.shape[1:], fill, a.dtype)])  # noqa: E731
    centre = ext(tree.center, 0)[boxes]
    side = ext(tree.box_side(tree.level), 1)[boxes]
    return pts, live, rows, boxes, centre, side


def _scaled(pts, live, boxes, centre, side, total: int):
    """u = (point - centre) / side (E, T, C, d), sides (E, T, C), and the
    mask of real (point, box) pairs; dead pairs get a far point (the bases
    stay finite)."""
    u = (pts[:, :, None, :] - centre[:, None]) / side[:, None, :, None]
    ok = live[:, :, None] & (boxes < total)[:, None, :]
    u = jnp.where(ok[..., None], u, 2.0)
    return u, jnp.broadcast_to(side[:, None, :], ok.shape), ok


def _chunked(f, args, per_entry: int):
    """f over the leading axis of args in chunks of entries (lax.map) so
    that a chunk holds at most CHUNK_VALUES basis values."""
    n = jax.tree_util.tree_leaves(args)[0].shape[0]
    size = max(1, min(n, CHUNK_VALUES // max(per_entry, 1)))
    if size >= n:
        return f(*args)
    pad = -n % size
    padded = [jnp.concatenate([a, jnp.repeat(a[-1:], pad, axis=0)]) for a in args]
    out = jax.lax.map(lambda xs: f(*xs), [a.reshape((-1, size) + a.shape[1:]) for a in padded])
    return jax.tree_util.tree_map(lambda o: o.reshape((-1,) + o.shape[2:])[:n], out)


def m2p(family, kernel, tree, mult, p: int, gradient: bool):
    """The W list: multipoles mult (B, K, P) evaluated at the sorted
    targets. Returns phi (M, K), grad (M, K, d) or None."""
    total, d = tree.n_boxes, tree.dim
    m, k = tree.tgt_sorted.shape[0], mult.shape[1]
    pts, live, rows, boxes, centre, side = _entries(tree, tree.w_tile, tree.w_pos,
                                                    tree.tgt_start, tree.tgt_sorted, m)
    mult = jnp.concatenate([mult, jnp.zeros((1,) + mult.shape[1:], mult.dtype)])

    def one(pts, live, boxes, centre, side):
        u, h, ok = _scaled(pts, live, boxes, centre, side, total)
        b, g = family.m2p_basis(kernel, u.reshape(-1, d), h.reshape(-1), p, gradient)
        e, t, c = ok.shape
        mask = ok.reshape(-1, 1).astype(b.dtype)
        b = (b * mask).reshape(e, t, c, -1)
        m_ = mult[boxes]                                              # (E, C, K, P)
        phi = jnp.einsum("etcp,eckp->etk", b, m_, precision=HIGHEST)
        if g is None:
            return phi, None
        g = (g * mask[..., None]).reshape(e, t, c, -1, d)
        return phi, jnp.einsum("etcpa,eckp->etka", g, m_, precision=HIGHEST)

    per_entry = adaptive.FAR_TILE * boxes.shape[1] * mult.shape[2] * (1 + d * gradient)
    phi, grad = _chunked(one, (pts, live, boxes, centre, side), per_entry)
    flat_rows = rows.reshape(-1)
    phi = jnp.zeros((m + 1, k), phi.dtype).at[flat_rows].add(phi.reshape(-1, k))[:m]
    if gradient:
        grad = jnp.zeros((m + 1, k, d), grad.dtype).at[flat_rows].add(
            grad.reshape(-1, k, d))[:m]
    return phi, grad


def p2l(family, kernel, tree, q_sorted, p: int, into):
    """The X list: sorted charges q_sorted (N, K) added to the local
    expansions `into` (B, K, P) of the boxes they are in the X list of.
    Returns the sums (B, K, P)."""
    total, d = tree.n_boxes, tree.dim
    n, k = q_sorted.shape
    pts, live, rows, boxes, centre, side = _entries(tree, tree.x_tile, tree.x_pos,
                                                    tree.src_start, tree.src_sorted, n)
    q = p2p.pad_rows(q_sorted, 1)[rows] * live[..., None]               # (E, T, K)

    def one(pts, live, boxes, centre, side, q):
        v, h, ok = _scaled(pts, live, boxes, centre, side, total)
        e, t, c = ok.shape
        b = family.p2l_basis(kernel, v.reshape(-1, d), h.reshape(-1), p)
        b = (b * ok.reshape(-1, 1).astype(b.dtype)).reshape(e, t, c, -1)
        return jnp.einsum("etcp,etk->eckp", b, q, precision=HIGHEST)

    per_entry = adaptive.FAR_TILE * boxes.shape[1] * into.shape[-1]
    loc = _chunked(one, (pts, live, boxes, centre, side, q), per_entry)
    return into.at[boxes.reshape(-1)].add(loc.reshape((-1, k, loc.shape[-1])), mode="drop")
